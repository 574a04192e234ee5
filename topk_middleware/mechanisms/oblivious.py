"""Oblivious releases: the one-shot top-k read through an access pattern fixed by public facts.

Threat: a *server observer* (DESIGN invariant 12) sees what the store does for a release (rows
and buffers read, the number and shape of queries, parameter sizes, the wall time). The private
threshold algorithm (Wu, Ohrimenko, Wirth 2023, Algorithm 3) stops at a data-dependent depth, so
that transcript tells neighbouring tables apart. Here every read has a size fixed by
(m, k, delta_pad) and the wall time is padded to a deadline fixed by the store's cost model.

Algorithm (fixed depth d, two batches):

1. Draw the d largest of the m i.i.d. noises and the positions holding them (`top_noises`:
   exponential spacings, as the lazy noise oracle of Algorithm 4 draws them): by Lemma 4.1 of
   Wu et al. the set R of those positions is a uniformly random d-subset of 0..m-1, whatever
   the data.
2. Read the top d rows by sorted access (S: one batch of d rows) and the d rows at R (one batch
   of d rows; on a rank-ordered copy ranks of R below d are read again, so that the row count is
   2d exactly, not 2d minus an overlap that is a function of the noise). A store that finds
   positions only through a lookup per row (access.SortedIds: PostgreSQL's live tables) serves
   S without positions, and S and R are then matched by id.
3. If |S ∩ R| >= k: every item outside S ∪ R has score <= every item of S and noise < every noise
   of R, so its h + Z is below that of each of the >= k items of S ∩ R (continuous noise: noise
   ties have probability 0). The exact one-shot answer (top-k of h + Z, Algorithm 2) is therefore
   among S ∪ R; the noises of S \\ R are drawn i.i.d. conditioned below the d-th largest
   (`noises_below`), and the top-k of the candidates is released (ties: smaller position).
4. Otherwise (a *miss*) the whole table is read and the one-shot answer computed from the same
   noise: never a wrong answer, only an access pattern that differs. The miss is flagged in the
   operator's diagnostics.

Depth rule. |S ∩ R| ~ Hypergeometric(m, d, d) for every histogram (R is a uniform d-subset,
independent of S in law), so P(miss) = P(Hypergeom(m, d, d) < k) whatever the data; d is the
least depth with that probability <= delta_pad (`oblivious_depth`; about 2 sqrt(mk) for
delta_pad = 1e-9: 20,414 at m = 10^7, k = 10, below Theorem 4.2's expected-cost bound). When
2d >= m a full read (m rows, also fixed) is cheaper and is used. Where a store names its m items
by M > m position slots (access.PositionSlots: a DuckDB table after deletes), R is a uniform
d-subset of the M slots and d is chosen for M; S holds d rows only while d <= m, so the full
read is taken whenever 2d >= m (the live rows), and otherwise |S cap R| ~ Hypergeometric(M, d, d)
as above. (Comparing 2d with M instead would leave S with fewer than d rows on a table with few
live rows, and the miss far likelier than delta_pad.)

Guarantee (proof sketch). Let out be the released items: in every case the exact one-shot answer
for the drawn noise, so out is (eps, delta)-DP by Fact 3.3 / Fact 3.2 (privacy.calibrate). Let T
be the observable transcript (number, shape and row counts of the queries, parameter sizes, the
padded wall time). Off the miss event E, T = t0, a function of public facts; P(E) <= delta_pad
for every histogram. For neighbours h, h' and any set W of (transcript, release) pairs, with
W0 = {o : (t0, o) in W}:
    P[(T, out) in W | h] <= P[out in W0 | h] + P(E)
                         <= e^eps P[out in W0 | h'] + delta + delta_pad
                         <= e^eps (P[(T, out) in W | h'] + P(E)) + delta + delta_pad,
so the pair is (eps, delta + (1 + e^eps) delta_pad)-DP, eps the epsilon of everything the analyst
receives (with noisy counts: the selection's plus the counts'; oblivious_guarantee says which).
Assumptions: add/remove-one-client
neighbours (the calibration's), the observer sees sizes and times but not the values bound to
the queries (positions are bind parameters: the SQL functions pin the debug settings that would
print them), and the wall time stays under the deadline. A release whose work overruns its
deadline returns when the work ends: its wall time is then the work's own, which this guarantee
does not cover (the reads still are fixed); the overrun is counted (`deadline_misses`, the
release's diagnostics and, for the SQL functions, the ledger's log).

Not oblivious: mechanisms whose reads depend on the data by design (peeling and the joint
exponential mechanism read every item; limited_domain, stable and pay_what_you_get stop at a
data-dependent depth or read a data-dependent set; cost_aware chooses blocks from the scores
read). The in-store one-shot hashes a data-dependent number of rows (its cut). Those are refused
in oblivious mode.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from .. import interrupts
from ..access import CountedAccess, StoreCosts, run_traits, store_traits
from ..noise import NoiseDistribution
from ..privacy import PrivacyGuarantee
from .oneshot import top_k_ranks

# Mechanisms that cannot be made oblivious (module docstring): refused in oblivious mode.
NOT_OBLIVIOUS = ("peeling", "joint", "limited_domain", "stable", "pay_what_you_get", "cost_aware")

# The deadline: DEADLINE_MARGIN times the store's modelled cost of the release (ObliviousCosts),
# plus a floor (scheduling jitter of a loaded machine). The padding sleeps in slices of at most
# PAD_SLICE seconds and checks for interrupts after each (interrupts.py).
DEADLINE_MARGIN = 1.5
DEADLINE_FLOOR = 0.01
PAD_SLICE = 0.05

# miss_probability sums this many log1p terms at most (32 MB of float64); beyond, lgamma.
LOG1P_TERMS = 1 << 22


def check_delta_pad(delta_pad: Any) -> float:
    """delta_pad must be a number in (0, 1): the chance the access pattern departs from the one
    fixed by public facts."""
    if isinstance(delta_pad, bool) or not isinstance(delta_pad, int | float | np.floating):
        raise TypeError(f"delta_pad must be a number in (0, 1), got {delta_pad!r}")
    value = float(delta_pad)
    if not (0.0 < value < 1.0):
        raise ValueError(f"delta_pad must be in (0, 1), got {delta_pad!r}")
    return value


def miss_probability(m: int, k: int, d: int) -> float:
    """P(Hypergeometric(m, d, d) < k): the chance that fewer than k of the top-d rows by score
    are among the d positions holding the d largest noises (Lemma 4.1: a uniform d-subset).

    The sum of the probabilities of overlaps x = x0..k-1 (x0 = max(0, 2d - m), the least
    overlap), each from the one before by the ratio (d - x)^2 / ((x + 1)(m - 2d + x + 1)). The
    first, at x0 = 0 and d <= LOG1P_TERMS: the product over i < d of (m - d - i) / (m - i), a
    sum of log1p terms, each exact to an ulp (differences of lgamma near m lose digits: a
    relative 1e-6 at m = 1e10); else C(d, x0) C(m - d, d - x0) / C(m, d) from lgamma. Agrees
    with scipy.stats.hypergeom.cdf (tests/core/test_oblivious.py), which is not imported here:
    scipy.stats costs half a second of CPU in every process that releases, each PostgreSQL
    session of the SQL functions included."""
    if d >= m:
        return 0.0
    if d < k:  # the overlap is at most d
        return 1.0
    first = max(0, 2 * d - m)
    if first >= k:
        return 0.0
    if first == 0 and d <= LOG1P_TERMS:
        log_first = float(np.log1p(-d / (m - np.arange(d, dtype=np.float64))).sum())
    else:

        def log_choose(n: int, r: int) -> float:
            return math.lgamma(n + 1) - math.lgamma(r + 1) - math.lgamma(n - r + 1)

        log_first = log_choose(d, first) + log_choose(m - d, d - first) - log_choose(m, d)
    x = np.arange(first, k - 1, dtype=np.float64)
    log_ratios = 2.0 * np.log(d - x) - np.log(x + 1.0) - np.log(m - 2.0 * d + x + 1.0)
    logs = log_first + np.concatenate(([0.0], np.cumsum(log_ratios)))
    return min(1.0, float(np.exp(logs).sum()))


@lru_cache(maxsize=256)
def oblivious_depth(m: int, k: int, delta_pad: float) -> int:
    """The least d in [k, m] with P(Hypergeometric(m, d, d) < k) <= delta_pad (1 - 1e-6) (the
    margin covers miss_probability's rounding): the miss probability falls as d grows, so the
    depth doubles from k until it holds, then a binary search between the last two."""
    target = delta_pad * (1.0 - 1e-6)
    high = k
    while high < m and miss_probability(m, k, high) > target:
        high = min(m, 2 * high)
    low = max(k, high // 2)
    while low < high:
        mid = (low + high) // 2
        if miss_probability(m, k, mid) <= target:
            high = mid
        else:
            low = mid + 1
    return low


def oblivious_guarantee(
    base: PrivacyGuarantee, delta_pad: float, counts_epsilon: float = 0.0
) -> PrivacyGuarantee:
    """The guarantee of the release and its transcript: (eps, delta + (1 + e^eps) delta_pad)
    (module docstring), eps the whole release's: the selection's, plus `counts_epsilon` when
    noisy counts are released with it (the proof's middle step uses the DP of everything the
    analyst receives)."""
    whole = base.epsilon + counts_epsilon
    pad = (1.0 + math.exp(min(whole, 700.0))) * delta_pad
    which = (
        f"eps = {whole:.6g}, the whole release's (selection {base.epsilon:.6g} + counts "
        f"{counts_epsilon:.6g})"
        if counts_epsilon
        else f"eps = {whole:.6g}, the selection's"
    )
    return PrivacyGuarantee(
        base.epsilon,
        min(1.0, base.delta + pad),
        base.noise,
        base.scale,
        base.derivation
        + f"; oblivious access (fixed depth, Lemma 4.1 and a hypergeometric tail bound): the "
        f"release with the server's view of its reads is (eps, delta + (1 + e^eps) * delta_pad)"
        f"-DP with {which}, delta_pad = {delta_pad:g}",
        base.sensitivity,  # the source's: the scale above is that many unit scales
        base.counts_epsilon,
        base.counts_scale,
        base.score_bound,
    )


@dataclass(frozen=True)
class ObliviousCosts:
    """What an oblivious release costs on one store and mode, in seconds: its deadline's model.

    A release makes a fixed number of round trips (`fixed`: the snapshot, m, the pinned
    settings, the commit), reads d rows in score order (`sorted_row` each) and the d rows at the
    drawn positions (`random_row` each, plus `random_miss` for the share of them the store's
    cache cannot hold: 1 - cached_rows / m, a read from the operating system), or m rows once
    (`full_row` each, when 2d >= m), and reads `counts` exact counts of the winners (`count`
    each; the bound on drawing their noise, noisy_counts.counts_seconds, is added by the
    caller), plus `scan_row` per item of the domain where the batches scan the table or a
    column of it (no index serves them). Each row's cost includes the client's work on it.
    Stores give their own (`oblivious_costs` attribute): PostgreSQL copy and live tables,
    the SQL functions' SPI reads and DuckDB tables (copy and table) have theirs; a store
    without one gets `costs_from_store`."""

    fixed: float = 5e-3
    sorted_row: float = 2e-6
    random_row: float = 1e-5
    random_miss: float = 0.0
    cached_rows: float = math.inf
    full_row: float = 2e-6
    count: float = 3e-4
    scan_row: float = 0.0  # per item of the domain, where the release's batches scan it

    def seconds(self, m: int, d: int, counts: int = 0) -> float:
        """The modelled seconds of a release reading d rows of each list (a full read of m rows
        when 2d >= m) and releasing `counts` noisy counts."""
        if 2 * d >= m:
            reads = m * self.full_row
        else:
            cold = max(0.0, 1.0 - self.cached_rows / m)
            reads = d * (self.sorted_row + self.random_row + cold * self.random_miss)
            reads += m * self.scan_row
        return self.fixed + reads + counts * self.count


def costs_from_store(costs: StoreCosts) -> ObliviousCosts:
    """An ObliviousCosts from a store's StoreCosts (a store that gives no model of its own)."""
    return ObliviousCosts(
        fixed=6 * costs.round_trip + costs.random_batch,
        sorted_row=costs.sorted_row + 1e-6,
        random_row=costs.random_row + 1e-6,
        full_row=costs.full_read_row + 1e-6,
        scan_row=costs.random_batch_item,
    )


def source_oblivious_costs(source: Any) -> ObliviousCosts:
    """The source's own model (RunTraits.oblivious_costs), else one from its StoreCosts."""
    traits = run_traits(source)
    if isinstance(traits.oblivious_costs, ObliviousCosts):
        return traits.oblivious_costs
    return costs_from_store(traits.costs if traits.costs is not None else StoreCosts())


def check_read_size(source: Any, k: int, m: int, d: int) -> None:
    """Refuse, before anything is charged, a release that would read more rows than the store
    allows (StoreTraits.max_oblivious_rows: the SQL functions' SPI reads hold every row in the
    server process): ValueError naming k and the bound."""
    bound = store_traits(source).max_oblivious_rows
    if bound is not None and rows_read(m, d) > bound:
        raise ValueError(
            f"an oblivious top-{k} on this table would read {rows_read(m, d):,} rows, more than "
            f"the {bound:,} this store takes in one release: ask for a smaller k"
        )


def oblivious_deadline(costs: ObliviousCosts, m: int, d: int, counts: int = 0) -> float:
    """Seconds a release may take, from public facts only (m, d, the number of counts, the
    store's model): DEADLINE_MARGIN times the model, plus DEADLINE_FLOOR."""
    return DEADLINE_MARGIN * costs.seconds(m, d, counts) + DEADLINE_FLOOR


@dataclass
class DeadlineLog:
    """How many oblivious releases ran in this process, how many overran their deadline and by
    how much at most (an operator diagnostic: an overrun shows the observer the work's own
    time, which the guarantee does not cover; docs/oblivious.md)."""

    releases: int = 0
    missed: int = 0
    worst_overrun: float = 0.0  # seconds past the deadline, the largest seen
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, missed: bool, overrun: float = 0.0) -> None:
        with self.lock:
            self.releases += 1
            self.missed += int(missed)
            self.worst_overrun = max(self.worst_overrun, float(overrun))

    def as_dict(self) -> dict[str, float]:
        with self.lock:
            return {
                "releases": self.releases,
                "missed": self.missed,
                "worst_overrun": self.worst_overrun,
            }


