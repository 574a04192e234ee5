"""The private threshold algorithm (Wu, Ohrimenko, Wirth 2023, Algorithm 3), batched.

TA runs on two lists: L1 = the data store (through CountedAccess) and L2 = a noise list, with the
aggregate f(i) = h[i] + Z_i. Its output is exactly the top-k of h + Z (Algorithm 2's distribution)
and its expected cost on L1 is at most 2 (sqrt(mk) + sqrt(m/2)) (Theorem 4.2).

Batching. Step s of the sequential algorithm makes one sorted access to each list, learns the noise
of the L1 item (random access to L2) and the score of the L2 item (random access to L1, unless
already seen). Which items a step touches depends only on the positions sorted access returns and
on the noise list, never on scores (where positions are ranks, not even on the data); only *when
it stops* depends on the scores. So a block of steps is run in three phases:
plan (ask the noise list, see NoisePlan), fetch (one batch of sorted rows and one of random
rows from the store), evaluate (the sequential stopping rule, step by step). The answer and the
access counts are those of the sequential algorithm; only rows_fetched and round_trips change.
Blocks grow geometrically, so a run makes O(log(steps)) round trips and fetches < growth x the rows
it uses.

Block-max pruning. Scores are non-increasing along ranks, so where positions are ranks every known
score bounds the unread ones (CountedAccess.score_bounds: the prefix, the rows read, the zone map);
where they are not (live tables, a pending delta) an unread item lies deeper than the fetched
prefix, so its score is at most the prefix's last (TA's own bound). The value f = h + Z of an L2
item lies in [lower + Z, upper + Z]. Counting L2 items at their lower (upper) values gives
reaching_lo(s) <= reaching(s) <= reaching_hi(s), each non-decreasing in s for the reason reaching is
(_Steps.first_stop). So the stop step S lies in first .. latest, the first steps with reaching_hi >=
k and reaching_lo >= k. An unread item changes reaching(s) only if its interval straddles tau[s];
reading those for s in first .. latest - 1 makes reaching exact there, so S is the step the unpruned
run finds. At S, k seen items have f > tau[S] (the stop) and k have f >= L (the k-th best lower
value), so an item with f < max(tau[S], L) is strictly below the k-th best and out of the top-k
whatever the ties: the top-k of the other items, in order, is the unpruned one.

Ties. The run stops when k seen items have f strictly above tau (not TA's >=): an unseen item has
f <= tau, so it cannot tie the k-th best, and the release is the top-k of h + Z with the one-shot's
rule for equal values (smaller position first) exactly, also where rounding makes values equal
(scores near the score bound, privacy.score_bound). One batch reads both
kinds for every possible S (tau is non-increasing, L non-decreasing in s); bounds only tighten as
rows are read, so the block is then decided. The release (hence Theorem 4.1's law) and the
sequential access counts are exactly those of the unpruned run for every noise draw; only
rows_fetched and round_trips change, and random accesses settled without a row are counted as
rows_bounded. Before that batch, the runs or the zone map may be read first
(CountedAccess.tighten_bounds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..access import CountedAccess
from ..interrupts import check as check_interrupts
from ..noise_list import NoiseList
from .oneshot import top_k_ranks

# Up to this many steps, `_Steps.first_stop` counts reaching(s) for every step at once (an
# n x n comparison) instead of per probe of its binary search.
REACHING_TABLE_MAX = 128


@dataclass(frozen=True)
class Batching:
    """Block sizes of the batched run: first block `first` steps, then x `growth`.

    The default first block is 2k steps: TA cannot stop before k steps, and on skewed data it
    stops right after them, so 2k usually ends a run in one block (3 round trips in all).
    `jump_to` makes the second block end at that step (a store where a batch of random reads
    costs one scan whatever its size could want fewer, larger batches). It is not the
    default anywhere: with block-max pruning a block reads random rows only for the items its
    bounds cannot settle, and planning a step of the noise list costs Python ~2-3 us, so the
    doubling blocks won on every store measured (a plateau at m = 10^7 with a pending DuckDB
    delta: 29 ms against 38 ms with a jump to 1.25 sqrt(mk); 57 ms with a jump to
    Theorem 4.2's bound 2 (sqrt(mk) + sqrt(m/2)), 24,472 steps planned for a run that stopped
    near 10^4).
    """

    first: int | None = None
    growth: float = 2.0
    jump_to: int | None = None  # after the first block, one block up to this many steps

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
        size = float(self.first or 2 * k)
        if self.jump_to is not None:
            first = max(1, int(size))
            yield first
            size = max(float(self.jump_to - first), size * self.growth)
        while True:
            yield max(1, int(size))
            size *= self.growth


DEFAULT_BATCHING = Batching()


class NoisePlan:
    """What the noise list answers at steps 0, 1, 2, ... of Algorithm 3, drawn ahead in chunks.

    Step s needs the noise of the item at depth s (random access to L2) and the next item of L2
    with its noise (sorted access). The plan draws them for a whole chunk of steps with the noise
    list's batched calls: first the chunk's sorted accesses, then the noises of the positions at
    its depths (fetching those rows first where positions are not ranks). Any order of calls
    samples the exact joint law of the noise list (Algorithm 4 samples each value from its
    conditional law given the others), and the chunks are a fixed function of k, so the plan,
    hence the answer for one seed, does not depend on how the store is batched. The chunks are
    the default Batching's blocks, so a run with the default batching plans no step it does not
    fetch.
    """

    def __init__(self, noise_list: NoiseList, k: int, access: CountedAccess) -> None:
        self.noise_list = noise_list
        self.access = access
        self.noise_at_depth = np.empty(0)  # step s: the noise of the item at depth s
        self.l2_position = np.empty(0, dtype=np.int64)  # step s: the item at place s of L2 ...
        self.l2_noise = np.empty(0)  # ... and its noise
        self._chunks = DEFAULT_BATCHING.blocks(k)

    def __len__(self) -> int:
        return len(self.l2_position)

    def extend_to(self, end: int) -> None:
        """Make sure steps 0 .. end - 1 are planned."""
        m = self.access.m
        end = min(end, m)
        while len(self) < end:
            start = len(self)
            count = min(next(self._chunks), m - start)
            positions, noises = self.noise_list.next_sorted_batch(count)
            if self.access.ranked:
                at_depths = np.arange(start, start + count, dtype=np.int64)
            else:
                self.access.fetch_sorted_until(start + count)
                at_depths = self.access.prefix_positions()[start : start + count]
            own = self.noise_list.noises_of(at_depths)
            self.l2_position = np.concatenate(
                [self.l2_position, np.asarray(positions, dtype=np.int64)]
            )
            self.l2_noise = np.concatenate([self.l2_noise, np.asarray(noises, dtype=float)])
            self.noise_at_depth = np.concatenate([self.noise_at_depth, np.asarray(own, float)])


@dataclass(frozen=True)
class _Steps:
    """Steps 0 .. n-1 of Algorithm 3 seen all at once (arrays indexed by step s).

    At step s the run has seen the items at depths 0..s (sorted access on the store) and the items
    L2 served at steps 0..s; item l2_position[t] needed a random access iff sorted access had not
    reached it before, i.e. iff its depth l2_depth[t] > t. tau[s] = h[s] + l2_noise[s] is TA's
    threshold. The value h + Z of such an item is known to lie in [l2_low[t], l2_high[t]]
    (equal where its score is known; block-max pruning, module docstring).
    """

    own_position: np.ndarray  # the position of the item at depth s
    own_value: np.ndarray  # h + Z of the item at depth s
    l2_position: np.ndarray
    l2_depth: np.ndarray  # depth of the L2 item of step s (m where beyond the fetched prefix)
    l2_low: np.ndarray  # bounds on h + Z of the L2 item of step s (-inf where already seen)
    l2_high: np.ndarray
    l2_unread: np.ndarray  # whether the L2 item of step s needs a random access not yet made
    tau: np.ndarray

    @classmethod
    def gather(cls, access: CountedAccess, plan: NoisePlan, n: int) -> _Steps:
        h = access.prefix_scores()[:n]
        l2_position, l2_noise = plan.l2_position[:n], plan.l2_noise[:n]
        l2_depth = access.depths_of(l2_position)
        new = l2_depth > np.arange(n)
        lower, upper = access.score_bounds(l2_position[new])
        l2_low, l2_high = np.full(n, -np.inf), np.full(n, -np.inf)
        l2_low[new], l2_high[new] = lower + l2_noise[new], upper + l2_noise[new]
        l2_unread = np.zeros(n, dtype=bool)
        l2_unread[new] = lower < upper
        own_position = access.prefix_positions()[:n]
        own_value = h + plan.noise_at_depth[:n]
        return cls(
            own_position, own_value, l2_position, l2_depth, l2_low, l2_high, l2_unread, h + l2_noise
        )

    def reaching(self, s: int, l2_value: np.ndarray) -> int:
        """How many items seen by step s have value > tau[s] (the run stops once it is >= k),
        with the L2 items valued at `l2_value` (l2_low or l2_high).

        Strictly above: an unseen item's value is at most tau[s] (its score and noise are at
        most those tau adds, and rounding to nearest is monotone), and may equal it, so only
        k items strictly above it make the top-k final under the one-shot's tie rule (equal
        values: the smaller position first). TA's own rule (>= tau) would miss an unseen item
        tying the k-th best at tau with a smaller position."""
        t = self.tau[s]
        own = np.count_nonzero(self.own_value[: s + 1] > t)
        only_l2 = (self.l2_depth[: s + 1] > s) & (l2_value[: s + 1] > t)
        return own + int(np.count_nonzero(only_l2))

    def _reaching_table(self, l2_value: np.ndarray) -> list[int] | None:
        """reaching(s) for every step s (the same counts), where there are at most
        REACHING_TABLE_MAX steps; kept per `l2_value` array. None beyond."""
        n = len(self.tau)
        if n > REACHING_TABLE_MAX:
            return None
        tables = self.__dict__.setdefault("_tables", {})  # frozen: not a field
        kept = tables.get(id(l2_value))
        if kept is not None and kept[0] is l2_value:
            return kept[1]
        steps = np.arange(n)
        seen = steps[None, :] <= steps[:, None]  # row s: the items seen by step s
        tau = self.tau[:, None]
        own = ((self.own_value[None, :] > tau) & seen).sum(axis=1)
        only_l2 = (self.l2_depth[None, :] > steps[:, None]) & (l2_value[None, :] > tau) & seen
        table = (own + only_l2.sum(axis=1)).tolist()
        tables[id(l2_value)] = (l2_value, table)
        return table

    def first_stop(self, k: int, start: int, l2_value: np.ndarray) -> int | None:
        """The first step >= start at which reaching (with `l2_value`) is >= k, or None.

        reaching(s) never decreases: the seen set grows and tau never increases (h and L2 are
        both non-increasing), whatever fixed values the items have. So a binary search finds
        the step the sequential run stops at once the values it depends on are known.
        """
        last = len(self.tau) - 1
        if last < start:
            return None
        table = self._reaching_table(l2_value)
        if table is None:
            if self.reaching(last, l2_value) < k:
                return None
        elif table[last] < k:
            return None
        low, high = start, last
        while low < high:
            mid = (low + high) // 2
            reach = self.reaching(mid, l2_value) if table is None else table[mid]
            if reach >= k:
                high = mid
            else:
                low = mid + 1
        return low

    def to_read(self, k: int, start: int) -> np.ndarray:
        """The positions whose scores must be read before the stop step and the top-k are
        decided (module docstring); empty once they are.

        With `first` and `latest` the first steps >= start where reaching counted at upper and
        at lower values reaches k, the stop is in first .. latest. Reaching is undecided only
        at the steps first .. top (top = latest - 1, or the block's last step), through items
        whose bounds straddle tau at one of them; and at any stop <= last (latest, or the last
        step) an item below max(tau[last], the k-th best lower value at `first`) is out of the
        top-k. The rest need no read."""
        first = self.first_stop(k, start, self.l2_high)
        if first is None:
            return np.empty(0, dtype=np.int64)  # no stop in this block, whatever the scores
        latest = self.first_stop(k, start, self.l2_low)
        last = len(self.tau) - 1 if latest is None else latest
        top = last if latest is None else latest - 1
        steps = np.arange(last + 1)
        low, high = self.l2_low[: last + 1], self.l2_high[: last + 1]
        candidate = high >= max(self.tau[last], self.kth_low(k, first))
        if top >= first:  # reaching is undecided somewhere in first .. top
            straddle = (steps <= top) & (high > self.tau[top])
            candidate |= straddle & (low <= self.tau[np.maximum(steps, first)])
        return self.l2_position[: last + 1][self.l2_unread[: last + 1] & candidate]

    def kth_low(self, k: int, s: int) -> float:
        """The k-th largest lower value of the items seen by step s (-inf if fewer): no item
        whose value is below it can be in the top-k at s."""
        l2_only = self.l2_depth[: s + 1] > s
        values = np.concatenate([self.own_value[: s + 1], self.l2_low[: s + 1][l2_only]])
        if len(values) < k:
            return -np.inf
        return float(np.partition(values, len(values) - k)[len(values) - k])

    def top_k(self, k: int, stop: int) -> tuple[list[int], int, np.ndarray]:
        """Positions of the k best items seen by step `stop`, best first (ties: smaller
        position), the number of random accesses the sequential run made up to that step, and
        the positions of those settled by their bounds (unread, provably out of the top-k)."""
        l2_only = self.l2_depth[: stop + 1] > stop
        unread = self.l2_unread[: stop + 1]
        bar = max(self.tau[stop], self.kth_low(k, stop))
        if np.any(self.l2_high[: stop + 1][unread] >= bar):
            raise AssertionError("an unread item could still be in the top-k at the stop")
        l2_only &= ~unread
        positions = np.concatenate(
            [self.own_position[: stop + 1], self.l2_position[: stop + 1][l2_only]]
        )
        values = np.concatenate([self.own_value[: stop + 1], self.l2_low[: stop + 1][l2_only]])
        best = top_k_ranks(values, k, positions)
        random = int(np.count_nonzero(self.l2_depth[: stop + 1] > np.arange(stop + 1)))
        return positions[best].tolist(), random, self.l2_position[: stop + 1][unread]


def private_threshold_top_k(
    access: CountedAccess, noise_list: NoiseList, k: int, batching: Batching
) -> list[int]:
    """Algorithm 3: positions of the top-k items of h + Z, best first.

    Each block: plan (NoisePlan), fetch (the sorted prefix, one round trip), evaluate (TA's
    stopping rule over the steps so far, vectorised in _Steps). The block's L2 items beyond the
    prefix are bounded, not read, and only those that could change the stop or the top-k are
    read, in one round trip (block-max pruning, module docstring). The answer and the charged
    accesses are those of the sequential run.
    """
    m = access.m
    plan = NoisePlan(noise_list, k, access)
    start = 0
    for block in batching.blocks(k):
        check_interrupts()
        end = min(m, start + block)
        plan.extend_to(end)
        access.fetch_sorted_until(end)
        steps = _Steps.gather(access, plan, end)
        while len(need := steps.to_read(k, start)):
            if not access.tighten_bounds(len(need)):
                access.fetch_positions(need)
            steps = _Steps.gather(access, plan, end)
        stop = steps.first_stop(k, start, steps.l2_low)
        if stop is None and end < m:
            start = end
            continue
        positions, random, bounded = steps.top_k(k, end - 1 if stop is None else stop)
        access.settle_by_bounds(bounded)
        access.charge(
            sorted_count=(end if stop is None else stop + 1) - access.depth, random_count=random
        )
        return positions
    raise AssertionError("unreachable")
