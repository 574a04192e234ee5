"""SQLAlchemyTable(mode="live") on PostgreSQL: a fresh release after writes vs the one-shot query.

    python -m benchmarks.sqlalchemy_live [--m 1000000] [--families zipf plateau] [--reps 7]

For each family it loads a table (id BIGINT, score BIGINT; ids a seeded permutation, counts of
benchmarks/common.py) into the server of TOPK_PG_DSN, wraps it in SQLAlchemyTable(mode="live")
through psycopg 3 and runs prepare() once (timed). Then it changes 1% of the counts (random items,
up and down, one UPDATE in one transaction; timed), and with no prepare() in between times,
interleaved rep by rep after one untimed warm-up of each:

* ``live``: private_top_k(method="threshold", k, epsilon) on the live table, end to end;
* ``oneshot_sql``: ``SELECT id FROM t ORDER BY score - b * ln(-ln(random())) DESC LIMIT k``, the
  one-shot mechanism pushed into SQL with the same Gumbel scale b (Fact 3.3);
* ``copy``: for comparison, mode="copy" after the same writes: prepare() (the rank table rebuilt
  by a full sort) plus one run (timed once per rep only with --copy).

It also times inserting and deleting 1% of the items (the triggers' cost, O(changed items)).
Results: <--name, default sqlalchemy_live>.json (medians and every rep) in benchmarks/results/
(a --quick run: m = 10^4, 3 reps, in benchmarks/scratch/), or in --out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import sqlalchemy as sa

from adapters.sqlalchemy import SQLAlchemyTable
from topk_middleware import private_top_k

from . import common
from .wallclock import gumbel_scale, pg_copy_payload


def _time(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def engine_for(dsn: str) -> sa.Engine:
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(dsn)
    params.setdefault("user", os.environ.get("PGUSER", "root"))
    return sa.create_engine("postgresql+psycopg://", connect_args=params)


def load(engine: sa.Engine, table: str, ids: np.ndarray, scores: np.ndarray) -> None:
    raw = engine.raw_connection()
    try:
        con = raw.driver_connection
        con.autocommit = True  # type: ignore[union-attr]
        con.execute(f"DROP TABLE IF EXISTS {table} CASCADE")  # type: ignore[union-attr]
        con.execute(f"CREATE TABLE {table} (id bigint NOT NULL, score bigint NOT NULL)")  # type: ignore[union-attr]
        payload = pg_copy_payload(ids, scores)
        with con.cursor() as cur, cur.copy(f"COPY {table} FROM STDIN (FORMAT BINARY)") as copy:  # type: ignore[union-attr]
            copy.write(payload)
        con.execute(f"VACUUM ANALYZE {table}")  # type: ignore[union-attr]
    finally:
        raw.close()


def change_one_percent(engine: sa.Engine, table: str, m: int, rng: np.random.Generator) -> float:
    """1% of the items, random, half up and half down by 1..10 (never below 0; small, so that
    the plateau stays a hard instance), in one UPDATE."""
    chosen = rng.choice(m, size=m // 100, replace=False)
    delta = rng.integers(1, 11, size=len(chosen)) * np.where(np.arange(len(chosen)) % 2, 1, -1)
    values = ", ".join(f"({int(i)}, {int(d)})" for i, d in zip(chosen, delta, strict=True))
    statement = (
        f"UPDATE {table} AS t SET score = greatest(t.score + c.d, 0) "
        f"FROM (VALUES {values}) AS c(id, d) WHERE t.id = c.id"
    )
    with engine.begin() as conn:
        return _time(lambda: conn.exec_driver_sql(statement))


def bench_family(engine: sa.Engine, family: str, m: int, args: argparse.Namespace) -> dict:
    table = f"topk_live_bench_{family}_{m}"
    ids, scores = common.shuffled_ids(m, args.seed), common.family_scores(family, m, args.k)
    load(engine, table, ids, scores)
    source = SQLAlchemyTable(engine, table, mode="live")
    prepare_s = _time(source.prepare)
    scale = gumbel_scale(args.k, args.epsilon, m)
    oneshot = (
        f"SELECT id FROM {table} ORDER BY score - {scale!r} * ln(-ln(random())) DESC LIMIT {args.k}"
    )
    seeds = iter(range(10**6))

    def timed_runs() -> dict[str, Any]:
        """Live runs and one-shot queries, interleaved, after one untimed warm-up of each."""
        with engine.connect() as conn:

            def run_oneshot() -> None:
                conn.exec_driver_sql(oneshot).all()
                conn.rollback()

            def run_live() -> Any:
                return private_top_k(source, k=args.k, epsilon=args.epsilon, seed=next(seeds))

            run_live(), run_oneshot()
            live_s, sql_s, stats = [], [], []
            for _ in range(args.reps):
                start = time.perf_counter()
                stats.append(run_live().accesses)
                live_s.append(time.perf_counter() - start)
                sql_s.append(_time(run_oneshot))
        live, sql = statistics.median(live_s), statistics.median(sql_s)
        return {
            "live_median_s": live,
            "oneshot_sql_median_s": sql,
            "speedup": sql / live,
            "live_s": live_s,
            "oneshot_sql_s": sql_s,
            "rows_fetched_median": statistics.median(s.rows_fetched for s in stats),
            "round_trips_median": statistics.median(s.round_trips for s in stats),
            "accesses_median": statistics.median(s.total for s in stats),
        }

    unchanged = timed_runs()
    update_s = change_one_percent(engine, table, m, np.random.default_rng(args.seed))
    after_writes = timed_runs()
    copy_s = None
    if args.copy:
        copy = SQLAlchemyTable(engine, table)
        copy_s = _time(lambda: (copy.prepare(), private_top_k(copy, k=args.k, epsilon=1.0)))
    # The triggers' cost: insert then delete 1% new items, each in one statement.
    new = m + np.arange(m // 100)
    rows = ", ".join(f"({int(i)}, 1)" for i in new)
    with engine.begin() as conn:
        insert_s = _time(lambda: conn.exec_driver_sql(f"INSERT INTO {table} VALUES {rows}"))
    with engine.begin() as conn:
        delete_s = _time(lambda: conn.exec_driver_sql(f"DELETE FROM {table} WHERE id >= {m}"))
    with source.snapshot():
        assert source.domain_size() == m  # the positions are back to m after the deletes
    source.uninstall()  # type: ignore[attr-defined]
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {table} CASCADE")
        if args.copy:
            for name in (copy.rank_table_name, copy.runs_table_name):
                conn.exec_driver_sql(f'DROP TABLE IF EXISTS "{name}"')
    return {
        "family": family,
        "m": m,
        "prepare_s": prepare_s,
        "update_1pct_s": update_s,
        "insert_1pct_items_s": insert_s,
        "delete_1pct_items_s": delete_s,
        "copy_refresh_and_run_s": copy_s,
        "unchanged": unchanged,
        "after_1pct_writes": after_writes,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=None, help="rows (default 10^6)")
    parser.add_argument("--families", nargs="+", default=["zipf", "plateau"])
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=None, help="interleaved reps (default 7)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--copy", action="store_true", help="also time mode='copy' refresh + run")
    parser.add_argument("--name", default="sqlalchemy_live", help="file name stem of the results")
    common.add_output_arguments(parser, "m = 10^4, 3 reps")
    args = parser.parse_args(argv)
    args.m = args.m or (10**4 if args.quick else 10**6)
    args.reps = args.reps or (3 if args.quick else 7)
    dsn = os.environ.get("TOPK_PG_DSN", common.DEFAULT_PG_DSN)
    engine = engine_for(dsn)
    results = [bench_family(engine, family, args.m, args) for family in args.families]
    for r in results:
        for phase in ("unchanged", "after_1pct_writes"):
            t = r[phase]
            print(
                f"{r['family']:>8} m={r['m']:.0e} {phase:>17}: live "
                f"{t['live_median_s'] * 1e3:.1f} ms ({t['rows_fetched_median']:.0f} rows, "
                f"{t['round_trips_median']:.0f} round trips), one-shot SQL "
                f"{t['oneshot_sql_median_s'] * 1e3:.1f} ms: {t['speedup']:.0f}x"
            )
        print(
            f"{r['family']:>8} m={r['m']:.0e}: prepare {r['prepare_s']:.1f} s, 1% updates "
            f"{r['update_1pct_s']:.2f} s, 1% inserts {r['insert_1pct_items_s']:.2f} s, 1% deletes "
            f"{r['delete_1pct_items_s']:.2f} s"
            + (f", copy refresh+run {r['copy_refresh_and_run_s']:.1f} s" if args.copy else "")
        )
    payload = {"machine": common.machine_info(dsn), "config": vars(args), "results": results}
    path = common.write_json(common.output_dir(args) / f"{args.name}.json", payload)
    print(f"written: {path}")
    engine.dispose()


if __name__ == "__main__":
    main()
