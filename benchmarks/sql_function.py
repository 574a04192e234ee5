"""topk.private_top_k inside PostgreSQL against the client-side run and the one-shot query.

    python -m benchmarks.sql_function [--m 10000000] [--family zipf] [--reps 15]

It loads a table (id BIGINT, score BIGINT; ids a seeded permutation, counts of
benchmarks/common.py) into the server of TOPK_PG_DSN, installs the schema topk
(frontends/sql/install.py; from this checkout and virtual environment) and registers the
table (live-mode preparation, timed; --keep, then --reuse, skip loading it again). Then,
interleaved rep by rep (the order turning each rep, so that each method follows the 3-second
one-shot query as often) after one untimed warm-up of each, all with k, epsilon, no seed (the
secure generator, as in production):

* ``in_server``: ``SELECT * FROM topk.private_top_k(table, k, epsilon)`` from an analyst role's
  open session (EXECUTE only), charged to the ledger: SPI reads, the charge and the log;
* ``client_ledger``: private_top_k(PostgresTable(mode="live"), budget=) from this process over
  the local socket, charged to the same ledger (the same work, with round trips);
* ``client``: the same client-side run without a ledger;
* ``ledger_only``: the ledger's share of a charged release, alone: one charge and its log entry
  (two transactions), from this process to the same ledger;
* ``oneshot_sql``: ``SELECT id FROM t ORDER BY score - b * ln(-ln(random())) DESC LIMIT k``, the
  one-shot mechanism pushed into SQL with the same Gumbel scale b (Fact 3.3), no charge.

And ``in_server_new_session`` a few times: connect, first call (the server's Python imports numpy,
scipy, SQLAlchemy and the project and opens the ledger's connection once per session), close.
Results: <--name, default sql_function>.json (medians, ratios, every rep) in benchmarks/results/
(a --quick run: m = 10^5, 3 reps, one new session, in benchmarks/scratch/), or in --out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import psycopg
import sqlalchemy as sa

from adapters.postgres import PostgresTable
from frontends import sql_function
from topk_middleware import PrivacyLedger, private_top_k
from topk_middleware.accounting import oneshot_cost

from . import common
from .wallclock import gumbel_scale, pg_copy_payload

ANALYST = "topk_bench_analyst"
CLIENT_PRINCIPAL = "topk_bench_client"
LEDGER_PRINCIPAL = "topk_bench_ledger"
BUDGET = 1e12  # large enough for every rep (delta = 0: basic composition)


def _time(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def load(conn: psycopg.Connection[Any], table: str, ids: np.ndarray, scores: np.ndarray) -> None:
    conn.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
    conn.execute(f"CREATE TABLE {table} (id bigint NOT NULL, score bigint NOT NULL)")
    with conn.cursor() as cur, cur.copy(f"COPY {table} FROM STDIN (FORMAT BINARY)") as copy:
        copy.write(pg_copy_payload(ids, scores))
    conn.execute(f"VACUUM ANALYZE {table}")


def setup_roles(conn: psycopg.Connection[Any], table: str) -> None:
    """The analyst role (LOGIN, EXECUTE on the function only) with a large budget, and the
    client's principal; both ledgers emptied so every rep composes the same few charges."""
    if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [ANALYST]).fetchone():
        conn.execute(f"CREATE ROLE {ANALYST} LOGIN")
    conn.execute(f"GRANT EXECUTE ON FUNCTION topk.private_top_k TO {ANALYST}")
    analyst = conn.execute("SELECT topk.principal(%s)", [ANALYST]).fetchone()[0]
    for principal in (analyst, CLIENT_PRINCIPAL, LEDGER_PRINCIPAL):
        conn.execute("DELETE FROM topk.topk_ledger_charges WHERE principal = %s", [principal])
        conn.execute("DELETE FROM topk.topk_ledger_principals WHERE principal = %s", [principal])
    conn.execute("SELECT topk.grant_budget(%s, %s, 0)", [ANALYST, BUDGET])


