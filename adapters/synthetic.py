"""SyntheticSource: a histogram of any size (m up to 10^12) that stores no per-item data.

The score is a function of the canonical rank, so sorted access and the positional index cost
nothing; item ids are a seeded pseudo-random bijection of [0, m) with the ranks. Families:

* "zipf":    score(r) = floor(top / (r + 1) ** exponent)   (skewed: TA stops early)
* "flat":    score(r) = top                                 (every item tied)
* "uniform": score(r) = floor(top * (m - 1 - r) / (m - 1))  (counts spread evenly over 0..top)
* "distinct": the plateau without ties: every score distinct (float), the top size =
  ceil(sqrt(m k)) within 0.001 of each other (top - 0.001 r / size), the others evenly spaced
  from top - 1 down to 0. No runs of tied scores answer random access (one strict segment).
* "plateau": the lower-bound instance of Wu, Ohrimenko, Wirth (ICML 2023), Theorem 5.4 / eq. (14):
  a set S of tau = ceil(sqrt(m k)) items, S_L (|S| / k of them) with score top - 1, the others of
  S (S_H) with score top, every item outside S with score 0. For k = 1, S_L = S: tau tied items.

Ties and the bijection. Every store serves the canonical order (score descending, ties by id
ascending), so within a block of tied scores ids must increase with rank: a free permutation of
[0, m) would break that. The rank axis is cut into maximal runs of equal score; consecutive runs of
length one are merged into *strict* segments (scores strictly decreasing), the other runs are
*tied* segments. Each segment owns a contiguous range of ids, the ranges laid out in a seeded
random order of the segments; inside a strict segment the ids are a seeded Feistel permutation
(with cycle walking) of its range, inside a tied segment they increase with rank. Scores of
different segments differ, so the canonical order is exactly the rank order. A family whose every
item is tied ("flat") therefore has id = rank: the canonical order leaves no other choice.
The number of runs is bounded by the number of distinct scores (checked: at most MAX_RUNS).
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np

from topk_middleware.access import AccessError, Rows, StoreTraits

FAMILIES = ("zipf", "flat", "uniform", "plateau", "distinct")
MAX_DOMAIN = 2**62
MAX_RUNS = 100_000
RUN_BLOCK = 4096
DEFAULT_TOP = {
    "zipf": 1_000_000,
    "flat": 1,
    "uniform": 1_000,
    "plateau": 100,
    "distinct": 1_000_000,
}
DISTINCT_MAX_M = 2**40  # float scores stay distinct (steps of about top / m)
FEISTEL_ROUNDS = 4
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser on uint64 arrays (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class Feistel:
    """A seeded pseudo-random permutation of [0, n): a balanced Feistel network on the smallest
    even number of bits covering n, made a permutation of [0, n) by cycle walking."""

    def __init__(self, n: int, key: int) -> None:
        self.n = n
        bits = max(2, (n - 1).bit_length())
        bits += bits % 2
        self.half = np.uint64(bits // 2)
        self.mask = np.uint64((1 << (bits // 2)) - 1)
        keys = _mix64(np.arange(1, FEISTEL_ROUNDS + 1, dtype=np.uint64) * np.uint64(key | 1))
        self.keys = [np.uint64(int(k) ^ key) for k in keys]

    def _round(self, value: np.ndarray, i: int) -> np.ndarray:
        return _mix64(value ^ self.keys[i]) & self.mask

    def _pass(self, x: np.ndarray, inverse: bool) -> np.ndarray:
        left, right = x >> self.half, x & self.mask
        if inverse:
            for i in reversed(range(FEISTEL_ROUNDS)):
                left, right = right ^ self._round(left, i), left
        else:
            for i in range(FEISTEL_ROUNDS):
                left, right = right, left ^ self._round(right, i)
        return (left << self.half) | right

    def apply(self, x: np.ndarray, inverse: bool = False) -> np.ndarray:
        """The permutation (or its inverse) of int64 values in [0, n)."""
        y = self._pass(np.asarray(x, dtype=np.uint64), inverse)
        outside = y >= np.uint64(self.n)
        while outside.any():
            y[outside] = self._pass(y[outside], inverse)
            outside = y >= np.uint64(self.n)
        return y.astype(np.int64)


def distinct_scores_of_ranks(ranks: np.ndarray, m: int, size: int, top: float) -> np.ndarray:
    """Scores of the "distinct" family at these ranks: top - 0.001 r / size for r < size, then
    (top - 1) (m - 1 - r) / (m - 1 - size) down to 0; strictly decreasing, all distinct."""
    r = np.asarray(ranks, dtype=np.int64)
    head = top - 0.001 * r.astype(np.float64) / size
    tail = (top - 1.0) * (m - 1 - r).astype(np.float64) / max(m - 1 - size, 1)
    return np.where(r < size, head, tail)


class SyntheticSource:
    """A Source over m items whose score is a function of rank (see the module docstring).

    `top` is the largest count (family default in DEFAULT_TOP), `exponent` the Zipf exponent,
    `k` and `size` shape the plateau (size = |S|, default ceil(sqrt(m k))), `seed` the bijection.
    """

    def __init__(
        self,
        m: int,
        family: str = "zipf",
        *,
        top: int | None = None,
        exponent: float = 1.0,
        k: int = 1,
        size: int | None = None,
        seed: int = 0,
    ) -> None:
        if isinstance(m, bool) or not isinstance(m, numbers.Integral):
            raise TypeError(f"SyntheticSource m must be an integer, got {m!r}")
        if not (1 <= m <= MAX_DOMAIN):
            raise ValueError(f"SyntheticSource m must be in [1, 2**62], got {m}")
        if family not in FAMILIES:
            raise ValueError(f"SyntheticSource family must be one of {FAMILIES}, got {family!r}")
        top = DEFAULT_TOP[family] if top is None else top
        if isinstance(top, bool) or not isinstance(top, numbers.Integral) or top < 0:
            raise ValueError(f"SyntheticSource top must be a non-negative integer, got {top!r}")
        self.m, self.family, self.top = int(m), family, int(top)
        if family == "zipf" and not (math.isfinite(exponent) and exponent > 0):
            raise ValueError(f"zipf exponent must be finite and > 0, got {exponent}")
        if family == "uniform" and self.top * max(self.m - 1, 1) >= 2**63:
            raise ValueError("uniform family: top * (m - 1) must stay below 2**63")
        if family == "plateau":
            if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
                raise ValueError(f"plateau k must be an integer >= 1, got {k!r}")
            if size is None:
                size = math.isqrt(self.m * int(k) - 1) + 1  # ceil(sqrt(m k))
            if not (1 <= size <= self.m):
                raise ValueError(f"plateau size must be in [1, m = {self.m}], got {size}")
            if self.top < 2:
                raise ValueError(f"plateau top must be >= 2 (S_L scores top - 1 > 0), got {top}")
            self.size = int(size)
            self.high = self.size - self.size // int(k)  # |S_H|: ranks [0, high) score top
        if family == "distinct":
            if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
                raise ValueError(f"distinct k must be an integer >= 1, got {k!r}")
            if self.m > DISTINCT_MAX_M:
                raise ValueError(f"distinct family: m must be <= 2**40, got {self.m}")
            if self.top < 2:
                raise ValueError(f"distinct top must be >= 2, got {top}")
            self.size = min(self.m, math.isqrt(self.m * int(k) - 1) + 1)
        self.exponent = float(exponent)
        self.seed = int(seed)
        self._build_segments()

    # ----- the score as a function of rank ------------------------------------------------------
    def scores_of_ranks(self, ranks: np.ndarray) -> np.ndarray:
        """Integer counts (as int64) of the items at these canonical ranks (float64 for the
        "distinct" family)."""
        r = np.asarray(ranks, dtype=np.int64)
        if self.family == "distinct":
            return distinct_scores_of_ranks(r, self.m, self.size, float(self.top))
        if self.family == "zipf":
            return np.floor(self.top / (r + 1.0) ** self.exponent).astype(np.int64)
        if self.family == "flat":
            return np.full(r.shape, self.top, dtype=np.int64)
        if self.family == "uniform":
            if self.m == 1:
                return np.full(r.shape, self.top, dtype=np.int64)
            return (self.top * (self.m - 1 - r)) // (self.m - 1)
        top = np.int64(self.top)
        return np.where(r < self.high, top, np.where(r < self.size, top - 1, np.int64(0)))

    def _score_at(self, rank: int) -> int:
        return int(self.scores_of_ranks(np.array([rank], dtype=np.int64))[0])

    # ----- segments and the bijection -----------------------------------------------------------
    def _runs(self) -> list[int]:
        """Start ranks of the maximal runs of equal score.

        Scores are read in blocks of RUN_BLOCK consecutive ranks (run boundaries inside a block by
        comparison of neighbours); a run reaching the end of its block is followed to its end by
        exponential and binary search.
        """
        starts: list[int] = []
        r, m = 0, self.m
        while r < m:
            starts.append(r)
            hi = min(r + RUN_BLOCK, m)
            block = self.scores_of_ranks(np.arange(r, hi, dtype=np.int64))
            cuts = (np.flatnonzero(block[1:] != block[:-1]) + 1 + r).tolist()
            starts.extend(cuts)
            if len(starts) > MAX_RUNS:
                raise ValueError(
                    f"the {self.family} family with m = {m}, top = {self.top} has more than "
                    f"{MAX_RUNS} runs of distinct scores; use a smaller top"
                )
            r = self._run_end(int(block[-1]), hi)
        return starts

    def _run_end(self, value: int, hi: int) -> int:
        """The first rank >= hi whose score is below `value` (score(hi - 1) == value), or m."""
        m, lo, step = self.m, hi - 1, 1
        while True:
            probe = lo + step
            if probe >= m:
                probe = m
                break
            if self._score_at(probe) < value:
                break
            lo, step = probe, step * 2
        while probe - lo > 1:  # score(lo) == value > score(probe) (or probe == m)
            mid = (lo + probe) // 2
            if self._score_at(mid) < value:
                probe = mid
            else:
                lo = mid
        return probe

    def _build_segments(self) -> None:
        runs = [0, self.m] if self.family == "distinct" else [*self._runs(), self.m]
        starts: list[int] = []
        strict: list[bool] = []
        for a, b in itertools.pairwise(runs):
            single = b - a == 1
            if single and strict and strict[-1]:
                continue  # extend the current strict segment
            starts.append(a)
            strict.append(single)
        self._seg_start = np.asarray(starts, dtype=np.int64)
        self._seg_len = np.diff(np.append(self._seg_start, self.m))
        self._seg_strict = np.asarray(strict, dtype=bool)
        rng = np.random.default_rng(self.seed)
        layout = rng.permutation(len(starts))  # id ranges in this order of segments
        base = np.empty(len(starts), dtype=np.int64)
        base[layout] = np.concatenate([[0], np.cumsum(self._seg_len[layout])[:-1]])
        self._seg_base = base
        self._by_base = np.argsort(base)
        self._bases_sorted = base[self._by_base]
        keys = rng.integers(0, 2**63, len(starts)).tolist()
        self._feistel = {
            int(s): Feistel(int(self._seg_len[s]), keys[s]) for s in np.flatnonzero(strict)
        }

    def ids_of_ranks(self, ranks: np.ndarray) -> np.ndarray:
        """Item ids (int64) of the given canonical ranks."""
        r = np.asarray(ranks, dtype=np.int64)
        seg = np.searchsorted(self._seg_start, r, side="right") - 1
        offset = r - self._seg_start[seg]
        for s in np.unique(seg[self._seg_strict[seg]]).tolist():
            sel = seg == s
            offset[sel] = self._feistel[s].apply(offset[sel])
        return self._seg_base[seg] + offset

    def ranks_of_ids(self, ids: np.ndarray) -> np.ndarray:
        """Canonical ranks (int64) of the given item ids (each in [0, m))."""
        x = np.asarray(ids, dtype=np.int64)
        seg = self._by_base[np.searchsorted(self._bases_sorted, x, side="right") - 1]
        offset = x - self._seg_base[seg]
        for s in np.unique(seg[self._seg_strict[seg]]).tolist():
            sel = seg == s
            offset[sel] = self._feistel[s].apply(offset[sel], inverse=True)
        return self._seg_start[seg] + offset

    # ----- the Source protocol ------------------------------------------------------------------
    def traits(self) -> StoreTraits:
        """access.StoreTraits: counts of unit votes (sensitivity 1); the plateau's scores are
        not integers."""
        return StoreTraits(sensitivity=1.0)

    def domain_size(self) -> int:
        return self.m

    def snapshot(self) -> nullcontext[None]:
        return nullcontext()  # the histogram is a pure function: nothing can change it

    def read_sorted(self, start: int, count: int) -> Rows:
        start = max(0, int(start))
        stop = min(start + max(0, int(count)), self.m)
        ranks = np.arange(start, max(start, stop), dtype=np.int64)
        return self._rows(ranks)

    def read_positions(self, ranks: np.ndarray) -> Rows:
        ranks = np.asarray(ranks, dtype=np.int64)
        if len(ranks) and (ranks.min() < 0 or ranks.max() >= self.m):
            raise AccessError(f"rank out of range [0, {self.m})")
        return self._rows(ranks)

    def read_ids(self, ids: Sequence[Any]) -> np.ndarray:
        values = list(ids)
        for item in values:
            if (
                isinstance(item, bool)
                or not isinstance(item, numbers.Integral)
                or not (0 <= item < self.m)
            ):
                raise AccessError(f"SyntheticSource has no item with id {item!r}")
        ranks = self.ranks_of_ids(np.asarray(values, dtype=np.int64))
        return self.scores_of_ranks(ranks).astype(np.float64)

    def _rows(self, ranks: np.ndarray) -> Rows:
        return Rows(ranks, self.ids_of_ranks(ranks), self.scores_of_ranks(ranks).astype(np.float64))
