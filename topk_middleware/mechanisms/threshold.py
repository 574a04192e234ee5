"""The private threshold algorithm (Wu, Ohrimenko, Wirth 2023, Algorithm 3), batched.

TA runs on two lists: L1 = the data store (through CountedAccess) and L2 = a noise list, with the
aggregate f(i) = h[i] + Z_i. Its output is exactly the top-k of h + Z (Algorithm 2's distribution)
and its expected cost on L1 is at most 2 (sqrt(mk) + sqrt(m/2)) (Theorem 4.2).

Batching. Step s of the sequential algorithm makes one sorted access to each list, learns the noise
of the L1 item (random access to L2) and the score of the L2 item (random access to L1, unless
already seen). Which items a step touches depends only on ranks and on the noise list, never on
scores; only *when it stops* depends on the data. So a block of steps is run in three phases:
plan (ask the noise list, see NoisePlan), fetch (one batch of sorted rows and one of random
rows from the store), evaluate (the sequential stopping rule, step by step). The answer and the
access counts are those of the sequential algorithm; only rows_fetched and round_trips change.
Blocks grow geometrically, so a run makes O(log(steps)) round trips and fetches < growth x the rows
it uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..access import CountedAccess
from ..noise_list import NoiseList
from ..threshold import TopKTracker


@dataclass(frozen=True)
class Batching:
    """Block sizes of the batched run: first block `first` steps (default k), then x `growth`."""

    first: int | None = None
    growth: float = 2.0

    def __post_init__(self) -> None:
        if self.first is not None and self.first < 1:
            raise ValueError(f"Batching.first must be >= 1, got {self.first}")
        if not (self.growth >= 1.0 and math.isfinite(self.growth)):
            raise ValueError(f"Batching.growth must be a finite number >= 1, got {self.growth}")

    @classmethod
    def sequential(cls) -> Batching:
        """One step per block: every access is its own round trip (the paper's model, literally)."""
        return cls(first=1, growth=1.0)

    def blocks(self, k: int):
        size = float(self.first or k)
        while True:
            yield max(1, int(size))
            size *= self.growth


class NoisePlan:
    """What the noise list answers at steps 0, 1, 2, ... of Algorithm 3, drawn ahead in chunks.

    Step s needs the noise of the item of rank s (random access to L2) and the next item of L2
    with its noise (sorted access). The plan draws them for a whole chunk of steps with the noise
    list's batched calls: first the chunk's sorted accesses, then the noises of its ranks. Any
    order of calls samples the exact joint law of the noise list (Algorithm 4 samples each value
    from its conditional law given the others), and the chunks are a fixed function of k, so the
    plan, hence the answer for one seed, does not depend on how the store is batched.
    """

    FIRST_CHUNK = 64

    def __init__(self, noise_list: NoiseList, k: int, m: int) -> None:
        self.noise_list = noise_list
        self.m = m
        self.noise_of_rank: list[float] = []  # step s: the noise of the item of rank s
        self.l2_rank: list[int] = []  # step s: the item at position s of L2 ...
        self.l2_noise: list[float] = []  # ... and its noise
        self._chunk = max(k, self.FIRST_CHUNK)

    def __len__(self) -> int:
        return len(self.l2_rank)

    def extend_to(self, end: int) -> None:
        """Make sure steps 0 .. end - 1 are planned."""
        end = min(end, self.m)
        while len(self) < end:
            start = len(self)
            count = min(self._chunk, self.m - start)
            ranks, noises = self.noise_list.next_sorted_batch(count)
            own_ranks = np.arange(start, start + count, dtype=np.int64)
            batched = getattr(self.noise_list, "noises_of", None)
            if batched is not None:
                own = batched(own_ranks)
            else:
                own = [self.noise_list.noise_of(r) for r in own_ranks.tolist()]
            self.l2_rank.extend(np.asarray(ranks).tolist())
            self.l2_noise.extend(np.asarray(noises).tolist())
            self.noise_of_rank.extend(np.asarray(own).tolist())
            self._chunk *= 2


def private_threshold_top_k(
    access: CountedAccess, noise_list: NoiseList, k: int, batching: Batching
) -> list[int]:
    """Algorithm 3: ranks of the top-k items of h + Z, best first."""
    m = access.m
    tracker = TopKTracker(k)
    seen: set[int] = set()
    plan = NoisePlan(noise_list, k, m)
    start = 0
    for block in batching.blocks(k):
        end = min(m, start + block)
        plan.extend_to(end)
        steps = zip(
            plan.noise_of_rank[start:end], plan.l2_rank[start:end], plan.l2_noise[start:end],
            strict=True,
        )
        # Fetch: the sorted prefix, and the rows of L2 items beyond it, one batch each.
        access.fetch_sorted_until(end)
        access.fetch_ranks([rank for rank in plan.l2_rank[start:end] if rank >= end])
        # Evaluate: the sequential algorithm, step by step.
        for z_sorted_item, noise_rank, noise in steps:
            rank, score = access.sorted_access()
            if rank not in seen:
                seen.add(rank)
                tracker.offer(score + z_sorted_item, rank)
            if noise_rank not in seen:
                seen.add(noise_rank)
                tracker.offer(access.random_access(noise_rank) + noise, noise_rank)
            if tracker.done(score + noise):
                return tracker.keys()
        start = end
        if start >= m:  # every item seen: the tracker holds the exact top-k
            return tracker.keys()
    raise AssertionError("unreachable")
