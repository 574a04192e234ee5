"""Shared pieces of the benchmarks: data families, sources, bounds, summaries, machine facts.

The four data families of the access benchmark, as `adapters.synthetic.SyntheticSource` defines them
(r is the canonical rank, 0-based):

* ``zipf``: h[r] = floor(10^6 / (r + 1)), a heavy head and a long tail of small counts;
* ``flat``: every item has the same count (everything tied);
* ``uniform``: counts spread evenly over 0..1000, h[r] = floor(1000 (m - 1 - r) / (m - 1));
* ``plateau``: the lower-bound instance of Wu, Ohrimenko, Wirth (ICML 2023), Theorem 5.4 and
  equation (14): tau = ceil(sqrt(mk)) items at the top, tau // k of them at n - 1 and the rest at
  n, every other item at 0. No algorithm with sorted and random access does better than
  Omega(sqrt(mk)) on it, so it is where the sqrt(mk) shape of the cost shows. The benchmarks use
  n = 10^6, far above the noise (scale <= 2k / epsilon), so that the plateau items are the top-k.

Items are named by their canonical rank, so only the multiset of counts matters for the access
counts; in database tables the item ids are a seeded random permutation.

`adapters.synthetic.SyntheticSource` serves the families for every m (it computes counts from
ranks and never materialises them); without it the histogram is built in memory as an
`adapters.memory.ArraySource` (same counts), which limits m to what fits in memory.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import importlib.util
import inspect
import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SCRATCH_DIR = Path(__file__).resolve().parent / "scratch"  # quick runs; ignored by git
FAMILIES = ("zipf", "flat", "uniform", "plateau", "distinct")
DEFAULT_PG_DSN = "host=127.0.0.1 port=5432 dbname=test"

ZIPF_TOP = 1_000_000  # h[0] of the zipf family
FLAT_COUNT = 1  # every count of the flat family
UNIFORM_MAX = 1_000  # counts of the uniform family are spread evenly over 0..UNIFORM_MAX
PLATEAU_HEIGHT = 1_000_000  # n of the plateau instance
MAX_IN_MEMORY_M = 10**8  # beyond this an ArraySource needs more than ~2.4 GB

T = TypeVar("T")


# ----- the paper's reference lines -----------------------------------------------------------
def sqrt_mk(m: int, k: int) -> float:
    """sqrt(mk): the Omega(sqrt(mk)) lower bound's shape (Wu et al. 2023, Theorem 5.4)."""
    return math.sqrt(m * k)


def access_bound(m: int, k: int) -> float:
    """2 (sqrt(mk) + sqrt(m/2)): Theorem 4.2's bound on the expected accesses of Algorithm 3."""
    return 2.0 * (math.sqrt(m * k) + math.sqrt(m / 2.0))


def plateau_size(m: int, k: int) -> int:
    """tau = ceil(sqrt(mk)) items on the plateau (Theorem 5.4's proof)."""
    return math.isqrt(m * k - 1) + 1


# ----- data families -------------------------------------------------------------------------
def family_scores(family: str, m: int, k: int) -> np.ndarray:
    """The m counts of a family in canonical (descending) order, as int64 (float64 for
    "distinct": the plateau without ties, see distinct_scores)."""
    if family == "distinct":
        return distinct_scores(m, k)
    cls = synthetic_class()
    if cls is not None:
        return build_synthetic(cls, family, m, k).scores_of_ranks(np.arange(m, dtype=np.int64))
    r = np.arange(m, dtype=np.int64)
    if family == "zipf":
        return np.floor(ZIPF_TOP / (r + 1.0)).astype(np.int64)
    if family == "flat":
        return np.full(m, FLAT_COUNT, dtype=np.int64)
    if family == "uniform":
        return (UNIFORM_MAX * (m - 1 - r)) // max(m - 1, 1)
    if family == "plateau":
        tau = plateau_size(m, k)
        high = tau - tau // k  # S_H scores n, S_L (tau // k items) n - 1: equation (14)
        return np.where(r < high, PLATEAU_HEIGHT, np.where(r < tau, PLATEAU_HEIGHT - 1, 0))
    raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")


