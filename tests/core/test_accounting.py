"""The accountant's formulas against independent computations and Google's dp-accounting package,
and the budget's refusal of an over-budget release before any row is read."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
from scipy.optimize import minimize_scalar

from adapters.memory import ArraySource
from topk_middleware.access import Rows, StoreTraits
from topk_middleware.accounting import (
    DEFAULT_ORDERS,
    BudgetExceeded,
    PrivacyBudget,
    PrivacyCost,
    advanced_composition_epsilon,
    compose,
    composed_rdp_curve,
    gaussian_rdp,
    laplace_rdp,
    limited_domain_epsilon,
    oneshot_cost,
    pure_dp_rdp,
    range_bounded_composition_epsilon,
    rdp_to_dp_epsilon,
    zcdp_to_dp_epsilon,
)
from topk_middleware.api import budgeted_private_top_k
from topk_middleware.mechanisms.joint import joint_cost, joint_top_k
from topk_middleware.mechanisms.limited_domain import limited_domain_top_k
from topk_middleware.mechanisms.pay_what_you_get import PayWhatYouGet
from topk_middleware.mechanisms.peeling import peeling_cost, peeling_top_k
from topk_middleware.mechanisms.stable import stable_cost, stable_top_k
from topk_middleware.privacy import gumbel_topk_epsilon

ORDERS = rdp_lib.DEFAULT_RDP_ORDERS


def theorem_1(k: int, eps: float, delta_prime: float) -> float:
    """Durfee & Rogers 2019, Theorem 1, written out with exponentials."""
    ratio = (math.exp(eps) - 1) / (math.exp(eps) + 1)
    log_term = math.log(1 / delta_prime)
    return min(
        k * eps,
        k * eps * ratio + eps * math.sqrt(2 * k * log_term),
        k * eps**2 / 2 + eps * math.sqrt(k * log_term / 2),
    )


def test_durfee_rogers_theorem_1_check_value() -> None:
    """k = 10, eps = 0.1, delta' = 1e-6 gives eps' = 0.8811 (the third branch)."""
    independent = theorem_1(10, 0.1, 1e-6)
    assert round(independent, 4) == 0.8811
    assert limited_domain_epsilon(10, 0.1, 1e-6) == pytest.approx(independent, rel=1e-12)


@pytest.mark.parametrize(("k", "eps", "dp"), [(1, 1.0, 1e-5), (50, 0.05, 1e-9), (5, 2.0, 1e-3)])
def test_theorem_1_other_points(k: int, eps: float, dp: float) -> None:
    assert limited_domain_epsilon(k, eps, dp) == pytest.approx(theorem_1(k, eps, dp), rel=1e-12)


def test_lemma_4_4_heterogeneous() -> None:
    etas = [0.1, 0.3, 0.05, 0.2]
    dp = 1e-7
    s = sum(etas)
    sq = sum(e * e for e in etas)
    L = math.log(1 / dp)
    second = sum(e * (math.exp(e) - 1) / (math.exp(e) + 1) for e in etas) + math.sqrt(2 * sq * L)
    third = sq / 2 + math.sqrt(sq * L / 2)
    assert range_bounded_composition_epsilon(etas, dp) == pytest.approx(
        min(s, second, third), rel=1e-12
    )
    assert range_bounded_composition_epsilon(etas, 0.0) == pytest.approx(s)


def test_theorem_3_advanced_composition() -> None:
    eps = [0.01] * 400
    dp = 1e-6
    expected = 400 * 0.01 * (math.exp(0.01) - 1) / (math.exp(0.01) + 1) + math.sqrt(
        2 * 400 * 0.01**2 * math.log(1 / dp)
    )
    assert expected < 4.0
    assert advanced_composition_epsilon(eps, dp) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("rho", "delta"), [(0.01, 1e-6), (0.5, 1e-9), (2.0, 1e-5)])
def test_zcdp_conversion_against_dp_accounting(rho: float, delta: float) -> None:
    """Same orders, same conversion: equal to dp-accounting's RdpAccountant on a ZCDpEvent."""
    accountant = rdp_lib.RdpAccountant()
    accountant.compose(dp_event.ZCDpEvent(rho / 2), 2)  # composition adds: rho in total
    theirs = accountant.get_epsilon(delta)
    ours, _ = rdp_to_dp_epsilon(lambda a: a * rho, delta, orders=ORDERS)
    assert ours == pytest.approx(theirs, rel=1e-10)
    dense, _ = rdp_to_dp_epsilon(lambda a: a * rho, delta)  # our denser default grid
    assert dense <= theirs * (1 + 1e-9)
    # The closed form of Bun & Steinke Prop. 1.3 is the continuous minimum of Mironov's bound.
    mironov = minimize_scalar(
        lambda a: a * rho + math.log(1 / delta) / (a - 1), bounds=(1 + 1e-9, 1e6), method="bounded"
    )
    assert zcdp_to_dp_epsilon(rho, delta) == pytest.approx(mironov.fun, rel=1e-6)
    assert dense <= zcdp_to_dp_epsilon(rho, delta)  # the improved conversion is never worse


