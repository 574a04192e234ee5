"""Every table size and state against the store's own one-shot query.

    python -m benchmarks sizes [--quick] [--ms 1e3 1e4 1e5 1e6 1e7] [--families zipf ...]
        [--stores duckdb postgres-copy postgres-live sqlite mariadb sqlalchemy-postgresql]
        [--reps 3] [--rounds 3] [--sqlalchemy-max-m 1e5]

For each store, family and m (k = 10, epsilon = 1, the default method), a table of m rows
(id bigint PRIMARY KEY, score bigint NOT NULL, rows in random order) and each state the store
has:

- DuckDB (`DuckDBTable`): ``frozen`` (a frozen copy), ``default`` (not frozen, no write),
  ``writes`` (not frozen, 1% of the rows moved by +1..+3 before each release);
- PostgreSQL copy mode (`PostgresTable`): ``current`` (the copy proven current), ``writes``;
- PostgreSQL live mode: ``live``, ``writes``;
- SQLAlchemy copy mode on SQLite, MariaDB (PyMySQL) and PostgreSQL: ``current``, ``writes``
  (up to --sqlalchemy-max-m rows: loading goes through the driver).

``writes`` runs --rounds rounds, each one write batch then one release, the copy never
refreshed in between (1%, 2%, 3% of m changed since the copy). Each release is timed
interleaved with the store's own one-shot query, `ORDER BY score - b ln(-ln random()) LIMIT k`
(b the release's Gumbel scale; SQLite: a registered Gumbel function; MariaDB: rand()), on the
same table in the same state. Each point reports the release's median seconds, the query's,
their ratio (`vs_query`, above 1 the release is faster), and the ratio against the floor
(`vs_floor`, the floor's seconds over the release's): for m <= 10^5 a full read of (id, score)
into numpy plus an in-memory release (ArraySource, the one-shot); above, one query reading the
release's own rows (`rows_fetched`) by rank range from the store's copy (DuckDB, PostgreSQL
copy mode; none elsewhere).

`--quick`: m in {10^3, 10^4}, zipf and tied plateau, one rep, two rounds: a smoke run of every
store (results in benchmarks/scratch/). The JSON goes to benchmarks/results/sizes.json, the
plot (ratio against m, one line per store and state, one panel per family) to sizes.png.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import common
from .freshness import round_scores
from .wallclock import gumbel_scale

FAMILIES = ("zipf", "plateau", "distinct", "uniform", "sparse")  # plateau tied, distinct untied
STORES = ("duckdb", "postgres-copy", "postgres-live", "sqlite", "mariadb", "sqlalchemy-postgresql")
SQLALCHEMY_STORES = ("sqlite", "mariadb", "sqlalchemy-postgresql")
STATES = {
    "duckdb": ("frozen", "default", "writes"),
    "postgres-copy": ("current", "writes"),
    "postgres-live": ("live", "writes"),
    "sqlite": ("current", "writes"),
    "mariadb": ("current", "writes"),
    "sqlalchemy-postgresql": ("current", "writes"),
}
WRITE_FRACTION = 0.01
FLOOR_FULL_READ_MAX = 100_000


@dataclass
class Table:
    """One benchmark table on a store: how to write it, query it and read it whole."""

    source: Any
    query: Callable[[], Any]
    write: Callable[[np.ndarray, np.ndarray], None]
    read_all: Callable[[], tuple[np.ndarray, np.ndarray]]
    read_ranks: Callable[[int], Any] | None
    close: Callable[[], None]
    notes: dict[str, Any] = field(default_factory=dict)


def _timed(run: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = run()
    return time.perf_counter() - start, out


def _query_text(table: str, scale: float, k: int, gumbel: str | None = None) -> str:
    noise = gumbel or f"- {scale!r} * ln(-ln(random()))"
    return f"SELECT id FROM {table} ORDER BY score {noise} DESC LIMIT {k}"


def _duckdb(workdir: Path, ids: np.ndarray, scores: np.ndarray, state: str, scale: float, k: int):
    import duckdb
    import pyarrow as pa

    from adapters.duckdb import DuckDBTable

    con = duckdb.connect(str(workdir / f"sizes_{uuid.uuid4().hex[:6]}.duckdb"))
    frame = pa.table({"id": ids, "score": scores})  # noqa: F841 - read by the statement below
    con.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, score BIGINT NOT NULL)")
    con.execute("INSERT INTO t SELECT id, score FROM frame")
    source = DuckDBTable(con, "t", frozen=state == "frozen")
    source.prepare()
    text = _query_text("t", scale, k)

    def write(changed: np.ndarray, steps: np.ndarray) -> None:
        batch = pa.table({"id": changed, "d": steps})  # noqa: F841
        con.execute("UPDATE t SET score = score + batch.d FROM batch WHERE t.id = batch.id")

    def read_all() -> tuple[np.ndarray, np.ndarray]:
        got = con.execute("SELECT id, score FROM t").fetchnumpy()
        return got["id"], got["score"]

    def read_ranks(n: int) -> Any:
        return con.execute(
            f"SELECT rank, id, score FROM {source.rank_table} WHERE rank < {int(n)}"
        ).fetchall()

    return Table(
        source,
        lambda: con.execute(text).fetchall(),
        write,
        read_all,
        read_ranks,
        con.close,
    )


def _postgres(dsn: str, ids: np.ndarray, scores: np.ndarray, state: str, scale: float, k: int):
    import psycopg

    from adapters.postgres import PostgresTable

    con = psycopg.connect(dsn, autocommit=True)
    name = f"topk_sizes_{uuid.uuid4().hex[:8]}"
    con.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, score bigint NOT NULL)")
    with con.cursor() as cur, cur.copy(f"COPY {name} (id, score) FROM STDIN") as copy:
        for row in zip(ids.tolist(), scores.tolist(), strict=True):
            copy.write_row(row)
    con.execute(f"ANALYZE {name}")
    live = state == "live"
    source = PostgresTable(dsn, name, mode="live" if live else "copy")
    source.prepare()
    text = _query_text(name, scale, k)

    def write(changed: np.ndarray, steps: np.ndarray) -> None:
        con.execute(
            f"UPDATE {name} t SET score = t.score + s.d FROM unnest(%s::bigint[], %s::bigint[]) "
            "AS s(id, d) WHERE t.id = s.id",
            [changed.tolist(), steps.tolist()],
        )

    def read_all() -> tuple[np.ndarray, np.ndarray]:
        rows = con.execute(f"SELECT id, score FROM {name}").fetchall()
        return np.array([r[0] for r in rows]), np.array([r[1] for r in rows])

    def read_ranks(n: int) -> Any:
        return con.execute(
            f'SELECT rank, id, score FROM "{source.rank_table}" WHERE rank < %s', [int(n)]
        ).fetchall()

    def close() -> None:
        source.uninstall()
        source.close()
        con.execute(f"DROP TABLE IF EXISTS {name} CASCADE")
        con.close()

    return Table(
        source,
        lambda: con.execute(text).fetchall(),
        write,
        read_all,
        None if live else read_ranks,
        close,
    )


def _sqlalchemy(
    dialect: str, dsn: str, workdir: Path, ids: np.ndarray, scores: np.ndarray, scale: float, k: int
):
    import sqlalchemy as sa

    from adapters.sqlalchemy import SQLAlchemyTable

    from .freshness_copy import _engine

    engine = _engine(dialect if dialect in ("sqlite", "mariadb") else "postgresql", dsn, workdir)
    name = f"topk_sizes_{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {name} (id BIGINT PRIMARY KEY, score BIGINT NOT NULL)")
        if dialect in ("sqlite", "mariadb"):
            t = sa.table(name, sa.column("id"), sa.column("score"))
            rows = [{"id": int(i), "score": int(s)} for i, s in zip(ids, scores, strict=True)]
            for at in range(0, len(rows), 50_000):
                conn.execute(t.insert(), rows[at : at + 50_000])
        else:  # COPY through the engine's own psycopg connection: setup, not measured
            raw = conn.connection.driver_connection
            with raw.cursor() as cur, cur.copy(f"COPY {name} (id, score) FROM STDIN") as copy:
                for row in zip(ids.tolist(), scores.tolist(), strict=True):
                    copy.write_row(row)
    source = SQLAlchemyTable(engine, name)
    source.prepare()
    sqlrng = np.random.default_rng(0)
    gumbel = {"sqlite": "+ topk_gumbel()", "mariadb": f"- {scale!r} * ln(-ln(rand()))"}.get(dialect)
    text = _query_text(name, scale, k, gumbel)

    def query() -> Any:
        with engine.connect() as conn:
            if dialect == "sqlite":
                conn.connection.driver_connection.create_function(
                    "topk_gumbel", 0, lambda: float(sqlrng.gumbel(0.0, scale))
                )
            return conn.exec_driver_sql(text).all()

    def write(changed: np.ndarray, steps: np.ndarray) -> None:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"UPDATE {name} SET score = score + ? WHERE id = ?"
                if dialect == "sqlite"
                else f"UPDATE {name} SET score = score + %s WHERE id = %s",
                [(int(d), int(i)) for i, d in zip(changed, steps, strict=True)],
            )

    def read_all() -> tuple[np.ndarray, np.ndarray]:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql(f"SELECT id, score FROM {name}").all()
        return np.array([r[0] for r in rows]), np.array([r[1] for r in rows])

    def close() -> None:
        source.uninstall()
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
        engine.dispose()

    return Table(source, query, write, read_all, None, close)


def make_table(store: str, state: str, dsn: str, workdir: Path, ids, scores, scale, k) -> Table:
    if store == "duckdb":
        return _duckdb(workdir, ids, scores, state, scale, k)
    if store in ("postgres-copy", "postgres-live"):
        return _postgres(dsn, ids, scores, "live" if store == "postgres-live" else state, scale, k)
    return _sqlalchemy(store, dsn, workdir, ids, scores, scale, k)


def _floor(table: Table, m: int, k: int, rows_fetched: int) -> tuple[str, float] | None:
    """The floor's kind and seconds (module docstring)."""
    from adapters.memory import ArraySource
    from topk_middleware import private_top_k

    if m <= FLOOR_FULL_READ_MAX:

        def full() -> Any:
            ids, scores = table.read_all()
            return private_top_k(ArraySource(scores, ids), k=k, epsilon=1.0, method="oneshot")

        return "full read + in memory", _timed(full)[0]
    if table.read_ranks is None:
        return None
    return "rows read by rank", _timed(lambda: table.read_ranks(max(rows_fetched, k)))[0]