def distinct_scores(m: int, k: int) -> np.ndarray:
    """Every score distinct: the top ceil(sqrt(mk)) within 0.001 of each other (PLATEAU_HEIGHT
    down to PLATEAU_HEIGHT - 0.001), the rest evenly spaced and distinct from PLATEAU_HEIGHT - 1
    down to 0: Theorem 5.4's hard instance with no tied runs to answer random access."""
    from adapters.synthetic import distinct_scores_of_ranks

    size = min(m, math.isqrt(m * k - 1) + 1)
    return distinct_scores_of_ranks(np.arange(m), m, size, float(PLATEAU_HEIGHT))


def shuffled_ids(m: int, seed: int = 0) -> np.ndarray:
    """Item ids for a table: a seeded random permutation of 0..m-1 (ids carry no order)."""
    return np.random.default_rng(seed).permutation(m).astype(np.int64)


def synthetic_class() -> Any | None:
    """`adapters.synthetic.SyntheticSource` if that module exists and imports, else None."""
    if importlib.util.find_spec("adapters.synthetic") is None:
        return None
    try:
        module = importlib.import_module("adapters.synthetic")
    except Exception:  # a module being written by someone else may not import yet
        return None
    return getattr(module, "SyntheticSource", None)


def make_source(family: str, m: int, k: int, *, prefer_synthetic: bool = True) -> Any:
    """A Source serving `family` at size m (k matters for the plateau only)."""
    cls = synthetic_class() if prefer_synthetic else None
    if cls is not None:
        return build_synthetic(cls, family, m, k)
    if m > MAX_IN_MEMORY_M:
        raise ValueError(
            f"m = {m:g} needs adapters.synthetic.SyntheticSource (not available): an in-memory "
            f"histogram is limited to m <= {MAX_IN_MEMORY_M:g}"
        )
    from adapters.memory import ArraySource

    return ArraySource(family_scores(family, m, k))


def build_synthetic(cls: Any, family: str, m: int, k: int) -> Any:
    """SyntheticSource for a family, passing k when its constructor takes it (plateau size)."""
    params = inspect.signature(cls).parameters
    kwargs: dict[str, Any] = {}
    if family in ("plateau", "distinct"):
        kwargs["k"] = k
        if "top" in params:
            kwargs["top"] = PLATEAU_HEIGHT
    return cls(m, family, **kwargs)


def source_kind(source: Any) -> str:
    return type(source).__module__ + "." + type(source).__qualname__


# ----- what the core offers ------------------------------------------------------------------
def api_choices(name: str) -> tuple[str, ...]:
    """The values `private_top_k` accepts for `name` (METHODS, NOISES, ORACLES of api.py)."""
    from topk_middleware import api

    return tuple(getattr(api, name, ()))


def has_exponential() -> bool:
    """Whether the core exports exponential_mechanism (Corollary 4.3)."""
    import topk_middleware

    return hasattr(topk_middleware, "exponential_mechanism")


def has_cost_model() -> bool:
    """Whether private_top_k takes a CostModel (`costs=`): the cost-aware threshold algorithm."""
    import topk_middleware

    return (
        hasattr(topk_middleware, "CostModel")
        and "costs" in inspect.signature(topk_middleware.private_top_k).parameters
    )


def best_oracle() -> str:
    """The lazy noise oracle (Algorithm 4) when the core has it, else the eager list."""
    return "lazy" if "lazy" in api_choices("ORACLES") else "eager"


