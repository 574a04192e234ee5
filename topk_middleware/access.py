"""The access model: sorted access and random access to a histogram, and the layer that counts them.

Wu, Ohrimenko, Wirth (ICML 2023), Section 2: the histogram h is reachable only through
*sorted access* (the next (item, score) pair in non-increasing score order) and *random access*
(the score of a named item). The cost of a mechanism is the number of such accesses.

Every store serves one canonical order: score descending, ties broken by id ascending. The position
of an item in that order is its *rank* (0-based). Ranks are how the core names items: sorted access
at depth t returns the item of rank t, and sampling "a uniformly random item not yet seen" is a
uniformly random rank, which a store serves from a positional index. Because every store agrees on
ranks, one seed gives one answer on every store.

A mechanism never holds a store: it holds a `CountedAccess`, which is the only door to it and
counts every row that passes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class Rows:
    """A batch of rows from a store: parallel arrays of canonical ranks, item ids and scores."""

    ranks: np.ndarray
    ids: np.ndarray
    scores: np.ndarray
    round_trips: int = 1

    def __len__(self) -> int:
        return len(self.ranks)


@runtime_checkable
class SortedAccess(Protocol):
    """Sorted access: rows in canonical order (score descending, ties by id ascending)."""

    def read_sorted(self, start: int, count: int) -> Rows:
        """Rows of canonical ranks start .. start + count - 1 (fewer at the end)."""
        ...


@runtime_checkable
class RandomAccess(Protocol):
    """Random access: the score of a named item, and the row at a given canonical rank."""

    def read_ids(self, ids: Sequence[Any]) -> np.ndarray:
        """Scores of the named items, in the order given; an unknown id is an error."""
        ...

    def read_ranks(self, ranks: np.ndarray) -> Rows:
        """Rows at the given canonical ranks (the positional index for uniform sampling)."""
        ...


@runtime_checkable
class Source(SortedAccess, RandomAccess, Protocol):
    """A histogram over a known, public domain of m items, served by sorted and random access."""

    def domain_size(self) -> int:
        """m: the number of items in the public domain, zero-vote items included."""
        ...

    def snapshot(self) -> AbstractContextManager[Any]:
        """A context in which every read sees one snapshot of the data (invariant 4)."""
        ...


@dataclass
class AccessStats:
    """What one mechanism run cost.

    `sorted` and `random` are the accesses the *sequential* algorithm makes on the data store, as
    the paper counts them (what Theorem 4.2 bounds). `rows_fetched` and `round_trips` are what the
    store really served. Batching pulls rows ahead, so rows_fetched is usually above total; it can
    also be below it, because the sequential algorithm may read one row twice (a random access to
    an item that sorted access reaches later) where a batch holds it once. Every sorted access is a
    distinct fetched row, and so is every random access: rows_fetched >= max(sorted, random).
    Access counts depend on the data: they are diagnostics for the operator, not private output.
    """

    sorted: int = 0
    random: int = 0
    rows_fetched: int = 0
    round_trips: int = 0

    @property
    def total(self) -> int:
        return self.sorted + self.random


class AccessError(ValueError):
    """A store broke the access contract (short read, unknown id, rank out of range)."""


class _Prefix:
    """The fetched canonical prefix: growable numpy buffers of ids and scores (amortised O(1))."""

    def __init__(self) -> None:
        self.size = 0
        self._scores = np.empty(0, dtype=np.float64)
        self._ids: np.ndarray | None = None

    @property
    def scores(self) -> np.ndarray:
        return self._scores[: self.size]

    @property
    def ids(self) -> np.ndarray:
        return self._ids[: self.size] if self._ids is not None else np.empty(0, dtype=object)

    def append(self, ids: np.ndarray, scores: np.ndarray) -> None:
        # Integer ids stay int64; anything else is kept as Python objects (numpy's fixed-width
        # strings would truncate a longer id fetched later).
        ids = np.asarray(ids)
        kind = np.int64 if ids.dtype.kind in "iu" else object
        need = self.size + len(scores)
        if self._ids is None:
            self._ids = np.empty(0, dtype=kind)
        elif kind is object and self._ids.dtype != object:
            self._ids = self._ids.astype(object)
        if need > len(self._scores):
            capacity = max(need, 2 * len(self._scores))
            self._scores = np.resize(self._scores, capacity)
            self._ids = np.resize(self._ids, capacity)
        self._scores[self.size : need] = scores
        self._ids[self.size : need] = ids
        self.size = need


@dataclass
class CountedAccess:
    """The only door from a mechanism to a store; it counts every access.

    Two layers meet here. *Fetches* (`fetch_sorted_until`, `fetch_ranks`, `read_all`) go to the
    store, in batches, and are counted as rows_fetched and round_trips. *Accesses*
    (`sorted_access`, `random_access` and their batched forms) are the steps of the sequential
    algorithm; they are served from what was fetched (fetching on demand if needed) and counted as
    the paper counts them.
    """

    source: Source
    stats: AccessStats = field(default_factory=AccessStats)

    def __post_init__(self) -> None:
        self.m = int(self.source.domain_size())
        self.stats.round_trips += 1
        self._prefix = _Prefix()
        self._by_rank: dict[int, tuple[Any, float]] = {}
        self._depth = 0  # next rank served by sorted access

    # ----- fetches: what the store serves -----------------------------------------------------
    @property
    def prefix_fetched(self) -> int:
        """How many rows of the canonical order have been pulled from the store."""
        return self._prefix.size

    @property
    def depth(self) -> int:
        """How many sorted accesses have been made: the next rank sorted access serves."""
        return self._depth

    def fetch_sorted_until(self, end: int) -> None:
        """Pull the canonical prefix up to rank `end` (exclusive) in one batch."""
        end = min(end, self.m)
        start = self.prefix_fetched
        if end <= start:
            return
        rows = self.source.read_sorted(start, end - start)
        if len(rows) != end - start:
            raise AccessError(
                f"store returned {len(rows)} rows for sorted ranks [{start}, {end}); the domain "
                "changed during the run or the store does not serve its canonical order"
            )
        self._count_fetch(rows)
        self._prefix.append(rows.ids, rows.scores)

    def is_fetched(self, rank: int) -> bool:
        """Whether the row at `rank` is already in memory (no fetch needed)."""
        return rank < self.prefix_fetched or rank in self._by_rank

    def fetch_ranks(self, ranks: Sequence[int] | np.ndarray) -> None:
        """Pull the rows at the given ranks that are not yet known, in one batch."""
        fetched = self.prefix_fetched
        wanted = sorted({int(r) for r in ranks if r >= fetched and int(r) not in self._by_rank})
        if not wanted:
            return
        if wanted[-1] >= self.m or wanted[0] < 0:
            raise AccessError(f"rank out of range [0, {self.m})")
        rows = self.source.read_ranks(np.asarray(wanted, dtype=np.int64))
        if len(rows) != len(wanted):
            raise AccessError(f"store returned {len(rows)} rows for {len(wanted)} ranks")
        self._count_fetch(rows)
        for rank, item, score in zip(
            rows.ranks.tolist(), rows.ids.tolist(), rows.scores.tolist(), strict=True
        ):
            self._by_rank[rank] = (item, score)

    def read_all(self) -> Rows:
        """A full read in canonical order: m sorted accesses (the one-shot mechanism's cost)."""
        rows = self.source.read_sorted(0, self.m)
        if len(rows) != self.m:
            raise AccessError(f"store returned {len(rows)} rows for a full read of m = {self.m}")
        self._count_fetch(rows)
        self.stats.sorted += self.m
        self._depth = self.m
        self._prefix = _Prefix()
        self._prefix.append(rows.ids, rows.scores)
        return rows

    def _count_fetch(self, rows: Rows) -> None:
        self.stats.rows_fetched += len(rows)
        self.stats.round_trips += rows.round_trips

    # ----- accesses: the steps of the sequential algorithm -----------------------------------
    def sorted_access(self) -> tuple[int, float]:
        """The next (rank, score) in canonical order: one sorted access."""
        rank = self._depth
        if rank >= self.m:
            raise AccessError("sorted access past the end of the domain")
        if rank >= self.prefix_fetched:
            self.fetch_sorted_until(rank + 1)
        self._depth += 1
        self.stats.sorted += 1
        return rank, float(self._prefix.scores[rank])

    def sorted_accesses(self, count: int) -> np.ndarray:
        """The scores of the next `count` ranks in canonical order: `count` sorted accesses."""
        start, end = self._depth, self._depth + count
        if count < 0 or end > self.m:
            raise AccessError(f"sorted access past the end of the domain (m = {self.m})")
        self.fetch_sorted_until(end)
        self._depth = end
        self.stats.sorted += count
        return self._prefix.scores[start:end].copy()

    def random_access(self, rank: int) -> float:
        """The score of the item at `rank`: one random access."""
        self.stats.random += 1
        if rank < self.prefix_fetched:
            return float(self._prefix.scores[rank])
        if rank not in self._by_rank:
            self.fetch_ranks([rank])
        return self._by_rank[rank][1]

    def random_accesses(self, ranks: np.ndarray) -> np.ndarray:
        """The scores of the items at `ranks`: len(ranks) random accesses (one fetch if needed)."""
        ranks = np.asarray(ranks, dtype=np.int64)
        self.fetch_ranks(ranks)
        self.stats.random += len(ranks)
        return self.scores_at(ranks)

    def scores_at(self, ranks: np.ndarray) -> np.ndarray:
        """Scores of fetched rows, without counting an access: for an algorithm that evaluates
        ahead and then charges exactly the accesses its sequential form makes (`charge`)."""
        ranks = np.asarray(ranks, dtype=np.int64)
        in_prefix = ranks < self.prefix_fetched
        scores = np.empty(len(ranks), dtype=np.float64)
        scores[in_prefix] = self._prefix.scores[ranks[in_prefix]]
        beyond = ranks[~in_prefix].tolist()
        if beyond:
            try:
                scores[~in_prefix] = [self._by_rank[r][1] for r in beyond]
            except KeyError as missing:
                raise AccessError(f"rank {missing.args[0]} has not been fetched") from None
        return scores

    def prefix_scores(self) -> np.ndarray:
        """The scores of the fetched prefix (read-only view, no access counted)."""
        view = self._prefix.scores
        view.flags.writeable = False
        return view

    def charge(self, sorted_count: int, random_count: int) -> None:
        """Count accesses that a vectorised evaluation made from fetched rows: the sorted ones
        are the next `sorted_count` ranks, which must have been fetched."""
        if self._depth + sorted_count > self.prefix_fetched:
            raise AccessError("charged sorted accesses beyond the fetched prefix")
        self._depth += sorted_count
        self.stats.sorted += sorted_count
        self.stats.random += random_count

    def random_access_ids(self, ids: Sequence[Any]) -> np.ndarray:
        """Scores of named items: len(ids) random accesses, fetched in one batch."""
        scores = np.asarray(self.source.read_ids(ids), dtype=np.float64)
        self.stats.random += len(ids)
        self.stats.rows_fetched += len(ids)
        self.stats.round_trips += 1
        return scores

    def id_of(self, rank: int) -> Any:
        """The item id at a rank that has already been fetched (no access is counted)."""
        item = self._prefix.ids[rank] if rank < self.prefix_fetched else self._by_rank[rank][0]
        return item.item() if isinstance(item, np.generic) else item  # plain Python ids

    def ids_of(self, ranks: Iterator[int] | Sequence[int]) -> list[Any]:
        return [self.id_of(r) for r in ranks]