def measure(
    store: str, state: str, family: str, m: int, cfg: argparse.Namespace, dsn: str, workdir: Path
) -> dict[str, Any]:
    """One point (module docstring)."""
    from topk_middleware import private_top_k

    k, epsilon = cfg.k, 1.0
    scale = gumbel_scale(k, epsilon, m)
    scores = round_scores(family, m, k, scale).astype(np.int64)
    ids = common.shuffled_ids(m, seed=0)
    order = np.random.default_rng(1).permutation(m)
    started = time.perf_counter()
    table = make_table(store, state, dsn, workdir, ids[order], scores[order], scale, k)
    setup = time.perf_counter() - started
    rng = np.random.default_rng(m)
    seeds = iter(range(1, 10**6))
    releases, queries, floors, plans = [], [], [], []
    floor_kind = None
    try:
        private_top_k(table.source, k=k, epsilon=epsilon, seed=0)  # warm-up, as a user's second
        table.query()
        rounds = cfg.rounds if state == "writes" else cfg.reps
        for _ in range(rounds):
            if state == "writes":
                count = max(1, int(WRITE_FRACTION * m))
                changed = ids[rng.choice(m, size=count, replace=False)]
                table.write(changed, rng.integers(1, 4, size=count))
            queries.append(_timed(table.query)[0])
            seconds, result = _timed(
                lambda: private_top_k(table.source, k=k, epsilon=epsilon, seed=next(seeds))
            )
            releases.append(seconds)
            queries.append(_timed(table.query)[0])
            floor = _floor(table, m, k, int(result.accesses.rows_fetched))
            if floor is not None:
                floor_kind = floor[0]
                floors.append(floor[1])
            plans.append(
                {
                    "chosen": result.plan.get("auto", {}).get("chosen"),
                    "read": (result.plan.get("freshness") or {}).get("read"),
                    "rows_fetched": int(result.accesses.rows_fetched),
                }
            )
    finally:
        table.close()
    release, query = statistics.median(releases), statistics.median(queries)
    floor_s = statistics.median(floors) if floors else None
    return {
        "store": store,
        "state": state,
        "family": family,
        "m": m,
        "k": k,
        "setup_seconds": setup,
        "release": releases,
        "query": queries,
        "floor": floors,
        "floor_kind": floor_kind,
        "release_median": release,
        "query_median": query,
        "vs_query": query / release,
        "vs_floor": None if floor_s is None else floor_s / release,
        "plans": plans,
        "load_average": list(os.getloadavg()),
    }


