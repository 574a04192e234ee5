"""The joint exponential mechanism for a top-k set (Gillenwater, Joseph, Munoz Medina, Ribero 2022).

One exponential mechanism over all k-subsets S of the m items (their Algorithm 1, JOINT). With
counts sorted c_(1) >= ... >= c_(m) and S's counts sorted s_(1) >= ... >= s_(k), the utility is
u(S) = -max_i (c_(i) - s_(i)) (their Lemma 5); every order statistic moves by at most 1 when a
client is added or removed, so u has sensitivity 1 and P(S) ~ exp(epsilon u(S) / 2) is
epsilon-DP (their Definition 3 and Theorem 8; McSherry & Talwar 2007). It is also
epsilon-range-bounded (Durfee & Rogers 2019, Lemma 4.3) and so epsilon^2/8-zCDP (Cesar & Rogers
2021). The output is an unordered set, released in random order.

Sampling (their Algorithm 1, lines 2-4), with exact integer counting instead of their FFT
products. A set meets "utility >= -t" iff its i-th best item has rank < b_i(t), where
b_i(t) = #{j : c_(i) - c_(j) <= t}; so N(t), the number of such sets, is the number of k-subsets
with |S cap [0, b_i)| >= i for every i. Cutting the ranks at the distinct b_i gives at most k+1
segments; a dynamic program over the segments with state "items chosen so far" counts them with
binomials (Python integers: the counts reach C(m, k)). U(t) = N(t) - N(t_prev) sets have utility
exactly -t; a threshold is drawn with weight U(t) exp(-epsilon t / 2), then a uniform set of that
utility: per-segment sizes by a backward pass of the same program (refined by the breakpoints of
t_prev, with a flag "still inside the t_prev sets"), then uniform ranks within each segment.
[Our reading: the indicator of their step 2b must be "<=", as here.]

Data access. Only thresholds t <= T = 2 (ln C(m, k) + 80) / epsilon are enumerated: every set of
larger |utility| has total weight below e^-80 of the true top-k set's. The cut does not change
the law: one uniform u picks the threshold, and if the enumerated mass cannot decide u whatever
the tail weighs, everything is read and enumerated (with the same u). The law is the mechanism's
up to the floating-point rounding of the weights exp(-epsilon t / 2); the counts are exact.
So the mechanism reads the sorted prefix down to the first count below c_(k) - T (sorted
accesses), plus the ids of the few ranks drawn beyond it (random accesses); the paper reads the
whole histogram. With many tied or nearly tied counts the prefix is long (a plateau: all of it).
"""

from __future__ import annotations

import bisect
import copy
import math
from dataclasses import dataclass

import numpy as np

from ..access import CountedAccess, Source, store_traits
from ..accounting import (
    MechanismResult,
    PrivacyBudget,
    PrivacyCost,
    charge,
    range_bounded_zcdp,
    record,
)
from ..interrupts import check as check_interrupts
from ..privacy import (
    PrivacyGuarantee,
    bound_text,
    check_neighbours,
    require_unit_sensitivity,
    score_bound,
)
from ..randomness import make_rng, randbelow
from ..release_keys import keyable
from ..validation import check_common, check_k_within

TAIL_LOG_MARGIN = 80.0  # enumerate until the rest weighs < e^-80 of the top-k set


# Work known to be excessive, refused before anything is charged, from public facts (k, m, the
# weight epsilon, whether the score column is an integer type). Exact counting costs one pass of
# the segment program per distinct threshold, measured (benchmarks/work_caps.py, m = 10^6 and
# 250,000, load average 22 on 2 cores) at about 2.5 us per (k + 1)^2 plus about 30 us: 35 us at
# k = 1, 0.54 ms at k = 16, 10.5 ms at k = 64. The distinct thresholds are the distinct gaps
# c_(i) - c_(j) up to the cut: at most k m, and for integer counts at most floor(cut) + 1. The
# gaps hold k m doubles (k m 8 bytes at worst), the set of distinct thresholds one Python float
# each.
JOINT_MAX_K = 64
JOINT_MAX_CELLS = 16_000_000  # k * m: 128 MiB of gaps at worst
JOINT_MAX_WORK = 2_500_000  # thresholds * ((k + 1)^2 + 12): about 6 s at the rate above


