"""The Polars namespace against ArraySource.from_polars on the same frame.

    python -m benchmarks.polars_ns [--m 10000000] [--reps 5] [--quick]

A DataFrame of m rows (id Int64 a seeded permutation, score the zipf counts of
benchmarks/common.py in a seeded random order), k = 10, epsilon = 1, no seed; interleaved rep by
rep after one untimed warm-up of each:

* ``namespace``: ``frame.topk.private_top_k(k=, epsilon=)`` (frontends/polars_ns.py), the frame
  of rank and item included;
* ``from_polars``: ``private_top_k(ArraySource.from_polars(frame), k, epsilon)``;
* ``lazy_namespace``: ``frame.lazy().with_columns(...).topk.private_top_k(...)`` over a
  LazyFrame with eight more columns, of which the namespace collects two.

Results: polars_ns.json (medians, ratios, every rep) in benchmarks/results/ (a --quick run:
m = 10^5, 3 reps, in benchmarks/scratch/), or in --out.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import polars as pl

import frontends.polars_ns  # noqa: F401 - registers the namespace
from adapters.memory import ArraySource
from topk_middleware import private_top_k

from . import common


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=10**7)
    parser.add_argument("--reps", type=int, default=5)
    common.add_output_arguments(parser, "m = 10^5, 3 reps")
    args = parser.parse_args(argv)
    m, reps, k, epsilon = (10**5, 3, 10, 1.0) if args.quick else (args.m, args.reps, 10, 1.0)
    order = np.random.default_rng(1).permutation(m)
    frame = pl.DataFrame(
        {"id": common.shuffled_ids(m), "score": common.family_scores("zipf", m, k)[order]}
    )
    wide = frame.lazy().with_columns([pl.col("score").alias(f"extra{i}") for i in range(8)])
    runs = {
        "namespace": lambda: frame.topk.private_top_k(k=k, epsilon=epsilon),
        "from_polars": lambda: private_top_k(ArraySource.from_polars(frame), k, epsilon),
        "lazy_namespace": lambda: wide.topk.private_top_k(k=k, epsilon=epsilon),
    }
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {label: [] for label in runs}
    labels = list(runs)
    for rep in range(reps):
        for label in labels[rep % len(labels) :] + labels[: rep % len(labels)]:
            start = time.perf_counter()
            runs[label]()
            times[label].append(time.perf_counter() - start)
    medians = {label: statistics.median(values) for label, values in times.items()}
    payload = {
        "benchmark": "polars_ns",
        "m": m,
        "k": k,
        "epsilon": epsilon,
        "reps": reps,
        "median_seconds": medians,
        "ratio_namespace_to_from_polars": medians["namespace"] / medians["from_polars"],
        "seconds": times,
        "machine": common.machine_info(),
    }
    path = common.write_json(common.output_dir(args) / "polars_ns.json", payload)
    for label, value in medians.items():
        print(f"{label:15s} {value * 1e3:9.1f} ms")
    print(f"namespace / from_polars {payload['ratio_namespace_to_from_polars']:.3f}")
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
