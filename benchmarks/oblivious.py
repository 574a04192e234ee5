"""Oblivious releases against each store's own one-shot query.

    python -m benchmarks oblivious [--m 10000000]
        [--stores duckdb duckdb-live postgres postgres-live]
        [--families zipf plateau distinct] [--reps 5] [--reuse] [--keep]

For each store and data family (benchmarks/common.py), in one interleaved loop: the store's own
one-shot query (`ORDER BY score + Gumbel noise LIMIT k`, as benchmarks/wallclock.py times it) and
`private_top_k(..., oblivious=True)` with its padding (the wall time a server observer sees).
Reported: medians, the ratios one-shot / oblivious (padded) and one-shot / work, the rows
fetched (2d whatever the family), the deadline, how often the work overran it and by how much
at most. Tables are built once (--reuse keeps them). Stores: DuckDB's rank-ordered copy
(`frozen=True`: the caller promises no write after prepare(), so runs read the copy), the DuckDB
table as it is now (the default, current whatever was written: reads by rowid slot), the
PostgreSQL copy (proven current by its write counter) and the PostgreSQL live table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import common
from .wallclock import DuckDBStore, PostgresStore, gumbel_scale, table_name

STORES = ("duckdb", "duckdb-live", "postgres", "postgres-live")


@dataclass
class ObliviousConfig:
    m: int = 10**7
    stores: tuple[str, ...] = STORES
    families: tuple[str, ...] = ("zipf", "plateau", "distinct")
    k: int = 10
    epsilon: float = 1.0
    reps: int = 5
    pg_dsn: str = field(
        default_factory=lambda: os.environ.get("TOPK_PG_DSN", common.DEFAULT_PG_DSN)
    )
    duckdb_path: Path | None = None
    reuse: bool = False
    keep: bool = False
    seed: int = 0
    out: Path = common.RESULTS_DIR
    name: str = "oblivious"


def _time(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def bench(cfg: ObliviousConfig, store: Any, kind: str, family: str) -> dict[str, Any]:
    from adapters.postgres import PostgresTable
    from topk_middleware import private_top_k

    m, table = cfg.m, table_name(family, cfg.m)
    entry: dict[str, Any] = {"store": kind, "family": family, "m": m, "k": cfg.k, "table": table}
    if cfg.reuse and store.exists(table, m):
        entry["load_seconds"] = None
    else:
        scores = common.family_scores(family, m, cfg.k)
        ids = common.shuffled_ids(m, seed=cfg.seed)
        entry["load_seconds"], _ = _time(lambda: store.load(table, ids, scores))
        del scores, ids
    if kind == "postgres-live":
        source = PostgresTable(cfg.pg_dsn, table, mode="live")
        store.sources.append(source)
    elif kind in ("duckdb", "duckdb-live"):
        from adapters.duckdb import DuckDBTable

        # frozen: the rank-ordered copy, no delta; else the table as it is now
        source = DuckDBTable(store.con, table, frozen=kind == "duckdb")
    else:
        source = store.source(table)
    entry["prepare_seconds"], _ = _time(lambda: source.prepare())
    scale = gumbel_scale(cfg.k, cfg.epsilon, m)
    oneshot = store.oneshot_sql(table, cfg.k, scale)

    def oblivious() -> Any:
        return private_top_k(source, cfg.k, cfg.epsilon, oblivious=True)

    oneshot()
    oblivious()  # warm-up, untimed
    times: dict[str, list[float]] = {"oneshot_sql": [], "oblivious": []}
    work, rows, missed = [], set(), 0
    for _ in range(cfg.reps):
        times["oneshot_sql"].append(_time(oneshot)[0])
        seconds, result = _time(oblivious)
        times["oblivious"].append(seconds)
        work.append(result.timings["work"])
        rows.add((result.accesses.rows_fetched, result.accesses.round_trips))
        missed += bool(result.plan["deadline_missed"])
        entry["deadline"] = result.plan["deadline"]
        entry["depth"] = result.plan["depth"]
    entry["seconds"] = times
    entry["work_seconds"] = work
    entry["median"] = {name: statistics.median(v) for name, v in times.items()}
    entry["work_median"] = statistics.median(work)
    entry["rows_and_round_trips"] = sorted(rows)
    entry["deadline_missed"] = missed
    entry["worst_overrun"] = max(0.0, max(work) - entry["deadline"])
    entry["oneshot_over_oblivious"] = entry["median"]["oneshot_sql"] / entry["median"]["oblivious"]
    entry["oneshot_over_work"] = entry["median"]["oneshot_sql"] / entry["work_median"]
    if not kind.startswith("duckdb") and not cfg.keep:
        source.uninstall()  # the rank table or the position table and triggers prepare() made
    return entry


def run(cfg: ObliviousConfig) -> dict[str, Any]:
    entries = []
    tmp = None
    duck = pg = None
    try:
        for kind in cfg.stores:
            if kind.startswith("duckdb"):
                if duck is None:
                    if cfg.duckdb_path is None:
                        tmp = tempfile.mkdtemp(prefix="topk_oblivious_")
                        cfg.duckdb_path = Path(tmp) / "bench.duckdb"
                    duck = DuckDBStore(cfg.duckdb_path)
                store = duck
            else:
                if pg is None:
                    pg = PostgresStore(cfg.pg_dsn)
                store = pg
            for family in cfg.families:
                entry = bench(cfg, store, kind, family)
                entries.append(entry)
                print(
                    f"{kind:14s} {family:9s} one-shot {entry['median']['oneshot_sql'] * 1e3:8.1f} "
                    f"ms  oblivious {entry['median']['oblivious'] * 1e3:7.1f} ms (work "
                    f"{entry['work_median'] * 1e3:6.1f} ms, deadline {entry['deadline'] * 1e3:6.1f}"
                    f" ms, missed {entry['deadline_missed']}/{cfg.reps})  ratio "
                    f"{entry['oneshot_over_oblivious']:.2f}x (work "
                    f"{entry['oneshot_over_work']:.2f}x)  rows {entry['rows_and_round_trips']}",
                    flush=True,
                )
            last_duck = [s for s in cfg.stores if s.startswith("duckdb")][-1:]
            if [kind] == last_duck and not cfg.keep:  # the DuckDB kinds share their tables
                for family in cfg.families:
                    store.drop(table_name(family, cfg.m), None)
        if pg is not None and not cfg.keep:
            for family in cfg.families:
                pg.con.execute(f"DROP TABLE IF EXISTS {table_name(family, cfg.m)} CASCADE")
    finally:
        if duck is not None:
            duck.close()
        if pg is not None:
            pg.close()
    payload = {
        "benchmark": "oblivious",
        "config": {
            "m": cfg.m,
            "k": cfg.k,
            "epsilon": cfg.epsilon,
            "reps": cfg.reps,
            "stores": list(cfg.stores),
            "families": list(cfg.families),
        },
        "machine": common.machine_info(cfg.pg_dsn if pg is not None else None),
        "entries": entries,
    }
    path = cfg.out / f"{cfg.name}.json"
    common.write_json(path, payload)
    payload["files"] = [str(path)]
    return payload


def markdown_table(payload: dict[str, Any]) -> str:
    lines = [
        "| store | family | store's one-shot query | oblivious release (padded) | its work | "
        "deadline | overrun | one-shot / oblivious | one-shot / work | rows fetched |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in payload["entries"]:
        lines.append(
            f"| {e['store']} | {e['family']} | {e['median']['oneshot_sql'] * 1e3:,.0f} ms | "
            f"{e['median']['oblivious'] * 1e3:,.0f} ms | {e['work_median'] * 1e3:,.0f} ms | "
            f"{e['deadline'] * 1e3:,.0f} ms | "
            f"{e['deadline_missed']}/{payload['config']['reps']} | "
            f"{e['oneshot_over_oblivious']:.2f}x | {e.get('oneshot_over_work', 0.0):.2f}x | "
            f"{', '.join(f'{r:,}' for r, _ in e['rows_and_round_trips'])} |"
        )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--m", type=int, default=10**7)
    parser.add_argument("--stores", nargs="+", choices=STORES, default=list(STORES))
    parser.add_argument("--families", nargs="+", default=["zipf", "plateau", "distinct"])
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--duckdb-path", type=Path, default=None)
    parser.add_argument("--pg-dsn", default=None, help="PostgreSQL DSN (default: TOPK_PG_DSN)")
    parser.add_argument("--reuse", action="store_true", help="keep tables that hold m rows")
    parser.add_argument("--keep", action="store_true", help="leave the tables in place")


def config_from_args(args: argparse.Namespace) -> ObliviousConfig:
    dsn = {"pg_dsn": args.pg_dsn} if args.pg_dsn else {}
    return ObliviousConfig(
        **dsn,
        m=args.m,
        stores=tuple(args.stores),
        families=tuple(args.families),
        k=args.k,
        epsilon=args.epsilon,
        reps=args.reps,
        duckdb_path=args.duckdb_path,
        reuse=args.reuse,
        keep=args.keep,
    )
