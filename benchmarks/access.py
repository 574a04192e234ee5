"""Access-cost benchmark: accesses.total against sqrt(mk) and Theorem 4.2's bound.

For every family (zipf, flat, uniform, plateau), m (10^3 .. 10^9), k (1, 10, 100) and method
(private threshold algorithm with Gumbel and with Laplace noise, the exponential mechanism k = 1 in
its threshold form (Corollary 4.3), the one-shot mechanism, and the cost-aware threshold algorithm
when the core offers it) it runs the mechanism `runs` times with distinct seeds and reports the
mean, median and p95 of accesses.total, next to sqrt(mk) and 2 (sqrt(mk) + sqrt(m/2))
(Wu, Ohrimenko, Wirth 2023, Theorem 4.2), plus rows_fetched and round_trips. On the plateau
family (the Theorem 5.4 instance) it fits the log-log slope of mean accesses against m.

Runs of one point are spread over worker processes. A point whose runs would exceed
`point_budget` seconds of worker time is cut to what fits (never below `min_runs`); the JSON says
so point by point (`runs`, `runs_planned`, `budget_limited`).
"""

from __future__ import annotations

import argparse
import math
import time
import zlib
from collections.abc import Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import common

DEFAULT_MS = tuple(10**e for e in range(3, 10))
DEFAULT_KS = (1, 10, 100)
# The cost model of the cost-aware method in the access sweep: a random access (an index probe)
# costs 10 sorted accesses (the next row of a range scan); round trips are free (in memory).
ACCESS_COST_MODEL = (1.0, 10.0, 0.0)
SLOPE_RANGE = (0.45, 0.55)


@dataclass(frozen=True)
class MethodSpec:
    """One line of the benchmark: a call of private_top_k."""

    label: str
    method: str
    noise: str
    only_k: int | None = None  # the exponential mechanism is the k = 1 case
    max_m: int | None = None  # one-shot reads all m rows: run only up to this size
    costs: tuple[float, float, float] | None = None  # CostModel(sorted, random, round_trip)
    note: str = ""


def available_methods(oneshot_max_m: int) -> list[MethodSpec]:
    """The methods of the benchmark that the core offers now."""
    specs = [
        MethodSpec("threshold-gumbel", "threshold", "gumbel", note="Algorithm 3, Gumbel noise"),
        MethodSpec("threshold-laplace", "threshold", "laplace", note="Algorithm 3, Laplace noise"),
    ]
    if common.has_exponential():
        note = "topk_middleware.exponential_mechanism (Corollary 4.3: Algorithm 3, Gumbel, k = 1)"
        specs.append(MethodSpec("exponential", "exponential", "gumbel", only_k=1, note=note))
    else:
        note = "Algorithm 3 with Gumbel noise at k = 1 (Corollary 4.3), seeds of its own"
        specs.append(MethodSpec("exponential", "threshold", "gumbel", only_k=1, note=note))
    if common.has_cost_model():
        specs.append(
            MethodSpec(
                "cost-aware",
                "threshold",
                "gumbel",
                costs=ACCESS_COST_MODEL,
                note="cost-aware threshold algorithm, CostModel(sorted, random, round_trip) = "
                f"{ACCESS_COST_MODEL}",
            )
        )
    specs.append(
        MethodSpec(
            "oneshot",
            "oneshot",
            "gumbel",
            max_m=oneshot_max_m,
            note="Algorithm 2, a full read: accesses.total = m by construction",
        )
    )
    return specs


# ----- one run, in a worker ------------------------------------------------------------------
_SOURCES: dict[tuple[str, int, int, bool], Any] = {}


def _source(family: str, m: int, k: int, prefer_synthetic: bool) -> Any:
    key = (family, m, k if family == "plateau" else 0, prefer_synthetic)
    if key not in _SOURCES:
        if len(_SOURCES) >= 2:
            _SOURCES.clear()
        _SOURCES[key] = common.make_source(family, m, k, prefer_synthetic=prefer_synthetic)
    return _SOURCES[key]


