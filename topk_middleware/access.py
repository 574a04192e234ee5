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
counts every row that passes, and every random access it can answer without a row because the
sorted order already fixes the score (`AccessStats.rows_inferred`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .sorted_chunks import SortedChunks


@dataclass(frozen=True)
class Rows:
    """A batch of rows from a store: parallel arrays of item positions, ids and scores."""

    positions: np.ndarray
    ids: np.ndarray
    scores: np.ndarray
    round_trips: int = 1

    def __len__(self) -> int:
        return len(self.positions)


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

    def read_positions(self, ranks: np.ndarray) -> Rows:
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


@runtime_checkable
class ScoreRuns(Protocol):
    """Optional: the canonical order as runs of tied scores, kept by the store beside its rows.

    Scores are non-increasing along ranks, so the runs (first rank of each distinct score) map
    every rank to its score. A store that keeps them (built with its rank table by prepare())
    lets random access by rank be answered without reading rows; count data has few runs.
    """

    def score_run_count(self) -> int | None:
        """How many runs the snapshot holds (no round trip: known with m), or None if the store
        keeps none."""
        ...

    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        """(first rank of each run, ascending from 0; its score, descending) in one round trip."""
        ...


@dataclass
class AccessStats:
    """What one mechanism run cost.

    `sorted` and `random` are the accesses the *sequential* algorithm makes on the data store, as
    the paper counts them (what Theorem 4.2 bounds). `rows_fetched` and `round_trips` are what the
    store really served. Batching pulls rows ahead, so rows_fetched is usually above total; it can
    also be below it, for two reasons. The sequential algorithm may read one row twice (a random
    access to an item that sorted access reaches later) where a batch holds it once. And a random
    access whose score is fixed by what is known of the sorted order (two known rows of equal
    score around it, or the store's runs of tied scores) is answered without a read
    (`rows_inferred`; see `CountedAccess.fetch_ranks`). rows_fetched also counts the runs read.
    Every sorted access is a distinct fetched row, and every random access a distinct fetched or
    inferred row: rows_fetched >= sorted and rows_fetched + rows_inferred >= random.
    Access counts depend on the data: they are diagnostics for the operator, not private output.
    """

    sorted: int = 0
    random: int = 0
    rows_fetched: int = 0
    round_trips: int = 0
    rows_inferred: int = 0

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
    the paper counts them. A random access beyond the fetched prefix may be served without a
    fetch when its score is fixed: by two known neighbours of one score, or by the store's runs
    of tied scores (`fetch_ranks`).
    """

    source: Source
    stats: AccessStats = field(default_factory=AccessStats)

    def __post_init__(self) -> None:
        self.m = int(self.source.domain_size())
        self.stats.round_trips += 1
        self._prefix = _Prefix()
        self._known = SortedChunks()  # rank -> score beyond the prefix, fetched or inferred
        self._ids_beyond: dict[int, Any] = {}  # ids of the rows fetched beyond the prefix
        self._depth = 0  # next rank served by sorted access
        self._rank_rows = 0  # rows read by rank so far (for scores)
        self._runs: tuple[np.ndarray, np.ndarray] | None = None  # the store's runs, once read
        self._run_count = (
            self.source.score_run_count() if isinstance(self.source, ScoreRuns) else None
        )
        # A store whose round trip costs about as much as reading this many rows asks for at
        # least this many per sorted read (optional attribute; 0: read what is asked).
        self._sorted_read_rows = int(getattr(self.source, "sorted_read_rows", 0) or 0)

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
        """Pull the canonical prefix up to rank `end` (exclusive) in one batch. After the first
        read (a run that needs a second one is a long one), at least the store's
        `sorted_read_rows` rows, if it names them: reading ahead costs that store nothing."""
        start = self.prefix_fetched
        if min(end, self.m) <= start:
            return
        if start:
            end = max(end, start + self._sorted_read_rows)
        end = min(end, self.m)
        rows = self.source.read_sorted(start, end - start)
        if len(rows) != end - start:
            raise AccessError(
                f"store returned {len(rows)} rows for sorted ranks [{start}, {end}); the domain "
                "changed during the run or the store does not serve its canonical order"
            )
        self._count_fetch(rows)
        self._prefix.append(rows.ids, rows.scores)

    def is_fetched(self, rank: int) -> bool:
        """Whether the score at `rank` is already known (no fetch needed)."""
        if rank < self.prefix_fetched:
            return True
        return bool(self._known.lookup(np.array([rank], dtype=np.int64))[0][0])

    def fetch_ranks(self, ranks: Sequence[int] | np.ndarray) -> None:
        """Make the scores at the given ranks known, reading from the store in one batch.

        The canonical order sorts scores descending, so when the nearest known rows below and
        above a rank have one score, the rank has that score too: it is *inferred*, not read (a
        zone map on the sorted column; on count data most of the long tail is tied). The rows
        still to read go in one batch. If the store keeps its runs of tied scores (`ScoreRuns`),
        they are read instead once the rows read by rank would reach their number (ski rental:
        at most about twice the rows of the cheaper choice), and every later random access is
        answered from them.
        """
        wanted = np.unique(np.asarray(ranks, dtype=np.int64))
        if not len(wanted):
            return
        if wanted[0] < 0 or wanted[-1] >= self.m:
            raise AccessError(f"rank out of range [0, {self.m})")
        wanted = wanted[wanted >= self.prefix_fetched]
        if self._known.count:
            wanted = wanted[~self._known.lookup(wanted)[0]]
        if not len(wanted):
            return
        inferred, scores = self._infer(wanted)
        read = wanted[~inferred]
        if len(read) and self._read_runs_if_due(len(read)):
            inferred, scores = self._infer(wanted)
            read = wanted[~inferred]
        if len(read):
            self._rank_rows += len(read)
            rows = self.source.read_positions(read)
            if len(rows) != len(read):
                raise AccessError(f"store returned {len(rows)} rows for {len(read)} ranks")
            self._count_fetch(rows)
            got = np.asarray(rows.positions, dtype=np.int64)
            self._ids_beyond.update(zip(got.tolist(), np.asarray(rows.ids).tolist(), strict=True))
            self._known.add(got, np.asarray(rows.scores, dtype=np.float64))
        self._known.add(wanted[inferred], scores[inferred])
        self.stats.rows_inferred += int(inferred.sum())

    def _infer(self, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mask, scores) of the ranks (beyond the prefix, not known) whose score is fixed: by the
        store's runs once read, else by two neighbours of one score."""
        if self._runs is not None:
            first, run_scores = self._runs
            scores = run_scores[np.searchsorted(first, ranks, side="right") - 1]
            return np.ones(len(ranks), dtype=bool), scores
        below, below_score, _, above_score = self._known.neighbours(ranks)
        fetched = self.prefix_fetched
        if fetched:  # the prefix's last row is a neighbour below every rank beyond it
            use_prefix = below < fetched - 1
            below_score[use_prefix] = self._prefix.scores[fetched - 1]
        return below_score == above_score, below_score

    def _read_runs_if_due(self, pending: int) -> bool:
        """Read the store's runs once rows read by rank (with `pending` more) reach their count."""
        count = self._run_count
        if self._runs is not None or count is None or self._rank_rows + pending < count:
            return False
        first, scores = self.source.read_score_runs()  # type: ignore[attr-defined]
        first = np.asarray(first, dtype=np.int64)
        scores = np.asarray(scores, dtype=np.float64)
        valid = (
            len(first) == count == len(scores)
            and count > 0
            and first[0] == 0
            and first[-1] < self.m
            and bool(np.all(np.diff(first) > 0))
            and bool(np.all(np.diff(scores) < 0))
        )
        if not valid:
            raise AccessError(
                f"the store's runs of tied scores are inconsistent ({len(first)} runs, "
                f"{count} announced, m = {self.m}): rebuild them with prepare(refresh=True)"
            )
        self.stats.rows_fetched += count
        self.stats.round_trips += 1
        self._runs = (first, scores)
        return True

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
        self.fetch_ranks([rank])
        return float(self.scores_at(np.array([rank], dtype=np.int64))[0])

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
        if not in_prefix.all():
            beyond = ranks[~in_prefix]
            found, known = self._known.lookup(beyond)
            if not found.all():
                raise AccessError(f"rank {int(beyond[~found][0])} has not been fetched")
            scores[~in_prefix] = known
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
        """The item id at a rank (no access is counted; see `ids_of`)."""
        return self.ids_of([rank])[0]

    def ids_of(self, ranks: Iterator[int] | Sequence[int]) -> list[Any]:
        """The item ids at ranks whose scores are known, as plain Python values. No access is
        counted: the accesses were counted when the scores were. An id at an inferred rank was
        never read; those are read in one batch (rows_fetched, one round trip)."""
        ranks = [int(r) for r in ranks]
        fetched = self.prefix_fetched
        missing = sorted({r for r in ranks if r >= fetched and r not in self._ids_beyond})
        if missing:
            if not all(self.is_fetched(r) for r in missing):
                raise AccessError("an id was asked for at a rank whose score is not known")
            rows = self.source.read_positions(np.asarray(missing, dtype=np.int64))
            if len(rows) != len(missing):
                raise AccessError(f"store returned {len(rows)} rows for {len(missing)} ranks")
            expected = self.scores_at(np.asarray(rows.positions, dtype=np.int64))
            if not np.array_equal(expected, np.asarray(rows.scores, dtype=np.float64)):
                raise AccessError("a row changed score during the run: the snapshot is broken")
            self._count_fetch(rows)
            got = np.asarray(rows.positions).tolist()
            self._ids_beyond.update(zip(got, np.asarray(rows.ids).tolist(), strict=True))
        prefix_ids = self._prefix.ids
        out = [prefix_ids[r] if r < fetched else self._ids_beyond[r] for r in ranks]
        return [x.item() if isinstance(x, np.generic) else x for x in out]  # plain Python ids
