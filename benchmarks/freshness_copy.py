"""Copy mode on a changing table, PostgreSQL (psycopg) and SQLAlchemy, against the store's query.

    python -m benchmarks freshness-copy [--m 1e6] [--reps 5] [--families zipf plateau ...]
        [--sqlalchemy-m 1e5] [--dialects sqlite duckdb postgresql mariadb] [--skip-postgres]

PostgreSQL copy mode (`PostgresTable`, not frozen), for each family at m rows (id bigint PRIMARY
KEY, score NOT NULL, rows in random order, ANALYZEd): `prepare()`, then interleaved rep by rep

- ``current``: a default release (`auto`) on the copy proven current;
- ``stale``: one row UPDATEd (its count moved by 1), then a default release: the copy is no
  longer current, and the release reads the table or refreshes the copy (diagnostics.plan);
- ``sql``: PostgreSQL's own one-shot query `ORDER BY score - b*ln(-ln(random())) DESC LIMIT k`
  (b the release's Gumbel scale).

SQLAlchemy copy mode (not frozen) on each dialect at `--sqlalchemy-m` rows (and PostgreSQL at
m), zipf: rep by rep, `prepare(refresh=True)` and a default release on the table unwritten
since, then one after a one-row UPDATE, interleaved with the dialect's own one-shot query
(SQLite: a registered Gumbel function; MariaDB: RAND()).

Ratios are the query's median over the release's: above 1 the release is faster. Results go
to benchmarks/results/freshness_copy.json (or --out / --name).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from . import common
from .freshness import round_scores
from .wallclock import gumbel_scale

FAMILIES = ("zipf", "plateau", "distinct", "uniform")
DIALECTS = ("sqlite", "duckdb", "postgresql", "mariadb")


def _time(run: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = run()
    return time.perf_counter() - start, out


def _summary(values: list[float]) -> dict[str, Any]:
    return {"seconds": values, "median": statistics.median(values), "min": min(values)}


def _load_postgres(con: Any, table: str, ids: np.ndarray, scores: np.ndarray) -> None:
    kind = "float8" if scores.dtype.kind == "f" else "bigint"
    con.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
    con.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, score {kind} NOT NULL)")
    with con.cursor() as cur, cur.copy(f"COPY {table} (id, score) FROM STDIN") as copy:
        for row in zip(ids.tolist(), scores.tolist(), strict=True):
            copy.write_row(row)
    con.execute(f"VACUUM ANALYZE {table}")


def postgres_family(dsn: str, family: str, m: int, k: int, epsilon: float, reps: int) -> dict:
    """One family on PostgreSQL copy mode (module docstring)."""
    import psycopg

    from adapters.postgres import PostgresTable
    from topk_middleware import private_top_k

    con = psycopg.connect(dsn, autocommit=True)
    table = f"topk_bench_copy_{family}_{m}"
    scale = gumbel_scale(k, epsilon, m)
    scores = round_scores(family, m, k, scale)
    ids = common.shuffled_ids(m, seed=0)
    order = np.random.default_rng(1).permutation(m)
    _load_postgres(con, table, ids[order], scores[order])
    source = PostgresTable(dsn, table)
    prepare_seconds, _ = _time(source.prepare)
    query = f"SELECT id FROM {table} ORDER BY score - {scale!r} * ln(-ln(random())) DESC LIMIT {k}"
    seeds = iter(range(1, 10**6))
    rng = random.Random(m)

    def release() -> Any:
        return private_top_k(source, k=k, epsilon=epsilon, seed=next(seeds))

    def write() -> None:
        item = int(ids[rng.randrange(m)])
        con.execute(f"UPDATE {table} SET score = score + 1 WHERE id = %s", [item])

    def sql() -> Any:
        return con.execute(query).fetchall()

    release(), sql()  # warm-up
    current, stale, oneshot, plans = [], [], [], []
    for _ in range(reps):
        source.prepare(refresh=True)
        current.append(_time(release)[0])
        oneshot.append(_time(sql)[0])
        write()
        seconds, result = _time(release)
        stale.append(seconds)
        plans.append(
            {
                "freshness": result.plan.get("freshness"),
                "chosen": result.plan.get("auto", {}).get("chosen"),
                "in_store": result.plan.get("in_store"),
            }
        )
        oneshot.append(_time(sql)[0])
    source.uninstall()
    source.close()
    con.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
    con.close()
    sql_median = statistics.median(oneshot)
    return {
        "store": "postgres-copy",
        "family": family,
        "m": m,
        "k": k,
        "epsilon": epsilon,
        "prepare_seconds": prepare_seconds,
        "current": _summary(current),
        "stale": _summary(stale),
        "sql": _summary(oneshot),
        "plans": plans,
        "sql_vs_current": sql_median / statistics.median(current),
        "sql_vs_stale": sql_median / statistics.median(stale),
    }


def _engine(dialect: str, dsn: str, workdir: Path) -> Any:
    import sqlalchemy as sa

    if dialect == "sqlite":
        return sa.create_engine(f"sqlite:///{workdir / 'bench.sqlite'}")
    if dialect == "duckdb":
        return sa.create_engine(f"duckdb:///{workdir / 'bench.duckdb'}")
    if dialect == "postgresql":
        parts = dict(p.split("=", 1) for p in dsn.split())
        return sa.create_engine(
            f"postgresql+psycopg://{parts.get('user', 'postgres')}@{parts['host']}:"
            f"{parts.get('port', 5432)}/{parts['dbname']}"
        )
    return sa.create_engine("mysql+pymysql://root@127.0.0.1:3306/test")


def sqlalchemy_dialect(
    dialect: str, dsn: str, workdir: Path, m: int, k: int, epsilon: float, reps: int
) -> dict:
    """SQLAlchemy copy mode on one dialect, zipf (module docstring)."""
    import sqlalchemy as sa

    from adapters.sqlalchemy import SQLAlchemyTable
    from topk_middleware import private_top_k

    engine = _engine(dialect, dsn, workdir)
    table = f"topk_bench_sa_{uuid.uuid4().hex[:8]}"
    scale = gumbel_scale(k, epsilon, m)
    scores = round_scores("zipf", m, k, scale)
    ids = common.shuffled_ids(m, seed=0)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, score BIGINT NOT NULL)")
        rows = [{"id": int(i), "score": int(s)} for i, s in zip(ids, scores, strict=True)]
        t = sa.table(table, sa.column("id"), sa.column("score"))
        for at in range(0, m, 50_000):
            conn.execute(t.insert(), rows[at : at + 50_000])
    source = SQLAlchemyTable(engine, table)
    prepare_seconds, _ = _time(source.prepare)
    b = repr(scale)
    if dialect == "mariadb":
        text = f"SELECT id FROM {table} ORDER BY score - {b} * ln(-ln(rand())) DESC LIMIT {k}"
    elif dialect == "sqlite":
        text = f"SELECT id FROM {table} ORDER BY score + topk_gumbel() DESC LIMIT {k}"
    else:
        text = f"SELECT id FROM {table} ORDER BY score - {b} * ln(-ln(random())) DESC LIMIT {k}"
    seeds = iter(range(1, 10**6))
    rng = random.Random(m)
    sqlrng = np.random.default_rng(0)

    def sql() -> Any:
        with engine.connect() as conn:
            if dialect == "sqlite":
                conn.connection.driver_connection.create_function(
                    "topk_gumbel", 0, lambda: float(sqlrng.gumbel(0.0, scale))
                )
            return conn.exec_driver_sql(text).all()

    def release() -> Any:
        return private_top_k(source, k=k, epsilon=epsilon, seed=next(seeds))

    def write() -> None:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"UPDATE {table} SET score = score + 1 WHERE id = {int(ids[rng.randrange(m)])}"
            )

    release(), sql()
    unwritten, written, oneshot, how = [], [], [], []
    for _ in range(reps):
        source.prepare(refresh=True)  # the copy current again: the release proves it
        unwritten.append(_time(release)[0])
        oneshot.append(_time(sql)[0])
        write()
        seconds, result = _time(release)
        written.append(seconds)
        how.append(
            {
                "freshness": result.plan.get("freshness", getattr(source, "last_freshness", None)),
                "chosen": result.plan.get("auto", {}).get("chosen"),
            }
        )
        oneshot.append(_time(sql)[0])
    source.uninstall()
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
    engine.dispose()
    sql_median = statistics.median(oneshot)
    return {
        "store": f"sqlalchemy-{dialect}",
        "family": "zipf",
        "m": m,
        "k": k,
        "prepare_seconds": prepare_seconds,
        "unwritten": _summary(unwritten),
        "written": _summary(written),
        "sql": _summary(oneshot),
        "plans": how,
        "sql_vs_unwritten": sql_median / statistics.median(unwritten),
        "sql_vs_written": sql_median / statistics.median(written),
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def report(payload: dict[str, Any]) -> str:
    lines = [
        "| store | family | m | current / unwritten | after a write | plan after the write | "
        "SQL one-shot | SQL / current | SQL / after write |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in payload["results"]:
        first = r.get("current", r.get("unwritten"))
        second = r.get("stale", r.get("written"))
        plans = sorted({str(p.get("freshness")) + "/" + str(p.get("chosen")) for p in r["plans"]})
        lines.append(
            f"| {r['store']} | {r['family']} | {r['m']:.0e} | {_ms(first['median'])} | "
            f"{_ms(second['median'])} | {', '.join(plans)} | {_ms(r['sql']['median'])} | "
            f"{r['sql']['median'] / first['median']:.2f}x | "
            f"{r['sql']['median'] / second['median']:.2f}x |"
        )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--m", type=float, default=1e6, help="rows of the PostgreSQL tables")
    parser.add_argument("--sqlalchemy-m", type=float, default=1e5, help="rows, SQLAlchemy")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES))
    parser.add_argument("--dialects", nargs="*", default=list(DIALECTS))
    parser.add_argument("--skip-postgres", action="store_true", help="no psycopg copy mode")


def main(args: argparse.Namespace) -> Path:
    import tempfile

    dsn = os.environ.get("TOPK_PG_DSN", common.DEFAULT_PG_DSN)
    m, small = int(args.m), int(args.sqlalchemy_m)
    started = time.perf_counter()
    results = []
    if not args.skip_postgres:
        for family in args.families:
            results.append(postgres_family(dsn, family, m, args.k, args.epsilon, args.reps))
            if not args.quiet:
                print(report({"results": results[-1:]}).splitlines()[-1], flush=True)
    with tempfile.TemporaryDirectory() as workdir:
        for dialect in args.dialects:
            sizes = [small] + ([m] if dialect == "postgresql" and m != small else [])
            for size in sizes:
                out = sqlalchemy_dialect(
                    dialect, dsn, Path(workdir), size, args.k, args.epsilon, args.reps
                )
                results.append(out)
                if not args.quiet:
                    print(report({"results": [out]}).splitlines()[-1], flush=True)
    payload = {
        "benchmark": "freshness_copy",
        "machine": common.machine_info(dsn),
        "config": {k: v for k, v in vars(args).items() if k not in ("out",)},
        "elapsed_seconds": time.perf_counter() - started,
        "results": results,
    }
    payload["config"]["out"] = str(args.out) if args.out else None
    out = args.out or common.RESULTS_DIR
    path = common.write_json(Path(out) / f"{args.name or 'freshness_copy'}.json", payload)
    print(report(payload))
    return path
