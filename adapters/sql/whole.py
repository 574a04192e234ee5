"""Runs that read a small table whole: its rows in the run's first query, every check of
validate() in numpy on the rows read, and the release from memory.

On a small table a run's statements cost more than its rows: a table read as it is now opens
with a few statements (its size and checks, the catalog) and its in-store one-shot takes a few
more, each a round trip, where one read of every (id, score) and a release in memory cost about
one. So a run that would read the table as it is now (engine._table_run) reads it whole where
the last run of this object found at most the dialect's measured crossover of rows
(`Dialect.whole_read_rows`, 0: never; the first run counts them); a run after a larger table
reads it the dialect's other way. A table grown past the crossover since the last run is read
whole once more (no LIMIT in the read: a LIMIT can cost a store more than the read itself).
Where the last run found the table small and the dialect says so (`whole_read_alone`), the
run is that one statement and nothing else (`alone_run`): no transaction, no copy, no proof of
freshness (one statement reads one snapshot; the table as it is now is current by definition),
whether or not a copy is current; exact scores (access.ExactScores) come from the same rows.

The rows read are checked as validate() checks the table (no NULL or repeated id, no NULL, NaN,
infinite or negative score, not empty; scores of a numeric type), in the project's words, then
sorted into the canonical order (score descending, ties by id ascending: byte order for text,
which is the order of Python's str and bytes), so positions are ranks. Reads are slices of that
order, counted as ArraySource's are (a round trip a batch, though the rows are in hand); the
planner then prices the threshold run and the one-shot over the full read in memory from what
they cost in Python (`MEMORY_COSTS`: a threshold run's round trips cost about 0.5 ms each, the
one-shot 0.07 us a row, so up to about 10^4 rows the one-shot over the rows read is chosen):
the in-store one-shot is not offered, the full read is the one-shot. Cost: one read of m rows
and two stable sorts (O(m log m)).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from adapters._sql import TableFacts, raise_if_invalid, scores_in_order
from topk_middleware.access import AccessError, Rows, RunTraits, ScoreBins, StoreCosts
from topk_middleware.keyed_noise import KeyedNoise

# The rows are in memory: what a run over them costs in Python (ArraySource-like reads, measured
# at 10^3-2*10^4 rows on the 2-core machine, load 4-6): the one-shot over the rows 0.07 us a row
# past a fixed 0.1-0.2 ms (0.13-0.24 ms at 10^3, 1.3-1.9 ms at 2*10^4), a threshold run about
# 0.5 ms a round trip of its blocks (1.2-20 ms at 3-7 round trips, every family), so a round trip
# priced at 0.5 ms and a batch of random reads alike; the in-store one-shot not offered.
MEMORY_COSTS = StoreCosts(round_trip=5e-4, random_batch=5e-4, full_read_row=7e-8, oneshot_row=1.0)

# What a run's freshness says of a copy it did not read as current (engine.Run.freshness).
STALE = ("stale", "none", "unprovable", "not read")


def _column(values: Any) -> tuple[np.ndarray, np.ndarray]:
    """(values, is NULL) of a column as a driver returns it (numpy, masked where NULL, or a
    list with None); bytearrays (BLOBs) as bytes, which hash and compare alike."""
    if isinstance(values, np.ma.MaskedArray):
        return np.asarray(values.data), np.ma.getmaskarray(values)
    array = np.asarray(values)
    if array.dtype == object:
        listed = [bytes(v) if isinstance(v, bytearray) else v for v in array.tolist()]
        array = np.empty(len(listed), dtype=object)
        array[:] = listed
        return array, np.equal(array, None)
    return array, np.zeros(len(array), dtype=bool)


def _numbers(t: Any, values: np.ndarray, nulls: np.ndarray) -> np.ndarray:
    """The scores as doubles, or a refusal where the column holds something else (a column
    altered since the source was made)."""
    if values.dtype.kind in "iuf":
        return values.astype(np.float64)
    kept = values[~nulls]
    bad = next((v for v in kept.tolist() if isinstance(v, bool | str | bytes)), None)
    try:
        if bad is not None:
            raise TypeError
        out = np.zeros(len(values))
        out[~nulls] = np.asarray(kept.tolist(), dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(
            f"{t.where} column {t.score_column!r} must be numeric, it holds "
            f"{type(bad if bad is not None else kept[0]).__name__} values"
        ) from None
    return out


class WholeReads:
    """One run's reads of a table read whole (module docstring): an engine.Reads strategy."""

    reads: str | None = None  # no in-store one-shot reads anything

    def __init__(self, t: Any, ids: np.ndarray, scores: np.ndarray, raw: np.ndarray) -> None:
        self.t, self.ids, self.scores, self.m = t, ids, scores, len(scores)
        self.raw = raw  # the scores as the table holds them, in the same order
        self._by_id: dict[Any, float] | None = None
        self._exact: dict[Any, Any] | None = None
        self.report: dict[str, Any] = {}  # the run's freshness where it runs alone (alone_run)

    @classmethod
    def open(cls, t: Any, cap: int | None = None, alone: bool = False) -> WholeReads | None:
        """The table read whole and checked (module docstring), or None where the dialect does
        not read whole, the last run found the table larger, the table has more rows than the
        dialect reads whole (`cap`: its whole_read_rows), or the read failed (the dialect's own
        reads then say why). `alone`: no transaction is open (Dialect.read_whole)."""
        cap = int(t.dialect.whole_read_rows if cap is None else cap)
        last = t.last_m
        if t._oblivious or cap <= 0 or (last is not None and last > cap):
            return None
        sql = f"SELECT {t.id_sql} AS id, {t.score_sql} AS score FROM {t.source}"
        try:
            if last is None:  # the first run of this object: how many rows first
                t.last_m = last = int(t.driver.scalar(f"SELECT count(*) FROM {t.source}"))
                if last > cap:
                    return None
            got = t.dialect.read_whole(t.driver, t, sql, alone)
        except t.driver.errors:
            return None
        ids, id_nulls = _column(got["id"])
        values, score_nulls = _column(got["score"])
        scores = _numbers(t, values, score_nulls)
        bad = ~score_nulls & ~np.isfinite(scores)
        negative = ~score_nulls & ~bad & (scores < 0)
        kept = ~id_nulls
        # ids in order (byte order for text), repeated ones side by side
        by_id = np.flatnonzero(kept)[np.argsort(ids[kept], kind="stable")]
        sorted_ids = ids[by_id]
        same = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1]) if len(by_id) > 1 else []
        nulls = int(id_nulls.sum())
        facts = TableFacts(
            len(ids), nulls, len(ids) - nulls - len(same), int(score_nulls.sum()),
            int(bad.sum()), int(negative.sum()),
        )  # fmt: skip
        duplicate = sorted_ids[same[:1]].tolist()[0] if len(same) else None
        raise_if_invalid(facts, t.where, t.id_column, t.score_column, duplicate)
        order = by_id[np.argsort(-scores[by_id], kind="stable")]
        t.last_m = len(ids)
        return cls(t, ids[order], scores[order], values[order])

    # ----- engine.Reads -------------------------------------------------------------------------
    def traits(self) -> RunTraits:
        """Positions are ranks; reads are counted as ArraySource's (module docstring)."""
        return RunTraits(
            sorted_read_rows=self.m,
            costs=MEMORY_COSTS,
            oblivious_costs=self.t.oblivious_costs,
        )

    def read_sorted(self, start: int, stop: int) -> Rows:
        positions = np.arange(start, stop, dtype=np.int64)
        return Rows(positions, self.ids[start:stop], self.scores[start:stop])

    def read_positions(self, positions: np.ndarray) -> Rows:
        wanted = np.unique(np.asarray(positions, dtype=np.int64))
        if len(wanted) and (wanted[0] < 0 or wanted[-1] >= self.m):
            raise AccessError(f"positions must be in [0, {self.m})")
        return Rows(wanted, self.ids[wanted], self.scores[wanted])

    def read_ids(self, ids: list[Any]) -> np.ndarray:
        if self._by_id is None:
            self._by_id = dict(zip(self.ids.tolist(), self.scores.tolist(), strict=True))
        asked = [bytes(i) if isinstance(i, bytearray) else i for i in ids]
        return scores_in_order(self._by_id, asked, self.t.where)

    def read_exact_scores(self, ids: list[Any]) -> list[Any]:
        """access.ExactScores from the rows read: integers as Python ints, numerics as the
        driver returns them (Decimals). An integer column the driver read as doubles (a 128-bit
        integer through a numpy fetch: inexact past 2^53) is asked of the table by id instead."""
        if self.raw.dtype.kind == "f" and self.t.integer_scores:
            return self.t.scores_by_id(ids)
        if self._exact is None:
            self._exact = dict(zip(self.ids.tolist(), self.raw.tolist(), strict=True))
        asked = [bytes(i) if isinstance(i, bytearray) else i for i in ids]
        try:
            return [self._exact[item] for item in asked]
        except KeyError as missing:
            raise AccessError(f"{self.t.where} has no item with id {missing.args[0]!r}") from None

    def read_oneshot(self, noise: KeyedNoise, k: int) -> Rows | None:
        return None  # the full read is in hand: the one-shot over it

    def oneshot_positions(self) -> int:
        return self.m

    # ----- the access protocols a store may add ------------------------------------------------
    def count_at_least(self, score: float) -> int | None:
        return None

    def read_score_histogram(self, bins: ScoreBins) -> tuple[np.ndarray, np.ndarray]:
        """access.ScoreHistogramRead from memory: the scores at or below bins.top are a suffix
        of the canonical order, their bins (ScoreBins.index) ascending along it."""
        kept = self.scores[np.searchsorted(-self.scores, -bins.top, side="left") :]
        index = bins.index(kept)
        starts = np.flatnonzero(np.r_[True, index[1:] != index[:-1]]) if len(kept) else []
        counts = np.diff(np.r_[starts, len(kept)]).astype(np.int64)
        return (np.maximum.reduceat(kept, starts) if len(kept) else kept), counts

    def read_position_scores(self, positions: np.ndarray) -> Any:
        return None

    def position_slots(self) -> int:
        return self.m


