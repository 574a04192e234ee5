"""Peeling: k sequential exponential-mechanism steps (Durfee & Rogers 2019, Section 4.1).

Step s draws one item among those not yet drawn with probability proportional to
exp((epsilon/k) h_i) (the exponential mechanism of their Definition 4.1 with quality h_i,
sensitivity 1), then removes it. The released list is ranked.

Privacy. The count quality is monotone (adding a client never lowers a count), so each step is
(epsilon/k)-DP (Durfee & Rogers 2019, Lemma 4.1) and (epsilon/k)-range-bounded (Lemma 4.3); the k
steps are epsilon-DP by basic composition (Dwork & Roth 2014, Theorem 3.16), tighter for
(epsilon', delta) by Lemma 4.4, and k (epsilon/k)^2/8 = epsilon^2/(8k)-zCDP (Cesar & Rogers 2021).
By Lemma 4.2 the output has the distribution of the one-shot Gumbel top-k with scale k/epsilon
(Wu et al. Algorithm 2), which the tests check; `peel` draws it that way, in one pass. Data access:
a full read (m sorted accesses); work O(m + k log k), memory a few arrays of m doubles.
"""

from __future__ import annotations

import numpy as np

from ..access import CountedAccess, Source
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
from ..randomness import make_rng
from ..release_keys import keyable
from ..validation import check_common, check_k_within

SOURCE = "Durfee & Rogers 2019, Section 4.1 (peeling EM), Lemmas 4.1-4.3; basic composition"


def peeling_cost(k: int, epsilon: float) -> PrivacyCost:
    """The guarantee of peeling_top_k, from its parameters alone."""
    step = epsilon / k
    return PrivacyCost(
        mechanism="peeling",
        epsilon=epsilon,
        range_bounded=(step,) * k,
        rho=k * range_bounded_zcdp(step),
        sources=(
            "pure: k steps of (eps/k)-DP EM (Durfee & Rogers Lemma 4.1), basic composition",
            "range-bounded: Durfee & Rogers Lemma 4.3 (monotone quality)",
            "zCDP: Cesar & Rogers 2021 Lemma 17, eta^2/8 per step, added",
        ),
    )


def peel(scores: np.ndarray, k: int, step_epsilon: float, rng: np.random.Generator) -> list[int]:
    """k exponential-mechanism draws without replacement, weights exp(step_epsilon * score): the
    ranked top-k of step_epsilon * score + standard Gumbel noise, which has exactly that law
    (Gumbel-max, Yellott 1977; Durfee & Rogers 2019, Lemma 4.2). One pass: m noises, a partial
    sort of the m perturbed logits and a sort of the k best, O(m + k log k) time and two arrays
    of m doubles; k sequential draws would cost k passes over m (k m: 82 s at k = 2,000,
    m = 10^6). Ties of the perturbed logits (probability 0) go to the smaller rank."""
    logits = np.asarray(scores, dtype=np.float64) * step_epsilon
    noisy = logits + rng.gumbel(size=len(logits))
    check_interrupts()
    best = np.argpartition(-noisy, k - 1)[:k] if k < len(noisy) else np.arange(len(noisy))
    order = np.lexsort((best, -noisy[best]))
    return [int(i) for i in best[order]]


# The most items one peeling releases (refused before anything is charged): the release of k
# ids costs about 6 us an item in Python (6.2 s and 257 MiB at k = m = 10^6, measured by
# benchmarks/work_caps.py at load average 22); 100,000 stays within a second.
PEELING_MAX_K = 100_000


def check_peeling_size(k: int) -> None:
    """Refuse a peeling_top_k of more than PEELING_MAX_K items, from k alone."""
    if k > PEELING_MAX_K:
        raise ValueError(
            f"peeling_top_k releases at most {PEELING_MAX_K:,} items (k = {k}): use a smaller k "
            "or private_top_k"
        )


@keyable
def peeling_top_k(
    source: Source,
    k: int,
    epsilon: float,
    seed: int | None = None,
    *,
    budget: PrivacyBudget | None = None,
    neighbours: str = "add_remove",
) -> MechanismResult:
    """Ranked private top-k by k sequential exponential-mechanism steps, pure epsilon-DP for
    add/remove-one-client neighbours (monotone counts, Lemma 4.1). `neighbours="replace"`:
    weights exp(epsilon h / (2k)), each step (epsilon/k)-DP and -range-bounded for a non-monotone
    quality (Lemmas 4.1, 4.3): the same guarantee. `seed` is for tests only."""
    check_common(k, epsilon, 0.0)
    check_neighbours(neighbours)
    require_unit_sensitivity(source, "peeling_top_k")
    factor = 2.0 if neighbours == "replace" else 1.0
    k, epsilon = int(k), float(epsilon)
    check_peeling_size(k)
    cost = peeling_cost(k, epsilon)
    rng = make_rng(seed)
    bound = score_bound(factor * k / epsilon)  # logits resolved to 2^-10 (privacy.py)
    with source.snapshot():
        access = CountedAccess(source)
        access.cap_scores(bound)
        check_k_within(k, access.m)
        charge(budget, cost)
        rows = access.read_all()
        ranks = peel(rows.scores, k, epsilon / (factor * k), rng)
        items = access.ids_at_depths(ranks)
    guarantee = PrivacyGuarantee(
        epsilon,
        0.0,
        "exponential",
        factor * k / epsilon,
        f"{SOURCE} ({neighbours.replace('_', '/')} one client); {bound_text(bound)}",
        score_bound=bound,
    )
    result = MechanismResult(
        items, guarantee, access.stats, True, "peeling", access.m, k_chosen=k, cost=cost
    )
    return record(budget, result)