@pytest.mark.parametrize("sigma", [0.7, 3.0, 20.0])
def test_gaussian_rdp_against_dp_accounting(sigma: float) -> None:
    accountant = rdp_lib.RdpAccountant()
    accountant.compose(dp_event.GaussianDpEvent(sigma))
    ours = np.array([gaussian_rdp(sigma, a) for a in ORDERS])
    np.testing.assert_allclose(ours, accountant._rdp, rtol=1e-10)


@pytest.mark.parametrize("scale", [0.5, 2.0, 10.0])
def test_laplace_rdp_against_dp_accounting(scale: float) -> None:
    accountant = rdp_lib.RdpAccountant()
    accountant.compose(dp_event.LaplaceDpEvent(scale))
    ours = np.array([laplace_rdp(scale, a) for a in ORDERS])
    np.testing.assert_allclose(ours, accountant._rdp, rtol=1e-9)


@pytest.mark.parametrize("eps", [0.1, 1.0, 3.0])
@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 10.0, 64.0])
def test_pure_dp_rdp_is_randomized_response(eps: float, alpha: float) -> None:
    """The sinh curve of Zhu & Wang Prop. 7 is the Renyi divergence of binary randomized
    response with ratio e^eps, computed here from its definition."""
    p = math.exp(eps) / (1 + math.exp(eps))
    P, Q = np.array([p, 1 - p]), np.array([1 - p, p])
    if alpha == 1.0:
        direct = float(np.sum(P * np.log(P / Q)))
    else:
        direct = math.log(float(np.sum(P**alpha * Q ** (1 - alpha)))) / (alpha - 1)
    assert pure_dp_rdp(eps, alpha) == pytest.approx(direct, rel=1e-10)
    sinh_form = (
        math.log((math.sinh(alpha * eps) - math.sinh((alpha - 1) * eps)) / math.sinh(eps))
        / (alpha - 1)
        if alpha > 1
        else direct
    )
    assert pure_dp_rdp(eps, alpha) == pytest.approx(sinh_form, rel=1e-10)
    assert pure_dp_rdp(eps, alpha) <= eps + 1e-12


def test_rdp_conversion_mironov_form() -> None:
    curve = lambda a: gaussian_rdp(2.0, a)  # noqa: E731
    ours, _ = rdp_to_dp_epsilon(curve, 1e-6, orders=ORDERS, improved=False)
    direct = min(curve(a) + math.log(1e6) / (a - 1) for a in ORDERS if a > 1)
    assert ours == pytest.approx(direct, rel=1e-12)