def joint_thresholds_bound(k: int, m: int, weight_epsilon: float, integer_scores: bool) -> float:
    """The most distinct thresholds the sampler enumerates (the comment above): k m, or for
    integer counts min(k m, floor(cut) + 1), cut = 2 (ln C(m, k) + TAIL_LOG_MARGIN) / eps."""
    if not integer_scores:
        return float(k * m)
    cut = 2.0 * (log_number_of_sets(m, k) + TAIL_LOG_MARGIN) / weight_epsilon
    return float(min(k * m, math.floor(cut) + 1))


def joint_work(k: int, m: int, weight_epsilon: float, integer_scores: bool) -> float:
    """The enumeration's worst-case work in the units of JOINT_MAX_WORK (the comment above)."""
    return joint_thresholds_bound(k, m, weight_epsilon, integer_scores) * ((k + 1) ** 2 + 12)


def smallest_joint_epsilon(k: int, m: int) -> float:
    """The least weight epsilon at which integer counts of m items pass the work cap at k."""
    thresholds = JOINT_MAX_WORK // ((k + 1) ** 2 + 12)
    return 2.0 * (log_number_of_sets(m, k) + TAIL_LOG_MARGIN) / (thresholds - 1) * (1 + 1e-9)


def check_joint_size(
    k: int,
    m: int | None = None,
    weight_epsilon: float | None = None,
    integer_scores: bool = False,
) -> None:
    """Refuse a joint_top_k whose worst-case work is excessive (JOINT_MAX_K, JOINT_MAX_CELLS,
    JOINT_MAX_WORK): from k alone, and with m and the weight epsilon (once m is known) before
    any charge; the message names k and epsilon only. The enumeration of the whole histogram
    that a draw needs with probability below e^-80 (sample_joint) is not bounded here."""
    if k > JOINT_MAX_K:
        raise ValueError(
            f"joint_top_k with k = {k} is too much work (exact counting grows like k^3 per "
            f"threshold): at most k = {JOINT_MAX_K}; use private_top_k for larger k"
        )
    if m is None:
        return
    if k * m > JOINT_MAX_CELLS:
        raise ValueError(
            f"joint_top_k with k = {k} needs too much memory on this table (k times the number "
            f"of items above {JOINT_MAX_CELLS:,}); use a smaller k or private_top_k"
        )
    if weight_epsilon is not None:
        if joint_work(k, m, weight_epsilon, integer_scores) > JOINT_MAX_WORK:
            kind = "" if integer_scores else " (non-integer scores: every gap may be a threshold)"
            raise ValueError(
                f"joint_top_k with k = {k} is too much work on this table at this epsilon"
                f"{kind}: use a smaller k, a larger epsilon or private_top_k"
            )


def joint_cost(epsilon: float) -> PrivacyCost:
    """The guarantee of joint_top_k, from its parameters alone."""
    return PrivacyCost(
        mechanism="joint",
        epsilon=epsilon,
        range_bounded=(epsilon,),
        rho=range_bounded_zcdp(epsilon),
        sources=(
            "pure: Gillenwater et al. 2022, Theorem 8 (EM, sensitivity 1, exp(eps u / 2))",
            "range-bounded: Durfee & Rogers 2019, Lemma 4.3 (EM with eps/2 is eps-range-bounded)",
            "zCDP: Cesar & Rogers 2021, Lemma 17",
        ),
    )


# ----- exact counting --------------------------------------------------------------------------
class _Gaps:
    """gap_i(j) = c_i - c_j for i < k over the first `limit` ranks (counts descending).

    Float subtraction is monotone, so gap_i is non-decreasing in j and the same expression
    defines both the utility and the bounds b_i(t) = #{j : gap_i(j) <= t}. Ranks >= limit are
    known to have gap_i > every threshold asked for.
    """

    def __init__(self, counts: np.ndarray, d: int, k: int, limit: int) -> None:
        self.d, self.k = d, k
        self.rows = [counts[i] - counts[:limit] for i in range(k)]

    def bounds(self, t: float) -> list[int]:
        check_interrupts()
        return [int(np.searchsorted(row, t, side="right")) for row in self.rows]

    def values(self, cut: float) -> list[float]:
        found: set[float] = set()
        for i, row in enumerate(self.rows):
            check_interrupts()
            tail = row[i:]
            found.update(tail[tail <= cut].tolist())
        return sorted(found)


