"""The lazy noise oracle (Wu, Ohrimenko, Wirth 2023, Algorithm 4).

The noise list L2 of Algorithm 3 holds m i.i.d. noises sorted descending, position j holding the
item I_(j) and its noise Z_(j). Generating all m of them costs O(m). The oracle samples a position
only when it is first needed, from its exact conditional law given the positions sampled so far:

* Items (Lemma 4.1): the item order of L2 is a uniform permutation, independent of the values.
  A fresh position reached by sorted access gets an item drawn uniformly from the items not yet
  placed; a fresh item reached by random access gets a position drawn uniformly from the positions
  not yet sampled (Algorithm 4, "Sorted Access" line 3 and "Random Access" line 2).
* Values (Facts 4.6, 4.7, Theorems 4.8, 4.10): Z_(j) = F^-1(U_(j)) with U_(1) >= ... >= U_(m) the
  sorted uniforms. We work with the survival probability V = 1 - U, increasing along positions,
  and `distribution.from_survival(V)`, which keeps the largest noises exact when V ~ j/m ~ 1e-12.
  Given the sampled positions, V_(j) depends only on its nearest sampled neighbours l < j < r:

      V_(j) = v_l + (v_r - v_l) * Y,   Y ~ Beta(j - l, r - j)

  with sentinels v_(-1) = 0 and v_(m) = 1 (0-based positions). This is one formula for the three
  cases of Theorem 4.8 and for the case j < min(J) that its case analysis leaves out. Checked
  against equation (9) of the paper: given U_(l) = u_l and U_(r) = u_r, U_(j) is the (j - l)-th
  largest of r - l - 1 uniforms on [u_r, u_l], i.e. u_r + (u_l - u_r) * Beta(r - j, j - l); the
  shift u_r is missing from the printed Theorem 4.10 (3). With V = 1 - U and 1 - Beta(a, b) =
  Beta(b, a) this is the formula above.

Numerics: Y = G1 / (G1 + G2) with G1 ~ Gamma(j - l), G2 ~ Gamma(r - j) keeps full relative
precision even when Y ~ 1e-12, and v_l + (v_r - v_l) * Y then has relative error of a few ulps
(both terms are non-negative), so V near 0 (the top of the list, where the top-k is decided) is
exact to double precision for every m up to 2**62. Near V = 1 (the smallest noises) the resolution
is that of a double near 1, 1.1e-16 in V; these noises never decide a top-k.

Memory: positions before the sorted-access cursor are all sampled and are needed only as the
cursor's predecessor; positions after it that random access has sampled sit in sorted numpy
arrays (`_SampledAhead`) for predecessor / successor lookup. Items map to their noise in
`SortedChunks` (single placements gather in a small dict first). Time and memory are
O(accesses log accesses) for batched access, never O(m).

Size: one class, LazyNoiseList, and the three small structures that hold its state (items
placed, positions sampled ahead, buffered draws); its batched accesses sample the joint law
its scalar ones do, from the same state, so both stay beside each other.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence

import numpy as np
from sortedcontainers import SortedList

from .noise import NoiseDistribution
from .sorted_chunks import SortedChunks

# Uniform choice from [lo, hi) minus a set of taken values uses rejection (expected <= 2 draws)
# while at most this fraction is taken, and exact selection over a SortedList beyond.
REJECTION_MAX_TAKEN = 0.5
MAX_DOMAIN = 2**62
BATCH_MIN = 16  # noises_of places fewer fresh items one at a time


def _nth_free(taken: SortedList | Iterable[int], t: int, lo: int) -> int:
    """The t-th (0-based) integer >= lo that is not in `taken` (sorted, every element >= lo).

    The number of free integers below taken[i] is taken[i] - lo - i, non-decreasing in i, so the
    answer is lo + t + p where p is the number of i with taken[i] - lo - i <= t (binary search).
    """
    low, high = 0, len(taken)  # type: ignore[arg-type]
    while low < high:
        mid = (low + high) // 2
        if taken[mid] - lo - mid <= t:  # type: ignore[index]
            low = mid + 1
        else:
            high = mid
    return lo + t + low


class _PlacedItems:
    """Placed items and their noises: SortedChunks, plus a small dict for items placed one at a
    time (flushed into a chunk once it holds CHUNK_MIN)."""

    CHUNK_MIN = 64

    def __init__(self) -> None:
        self.single: dict[int, float] = {}
        self.chunks = SortedChunks()

    def __len__(self) -> int:
        return len(self.single) + len(self.chunks)

    def get(self, item: int) -> float | None:
        noise = self.single.get(item)
        return noise if noise is not None else self.chunks.get(item)

    def __contains__(self, item: int) -> bool:
        return self.get(item) is not None

    def get_many(self, items: np.ndarray) -> np.ndarray:
        """Noises of many items (int64 array); NaN for the items not placed."""
        self._flush()
        return self.chunks.lookup(items)[1]

    def contains_many(self, items: np.ndarray) -> np.ndarray:
        """Which of many items (int64 array) are placed."""
        self._flush()
        return self.chunks.lookup(items)[0]

    def add(self, item: int, noise: float) -> None:
        self.single[item] = noise
        if len(self.single) >= self.CHUNK_MIN:
            self._flush()

    def add_many(
        self, items: np.ndarray, noises: np.ndarray, order: np.ndarray | None = None
    ) -> None:
        """Place distinct new items (any order; `order` = their argsort if known) with noises."""
        self.chunks.add(items, noises, order)

    def _flush(self) -> None:
        if self.single:
            items = np.fromiter(self.single, dtype=np.int64, count=len(self.single))
            noises = np.fromiter(self.single.values(), dtype=np.float64, count=len(self.single))
            self.single = {}
            self.chunks.add(items, noises)

    def all_items(self) -> np.ndarray:
        self._flush()
        return self.chunks.all_keys()


class _SampledAhead:
    """Positions at or after the sorted-access cursor that random access has sampled, with their
    v, item and noise: parallel numpy arrays sorted by position. Sorted access consumes them from
    the front (an offset, compacted now and then); a batch is merged in with one sort."""

    def __init__(self) -> None:
        self.pos = np.empty(0, dtype=np.int64)
        self.v = np.empty(0, dtype=np.float64)
        self.item = np.empty(0, dtype=np.int64)
        self.noise = np.empty(0, dtype=np.float64)
        self.start = 0

    def __len__(self) -> int:
        return len(self.pos) - self.start

    def __contains__(self, position: int) -> bool:
        keys = self.keys()
        i = int(np.searchsorted(keys, position))
        return i < len(keys) and int(keys[i]) == position

    def keys(self) -> np.ndarray:
        return self.pos[self.start :]

    def first_position(self) -> int:
        """The smallest sampled position ahead, or -1 if there is none."""
        return int(self.pos[self.start]) if len(self) else -1

    def entry(self, i: int) -> tuple[int, float, int, float]:
        """(position, v, item, noise) of the i-th sampled position ahead."""
        i += self.start
        return int(self.pos[i]), float(self.v[i]), int(self.item[i]), float(self.noise[i])

    def bisect(self, position: int) -> int:
        """How many sampled positions ahead are below `position`."""
        return int(self.keys().searchsorted(position))

    def pop_first(self) -> tuple[int, float, int, float]:
        entry = self.entry(0)
        self.start += 1
        if self.start > 1024 and 2 * self.start > len(self.pos):
            self._set(self.pos, self.v, self.item, self.noise)  # compact
        return entry

    def insert(self, position: int, v: float, item: int, noise: float) -> None:
        """One new (unsampled) position: O(len) copying, no sort (slices and one concatenate
        per column: np.insert's own overhead is ten times that on short columns)."""
        i = self.start + self.bisect(position)
        self.pos, self.v, self.item, self.noise = (
            np.concatenate((column[:i], np.array((value,), column.dtype), column[i:]))
            for column, value in (
                (self.pos, position),
                (self.v, v),
                (self.item, item),
                (self.noise, noise),
            )
        )

    def add(self, pos: np.ndarray, v: np.ndarray, item: np.ndarray, noise: np.ndarray) -> None:
        """Merge new (unsampled) positions, in any order (taken as they are, ascending, where
        there are none yet)."""
        if not len(self) and (len(pos) < 2 or bool(np.all(pos[1:] > pos[:-1]))):
            self.start = 0
            self.pos, self.v, self.item, self.noise = pos, v, item, noise
            return
        columns = [
            np.concatenate([old[self.start :], new])
            for old, new in ((self.pos, pos), (self.v, v), (self.item, item), (self.noise, noise))
        ]
        order = np.argsort(columns[0], kind="stable")
        self.start = 0
        self.pos, self.v, self.item, self.noise = (c[order] for c in columns)

    def _set(self, *columns: np.ndarray) -> None:
        self.pos, self.v, self.item, self.noise = (c[self.start :].copy() for c in columns)
        self.start = 0


class _Draws:
    """Scalar random draws served from blocks of one generator (numpy's scalar calls are slow).

    Buffering only regroups the generator's stream: every value is still an independent draw.
    """

    BITS = 62
    MAX_BLOCK = 4096  # blocks double from 8 up to this: small lists draw little

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self._bits: list[int] = []
        self._exps: list[float] = []
        self._bits_block = self._exps_block = 8

    def below(self, n: int) -> int:
        """A uniform integer in [0, n), exactly: 62 random bits, rejected above a multiple of n.
        The bits are the top 62 of the generator's raw 64-bit words: what rng.integers(0,
        2**62) draws (Lemire's method on a power of two keeps them), at a tenth of its cost."""
        limit = ((1 << self.BITS) // n) * n
        while True:
            if not self._bits:
                size = self._bits_block
                raw = self.rng.bit_generator.random_raw(size)
                self._bits = (raw >> np.uint64(64 - self.BITS)).tolist()
                self._bits_block = min(2 * size, self.MAX_BLOCK)
            x = self._bits.pop()
            if x < limit:
                return x % n

    def exponential(self) -> float:
        if not self._exps:
            self._exps = self.rng.standard_exponential(self._exps_block).tolist()
            self._exps_block = min(2 * self._exps_block, self.MAX_BLOCK)
        return self._exps.pop()


class LazyNoiseList:
    """Algorithm 4: sorted and random access to m sorted i.i.d. noises, sampled on demand.

    Implements the NoiseList protocol (noise_list.py): `next_sorted()` and `noise_of(rank)`, items
    being canonical ranks 0..m-1; plus `next_sorted_batch(count)`, the next `count` positions in
    one vectorised draw, and `noises_of(ranks)`, random access to many items at once. Its joint
    law is exactly that of EagerNoiseList (sorting m i.i.d. noises), whatever the interleaving of
    accesses; the random stream differs, so one seed gives different (equally distributed)
    answers with the two oracles.
    """

    def __init__(self, distribution: NoiseDistribution, m: int, rng: np.random.Generator) -> None:
        if isinstance(m, bool) or not isinstance(m, numbers.Integral):
            raise TypeError(f"LazyNoiseList m must be an integer, got {m!r}")
        if not (1 <= m <= MAX_DOMAIN):
            raise ValueError(f"LazyNoiseList m must be in [1, 2**62], got {m}")
        self.distribution = distribution
        self.m = int(m)
        self.rng = rng
        self._draws = _Draws(rng)
        self._cursor = 0  # next position served by sorted access; all positions before are sampled
        self._last_v = 0.0  # v of position cursor - 1 (the sentinel v_(-1) = 0 at the start)
        self._last_noise = math.inf
        self._ahead = _SampledAhead()  # positions >= cursor sampled by random access
        self._placed = _PlacedItems()  # item (canonical rank) -> its noise
        self._placed_sorted: SortedList | None = None  # placed items, kept once many are placed

    # ----- introspection ------------------------------------------------------------------------
    @property
    def sampled(self) -> int:
        """How many positions (= items) have been sampled so far."""
        return len(self._placed)

    @property
    def cursor(self) -> int:
        """How many positions sorted access has served."""
        return self._cursor

    # ----- the NoiseList protocol -----------------------------------------------------------------
    def next_sorted(self) -> tuple[int, float]:
        """Sorted access (Algorithm 4): (item, noise) at the next position."""
        j = self._cursor
        if j >= self.m:
            raise IndexError(f"sorted access past the end of the noise list (m = {self.m})")
        ahead = self._ahead
        if ahead.first_position() == j:
            _, v, item, noise = ahead.pop_first()
        else:
            if ahead:
                r, v_r, _, noise_r = ahead.entry(0)
            else:
                r, v_r, noise_r = self.m, 1.0, -math.inf
            v = self._draw_v(j - 1, self._last_v, j, r, v_r)
            item = self._fresh_item()
            noise = self._noise_for(v, self._last_noise, noise_r)
            self._place(item, noise)
        self._cursor = j + 1
        self._last_v, self._last_noise = v, noise
        return item, noise

    def noise_of(self, rank: int) -> float:
        """Random access (Algorithm 4): the noise of item `rank`, placing it first if it is new."""
        noise = self._placed.get(rank)
        if noise is not None:
            return noise
        if isinstance(rank, bool) or not isinstance(rank, numbers.Integral):
            raise TypeError(f"noise_of needs an integer rank, got {rank!r}")
        rank = int(rank)
        if not (0 <= rank < self.m):
            raise IndexError(f"rank {rank} is outside the domain [0, {self.m})")
        j = self._fresh_position()
        ahead = self._ahead
        i = ahead.bisect(j)
        if i > 0:
            left, v_l, _, noise_l = ahead.entry(i - 1)
        else:
            left, v_l, noise_l = self._cursor - 1, self._last_v, self._last_noise
        if i < len(ahead):
            r, v_r, _, noise_r = ahead.entry(i)
        else:
            r, v_r, noise_r = self.m, 1.0, -math.inf
        v = self._draw_v(left, v_l, j, r, v_r)
        noise = self._noise_for(v, noise_l, noise_r)
        ahead.insert(j, v, rank, noise)
        self._place(rank, noise)
        return noise

    # ----- batched random access ------------------------------------------------------------------
    def noises_of(self, ranks: Sequence[int] | np.ndarray) -> np.ndarray:
        """Random access to many items at once: their noises, in the order given.

        The fresh items get distinct positions drawn uniformly from the unsampled ones, in order
        (sequential rejection, as one at a time). Gaps (l, r) between sampled positions are
        conditionally independent (Theorem 4.8); in a gap the q + 1 spacings of (v_l, v_r) cut at
        the new positions p1 < ... < pq are Dirichlet(p1 - l, p2 - p1, ..., r - pq), the joint law
        of uniform order statistics (for q = 1 the Beta(p - l, r - p) of `_draw_v`), drawn as
        normalised independent gammas.
        """
        arr = np.asarray(ranks)
        if arr.ndim != 1 or (len(arr) and not np.issubdtype(arr.dtype, np.integer)):
            raise TypeError(f"noises_of needs a 1-D sequence of integer ranks, got {arr.dtype}")
        if len(arr) and (arr.min() < 0 or arr.max() >= self.m):
            raise IndexError(f"a rank is outside the domain [0, {self.m})")
        arr = arr.astype(np.int64, copy=False)
        placed = self._placed
        noises = placed.get_many(arr)
        missing = np.isnan(noises)
        if not missing.any():
            return noises
        # Fresh items in ascending order: positions are exchangeable, so which fresh item takes
        # which drawn position may follow any fixed order.
        asked = arr[missing]
        if len(asked) < 2 or bool(np.all(asked[1:] > asked[:-1])):  # ascending already: as is
            fresh, where = asked, np.arange(len(asked))
        else:
            fresh, where = np.unique(asked, return_inverse=True)
        span = self.m - self._cursor
        if len(fresh) < BATCH_MIN or len(self._ahead) + len(fresh) > REJECTION_MAX_TAKEN * span:
            fresh_noises = np.array([self.noise_of(rank) for rank in fresh.tolist()])
        else:
            keys = self._ahead.keys()
            positions = self._fresh_positions(len(fresh), keys)
            fresh_noises = self._place_at(fresh, positions, keys)
        noises[missing] = fresh_noises[where]
        return noises

    def _fresh_positions(self, count: int, keys: np.ndarray) -> np.ndarray:
        """`count` distinct unsampled positions, uniformly, in draw order (sequential rejection:
        duplicates and sampled positions rejected, then a scalar top-up)."""
        lo, span = self._cursor, self.m - self._cursor
        draw = lo + self.rng.integers(0, span, size=count, dtype=np.int64)
        order = np.argsort(draw, kind="stable")
        ordered = draw[order]
        keep = np.ones(count, dtype=bool)
        keep[order[1:][ordered[1:] == ordered[:-1]]] = False
        if len(keys):  # sampled already: both sides sorted, so one merge-like search
            i = np.minimum(np.searchsorted(keys, ordered), len(keys) - 1)
            keep[order[keys[i] == ordered]] = False
        if keep.all():
            return draw
        extra: dict[int, None] = {}
        missing = count - int(keep.sum())
        while len(extra) < missing:
            j = lo + self._draws.below(span)
            i = int(np.searchsorted(ordered, j))
            if (i < count and ordered[i] == j) or j in self._ahead or j in extra:
                continue
            extra[j] = None
        return np.concatenate([draw[keep], np.fromiter(extra, np.int64, missing)])

    def _place_at(self, items: np.ndarray, positions: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Place new items (ascending) at new positions (all >= cursor, unsampled), sampling the
        values there; returns the items' noises.

        Gaps are grouped by their number of new positions into power-of-two size classes; a class
        is one 2-D gamma draw (rows padded with shape-0 gammas, which are exactly 0) and one
        cumulative sum per row, so that partial sums start at the gap and tiny values keep their
        precision.
        """
        items_ascending = items
        by_position = np.argsort(positions)
        pos, items = positions[by_position], items[by_position]
        n = len(pos)
        ahead = self._ahead
        gap = np.searchsorted(keys, pos)  # new position between ext[gap] and ext[gap + 1]
        if gap[0] == gap[-1]:  # one gap (the first block's items): the same draws, unpadded
            g = int(gap[0])
            left, v_l, noise_l = self._neighbour(g)
            right, v_r, noise_r = self._neighbour(g + 1)
            v = self._one_gap(pos, left, right, v_l, v_r)
            z = np.asarray(self.distribution.from_survival(v), dtype=np.float64)
            noise = np.minimum(np.maximum(z, noise_r), noise_l)  # np.clip's, on scalars
        else:
            # Sampled neighbours with the sentinels: the cursor's predecessor and v_(m) = 1.
            ext_pos = np.concatenate([[self._cursor - 1], keys, [self.m]]).astype(np.int64)
            ext_v = np.concatenate([[self._last_v], ahead.v[ahead.start :], [1.0]])
            ext_noise = np.concatenate(
                [[self._last_noise], ahead.noise[ahead.start :], [-math.inf]]
            )
            v = self._gaps(pos, gap, ext_pos, ext_v)
            z = np.asarray(self.distribution.from_survival(v), dtype=np.float64)
            noise = np.minimum(np.maximum(z, ext_noise[gap + 1]), ext_noise[gap])  # np.clip's
        ahead.add(pos, v, items, noise)
        by_item = np.empty(n)
        by_item[by_position] = noise
        self._placed.add_many(items_ascending, by_item, np.arange(n))
        if self._placed_sorted is not None:
            self._placed_sorted.update(items.tolist())
        return by_item

    def _neighbour(self, g: int) -> tuple[int, float, float]:
        """(position, v, noise) of the g-th sampled neighbour of the positions ahead: 0 the
        cursor's predecessor (the sentinel v_(-1) = 0 at the start), then the sampled positions
        ahead, then the sentinel v_(m) = 1."""
        ahead = self._ahead
        if g == 0:
            return self._cursor - 1, self._last_v, self._last_noise
        if g > len(ahead):
            return self.m, 1.0, -math.inf
        i = ahead.start + g - 1
        return int(ahead.pos[i]), float(ahead.v[i]), float(ahead.noise[i])

    def _one_gap(
        self, pos: np.ndarray, left: int, right: int, v_l: float, v_r: float
    ) -> np.ndarray:
        """The v of new positions `pos` (ascending) all in the gap (left, right) between two
        sampled positions: its q + 1 spacings Dirichlet, as `_gaps` draws them (a gamma of shape
        0 is exactly 0 and takes no draw: the same stream and the same values, unpadded)."""
        bounds = np.concatenate(([left], pos, [right]))
        sums = np.cumsum(self.rng.standard_gamma(np.diff(bounds)))
        return np.minimum(np.maximum(v_l + (v_r - v_l) * (sums[:-1] / sums[-1]), v_l), v_r)

    def _gaps(
        self, pos: np.ndarray, gap: np.ndarray, ext_pos: np.ndarray, ext_v: np.ndarray
    ) -> np.ndarray:
        """The v of new positions `pos` (ascending) in gaps `gap` (`_place_at`): per size
        class of gaps, one 2-D gamma draw and one cumulative sum per row."""
        n = len(pos)
        first = np.ones(n, dtype=bool)
        first[1:] = gap[1:] != gap[:-1]
        starts = np.flatnonzero(first)
        sizes = np.diff(np.append(starts, n))
        gaps = gap[starts]
        v = np.empty(n)
        size_class = np.ceil(np.log2(sizes)).astype(np.int64)
        for c in np.unique(size_class).tolist():
            chosen = np.flatnonzero(size_class == c)
            width = 1 << c  # at most this many new positions per gap in the class
            g, sz, st = gaps[chosen], sizes[chosen], starts[chosen]
            # Row i: the positions l, p1..pq, r of gap i, padded after r by repeating r.
            col = np.arange(width + 2)
            take = np.minimum(col[None, :] - 1, sz[:, None])  # -1 = l, 0..q-1 = p, q = r
            inner = np.clip(st[:, None] + take, 0, n - 1)
            bounds = np.where(
                take < 0,
                ext_pos[g][:, None],
                np.where(take >= sz[:, None], ext_pos[g + 1][:, None], pos[inner]),
            )
            sums = np.cumsum(self.rng.standard_gamma(np.diff(bounds, axis=1)), axis=1)
            lv, rv = ext_v[g][:, None], ext_v[g + 1][:, None]
            share = sums[:, :-1] / sums[:, -1:]
            values = np.clip(lv + (rv - lv) * share, lv, rv)
            keep = col[None, :width] < sz[:, None]
            v[(st[:, None] + col[None, :width])[keep]] = values[keep]
        return v

    # ----- batched sorted access ------------------------------------------------------------------
    def next_sorted_batch(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The next `count` sorted accesses at once: (items, noises), noises non-increasing.

        A run of consecutive unsampled positions j = l+1 .. l+c below the next sampled position r
        holds the c smallest of the n = r - l - 1 uniforms V in (v_l, v_r), drawn jointly from
        exponential spacings: V_(l+i) = v_l + (v_r - v_l) * S_i / (S_c + G), S_i the partial sums
        of c standard exponentials and G ~ Gamma(n + 1 - c) the sum of the remaining ones. Its items
        are c distinct fresh items in uniformly random order. Stops early at the end of the list.
        """
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 0:
            raise ValueError(f"count must be a non-negative integer, got {count!r}")
        count = min(int(count), self.m - self._cursor)
        items_out = np.empty(count, dtype=np.int64)
        noises_out = np.empty(count, dtype=np.float64)
        filled = 0
        ahead = self._ahead
        while filled < count:
            j = self._cursor
            if ahead.first_position() == j:
                _, v, item, noise = ahead.pop_first()
                items_out[filled], noises_out[filled] = item, noise
                filled += 1
                self._cursor = j + 1
                self._last_v, self._last_noise = v, noise
                continue
            if ahead:
                r, v_r, _, noise_r = ahead.entry(0)
            else:
                r, v_r, noise_r = self.m, 1.0, -math.inf
            run = min(r - j, count - filled)
            v_l = self._last_v
            spacings = np.cumsum(self.rng.standard_exponential(run))
            rest = self.rng.standard_gamma(r - j - run + 1)
            v = v_l + (v_r - v_l) * (spacings / (spacings[-1] + rest))
            np.minimum(np.maximum(v, v_l, out=v), v_r, out=v)  # np.clip, without its overhead
            noises = np.asarray(self.distribution.from_survival(v), dtype=np.float64)
            np.minimum(np.maximum(noises, noise_r, out=noises), self._last_noise, out=noises)
            items, order = self._fresh_items(run)
            self._placed.add_many(items, noises, order)
            if self._placed_sorted is not None:
                self._placed_sorted.update(items.tolist())
            items_out[filled : filled + run] = items
            noises_out[filled : filled + run] = noises
            filled += run
            self._cursor = j + run
            self._last_v, self._last_noise = float(v[-1]), float(noises[-1])
        return items_out, noises_out

    # ----- internals --------------------------------------------------------------------------
    def _draw_v(self, left: int, v_l: float, j: int, r: int, v_r: float) -> float:
        """V_(j) given its nearest sampled neighbours l = left < j < r (Theorems 4.8, 4.10):
        v_l + (v_r - v_l) * Beta(j - l, r - j).

        Beta(1, n) (the next position after a sampled one) is 1 - W**(1/n), W uniform, computed as
        -expm1(-E / n) with E = -ln W exponential; otherwise numpy's Beta(a, b), which for
        max(a, b) > 1 is G1 / (G1 + G2) with independent gammas. Both keep full relative
        precision for tiny results.
        """
        if j - left == 1:
            y = -math.expm1(-self._draws.exponential() / (r - j))
        else:
            y = self.rng.beta(j - left, r - j)
        v = v_l + (v_r - v_l) * y
        return min(max(v, v_l), v_r)

    def _noise_for(self, v: float, upper: float, lower: float) -> float:
        """F^-1(1 - v), kept within its neighbours' noises (guards against last-ulp rounding)."""
        noise = float(self.distribution.from_survival(v))
        return min(max(noise, lower), upper)

    def _place(self, item: int, noise: float) -> None:
        self._placed.add(item, noise)
        if self._placed_sorted is not None:
            self._placed_sorted.add(item)

    def _fresh_item(self) -> int:
        """An item drawn uniformly from those not yet placed (Algorithm 4, sorted access line 3)."""
        m, placed = self.m, self._placed
        if len(placed) <= REJECTION_MAX_TAKEN * m:
            while True:
                item = self._draws.below(m)
                if item not in placed:
                    return item
        if self._placed_sorted is None:
            self._placed_sorted = SortedList(placed.all_items().tolist())
        t = self._draws.below(m - len(placed))
        return _nth_free(self._placed_sorted, t, 0)

    def _fresh_items(self, count: int) -> tuple[np.ndarray, np.ndarray | None]:
        """`count` distinct items, uniformly from those not placed, in uniformly random order;
        and their argsort when it was computed on the way (else None)."""
        m, placed = self.m, self._placed
        if len(placed) + count > REJECTION_MAX_TAKEN * m:
            # Few items are left (m = O(accesses)): list them and take a uniform ordered sample.
            is_free = np.ones(m, dtype=bool)
            is_free[placed.all_items()] = False
            return self.rng.permutation(np.flatnonzero(is_free))[:count], None
        # Sequential rejection, vectorised: candidates are i.i.d. uniform; keeping each candidate
        # that is neither placed nor an earlier kept one gives a uniform sample without
        # replacement in random order. At most half the domain is taken, so few are rejected.
        if count <= 64:  # few items: one at a time (no pass over the placed items)
            chosen: dict[int, None] = {}
            while len(chosen) < count:
                item = self._draws.below(m)
                if item not in placed:
                    chosen.setdefault(item)
            return np.fromiter(chosen, dtype=np.int64, count=count), None
        draw = self.rng.integers(0, m, size=count, dtype=np.int64)
        order = np.argsort(draw, kind="stable")  # equal values: earliest occurrence first
        ordered = draw[order]
        keep = np.ones(count, dtype=bool)
        keep[order[1:][ordered[1:] == ordered[:-1]]] = False  # later occurrences of a value
        if len(placed):
            keep[order[placed.contains_many(ordered)]] = False  # sorted needles search faster
        if keep.all():
            return draw, order  # the common case: nothing rejected
        # Top up one candidate at a time: a value of `draw` is kept or placed, so it is rejected.
        extra: dict[int, None] = {}
        missing = count - int(keep.sum())
        while len(extra) < missing:
            item = self._draws.below(m)
            i = int(np.searchsorted(ordered, item))
            if (i < count and ordered[i] == item) or item in placed or item in extra:
                continue
            extra[item] = None
        return np.concatenate([draw[keep], np.fromiter(extra, np.int64, missing)]), None

    def _fresh_position(self) -> int:
        """A position drawn uniformly from those not yet sampled (Algorithm 4, random access l.2).

        Unsampled positions are [cursor, m) minus the keys of `_ahead`.
        """
        lo, ahead = self._cursor, self._ahead
        span = self.m - lo
        if len(ahead) <= REJECTION_MAX_TAKEN * span:
            while True:
                j = lo + self._draws.below(span)
                if j not in ahead:
                    return j
        t = self._draws.below(span - len(ahead))
        return _nth_free(ahead.keys(), t, lo)
