"""The access model: sorted access and random access to a histogram, and the layer that counts them.

Wu, Ohrimenko, Wirth (ICML 2023), Section 2: the histogram h is reachable only through
*sorted access* (the next (item, score) pair in non-increasing score order) and *random access*
(the score of a named item). The cost of a mechanism is the number of such accesses.

Two ways of naming an item meet here (DESIGN invariant 11):

* its *depth*: its place in the one canonical order every store serves (score descending, ties
  by id ascending). Sorted access at depth t returns the row of depth t.
* its *position*: a dense number 0..m-1 fixed for the snapshot, which is what random access and
  uniform sampling name ("a uniformly random item not yet seen" is a uniformly random position).
  Sorted access returns each row with its position.

A rank-ordered copy of the table (what `prepare()` builds) makes them the same: an item's position
is its rank. Such a store says so (`positions_are_ranks`), and then the order of positions is the
order of scores, which lets random access be answered without reading rows (tied neighbours, the
store's runs of tied scores). A live table keeps them apart: positions come from a dense integer
key or a position table kept current across writes, and sorted access reads an index. Every
rank-ordered store agrees on positions, so one seed gives one answer on all of them; on a live
table the answer for a seed depends on its positions, the output law does not.

A mechanism never holds a store: it holds a `CountedAccess`, which is the only door to it and
counts every row that passes, every random access it can answer without a row because the
sorted order already fixes the score (`AccessStats.rows_inferred`), and every random access a
mechanism settled from bounds on the score alone (`AccessStats.rows_bounded`: block-max pruning,
`CountedAccess.score_bounds`).

Size: the access protocols and CountedAccess, the one door every mechanism reads
through; its bounds (tied runs, block-max) must stay beside the counting they change.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .sorted_chunks import SortedChunks

# The zone map of a rank-ordered store (`CountedAccess.tighten_bounds`): about this many ranks,
# log-spaced from the end of the fetched prefix to the last rank.
ZONE_MAP_ROWS = 256


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
        """Rows of depths start .. start + count - 1 of the canonical order, each with its
        position (fewer at the end)."""
        ...


@runtime_checkable
class RandomAccess(Protocol):
    """Random access: the score of a named item, and the row at a given position."""

    def read_ids(self, ids: Sequence[Any]) -> np.ndarray:
        """Scores of the named items, in the order given; an unknown id is an error."""
        ...

    def read_positions(self, positions: np.ndarray) -> Rows:
        """Rows at the given positions 0..m-1 (the positional index for uniform sampling)."""
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


# implements(): whether a class provides every method of a protocol (None: not decidable by class)
_BY_CLASS: dict[tuple[type, type], bool | None] = {}
_MEMBERS: dict[type, frozenset[str]] = {}


def implements(source: Any, protocol: type) -> bool:
    """isinstance(source, protocol) for a runtime-checkable protocol of methods, decided once per
    class where the class alone decides it (a protocol check costs 5-10 us; a release makes
    several): the class provides every method, or lacks one that the instance does not set
    either (no __getattr__). Otherwise the check itself."""
    cls = type(source)
    key = (cls, protocol)
    known = _BY_CLASS.get(key, ...)
    if known is ...:
        try:
            known = issubclass(cls, protocol)
        except TypeError:  # a protocol with data members: no answer by class
            known = None
        if known is False and any("__getattr__" in vars(base) for base in cls.__mro__):
            known = None
        _BY_CLASS[key] = known
    if known:
        return True
    if known is False:
        members = _MEMBERS.get(protocol)
        if members is None:
            members = frozenset(
                name
                for name, value in vars(protocol).items()
                if callable(value) and not name.startswith("_")
            )
            _MEMBERS[protocol] = members
        try:
            own = vars(source)
        except TypeError:  # no instance dictionary (__slots__)
            own = {}
        if members.isdisjoint(own):
            return False
    return isinstance(source, protocol)


@runtime_checkable
class SortedIds(Protocol):
    """Optional: the top rows of the canonical order without their positions, where a store
    finds a position only through another lookup per row (PostgreSQL's live tables: the
    position table). Oblivious releases (mechanisms/oblivious.py) match the top rows with the
    rows read by position through their ids, so they need no position of a top row."""

    def read_sorted_ids(self, count: int) -> Rows:
        """The ids and scores of depths 0 .. count - 1 in one batch, positions all -1."""
        ...


def parameters_in_text(source: Any) -> bool:
    """Whether the store's driver writes query parameters into the statement text a server
    observer reads (StoreTraits.parameters_in_text: pymysql, psycopg2), so that no secret (a key,
    drawn positions, noises) may be sent to it as a parameter."""
    return store_traits(source).parameters_in_text


def positions_are_ranks(source: Any) -> bool:
    """Whether the source names every item by its rank in the canonical order (a rank-ordered
    copy; RunTraits.positions_are_ranks)."""
    return run_traits(source).positions_are_ranks


@runtime_checkable
class ScoreRuns(Protocol):
    """Optional: the canonical order as runs of tied scores, kept by the store beside its rows.

    Scores are non-increasing along ranks, so the runs (first rank of each distinct score) map
    every rank to its score. A store that keeps them (built with its rank table by prepare())
    lets random access by rank be answered without reading rows; count data has few runs.
    """

    def score_run_count(self) -> int | None:
        """How many runs the snapshot holds (no round trip: known with m), or None if the store
        keeps none. A store that has them in hand already (read with m) says so
        (RunTraits.score_runs_in_hand): the core then takes them before it reads any row by
        rank (where a row by rank costs that store far more than a run)."""
        ...

    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        """(first rank of each run, ascending from 0; its score, descending) in one round trip.

        A store for which sizing the lower runs costs reads (PostgreSQL's live tables count
        rows) may also offer `read_score_runs_head()` (ScoreRunsHead), which the core then
        calls first."""
        ...


@runtime_checkable
class ScoreRunsHead(Protocol):
    """Optional, beside ScoreRuns: the runs' head, where sizing the lower runs costs reads."""

    def read_score_runs_head(self) -> tuple[np.ndarray, np.ndarray]:
        """The pair read_score_runs() gives, but with first ranks for the leading runs only, its
        last entry the rank where the rest begins. The runs not given fill [first[-1], m) in
        order, their starts unknown, so a score there lies in [scores[-1], scores[len(first) -
        1]]. Where those bounds do not settle a rank, the core reads the full runs with
        `read_score_runs()`."""
        ...