def _segments(d: int, constraint_sets: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Segment ends (sorted, last = d) and, per constraint system, the minimum number of chosen
    items required within [0, end) at each end (0 where the system has no breakpoint)."""
    ends = sorted({b for bounds in constraint_sets for b in bounds} | {d})
    needs = []
    for bounds in constraint_sets:
        need = [0] * len(ends)
        for i, b in enumerate(bounds):
            pos = bisect.bisect_left(ends, b)
            need[pos] = max(need[pos], i + 1)
        needs.append(need)
    return ends, needs


def _count(d: int, k: int, bounds: list[int]) -> int:
    """The number of k-subsets S of [0, d) with |S cap [0, bounds[i])| >= i + 1 for every i."""
    ends, (need,) = _segments(d, [bounds])
    ways = [1] + [0] * k
    start = 0
    for end, req in zip(ends, need, strict=True):
        check_interrupts()
        length = end - start
        new = [0] * (k + 1)
        for n, w in enumerate(ways):
            if w:
                for x in range(0, min(k - n, length) + 1):
                    new[n + x] += w * math.comb(length, x)
        ways = [w if n >= req else 0 for n, w in enumerate(new)]
        start = end
    return ways[k]


def count_sets(counts: np.ndarray, k: int, t: float) -> int:
    """N(t): the number of k-subsets of the histogram `counts` with utility >= -t."""
    d = len(counts)
    return _count(d, k, _Gaps(np.asarray(counts, dtype=np.float64), d, k, d).bounds(t))


def _sample_exact_set(
    gaps: _Gaps,
    t: float,
    t_prev: float | None,
    rng: np.random.Generator,
) -> list[int]:
    """A uniform k-subset (ranks) with utility exactly -t: inside the t sets, outside t_prev's."""
    d, k = gaps.d, gaps.k
    systems = [gaps.bounds(t)]
    if t_prev is not None:
        systems.append(gaps.bounds(t_prev))
    ends, needs = _segments(d, systems)
    need_t = needs[0]
    need_p = needs[1] if t_prev is not None else [0] * len(ends)
    initial = {(0, t_prev is not None): 1}
    # tables[s][(n, inside_prev)] = ways to fill segments 0..s meeting the t constraints
    tables: list[dict[tuple[int, bool], int]] = []
    state = initial
    start = 0
    for s, end in enumerate(ends):
        check_interrupts()
        length = end - start
        new: dict[tuple[int, bool], int] = {}
        for (n, inside), w in state.items():
            for x in range(0, min(k - n, length) + 1):
                chosen = n + x
                if chosen < need_t[s]:
                    continue
                key = (chosen, inside and chosen >= need_p[s])
                new[key] = new.get(key, 0) + w * math.comb(length, x)
        tables.append(new)
        state = new
        start = end
    current = (k, False)
    if tables[-1].get(current, 0) == 0:
        raise AssertionError("no set has the drawn utility")  # U(t) > 0 was checked
    sizes = [0] * len(ends)
    for s in range(len(ends) - 1, -1, -1):
        check_interrupts()
        length = ends[s] - (ends[s - 1] if s else 0)
        n, inside = current
        previous = tables[s - 1] if s else initial
        options: list[tuple[tuple[int, bool], int, int]] = []
        for (pn, pinside), w in previous.items():
            x = n - pn
            if 0 <= x <= length and (pinside and n >= need_p[s]) == inside and n >= need_t[s]:
                options.append(((pn, pinside), x, w * math.comb(length, x)))
        pick = randbelow(rng, sum(weight for _, _, weight in options))
        for prev_state, x, weight in options:
            if pick < weight:
                sizes[s], current = x, prev_state
                break
            pick -= weight
    ranks: list[int] = []
    start = 0
    for end, x in zip(ends, sizes, strict=True):
        if x:
            ranks.extend((start + rng.choice(end - start, size=x, replace=False)).tolist())
        start = end
    return sorted(ranks)


@dataclass(frozen=True)
class _Thresholds:
    values: list[float]  # distinct t, ascending
    log_weights: list[float]  # ln(U(t)) - epsilon t / 2 (-inf when U(t) = 0)
    cumulative: list[int]  # N(t)


def _thresholds(gaps: _Gaps, epsilon: float, cut: float) -> _Thresholds:
    ordered = gaps.values(cut)
    cumulative = [_count(gaps.d, gaps.k, gaps.bounds(t)) for t in ordered]
    log_w = []
    previous = 0
    for t, n in zip(ordered, cumulative, strict=True):
        u = n - previous
        log_w.append(math.log(u) - epsilon * t / 2.0 if u > 0 else -math.inf)
        previous = n
    return _Thresholds(ordered, log_w, cumulative)


def _pick(log_w: list[float], log_tail: float, u: float) -> int | None:
    """The first index whose cumulative weight exceeds u Z, where Z = W + (unknown tail <= R):
    found only if it is the same for every tail in [0, R]; else None."""
    top = max(log_w)
    weights = [math.exp(w - top) for w in log_w]
    total = sum(weights)
    tail = math.exp(log_tail - top) if log_tail > -math.inf else 0.0
    low, high = u * total, u * (total + tail)
    running = 0.0
    for i, w in enumerate(weights):
        running += w
        if running > low:
            return i if running > high else None
    return None


def log_number_of_sets(d: int, k: int) -> float:
    return math.lgamma(d + 1) - math.lgamma(k + 1) - math.lgamma(d - k + 1)


def sample_joint(
    counts: np.ndarray,
    d: int,
    k: int,
    epsilon: float,
    rng: np.random.Generator,
    *,
    margin: float = TAIL_LOG_MARGIN,
) -> list[int] | None:
    """Ranks of a k-set drawn from the joint EM over a histogram of d items, or None when the
    draw needs counts beyond the sorted prefix `counts` (then call again with all d counts and
    a generator in the same state: the draw is the same u).

    `counts` must contain every count >= c_(k) - cut, where cut = 2 (ln C(d, k) + margin) / eps,
    or be the whole histogram.
    """
    counts = np.asarray(counts, dtype=np.float64)
    complete = len(counts) == d
    cut = 2.0 * (log_number_of_sets(d, k) + margin) / epsilon
    u = float(rng.random())
    last = counts[k - 1] - counts
    limit = int(np.searchsorted(last, cut, side="right"))
    if limit == len(counts) and not complete:
        raise ValueError("the prefix does not reach below c_(k) - cut")
    gaps = _Gaps(counts, d, k, limit)
    table = _thresholds(gaps, epsilon, cut)
    rest = math.comb(d, k) - table.cumulative[-1]
    log_tail = math.log(rest) - epsilon * cut / 2.0 if rest > 0 else -math.inf
    index = _pick(table.log_weights, log_tail, u)
    if index is None:
        if not complete:
            return None
        gaps = _Gaps(counts, d, k, d)
        table = _thresholds(gaps, epsilon, math.inf)
        index = _pick(table.log_weights, -math.inf, u)
        if index is None:
            raise AssertionError("the full enumeration always decides")
    t = table.values[index]
    t_prev = table.values[index - 1] if index > 0 else None
    return _sample_exact_set(gaps, t, t_prev, rng)


def _positions_of(access: CountedAccess, ranks: list[int], rng: np.random.Generator) -> list[int]:
    """The positions of drawn ranks; one random access for each beyond the sorted prefix.

    Ranks beyond the prefix all fall in the last segment of the draw, whose items are chosen
    uniformly (_sample_exact_set): any uniform choice of unread items has the same law. Where
    positions are ranks that choice is the drawn ranks; otherwise it is uniform positions not in
    the prefix.
    """
    fetched = access.prefix_fetched
    prefix = access.prefix_positions()
    beyond = [i for i, r in enumerate(ranks) if r >= fetched]
    positions = [int(prefix[r]) if r < fetched else int(r) for r in ranks]
    if not access.ranked and beyond:
        unread = np.setdiff1d(np.arange(access.m, dtype=np.int64), prefix)
        drawn = rng.choice(unread, size=len(beyond), replace=False)
        for i, p in zip(beyond, drawn.tolist(), strict=True):
            positions[i] = int(p)
    for i in beyond:
        access.random_access(positions[i])  # the id of a drawn item beyond the prefix
    return positions


@keyable
def joint_top_k(
    source: Source,
    k: int,
    epsilon: float,
    seed: int | None = None,
    *,
    budget: PrivacyBudget | None = None,
    neighbours: str = "add_remove",
) -> MechanismResult:
    """An unordered private top-k set from the joint exponential mechanism, pure epsilon-DP for
    add/remove-one-client neighbours (u moves by at most 1). `neighbours="replace"`: u moves by
    at most 2 (c_(i) and s_(i) each by 1, in either direction), so the weights are
    exp(epsilon u / 4): the same epsilon (McSherry & Talwar, sensitivity 2). The items come in a
    fresh random order. `seed` is for tests only."""
    check_common(k, epsilon, 0.0)
    check_neighbours(neighbours)
    require_unit_sensitivity(source, "joint_top_k (the joint exponential mechanism)")
    k, epsilon = int(k), float(epsilon)
    check_joint_size(k)
    cost = joint_cost(epsilon)
    weight_epsilon = epsilon / 2.0 if neighbours == "replace" else epsilon
    rng = make_rng(seed)
    saved = copy.deepcopy(rng)  # the same u again if the whole histogram must be read
    bound = score_bound(1.0 / weight_epsilon)  # weights exp(eps u): resolved to 2^-10
    with source.snapshot():
        access = CountedAccess(source, rng=rng)
        access.cap_scores(bound)
        m = access.m
        check_k_within(k, m)
        check_joint_size(k, m, weight_epsilon, store_traits(source).integer_scores)
        charge(budget, cost)
        cut = 2.0 * (log_number_of_sets(m, k) + TAIL_LOG_MARGIN) / weight_epsilon
        # Sorted accesses until a count falls below c_(k) - cut (or the end of the domain): the
        # depth of the first such count is found in each fetched block at once, and exactly the
        # accesses up to it are counted.
        taken = 0
        block = 2 * k
        while taken < m:
            check_interrupts()
            access.fetch_sorted_until(taken + block)
            fetched = access.prefix_scores()
            if len(fetched) >= k:
                start = max(taken, k)
                below = np.flatnonzero(fetched[k - 1] - fetched[start:] > cut)
                if len(below):
                    access.charge(start + int(below[0]) + 1 - taken, 0)
                    taken = start + int(below[0]) + 1
                    break
            access.charge(len(fetched) - taken, 0)
            taken = len(fetched)
            block *= 2
        scores = access.prefix_scores()[:taken].copy()
        ranks = sample_joint(scores, m, k, weight_epsilon, rng)
        if ranks is None:
            # The tail could matter for this draw: read everything and draw again (same u).
            access.fetch_sorted_until(m)
            access.charge(m - taken, 0)
            scores = access.prefix_scores()[:m].copy()
            rng = saved
            ranks = sample_joint(scores, m, k, weight_epsilon, rng)
            assert ranks is not None
        positions = _positions_of(access, ranks, rng)
        order = rng.permutation(len(positions))
        items = access.ids_of([positions[i] for i in order])
    guarantee = PrivacyGuarantee(
        epsilon,
        0.0,
        "exponential",
        2.0 / weight_epsilon,
        f"Gillenwater et al. 2022, Theorem 8 ({neighbours.replace('_', '/')} one client); "
        f"{bound_text(bound)}",
        score_bound=bound,
    )
    result = MechanismResult(
        items, guarantee, access.stats, False, "joint", m, k_chosen=k, cost=cost
    )
    return record(budget, result)