def test_composed_rdp_curve_is_the_sum_of_the_curves() -> None:
    """RDP composition adds the releases' curves (zCDP releases as alpha rho): the grouped sum
    equals the plain sum of every release's own curve at every order, on a mix of zCDP costs,
    stable costs rebuilt from one recipe, and a curve without a recipe."""
    gaussian = PrivacyCost("gaussian", rdp=lambda a: gaussian_rdp(3.0, a))
    mix = [
        oneshot_cost("gumbel", 3, 100, 0.5),
        stable_cost(0.01, 1e-7),
        stable_cost(0.01, 1e-7),
        gaussian,
        stable_cost(0.02, 1e-7),
        peeling_cost(2, 0.3),
        gaussian,
    ] * 5
    curves = [c.rdp_curve() for c in mix]
    total = composed_rdp_curve(mix)
    assert total is not None
    for alpha in (1.001, 1.5, 2.0, 7.0, 64.0, 1e4):
        plain = sum(f(alpha) for f in curves)  # type: ignore[misc]
        assert total(alpha) == pytest.approx(plain, rel=1e-12)
    assert composed_rdp_curve([*mix, PrivacyCost("pure", epsilon=1.0)]) is None


def test_composing_many_equal_releases_evaluates_their_curve_once_per_order() -> None:
    """A ledger composes every earlier charge at each release: n equal releases must cost one
    evaluation of their curve per order, not n (the calls counted), and give the epsilon of the
    curve times n converted by Canonne-Kamath-Steinke's bound (minimised here over the orders;
    compose's refinement between orders can only lower it, and barely does on this curve)."""
    calls = 0

    def curve(alpha: float) -> float:
        nonlocal calls
        calls += 1
        return gaussian_rdp(20.0, alpha)

    cost = PrivacyCost("gaussian", rdp=curve, delta=0.0)
    single = compose([cost], 1e-6)
    one_release = calls
    calls = 0
    composed = compose([cost] * 400, 1e-6)
    assert one_release > 1000 and calls < 1.1 * one_release  # (the refinement's probes vary)
    log_delta = math.log(1e-6)
    on_orders = min(
        400 * a / (2 * 20.0**2) + math.log(a - 1) - (a * math.log(a) + log_delta) / (a - 1)
        for a in DEFAULT_ORDERS
        if a > 1
    )
    assert on_orders * (1 - 1e-4) <= composed.epsilon <= on_orders * (1 + 1e-12)
    assert composed.epsilon > single.epsilon


# ----- the budget ------------------------------------------------------------------------------
class ReadCounter:
    """A Source wrapper that counts every row served (independently of CountedAccess)."""

    def __init__(self, inner: ArraySource) -> None:
        self.inner = inner
        self.rows = 0

    def traits(self) -> StoreTraits:
        return self.inner.traits()

    def domain_size(self) -> int:
        return self.inner.domain_size()

    def snapshot(self) -> Any:
        return self.inner.snapshot()

    def read_sorted(self, start: int, count: int) -> Rows:
        rows = self.inner.read_sorted(start, count)
        self.rows += len(rows)
        return rows

    def read_positions(self, ranks: np.ndarray) -> Rows:
        rows = self.inner.read_positions(ranks)
        self.rows += len(rows)
        return rows

    def read_ids(self, ids: Sequence[Any]) -> np.ndarray:
        self.rows += len(ids)
        return self.inner.read_ids(ids)


def counter() -> ReadCounter:
    return ReadCounter(ArraySource(np.arange(200, dtype=float)))


def test_budget_refuses_and_reads_nothing() -> None:
    """Each mechanism charges the budget before opening the source: an over-budget call raises
    BudgetExceeded, the wrapper has served zero rows, and nothing is recorded. (Fails if a
    mechanism reads first and charges after.)"""
    budget = PrivacyBudget(epsilon=1.0, delta=1e-6)
    first = counter()
    peeling_top_k(first, 3, 0.9, seed=1, budget=budget)
    assert first.rows == 200 and len(budget.releases) == 1
    calls = [
        lambda s: peeling_top_k(s, 3, 0.5, seed=1, budget=budget),
        lambda s: joint_top_k(s, 3, 0.5, seed=1, budget=budget),
        lambda s: limited_domain_top_k(s, 3, 10, 0.2, 1e-7, seed=1, budget=budget),
        lambda s: stable_top_k(s, 0.5, 1e-7, k_bar=10, seed=1, budget=budget),
    ]
    for call in calls:
        source = counter()
        with pytest.raises(BudgetExceeded):
            call(source)
        assert source.rows == 0
    assert len(budget.releases) == 1
    # A pay-what-you-get session is charged its Theorem 2 worst case when it opens.
    with pytest.raises(BudgetExceeded):
        PayWhatYouGet(k_star=20, l_star=4, epsilon=0.1, delta=1e-7, budget=budget)
    # Within what is left, a release goes through.
    small = counter()
    joint_top_k(small, 3, 0.05, seed=1, budget=budget)
    assert small.rows > 0 and len(budget.releases) == 2


