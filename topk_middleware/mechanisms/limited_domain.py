"""Limited-domain top-k (Durfee & Rogers 2019, Algorithm 1 LimitDom^{k, k_bar}): sorted access only.

Only the true top k_bar + 1 rows are read (k_bar + 1 sorted accesses, no random access):
    h_bot = h_(k_bar+1) + 1 + ln(min{Delta, k_bar} / delta) / epsilon
    v_bot = h_bot + Gumbel(1/epsilon),   v_j = h_(j) + Gumbel(1/epsilon) for j <= k_bar;
the items whose noisy value beats v_bot are released in noisy order, at most k of them. When
fewer than k beat it, they are followed by the bottom symbol: `bottom=True` and fewer items.
Delta is the restricted sensitivity (a client changes at most Delta counts, each by at most 1);
None means unrestricted. The paper prints min{Delta, k_bar, d - k_bar}; with an unknown domain d
we use min{Delta, k_bar}, never smaller, hence never a weaker threshold.

Privacy (Theorem 1): (eps', delta + delta')-DP for every delta' >= 0 with
eps' = min{k eps, k eps (e^eps - 1)/(e^eps + 1) + eps sqrt(2k ln(1/delta')),
           k eps^2/2 + eps sqrt(k ln(1/delta')/2)}   (accounting.limited_domain_epsilon).
Outside the delta event it is k steps of an eps-range-bounded exponential mechanism, which is
what pay-what-you-get composition (Theorem 2, pay_what_you_get.py) and Lemma 4.4 build on.

Resolution: counts are read as min(count, B), B = privacy.score_bound(1/epsilon), as for
private_top_k: above B a double cannot resolve the noise (or the threshold's +1), and clamping
keeps the neighbour relation (monotone, 1-Lipschitz), so the theorems hold for what is read.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ..access import CountedAccess, Source
from ..accounting import (
    MechanismResult,
    PrivacyBudget,
    PrivacyCost,
    charge,
    limited_domain_epsilon,
    record,
)
from ..privacy import (
    PrivacyGuarantee,
    bound_text,
    check_neighbours,
    require_unit_sensitivity,
    score_bound,
)
from ..randomness import make_rng
from ..release_keys import keyable
from ..validation import check_common


def check_limited_domain(
    k: int, k_bar: int, epsilon: float, delta: float, sensitivity: int | None
) -> None:
    """Refuse bad parameters of Algorithm 1 before anything is read."""
    check_common(k, epsilon, delta)
    if isinstance(k_bar, bool) or not isinstance(k_bar, numbers.Integral):
        raise TypeError(f"k_bar must be an integer, got {k_bar!r}")
    if k_bar < k:
        raise ValueError(f"k_bar must be >= k (Algorithm 1 reads the top k_bar), got {k_bar} < {k}")
    if delta <= 0.0:
        raise ValueError(f"delta must be in (0, 1) for the limited-domain threshold, got {delta}")
    if sensitivity is not None:
        if isinstance(sensitivity, bool) or not isinstance(sensitivity, numbers.Integral):
            raise TypeError(f"sensitivity must be a positive integer or None, got {sensitivity!r}")
        if sensitivity < 1:
            raise ValueError(f"sensitivity must be >= 1, got {sensitivity}")


def threshold_offset(k_bar: int, epsilon: float, delta: float, sensitivity: int | None) -> float:
    """h_bot - h_(k_bar+1) = 1 + ln(min{Delta, k_bar} / delta) / epsilon (Algorithm 1)."""
    limit = k_bar if sensitivity is None else min(int(sensitivity), k_bar)
    return 1.0 + math.log(limit / delta) / epsilon


def limited_domain_cost(
    k: int, epsilon: float, delta: float, delta_prime: float = 0.0
) -> PrivacyCost:
    """The guarantee of one call of Algorithm 1 (Durfee & Rogers 2019, Theorem 1)."""
    approx: tuple[tuple[float, float], ...] = ()
    if delta_prime > 0.0:
        approx = ((limited_domain_epsilon(k, epsilon, delta_prime), delta + delta_prime),)
    return PrivacyCost(
        mechanism="limited_domain",
        epsilon=k * epsilon,
        delta=delta,
        range_bounded=(epsilon,) * k,
        range_bounded_delta=2.0 * delta,
        approx=approx,
        sources=(
            "Durfee & Rogers 2019, Theorem 1: (k eps, delta)-DP; (eps', delta + delta')-DP",
            "range-bounded steps: Durfee & Rogers Lemmas 4.2-4.4 (proof of Theorems 1 and 2); "
            "composed with other releases a call adds 2 delta (Theorem 2)",
        ),
    )


@keyable
def limited_domain_top_k(
    source: Source,
    k: int,
    k_bar: int,
    epsilon: float,
    delta: float,
    *,
    sensitivity: int | None = None,
    delta_prime: float = 0.0,
    seed: int | None = None,
    budget: PrivacyBudget | None = None,
    neighbours: str = "add_remove",
) -> MechanismResult:
    """Durfee-Rogers Algorithm 1: at most k items, ranked, from k_bar + 1 sorted accesses.

    `epsilon` is the per-item Gumbel parameter (noise scale 1/epsilon); `delta` sets the
    threshold; `delta_prime` picks the point of Theorem 1 reported in `result.privacy`
    (0: the pure-composition form (k epsilon, delta)). Guarantees are for add/remove-one-client
    neighbours; "replace" is refused. `seed` is for tests only.
    """
    check_limited_domain(k, k_bar, epsilon, delta, sensitivity)
    check_neighbours(neighbours)
    require_unit_sensitivity(
        source, "limited_domain_top_k (Algorithm 1 of Durfee & Rogers: its threshold adds 1)"
    )
    if neighbours == "replace":
        raise ValueError(
            "limited_domain_top_k is calibrated for add/remove-one-client neighbours only (its "
            "threshold's delta assumes monotone counts: with the same threshold, replace-one "
            "neighbours need a larger delta); nothing was read or charged"
        )
    if not (0.0 <= delta_prime < 1.0):
        raise ValueError(f"delta_prime must be in [0, 1), got {delta_prime}")
    k, k_bar, epsilon, delta = int(k), int(k_bar), float(epsilon), float(delta)
    cost = limited_domain_cost(k, epsilon, delta, delta_prime)
    rng = make_rng(seed)
    bound = score_bound(1.0 / epsilon)  # the Gumbel scale; unit steps (checked above)
    with source.snapshot():
        access = CountedAccess(source)
        access.cap_scores(bound)
        if access.m <= k_bar:
            raise ValueError(
                f"k_bar = {k_bar} must be < m = {access.m}: Algorithm 1 reads the count of rank "
                "k_bar + 1"
            )
        charge(budget, cost)
        access.fetch_sorted_until(k_bar + 1)
        scores = np.array([access.sorted_access()[1] for _ in range(k_bar + 1)])
        noise = rng.gumbel(0.0, 1.0 / epsilon, k_bar + 1)
        v_bottom = (
            scores[k_bar] + threshold_offset(k_bar, epsilon, delta, sensitivity) + noise[k_bar]
        )
        noisy = scores[:k_bar] + noise[:k_bar]
        order = np.lexsort((np.arange(k_bar), -noisy))
        above = [int(r) for r in order if noisy[r] > v_bottom]
        ranks = above[:k]
        bottom = len(ranks) < k
        items = access.ids_at_depths(ranks)
    if delta_prime > 0.0:
        eps_report = limited_domain_epsilon(k, epsilon, delta_prime)
        how = f"Durfee & Rogers 2019, Theorem 1 at delta' = {delta_prime:g} (add/remove one client)"
    else:
        eps_report = k * epsilon
        how = "Durfee & Rogers 2019, Theorem 1 with delta' = 0 (add/remove one client)"
    guarantee = PrivacyGuarantee(
        eps_report,
        delta + delta_prime,
        "gumbel",
        1.0 / epsilon,
        f"{how}; {bound_text(bound)}",
        score_bound=bound,
    )
    result = MechanismResult(
        items,
        guarantee,
        access.stats,
        True,
        "limited_domain",
        access.m,
        bottom=bottom,
        k_chosen=k,
        cost=cost,
        details={"k_bar": k_bar},
    )
    return record(budget, result)
