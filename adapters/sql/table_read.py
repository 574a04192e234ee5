"""Runs that read the table itself: what a run does when its copy is not proven current and
reading the table is priced below a rebuild (docs/freshness.md).

The release is the one-shot mechanism (Wu, Ohrimenko, Wirth 2023, Algorithm 2) run in the store
on the user's table with keyed noise (topk_middleware/keyed_noise.py). Each row's *position* is
its slot, an address fixed within the run's snapshot that the dialect names (a heap address:
block * P + offset - 1, P the most tuples a page holds, plus the first slot of its relation
where the table has partitions; or a row id), known with the table's
size before any noise is drawn. Slots without a row are positions without an item: each is
still an exceedance with probability q, independently, and an empty one never wins, so the
release has the one-shot law.

The run's first query (the dialect's `open_table`) is one aggregate pass: m, the largest score,
the checks of validate() that the catalog does not guarantee (a unique key vouches for the ids,
NOT NULL and CHECK constraints for the scores), and the slots; `scan_table` is that pass for a
dialect whose catalog vouches for nothing but a unique key (a table without slots is read in
full in canonical order where the one-shot runs in the client). Then
`table_oneshot`:

1. the exceedances (about 1,024 positions drawn by the client) are read by slot, with, where a
   B-tree leads with the score or the store keeps no statistics of it, the k rows of the top
   scores; their noise is computed here (the exceedances' drawn, the others' keyed) and the
   k-th largest noisy score T of them;
2. one range read of the rows with score >= c computes the keyed noise of each in the store and
   returns the k best. c = T - bound is a valid cut (a row outside the exceedances can reach T
   only from there); where the top rows were not read, c is the larger of that and a cut guessed
   from the store's statistics (a score above which they put at least GUESS_ROWS_PER_K * k
   rows, less the bound and one scale: among 4k rows the k-th largest noise is about b ln 4 >
   0), checked afterwards: when the k-th best of both reads, less the bound, lies below it, the
   range read is made again from there (exactly). Statistics gone stale cost that second read,
   never an answer.
3. the merge (here, once for every dialect): the rows of both reads by position, the k best by
   noisy score, ties by smaller position; ids repeated among them refused where no unique key
   vouched for the ids.

Explicit threshold runs on the table read by rank: sorted reads ORDER BY .. LIMIT OFFSET,
reads by rank a row_number() window over the table (`sorted_by_rank`, `positions_by_rank`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from adapters._sql import TableFacts, id_array, raise_if_invalid, rows_from_records
from topk_middleware.access import AccessError, Rows
from topk_middleware.keyed_noise import KeyedNoise

from .checks import refuse_non_numbers

# The cut guessed from the statistics keeps about this many times k rows above it.
GUESS_ROWS_PER_K = 4
# Ids are counted distinct on tables of at most this many rows without a unique key.
DISTINCT_CHECK_MAX = 100_000


@dataclass
class TableState:
    """What a run reading the table itself knows after its first query."""

    leaves: list[tuple[int, str, int]]  # (relation id, qualified name, first slot)
    per_page: int  # slots per block (0: slots are row ids)
    slots: int  # positions the exceedances are drawn from
    max_score: float
    score_type: str
    unique_ids: bool  # a unique key (or a count) guarantees distinct ids
    score_index: bool  # a B-tree leads with the score column
    m: int = 0
    stats: tuple[list[float], list[float], list[float], float] | None = None
    plan: dict[str, Any] = field(default_factory=dict)
    offset: int = 0  # the smallest row id, where slots are row ids

    @property
    def partitioned(self) -> bool:
        return len(self.leaves) != 1


def scan_table(
    t: Any, unique: bool, estimate: int, extra: Sequence[str] = ()
) -> tuple[TableState, list[Any]]:
    """A run's first query over the table where the dialect has nothing better: one aggregate
    pass with m, the largest score and validate()'s checks (NULL ids and scores, scores that are
    not numbers, NaN, infinite or negative), and the values of `extra`. Ids are counted distinct
    in byte order unless a unique key vouches for them (`unique`) or the table has more than
    DISTINCT_CHECK_MAX rows by `estimate` (then the rows a release reads are checked: the
    merge in `table_oneshot`). A state with one relation and no positions, which the dialect
    completes."""
    d, s, i, driver = t.dialect, t.score_sql, t.id_sql, t.driver
    distinct = not unique and estimate <= DISTINCT_CHECK_MAX
    key = d.byte_order(i) if t.text_ids else i
    bad, odd = d.non_finite(s, t.score_info), d.non_numbers(s)
    columns = [
        "count(*)",
        f"count({i})",
        f"count({s})",
        f"min({s})",
        f"max({s})",
        d.count_if(bad) if bad else "0",
        d.count_if(odd) if odd else "0",
        f"count(DISTINCT {key})" if distinct else "NULL",
        *extra,
    ]
    row = driver.one(f"SELECT {', '.join(columns)} FROM {t.source}")
    m, ids, scores, low, high, non_finite, non_numbers, distinct_ids = row[:8]
    m = int(m)
    refuse_non_numbers(t, m, int(non_numbers or 0))
    negative = 0
    if low is not None and float(low) < 0:
        negative = int(driver.scalar(f"SELECT count(*) FROM {t.source} WHERE {s} < 0"))
    facts = TableFacts(m, m - int(ids), m, m - int(scores), int(non_finite or 0), negative)
    raise_if_invalid(facts, t.where, t.id_column, t.score_column)
    if distinct and int(distinct_ids) != m:
        duplicate = driver.scalar(
            f"SELECT {key} FROM {t.source} GROUP BY {key} HAVING count(*) > 1 LIMIT 1"
        )
        facts = TableFacts(m, 0, int(distinct_ids), 0, 0, 0)
        raise_if_invalid(facts, t.where, t.id_column, t.score_column, duplicate)
    state = TableState(
        [(0, t.source, 0)], 0, 0, float(high), t.score_info.type, unique or distinct, False, m
    )
    return state, list(row[8:])


def open_table(t: Any) -> TableState | None:
    """The first query of a run that reads the table (the dialect's), or None where the
    relation has no slots (a view): the run then reads by rank."""
    return t.dialect.open_table(t)


def guess_cut(
    stats: tuple[list[float], list[float], list[float], float], m: int, rows: int
) -> float | None:
    """The largest score x among the statistics' most common values and histogram bounds above
    which they put at least `rows` of m rows, counting a histogram bucket only where it lies
    wholly above x (scores are skewed within the top bucket: a linear reading of it puts the
    cut far too high on Zipf counts); None where the statistics do not say."""
    values, freqs, bounds, null_frac = stats
    other = max(0.0, 1.0 - null_frac - float(sum(freqs)))
    buckets = len(bounds) - 1

    def above(x: float) -> float:
        count = sum(f for v, f in zip(values, freqs, strict=False) if v >= x)
        if buckets > 0:
            whole = buckets - bisect.bisect_left(bounds, x)  # buckets whose lower bound >= x
            count += other * max(0, whole) / buckets
        return count * m

    for x in sorted({*values, *bounds}, reverse=True):
        if above(x) >= rows:
            return x
    return None


def below(t: float, bound: float) -> float:
    """The cut under a k-th best noisy score t: rows below it cannot reach t."""
    return t - bound - 1e-12 * abs(t) if math.isfinite(t) else -math.inf


def table_oneshot(t: Any, state: TableState, noise: KeyedNoise, k: int) -> Rows:
    """Algorithm 2 with keyed noise on the table itself (module docstring, steps 1-3)."""
    d, driver = t.dialect, t.driver
    top = state.score_index or state.stats is None
    sql, params = d.known_rows_sql(t, state, noise, k, top)
    records = driver.execute(sql, params) if sql else []
    positions = np.array([r[0] for r in records], dtype=np.int64)
    positions, first = np.unique(positions, return_index=True)
    ids = [records[i][1] for i in first]
    scores = np.array([float(records[i][2]) for i in first], dtype=np.float64)
    # min(score, B) + noise (privacy.score_bound), as every path reads scores
    capped = noise.capped(scores)
    noisy = capped + noise.noises(positions) if len(positions) else capped
    known_t = float(np.sort(noisy)[-k]) if len(noisy) >= k else -math.inf
    exact = below(known_t, noise.bound)
    cut, guessed = exact, False
    if not top and state.stats is not None:
        guess = guess_cut(state.stats, state.m, GUESS_ROWS_PER_K * k)
        if guess is not None and guess - noise.bound - noise.scale > exact:
            cut, guessed = guess - noise.bound - noise.scale, True
    rest = _range_read(t, state, noise, k, cut)
    values = np.concatenate([noisy, [float(r[3]) for r in rest]])
    kth = float(np.sort(values)[-k]) if len(values) >= k else -math.inf
    low = below(kth, noise.bound)
    state.plan.update({"cut_guessed": guessed, "cut_missed": guessed and low < cut})
    if guessed and low < cut:  # the statistics put the cut too high: read from low
        rest = _range_read(t, state, noise, k, low)
    all_positions = np.concatenate(
        [positions, np.array([r[0] for r in rest], dtype=np.int64)]
    ).astype(np.int64)
    all_ids = [*ids, *(r[1] for r in rest)]
    all_scores = np.concatenate([scores, [float(r[2]) for r in rest]])
    all_noisy = np.concatenate([noisy, [float(r[3]) for r in rest]])
    all_positions, first = np.unique(all_positions, return_index=True)
    all_ids = [all_ids[i] for i in first]
    all_scores, all_noisy = all_scores[first], all_noisy[first]
    if not state.unique_ids and len(set(all_ids)) != len(all_ids):
        seen: set[Any] = set()
        duplicate = next(i for i in all_ids if i in seen or seen.add(i))
        facts = TableFacts(len(all_ids), 0, len(set(all_ids)), 0, 0, 0)
        raise_if_invalid(facts, t.where, t.id_column, t.score_column, duplicate)
    best = np.lexsort((all_positions, -all_noisy))[:k]
    chosen = id_array([all_ids[i] for i in best])
    return Rows(np.arange(len(best), dtype=np.int64), chosen, all_scores[best])


def _range_read(t: Any, state: TableState, noise: KeyedNoise, k: int, cut: float) -> list[Any]:
    """The k best rows by score + keyed noise among those with score >= `cut` outside the
    exceedances, computed in the store: (position, id, score, noisy score)."""
    sql, params = t.dialect.range_read_sql(t, state, noise, k, cut)
    records = t.driver.execute(sql, params)
    if records and records[0][0] is None:
        raise AccessError(
            f"{t.where}: a row of a relation the run did not know (a partition attached "
            "during the run) was read: try again"
        )
    return records


# ----- reads by rank (an explicit threshold run on the table) ---------------------------------
def sorted_by_rank(t: Any, start: int, stop: int) -> Rows:
    """Depths [start, stop) of the canonical order of the table: ORDER BY .. LIMIT OFFSET (no
    output column named like a table column: ORDER BY would take the alias, a cast score, and
    sort instead of walking an index on the score)."""
    records = t.driver.execute(
        f"SELECT 0, {t.id_sql}, {t.dialect.double(t.score_sql)} "
        f"FROM {t.source} ORDER BY {t.order_sql()} LIMIT :count OFFSET :start",
        {"count": int(stop - start), "start": int(start)},
    )
    rows = rows_from_records(records)
    return Rows(np.arange(start, start + len(rows), dtype=np.int64), rows.ids, rows.scores)


def positions_by_rank(t: Any, ranks: np.ndarray) -> Rows:
    """The rows at canonical ranks: a row_number() window over the whole table per batch."""
    return t._rows_at(f"({t.canonical_rows()})", ranks)


__all__ = [
    "DISTINCT_CHECK_MAX",
    "GUESS_ROWS_PER_K",
    "TableState",
    "below",
    "guess_cut",
    "open_table",
    "positions_by_rank",
    "scan_table",
    "sorted_by_rank",
    "table_oneshot",
]