def test_budget_uses_the_best_composition() -> None:
    """50 joint releases at eps = 0.1 with delta = 1e-6: basic composition says 5.0; zCDP
    (rho = eps^2/8 each) through RDP says less; the budget takes the minimum of the rules,
    computed here independently (dp-accounting for the RDP rule, Lemma 4.4 by hand)."""
    budget = PrivacyBudget(epsilon=10.0, delta=1e-6)
    for _ in range(50):
        budget.charge(joint_cost(0.1))
    spent = budget.spent()
    accountant = rdp_lib.RdpAccountant()
    accountant.compose(dp_event.ZCDpEvent(0.1**2 / 8), 50)
    rdp_value = accountant.get_epsilon(1e-6)
    lemma_44 = min(
        5.0,
        50 * 0.1 * math.tanh(0.05) + math.sqrt(2 * 50 * 0.01 * math.log(1e6)),
        50 * 0.01 / 2 + math.sqrt(0.5 * 50 * 0.01 * math.log(1e6)),
    )
    assert spent.epsilon <= min(rdp_value, lemma_44) * (1 + 1e-9)
    assert spent.epsilon >= min(rdp_value, lemma_44) * 0.99  # denser orders gain < 1 %
    assert spent.epsilon < 5.0 and spent.delta <= 1e-6


def test_budget_pure_only_and_exact_fit() -> None:
    """delta = 0: only basic composition applies; a release that fits exactly is accepted, the
    next one is refused and not recorded."""
    budget = PrivacyBudget(epsilon=1.0)
    budget.charge(peeling_cost(4, 0.5))
    budget.charge(peeling_cost(2, 0.5))
    assert budget.spent().epsilon == pytest.approx(1.0)
    with pytest.raises(BudgetExceeded, match="over the total"):
        budget.charge(peeling_cost(1, 1e-3))
    assert len(budget.releases) == 2
    # Used up: a cost too small to move the float sum (1 + 1e-17 == 1) is refused all the same.
    for _ in range(3):
        with pytest.raises(BudgetExceeded, match="used up"):
            budget.charge(peeling_cost(1, 1e-17))
    assert len(budget.releases) == 2
    # An approximate-only release cannot be charged to a pure budget.
    with pytest.raises(BudgetExceeded):
        PrivacyBudget(epsilon=100.0).charge(stable_cost(0.1, 1e-9))


def test_stable_cost_is_theorem_11() -> None:
    """A2 with Gaussian PTR: RDP = A1 (min{alpha eps1^2/8, sinh curve}) + alpha rho/2, which
    is at most alpha rho (delta_t-approximate rho-zCDP, Theorem 11)."""
    rho = 0.3
    cost = stable_cost(rho, 1e-8)
    eps1 = 2 * math.sqrt(rho)
    for a in [1.5, 2.0, 8.0, 100.0]:
        a1 = min(a * eps1**2 / 8, pure_dp_rdp(eps1, a))
        assert cost.rdp(a) == pytest.approx(a1 + a * rho / 2, rel=1e-12)  # type: ignore[misc]
        assert cost.rdp(a) <= a * rho + 1e-12  # type: ignore[misc]
    assert cost.rho == rho and cost.delta == 1e-8 and cost.epsilon is None


def test_bad_budget_parameters() -> None:
    with pytest.raises(ValueError, match="epsilon"):
        PrivacyBudget(epsilon=0.0)
    with pytest.raises(ValueError, match="delta"):
        PrivacyBudget(epsilon=1.0, delta=1.0)
    with pytest.raises(ValueError, match="delta"):
        rdp_to_dp_epsilon(lambda a: a, 0.0)
    assert PrivacyCost("x", epsilon=1.0).dp_pairs() == [(1.0, 0.0)]