@dataclass(frozen=True)
class ScoreBins:
    """Bins of the scores at or below `top` by their distance d = top - score: one `width`
    while d < linear x width, then a width that grows with d (a share 1/per_e of it):

        bin(d) = floor(d / width)                                  where d < linear x width,
                 linear + floor(per_e x ln(d / (linear x width)))  elsewhere.

    Each bin is read as its largest score and how many items it holds (ScoreHistogramRead), so
    an item is read at most max(width, d / per_e) above its score; a store may compute the bins
    in its own arithmetic (a score on a boundary may land in the next bin: nothing else moves).
    Non-empty bins: at most linear + per_e x ln(spread / (linear x width)) + 1."""

    top: float
    width: float
    linear: int = 2048
    per_e: int = 512

    def index(self, scores: np.ndarray) -> np.ndarray:
        """The bins of these scores (each at most `top`), in numpy."""
        d = self.top - np.asarray(scores, dtype=np.float64)
        edge = self.linear * self.width
        with np.errstate(divide="ignore"):
            far = self.linear + np.floor(self.per_e * np.log(np.maximum(d, edge) / edge))
        return np.where(d < edge, np.floor(d / self.width), far).astype(np.int64)

    def sql(self, score: str) -> str:
        """The bin of `score` (an SQL expression of the score as a double precision number), in
        the SQL that DuckDB, PostgreSQL, MariaDB / MySQL and SQLite read alike."""
        top, width = repr(float(self.top)), repr(float(self.width))
        edge = repr(float(self.linear * self.width))
        d = f"({top} - {score})"
        return (
            f"CASE WHEN {d} < {edge} THEN FLOOR({d} / {width}) "
            f"ELSE {int(self.linear)} + FLOOR({int(self.per_e)} * LN({d} / {edge})) END"
        )


@runtime_checkable
class ScoreHistogramRead(Protocol):
    """Optional: the histogram of the scores at or below a level, binned (ScoreBins), by one
    aggregate query: where a store keeps no runs of tied scores, what `preview` reads of the
    tail beyond the top rows (topk_middleware/preview.py), without a row per item."""

    def read_score_histogram(self, bins: ScoreBins) -> tuple[np.ndarray, np.ndarray] | None:
        """(the largest score of each non-empty bin, how many items it holds), in any order,
        over the items scoring at most `bins.top`, in one round trip inside the snapshot; None
        where the store would read every row for it."""
        ...


