"""The private threshold algorithm (Wu, Ohrimenko, Wirth 2023, Algorithm 3), batched.

TA runs on two lists: L1 = the data store (through CountedAccess) and L2 = a noise list, with the
aggregate f(i) = h[i] + Z_i. Its output is exactly the top-k of h + Z (Algorithm 2's distribution)
and its expected cost on L1 is at most 2 (sqrt(mk) + sqrt(m/2)) (Theorem 4.2).

Batching. Step s of the sequential algorithm makes one sorted access to each list, learns the noise
of the L1 item (random access to L2) and the score of the L2 item (random access to L1, unless
already seen). Which items a step touches depends only on ranks and on the noise list, never on
scores; only *when it stops* depends on the data. So a block of steps is run in three phases:
plan (ask the noise list, in sequential order), fetch (one batch of sorted rows and one of random
rows from the store), evaluate (the sequential stopping rule, step by step). The answer and the
access counts are those of the sequential algorithm; only rows_fetched and round_trips change.
Blocks grow geometrically, so a run makes O(log(steps)) round trips and fetches < growth x the rows
it uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


def plan_block(noise_list: NoiseList, start: int, end: int) -> list[tuple[float, int, float]]:
    """The noise-list calls of steps start..end-1, in the sequential order.

    Step s needs the noise of the item of rank s (random access to L2) and the next item of L2
    (sorted access): (noise of rank s, rank of the L2 item, its noise).
    """
    plan = []
    for step in range(start, end):
        z_sorted_item = noise_list.noise_of(step)
        plan.append((z_sorted_item, *noise_list.next_sorted()))
    return plan


def private_threshold_top_k(
    access: CountedAccess, noise_list: NoiseList, k: int, batching: Batching
) -> list[int]:
    """Algorithm 3: ranks of the top-k items of h + Z, best first."""
    m = access.m
    tracker = TopKTracker(k)
    seen: set[int] = set()
    start = 0
    for block in batching.blocks(k):
        end = min(m, start + block)
        plan = plan_block(noise_list, start, end)
        # Fetch: the sorted prefix, and the rows of L2 items beyond it, one batch each.
        access.fetch_sorted_until(end)
        access.fetch_ranks([rank for _, rank, _ in plan if rank >= end])
        # Evaluate: the sequential algorithm, step by step.
        for z_sorted_item, noise_rank, noise in plan:
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
