"""Utility: how close is the released top-k to the true one, at each epsilon, per mechanism.

    python -m benchmarks utility [--quick] [--trials 200] [--jobs 2]
    python -m benchmarks utility --preview-m 1e7     the preview's time on a 10^7-row table
                                                     (benchmarks/utility_preview.py)
    python -m benchmarks utility --combine           utility.json from the data sets' files

For each data set (benchmarks/utility_data.py: three real tables from installed packages, and
the synthetic families zipf and plateau of benchmarks/common.py at m = 10^4), k in {10, 100}
and total epsilon in {0.1, 0.25, 0.5, 1, 2, 4} (delta 1e-6 where a mechanism takes one), every
top-k mechanism of the project and OpenDP's noisy top-k release `--trials` times (seeds 0..);
the figures of preview.release_figures: precision@k, k-relative error quantiles (25/50/75%),
P(exact top-k), near-zero items; for `with_counts` the counts' l_inf and l_1 error; the median
time of a release. The preview's prediction of the same point sits beside the measured one.

Calibration at a total (epsilon, delta = 1e-6):
  threshold, laplace    private_top_k(..., delta=1e-6) (method threshold; Laplace: the one-shot)
  threshold_counts      the same with with_counts=True (half of epsilon for the counts)
  peeling, joint        pure epsilon (their own calibrations); joint for k <= 64 only
  limited_domain        preview.limited_domain_item_epsilon at delta' = delta/2, threshold
                        delta/2, k_bar the preview's pick
  pay_what_you_get      one call of a session k* = k, l* = 1 (Theorem 2: 2 l* delta_1 + delta'):
                        delta_1 = delta/4, delta' = delta/2, the same per-item epsilon
  stable                StableTopK A3 (target k, k_bar = 4k): rho with rho + 2 sqrt(rho
                        ln(2/delta)) = epsilon, delta_t = delta/2 (Zhu & Wang Theorem 12)
  opendp_exponential    OpenDP make_noisy_top_k, MaxDivergence, monotonic, scale k/epsilon:
                        pure epsilon, exponential noise (its own law)
  opendp_gumbel         the same with ZeroConcentratedDivergence (Gumbel noise) at scale
                        k/epsilon: peeling's law (a cross-check, rho = epsilon^2 / (8k))
Trials: every mechanism of the project runs itself, `--trials` (200) seeded releases per point
on an in-memory ArraySource (the stores' integer counts): a release costs 0.1-17 ms on these
tables (load average 3-4), so 200 releases per point of all of them take about 8 CPU minutes.
OpenDP's release costs 2 ms to 30 s (its exact samplers; measured at load 4: 0.3-0.8 s on the
words at k = 10, 3-6 s at k = 100, 17-30 s on the senses at k = 100, epsilon 4), so it runs
`--trials` releases or until `--opendp-seconds` (30) CPU seconds of one point are spent, at
least 2 (its own cost, whatever the load); each row states its trials and the median wall and
CPU seconds of one release. `--merge --mechanisms ...` runs some mechanisms again and replaces
only their rows in the data sets' files (utility.json is then combined from all of them).
Results: benchmarks/results/utility.json (and utility_<data set>.json, written as each data set
finishes) and utility_<data set>.png.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np

from . import common
from .utility_data import DATASETS, SHAPES, load

EPSILONS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0)
KS = (10, 100)
DELTA = 1e-6
SYNTHETIC = ("zipf", "plateau")
SYNTHETIC_M = 10_000
MECHANISMS = (
    "threshold",
    "laplace",
    "threshold_counts",
    "peeling",
    "joint",
    "limited_domain",
    "pay_what_you_get",
    "stable",
    "opendp_exponential",
    "opendp_gumbel",
)
PREVIEWED = ("threshold", "laplace", "limited_domain")
OPENDP_SECONDS = 30.0  # CPU seconds of OpenDP's releases per point (at least OPENDP_MIN_TRIALS)
OPENDP_MIN_TRIALS = 2


@functools.lru_cache(maxsize=4)
def scores_of(name: str, k: int) -> np.ndarray:
    if name in SYNTHETIC:
        return np.asarray(common.family_scores(name, SYNTHETIC_M, k), dtype=np.float64)
    return load(name)


def stable_rho(epsilon: float, delta: float) -> float:
    """rho with rho + 2 sqrt(rho ln(1/delta)) = epsilon (Bun & Steinke Prop. 1.3, inverted)."""
    log_term = math.log(1.0 / delta)
    return (math.sqrt(log_term + epsilon) - math.sqrt(log_term)) ** 2


def releases(
    mechanism: str, scores: np.ndarray, k: int, epsilon: float, k_bar: int | None
) -> tuple[Callable[[int], Any], bool] | None:
    """(one release for a seed -> (items, noisy counts or None), whether its time is budgeted)
    or None where the mechanism does not apply to this point."""
    from adapters.memory import ArraySource
    from topk_middleware import (
        PayWhatYouGet,
        joint_top_k,
        limited_domain_top_k,
        peeling_top_k,
        private_top_k,
        stable_top_k,
    )
    from topk_middleware.mechanisms.joint import JOINT_MAX_K
    from topk_middleware.preview import limited_domain_item_epsilon

    integral = bool(np.all(scores == np.floor(scores)))  # counts: the stores' integer scores
    source = ArraySource(scores.astype(np.int64) if integral else scores)
    m = len(scores)
    item = limited_domain_item_epsilon(k, epsilon, DELTA / 2)
    if mechanism == "threshold":
        return (
            lambda s: (
                private_top_k(source, k, epsilon, DELTA, method="threshold", seed=s).items,
                None,
            ),
            False,
        )
    if mechanism == "laplace":
        return (
            lambda s: (
                private_top_k(
                    source, k, epsilon, DELTA, noise="laplace", method="oneshot_full_read", seed=s
                ).items,
                None,
            ),
            False,
        )
    if mechanism == "threshold_counts":

        def counted(s: int) -> Any:
            result = private_top_k(
                source, k, epsilon, DELTA, method="threshold", seed=s, with_counts=True
            )
            return result.items, result.counts

        return counted, False
    if mechanism == "peeling":
        return (lambda s: (peeling_top_k(source, k, epsilon, seed=s).items, None)), False
    if mechanism == "joint":
        if k > JOINT_MAX_K:
            return None
        return (lambda s: (joint_top_k(source, k, epsilon, seed=s).items, None)), False
    if mechanism == "limited_domain":
        return (
            lambda s: (
                limited_domain_top_k(
                    source, k, k_bar, item, DELTA / 2, delta_prime=DELTA / 2, seed=s
                ).items,
                None,
            ),
            False,
        )
    if mechanism == "pay_what_you_get":

        def session(s: int) -> Any:
            return PayWhatYouGet(k, 1, item, DELTA / 4).top_k(source, k, k_bar, seed=s).items, None

        return session, False
    if mechanism == "stable":
        if 4 * k >= m:
            return None
        rho = stable_rho(epsilon, DELTA / 2)
        return (
            lambda s: (
                stable_top_k(
                    source, rho, DELTA / 2, k=k, k_bar=4 * k, delta=DELTA / 2, seed=s
                ).items,
                None,
            ),
            False,
        )
    if mechanism.startswith("opendp"):
        import opendp.prelude as dp

        dp.enable_features("contrib")
        measure = (
            dp.max_divergence()
            if mechanism == "opendp_exponential"
            else dp.zero_concentrated_divergence()
        )
        release = dp.m.make_noisy_top_k(
            dp.vector_domain(dp.atom_domain(T=float, nan=False)),
            dp.linf_distance(T=float, monotonic=True),
            measure,
            k=k,
            scale=k / epsilon,
        )
        # OpenDP draws from its own secure generator: no seed (the trials are independent)
        vector = np.ascontiguousarray(scores, dtype=np.float64)
        return (lambda s: (release(vector), None)), True
    raise ValueError(f"unknown mechanism {mechanism!r}")


def measure_point(
    name: str,
    k: int,
    epsilon: float,
    mechanism: str,
    trials: int,
    k_bar: int | None,
    opendp_seconds: float = OPENDP_SECONDS,
) -> dict[str, Any] | None:
    """`trials` seeded releases of one mechanism at one point (a budgeted one: until
    `opendp_seconds` of CPU time are spent, at least OPENDP_MIN_TRIALS: its own cost, whatever
    the machine's load) and their figures."""
    from topk_middleware.preview import release_figures

    scores = scores_of(name, k)
    made = releases(mechanism, scores, k, epsilon, k_bar)
    if made is None:
        return None
    release, budgeted = made
    kth = float(scores[k - 1])
    values = np.full((trials, k), np.nan)
    l_inf, l_1, seconds, cpu = [], [], [], []
    runs = 0
    point_cpu = time.process_time()
    for seed in range(trials):
        if (
            budgeted
            and runs >= OPENDP_MIN_TRIALS
            and time.process_time() - point_cpu >= opendp_seconds
        ):
            break
        started, used = time.perf_counter(), time.process_time()
        try:
            items, counts = release(seed)
        except ValueError:  # work the mechanism refuses at this point (joint on long prefixes)
            return None
        seconds.append(time.perf_counter() - started)
        cpu.append(time.process_time() - used)
        ranks = np.asarray(items, dtype=np.int64)  # ids are ranks: the scores are descending
        values[seed, : len(ranks)] = scores[ranks]
        runs += 1
        if counts is not None:
            errors = np.abs(np.asarray(counts, dtype=np.float64) - scores[ranks])
            l_inf.append(float(errors.max()))
            l_1.append(float(errors.sum()))
    values = values[:runs]
    precision, error, tail = release_figures(values, kth, 0.01 * kth, k)
    q = np.quantile(error, [0.25, 0.5, 0.75])
    row = {
        "data": name,
        "k": k,
        "epsilon": epsilon,
        "mechanism": mechanism,
        "trials": runs,
        "k_bar": k_bar if mechanism in ("limited_domain", "pay_what_you_get") else None,
        "precision": float(precision.mean()),
        "error_q25": float(q[0]),
        "error_median": float(q[1]),
        "error_q75": float(q[2]),
        "exact": float(np.mean(precision == 1.0)),
        "tail_items": float(tail.mean()),
        "seconds_median": float(np.median(seconds)),
        "cpu_seconds_median": float(np.median(cpu)),
    }
    if l_inf:
        row["counts_linf_median"] = float(np.median(l_inf))
        row["counts_l1_median"] = float(np.median(l_1))
    return row


def run_data_set(
    name: str,
    trials: int,
    epsilons: tuple[float, ...],
    ks: tuple[int, ...],
    mechanisms: tuple[str, ...],
    opendp_seconds: float = OPENDP_SECONDS,
) -> list[dict[str, Any]]:
    """Every point of one data set, the preview's prediction first."""
    from adapters.memory import ArraySource
    from topk_middleware import preview

    rows: list[dict[str, Any]] = []
    for k in ks:
        scores = scores_of(name, k)
        if k >= len(scores):
            continue
        started = time.perf_counter()
        predicted = preview(
            ArraySource(scores),
            k,
            epsilons=epsilons,
            methods=PREVIEWED,
            delta=DELTA,
            trials=200,
            seed=0,
        )
        took = time.perf_counter() - started
        for outcome in predicted.outcomes:
            rows.append(
                {
                    "data": name,
                    "k": k,
                    "mechanism": "preview:" + outcome.method,
                    "preview_seconds": took,
                    **outcome.as_dict(),
                }
            )
        for epsilon in epsilons:
            k_bar = predicted.outcome("limited_domain", epsilon).k_bar
            for mechanism in mechanisms:
                row = measure_point(name, k, epsilon, mechanism, trials, k_bar, opendp_seconds)
                if row is not None:
                    rows.append(row)
    return rows


def plot(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """One PNG per data set: precision@k and median k-relative error (25-75% band) against
    epsilon, a line per mechanism, a row per k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for name in sorted({row["data"] for row in rows}):
        mine = [row for row in rows if row["data"] == name and "precision" in row]
        ks = sorted({row["k"] for row in mine})
        fig, axes = plt.subplots(len(ks), 2, figsize=(11, 3.6 * len(ks)), squeeze=False)
        for i, k in enumerate(ks):
            for mechanism in sorted({row["mechanism"] for row in mine if row["k"] == k}):
                line = sorted(
                    (row for row in mine if row["k"] == k and row["mechanism"] == mechanism),
                    key=lambda row: row["epsilon"],
                )
                eps = [row["epsilon"] for row in line]
                style = "--" if mechanism.startswith("preview:") else "-"
                base = mechanism.removeprefix("preview:")
                color = plt.get_cmap("tab20")(MECHANISMS.index(base) * 2 % 20)
                axes[i][0].plot(
                    eps,
                    [row["precision"] for row in line],
                    style,
                    color=color,
                    marker="o",
                    ms=3,
                    label=mechanism,
                )
                median = [row["error_median"] for row in line]
                axes[i][1].plot(eps, median, style, color=color, marker="o", ms=3, label=mechanism)
                if not mechanism.startswith("preview:"):
                    axes[i][1].fill_between(
                        eps,
                        [row["error_q25"] for row in line],
                        [row["error_q75"] for row in line],
                        color=color,
                        alpha=0.12,
                    )
            for ax, label in zip(
                axes[i], ("precision@k", "k-relative error (median, 25-75%)"), strict=True
            ):
                ax.set_xscale("log")
                ax.set_xlabel("total epsilon")
                ax.set_title(f"{name}, k = {k}: {label}", fontsize=9)
            axes[i][1].set_yscale("symlog", linthresh=1.0)
        axes[0][1].legend(fontsize=6, loc="upper right", ncol=2)
        fig.suptitle(SHAPES.get(name, f"synthetic {name}, m = {SYNTHETIC_M}"), fontsize=10)
        fig.tight_layout()
        path = out / f"utility_{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="20 trials, epsilon 0.25, 1, 4, k 10")
    parser.add_argument("--trials", type=int, default=200, help="releases per point (200)")
    parser.add_argument(
        "--opendp-seconds",
        type=float,
        default=None,
        help=f"CPU seconds of OpenDP's releases per point ({OPENDP_SECONDS:g}; --quick: 2), "
        f"at least {OPENDP_MIN_TRIALS} releases",
    )
    parser.add_argument(
        "--data", nargs="+", default=[*DATASETS, *SYNTHETIC], help="data sets (default: all)"
    )
    parser.add_argument(
        "--mechanisms",
        nargs="+",
        default=list(MECHANISMS),
        choices=MECHANISMS,
        help="mechanisms (default: all)",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="replace only the rows of --mechanisms in the data sets' files (a second pass)",
    )
    parser.add_argument(
        "--combine",
        action="store_true",
        help="only merge the data sets' JSON files in the results folder into utility.json",
    )
    parser.add_argument(
        "--preview-m",
        type=float,
        default=None,
        help="only time the preview on a table of this many rows (benchmarks/utility_preview.py)",
    )
    parser.add_argument(
        "--preview-store",
        nargs="+",
        default=["duckdb"],
        choices=("duckdb", "postgres"),
        help="the stores of --preview-m (default: duckdb)",
    )


def merged(path: Path, rows: list[dict[str, Any]], ran: set[str]) -> list[dict[str, Any]]:
    """The rows of a data set's file with those of the mechanisms in `ran` (and the preview's)
    replaced by a new run's (--merge: a second pass of some mechanisms)."""
    if not path.exists():
        return rows
    kept = [
        row
        for row in json.loads(path.read_text())["rows"]
        if row["mechanism"] not in ran and not row["mechanism"].startswith("preview:")
    ]
    return kept + rows


def combine(out: Path, names: list[str]) -> Path:
    """utility.json from the per-data-set files of `names` present in `out` (a run cut short, or
    data sets run apart), and their PNGs redrawn."""
    rows: list[dict[str, Any]] = []
    trials: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    for name in names:
        path = out / f"utility_{name}.json"
        if path.exists():
            part = json.loads(path.read_text())
            rows.extend(part["rows"])
            trials[name] = part["trials"]
            runs[name] = {key: value for key, value in part.items() if key != "rows"}
    payload = {
        "machine": common.machine_info(),
        "trials": trials,
        "runs": runs,
        "delta": DELTA,
        "data_sets": {
            name: SHAPES.get(name, f"synthetic {name}, m = {SYNTHETIC_M}") for name in trials
        },
        "rows": rows,
    }
    plot(rows, out)
    return common.write_json(out / "utility.json", payload)


def main(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.combine:
        print(combine(out, args.data))
        return 0
    if args.preview_m is not None:
        from .utility_preview import preview_timing

        m = int(args.preview_m)
        timings = []
        for store in args.preview_store:
            timings.append(preview_timing(m, store))
            print(timings[-1], flush=True)
        path = common.write_json(
            out / f"utility_preview_{m:.0e}.json",
            {"machine": common.machine_info(), "stores": timings},
        )
        print(path)
        return 0
    trials, epsilons, ks = args.trials, EPSILONS, KS
    opendp_seconds = OPENDP_SECONDS
    if args.quick:
        trials, epsilons, ks, opendp_seconds = min(trials, 20), (0.25, 1.0, 4.0), (10,), 2.0
    if args.opendp_seconds is not None:
        opendp_seconds = args.opendp_seconds
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=args.jobs or 2) as pool:
        futures = {
            pool.submit(
                run_data_set, name, trials, epsilons, ks, tuple(args.mechanisms), opendp_seconds
            ): name
            for name in args.data
        }
        for future in as_completed(futures):
            part = future.result()
            name = futures[future]
            if args.merge:
                part = merged(out / f"utility_{name}.json", part, set(args.mechanisms))
            rows.extend(part)
            run = {
                "trials": trials,
                "opendp_seconds": opendp_seconds,
                "mechanisms": list(args.mechanisms),
                "seconds": time.perf_counter() - started,
                "load_average": os.getloadavg(),
            }
            common.write_json(out / f"utility_{name}.json", {**run, "rows": part})
            print(f"{name}: {run['seconds']:.0f} s", flush=True)
            if not args.no_plot:
                plot(part, out)
    if args.merge:  # the other data sets' rows too
        print(combine(out, [*DATASETS, *SYNTHETIC]))
        return 0
    payload = {
        "machine": common.machine_info(),
        "seconds": time.perf_counter() - started,
        "trials": trials,
        "opendp_seconds": opendp_seconds,
        "load_average": os.getloadavg(),
        "delta": DELTA,
        "data_sets": {
            name: SHAPES.get(name, f"synthetic {name}, m = {SYNTHETIC_M}") for name in args.data
        },
        "rows": rows,
    }
    path = common.write_json(out / "utility.json", payload)
    print(path, f"{payload['seconds']:.0f} s")
    return 0


def markdown(rows: list[dict[str, Any]], data: str, k: int, field: str = "precision") -> str:
    """A table of one figure (precision, error_median, ...) per mechanism and epsilon: the form
    docs/choosing-epsilon.md shows."""
    mine = [row for row in rows if row["data"] == data and row["k"] == k and field in row]
    epsilons = sorted({row["epsilon"] for row in mine})
    lines = [
        "| mechanism | " + " | ".join(f"eps {e:g}" for e in epsilons) + " |",
        "|---|" + "---|" * len(epsilons),
    ]
    for mechanism in [*(f"preview:{m}" for m in PREVIEWED), *MECHANISMS]:
        cells = {row["epsilon"]: row for row in mine if row["mechanism"] == mechanism}
        if not cells:
            continue
        form = ".2f" if field in ("precision", "exact") else ".4g"
        shown = [format(cells[e][field], form) if e in cells else "" for e in epsilons]
        lines.append(f"| {mechanism} | " + " | ".join(shown) + " |")
    return "\n".join(lines)