def alone_run(t: Any) -> WholeReads | None:
    """The reads of a run of a table the last run found small (at most the dialect's
    whole_read_rows rows; or at most its whole_read_alone_rows where the last run found no
    current copy: a copy written since, or none read, and a read alone may take a faster
    statement, Dialect.read_whole) that reads it whole in one statement outside any
    transaction: one statement reads one snapshot in every SQL store, and a table read as it
    is now needs no copy, no proof of freshness and no count, so the run is one round trip;
    `report` is the run's freshness. None where the run is oblivious, the dialect reads no
    table whole or not alone (`Dialect.whole_read_alone`), no run has counted the table yet or
    found it larger, or the read failed (the run then opens as any other)."""
    d, last = t.dialect, t.last_m
    cap = int(d.whole_read_rows)
    if last is not None and last > cap and (t.last_freshness or {}).get("copy") in STALE:
        cap = max(cap, int(d.whole_read_alone_rows))  # the last run read no current copy
    if t._oblivious or not d.whole_read_alone or cap <= 0 or last is None or last > cap:
        return None
    whole = WholeReads.open(t, cap, alone=True)
    if whole is not None:
        whole.report = {"copy": "not read", "read": "table whole", "whole_read_rows": cap}
    return whole


__all__ = ["MEMORY_COSTS", "WholeReads", "alone_run"]
