"""A cost-aware private threshold algorithm: unequal costs of sorted and random access.

Wu, Ohrimenko, Wirth (ICML 2023) leave open (Section 7) what to do when sorted and random access
cost differently, as they do in every database: a sorted access is the next row of an index range
scan, a random access is an index probe. This module answers with the idea of Fagin, Lotem and
Naor's Combined Algorithm (CA, PODS 2001 / JCSS 2003, Section 8) applied to Algorithm 3:

* An item met on the noise list L2 is not completed by random access at once; it waits in a
  *pending* queue with its noise z and the upper bound  h_last + z  on its aggregate, where h_last
  is the last score seen under sorted access on the store (its own score can be no larger).
* It leaves the queue for free when sorted access on the store reaches it, or is *pruned* when its
  upper bound falls below the current k-th best aggregate: it cannot enter the top k, and its
  random access is skipped.
* Every floor(c_random / c_sorted) steps the pending item with the largest upper bound is completed
  by random access, so that expensive random accesses are traded for cheap sorted ones.
* It stops when k completed items reach the threshold tau = h_last + z_last (Algorithm 1's rule)
  and no pending item could still beat the k-th best. Those that could are either pruned by
  reading on in sorted order (h falls) or completed by random access, whichever the cost model
  says, decided online as in ski rental: read on until that has cost as much as completing them.

The result is the exact top-k of h + Z, as for Algorithm 3: every unseen item has aggregate
<= tau < the k-th best (the stop is strict: TopKTracker.done), every pruned item has aggregate
< the k-th best, so ties follow the one-shot's rule (the smaller position first). Pruning
compares noises with the k-th best minus the score; that difference is computed in doubles, so
the bound keeps a few ulps of slack (`_prune_bound`): an item pruned has h + Z, as rounded,
strictly below the k-th best. The noise-list calls of the first s steps are those of Algorithm
3, so with the same seed the answer is the same. It may run more steps than Algorithm 3, in
exchange for fewer random accesses; which is cheaper is what the cost model decides.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from sortedcontainers import SortedList

from ..access import AccessStats, CountedAccess
from ..interrupts import check as check_interrupts
from ..noise_list import NoiseList
from ..threshold import TopKTracker
from .threshold import Batching, NoisePlan


@dataclass(frozen=True)
class CostModel:
    """Modelled cost of reading a store: per sorted access, per random access, per round trip."""

    sorted: float = 1.0
    random: float = 1.0
    round_trip: float = 0.0

    def __post_init__(self) -> None:
        for name in ("sorted", "random", "round_trip"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"CostModel.{name} must be finite and >= 0, got {value}")
        if self.sorted <= 0:
            raise ValueError("CostModel.sorted must be > 0")

    @property
    def sorted_per_random(self) -> int:
        """How many steps (sorted accesses) one random access is worth: CA's period h."""
        return max(1, int(self.random // self.sorted))

    def cost(self, stats: AccessStats) -> float:
        """The modelled cost of a run: its accesses and its round trips."""
        return (
            self.sorted * stats.sorted
            + self.random * stats.random
            + self.round_trip * stats.round_trips
        )

    def batching(self, k: int, m: int) -> Batching:
        """The block schedule with the least modelled cost, averaged over where a run may stop.

        A run stops after S steps, S unknown; Theorem 4.2 bounds its mean by
        2 (sqrt(mk) + sqrt(m/2)), and it is at least k. Model S as log-uniform on that range; a
        schedule that has fetched F rows in B blocks when it stops costs about
        (c_sorted + c_random) F + 2 B c_round_trip. The grid below is small and the model cheap.
        """
        upper = max(k + 1.0, min(float(m), 2 * (math.sqrt(m * k) + math.sqrt(m / 2))))
        stops = np.geomspace(k, upper, 40)
        per_row = self.sorted + self.random
        best: tuple[float, Batching] | None = None
        for first_factor in (1, 2, 4, 8, 16, 32):
            for growth in (1.5, 2.0, 3.0, 4.0, 8.0):
                schedule = Batching(first=max(1, k * first_factor), growth=growth)
                total = 0.0
                for stop in stops:
                    fetched, blocks = _rows_and_blocks(schedule.blocks(k), stop, m)
                    total += per_row * fetched + 2 * blocks * self.round_trip
                if best is None or total < best[0]:
                    best = (total, schedule)
        assert best is not None
        return best[1]


def _rows_and_blocks(blocks: Iterator[int], stop: float, m: int) -> tuple[int, int]:
    fetched = count = 0
    for size in blocks:
        fetched = min(m, fetched + size)
        count += 1
        if fetched >= stop or fetched >= m:
            return fetched, count
    raise AssertionError("unreachable")


def _prune_bound(kth: float, score: float) -> float:
    """A noise z below this has fl(score + z) < kth (module docstring): kth - score, less four
    ulps of the larger operand (the rounding of the difference, of the sum, and their bound)."""
    gap = kth - score
    if not math.isfinite(gap):
        return gap
    return gap - 4.0 * math.ulp(max(abs(kth), abs(score)))


class _Pending:
    """Items met on L2 but not completed, ordered by decreasing noise (a SortedList)."""

    def __init__(self) -> None:
        self.noise: dict[int, float] = {}
        self._order = SortedList()  # (-z, position): the head has the largest noise

    def __len__(self) -> int:
        return len(self.noise)

    def add(self, position: int, z: float) -> None:
        self.noise[position] = z
        self._order.add((-z, position))

    def take(self, position: int) -> float:
        z = self.noise.pop(position)
        self._order.remove((-z, position))
        return z

    def head(self) -> tuple[int, float] | None:
        if not self._order:
            return None
        negative_z, position = self._order[0]
        return position, -negative_z

    def positions_from_head(self, count: int) -> list[int]:
        return [position for _, position in self._order.islice(0, count)]

    def count_at_least(self, bound: float) -> int:
        """How many pending items have noise z >= bound."""
        return self._order.bisect_right((-bound, math.inf))

    def prune(self, bound: float) -> None:
        """Drop the items whose noise z has h_last + z < k-th best, i.e. z < bound."""
        order = self._order
        while order and -order[-1][0] < bound:
            del self.noise[order.pop()[1]]


def cost_aware_threshold_top_k(
    access: CountedAccess,
    noise_list: NoiseList,
    k: int,
    batching: Batching,
    costs: CostModel,
) -> list[int]:
    """Algorithm 3 with deferred, pruned random accesses (module docstring): top-k positions."""
    m = access.m
    tracker = TopKTracker(k)
    seen: set[int] = set()
    pending = _Pending()
    period = costs.sorted_per_random
    since_random = 0
    closing_spent: float | None = None  # sorted-access cost spent since TA's rule first held
    start = 0

    def complete_head(count_hint: int, upcoming: list[int]) -> None:
        position, z = pending.head()  # type: ignore[misc]
        if not access.is_fetched(position):
            # One round trip for the completions expected next: the pending items nearest the
            # head, then the L2 items the block will meet.
            access.fetch_positions(
                (pending.positions_from_head(count_hint) + upcoming)[:count_hint]
            )
        pending.take(position)
        seen.add(position)
        tracker.offer(access.random_access(position) + z, position)

    noise_plan = NoisePlan(noise_list, k, access)
    for block in batching.blocks(k):
        end = min(m, start + block)
        noise_plan.extend_to(end)
        l2_positions = noise_plan.l2_position[start:end].tolist()
        plan = zip(
            noise_plan.noise_at_depth[start:end].tolist(),
            l2_positions,
            noise_plan.l2_noise[start:end].tolist(),
            strict=True,
        )
        access.fetch_sorted_until(end)
        for step, (z_sorted_item, noise_position, noise) in enumerate(plan):
            check_interrupts()
            position, score = access.sorted_access()
            if position in pending.noise:
                pending.take(position)  # completed for free by sorted access
            if position not in seen:
                seen.add(position)
                tracker.offer(score + z_sorted_item, position)
            bound = _prune_bound(tracker.kth(), score)  # pending noise below it: pruned
            if (
                noise_position not in seen
                and noise_position not in pending.noise
                and noise >= bound
            ):
                pending.add(noise_position, noise)  # (an arrival below the bound is pruned at once)
            pending.prune(bound)
            since_random += 1
            if closing_spent is None and since_random >= period and len(pending):
                rest = l2_positions[step:]
                complete_head(math.ceil(len(rest) / period) + 1, rest)
                since_random = 0
                pending.prune(_prune_bound(tracker.kth(), score))
            if closing_spent is None and tracker.done(score + noise):
                closing_spent = 0.0
            if closing_spent is not None:
                # TA's rule holds (and keeps holding: tau falls, the k-th best rises). What is
                # left are the pending items that could still beat the k-th best. Ski rental:
                # keep reading in sorted order, which prunes them as h falls, until that has
                # cost as much as completing them all by random access; then complete them.
                needed = pending.count_at_least(_prune_bound(tracker.kth(), score))
                if needed == 0:
                    return tracker.keys()
                if closing_spent >= needed * costs.random + costs.round_trip:
                    while (head := pending.head()) is not None and score + head[1] >= tracker.kth():
                        complete_head(needed, [])
                    return tracker.keys()
                closing_spent += costs.sorted
        start = end
        if start >= m:  # every item seen by sorted access: nothing is pending
            return tracker.keys()
    raise AssertionError("unreachable")