# ----- statistics ----------------------------------------------------------------------------
def summarize(values: Iterable[float]) -> dict[str, float]:
    """mean, median, p95, std, min, max and count of a sample."""
    a = np.asarray(list(values), dtype=np.float64)
    if len(a) == 0:
        return {"n": 0}
    return {
        "n": len(a),
        "mean": float(a.mean()),
        "median": float(np.median(a)),
        "p95": float(np.percentile(a, 95)),
        "std": float(a.std(ddof=1)) if len(a) > 1 else 0.0,
        "min": float(a.min()),
        "max": float(a.max()),
    }


def loglog_slope(xs: Iterable[float], ys: Iterable[float]) -> float:
    """Least-squares slope of log y against log x (numpy.polyfit, degree 1)."""
    x = np.log(np.asarray(list(xs), dtype=np.float64))
    y = np.log(np.asarray(list(ys), dtype=np.float64))
    return float(np.polyfit(x, y, 1)[0])


# ----- machine facts -------------------------------------------------------------------------
def _version(module: str) -> str | None:
    try:
        return importlib.import_module(module).__version__
    except Exception:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def postgres_version(dsn: str) -> str | None:
    """The server's version string, or None if the server cannot be reached."""
    try:
        import psycopg

        with psycopg.connect(dsn, connect_timeout=3) as con:
            return str(con.execute("SHOW server_version").fetchone()[0])
    except Exception:
        return None


def git_commit() -> str | None:
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def machine_info(pg_dsn: str | None = None) -> dict[str, Any]:
    """Where and with what a benchmark ran."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "cpu_model": _cpu_model(),
        "memory_gb": _memory_gb(),
        "load_average_at_start": load,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "numpy": _version("numpy"),
        "duckdb": _version("duckdb"),
        "psycopg": _version("psycopg"),
        "postgresql": postgres_version(pg_dsn) if pg_dsn else None,
        "git_commit": git_commit(),
        "started_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": "python -m benchmarks " + " ".join(sys.argv[1:]),
    }


# ----- output --------------------------------------------------------------------------------
def add_output_arguments(parser: argparse.ArgumentParser, quick: str) -> None:
    """`--quick` (what it shrinks: `quick`) and `--out`, as every benchmark command takes them:
    results go to RESULTS_DIR, those of a quick run to SCRATCH_DIR, unless --out says where."""
    parser.add_argument("--quick", action="store_true", help=f"a smoke run: {quick}")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results folder (default: benchmarks/results, benchmarks/scratch for --quick)",
    )


def output_dir(args: argparse.Namespace) -> Path:
    """The results folder of a command given add_output_arguments' options."""
    if args.out is not None:
        return Path(args.out)
    return SCRATCH_DIR if args.quick else RESULTS_DIR


def write_json(path: Path, payload: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=False, default=_plain) + "\n")
    return path


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def progress(
    iterable: Iterable[T], *, total: int | None = None, desc: str = "", quiet: bool = False
) -> Iterator[T]:
    """A tqdm progress bar on stderr, shown only when stderr is a terminal (a redirected log
    gets none) and not quiet."""
    from tqdm import tqdm

    yield from tqdm(iterable, total=total, desc=desc, disable=bar_off(quiet), dynamic_ncols=True)


def bar_off(quiet: bool) -> bool | None:
    """tqdm's `disable`: True when quiet, else None (tqdm: off unless stderr is a terminal)."""
    return True if quiet else None


def legend_below(fig: Any, axes: Any, columns: int = 4) -> None:
    """One legend for all panels of `fig`, below them (clear of every line and band), and the
    figure's layout tightened around it."""
    legend: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    rows = -(-len(legend) // columns)
    fig.legend(
        list(legend.values()),
        list(legend),
        loc="lower center",
        ncol=min(len(legend), columns),
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout(rect=(0.0, 0.05 + 0.045 * rows, 1.0, 1.0))


def legend_outside(ax: Any, fontsize: int = 8) -> None:
    """The legend right of the axes, clear of the bars and lines; fig.tight_layout() keeps it."""
    ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
