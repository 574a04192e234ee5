"""Benchmark: the exponential mechanism in O(sqrt(m)) accesses (Wu et al. 2023, Corollary 4.3).

On the plateau family of SyntheticSource (the k = 1 lower-bound instance of Theorem 5.4:
ceil(sqrt(m)) items tied at the top, every other item at 0), for m = 10^4 ... 10^10, one point
per decade: mean, median and p95 of `accesses.total` over many seeded runs, against the
Theorem 4.2 bound 2 (sqrt(m) + sqrt(m/2)), and the log-log slope of the mean against m
(numpy.polyfit). Also the wall clock of 10^6 consecutive sorted noises from the lazy noise list
(one vectorised batch).

    python -m benchmarks.exponential [--runs 100] [--max-exp 10] [--jobs 2]

Writes benchmarks/results/exponential.json and benchmarks/results/exponential.png.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import math
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from adapters.synthetic import SyntheticSource
from benchmarks import common
from topk_middleware import exponential_mechanism
from topk_middleware.lazy_noise import LazyNoiseList
from topk_middleware.noise import Gumbel

RESULTS = Path(__file__).resolve().parent / "results"
EPSILON = 1.0


def bound(m: int) -> float:
    """Theorem 4.2 with k = 1: E[accesses] <= 2 (sqrt(m) + sqrt(m/2))."""
    return 2.0 * (math.sqrt(m) + math.sqrt(m / 2.0))


@functools.cache
def plateau(m: int) -> SyntheticSource:
    return SyntheticSource(m, "plateau")


def one_run(m: int, seed: int) -> tuple[int, int, int, float]:
    """(total, sorted, random, seconds) of one exponential-mechanism run."""
    source = plateau(m)
    start = time.perf_counter()
    result = exponential_mechanism(source, EPSILON, seed=seed)
    seconds = time.perf_counter() - start
    winner_rank = int(source.ranks_of_ids(np.asarray(result.items))[0])
    if winner_rank >= source.size:  # with a gap of top - 1 = 99 >> 1/epsilon this never happens
        print(f"note: m={m} seed={seed} selected a zero-count item", file=sys.stderr)
    a = result.accesses
    return a.total, a.sorted, a.random, seconds


def summary(values: np.ndarray) -> dict[str, float]:
    return {
        "mean": float(values.mean()),
        "median": float(np.median(values)),
        "p95": float(np.percentile(values, 95)),
        "std": float(values.std(ddof=1)) if len(values) > 1 else 0.0,
        "min": float(values.min()),
        "max": float(values.max()),
    }


def batch_timing(count: int = 10**6, repeats: int = 5) -> dict[str, Any]:
    """Wall clock of `count` consecutive sorted noises in one next_sorted_batch call."""
    seconds = []
    for r in range(repeats):
        noise_list = LazyNoiseList(Gumbel(1.0), 10**12, np.random.default_rng(r))
        start = time.perf_counter()
        items, noises = noise_list.next_sorted_batch(count)
        seconds.append(time.perf_counter() - start)
        assert len(items) == count and bool(np.all(np.diff(noises) <= 0))
    eager = []
    for r in range(repeats):
        start = time.perf_counter()
        z = np.random.default_rng(r).gumbel(0.0, 1.0, count)
        np.argsort(-z, kind="stable")
        eager.append(time.perf_counter() - start)
    return {
        "count": count,
        "m": 10**12,
        "lazy_batch_seconds": {"best": min(seconds), "median": float(np.median(seconds))},
        "reference_eager_draw_and_sort_of_count_noises_seconds": float(np.median(eager)),
        "repeats": repeats,
    }


def plot(points: list[dict[str, Any]], slope: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = np.array([p["m"] for p in points], dtype=float)
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    ax.loglog(m, [p["total"]["mean"] for p in points], "o-", label=f"mean (slope {slope:.3f})")
    ax.loglog(m, [p["total"]["median"] for p in points], "s--", ms=4, label="median")
    ax.loglog(m, [p["total"]["p95"] for p in points], "^:", ms=4, label="p95")
    ax.loglog(m, [bound(int(x)) for x in m], "k-", lw=1, label="2(sqrt(m) + sqrt(m/2))")
    ax.loglog(m, np.sqrt(m), color="grey", lw=0.8, ls="--", label="sqrt(m)")
    ax.set_xlabel("m (items)")
    ax.set_ylabel("accesses.total")
    runs = min(p["runs"] for p in points)
    ax.set_title(
        f"Exponential mechanism, plateau family\neps = {EPSILON}, at least {runs} runs per point",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    common.legend_outside(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def replot(payload: dict[str, Any], path: Path) -> None:
    """The plot of a saved exponential.json (no run)."""
    plot(payload["points"], float(payload["loglog_slope_of_mean"]), path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.exponential", description=__doc__)
    parser.add_argument("--runs", type=int, default=100, help="runs per point")
    parser.add_argument("--min-exp", type=int, default=4, help="smallest m = 10**min_exp")
    parser.add_argument("--max-exp", type=int, default=10, help="largest m = 10**max_exp")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    args = parser.parse_args(argv)

    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    points = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for e in range(args.min_exp, args.max_exp + 1):
            m = 10**e
            t0 = time.perf_counter()
            seeds = range(args.seed, args.seed + args.runs)
            rows = np.array(list(pool.map(one_run, [m] * args.runs, seeds, chunksize=4)))
            total = rows[:, 0]
            point = {
                "m": m,
                "runs": args.runs,
                "total": summary(total),
                "sorted_mean": float(rows[:, 1].mean()),
                "random_mean": float(rows[:, 2].mean()),
                "bound": bound(m),
                "mean_over_bound": float(total.mean() / bound(m)),
                "mean_over_sqrt_m": float(total.mean() / math.sqrt(m)),
                "runs_over_bound": int((total > bound(m)).sum()),
                "seconds_per_run_median": float(np.median(rows[:, 3])),
                "wall_seconds": time.perf_counter() - t0,
            }
            points.append(point)
            print(
                f"m=1e{e}: mean {point['total']['mean']:.1f} median {point['total']['median']:.0f}"
                f" p95 {point['total']['p95']:.0f} bound {point['bound']:.0f}"
                f" ({point['wall_seconds']:.1f} s)",
                flush=True,
            )
    ms = np.array([p["m"] for p in points], dtype=float)
    means = np.array([p["total"]["mean"] for p in points])
    slope, intercept = np.polyfit(np.log(ms), np.log(means), 1)
    timing = batch_timing()
    print(f"log-log slope of the mean: {slope:.4f}")
    print(f"1e6 sorted noises in one batch: {timing['lazy_batch_seconds']['median']:.3f} s")
    payload = {
        "benchmark": "exponential mechanism (Wu et al. 2023, Corollary 4.3) on the plateau family",
        "source": "adapters.synthetic.SyntheticSource(m, 'plateau'): ceil(sqrt(m)) items at 99, "
        "the rest at 0",
        "epsilon": EPSILON,
        "oracle": "lazy",
        "points": points,
        "loglog_slope_of_mean": float(slope),
        "loglog_intercept_of_mean": float(intercept),
        "all_means_below_bound": bool(all(p["mean_over_bound"] < 1 for p in points)),
        "sorted_noise_batch": timing,
        "machine": {
            "cpus": os.cpu_count(),
            "jobs": args.jobs,
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "numpy": np.__version__,
            "started_utc": started,
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "exponential.json").write_text(json.dumps(payload, indent=2) + "\n")
    plot(points, float(slope), args.out / "exponential.png")
    print(f"wrote {args.out / 'exponential.json'} and {args.out / 'exponential.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
