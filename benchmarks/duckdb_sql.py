"""The private top-k called from DuckDB SQL against the same release from Python.

    python -m benchmarks.duckdb_sql [--m 10000000] [--reps 11] [--quick]

For each family (zipf, and "distinct": the untied plateau, Theorem 5.4's hard instance without
ties) it loads a DuckDB table (id BIGINT a seeded permutation, score; benchmarks/common.py),
runs prepare() (frozen: the sublinear path reads the rank-ordered copy) and registers it
(frontends/duckdb_sql.py). Then, interleaved rep by rep after one untimed warm-up of each, no
seed (the secure generator), both charged to one SQLite ledger, for oblivious True (the
registration's default) and False (the adaptive threshold algorithm):

* ``sql``: ``SELECT * FROM private_top_k(table, k, epsilon)`` on the registering connection;
* ``python``: private_top_k(DuckDBTable on a cursor, k, epsilon, budget=) from this process;
* ``oneshot_sql``: the one-shot mechanism pushed into SQL (ORDER BY score + Gumbel noise
  LIMIT k), no charge: the store's own one-shot query, for scale.

Results: duckdb_sql.json (medians, ratio sql / python, every rep) in benchmarks/results/ (a
--quick run: m = 10^5, 3 reps, in benchmarks/scratch/), or in --out.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from adapters.duckdb import DuckDBTable
from frontends.duckdb_sql import register_private_top_k
from topk_middleware import PrivacyLedger, private_top_k

from . import common

FAMILIES = ("zipf", "distinct")


def _load(con: duckdb.DuckDBPyConnection, name: str, family: str, m: int, k: int) -> None:
    data = pa.table(  # noqa: F841 - read by DuckDB's replacement scan below
        {"id": common.shuffled_ids(m), "score": common.family_scores(family, m, k)}
    )
    con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT * FROM data")


def _timed(run: Any) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def measure(family: str, m: int, k: int, epsilon: float, reps: int, folder: Path) -> dict:
    con = duckdb.connect()
    name = f"votes_{family}"
    _load(con, name, family, m, k)
    table = DuckDBTable(con, name, frozen=True)
    started = time.perf_counter()
    table.prepare()
    prepare_seconds = time.perf_counter() - started
    ledger = PrivacyLedger(f"sqlite:///{folder / f'ledger_{family}.db'}")
    out: dict[str, Any] = {"family": family, "prepare_seconds": prepare_seconds, "modes": {}}
    scale = k / epsilon  # Gumbel one-shot: per-item scale k / epsilon (Fact 3.3)
    oneshot = f"SELECT id FROM {name} ORDER BY score - {scale!r} * ln(-ln(random())) DESC LIMIT {k}"
    for oblivious in (True, False):
        principal = f"analyst_{int(oblivious)}"
        budget = ledger.budget(principal, 1e9, 0.5)
        register_private_top_k(
            con, ledger=ledger, principal=principal, tables=[table], oblivious=oblivious
        )
        reader = DuckDBTable(con.cursor(), name, frozen=True)
        query = f"SELECT * FROM private_top_k('{name}', {k}, {epsilon!r})"
        runs = {
            "sql": lambda q=query: con.execute(q).fetchall(),
            "python": lambda b=budget, r=reader, o=oblivious: private_top_k(
                r, k, epsilon, budget=b, oblivious=o
            ),
            "oneshot_sql": lambda: con.execute(oneshot).fetchall(),
        }
        for run in runs.values():  # warm-up, untimed
            run()
        times: dict[str, list[float]] = {label: [] for label in runs}
        labels = list(runs)
        for rep in range(reps):
            for label in labels[rep % len(labels) :] + labels[: rep % len(labels)]:
                times[label].append(_timed(runs[label]))
        medians = {label: statistics.median(values) for label, values in times.items()}
        out["modes"]["oblivious" if oblivious else "adaptive"] = {
            "median_seconds": medians,
            "ratio_sql_to_python": medians["sql"] / medians["python"],
            "ratio_sql_to_oneshot_sql": medians["sql"] / medians["oneshot_sql"],
            "seconds": times,
        }
    ledger.close()
    con.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=10**7)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=11)
    common.add_output_arguments(parser, "m = 10^5, 3 reps")
    args = parser.parse_args(argv)
    m, reps = (10**5, 3) if args.quick else (args.m, args.reps)
    with tempfile.TemporaryDirectory() as scratch:
        results = [
            measure(family, m, args.k, args.epsilon, reps, Path(scratch)) for family in FAMILIES
        ]
    payload = {
        "benchmark": "duckdb_sql",
        "m": m,
        "k": args.k,
        "epsilon": args.epsilon,
        "reps": reps,
        "families": results,
        "machine": common.machine_info(),
    }
    path = common.write_json(common.output_dir(args) / "duckdb_sql.json", payload)
    for result in results:
        for mode, found in result["modes"].items():
            med = found["median_seconds"]
            print(
                f"{result['family']:9s} {mode:9s} sql {med['sql'] * 1e3:8.1f} ms  python "
                f"{med['python'] * 1e3:8.1f} ms  ratio {found['ratio_sql_to_python']:.2f}  "
                f"one-shot query {med['oneshot_sql'] * 1e3:8.1f} ms"
            )
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
