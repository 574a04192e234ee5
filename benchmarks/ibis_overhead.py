"""IbisTable against the native adapters, on the same table of each backend.

    python -m benchmarks.ibis_overhead [--m 200000] [--reps 5] [--methods ...] [--quick]

For each backend (DuckDB in process, SQLite in a file, PostgreSQL at TOPK_PG_DSN), each
family (zipf, and "distinct": the untied plateau) and each method ("threshold", and
"oneshot_in_store": the keyed one-shot in the store where it runs there, else over a full
read), one table (id BIGINT a seeded permutation, score; benchmarks/common.py), and the median
seconds of a release (k = 10, epsilon = 1, no seed), interleaved rep by rep after one untimed
warm-up:

* ``ibis``: IbisTable(backend.table(name)) (adapters/ibis.py: no copy, reads the table);
* ``native``: the project's adapter for that store over a rank-ordered copy (DuckDBTable,
  SQLAlchemyTable on SQLite, PostgresTable; frozen, prepare() untimed);
* ``ibis_queries`` / ``native_round_trips``: the round trips of one release;
* ``ibis_in_store`` / ``native_in_store``: whether the one-shot ran in the store.

Results: ibis_overhead.json in benchmarks/results/ (a --quick run: m = 10^4, 2 reps, in
benchmarks/scratch/), or in --out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import duckdb
import ibis
import psycopg
import pyarrow as pa
import sqlalchemy as sa

from adapters.duckdb import DuckDBTable
from adapters.ibis import IbisTable
from adapters.postgres import PostgresTable
from adapters.sqlalchemy import SQLAlchemyTable
from topk_middleware import private_top_k

from . import common

FAMILIES = ("zipf", "distinct")
METHODS = ("threshold", "oneshot_in_store")
DEFAULT_PG_DSN = "host=127.0.0.1 port=5432 dbname=test"


def _data(family: str, m: int, k: int) -> pa.Table:
    scores = common.family_scores(family, m, k)
    kind = pa.int64() if scores.dtype.kind in "iu" else pa.float64()
    return pa.table({"id": common.shuffled_ids(m), "score": pa.array(scores, type=kind)})


def _duckdb(data: pa.Table, folder: Path) -> tuple[Any, Any, Any]:
    raw = duckdb.connect()
    raw.execute("CREATE TABLE votes AS SELECT * FROM data")
    native = DuckDBTable(raw, "votes", frozen=True)
    native.prepare()
    return IbisTable(ibis.duckdb.from_connection(raw).table("votes")), native, raw.close


def _sqlite(data: pa.Table, folder: Path) -> tuple[Any, Any, Any]:
    path = folder / f"votes_{uuid.uuid4().hex[:6]}.sqlite"
    engine = sa.create_engine(f"sqlite:///{path}")
    kind = "INTEGER" if pa.types.is_integer(data.schema.field("score").type) else "REAL"
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE votes (id INTEGER PRIMARY KEY, score {kind})")
        conn.exec_driver_sql(
            "INSERT INTO votes VALUES (?, ?)",
            list(zip(data["id"].to_pylist(), data["score"].to_pylist(), strict=True)),
        )
    native = SQLAlchemyTable(engine, "votes", frozen=True)
    native.prepare()
    backend = ibis.sqlite.connect(path)
    return IbisTable(backend.table("votes")), native, engine.dispose


def _postgres(data: pa.Table, folder: Path) -> tuple[Any, Any, Any]:
    dsn = os.environ.get("TOPK_PG_DSN", DEFAULT_PG_DSN)
    name = f"topk_ibis_bench_{uuid.uuid4().hex[:6]}"
    conn = psycopg.connect(dsn, autocommit=True)
    kind = "bigint" if pa.types.is_integer(data.schema.field("score").type) else "float8"
    conn.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, score {kind})")
    with conn.cursor() as cur, cur.copy(f"COPY {name} FROM STDIN") as copy:
        for row in zip(data["id"].to_pylist(), data["score"].to_pylist(), strict=True):
            copy.write_row(row)
    conn.execute(f"ANALYZE {name}")
    native = PostgresTable(dsn, name, frozen=True)
    native.prepare()
    parts = psycopg.conninfo.conninfo_to_dict(dsn)
    backend = ibis.postgres.connect(
        host=parts.get("host"),
        port=int(parts.get("port", 5432)),
        database=parts.get("dbname"),
        user=parts.get("user"),
        password=parts.get("password"),
    )

    def close() -> None:
        backend.disconnect()
        native.uninstall()
        native.close()
        conn.execute(f"DROP TABLE IF EXISTS {name}")
        conn.close()

    return IbisTable(backend.table(name)), native, close


BACKENDS = {"duckdb": _duckdb, "sqlite": _sqlite, "postgres": _postgres}


def measure(
    backend: str, family: str, methods: list[str], m: int, k: int, reps: int, folder: Path
) -> list[dict]:
    """Every method on one pair of stores over one table (made once)."""
    ours, native, close = BACKENDS[backend](_data(family, m, k), folder)
    try:
        return [_measure(ours, native, backend, family, method, k, reps) for method in methods]
    finally:
        close()


def _measure(
    ours: Any, native: Any, backend: str, family: str, method: str, k: int, reps: int
) -> dict:
    runs = {
        "ibis": lambda: private_top_k(ours, k, 1.0, method=method),
        "native": lambda: private_top_k(native, k, 1.0, method=method),
    }
    first = {label: run() for label, run in runs.items()}  # the untimed warm-up
    times: dict[str, list[float]] = {label: [] for label in runs}
    for rep in range(reps):
        for label in list(runs)[rep % 2 :] + list(runs)[: rep % 2]:
            start = time.perf_counter()
            runs[label]()
            times[label].append(time.perf_counter() - start)
    medians = {label: statistics.median(values) for label, values in times.items()}
    return {
        "backend": backend,
        "family": family,
        "method": method,
        "median_seconds": medians,
        "ratio_ibis_to_native": medians["ibis"] / medians["native"],
        "ibis_queries": first["ibis"].accesses.round_trips,
        "native_round_trips": first["native"].accesses.round_trips,
        "ibis_in_store": bool(first["ibis"].diagnostics.plan["in_store"]),
        "native_in_store": bool(first["native"].diagnostics.plan["in_store"]),
        "seconds": times,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=200_000)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    common.add_output_arguments(parser, "m = 10^4, 2 reps")
    args = parser.parse_args(argv)
    m, reps = (10**4, 2) if args.quick else (args.m, args.reps)
    load_before = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory() as scratch:
        results = [
            row
            for backend in args.backends
            for family in FAMILIES
            for row in measure(backend, family, args.methods, m, args.k, reps, Path(scratch))
        ]
    payload = {
        "benchmark": "ibis_overhead",
        "m": m,
        "load_average_before": load_before,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "k": args.k,
        "reps": reps,
        "results": results,
        "machine": common.machine_info(),
    }
    path = common.write_json(common.output_dir(args) / "ibis_overhead.json", payload)
    for r in results:
        med = r["median_seconds"]
        print(
            f"{r['backend']:9s} {r['family']:9s} {r['method']:17s} "
            f"ibis {med['ibis'] * 1e3:9.1f} ms "
            f"({r['ibis_queries']} queries)  native {med['native'] * 1e3:9.1f} ms "
            f"({r['native_round_trips']})  ratio {r['ratio_ibis_to_native']:.2f}"
        )
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
