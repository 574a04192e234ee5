"""ClickHouse benchmark: a private top-k from a ClickHouseTable against ClickHouse's own one-shot.

    python -m benchmarks.clickhouse [--m 10000000] [--families zipf distinct] [--reps 3]
    python -m benchmarks.clickhouse --quick      # one repetition, same m

For each family (benchmarks/common.py: zipf, and distinct, the untied plateau: every score
distinct, the top sqrt(mk) within 0.001) a MergeTree table (id, score) of m rows is loaded into
ClickHouse in process (chdb, a database in a temporary folder), its parts merged (OPTIMIZE
FINAL), and `prepare()` builds the rank-ordered copy (timed). Then, per repetition, in an order
rotated by one each repetition:

* `release`: private_top_k(source, k, epsilon), method "auto" (the planner, with the dialect's
  cost record), its freshness proof included (the table's parts, one query);
* `threshold`: the private threshold algorithm forced (Wu, Ohrimenko, Wirth 2023);
* `in_store`: the in-store one-shot with keyed noise (SHA-256 in ClickHouse);
* `clickhouse_oneshot`: ClickHouse's own query over the table, `ORDER BY score - b *
  log(-log(randCanonical())) DESC LIMIT k` (the one-shot mechanism with ClickHouse's random
  numbers, b the calibrated Gumbel scale): the store's own answer to the question.

The ratio of a method is the one-shot's median time over the method's, in the same run.
Results: benchmarks/results/clickhouse_1e7.json and clickhouse_1e7.png (--out elsewhere).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from . import common

METHODS = ("release", "threshold", "in_store", "clickhouse_oneshot")


def _load(con: Any, family: str, m: int, k: int) -> float:
    import pyarrow as pa

    scores = common.family_scores(family, m, k)
    ids = common.shuffled_ids(m)
    kind = "Float64" if scores.dtype.kind == "f" else "Int64"
    rows = pa.table({"id": ids, "score": scores})  # noqa: F841  (read by Python(rows) below)
    started = time.perf_counter()
    con.query(f"DROP TABLE IF EXISTS {family}")
    con.query(f"CREATE TABLE {family} (id Int64, score {kind}) ENGINE = MergeTree ORDER BY id")
    con.query(f"INSERT INTO {family} SELECT id, score FROM Python(rows)")
    con.query(f"OPTIMIZE TABLE {family} FINAL")
    return time.perf_counter() - started


def _timed(run: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    out = run()
    return time.perf_counter() - started, out


def run_family(con: Any, family: str, m: int, k: int, epsilon: float, reps: int) -> dict:
    from adapters.clickhouse import ClickHouseTable
    from topk_middleware import private_top_k

    load = _load(con, family, m, k)
    source = ClickHouseTable(con, family)
    prepare, _ = _timed(source.prepare)
    scale = private_top_k(source, k, epsilon, method="oneshot", seed=0).privacy.scale
    own = (
        f"SELECT id FROM {family} ORDER BY score - {scale!r} * log(-log(randCanonical())) "
        f"DESC LIMIT {k}"
    )
    runs: dict[str, Any] = {
        "release": lambda: private_top_k(source, k, epsilon),
        "threshold": lambda: private_top_k(source, k, epsilon, method="threshold"),
        "in_store": lambda: private_top_k(source, k, epsilon, method="oneshot"),
        "clickhouse_oneshot": lambda: con.query(own, "ArrowTable"),
    }
    seconds: dict[str, list[float]] = {name: [] for name in METHODS}
    plans: list[dict[str, Any]] = []
    for rep in range(reps):
        order = METHODS[rep % len(METHODS) :] + METHODS[: rep % len(METHODS)]
        for name in order:
            took, result = _timed(runs[name])
            seconds[name].append(took)
            if name == "release":
                plans.append(
                    {
                        "method": result.method,
                        "plan": {
                            key: result.plan.get(key)
                            for key in ("requested", "in_store", "freshness")
                        },
                        "rows_fetched": result.accesses.rows_fetched,
                        "round_trips": result.accesses.round_trips,
                    }
                )
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    own_median = medians["clickhouse_oneshot"]
    return {
        "family": family,
        "m": m,
        "k": k,
        "epsilon": epsilon,
        "load_seconds": load,
        "prepare_seconds": prepare,
        "seconds": seconds,
        "median_seconds": medians,
        "ratio_vs_clickhouse_oneshot": {
            name: own_median / value for name, value in medians.items() if value > 0
        },
        "release_plans": plans,
    }


def plot(payload: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = [r["family"] for r in payload["results"]]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.2
    for i, name in enumerate(METHODS):
        values = [r["median_seconds"][name] for r in payload["results"]]
        ax.bar(np.arange(len(families)) + i * width, values, width, label=name)
    ax.set_xticks(np.arange(len(families)) + 1.5 * width, families)
    ax.set_yscale("log")
    ax.set_ylabel("median seconds per release")
    m = payload["results"][0]["m"]
    ax.set_title(f"ClickHouse (chdb), m = {m:.0e}, k = {payload['results'][0]['k']}")
    common.legend_below(fig, [ax])
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    import chdb

    parser = argparse.ArgumentParser(prog="python -m benchmarks.clickhouse", description=__doc__)
    parser.add_argument("--m", type=float, default=1e7)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--families", nargs="+", default=["zipf", "distinct"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one repetition")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    m, reps = int(args.m), 1 if args.quick else args.reps
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="topk_clickhouse_") as folder:
        con = chdb.connect(str(Path(folder) / "bench.chdb"))
        results = [
            run_family(con, family, m, args.k, args.epsilon, reps) for family in args.families
        ]
        con.close()
    payload = {
        "machine": common.machine_info(),
        "chdb": chdb.__version__,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "quick": args.quick,
        "results": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"clickhouse_1e{round(np.log10(m))}"
    common.write_json(args.out / f"{stem}.json", payload)
    plot(payload, args.out / f"{stem}.png")
    for r in results:
        ratios = ", ".join(f"{n} {v:.2f}x" for n, v in r["ratio_vs_clickhouse_oneshot"].items())
        print(f"{r['family']}: prepare {r['prepare_seconds']:.1f} s; {ratios}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