def run_chunk(
    spec: MethodSpec,
    family: str,
    m: int,
    k: int,
    epsilon: float,
    oracle: str,
    seeds: Sequence[int],
    prefer_synthetic: bool,
) -> dict[str, Any]:
    """Run one point for the given seeds; returns per-run counts and times."""
    import topk_middleware as core

    source = _source(family, m, k, prefer_synthetic)
    out: dict[str, list[float]] = {
        "total": [],
        "sorted": [],
        "random": [],
        "rows_fetched": [],
        "round_trips": [],
        "seconds": [],
    }
    kwargs: dict[str, Any] = {}
    if spec.method == "threshold":
        kwargs["oracle"] = oracle
    if spec.costs is not None:
        kwargs["costs"] = core.CostModel(*spec.costs)
    for seed in seeds:
        start = time.perf_counter()
        if spec.method == "exponential":
            result = core.exponential_mechanism(source, epsilon, seed=seed)
        else:
            result = core.private_top_k(
                source,
                k=k,
                epsilon=epsilon,
                noise=spec.noise,
                method=spec.method,
                seed=seed,
                **kwargs,
            )
        out["seconds"].append(time.perf_counter() - start)
        stats = result.accesses
        if len(result.items) != k:
            raise AssertionError(f"{spec.label} returned {len(result.items)} items for k = {k}")
        out["total"].append(stats.total)
        out["sorted"].append(stats.sorted)
        out["random"].append(stats.random)
        out["rows_fetched"].append(stats.rows_fetched)
        out["round_trips"].append(stats.round_trips)
    out["source"] = [common.source_kind(source)]  # type: ignore[list-item]
    return out


# ----- the sweep -----------------------------------------------------------------------------
@dataclass
class AccessConfig:
    ms: tuple[int, ...] = DEFAULT_MS
    ks: tuple[int, ...] = DEFAULT_KS
    families: tuple[str, ...] = common.FAMILIES
    methods: tuple[str, ...] | None = None  # labels; None = all available
    runs: int = 100
    min_runs: int = 20
    oneshot_runs: int = 5
    oneshot_max_m: int = 10**7
    epsilon: float = 1.0
    point_budget: float = 120.0  # seconds of worker time per point
    jobs: int = 2
    seed: int = 0
    prefer_synthetic: bool = True
    out: Path = common.RESULTS_DIR
    name: str = "access"
    plots: bool = True
    quiet: bool = False
    quick: bool = False  # a smoke sweep: its slope is reported, not checked
    extra: dict[str, Any] = field(default_factory=dict)


def _seeds(cfg: AccessConfig, spec: MethodSpec, family: str, m: int, k: int, n: int, skip: int):
    base = zlib.crc32(f"{cfg.seed}|{spec.label}|{family}|{m}|{k}".encode()) * 10_000
    return [base + i for i in range(skip, skip + n)]


def _merge(parts: list[dict[str, Any]]) -> dict[str, list[float]]:
    merged: dict[str, list[float]] = {}
    for part in parts:
        for key, values in part.items():
            merged.setdefault(key, []).extend(values)
    return merged