DEADLINES = DeadlineLog()


def deadline_misses() -> dict[str, float]:
    """{"releases", "missed", "worst_overrun"}: oblivious releases of this process, how many
    overran their deadline, and the largest overrun in seconds."""
    return DEADLINES.as_dict()


def pad_to(started: float, deadline: float) -> tuple[float, bool]:
    """Sleep until `deadline` seconds after `started` (time.perf_counter), in slices of at most
    PAD_SLICE seconds with an interrupt check after each (a cancel is answered within about
    PAD_SLICE + interrupts.INTERVAL); (the seconds the work took, whether it overran)."""
    took = time.perf_counter() - started
    while True:
        left = started + deadline - time.perf_counter()
        if left <= 0:
            break
        time.sleep(min(left, PAD_SLICE))
        interrupts.check()
    return took, took > deadline


@dataclass(frozen=True)
class ObliviousRun:
    """What an oblivious run released (the items, best first, and their scores as read) and
    what it read and found (operator diagnostics)."""

    items: list[Any]
    scores: list[float]
    depth: int
    overlap: int
    missed: bool
    full_read: bool


def rows_read(m: int, d: int) -> int:
    """The rows an oblivious release reads besides its top row: 2d, or m when 2d >= m (a miss,
    of probability <= delta_pad, reads m more)."""
    return m if 2 * d >= m else 2 * d


