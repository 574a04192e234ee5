"""The in-store one-shot on the SQLAlchemy dialects against the store's own one-shot query.

    python -m benchmarks.in_store [--m 1000000] [--dialects sqlite postgresql]
                                  [--families zipf plateau distinct uniform] [--reps 7]

For each dialect and family it loads a table (id BIGINT primary key, score DOUBLE; ids a seeded
permutation, the scores of benchmarks/common.py) through SQLAlchemy, runs prepare() (the rank
table), and in one snapshot times, interleaved rep by rep after one untimed warm-up of each:

* ``in_store``: `SQLAlchemyTable.read_oneshot` under a fresh `KeyedNoise` with its split (the
  store hashes the rows that can win; topk_middleware/keyed_noise.py), one query;
* ``oneshot_sql``: ``SELECT id FROM t ORDER BY score - b * ln(-ln(U)) DESC LIMIT k`` with the
  dialect's own random() as U (SQLite: its 64-bit random() scaled into (0, 1)), the same Gumbel
  scale b.

Target: the in-store one-shot within 1.5x of the plain query (oneshot_sql / in_store
>= 0.67). DuckDB and PostgreSQL through their own adapters are in `python -m benchmarks
wallclock`. MariaDB / MySQL take no in-store path (pymysql would write the key into the
statement text: docs/security.md). Results: benchmarks/results/<--name, default
in_store_sqlalchemy>.{json,md,png}.
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
import sqlalchemy as sa

from adapters.sqlalchemy import SQLAlchemyTable
from topk_middleware.keyed_noise import KeyedNoise

from . import common
from .wallclock import gumbel_scale

TARGET = 1 / 1.5  # oneshot_sql / in_store at least
UNIFORM_SQL = {
    "postgresql": "random()",
    "sqlite": "(random() / 18446744073709551616.0 + 0.5)",
}
LOAD_ROWS = 50_000  # rows per INSERT batch


def engine_for(dialect: str, folder: Path) -> sa.Engine:
    if dialect == "sqlite":
        return sa.create_engine(f"sqlite:///{folder / 'in_store.db'}")
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(os.environ.get("TOPK_PG_DSN", common.DEFAULT_PG_DSN))
    params.setdefault("user", os.environ.get("PGUSER", "root"))
    return sa.create_engine("postgresql+psycopg://", connect_args=params)


def load(engine: sa.Engine, table: str, ids: np.ndarray, scores: np.ndarray) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
        conn.exec_driver_sql(
            f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, score DOUBLE PRECISION NOT NULL)"
        )
    insert = sa.text(f"INSERT INTO {table} (id, score) VALUES (:i, :s)")
    with engine.begin() as conn:
        for start in range(0, len(ids), LOAD_ROWS):
            part = slice(start, start + LOAD_ROWS)
            rows = [
                {"i": int(i), "s": float(s)} for i, s in zip(ids[part], scores[part], strict=True)
            ]
            conn.execute(insert, rows)


def _time(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench(engine: sa.Engine, dialect: str, family: str, args: argparse.Namespace) -> dict:
    m, k = args.m, args.k
    table = f"topk_in_store_{family}_{m}"
    load(engine, table, common.shuffled_ids(m, args.seed), common.family_scores(family, m, k))
    source = SQLAlchemyTable(engine, table)
    prepare_s = _time(source.prepare)
    scale = gumbel_scale(k, args.epsilon, m)
    uniform = UNIFORM_SQL[engine.dialect.name]
    plain = f"SELECT id FROM {table} ORDER BY score - {scale!r} * ln(-ln({uniform})) DESC LIMIT {k}"
    rng = np.random.default_rng(args.seed)
    in_store: list[float] = []
    oneshot: list[float] = []
    with source.snapshot(), engine.connect() as conn:
        for rep in range(args.reps + 1):  # rep 0: the untimed warm-up
            noise = KeyedNoise.draw(rng, "gumbel", scale, m, k)
            a = _time(lambda n=noise: source.read_oneshot(n, k))
            b = _time(lambda: conn.exec_driver_sql(plain).all())
            if rep:
                in_store.append(a)
                oneshot.append(b)
    with engine.begin() as conn:
        for name in (table, source.rank_table_name, source.runs_table_name):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
    med_in, med_sql = statistics.median(in_store), statistics.median(oneshot)
    return {
        "dialect": dialect,
        "family": family,
        "m": m,
        "prepare_s": prepare_s,
        "in_store_s": in_store,
        "oneshot_sql_s": oneshot,
        "in_store_median_s": med_in,
        "oneshot_sql_median_s": med_sql,
        "ratio": med_sql / med_in,
        "met": med_sql / med_in >= TARGET,
        "oneshot_sql_query": plain,
    }


def table_md(results: list[dict]) -> str:
    lines = [
        "| dialect | data | m | in-store one-shot | one-shot in SQL | SQL / in store "
        "(target >= 0.67x) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['dialect']} | {r['family']} | {r['m']:.0e} | "
            f"{r['in_store_median_s'] * 1e3:.1f} ms | {r['oneshot_sql_median_s'] * 1e3:.1f} ms | "
            f"{r['ratio']:.2f}x, {'met' if r['met'] else 'MISSED'} |"
        )
    return "\n".join(lines) + "\n"


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    labels = [f"{r['dialect']}\n{r['family']}" for r in results]
    ax.bar(range(len(results)), [r["ratio"] for r in results], color="tab:blue")
    ax.axhline(TARGET, color="tab:red", linestyle="--", label="target 0.67x")
    ax.set_xticks(range(len(results)), labels, fontsize=7)
    ax.set_ylabel("one-shot SQL / in-store (higher: in-store faster)")
    ax.set_title(f"In-store one-shot on SQLAlchemy dialects, m = {results[0]['m']:.0e}")
    common.legend_outside(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=lambda s: int(float(s)), default=10**6)
    parser.add_argument(
        "--dialects",
        nargs="+",
        default=["sqlite", "postgresql"],
        choices=["sqlite", "postgresql"],
    )
    parser.add_argument("--families", nargs="+", default=["zipf", "plateau", "distinct", "uniform"])
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=common.RESULTS_DIR)
    parser.add_argument("--name", default="in_store_sqlalchemy")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for dialect in args.dialects:
            engine = engine_for(dialect, Path(folder))
            for family in args.families:
                results.append(bench(engine, dialect, family, args))
                r = results[-1]
                print(
                    f"{dialect:>10} {family:>8} m={r['m']:.0e}: in-store "
                    f"{r['in_store_median_s'] * 1e3:.1f} ms, one-shot SQL "
                    f"{r['oneshot_sql_median_s'] * 1e3:.1f} ms: {r['ratio']:.2f}x",
                    flush=True,
                )
            engine.dispose()
    args.out.mkdir(parents=True, exist_ok=True)
    dsn = os.environ.get("TOPK_PG_DSN", common.DEFAULT_PG_DSN)
    config = {**vars(args), "out": str(args.out)}
    payload = {"machine": common.machine_info(dsn), "config": config, "results": results}
    common.write_json(args.out / f"{args.name}.json", payload)
    (args.out / f"{args.name}.md").write_text(table_md(results))
    if not args.no_plot:
        plot(results, args.out / f"{args.name}.png")
    print(table_md(results))


if __name__ == "__main__":
    main()
