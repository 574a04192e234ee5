"""Fagin's Threshold Algorithm (Wu, Ohrimenko, Wirth 2023, Algorithm 1; Fagin, Lotem, Naor 2003).

Given t lists that each rank all items by one attribute, and a monotone aggregate f, TA finds the k
items with the largest aggregate: sorted access proceeds in parallel on every list; each newly seen
item is completed by random access to the other lists (and remembered, so it is never completed
twice); TA stops as soon as k seen items have aggregate >= tau = f(last value seen on each list),
since no unseen item can beat tau. Here the stop is strict (> tau): an unseen item can tie tau,
and with ties broken by the smaller key it could still belong in the top-k.

`TopKTracker` is that stopping rule; the private threshold algorithm (mechanisms/threshold.py)
reuses it with the data store as one list and the noise list as the other.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


class TopKTracker:
    """The k largest aggregates seen so far, as a min-heap; ties go to the smaller key."""

    def __init__(self, k: int) -> None:
        self.k = k
        self._heap: list[tuple[float, int, Any]] = []

    def offer(self, value: float, key: int, item: Any = None) -> None:
        entry = (value, -key, item)
        if len(self._heap) < self.k:
            heapq.heappush(self._heap, entry)
        elif entry > self._heap[0]:
            heapq.heapreplace(self._heap, entry)

    def kth(self) -> float:
        """The k-th largest aggregate seen (-inf while fewer than k items have been seen)."""
        return self._heap[0][0] if len(self._heap) == self.k else -math.inf

    def done(self, tau: float) -> bool:
        """The stopping rule: k seen items have aggregate > tau. Strictly: an unseen item's
        aggregate is at most tau and may equal it, and under the tie rule (smaller key first) it
        could then still belong in the top-k; TA's own >= stops one step earlier on exact ties
        only."""
        return len(self._heap) == self.k and self._heap[0][0] > tau

    def keys(self) -> list[int]:
        """The keys of the k best, best first."""
        return [-nk for _, nk, _ in sorted(self._heap, reverse=True)]

    def ranked(self) -> list[tuple[float, int, Any]]:
        """(value, key, item), best first."""
        return [(v, -nk, item) for v, nk, item in sorted(self._heap, reverse=True)]


class RankedList(Protocol):
    """One list of TA: every item with one value, served by sorted and random access."""

    def sorted_next(self) -> tuple[Hashable, float] | None:
        """The next (item, value) in non-increasing value order, or None when exhausted."""
        ...

    def random(self, item: Hashable) -> float:
        """The value of a named item."""
        ...


@dataclass
class ArrayList:
    """A RankedList over in-memory parallel arrays, counting its own accesses."""

    items: Sequence[Hashable]
    values: np.ndarray
    sorted_accesses: int = 0
    random_accesses: int = 0
    _order: np.ndarray = field(init=False, repr=False)
    _index: dict[Hashable, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.values = np.asarray(self.values, dtype=np.float64)
        if len(self.items) != len(self.values):
            raise ValueError("items and values must have the same length")
        self._order = np.argsort(-self.values, kind="stable")
        self._index = {item: i for i, item in enumerate(self.items)}
        self._next = 0

    def sorted_next(self) -> tuple[Hashable, float] | None:
        if self._next >= len(self._order):
            return None
        i = int(self._order[self._next])
        self._next += 1
        self.sorted_accesses += 1
        return self.items[i], float(self.values[i])

    def random(self, item: Hashable) -> float:
        self.random_accesses += 1
        return float(self.values[self._index[item]])


@dataclass(frozen=True)
class TAResult:
    items: list[Hashable]  # best first
    scores: list[float]  # their aggregates
    steps: int  # rounds of parallel sorted access


def threshold_algorithm(
    lists: Sequence[RankedList],
    k: int,
    aggregate: Callable[[Sequence[float]], float] = sum,
) -> TAResult:
    """Algorithm 1: the k items with the largest monotone aggregate over t >= 1 lists."""
    if not lists:
        raise ValueError("threshold_algorithm needs at least one list")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    tracker = TopKTracker(k)
    seen: set[Hashable] = set()
    last: list[float] = [0.0] * len(lists)
    steps = 0
    while True:
        steps += 1
        for position, current in enumerate(lists):
            served = current.sorted_next()
            if served is None:  # every list holds every item: all items have been seen
                return _ta_result(tracker, steps)
            item, value = served
            last[position] = value
            if item in seen:
                continue
            seen.add(item)
            values = [value if other is current else other.random(item) for other in lists]
            tracker.offer(aggregate(values), len(seen), item)
        if tracker.done(aggregate(last)):
            return _ta_result(tracker, steps)


def _ta_result(tracker: TopKTracker, steps: int) -> TAResult:
    ranked = tracker.ranked()
    return TAResult([item for _, _, item in ranked], [v for v, _, _ in ranked], steps)
