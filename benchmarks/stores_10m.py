"""Private threshold algorithm vs a one-shot full scan on real stores at m = 10^7.

    python -m benchmarks.stores_10m [--m 10000000] [--stores duckdb postgres] [--families zipf]

For each store and data family: load the table (DuckDB: from numpy; PostgreSQL: binary COPY), run
`prepare()` (validation, rank table and its indexes), then time `private_top_k` with
method="threshold" (Algorithm 3, default lazy oracle) for several seeds and with method="oneshot"
(Algorithm 2: every row read into the client), recording wall time, rows read and round trips.
Writes benchmarks/results/stores_10m.json. Tables live in a temporary DuckDB file and in a schema
of their own on the PostgreSQL server (TOPK_PG_DSN), dropped at the end.
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

import numpy as np

from topk_middleware import private_top_k

from .common import DEFAULT_PG_DSN, RESULTS_DIR, family_scores, machine_info, write_json


def _copy_payload(ids: np.ndarray, scores: np.ndarray) -> bytes:
    """Rows (id int8, score int8) in PostgreSQL's binary COPY format, built by numpy."""
    row = np.dtype([("n", ">i2"), ("l1", ">i4"), ("id", ">i8"), ("l2", ">i4"), ("score", ">i8")])
    data = np.empty(len(ids), dtype=row)
    data["n"], data["l1"], data["l2"] = 2, 8, 8
    data["id"], data["score"] = ids, scores
    header = b"PGCOPY\n\xff\r\n\x00" + (0).to_bytes(4, "big") + (0).to_bytes(4, "big")
    return header + data.tobytes() + b"\xff\xff"


def _runs(source: Any, k: int, seeds: int, oneshot_runs: int, m: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for method, repeats in (("threshold", seeds), ("oneshot", oneshot_runs)):
        runs = []
        for seed in range(repeats):
            started = time.perf_counter()
            result = private_top_k(source, k=k, epsilon=1.0, method=method, seed=seed)
            seconds = time.perf_counter() - started
            a = result.accesses
            runs.append(
                {
                    "seed": seed,
                    "seconds": seconds,
                    "rows_fetched": a.rows_fetched,
                    "round_trips": a.round_trips,
                    "accesses_total": a.total,
                    "items": [int(i) for i in result.items],
                }
            )
            print(
                f"    {method:<9} seed {seed}: {seconds * 1000:9.1f} ms, rows read "
                f"{a.rows_fetched:>10,} ({a.rows_fetched / m:.4%}), {a.round_trips} round trips"
            )
        times = [r["seconds"] for r in runs]
        out[method] = {
            "median_seconds": statistics.median(times),
            "median_rows_fetched": statistics.median(r["rows_fetched"] for r in runs),
            "runs": runs,
        }
    return out


def bench_duckdb(families: list[str], m: int, k: int, seeds: int, oneshot: int) -> dict:
    import duckdb

    from adapters.duckdb import DuckDBTable

    results: dict[str, Any] = {"version": duckdb.__version__}
    with tempfile.TemporaryDirectory() as folder:
        con = duckdb.connect(str(Path(folder) / "bench.duckdb"))
        for family in families:
            print(f"duckdb / {family}")
            ids = np.random.default_rng(0).permutation(m).astype(np.int64)
            scores = family_scores(family, m, k).astype(np.int64)
            data = {"id": ids, "score": scores}  # noqa: F841 (DuckDB scans it by name)
            started = time.perf_counter()
            con.execute(f"CREATE TABLE {family} AS SELECT id, score FROM data")
            con.execute("CHECKPOINT")
            load = time.perf_counter() - started
            source = DuckDBTable(con, family)
            started = time.perf_counter()
            source.prepare()
            con.execute("CHECKPOINT")
            prepare = time.perf_counter() - started
            print(f"    load {load:.1f} s, prepare {prepare:.1f} s\n{source.check()}")
            results[family] = {
                "load_seconds": load,
                "prepare_seconds": prepare,
                "access_plan": str(source.check()),
                **_runs(source, k, seeds, oneshot, m),
            }
        con.close()
    return results


def bench_postgres(dsn: str, families: list[str], m: int, k: int, seeds: int, oneshot: int) -> dict:
    import psycopg
    from psycopg import sql

    from adapters.postgres import PostgresTable

    schema = f"topk_bench_{uuid.uuid4().hex[:8]}"
    conn = psycopg.connect(dsn, autocommit=True)
    results: dict[str, Any] = {"version": conn.execute("SHOW server_version").fetchone()[0]}
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        for family in families:
            print(f"postgres / {family}")
            table = sql.Identifier(schema, family)
            ids = np.random.default_rng(0).permutation(m).astype(np.int64)
            scores = family_scores(family, m, k).astype(np.int64)
            started = time.perf_counter()
            conn.execute(sql.SQL("CREATE TABLE {} (id bigint, score bigint)").format(table))
            payload = _copy_payload(ids, scores)
            copy = sql.SQL("COPY {} FROM STDIN (FORMAT BINARY)").format(table)
            with conn.cursor() as cur, cur.copy(copy) as writer:
                for at in range(0, len(payload), 1 << 24):
                    writer.write(payload[at : at + (1 << 24)])
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(table))
            load = time.perf_counter() - started
            source = PostgresTable(dsn, family, schema=schema)
            started = time.perf_counter()
            source.prepare()
            prepare = time.perf_counter() - started
            print(f"    COPY {load:.1f} s, prepare {prepare:.1f} s\n{source.check()}")
            results[family] = {
                "copy_seconds": load,
                "prepare_seconds": prepare,
                "access_plan": str(source.check()),
                **_runs(source, k, seeds, oneshot, m),
            }
            source.close()
    finally:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
        conn.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stores_10m")
    parser.add_argument("--m", type=int, default=10**7)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--stores", nargs="+", default=["duckdb", "postgres"])
    parser.add_argument("--families", nargs="+", default=["zipf", "plateau"])
    parser.add_argument("--seeds", type=int, default=5, help="threshold runs (seeds 0..n-1)")
    parser.add_argument("--oneshot-runs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "stores_10m.json")
    args = parser.parse_args(argv)
    dsn = os.environ.get("TOPK_PG_DSN", DEFAULT_PG_DSN)
    payload: dict[str, Any] = {
        "machine": machine_info(dsn if "postgres" in args.stores else None),
        "m": args.m,
        "k": args.k,
        "epsilon": 1.0,
        "noise": "gumbel",
        "stores": {},
    }
    for store in args.stores:
        if store == "duckdb":
            payload["stores"]["duckdb"] = bench_duckdb(
                args.families, args.m, args.k, args.seeds, args.oneshot_runs
            )
        elif store == "postgres":
            payload["stores"]["postgres"] = bench_postgres(
                dsn, args.families, args.m, args.k, args.seeds, args.oneshot_runs
            )
        else:
            parser.error(f"unknown store {store!r}")
    print(f"wrote {write_json(args.out, payload)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