@runtime_checkable
class PositionScores(Protocol):
    """Optional, for a store whose positions are not ranks: scores at positions without their
    rows, where the store can tell them cheaper than it reads the rows (a rank-ordered base with a
    small delta knows the score of a base position from its runs of tied scores). The ids of
    items whose rows were not read are read in one batch when they are released (`ids_of`)."""

    def read_position_scores(self, positions: np.ndarray) -> tuple[np.ndarray, int, int] | None:
        """(the scores at `positions`, how many rows the store read, how many of the positions
        it answered without reading their row) in one round trip, or None when the store would
        have to read the rows anyway."""
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
    (`rows_inferred`; see `CountedAccess.fetch_positions`). And a random access whose item
    provably cannot change the answer, whatever its score within the bounds the sorted order
    gives it (known ranks around it; at least, the fetched prefix's last score above any item
    beyond it), is settled without a read (`rows_bounded`; see
    `CountedAccess.score_bounds` and mechanisms/threshold.py). rows_fetched also counts the runs
    and the zone map read. Every sorted access is a distinct fetched row, and every random access
    a distinct fetched, inferred or bounded row: rows_fetched >= sorted and
    rows_fetched + rows_inferred + rows_bounded >= random.
    Access counts depend on the data: they are diagnostics for the operator, not private output.
    """

    sorted: int = 0
    random: int = 0
    rows_fetched: int = 0
    round_trips: int = 0
    rows_inferred: int = 0
    rows_bounded: int = 0

    @property
    def total(self) -> int:
        return self.sorted + self.random


class AccessError(ValueError):
    """A store broke the access contract (short read, unknown id, rank out of range)."""


class _Prefix:
    """The fetched canonical prefix: growable numpy buffers of positions, ids and scores
    (amortised O(1) appends). Positions are kept only where they are not the depths."""

    def __init__(self, keep_positions: bool) -> None:
        self.size = 0
        self._scores = np.empty(0, dtype=np.float64)
        self._ids: np.ndarray | None = None
        self._positions = np.empty(0, dtype=np.int64) if keep_positions else None

    @property
    def scores(self) -> np.ndarray:
        return self._scores[: self.size]

    @property
    def ids(self) -> np.ndarray:
        return self._ids[: self.size] if self._ids is not None else np.empty(0, dtype=object)

    @property
    def positions(self) -> np.ndarray:
        if self._positions is None:
            return np.arange(self.size, dtype=np.int64)
        return self._positions[: self.size]

    def position_at(self, depth: int) -> int:
        """The position at one depth in O(1) (`positions` builds the whole array)."""
        return depth if self._positions is None else int(self._positions[depth])

    def append(self, rows: Rows) -> None:
        # Integer ids stay int64; anything else is kept as Python objects (numpy's fixed-width
        # strings would truncate a longer id fetched later).
        ids = np.asarray(rows.ids)
        kind = np.int64 if ids.dtype.kind in "iu" else object
        need = self.size + len(rows)
        if self._ids is None:
            self._ids = np.empty(0, dtype=kind)
        elif kind is object and self._ids.dtype != object:
            self._ids = self._ids.astype(object)
        if need > len(self._scores):
            capacity = max(need, 2 * len(self._scores))
            self._scores = _grown(self._scores, self.size, capacity)
            self._ids = _grown(self._ids, self.size, capacity)
            if self._positions is not None:
                self._positions = _grown(self._positions, self.size, capacity)
        self._scores[self.size : need] = rows.scores
        self._ids[self.size : need] = ids
        if self._positions is not None:
            self._positions[self.size : need] = rows.positions
        self.size = need


def _grown(buffer: np.ndarray, used: int, capacity: int) -> np.ndarray:
    """A buffer of `capacity` holding the first `used` entries of `buffer`."""
    grown = np.empty(capacity, dtype=buffer.dtype)
    grown[:used] = buffer[:used]
    return grown


def _unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(values, return_inverse=True), by one argsort where the values are distinct
    (the L2 items of a block are)."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    if len(ordered) > 1 and not bool(np.all(ordered[1:] > ordered[:-1])):
        return np.unique(values, return_inverse=True)
    inverse = np.empty(len(values), dtype=np.intp)
    inverse[order] = np.arange(len(values))
    return ordered, inverse


@runtime_checkable
class ExchangeableTies(Protocol):
    """Optional, for a store serving positions = ranks (ScoreRuns in hand) whose row at a rank deep
    inside a long run of tied scores is dear to read (PostgreSQL's B-tree keeps no subtree
    counts: the row at an offset is a walk along the run).

    Items of one run have one score, and the mechanism decided everything beyond the fetched
    prefix from scores alone (the runs), never from which item holds which rank there. So any
    bijection between a run's unread ranks and its unread items that is drawn independently of
    the noise leaves the output law unchanged (the one-shot law is invariant under permutations
    of tied items). Such a store may name the item at an unread rank by a uniformly random unread
    item of its run, drawn from `rng`, where that is cheaper than reading the canonical row."""

    def read_ranks_exchangeable(self, ranks: np.ndarray, rng: np.random.Generator) -> Rows:
        """Rows (rank, id, score) for ranks beyond the fetched prefix: each its canonical row or
        an unread item of its run drawn uniformly from `rng`, one item per rank, consistently
        within the snapshot."""
        ...


@dataclass
class CountedAccess:
    """The only door from a mechanism to a store; it counts every access.

    Two layers meet here. *Fetches* (`fetch_sorted_until`, `fetch_positions`, `read_all`) go to
    the store, in batches, and are counted as rows_fetched and round_trips. *Accesses*
    (`sorted_access`, `random_access` and their batched forms) are the steps of the sequential
    algorithm; they are served from what was fetched (fetching on demand if needed) and counted as
    the paper counts them. Items are named by position (module docstring); `depths_of` tells
    where a position stands in the fetched prefix. Where positions are ranks, a random access
    beyond the fetched prefix may be served without a fetch when its score is fixed: by two known
    neighbours of one score, or by the store's runs of tied scores (`fetch_positions`); and its
    score is bounded by its known neighbours (`score_bounds`), which a sparse read of ranks, the
    zone map, tightens (`tighten_bounds`).

    Scores are clamped at `score_cap` (privacy.score_bound; `cap_scores`, before the first
    read) where they enter: every row, run and score read is served as min(score, cap). The
    mechanism then runs on the clamped counts, which keep the canonical order (clamping is
    monotone), the sensitivity and the neighbour relation.
    """

    source: Source
    stats: AccessStats = field(default_factory=AccessStats)
    # The run's generator, for stores that may name unread tied items by a draw
    # (ExchangeableTies); None: canonical rows only.
    rng: np.random.Generator | None = None
    score_cap: float = np.inf  # scores above it are read as it (cap_scores)

    def __post_init__(self) -> None:
        self.m = int(self.source.domain_size())
        # positions 0 .. slots - 1 name the items (m of them; PositionSlots: a store may name
        # them by slots, some without an item)
        # what the run is like, asked after m: a store may read its first rows with m
        self.traits = run_traits(self.source)
        slots = implements(self.source, PositionSlots)
        self.slots = int(self.source.position_slots()) if slots else self.m  # type: ignore[attr-defined]
        self.stats.round_trips += 1
        self.ranked = self.traits.positions_are_ranks
        self._prefix = _Prefix(keep_positions=not self.ranked)
        # Scores known by position: beyond the prefix where positions are ranks (fetched or
        # inferred), every fetched row otherwise.
        self._known = SortedChunks()
        self._ids_by_position: dict[int, Any] = {}  # ids of the rows in _known that were read
        self._depth_of = SortedChunks()  # position -> depth in the prefix (unranked stores)
        self._depth = 0  # next depth served by sorted access
        self._rank_rows = 0  # rows read by rank so far (for scores)
        self._runs: tuple[np.ndarray, np.ndarray] | None = None  # the store's runs, once read
        self._runs_open = False  # whether _runs is a head only (ScoreRuns.read_score_runs)
        self._zone_map_read = False  # whether tighten_bounds read the zone map
        self._run_count = (
            self.source.score_run_count()
            if self.ranked and implements(self.source, ScoreRuns)
            else None
        )
        self._runs_in_hand = self._run_count is not None and self.traits.score_runs_in_hand
        self._position_scores = not self.ranked and implements(self.source, PositionScores)
        # A store whose round trip costs about as much as reading this many rows asks for at
        # least this many per sorted read (0: read what is asked).
        self._sorted_read_rows = self.traits.sorted_read_rows
        # A store that read the first rows of the canonical order with m, in the run's first
        # query, says how many: a first sorted read within them makes no round trip of its own.
        self._rows_in_hand = self.traits.sorted_rows_in_hand

    @property
    def run_count(self) -> int | None:
        """How many runs of tied scores the store keeps (ScoreRuns), if it keeps them."""
        return self._run_count

    def cap_scores(self, cap: float) -> None:
        """Serve every score as min(score, cap) from here on (class docstring); before any row
        is read, so that no unclamped score is kept."""
        if self.prefix_fetched or self._known.count or self._runs is not None:
            raise AccessError("scores can be capped only before the first read")
        self.score_cap = float(cap)

    def _capped(self, scores: Any) -> np.ndarray:
        """Scores as float64, clamped at score_cap."""
        values = np.asarray(scores, dtype=np.float64)
        return np.minimum(values, self.score_cap) if self.score_cap < np.inf else values

    def _capped_rows(self, rows: Rows) -> Rows:
        if self.score_cap == np.inf:
            return rows
        return Rows(rows.positions, rows.ids, self._capped(rows.scores), rows.round_trips)

    # ----- fetches: what the store serves -----------------------------------------------------
    @property
    def prefix_fetched(self) -> int:
        """How many rows of the canonical order have been pulled from the store."""
        return self._prefix.size

    @property
    def depth(self) -> int:
        """How many sorted accesses have been made: the next depth sorted access serves."""
        return self._depth

    def fetch_sorted_until(self, end: int) -> None:
        """Pull the canonical prefix up to depth `end` (exclusive) in one batch. After the first
        read (a run that needs a second one is a long one), at least the store's
        `sorted_read_rows` rows, if it names them: reading ahead costs that store nothing."""
        start = self.prefix_fetched
        if min(end, self.m) <= start:
            return
        if start > 0:
            end = max(end, start + self._sorted_read_rows)
        end = min(end, self.m)
        rows = self._capped_rows(self.source.read_sorted(start, end - start))
        if len(rows) != end - start:
            raise AccessError(
                f"store returned {len(rows)} rows for sorted depths [{start}, {end}); the domain "
                "changed during the run or the store does not serve its canonical order"
            )
        in_hand = start == 0 and end <= self._rows_in_hand
        self._count_fetch(rows, 0 if in_hand else None)
        self._prefix.append(rows)
        if not self.ranked:
            positions = self._checked_positions(rows)
            scores = np.asarray(rows.scores, dtype=np.float64)
            if self._known.count:
                new = ~self._known.lookup(positions)[0]
                self._known.add(positions[new], scores[new])
            else:
                self._known.add(positions, scores)
            depths = np.arange(start, end, dtype=np.float64)
            self._depth_of.add(positions, depths)

    def _checked_positions(self, rows: Rows) -> np.ndarray:
        positions = np.asarray(rows.positions, dtype=np.int64)
        if len(positions) and (positions.min() < 0 or positions.max() >= self.slots):
            raise AccessError(f"store returned a position outside [0, {self.slots})")
        return positions

    def _remember(self, positions: np.ndarray, ids: Any, scores: Any) -> None:
        """Keep the scores and ids of rows read at positions not yet known."""
        self._ids_by_position.update(zip(positions.tolist(), np.asarray(ids).tolist(), strict=True))
        self._known.add(positions, np.asarray(scores, dtype=np.float64))

    def prefix_positions(self) -> np.ndarray:
        """The positions of the fetched prefix, by depth (read-only; no access counted)."""
        return self._prefix.positions

    def depths_of(self, positions: np.ndarray) -> np.ndarray:
        """The depth of each position in the canonical order where it is known: its rank where
        positions are ranks, its depth in the fetched prefix otherwise, and m (deeper than any
        fetched row) for a position not in the prefix."""
        positions = np.asarray(positions, dtype=np.int64)
        if self.ranked:
            return positions
        found, depths = self._depth_of.lookup(positions)
        return np.where(found, depths, self.m).astype(np.int64)

    def is_fetched(self, position: int) -> bool:
        """Whether the score at `position` is already known (no fetch needed)."""
        if self.ranked and position < self.prefix_fetched:
            return True
        return bool(self._known.lookup(np.array([position], dtype=np.int64))[0][0])

    def fetch_positions(self, positions: Sequence[int] | np.ndarray) -> None:
        """Make the scores at the given positions known, reading from the store in one batch.

        Where positions are ranks the canonical order sorts scores descending along them, so
        when the nearest known rows below and above a rank have one score, the rank has that
        score too: it is *inferred*, not read (a zone map on the sorted column; on count data
        most of the long tail is tied). The rows still to read go in one batch. If the store
        keeps its runs of tied scores (`ScoreRuns`), they are read instead once the rows read by
        rank would reach their number (ski rental: at most about twice the rows of the cheaper
        choice), and every later random access is answered from them.
        """
        wanted = np.unique(np.asarray(positions, dtype=np.int64))
        if not len(wanted):
            return
        if wanted[0] < 0 or wanted[-1] >= self.m:
            raise AccessError(f"position out of range [0, {self.m})")
        if self.ranked:
            wanted = wanted[wanted >= self.prefix_fetched]
        if self._known.count:
            wanted = wanted[~self._known.lookup(wanted)[0]]
        if not len(wanted):
            return
        if not self.ranked:
            if not (self._position_scores and self._read_position_scores(wanted)):
                self._read_positions(wanted)
            return
        inferred, scores = self._infer(wanted)
        read = wanted[~inferred]
        if len(read) and self._read_runs_if_due(len(read)):
            inferred, scores = self._infer(wanted)
            read = wanted[~inferred]
        if len(read) and self._runs_open:  # ranks past a head of runs: read the full runs
            self._read_full_runs()
            inferred, scores = self._infer(wanted)
            read = wanted[~inferred]
        if len(read):
            self._rank_rows += len(read)
            self._read_positions(read)
        self._known.add(wanted[inferred], scores[inferred])
        self.stats.rows_inferred += int(inferred.sum())

    def _read_positions(self, positions: np.ndarray) -> None:
        rows = self._capped_rows(self.source.read_positions(positions))
        if len(rows) != len(positions):
            raise AccessError(f"store returned {len(rows)} rows for {len(positions)} positions")
        self._count_fetch(rows)
        self._remember(self._checked_positions(rows), rows.ids, rows.scores)

    def _read_position_scores(self, positions: np.ndarray) -> bool:
        """Scores without rows from a `PositionScores` store; False if it declines. Scores it
        found without reading a row are counted as inferred."""
        got = self.source.read_position_scores(positions)  # type: ignore[attr-defined]
        if got is None:
            return False
        scores, read, inferred = self._capped(got[0]), int(got[1]), int(got[2])
        if len(scores) != len(positions) or read < 0 or not 0 <= inferred <= len(positions):
            raise AccessError(f"store returned {len(scores)} scores for {len(positions)} positions")
        self.stats.rows_fetched += read
        self.stats.rows_inferred += inferred
        self.stats.round_trips += 1
        self._known.add(positions, scores)
        return True

    def _infer(self, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mask, scores) of the ranks (beyond the prefix, not known) whose score is fixed: by the
        store's runs once read, else by two neighbours of one score."""
        lower, upper = self._bounds(ranks)
        return lower == upper, upper

    def _bounds(self, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper) bounds on the scores at ranks beyond the prefix that are not known:
        from the store's runs once read (exact, except past a head of runs), else the scores
        of the nearest known ranks above (deeper; -inf if none) and below (shallower, the
        prefix's last row included; +inf if none). Scores are non-increasing along ranks."""
        if self._runs is not None:
            first, run_scores = self._runs
            run = np.searchsorted(first, ranks, side="right") - 1
            scores = run_scores[run]
            if not self._runs_open:
                return scores, scores
            # past a head of runs (its last first rank): between the least score and the first
            # unsized run's, or the prefix's last score if that is lower
            tail = run == len(first) - 1
            fetched = self.prefix_fetched
            if fetched:
                scores = np.where(
                    tail, np.minimum(scores, self._prefix.scores[fetched - 1]), scores
                )
            return np.where(tail, run_scores[-1], scores), scores
        below, below_score, _, above_score = self._known.neighbours(ranks)
        fetched = self.prefix_fetched
        if fetched:  # the prefix's last row is a neighbour below every rank beyond it
            use_prefix = below < fetched - 1
            below_score[use_prefix] = self._prefix.scores[fetched - 1]
        upper = np.where(np.isnan(below_score), np.inf, below_score)
        return np.where(np.isnan(above_score), -np.inf, above_score), upper

    def score_bounds(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper) bounds on the scores at `positions`, equal where the score is known.
        No access is counted and nothing is read: this is what the sorted order already says.

        Where positions are ranks, scores are non-increasing along them, so every known score
        bounds the deeper ranks from above and the shallower ones from below (a zone map on the
        sorted column, as block-max indexes bound the scores of a posting list's blocks). Where
        the bounds meet, the score is inferred (remembered, counted in rows_inferred as
        `fetch_positions` does). Where positions are not ranks, a position not read is deeper
        than the fetched prefix in the canonical order, so its score is at most the prefix's
        last (TA's own bound on unseen items), and unbounded below."""
        positions = np.asarray(positions, dtype=np.int64)
        if not self.ranked:
            found, known = self._known.lookup(positions)
            fetched = self.prefix_fetched
            ceiling = float(self._prefix.scores[fetched - 1]) if fetched else np.inf
            lower = np.where(found, known, -np.inf)
            return lower, np.where(found, known, ceiling)
        lower = np.empty(len(positions), dtype=np.float64)
        upper = np.empty(len(positions), dtype=np.float64)
        in_prefix = positions < self.prefix_fetched
        lower[in_prefix] = upper[in_prefix] = self._prefix.scores[positions[in_prefix]]
        beyond = np.flatnonzero(~in_prefix)
        found, known = self._known.lookup(positions[beyond])
        lower[beyond[found]] = upper[beyond[found]] = known[found]
        unknown = beyond[~found]
        if len(unknown):
            ranks, inverse = _unique_inverse(positions[unknown])
            low, high = self._bounds(ranks)
            inferred = low == high
            self._known.add(ranks[inferred], high[inferred])
            self.stats.rows_inferred += int(inferred.sum())
            lower[unknown], upper[unknown] = low[inverse], high[inverse]
        return lower, upper

    def tighten_bounds(self, pending: int) -> bool:
        """Before `pending` rows are read by rank for their scores: read what bounds every rank
        at once, if due (ski rental, as for the runs: once rows read by rank would reach its
        size). The store's runs of tied scores first (`ScoreRuns`: exact bounds); else, where
        they are not at least as small, the zone map: about ZONE_MAP_ROWS ranks log-spaced from
        the end of the prefix to the last rank, in one batch through the normal read path
        (counted as rows_fetched, not as accesses). True if it read either: the caller evaluates
        its bounds again. Ranked access only; each is read at most once a run."""
        if not self.ranked:
            return False
        if self._runs is not None:
            if not self._runs_open:
                return False
            self._read_full_runs()
            return True
        if self._read_runs_if_due(pending):
            return True
        count = self._run_count
        if self._zone_map_read or (count is not None and count <= ZONE_MAP_ROWS):
            return False
        if self._rank_rows + pending < ZONE_MAP_ROWS:
            return False
        self._zone_map_read = True
        low = max(self.prefix_fetched, 1)
        ranks = np.unique(np.rint(np.geomspace(low, max(low, self.m - 1), ZONE_MAP_ROWS)))
        ranks = ranks.astype(np.int64)[ranks < self.m]
        if self._known.count:
            ranks = ranks[~self._known.lookup(ranks)[0]]
        if not len(ranks):
            return False
        self._rank_rows += len(ranks)
        self._read_positions(ranks)
        return True

    def settle_by_bounds(self, positions: np.ndarray) -> None:
        """Count random accesses a mechanism settled from `score_bounds` alone, without their
        rows (rows_bounded): the distinct positions whose score is still not known."""
        positions = _unique_inverse(np.asarray(positions, dtype=np.int64))[0]
        if self.ranked:
            positions = positions[positions >= self.prefix_fetched]
        if self._known.count:
            positions = positions[~self._known.lookup(positions)[0]]
        self.stats.rows_bounded += len(positions)

    def _read_runs_if_due(self, pending: int) -> bool:
        """Read the store's runs once rows read by rank (with `pending` more) reach their count,
        or at once if the store has them in hand (`ScoreRuns`)."""
        count = self._run_count
        if self._runs is not None or count is None:
            return False
        if self._rank_rows + pending < count and not self._runs_in_hand:
            return False
        if implements(self.source, ScoreRunsHead):
            self._take_runs(*self.source.read_score_runs_head())  # type: ignore[attr-defined]
        else:
            self._take_runs(*self.source.read_score_runs())  # type: ignore[attr-defined]
        return True

    def _read_full_runs(self) -> None:
        """After a head of runs: every run's first rank (ScoreRuns.read_score_runs)."""
        self._take_runs(*self.source.read_score_runs(), full=True)  # type: ignore[attr-defined]

    def _take_runs(self, first: Any, scores: Any, full: bool = False) -> None:
        """Check and keep runs read from the store (a head of them unless `full`), counted as
        one round trip and a row per run."""
        count = self._run_count
        first = np.asarray(first, dtype=np.int64)
        scores = np.asarray(scores, dtype=np.float64)
        given = len(first)
        valid = (
            count is not None
            and len(scores) == count > 0
            and (given == count or (not full and 0 < given < count))
            and first[0] == 0
            and first[-1] <= self.m - (count - given + 1)  # every run not given has a row
            and bool(np.all(np.diff(first) > 0))
            and bool(np.all(np.diff(scores) < 0))
        )
        if not valid:
            raise AccessError(
                f"the store's runs of tied scores are inconsistent ({given} first ranks, "
                f"{len(scores)} scores, {count} announced, m = {self.m}): rebuild them with "
                "prepare(refresh=True)"
            )
        self.stats.rows_fetched += count
        self.stats.round_trips += 1
        if self.score_cap < np.inf and scores[0] >= self.score_cap:
            # the runs at or above the cap are one run of the clamped counts
            above = int(np.count_nonzero(scores >= self.score_cap))
            scores = np.concatenate([[self.score_cap], scores[above:]])
            first = np.concatenate([[0], first[above:]]) if above <= given else first[:1]
            given, count = len(first), count - above + 1  # (the store's count stays as read)
        self._runs = (first, scores)
        self._runs_open = given < count

    def score_histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """(each distinct score, descending; how many items hold it), clamped at `score_cap`:
        from the store's runs of tied scores where it keeps them (ScoreRuns: one round trip, a
        row per run), else from a full read (m sorted accesses). No id is read."""
        source = self.source
        count = source.score_run_count() if implements(source, ScoreRuns) else None
        if count:
            first, scores = source.read_score_runs()  # type: ignore[attr-defined]
            first = np.asarray(first, dtype=np.int64)
            scores = np.asarray(scores, dtype=np.float64)
            if not (
                len(first) == len(scores) == count
                and first[0] == 0
                and bool(np.all(np.diff(first) > 0))
                and bool(np.all(np.diff(scores) < 0))
                and first[-1] < self.m
            ):
                raise AccessError(
                    f"the store's runs of tied scores are inconsistent ({len(first)} first "
                    f"ranks, {len(scores)} scores, {count} announced, m = {self.m}): rebuild "
                    "them with prepare(refresh=True)"
                )
            self.stats.rows_fetched += count
            self.stats.round_trips += 1
            sizes = np.diff(np.append(first, self.m))
        else:
            rows = self.read_all()
            scores, sizes = np.unique(np.asarray(rows.scores, dtype=np.float64), return_counts=True)
            scores, sizes = scores[::-1], sizes[::-1]
        capped = np.minimum(scores, self.score_cap)
        if len(capped) and capped[0] < scores[0]:  # the runs at or above the cap are one
            above = int(np.count_nonzero(scores >= self.score_cap))
            capped = np.concatenate([[self.score_cap], scores[above:]])
            sizes = np.concatenate([[sizes[:above].sum()], sizes[above:]])
        return capped, np.asarray(sizes, dtype=np.int64)

    def binned_scores(self, bins: ScoreBins) -> tuple[np.ndarray, np.ndarray] | None:
        """The store's binned histogram of the scores at or below `bins.top`
        (ScoreHistogramRead): each bin's largest score, descending and clamped at score_cap, and
        how many items it holds; one round trip, a row per bin. None where the store has none."""
        source = self.source
        got = source.read_score_histogram(bins) if implements(source, ScoreHistogramRead) else None
        if got is None:
            return None
        tops = np.asarray(got[0], dtype=np.float64)
        sizes = np.asarray(got[1], dtype=np.int64)
        if not (
            len(tops) == len(sizes)
            and bool(np.all(sizes > 0))
            and bool(np.all(np.isfinite(tops)))
            and bool(np.all(tops <= bins.top))
        ):
            raise AccessError(
                f"the store's histogram of the scores at or below {bins.top:g} is inconsistent "
                f"({len(tops)} bins, {len(sizes)} sizes)"
            )
        self.stats.rows_fetched += len(tops)
        self.stats.round_trips += 1
        values, inverse = np.unique(np.minimum(tops, self.score_cap), return_inverse=True)
        totals = np.bincount(inverse, weights=sizes, minlength=len(values)).astype(np.int64)
        return values[::-1], totals[::-1]

    def read_all(self) -> Rows:
        """A full read in canonical order: m sorted accesses (the one-shot mechanism's cost).
        Rows already fetched are not read again; rows the store has in hand (all m of them:
        sorted_rows_in_hand) cost no round trip, as in fetch_sorted_until."""
        start = self.prefix_fetched
        rows = self._capped_rows(self.source.read_sorted(start, self.m - start))
        if len(rows) != self.m - start:
            raise AccessError(f"store returned {len(rows)} rows for a full read of m = {self.m}")
        self._count_fetch(rows, 0 if start == 0 and self.m <= self._rows_in_hand else None)
        self.stats.sorted += self.m
        self._depth = self.m
        self._prefix.append(rows)
        if not self.ranked:
            self._checked_positions(rows)
        if start == 0:
            return rows
        prefix = self._prefix
        return Rows(prefix.positions.copy(), prefix.ids.copy(), prefix.scores.copy())

    def read_sorted_batch(self, count: int, positions: bool = True) -> Rows:
        """Oblivious reads (mechanisms/oblivious.py): the top `count` rows of the canonical order
        in one batch, as the store serves them: no read-ahead, inference or runs, so the rows
        fetched are exactly `count` whatever the data. Counted as `count` sorted accesses.
        `positions=False`: a SortedIds store may leave the positions out (all -1)."""
        count = min(int(count), self.m)
        if not positions and implements(self.source, SortedIds):
            rows = self.source.read_sorted_ids(count)
            if len(rows) == count and not bool(np.all(np.asarray(rows.positions) == -1)):
                raise AccessError("read_sorted_ids returned positions")
        else:
            rows = self.source.read_sorted(0, count)
            self._checked_positions(rows)
        rows = self._capped_rows(rows)
        if len(rows) != count:
            raise AccessError(f"store returned {len(rows)} rows for sorted depths [0, {count})")
        self._count_fetch(rows)
        self.stats.sorted += count
        return rows

    def read_positions_batch(self, positions: np.ndarray) -> Rows:
        """Oblivious reads: the rows at `positions` (distinct) in one batch, every one read even
        where its score is known or could be inferred. Counted as len(positions) random
        accesses."""
        positions = np.asarray(positions, dtype=np.int64)
        if len(positions) and (positions.min() < 0 or positions.max() >= self.slots):
            raise AccessError(f"position out of range [0, {self.slots})")
        rows = self._capped_rows(self.source.read_positions(positions))
        if len(rows) != len(positions):
            raise AccessError(f"store returned {len(rows)} rows for {len(positions)} positions")
        self._checked_positions(rows)
        self._count_fetch(rows)
        self.stats.random += len(positions)
        return rows

    def _count_fetch(self, rows: Rows, round_trips: int | None = None) -> None:
        self.stats.rows_fetched += len(rows)
        self.stats.round_trips += rows.round_trips if round_trips is None else round_trips

    # ----- accesses: the steps of the sequential algorithm -----------------------------------
    def sorted_access(self) -> tuple[int, float]:
        """The next (position, score) in canonical order: one sorted access."""
        depth = self._depth
        if depth >= self.m:
            raise AccessError("sorted access past the end of the domain")
        if depth >= self.prefix_fetched:
            self.fetch_sorted_until(depth + 1)
        self._depth += 1
        self.stats.sorted += 1
        return self._prefix.position_at(depth), float(self._prefix.scores[depth])

    def sorted_accesses(self, count: int) -> np.ndarray:
        """The scores of the next `count` depths in canonical order: `count` sorted accesses."""
        start, end = self._depth, self._depth + count
        if count < 0 or end > self.m:
            raise AccessError(f"sorted access past the end of the domain (m = {self.m})")
        self.fetch_sorted_until(end)
        self._depth = end
        self.stats.sorted += count
        return self._prefix.scores[start:end].copy()

    def random_access(self, position: int) -> float:
        """The score of the item at `position`: one random access."""
        self.stats.random += 1
        if self.ranked and position < self.prefix_fetched:
            return float(self._prefix.scores[position])
        self.fetch_positions([position])
        return float(self.scores_at(np.array([position], dtype=np.int64))[0])

    def random_accesses(self, positions: np.ndarray) -> np.ndarray:
        """The scores of the items at `positions`: one random access each (one fetch if needed)."""
        positions = np.asarray(positions, dtype=np.int64)
        self.fetch_positions(positions)
        self.stats.random += len(positions)
        return self.scores_at(positions)

    def scores_at(self, positions: np.ndarray) -> np.ndarray:
        """Scores of fetched rows, without counting an access: for an algorithm that evaluates
        ahead and then charges exactly the accesses its sequential form makes (`charge`)."""
        positions = np.asarray(positions, dtype=np.int64)
        in_prefix = (
            positions < self.prefix_fetched if self.ranked else np.zeros(len(positions), bool)
        )
        scores = np.empty(len(positions), dtype=np.float64)
        scores[in_prefix] = self._prefix.scores[positions[in_prefix]]
        if not in_prefix.all():
            beyond = positions[~in_prefix]
            found, known = self._known.lookup(beyond)
            if not found.all():
                raise AccessError(f"position {int(beyond[~found][0])} has not been fetched")
            scores[~in_prefix] = known
        return scores

    def prefix_scores(self) -> np.ndarray:
        """The scores of the fetched prefix, by depth (read-only view, no access counted)."""
        view = self._prefix.scores
        view.flags.writeable = False
        return view

    def charge(self, sorted_count: int, random_count: int) -> None:
        """Count accesses that a vectorised evaluation made from fetched rows: the sorted ones
        are the next `sorted_count` depths, which must have been fetched."""
        if self._depth + sorted_count > self.prefix_fetched:
            raise AccessError("charged sorted accesses beyond the fetched prefix")
        self._depth += sorted_count
        self.stats.sorted += sorted_count
        self.stats.random += random_count

    def exact_scores_of(self, ids: Sequence[Any]) -> tuple[list[Any], bool]:
        """The counts of named items as the store holds them, never clamped (noisy counts:
        noisy_counts.py), and whether they were read exactly: through the store's
        `read_exact_scores` (ExactScores) where it has one, else as doubles (read_ids).
        len(ids) random accesses in one batch."""
        if implements(self.source, ExactScores):
            values, exact = list(self.source.read_exact_scores(ids)), True  # type: ignore[attr-defined]
        else:
            values, exact = np.asarray(self.source.read_ids(ids), np.float64).tolist(), False
        if len(values) != len(ids):
            raise AccessError(f"store returned {len(values)} counts for {len(ids)} ids")
        self.stats.random += len(ids)
        self.stats.rows_fetched += len(ids)
        self.stats.round_trips += 1
        return values, exact

    def ids_at_depths(self, depths: Iterator[int] | Sequence[int]) -> list[Any]:
        """The item ids at depths of the fetched prefix, as plain Python values (no access is
        counted: it was when the rows were)."""
        depths = [int(d) for d in depths]
        if depths and max(depths) >= self.prefix_fetched:
            raise AccessError("an id was asked for at a depth beyond the fetched prefix")
        return self.ids_of(self._prefix.positions[depths]) if depths else []

    def ids_of(self, positions: Iterator[int] | Sequence[int] | np.ndarray) -> list[Any]:
        """The item ids at positions whose scores are known, as plain Python values. No access is
        counted: the accesses were counted when the scores were. An id at an inferred rank was
        never read; those are read in one batch (rows_fetched, one round trip)."""
        positions = [int(p) for p in positions]
        if not self.ranked:
            missing = np.array([p for p in positions if p not in self._ids_by_position], np.int64)
            if len(missing):  # rows of the prefix, by the map of their depths
                found, at = self._depth_of.lookup(missing)
                depths = at[found].astype(np.int64)
                if not found.all():  # a full read keeps no map by position
                    prefix = self._prefix.positions
                    depths = np.flatnonzero(np.isin(prefix, missing))
                self._ids_by_position.update(
                    zip(
                        self._prefix.positions[depths].tolist(),
                        self._prefix.ids[depths].tolist(),
                        strict=True,
                    )
                )
            unread = sorted({p for p in positions if p not in self._ids_by_position})
            if unread:  # scores known without rows (PositionScores): read the rows now
                if not all(self.is_fetched(p) for p in unread):
                    raise AccessError("an id was asked for at a position that was never read")
                self._read_ids_of(np.asarray(unread, dtype=np.int64))
            return [_plain(self._ids_by_position[p]) for p in positions]
        fetched = self.prefix_fetched
        missing = sorted({r for r in positions if r >= fetched and r not in self._ids_by_position})
        if missing:
            if not all(self.is_fetched(r) for r in missing):
                raise AccessError("an id was asked for at a rank whose score is not known")
            self._read_ids_of(np.asarray(missing, dtype=np.int64))
        prefix_ids = self._prefix.ids
        return [
            _plain(prefix_ids[r] if r < fetched else self._ids_by_position[r]) for r in positions
        ]

    def oneshot_in_store(self, noise: Any, k: int) -> list[Any] | None:
        """The one-shot mechanism run by the store (InStoreOneShot): the ids of the k best items
        under `noise`, best first, or None if the store cannot run it. Counted as the store
        read: m sorted accesses and m rows, in one round trip."""
        if not offers_in_store(self.source):
            return None
        rows = self.source.read_oneshot(noise, k)
        if rows is None:
            return None
        if len(rows) != min(k, self.m):
            raise AccessError(f"store returned {len(rows)} rows for an in-store top-{k}")
        self._checked_positions(rows)
        self.stats.sorted += self.m
        self.stats.rows_fetched += self.m
        self.stats.round_trips += rows.round_trips
        return [_plain(v) for v in np.asarray(rows.ids).tolist()]

    def _read_ids_of(self, positions: np.ndarray) -> None:
        """Read the rows at positions whose scores are known but whose ids were never read, in
        one batch, checking that the scores agree (ExchangeableTies: possibly drawn)."""
        if self.ranked and self.rng is not None and implements(self.source, ExchangeableTies):
            rows = self.source.read_ranks_exchangeable(positions, self.rng)
        else:
            rows = self.source.read_positions(positions)
        if len(rows) != len(positions):
            raise AccessError(f"store returned {len(rows)} rows for {len(positions)} positions")
        expected = self.scores_at(np.asarray(rows.positions, dtype=np.int64))
        if not np.array_equal(expected, self._capped(rows.scores)):
            raise AccessError("a row changed score during the run: the snapshot is broken")
        self._count_fetch(rows)
        got = np.asarray(rows.positions).tolist()
        self._ids_by_position.update(zip(got, np.asarray(rows.ids).tolist(), strict=True))


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


@runtime_checkable
class ExactScores(Protocol):
    """Optional: counts read as the store holds them (integer columns as Python ints of any
    size, decimals as Decimals), for the noisy counts; stores say whether their counts are
    integers in their traits (StoreTraits.integer_scores: a fact of the schema)."""

    def read_exact_scores(self, ids: Sequence[Any]) -> list[Any]:
        """The scores of the named items, in the order given, with no conversion to a double."""
        ...


@runtime_checkable
class InStoreOneShot(Protocol):
    """Optional: the one-shot mechanism run inside the store (Algorithm 2 in one query).

    The store adds to every score the noise its item's position gets (keyed_noise.KeyedNoise:
    the exceedances drawn by the client, else a keyed hash conditioned below their level; the
    key and the exceedances come from the run's generator, never from the store's random())
    and returns the k rows of largest score + noise, best first (ties: smaller position), in
    one round trip. Counted as a read of all m rows: m sorted accesses."""

    def read_oneshot(self, noise: Any, k: int) -> Rows | None:
        """The k best rows under `noise` (a KeyedNoise), or None where this store cannot."""
        ...


def offers_in_store(source: Any) -> bool:
    """Whether `source` runs the in-store one-shot: an InStoreOneShot whose read_oneshot is not
    None (an instance can take it away: a dialect that would put the key in the statement text)."""
    return implements(source, InStoreOneShot) and source.read_oneshot is not None


@runtime_checkable
class OneShotPositions(Protocol):
    """Optional, beside InStoreOneShot: a store whose in-store one-shot draws its exceedances
    over other positions than 0..m-1 (a table's slots where it reads the table itself)."""

    def oneshot_positions(self) -> int:
        """How many positions the in-store one-shot draws its exceedances from."""
        ...


@runtime_checkable
class OneShotReads(Protocol):
    """Optional, beside InStoreOneShot: what the last in-store one-shot read (DuckDB: the copy,
    its delta or the table), for the operator's diagnostics."""

    def oneshot_reads(self) -> str | None:
        """What the last in-store one-shot read, in words, or None."""
        ...


@runtime_checkable
class CountAtLeast(Protocol):
    """Optional: how many items score at least a level, where the store counts it cheaply (an
    index), for the planner's price of the in-store one-shot (planner.in_store_seconds)."""

    def count_at_least(self, score: float) -> int | None:
        """The number of items with score >= `score`, or None where it would cost a scan."""
        ...


@runtime_checkable
class RunFreshness(Protocol):
    """Optional: how the run in progress knew its data current, for the operator."""

    def run_freshness(self) -> dict[str, Any] | None:
        """Inside the run's snapshot: a copy proven current, or why not and what the run read
        instead; None outside a run."""
        ...


@dataclass(frozen=True)
class CopyRefresh:
    """A store reading its table itself (its copy is stale) that serves some reads only from the
    copy, refreshed first (Spark: reads by rank and sorted reads past the rows a run has read):
    the refresh's seconds and the copy's costs for the rest of the run. The planner adds the
    refresh to the price of a method that would make such a read."""

    seconds: float
    costs: StoreCosts


@dataclass(frozen=True)
class StoreCosts:
    """What a store's reads cost, in seconds (measured on the store; the planner's input).

    `random_batch` is the fixed cost of one batch of random reads and `random_row` its cost per
    row: where the fixed part dominates (DuckDB's rank table: a semi-join over the whole rank
    column, about one scan whatever the batch's size) fewer, larger batches win. `oneshot_row`
    is the in-store one-shot's cost per hashed row (InStoreOneShot), `oneshot_fixed` its cost
    besides (where it is not a round trip and a batch of random reads: a store reading its table
    as it is now scans it), `oneshot_query` what its statement costs besides a round trip
    (planning and running a statement of several joins: milliseconds, which on a small table
    outweigh a full read), `full_read_row` a full read into the client per item (the fallback
    one-shot). `sorted_scans`: every sorted read is a scan of the table (no index serves the
    order), so the planner reads nothing to price the threshold run. `copy_refresh`: reads
    only a refreshed copy serves (CopyRefresh)."""

    round_trip: float = 1e-4
    sorted_row: float = 1e-7
    random_batch: float = 1e-4
    random_row: float = 1e-6
    random_batch_item: float = 0.0  # per item of the domain: a batch that scans a column
    oneshot_row: float = 5e-7
    full_read_row: float = 5e-7
    oneshot_fixed: float | None = None  # the in-store one-shot's cost besides its hashed rows
    oneshot_query: float = 0.0  # the in-store one-shot statement's own cost past a round trip
    sorted_scans: bool = False  # every sorted read scans the table
    copy_refresh: CopyRefresh | None = None  # reads by rank refresh a stale copy first

    def random_batch_seconds(self, m: int) -> float:
        """The fixed cost of one batch of random reads over a domain of m items."""
        return self.random_batch + m * self.random_batch_item

    def flat_random_batches(self, m: int) -> bool:
        """True when a batch of random reads costs about the same whatever its size (up to the
        10^4-10^5 rows a threshold run asks for)."""
        return self.random_batch_seconds(m) >= 10_000 * self.random_row


def store_costs(source: Any) -> StoreCosts:
    """The store's measured costs for the run (RunTraits.costs), else a generic guess."""
    costs = run_traits(source).costs
    return costs if costs is not None else StoreCosts()


def run_freshness(source: Any) -> dict[str, Any] | None:
    """How the store knew the run's data current (RunFreshness, asked inside the run's
    snapshot), for the operator's diagnostics; None where the store does not say."""
    return source.run_freshness() if implements(source, RunFreshness) else None


@dataclass(frozen=True)
class StoreTraits:
    """What a store declares about itself: the one record the core reads (DESIGN invariant 15),
    returned by the store's `traits()` and asked before a release reads anything.

    `sensitivity` has no default: the most one client adds to or removes from one count,
    declared by whoever built the table (privacy.check_sensitivity). `max_items_per_client`:
    the contribution bound the counts were built under (from_votes), if any. `integer_scores`:
    the counts are of an integer type (the noisy counts' interval, noisy_counts.py).
    `parameters_in_text`: the driver writes query parameters into the statement text a server
    observer reads (pymysql, psycopg2), so no secret is ever sent as one.
    `max_oblivious_rows`: the most rows one oblivious release may read (None: no bound).
    `oblivious_reads_seen`: where another user of the store would see which blocks an
    oblivious run reads (PostgreSQL's statistics views, pg_statio_user_tables, for a role that
    may not set track_counts), what it would learn and what closes the channel, in one line of
    the store's words; an oblivious release is then refused before anything is read, released
    or charged (ObliviousReadsSeen). None: no user of the store the store knows of sees them,
    or its operator accepted the channel (the store then warns at each such run)."""

    sensitivity: float
    max_items_per_client: int | None = None
    integer_scores: bool = False
    parameters_in_text: bool = False
    max_oblivious_rows: int | None = None
    oblivious_reads_seen: str | None = None


@dataclass(frozen=True)
class RunTraits:
    """What the run in progress is like, from the store's `run_traits()`, asked inside its
    snapshot once m is read. A store without `run_traits()` names items by rank and has
    generic costs: the defaults.

    `positions_are_ranks`: every item is named by its rank in the canonical order (module
    docstring). `score_runs_in_hand`: its runs of tied scores came with m (ScoreRuns).
    `sorted_read_rows`: a round trip costs about as much as this many rows, so every sorted
    read asks for at least this many. `sorted_rows_in_hand`: the first rows of the canonical
    order read with m. `costs`: the measured cost shape (StoreCosts), None for a generic guess.
    `oblivious_costs`: the oblivious release's own model (mechanisms/oblivious.ObliviousCosts),
    None for one derived from `costs`."""

    positions_are_ranks: bool = True
    score_runs_in_hand: bool = False
    sorted_read_rows: int = 0
    sorted_rows_in_hand: int = 0
    costs: StoreCosts | None = None
    oblivious_costs: Any = None


@runtime_checkable
class DeclaresTraits(Protocol):
    """Every source: its declared traits (StoreTraits)."""

    def traits(self) -> StoreTraits:
        """What the store declares about itself (cheap: no read of the data)."""
        ...


@runtime_checkable
class DeclaresRunTraits(Protocol):
    """Optional: what the run in progress is like (RunTraits)."""

    def run_traits(self) -> RunTraits:
        """Inside a snapshot: the run's traits; outside one, what a run would have now."""
        ...


class TraitsError(TypeError):
    """A source that declares no traits, or declares them in another form than the records."""


class ObliviousReadsSeen(PermissionError):
    """An oblivious release refused before anything is read, released or charged: the store
    declares that another user of it would see which blocks the run reads
    (StoreTraits.oblivious_reads_seen, whose words the message carries)."""


def store_traits(source: Any) -> StoreTraits:
    """The source's StoreTraits; TraitsError where it declares none (no silent default)."""
    if not implements(source, DeclaresTraits):
        raise TraitsError(
            f"{type(source).__name__} declares no traits: a store defines traits() returning a "
            "StoreTraits, its sensitivity among them (docs/writing-a-store.md)"
        )
    traits = source.traits()
    if not isinstance(traits, StoreTraits):
        raise TraitsError(
            f"{type(source).__name__}.traits() returned {type(traits).__name__}, not a StoreTraits"
        )
    return traits


def run_traits(source: Any) -> RunTraits:
    """The source's RunTraits (DeclaresRunTraits), or the defaults where it declares none."""
    if not implements(source, DeclaresRunTraits):
        return RunTraits()
    traits = source.run_traits()
    if not isinstance(traits, RunTraits):
        raise TraitsError(
            f"{type(source).__name__}.run_traits() returned {type(traits).__name__}, "
            "not a RunTraits"
        )
    return traits


@runtime_checkable
class PositionSlots(Protocol):
    """Optional: a store that names its m items by positions 0 .. slots - 1 with slots >= m,
    some holding no item (DuckDB's rowids in oblivious reads: deleted rows leave their slot).
    Reading a slot without an item gives a row that never wins (score -inf); sampling uniform
    slots samples the items uniformly (mechanisms/oblivious.py)."""

    def position_slots(self) -> int:
        """How many slots positions range over (m where every position holds an item)."""
        ...


@runtime_checkable
class ObliviousReads(Protocol):
    """Optional: a store whose reads take data-dependent shortcuts by default (PostgreSQL's live
    tables probe the runs of tied scores when a run opens) turns them off for an oblivious
    release (mechanisms/oblivious.py), entered before `snapshot()`."""

    def oblivious_reads(self) -> AbstractContextManager[Any]:
        """A context in which every read has a size fixed by public facts."""
        ...


def oblivious_reads(source: Any) -> AbstractContextManager[Any]:
    """The store's ObliviousReads context, or a context that does nothing."""
    if implements(source, ObliviousReads):
        return source.oblivious_reads()
    return nullcontext()
