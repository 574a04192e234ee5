"""The cost of building an in-memory source: ArraySource over 10^6 text ids, from a list, a
numpy array, a pyarrow Table and a Polars DataFrame, against integer ids of the same histogram.

    python -m benchmarks.inputs [--m 1e6] [--reps 5] [--out DIR]

Each rep builds every source once, in turning order (interleaved); medians of wall and CPU
seconds. CPU seconds tell a loaded machine's figure from a quiet one's. Writes inputs.json to
--out (default benchmarks/scratch/; benchmarks/results/ keeps the committed runs).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from adapters.memory import ArraySource

from . import common


def _inputs(m: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    text = [f"item-{i:07d}-{(i * 7919) % 1000}" for i in rng.permutation(m).tolist()]
    scores = rng.integers(0, 1000, size=m)
    import polars as pl
    import pyarrow as pa

    return {
        "scores": scores,
        "builds": {
            "int ids (numpy)": lambda: ArraySource(scores, np.arange(m) * 3 + 1),
            "text ids (list of str)": lambda: ArraySource(scores, text),
            "text ids (numpy str array)": lambda: ArraySource(scores, np.array(text)),
            "text ids (pyarrow Table)": lambda: ArraySource.from_arrow(
                pa.table({"id": text, "score": scores})
            ),
            "text ids (Polars DataFrame)": lambda: ArraySource.from_polars(
                pl.DataFrame({"id": text, "score": scores})
            ),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.inputs", description=__doc__)
    parser.add_argument("--m", type=float, default=1e6, help="number of items (default 1e6)")
    parser.add_argument("--reps", type=int, default=5, help="interleaved reps (default 5)")
    parser.add_argument("--out", type=Path, default=common.SCRATCH_DIR, help="results folder")
    args = parser.parse_args(argv)
    m = int(args.m)
    builds = _inputs(m)["builds"]
    wall: dict[str, list[float]] = {name: [] for name in builds}
    cpu: dict[str, list[float]] = {name: [] for name in builds}
    for rep in range(args.reps):
        names = list(builds) if rep % 2 == 0 else list(reversed(builds))
        for name in names:
            started, cpu_started = time.perf_counter(), time.process_time()
            builds[name]()
            wall[name].append(time.perf_counter() - started)
            cpu[name].append(time.process_time() - cpu_started)
    results = [
        {
            "input": name,
            "m": m,
            "wall_median_s": statistics.median(wall[name]),
            "cpu_median_s": statistics.median(cpu[name]),
            "wall_s": wall[name],
        }
        for name in builds
    ]
    payload = {
        "benchmark": "inputs",
        "machine": common.machine_info(),
        "config": {"m": m, "reps": args.reps},
        "results": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = common.write_json(args.out / "inputs.json", payload)
    for r in results:
        print(f"{r['input']:30} wall {r['wall_median_s']:.3f} s  cpu {r['cpu_median_s']:.3f} s")
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
