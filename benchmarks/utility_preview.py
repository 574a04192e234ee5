"""The preview's cost on a large table read as it is now (target: under 5 s at m = 10^7).

    python -m benchmarks utility --preview-m 1e7 [--preview-store duckdb postgres]

A table of m rows, a Zipf head of 10^5 counts floor(10^6 / rank) over zeros (1,991 distinct
counts), in DuckDB (a file; DuckDBTable not frozen and never prepared: every run reads the
table itself) or PostgreSQL (a database of its own; PostgresTable(mode="live"), whose
prepare() installs the (score DESC, id) B-tree and the position table, no copy). preview() at
k = 100, its 6 default epsilons x 3 default mechanisms x 200 trials, 3 times: wall and CPU
seconds with the load average, rows read and round trips; the read alone (read_histogram in a
snapshot, its wall seconds); and, in the same run, the store's own queries as the reference of
the ratio: its exact top-k (ORDER BY score DESC, id LIMIT k) and its exact histogram (GROUP BY
score). On DuckDB also `topk-middleware preview` end to end, a fresh process each time (Python's
start and imports, scipy's half a second among them, included). Results:
benchmarks/results/utility_preview_<m>.json.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HEAD = 100_000
PG_DSN = os.environ.get("TOPK_PG_DSN", "host=127.0.0.1 port=5432 dbname=test")


def _best(seconds: list[float]) -> float:
    return min(seconds)


def cli_seconds(path: str, k: int, reps: int) -> list[float]:
    """`topk-middleware preview` on the DuckDB file, end to end in a fresh process each time
    (Python's start and imports included: what the owner waits for)."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    argv = [sys.executable, "-m", "frontends", "preview", path, "--table", "votes"]
    argv += ["--id", "item", "--score", "votes", "--k", str(k)]
    seconds = []
    for _ in range(reps):
        begun = time.perf_counter()
        subprocess.run(argv, env=env, check=True, capture_output=True)
        seconds.append(time.perf_counter() - begun)
    return seconds


@contextmanager
def duckdb_table(m: int, found: dict[str, Any]) -> Iterator[tuple[Any, Callable[[str], Any]]]:
    """The DuckDB table and a function running one statement on it (in its own connection);
    the CLI's end-to-end seconds into `found` first (the file is not open elsewhere then)."""
    import duckdb

    from adapters.duckdb import DuckDBTable

    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "votes.duckdb")
        with duckdb.connect(path) as con:
            con.execute(
                "CREATE TABLE votes AS SELECT range AS item, CASE WHEN range < "
                f"{HEAD} THEN floor(1e6 / (range + 1))::BIGINT ELSE 0 END AS votes "
                f"FROM range({int(m)})"
            )
        found["cli_seconds"] = cli_seconds(path, 100, 3)
        found["cli_load_average_1min"] = os.getloadavg()[0]
        source = DuckDBTable(path, "votes", id="item", score="votes")
        query = duckdb.connect(path, read_only=False)
        try:
            yield source, lambda text: query.execute(text).fetchall()
        finally:
            query.close()
            source.close()


@contextmanager
def postgres_table(m: int, found: dict[str, Any]) -> Iterator[tuple[Any, Callable[[str], Any]]]:
    """The PostgreSQL table (mode='live', prepared) in a database made for the run, dropped
    after it; a function running one statement there."""
    import psycopg

    from adapters.postgres import PostgresTable

    name = "topk_preview_" + uuid.uuid4().hex[:8]
    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    dsn = f"{PG_DSN} dbname={name}"
    try:
        with psycopg.connect(dsn, autocommit=True) as con:
            con.execute(
                "CREATE TABLE votes AS SELECT g AS item, CASE WHEN g < "
                f"{HEAD} THEN floor(1e6 / (g + 1))::bigint ELSE 0 END AS votes "
                f"FROM generate_series(0, {int(m) - 1}) AS g"
            )
            con.execute("ALTER TABLE votes ADD PRIMARY KEY (item)")
            source = PostgresTable(dsn, "votes", id="item", score="votes", mode="live")
            source.prepare()
            con.execute("VACUUM ANALYZE votes")
            try:
                yield source, lambda text: con.execute(text).fetchall()
            finally:
                source.close()
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


STORES = {"duckdb": duckdb_table, "postgres": postgres_table}
LABELS = {
    "duckdb": "DuckDB, not frozen, unprepared (reads the table)",
    "postgres": "PostgreSQL mode='live' (B-tree and position table, no copy)",
}


def preview_timing(m: int, store: str = "duckdb", k: int = 100, reps: int = 3) -> dict[str, Any]:
    """The module docstring's figures for one store."""
    from topk_middleware import preview
    from topk_middleware.access import CountedAccess
    from topk_middleware.preview import (
        DEFAULT_EPSILONS,
        DEFAULT_METHODS,
        read_histogram,
        smallest_scale,
    )

    started = time.perf_counter()
    extra: dict[str, Any] = {}
    with STORES[store](m, extra) as (source, run):
        build = time.perf_counter() - started
        topk_sql = f"SELECT item, votes FROM votes ORDER BY votes DESC, item LIMIT {k}"
        histogram_sql = "SELECT votes, count(*) FROM votes GROUP BY votes"
        times, cpu, loads, reads, topk, histogram = [], [], [], [], [], []
        for _ in range(reps):
            loads.append(os.getloadavg()[0])
            begun, used = time.perf_counter(), time.process_time()
            found = preview(source, k)
            times.append(time.perf_counter() - begun)
            cpu.append(time.process_time() - used)
            begun = time.perf_counter()
            with source.snapshot():
                access = CountedAccess(source)
                scale = smallest_scale(k, access.m, DEFAULT_EPSILONS, DEFAULT_METHODS, 1e-6)
                read_histogram(access, k, scale)
            reads.append(time.perf_counter() - begun)
            for query, into in ((topk_sql, topk), (histogram_sql, histogram)):
                begun = time.perf_counter()
                run(query)
                into.append(time.perf_counter() - begun)
    return {
        "store": LABELS[store],
        "m": m,
        "k": k,
        "points": len(found.outcomes),
        "trials": 200,
        "seconds": times,
        "cpu_seconds": cpu,
        "load_average_1min": loads,
        "read_seconds": reads,
        "store_topk_seconds": topk,
        "store_histogram_seconds": histogram,
        "ratio_to_store_topk": _best(times) / _best(topk),
        "ratio_to_store_histogram": _best(times) / _best(histogram),
        "build_seconds": build,
        "rows_fetched": found.accesses.rows_fetched,
        "round_trips": found.accesses.round_trips,
        "histogram_runs": found.histogram_runs,
        **extra,
    }