def top_noises(
    distribution: NoiseDistribution, rng: np.random.Generator, m: int, d: int
) -> tuple[np.ndarray, np.ndarray, float]:
    """The d largest of m i.i.d. noises and the positions holding them, and the d-th largest's
    survival probability v_d. Survivals of the sorted noises are the smallest uniforms,
    V_(j) = S_j / (S_d + G) with S_j partial sums of d standard exponentials and G ~ Gamma(m + 1
    - d) (exponential spacings, as Algorithm 4 draws them); their positions are a uniformly
    random d-subset in random order, independent of the values (Lemma 4.1)."""
    sums = np.cumsum(rng.standard_exponential(d))
    v = sums / (sums[-1] + rng.standard_gamma(m + 1 - d))
    positions = rng.choice(m, size=d, replace=False, shuffle=True).astype(np.int64)
    return positions, np.asarray(distribution.from_survival(v), np.float64), float(v[-1])


def noises_below(
    distribution: NoiseDistribution, rng: np.random.Generator, v_d: float, size: int
) -> np.ndarray:
    """`size` i.i.d. noises conditioned below the d-th largest: given the top d, the others are
    i.i.d. from the law truncated to survival > v_d (order statistics of i.i.d. draws)."""
    return np.asarray(distribution.from_survival(v_d + (1.0 - v_d) * rng.random(size)), np.float64)