def run(args: argparse.Namespace) -> dict[str, Any]:
    dsn, m, k, epsilon = args.dsn, args.m, args.k, args.epsilon
    table = f"topk_sqlfn_bench_{args.family}_{m}"
    admin = psycopg.connect(dsn, autocommit=True)
    ids, scores = common.shuffled_ids(m, args.seed), common.family_scores(args.family, m, k)
    exists = admin.execute("SELECT to_regclass(%s) IS NOT NULL", [table]).fetchone()[0]
    load_s = None if args.reuse and exists else _time(lambda: load(admin, table, ids, scores))
    install_s = _time(lambda: sql_function.install(dsn))
    register_s = _time(lambda: sql_function.register_source(dsn, table, "id", "score"))
    setup_roles(admin, table)
    admin.execute("SELECT topk.grant_source(%s::regclass, %s)", [table, ANALYST])
    analyst_dsn = psycopg.conninfo.make_conninfo(dsn, user=ANALYST)
    release_sql = "SELECT * FROM topk.private_top_k(%s::regclass, %s, %s)"
    scale = gumbel_scale(k, epsilon, m)
    oneshot = (
        f"SELECT id FROM {table} ORDER BY score - {scale!r} * ln(-ln(random())) DESC LIMIT {k}"
    )

    ledger = PrivacyLedger(
        sa.create_engine(
            "postgresql+psycopg://",
            creator=lambda: psycopg.connect(dsn, options="-c search_path=topk"),
        )
    )
    budget = ledger.budget(CLIENT_PRINCIPAL, BUDGET, 0.0)
    source = PostgresTable(dsn, table, id="id", score="score", mode="live")
    analyst = psycopg.connect(analyst_dsn, autocommit=True)

    def in_server() -> None:
        assert len(analyst.execute(release_sql, [table, k, epsilon]).fetchall()) == k

    def client_ledger() -> None:
        assert len(private_top_k(source, k, epsilon, budget=budget).items) == k

    def client() -> None:
        assert len(private_top_k(source, k, epsilon).items) == k

    last = private_top_k(source, k, epsilon)
    charge_only = ledger.budget(LEDGER_PRINCIPAL, BUDGET, 0.0)
    cost = oneshot_cost("gumbel", k, m, epsilon)

    def ledger_only() -> None:
        charge_only.charge(cost)
        charge_only.log_release(last)

    def oneshot_sql() -> None:
        assert len(admin.execute(oneshot).fetchall()) == k

    def new_session() -> None:
        with psycopg.connect(analyst_dsn, autocommit=True) as conn:
            assert len(conn.execute(release_sql, [table, k, epsilon]).fetchall()) == k

    methods = {
        "in_server": in_server,
        "client_ledger": client_ledger,
        "client": client,
        "ledger_only": ledger_only,
        "oneshot_sql": oneshot_sql,
    }
    for fn in methods.values():
        fn()  # warm-up, untimed
    times: dict[str, list[float]] = {name: [] for name in methods}
    names = list(methods)
    for rep in range(args.reps):  # the order turns each rep: each method follows each other
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            times[name].append(_time(methods[name]))
    new_session_s = [_time(new_session) for _ in range(args.new_sessions)]
    with admin.cursor() as cur:
        diagnostics = cur.execute(
            "SELECT diagnostics FROM topk.topk_ledger_charges WHERE principal = topk.principal(%s) "
            "ORDER BY seq DESC LIMIT 1",
            [ANALYST],
        ).fetchone()[0]
    analyst.close()
    source.close()
    if not args.keep:
        admin.execute("SELECT topk.unregister_source(%s::regclass)", [table])
        admin.execute(f"DROP TABLE {table} CASCADE")
    admin.close()
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {
        "benchmark": "sql_function",
        "family": args.family,
        "m": m,
        "k": k,
        "epsilon": epsilon,
        "reps": args.reps,
        "load_s": load_s,
        "install_s": install_s,
        "register_s": register_s,
        "medians_s": medians,
        "in_server_new_session_median_s": statistics.median(new_session_s),
        "ratios": {
            "in_server / client_ledger": medians["in_server"] / medians["client_ledger"],
            "in_server / client": medians["in_server"] / medians["client"],
            "oneshot_sql / in_server": medians["oneshot_sql"] / medians["in_server"],
            "oneshot_sql / client_ledger": medians["oneshot_sql"] / medians["client_ledger"],
        },
        "target_in_server_not_slower_than_client": medians["in_server"] <= medians["client_ledger"],
        "last_in_server_diagnostics": diagnostics,
        "times_s": times,
        "in_server_new_session_s": new_session_s,
        "note": "2-core machine shared with other agents' work while measuring",
        "machine": common.machine_info(dsn),
    }


def report(payload: dict[str, Any]) -> str:
    med = payload["medians_s"]
    lines = [
        f"m = {payload['m']:,} ({payload['family']}), k = {payload['k']}, "
        f"epsilon = {payload['epsilon']}, {payload['reps']} interleaved reps (medians):"
    ]
    for name, seconds in med.items():
        lines.append(f"  {name:<15} {seconds * 1000:10.1f} ms")
    lines.append(
        f"  in_server, new session: {payload['in_server_new_session_median_s'] * 1000:.0f} ms"
    )
    for name, ratio in payload["ratios"].items():
        lines.append(f"  {name:<28} {ratio:8.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sql_function")
    parser.add_argument(
        "--dsn", default=os.environ.get("TOPK_PG_DSN", "host=127.0.0.1 port=5432 dbname=test")
    )
    parser.add_argument("--m", type=int, default=None, help="rows (default 10^7)")
    parser.add_argument("--family", default="zipf", choices=["zipf", "plateau"])
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=None, help="interleaved reps (default 15)")
    parser.add_argument("--new-sessions", type=int, default=None, help="default 3")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the table afterwards")
    parser.add_argument("--reuse", action="store_true", help="use the table of a --keep run")
    parser.add_argument("--name", default="sql_function")
    common.add_output_arguments(parser, "m = 10^5, 3 reps, one new session")
    args = parser.parse_args(argv)
    quick = args.quick
    args.m = args.m or (10**5 if quick else 10**7)
    args.reps = args.reps or (3 if quick else 15)
    args.new_sessions = args.new_sessions or (1 if quick else 3)
    payload = run(args)
    path = common.write_json(common.output_dir(args) / f"{args.name}.json", payload)
    print(report(payload))
    print(f"written: {path}")


if __name__ == "__main__":
    main()
