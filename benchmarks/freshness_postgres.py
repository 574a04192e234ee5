"""Freshness on PostgreSQL: a release right after writes, with no rebuild (live mode).

One table per (m, family), loaded by COPY; `PostgresTable(mode="live")` is prepared once (its
B-tree, position table and triggers) and `mode="copy"` once (today's rank table, the reference
for a release on unchanged data). Then, interleaved, `reps` times:

1. change 1% of the counts: random items, each up or down by one (clipped at 0), in one
   committed transaction (its time is reported, not counted in the release);
2. (a) a fresh release end to end: live mode needs no refresh, so it is the run alone;
3. (b) the store's own one-shot query `ORDER BY score - b ln(-ln(random())) LIMIT k`;
4. a release on the same (now unchanged) data, live mode, and from the rank table of copy mode
   (which, not refreshed, serves the counts of its last prepare(): a speed reference only).

The ratio (b) / (a) is the figure of the freshness targets.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from . import common
from .wallclock import PostgresStore, gumbel_scale, table_name


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def change_one_percent(store: PostgresStore, table: str, ids: np.ndarray, rng: Any) -> float:
    """Add +1 or -1 (clipped at 0) to 1% of the items, in one transaction; its seconds."""
    chosen = rng.choice(ids, max(1, len(ids) // 100), replace=False)
    deltas = rng.choice(np.array([-1, 1]), len(chosen))
    start = time.perf_counter()
    with store.con.transaction():
        store.con.execute(
            f"UPDATE {table} AS b SET score = greatest(b.score + c.d, 0) "
            "FROM unnest(%s::bigint[], %s::bigint[]) AS c(id, d) WHERE b.id = c.id",
            [chosen.tolist(), deltas.tolist()],
        )
    return time.perf_counter() - start


def measure(
    dsn: str, m: int, family: str, k: int = 10, epsilon: float = 1.0, reps: int = 5, seed: int = 0
) -> dict[str, Any]:
    """One (m, family) point on PostgreSQL: every figure of the module docstring."""
    from adapters.postgres import PostgresTable
    from topk_middleware import private_top_k

    store = PostgresStore(dsn)
    table = table_name(family, m) + "_fresh"
    scores = common.family_scores(family, m, k)
    ids = common.shuffled_ids(m, seed)
    rng = np.random.default_rng(seed)
    point: dict[str, Any] = {"store": "postgres-live", "m": m, "family": family, "k": k}
    live = copy = None
    try:
        store.con.execute(f"DROP TABLE IF EXISTS {table}_topk_pos")
        point["load_s"] = _timed(lambda: store.load(table, ids, scores))[0]
        store.con.execute(f"ALTER TABLE {table} ADD PRIMARY KEY (id)")
        live = PostgresTable(dsn, table, mode="live")
        copy = PostgresTable(dsn, table)
        point["prepare_live_s"] = _timed(live.prepare)[0]
        point["prepare_copy_s"] = _timed(copy.prepare)[0]
        scale = gumbel_scale(k, epsilon, m)
        oneshot_sql = store.oneshot_sql(table, k, scale)
        runs: dict[str, list[float]] = {
            "write": [],
            "fresh": [],
            "oneshot_sql": [],
            "unchanged_live": [],
            "unchanged_copy": [],
        }
        stats = []
        private_top_k(live, k, epsilon)  # warm the caches once, as every store is
        for _ in range(reps):
            runs["write"].append(change_one_percent(store, table, ids, rng))
            seconds, result = _timed(lambda: private_top_k(live, k, epsilon))
            runs["fresh"].append(seconds)
            stats.append(result.accesses)
            runs["oneshot_sql"].append(_timed(oneshot_sql)[0])
            runs["unchanged_live"].append(_timed(lambda: private_top_k(live, k, epsilon))[0])
            runs["unchanged_copy"].append(_timed(lambda: private_top_k(copy, k, epsilon))[0])
        for name, values in runs.items():
            point[f"{name}_s"] = statistics.median(values)
            point[f"{name}_all_s"] = values
        point["ratio_oneshot_over_fresh"] = point["oneshot_sql_s"] / point["fresh_s"]
        point["ratio_unchanged_live_over_copy"] = (
            point["unchanged_live_s"] / point["unchanged_copy_s"]
        )
        point["rows_fetched"] = statistics.median(s.rows_fetched for s in stats)
        point["round_trips"] = statistics.median(s.round_trips for s in stats)
        point["accesses"] = statistics.median(s.total for s in stats)
    finally:
        for name in (table, f"{table}_topk_pos"):
            store.con.execute(f"DROP TABLE IF EXISTS {name} CASCADE")
        if live is not None:
            store.con.execute(f'DROP FUNCTION IF EXISTS "{live.trigger_function}"()')
            live.close()
        if copy is not None:
            for name in (copy.rank_table, copy.runs_table):
                store.con.execute(f'DROP TABLE IF EXISTS "{name}"')
            copy.close()
        store.close()
    return point
