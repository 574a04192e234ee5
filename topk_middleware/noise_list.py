"""The noise list L2 of the private threshold algorithm (Wu, Ohrimenko, Wirth 2023, Algorithm 3).

L2 holds one noise per item, sorted descending. It answers sorted access (the item with the next
largest noise, and that noise) and random access (the noise of a named item). Items are named by
their canonical rank (see access.py). Accesses to L2 live in memory: they are not accesses to the
data store and are not counted.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from .noise import NoiseDistribution


class NoiseList(Protocol):
    """Sorted and random access to m i.i.d. noises, one per item."""

    def next_sorted(self) -> tuple[int, float]:
        """Sorted access: (rank of the item, its noise) for the next largest noise."""
        ...

    def noise_of(self, rank: int) -> float:
        """Random access: the noise of the item at this rank."""
        ...

    def next_sorted_batch(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """`count` sorted accesses at once: (ranks, noises), noises non-increasing."""
        ...

    def noises_of(self, ranks: np.ndarray) -> np.ndarray:
        """Random access to several items at once: their noises, in the order given."""
        ...


class EagerNoiseList:
    """Algorithm 3, line 1: draw all m noises up front and sort them (O(m) time and memory).

    `noises[r]` is the noise of the item at rank r: the same vector the one-shot mechanism adds,
    so with one seed both mechanisms return the same answer.
    """

    def __init__(self, noises: np.ndarray) -> None:
        self.noises = noises
        self._order = np.argsort(-noises, kind="stable")
        self._next = 0

    @classmethod
    def draw(cls, distribution: NoiseDistribution, m: int, rng: np.random.Generator):
        return cls(distribution.sample(rng, m))

    def next_sorted(self) -> tuple[int, float]:
        rank = int(self._order[self._next])
        self._next += 1
        return rank, float(self.noises[rank])

    def noise_of(self, rank: int) -> float:
        return float(self.noises[rank])

    def next_sorted_batch(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        ranks = self._order[self._next : self._next + count]
        self._next += len(ranks)
        return ranks, self.noises[ranks]

    def noises_of(self, ranks: np.ndarray) -> np.ndarray:
        return self.noises[np.asarray(ranks, dtype=np.int64)]