def oblivious_top_k(
    access: CountedAccess,
    distribution: NoiseDistribution,
    rng: np.random.Generator,
    k: int,
    delta_pad: float,
    full_read: bool = False,
) -> ObliviousRun:
    """The exact one-shot top-k (Algorithm 2) of h + Z read at a fixed depth (module docstring):
    the ids, best first (ties: smaller position). `full_read`: read every row whatever d.
    Positions are the access's slots (m, or more where a store names items by slots some of
    which hold none: access.PositionSlots); the depth is the slots', and the whole table (its m
    live rows) is read when 2d >= m, so that the top-d batch always holds d rows and the miss
    law is the one the depth was chosen for (module docstring, Depth rule)."""
    m = access.slots
    d = m if full_read else oblivious_depth(m, k, delta_pad)
    if 2 * d >= access.m:
        rows = access.read_all()
        positions = np.asarray(rows.positions, dtype=np.int64)
        noises = distribution.sample(rng, m)[positions]
        best = top_k_ranks(rows.scores + noises, k, positions)
        return ObliviousRun(
            _ids(np.asarray(rows.ids, object)[best]),
            np.asarray(rows.scores, np.float64)[best].tolist(),
            d,
            m,
            False,
            True,
        )
    top_positions, top_values, v_d = top_noises(distribution, rng, m, d)
    head = access.read_sorted_batch(d, positions=False)
    drawn = access.read_positions_batch(top_positions)
    head_positions = np.asarray(head.positions, dtype=np.int64)
    if len(head_positions) and head_positions[0] < 0:  # a SortedIds store: match by id
        in_top = np.isin(_id_keys(head.ids), _id_keys(drawn.ids))
        head_positions = m + np.arange(len(head_positions), dtype=np.int64)  # tie keys only
    else:
        in_top = np.isin(head_positions, top_positions, assume_unique=True)
    overlap = int(in_top.sum())
    order = np.argsort(top_positions)
    sorted_top = top_positions[order]
    if overlap >= k:
        # candidates: the d rows of R with their drawn noises, and the rows of S not in R
        drawn_positions = np.asarray(drawn.positions, dtype=np.int64)
        drawn_noises = top_values[order][np.searchsorted(sorted_top, drawn_positions)]
        rest = ~in_top
        # ties of h + Z (probability 0: continuous noise) go to the smaller key: positions for
        # the rows of R, and past every position, in sorted order, for the rows of S \ R
        positions = np.concatenate([drawn_positions, head_positions[rest]])
        scores = np.concatenate([drawn.scores, np.asarray(head.scores)[rest]]).astype(np.float64)
        ids = np.concatenate([np.asarray(drawn.ids, object), np.asarray(head.ids, object)[rest]])
        noises = np.concatenate(
            [drawn_noises, noises_below(distribution, rng, v_d, int(rest.sum()))]
        )
        best = top_k_ranks(scores + noises, k, positions)
        return ObliviousRun(_ids(ids[best]), scores[best].tolist(), d, overlap, False, False)
    # A miss (probability <= delta_pad, whatever the data): the full one-shot with the same
    # top noises, every other noise drawn below them.
    rows = access.read_all()
    positions = np.asarray(rows.positions, dtype=np.int64)
    by_position = noises_below(distribution, rng, v_d, m)
    by_position[top_positions] = top_values
    scores = np.asarray(rows.scores, np.float64)
    best = top_k_ranks(scores + by_position[positions], k, positions)
    return ObliviousRun(
        _ids(np.asarray(rows.ids, object)[best]), scores[best].tolist(), d, overlap, True, False
    )


def _id_keys(ids: Any) -> np.ndarray:
    """Ids as an array np.isin compares by value (integers as int64, anything else as text)."""
    values = np.asarray(ids)
    return values if values.dtype.kind in "iu" else np.asarray([str(v) for v in values.tolist()])


def _ids(values: np.ndarray) -> list[Any]:
    return [v.item() if isinstance(v, np.generic) else v for v in values.tolist()]