def _retried(run: Callable[..., dict[str, Any]], *args: Any, tries: int = 6) -> dict[str, Any]:
    """`run(*args)`, tried again after a pause where a shared server refused the connection."""
    for attempt in range(tries):
        try:
            return run(*args)
        except Exception as error:
            if "too many clients" not in str(error) or attempt == tries - 1:
                raise
            time.sleep(10.0)
    raise AssertionError("unreachable")


def report(results: list[dict[str, Any]]) -> str:
    lines = [
        "| store | state | family | m | release ms | query ms | vs query | vs floor |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        floor = "-" if r["vs_floor"] is None else f"{r['vs_floor']:.2f}x"
        lines.append(
            f"| {r['store']} | {r['state']} | {r['family']} | 10^{round(math.log10(r['m']))} | "
            f"{1e3 * r['release_median']:.1f} | {1e3 * r['query_median']:.1f} | "
            f"{r['vs_query']:.2f}x | {floor} |"
        )
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = sorted({r["family"] for r in results})
    fig, axes = plt.subplots(1, len(families), figsize=(4.2 * len(families), 4), squeeze=False)
    for ax, family in zip(axes[0], families, strict=True):
        lines: dict[str, list[tuple[int, float]]] = {}
        for r in results:
            if r["family"] == family:
                lines.setdefault(f"{r['store']} {r['state']}", []).append((r["m"], r["vs_query"]))
        for label, points in sorted(lines.items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(family)
        ax.set_xlabel("m (rows)")
        ax.set_ylabel("store's query time / release time")
    common.legend_below(fig, axes[0], columns=4)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="m 1e3 1e4, two families, one rep")
    parser.add_argument("--ms", type=float, nargs="+", default=[1e3, 1e4, 1e5, 1e6, 1e7])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--stores", nargs="+", default=list(STORES), choices=STORES)
    parser.add_argument("--states", nargs="+", default=None, help="only these states")
    parser.add_argument("--reps", type=int, default=3, help="releases per state without writes")
    parser.add_argument("--rounds", type=int, default=3, help="write rounds of the writes state")
    parser.add_argument("--sqlalchemy-max-m", type=float, default=1e5)
    parser.add_argument("--k", type=int, default=10)


def main(args: argparse.Namespace) -> Path:
    if args.quick:
        args.ms, args.reps, args.rounds = [1e3, 1e4], 1, 2
        args.families = [f for f in args.families if f in ("zipf", "plateau")] or ["zipf"]
    dsn = os.environ.get("TOPK_PG_DSN", common.DEFAULT_PG_DSN)
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as workdir:
        for m in sorted(int(x) for x in args.ms):
            for store in args.stores:
                if store in SQLALCHEMY_STORES and m > args.sqlalchemy_max_m:
                    continue
                for state in STATES[store]:
                    if args.states and state not in args.states:
                        continue
                    for family in args.families:
                        try:
                            point = _retried(
                                measure, store, state, family, m, args, dsn, Path(workdir)
                            )
                        except Exception as error:  # a shared server out of connections
                            failed.append(
                                {
                                    "store": store,
                                    "state": state,
                                    "family": family,
                                    "m": m,
                                    "error": f"{type(error).__name__}: {error}",
                                }
                            )
                            print(f"failed: {failed[-1]}", flush=True)
                            continue
                        results.append(point)
                        if not args.quiet:
                            print(report([point]).splitlines()[-1], flush=True)
    payload = {
        "benchmark": "sizes",
        "machine": common.machine_info(dsn),
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "elapsed_seconds": time.perf_counter() - started,
        "results": results,
        "failed": failed,
    }
    out = common.output_dir(args)
    path = common.write_json(out / f"{args.name or 'sizes'}.json", payload)
    if not args.no_plot:
        plot(results, out / f"{args.name or 'sizes'}.png")
    print(report(results))
    return path