def _run_point(
    pool: Executor, cfg: AccessConfig, spec: MethodSpec, family: str, m: int, k: int, oracle: str
) -> dict[str, Any]:
    """All runs of one point: a pilot on every worker, then what the budget allows."""
    planned = cfg.oneshot_runs if spec.method == "oneshot" else cfg.runs
    jobs = max(1, cfg.jobs)
    wall = time.perf_counter()
    pilot = max(1, min(3, planned // jobs))
    futures = []

    def submit(n: int, first: int) -> Any:
        seeds = _seeds(cfg, spec, family, m, k, n, first)
        return pool.submit(
            run_chunk, spec, family, m, k, cfg.epsilon, oracle, seeds, cfg.prefer_synthetic
        )

    done = 0
    for _ in range(jobs):
        n = min(pilot, planned - done)
        if n <= 0:
            break
        futures.append(submit(n, done))
        done += n
    parts = [f.result() for f in futures]
    spent = sum(sum(p["seconds"]) for p in parts)
    per_run = spent / max(1, done)
    remaining = planned - done
    affordable = math.floor(max(0.0, cfg.point_budget - spent) / max(per_run, 1e-9))
    more = min(remaining, max(min(cfg.min_runs, planned) - done, affordable))
    if more > 0:
        chunk = max(1, math.ceil(more / (jobs * 4)))
        futures = []
        while more > 0:
            n = min(chunk, more)
            futures.append(submit(n, done))
            done += n
            more -= n
        wait(futures)
        parts += [f.result() for f in futures]
    merged = _merge(parts)
    totals = merged["total"]
    bound = common.access_bound(m, k)
    summary = common.summarize(totals)
    point = {
        "family": family,
        "m": m,
        "k": k,
        "method": spec.label,
        "api_method": spec.method,
        "noise": spec.noise,
        "oracle": oracle if spec.method == "threshold" else spec.method,
        "epsilon": cfg.epsilon,
        "source": merged["source"][0],
        "runs": len(totals),
        "runs_planned": planned,
        "budget_limited": len(totals) < planned,
        "sqrt_mk": common.sqrt_mk(m, k),
        "bound": bound,
        "total": summary,
        "sorted": common.summarize(merged["sorted"]),
        "random": common.summarize(merged["random"]),
        "rows_fetched": common.summarize(merged["rows_fetched"]),
        "round_trips": common.summarize(merged["round_trips"]),
        "seconds_per_run": common.summarize(merged["seconds"]),
        "wall_seconds": time.perf_counter() - wall,
        "mean_over_sqrt_mk": summary["mean"] / common.sqrt_mk(m, k),
        "mean_over_bound": summary["mean"] / bound,
        "mean_within_bound": summary["mean"] <= bound,
        # Every sorted access and every random access is a distinct fetched row (AccessStats).
        "rows_fetched_cover_accesses": all(
            f >= max(s, r)
            for f, s, r in zip(
                merged["rows_fetched"], merged["sorted"], merged["random"], strict=True
            )
        ),
    }
    if spec.method == "oneshot":
        point["total_equals_m"] = all(t == m for t in totals)
    return point


Point = tuple[MethodSpec, str, int, int]


def plan_points(cfg: AccessConfig, specs: list[MethodSpec]) -> list[Point]:
    points = []
    for family in cfg.families:
        for k in cfg.ks:
            for spec in specs:
                if spec.only_k is not None and spec.only_k != k:
                    continue
                for m in cfg.ms:
                    if k > m or (spec.max_m is not None and m > spec.max_m):
                        continue
                    points.append((spec, family, m, k))
    return points


# The methods Theorem 4.2 bounds (Algorithm 3); the cost-aware variant trades steps for random
# accesses and is reported, not held to the bound.
BOUNDED = ("threshold-gumbel", "threshold-laplace", "exponential")


def cost_aware_comparison(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Cost-aware against threshold-gumbel at each point: mean random, sorted, modelled cost."""
    c_sorted, c_random, _ = ACCESS_COST_MODEL
    plain = {(p["family"], p["m"], p["k"]): p for p in points if p["method"] == "threshold-gumbel"}
    out = []
    for p in points:
        q = plain.get((p["family"], p["m"], p["k"]))
        if p["method"] != "cost-aware" or q is None:
            continue

        def cost(x: dict[str, Any]) -> float:
            return c_sorted * x["sorted"]["mean"] + c_random * x["random"]["mean"]

        out.append(
            {
                "family": p["family"],
                "m": p["m"],
                "k": p["k"],
                "random_mean": [q["random"]["mean"], p["random"]["mean"]],
                "sorted_mean": [q["sorted"]["mean"], p["sorted"]["mean"]],
                "modelled_cost": [cost(q), cost(p)],
                "cost_ratio": cost(p) / cost(q) if cost(q) else None,
            }
        )
    return out


def slopes(points: list[dict[str, Any]], family: str = "plateau") -> list[dict[str, Any]]:
    """Log-log slope of mean accesses against m, per (method, k), on one family."""
    out = []
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for p in points:
        if p["family"] == family and p["method"] != "oneshot":
            groups.setdefault((p["method"], p["k"]), []).append(p)
    for (method, k), group in sorted(groups.items()):
        group.sort(key=lambda p: p["m"])
        if len(group) < 2:
            continue
        ms = [p["m"] for p in group]
        slope = common.loglog_slope(ms, [p["total"]["mean"] for p in group])
        out.append(
            {
                "family": family,
                "method": method,
                "k": k,
                "m_range": [ms[0], ms[-1]],
                "points": len(group),
                "slope": slope,
                "in_target_range": SLOPE_RANGE[0] <= slope <= SLOPE_RANGE[1],
                "held_to_target": method in BOUNDED,
            }
        )
    return out


def run(cfg: AccessConfig) -> dict[str, Any]:
    """The whole sweep; writes <out>/<name>.json and one PNG per family."""
    oracle = common.best_oracle()
    synthetic = common.synthetic_class() is not None and cfg.prefer_synthetic
    if not synthetic:
        too_big = [m for m in cfg.ms if m > common.MAX_IN_MEMORY_M]
        if too_big:
            raise SystemExit(
                f"m = {too_big} needs adapters.synthetic.SyntheticSource, which is not available; "
                f"use --max-m {common.MAX_IN_MEMORY_M}"
            )
    if oracle == "eager" and max(cfg.ms) > 10**7:
        raise SystemExit(
            "the core has no lazy noise oracle yet: the eager list draws and sorts m noises per "
            "run; use --max-m 1e7 or less"
        )
    specs = available_methods(cfg.oneshot_max_m)
    if cfg.methods:
        unknown = set(cfg.methods) - {s.label for s in specs}
        if unknown:
            raise SystemExit(f"unknown or unavailable methods {sorted(unknown)}")
        specs = [s for s in specs if s.label in cfg.methods]
    points_plan = plan_points(cfg, specs)
    info = common.machine_info()
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    from tqdm import tqdm

    with ProcessPoolExecutor(max_workers=max(1, cfg.jobs)) as pool:
        bar = tqdm(
            points_plan, desc="access", disable=common.bar_off(cfg.quiet), dynamic_ncols=True
        )
        for spec, family, m, k in bar:
            bar.set_postfix_str(f"{family} m={m:.0e} k={k} {spec.label}")
            results.append(_run_point(pool, cfg, spec, family, m, k, oracle))
    fits = slopes(results)
    payload = {
        "benchmark": "access",
        "machine": info,
        "config": {
            **{k: v for k, v in asdict(cfg).items() if k not in ("out", "extra")},
            "oracle": oracle,
            "synthetic_source": synthetic,
            "methods": [asdict(s) for s in specs],
            "families": {
                "zipf": f"h[r] = floor({common.ZIPF_TOP} / (r + 1))",
                "flat": f"h[r] = {common.FLAT_COUNT}",
                "uniform": f"h[r] = floor({common.UNIFORM_MAX} (m - 1 - r) / (m - 1))",
                "plateau": f"tau = ceil(sqrt(mk)) items at the top: tau // k at "
                f"{common.PLATEAU_HEIGHT - 1}, the rest at {common.PLATEAU_HEIGHT}; others 0 "
                "(Theorem 5.4, equation (14))",
            },
            **cfg.extra,
        },
        "elapsed_seconds": time.perf_counter() - started,
        "points": results,
        "plateau_slopes": fits,
        "cost_aware_vs_threshold": cost_aware_comparison(results),
        "targets": {
            "bounded_methods": list(BOUNDED),
            "mean_within_bound_everywhere": all(
                p["mean_within_bound"] for p in results if p["method"] in BOUNDED
            ),
            "points_over_bound": [
                {k: p[k] for k in ("family", "m", "k", "method", "mean_over_bound")}
                for p in results
                if p["method"] != "oneshot" and not p["mean_within_bound"]
            ],
            "plateau_slope_range": list(SLOPE_RANGE),
            "plateau_slopes_in_range": all(
                f["in_target_range"] for f in fits if f["held_to_target"]
            ),
        },
    }
    path = common.write_json(cfg.out / f"{cfg.name}.json", payload)
    payload["files"] = [str(path)]
    if cfg.plots:
        payload["files"] += [str(p) for p in plot(payload, cfg.out, cfg.name)]
    return payload


# ----- plots ---------------------------------------------------------------------------------
STYLE = {
    "threshold-gumbel": ("tab:blue", "o"),
    "threshold-laplace": ("tab:orange", "s"),
    "exponential": ("tab:green", "^"),
    "cost-aware": ("tab:red", "D"),
    "oneshot": ("tab:gray", "x"),
}


def plot(payload: dict[str, Any], out: Path, name: str) -> list[Path]:
    """One log-log figure per family: a panel per k, mean accesses (p95 as a band) per method,
    with sqrt(mk) and Theorem 4.2's bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = payload["points"]
    files = []
    for family in sorted({p["family"] for p in points}):
        fam = [p for p in points if p["family"] == family]
        ks = sorted({p["k"] for p in fam})
        fig, axes = plt.subplots(1, len(ks), figsize=(5.2 * len(ks), 4.6), squeeze=False)
        for ax, k in zip(axes[0], ks, strict=True):
            rows = [p for p in fam if p["k"] == k]
            ms = np.array(sorted({p["m"] for p in rows}), dtype=float)
            grid = np.geomspace(ms.min(), ms.max(), 50)
            ax.plot(grid, np.sqrt(grid * k), "k--", lw=1, label="sqrt(mk)")
            ax.plot(
                grid,
                2 * (np.sqrt(grid * k) + np.sqrt(grid / 2)),
                "k-",
                lw=1.2,
                label="2(sqrt(mk)+sqrt(m/2))",
            )
            for method in sorted({p["method"] for p in rows}):
                line = sorted((p for p in rows if p["method"] == method), key=lambda p: p["m"])
                x = [p["m"] for p in line]
                color, marker = STYLE.get(method, ("tab:red", "D"))
                ax.plot(
                    x,
                    [p["total"]["mean"] for p in line],
                    marker=marker,
                    color=color,
                    label=f"{method} (mean)",
                )
                ax.fill_between(
                    x,
                    [p["total"]["median"] for p in line],
                    [p["total"]["p95"] for p in line],
                    color=color,
                    alpha=0.15,
                )
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("m (items)")
            ax.set_ylabel("accesses.total")
            ax.set_title(f"{family}, k = {k}")
            ax.grid(True, which="major", alpha=0.3)
        fig.suptitle(
            f"Access cost, {family} family (band: median to p95; eps = "
            f"{payload['config']['epsilon']})",
            fontsize=10,
        )
        common.legend_below(fig, axes[0])
        path = out / f"{name}_{family}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)
    return files


# ----- command line --------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="a small sweep (m <= 1e4, 10 runs) for a smoke test"
    )
    parser.add_argument("--runs", type=int, default=None, help="runs per point (default 100)")
    parser.add_argument(
        "--min-runs",
        type=int,
        default=None,
        help="runs a point keeps even over its budget (default 20)",
    )
    parser.add_argument("--min-m", type=float, default=1e3)
    parser.add_argument("--max-m", type=float, default=None, help="largest m (default 1e9)")
    parser.add_argument("--k", type=int, nargs="+", default=None, help="k values (1 10 100)")
    parser.add_argument("--families", nargs="+", choices=common.FAMILIES, default=None)
    parser.add_argument("--methods", nargs="+", default=None, help="method labels to run")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument(
        "--point-budget",
        type=float,
        default=None,
        help="seconds of worker time per point (default 120)",
    )
    parser.add_argument("--oneshot-runs", type=int, default=None)
    parser.add_argument("--oneshot-max-m", type=float, default=None)
    parser.add_argument(
        "--in-memory", action="store_true", help="use ArraySource even when SyntheticSource exists"
    )


def config_from_args(args: argparse.Namespace) -> AccessConfig:
    cfg = AccessConfig()
    if args.quick:
        cfg.ms, cfg.ks, cfg.runs, cfg.min_runs, cfg.oneshot_runs = (10**3, 10**4), (1, 10), 10, 5, 2
        cfg.point_budget = 10.0
        cfg.name, cfg.quick = "access_quick", True
    max_m = int(args.max_m) if args.max_m else max(cfg.ms)
    cfg.ms = tuple(m for m in DEFAULT_MS if int(args.min_m) <= m <= max_m) or (max_m,)
    if args.quick and not args.max_m:
        cfg.ms = (10**3, 10**4)
    if args.k:
        cfg.ks = tuple(args.k)
    if args.families:
        cfg.families = tuple(args.families)
    if args.methods:
        cfg.methods = tuple(args.methods)
    if args.runs is not None:
        cfg.runs = args.runs
    if args.min_runs is not None:
        cfg.min_runs = args.min_runs
    if args.point_budget is not None:
        cfg.point_budget = args.point_budget
    if args.oneshot_runs is not None:
        cfg.oneshot_runs = args.oneshot_runs
    if args.oneshot_max_m is not None:
        cfg.oneshot_max_m = int(args.oneshot_max_m)
    cfg.epsilon = args.epsilon
    cfg.prefer_synthetic = not args.in_memory
    return cfg


def report(payload: dict[str, Any]) -> str:
    """A plain-text table of the sweep and the target checks."""
    lines = [
        f"{'family':8} {'k':>4} {'m':>8} {'method':18} {'runs':>5} {'mean':>10} {'median':>10} "
        f"{'p95':>10} {'sqrt(mk)':>10} {'bound':>10} {'mean/bnd':>8}"
    ]
    for p in payload["points"]:
        t = p["total"]
        lines.append(
            f"{p['family']:8} {p['k']:>4} {p['m']:>8.0e} {p['method']:18} {p['runs']:>5} "
            f"{t['mean']:>10.1f} {t['median']:>10.1f} {t['p95']:>10.1f} {p['sqrt_mk']:>10.1f} "
            f"{p['bound']:>10.1f} {p['mean_over_bound']:>8.3f}"
        )
    quick = payload["config"].get("quick", False)
    for f in payload["plateau_slopes"]:
        # A quick sweep spans one decade of m: its slope is a smoke figure, not a target check.
        verdict = (
            "(quick sweep: not checked against"
            if quick
            else ("in" if f["in_target_range"] else "outside")
        )
        lines.append(
            f"plateau slope {f['method']} k={f['k']}: {f['slope']:.4f} "
            f"(m {f['m_range'][0]:.0e}..{f['m_range'][1]:.0e}) "
            f"{verdict} [{SLOPE_RANGE[0]}, {SLOPE_RANGE[1]}]{')' if quick else ''}"
        )
    tg = payload["targets"]
    lines.append(
        f"mean <= bound at every point ({', '.join(BOUNDED)}): {tg['mean_within_bound_everywhere']}"
    )
    lines.append(f"elapsed: {payload['elapsed_seconds']:.1f} s")
    return "\n".join(lines)