def test_private_top_k_through_the_budget() -> None:
    """budgeted_private_top_k charges Fact 3.3's (epsilon, delta) and refuses the next release
    before reading a row."""
    budget = PrivacyBudget(epsilon=1.0, delta=1e-6)
    first = counter()
    result = budgeted_private_top_k(budget, first, 5, 1.0, 1e-6, seed=0)
    assert len(result.items) == 5 and first.rows > 0
    assert budget.spent().epsilon == pytest.approx(1.0)
    second = counter()
    with pytest.raises(BudgetExceeded):
        budgeted_private_top_k(budget, second, 1, 0.01, seed=0)
    assert second.rows == 0
    cost = oneshot_cost("laplace", 4, 100, 1.0)
    assert cost.epsilon == pytest.approx(1.0) and not cost.range_bounded and cost.rho is None


def test_fact_3_3_is_implied_by_proven_bounds() -> None:
    """Wu et al. print Fact 3.3 with eps0 sqrt(k ln(1/delta)); Durfee & Rogers' Corollary 4.1 has
    sqrt(2k ln(1/delta)). The printed form (privacy.gumbel_topk_epsilon) is still never below
    the smaller of two proven bounds for k steps of eps0-range-bounded selection: Lemma 4.4 and
    zCDP k eps0^2/8 (Cesar & Rogers 2021) converted by Bun & Steinke Prop. 1.3. Checked on a
    grid; fails if the calibration ever claimed less privacy loss than is proven."""
    for k in [1, 2, 5, 10, 50, 1000]:
        for eps0 in np.geomspace(1e-3, 10, 120):
            for delta in [0.5, 1e-2, 1e-6, 1e-12]:
                printed = gumbel_topk_epsilon(k, float(eps0), delta)
                proven = min(
                    limited_domain_epsilon(k, float(eps0), delta),
                    zcdp_to_dp_epsilon(k * eps0**2 / 8, delta),
                )
                assert printed >= proven * (1 - 1e-12), (k, eps0, delta)


def test_basic_composition_picks_pairs_within_delta() -> None:
    """A limited-domain release meets (k eps, delta) and, by Theorem 1, (eps', delta + delta'):
    under a budget whose delta admits only the first, basic composition must use it."""
    from topk_middleware.mechanisms.limited_domain import limited_domain_cost

    cost = limited_domain_cost(10, 0.1, 1e-8, delta_prime=1e-6)
    assert cost.dp_pairs()[0][0] < 1.0  # Theorem 1's pair: 0.88 at delta 1e-8 + 1e-6
    tight = PrivacyBudget(epsilon=1.0, delta=1e-8)
    spent = tight.charge(cost)
    assert spent.epsilon == pytest.approx(1.0) and spent.delta == pytest.approx(1e-8)
    roomy = PrivacyBudget(epsilon=1.0, delta=1e-5)
    assert roomy.charge(cost).epsilon == pytest.approx(limited_domain_epsilon(10, 0.1, 1e-5 - 1e-8))


def test_limited_domain_calls_compose_with_two_delta_each() -> None:
    """One call: Theorem 1, (eps', delta + delta'). Several: as in Theorem 2, each call adds
    2 delta to the range-bounded composition (Lemma 4.4 over all their steps)."""
    from topk_middleware.accounting import compose
    from topk_middleware.mechanisms.limited_domain import limited_domain_cost

    one = limited_domain_cost(10, 0.1, 1e-8)
    alone = compose([one], 1e-6)
    assert alone.epsilon == pytest.approx(limited_domain_epsilon(10, 0.1, 1e-6 - 1e-8))
    three = compose([one] * 3, 1e-6)
    assert three.epsilon == pytest.approx(theorem_1(30, 0.1, 1e-6 - 6e-8), rel=1e-12)
    assert "Lemma 4.4" in three.rule and three.delta <= 1e-6
