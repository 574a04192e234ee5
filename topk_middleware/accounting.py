"""Privacy accounting: what a release costs, and a budget that composes releases.

A release states its guarantee in every form it supports (`PrivacyCost`):

* pure / approximate DP: (epsilon, delta)-DP;
* range-bounded (Durfee & Rogers 2019, Definition 4.2): the release is an adaptive composition of
  eta_i-range-bounded steps (the exponential mechanism, one-shot Gumbel, peeling);
* zCDP rho (Bun & Steinke 2016), possibly delta-approximate (Zhu & Wang 2022, Definition 5);
* an RDP curve alpha -> eps(alpha) (Mironov 2017), possibly delta-approximate.

`delta` of a cost is the probability of the bad event outside which the other forms hold
(Durfee-Rogers' delta of Algorithm 1; Zhu-Wang's delta_t); it adds up under composition.

`PrivacyBudget` holds a total (epsilon, delta). It composes the releases charged to it by every
rule that applies to all of them and keeps the smallest epsilon: basic composition, the advanced
composition of Durfee-Rogers Theorem 3, the range-bounded composition of their Lemma 4.4, and
zCDP / RDP addition converted to (epsilon, delta) by minimising over the order alpha. A release
that would take the total past the budget is refused (`BudgetExceeded`) before it runs: every
mechanism here computes its cost from its parameters alone and charges the budget before it
opens the source.

Every formula names its source; tests/core/test_accounting.py checks them against independent
computations and against Google's dp-accounting package.
"""

from __future__ import annotations

import math
import numbers
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .mechanisms.oblivious import check_delta_pad, oblivious_guarantee
from .privacy import calibrate, range_bounded_composition_epsilon
from .release import TopKResult

RdpCurve = Callable[[float], float]

# Orders alpha on which RDP curves are minimised: dense near 1, geometric up to 10^4.
DEFAULT_ORDERS: tuple[float, ...] = tuple(
    np.unique(np.concatenate([1.0 + np.geomspace(1e-3, 1e4, 1200), np.arange(2, 257)]))
)


class BudgetExceeded(RuntimeError):
    """A release would take the composed guarantee past the budget; nothing was released.
    `needed_delta`: where the budget's delta is what is short, the total delta the releases
    with this one need (else None)."""

    def __init__(self, message: str, needed_delta: float | None = None) -> None:
        super().__init__(message)
        self.needed_delta = needed_delta


# ----- single-mechanism formulas ---------------------------------------------------------------
def _check_delta(delta: float, name: str = "delta") -> None:
    if not (0.0 < delta < 1.0):
        raise ValueError(f"{name} must be in (0, 1), got {delta}")


def advanced_composition_epsilon(epsilons: Sequence[float], delta_prime: float) -> float:
    """Durfee & Rogers 2019, Theorem 3 (Dwork-Rothblum-Vadhan 2010 with Kairouz et al.'s
    improvement): the adaptive composition of (eps_i, delta_i)-DP steps is
    (eps', sum delta_i + delta')-DP, eps' = min{sum eps_i,
    sum eps_i (e^eps_i - 1)/(e^eps_i + 1) + sqrt(2 sum eps_i^2 ln(1/delta'))}."""
    eps = np.asarray(epsilons, dtype=np.float64)
    basic = float(eps.sum())
    if delta_prime <= 0.0:
        return basic
    advanced = float(
        np.sum(eps * np.tanh(eps / 2.0)) + math.sqrt(2.0 * np.sum(eps**2) * -math.log(delta_prime))
    )
    return min(basic, advanced)


def limited_domain_epsilon(k: int, epsilon: float, delta_prime: float) -> float:
    """Durfee & Rogers 2019, Theorem 1: Algorithm 1 with Gumbel(1/epsilon) noise is
    (eps', delta + delta')-DP, eps' = min{k eps, k eps (e^eps - 1)/(e^eps + 1)
    + eps sqrt(2k ln(1/delta')), k eps^2/2 + eps sqrt(k ln(1/delta')/2)}
    (Lemma 4.4 with k steps of eps; Theorem 2 is the same formula with k* in place of k)."""
    return range_bounded_composition_epsilon([epsilon] * k, delta_prime)


def zcdp_to_dp_epsilon(rho: float, delta: float) -> float:
    """Bun & Steinke 2016, Proposition 1.3: rho-zCDP implies (rho + 2 sqrt(rho ln(1/delta)),
    delta)-DP: Mironov's conversion eps(alpha) + ln(1/delta)/(alpha - 1) with
    eps(alpha) = alpha rho, minimised over alpha. (Zhu & Wang 2022, Theorem 11 prints
    sqrt(2 rho ln(1/delta)); that does not follow from their Lemma 4: we use the minimisation.)"""
    _check_delta(delta)
    return rho + 2.0 * math.sqrt(rho * -math.log(delta))


def rdp_to_dp_epsilon(
    curve: RdpCurve,
    delta: float,
    orders: Sequence[float] = DEFAULT_ORDERS,
    improved: bool = True,
    refine: bool | None = None,
) -> tuple[float, float]:
    """(epsilon, best alpha) with (epsilon, delta)-DP from an RDP curve, minimised over alpha.

    improved=False: Mironov 2017, Proposition 3 (Zhu & Wang 2022, Lemma 4):
        eps = eps(alpha) + ln(1/delta) / (alpha - 1).
    improved=True: Canonne, Kamath & Steinke 2020, Proposition 12:
        eps = eps(alpha) + ln(alpha - 1) - (alpha ln(alpha) + ln(delta)) / (alpha - 1),
    which is never larger (for alpha > 1) and is what dp-accounting's RDP accountant uses.
    The minimum is taken over `orders` and then (refine, the default with the default orders)
    refined between the neighbours of the best order by golden-section search (golden_minimum,
    in pure Python: no optimiser to import); every alpha > 1 gives a valid bound, so the
    refinement can only lower epsilon. Cost: one curve evaluation per order, about 50 more.
    """
    _check_delta(delta)
    log_delta = math.log(delta)

    def bound(alpha: float) -> float:
        value = curve(alpha)
        if improved:
            shift = (alpha * math.log(alpha) + log_delta) / (alpha - 1.0)
            return value + math.log(alpha - 1.0) - shift
        return value - log_delta / (alpha - 1.0)

    grid = _DEFAULT_GRID if orders is DEFAULT_ORDERS else sorted(a for a in orders if a > 1.0)
    if not grid:
        raise ValueError("orders must contain some alpha > 1")
    values = [bound(a) for a in grid]
    i = int(np.argmin(values))
    best, best_alpha = values[i], grid[i]
    if refine if refine is not None else orders is DEFAULT_ORDERS:
        low = grid[i - 1] if i > 0 else 1.0 + 1e-9
        high = grid[i + 1] if i + 1 < len(grid) else grid[i] * 2.0
        found, at = golden_minimum(bound, low, high)
        if found < best:
            best, best_alpha = found, at
    return max(0.0, best), best_alpha


_DEFAULT_GRID = sorted(a for a in DEFAULT_ORDERS if a > 1.0)
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def golden_minimum(
    f: Callable[[float], float], low: float, high: float, tolerance: float = 1e-10
) -> tuple[float, float]:
    """(smallest value seen, its argument) of f on [low, high] by golden-section search (Kiefer
    1953): each evaluation shrinks the bracket by 0.618, until it is narrower than tolerance
    times (1 + |x|): about 50 evaluations for a bracket between two neighbouring orders.
    Every value seen is an upper bound where f is one (any alpha > 1 is), so the smallest is
    kept whether or not f is unimodal there; a value that is not finite counts as +inf."""

    def value(x: float) -> float:
        y = float(f(x))
        return y if math.isfinite(y) else math.inf

    a, b = low, high
    c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    fc, fd = value(c), value(d)
    best = min((fc, c), (fd, d))
    for _ in range(200):
        if b - a <= tolerance * (1.0 + abs(c)):
            break
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - _GOLDEN * (b - a)
            fc = value(c)
            best = min(best, (fc, c))
        else:
            a, c, fc = c, d, fd
            d = a + _GOLDEN * (b - a)
            fd = value(d)
            best = min(best, (fd, d))
    return best


def range_bounded_zcdp(eta: float) -> float:
    """Cesar & Rogers 2021, Lemma 17 (as used by Zhu & Wang 2022, Proposition 7): an
    eta-range-bounded mechanism is eta^2/8-zCDP."""
    return eta * eta / 8.0


def pure_dp_zcdp(epsilon: float) -> float:
    """Bun & Steinke 2016, Proposition 1.4: epsilon-DP implies epsilon^2/2-zCDP."""
    return epsilon * epsilon / 2.0


def _log_cosh(x: float) -> float:
    x = abs(x)
    return x + math.log1p(math.exp(-2.0 * x)) - math.log(2.0)


def pure_dp_rdp(epsilon: float, alpha: float) -> float:
    """RDP of an epsilon-DP mechanism (Zhu & Wang 2022, Proposition 7, second term, from Bun &
    Steinke 2016): (1/(alpha-1)) ln((sinh(alpha eps) - sinh((alpha-1) eps)) / sinh(eps)),
    evaluated stably as (1/(alpha-1)) ln(cosh((alpha - 1/2) eps) / cosh(eps/2)) (the same value:
    sinh a - sinh b = 2 cosh((a+b)/2) sinh((a-b)/2))."""
    if alpha == 1.0:  # the limit: KL divergence of randomized response
        return epsilon * math.tanh(epsilon / 2.0)
    return (_log_cosh((alpha - 0.5) * epsilon) - _log_cosh(0.5 * epsilon)) / (alpha - 1.0)


def gaussian_rdp(sigma: float, alpha: float, sensitivity: float = 1.0) -> float:
    """Mironov 2017, Proposition 7: the Gaussian mechanism N(0, sigma^2) on a query of L2
    sensitivity s is (alpha, alpha s^2 / (2 sigma^2))-RDP (Zhu & Wang 2022, Corollary 19)."""
    return alpha * sensitivity * sensitivity / (2.0 * sigma * sigma)


def laplace_rdp(scale: float, alpha: float) -> float:
    """Mironov 2017, Proposition 6: Laplace(b) noise on a sensitivity-1 query is
    (alpha, (1/(alpha-1)) ln(alpha/(2 alpha - 1) e^{(alpha-1)/b}
    + (alpha-1)/(2 alpha - 1) e^{-alpha/b}))-RDP; at alpha = 1 (KL): 1/b + e^{-1/b} - 1."""
    eps = 1.0 / scale
    if alpha == 1.0:
        return eps + math.expm1(-eps)
    a = math.log(alpha / (2 * alpha - 1)) + (alpha - 1) * eps
    b = math.log((alpha - 1) / (2 * alpha - 1)) - alpha * eps
    hi, lo = max(a, b), min(a, b)
    return (hi + math.log1p(math.exp(lo - hi))) / (alpha - 1.0)


# ----- the cost of one release -----------------------------------------------------------------
@dataclass(frozen=True)
class PrivacyCost:
    """The guarantee of one release in every form it supports (None / () = not claimed).

    epsilon: the release is (epsilon, delta)-DP (pure when delta = 0).
    range_bounded: per-step eta_i; outside the delta event the release is an adaptive composition
        of eta_i-range-bounded steps (Durfee & Rogers 2019, Definition 4.2).
    rho: delta-approximate rho-zCDP.  rdp: delta-approximate RDP curve.
    approx: further (epsilon, delta) pairs the release meets (used by basic composition).
    range_bounded_delta: what the release adds to delta when composed with others through its
        range-bounded steps, if not `delta` (Durfee & Rogers 2019, Theorem 2 charges a
        limited-domain call 2 delta there, while Theorem 1 alone needs delta).
    """

    mechanism: str
    epsilon: float | None = None
    delta: float = 0.0
    range_bounded: tuple[float, ...] = ()
    rho: float | None = None
    rdp: RdpCurve | None = None
    approx: tuple[tuple[float, float], ...] = ()
    sources: tuple[str, ...] = ()
    range_bounded_delta: float | None = None
    # How to rebuild the cost from its parameters ("module:function", keyword arguments): what a
    # durable ledger stores for a cost whose RDP curve is a function.
    recipe: tuple[str, tuple[tuple[str, Any], ...]] | None = None

    def rdp_curve(self) -> RdpCurve | None:
        """The RDP curve, from `rdp` or else from zCDP (alpha -> alpha rho, Bun & Steinke 2016)."""
        if self.rdp is not None:
            return self.rdp
        if self.rho is not None:
            rho = self.rho
            return lambda alpha: alpha * rho
        return None

    def dp_pairs(self) -> list[tuple[float, float]]:
        """Every (epsilon, delta) pair this release meets on its own."""
        pairs = list(self.approx)
        if self.epsilon is not None:
            pairs.append((self.epsilon, self.delta))
        return pairs


@dataclass(frozen=True)
class ComposedGuarantee:
    """The (epsilon, delta) of a sequence of releases, and the rule that gave it."""

    epsilon: float
    delta: float
    rule: str


def composed_rdp_curve(costs: Sequence[PrivacyCost]) -> RdpCurve | None:
    """The RDP curve of the releases together, or None if one of them has none: RDP curves add
    up under adaptive composition, and so does zCDP's rho, the curve alpha -> alpha rho
    (Mironov 2017; Zhu & Wang 2022, Lemma 16: the rule `compose` names). So the zCDP releases
    make one linear curve, and releases with the same RDP curve (one function, or one recipe)
    are evaluated once and counted with their multiplicity: composing n releases evaluates each
    distinct curve once per order, not n curves (a ledger composes every earlier charge at each
    release)."""
    rho = 0.0
    shared: dict[Any, list[Any]] = {}  # key -> [curve, how many releases have it]
    for cost in costs:
        if cost.rdp is not None:
            key = _curve_key(cost)
            shared.setdefault(key, [cost.rdp, 0])[1] += 1
        elif cost.rho is not None:
            rho += cost.rho
        else:
            return None
    groups = [(curve, count) for curve, count in shared.values()]
    if not groups:
        return lambda alpha: alpha * rho
    return lambda alpha: alpha * rho + sum(count * curve(alpha) for curve, count in groups)


def _curve_key(cost: PrivacyCost) -> Any:
    """What identifies a release's RDP curve: its recipe (the same parameters give the same
    curve), else the curve function itself."""
    if cost.recipe is not None:
        try:
            hash(cost.recipe)
        except TypeError:
            pass
        else:
            return ("recipe", cost.recipe)
    return ("curve", id(cost.rdp))


def compose(costs: Sequence[PrivacyCost], delta: float) -> ComposedGuarantee:
    """The smallest epsilon such that the releases together are (epsilon, <= delta)-DP, by every
    composition rule that applies to all of them. delta is the total delta allowed; what the
    releases' own delta does not use is spent on the composition rule (delta')."""
    if not costs:
        return ComposedGuarantee(0.0, 0.0, "nothing released")
    candidates: list[ComposedGuarantee] = []
    fail = sum(c.delta for c in costs)
    spare = delta - fail

    # Basic composition (Dwork & Roth 2014, Theorem 3.16; Durfee & Rogers 2019, Theorem 3 with
    # delta' = 0): for each release its cheapest pair that keeps the deltas within the total.
    pairs = [c.dp_pairs() for c in costs]
    if all(pairs):
        # Two choices per release: its smallest-epsilon pair, or its smallest-delta pair.
        for pick in (lambda e_d: (e_d[0], e_d[1]), lambda e_d: (e_d[1], e_d[0])):
            chosen = [min(p, key=pick) for p in pairs]
            candidates.append(
                ComposedGuarantee(
                    sum(e for e, _ in chosen),
                    sum(d for _, d in chosen),
                    "basic composition (Dwork & Roth, Thm 3.16)",
                )
            )
    if spare > 0.0:
        if all(c.epsilon is not None for c in costs):
            eps = advanced_composition_epsilon([c.epsilon for c in costs], spare)  # type: ignore[misc]
            candidates.append(
                ComposedGuarantee(eps, fail + spare, "advanced composition (Durfee & Rogers Thm 3)")
            )
        if all(c.range_bounded for c in costs):
            if len(costs) == 1:
                fail_rb = costs[0].delta
            else:
                fail_rb = sum(
                    c.delta if c.range_bounded_delta is None else c.range_bounded_delta
                    for c in costs
                )
            if delta - fail_rb > 0.0:
                etas = [eta for c in costs for eta in c.range_bounded]
                eps = range_bounded_composition_epsilon(etas, delta - fail_rb)
                candidates.append(
                    ComposedGuarantee(
                        eps, delta, "range-bounded composition (Durfee & Rogers Lemma 4.4)"
                    )
                )
        total = composed_rdp_curve(costs)
        if total is not None:
            eps, _ = rdp_to_dp_epsilon(total, spare)
            candidates.append(
                ComposedGuarantee(
                    eps,
                    fail + spare,
                    "RDP/zCDP addition (Mironov 2017; Zhu & Wang Lemma 16), converted by "
                    "Canonne-Kamath-Steinke 2020 Prop. 12 minimised over alpha",
                )
            )
    admissible = [c for c in candidates if c.delta <= delta * (1 + 1e-12)]
    if not admissible:
        return ComposedGuarantee(math.inf, fail, "no rule fits within delta")
    # The smallest epsilon; between equal ones (to 1e-12) the smaller delta.
    return min(admissible, key=lambda c: (round(c.epsilon, 12), c.delta))


@dataclass
class PrivacyBudget:
    """A total (epsilon, delta) and the releases charged to it.

    `charge(cost)` adds a release if the composition of everything charged so far and it stays
    within (epsilon, delta), else raises BudgetExceeded and records nothing. The mechanisms of
    this package take `budget=` and charge it before they open the source.
    """

    epsilon: float
    delta: float = 0.0
    releases: list[PrivacyCost] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_budget_total(self.epsilon, self.delta)

    def spent(self) -> ComposedGuarantee:
        with self._lock:
            return compose(list(self.releases), self.delta)

    def charge(self, cost: PrivacyCost) -> ComposedGuarantee:
        """Check and record under one lock: threads sharing the budget never overspend it."""
        with self._lock:
            before = compose(list(self.releases), self.delta) if self.releases else None
            after = compose([*self.releases, cost], self.delta)
            refuse_if_over(after, self.epsilon, self.delta, cost, before)
            self.releases.append(cost)
            return after


def check_budget_total(epsilon: Any, delta: Any) -> None:
    """A budget's total: a real epsilon, finite and > 0, and a real delta in [0, 1)."""
    for name, value in (("epsilon", epsilon), ("delta", delta)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"budget {name} must be a real number, got {value!r}")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"budget epsilon must be finite and > 0, got {epsilon}")
    if not (0.0 <= delta < 1.0):
        raise ValueError(f"budget delta must be in [0, 1), got {delta}")


EXHAUSTED = 1e-12  # relative: a composition this close to its total has used it up


def refuse_if_over(
    after: ComposedGuarantee,
    epsilon: float,
    delta: float,
    cost: PrivacyCost,
    before: ComposedGuarantee | None = None,
) -> None:
    """BudgetExceeded when the composition `after` passes the total (epsilon, delta), or when
    the releases `before` it have used the total up (within EXHAUSTED): a cost too small to
    move a float sum (epsilon 1e-17 on a spent total of 1) is still refused, never accepted
    without end."""
    if before is not None and before.epsilon >= epsilon * (1 - EXHAUSTED):
        raise BudgetExceeded(
            f"the budget is used up (epsilon = {before.epsilon:.6g} spent): {cost.mechanism} "
            f"would go over the total epsilon = {epsilon:g}; nothing was read or released"
        )
    if math.isinf(after.epsilon) and after.delta > delta:
        raise BudgetExceeded(
            f"{cost.mechanism} would take the budget to epsilon = inf: it spends delta = "
            f"{cost.delta:.3g}, so the budget's releases need a total delta of at least "
            f"{after.delta:.3g}, and the budget has delta = {delta:g}; grant a budget with a "
            "delta (1e-6 pays for many such releases), or release without delta (an adaptive "
            "release, oblivious=False); nothing was read or released",
            needed_delta=after.delta,
        )
    if after.epsilon > epsilon * (1 + EXHAUSTED):
        raise BudgetExceeded(
            f"{cost.mechanism} would take the budget to epsilon = {after.epsilon:.6g} "
            f"(best rule: {after.rule}) at delta <= {delta:g}, over the total "
            f"epsilon = {epsilon:g}; nothing was read or released"
        )


def charge(budget: Any, cost: PrivacyCost) -> None:
    """Charge `budget` (a PrivacyBudget, a PrivacyLedger's budget, or None) before a mechanism
    touches its source."""
    if budget is not None:
        budget.charge(cost)


def record(budget: Any, result: Any) -> Any:
    """Log a finished release with the budget that paid for it (a ledger keeps it); return it."""
    log = getattr(budget, "log_release", None)
    if log is not None:
        log(result)
    return result


# ----- the costs of the mechanisms of api.py ---------------------------------------------------
def oneshot_cost(
    noise: str,
    k: int,
    m: int,
    epsilon: float,
    delta: float = 0.0,
    neighbours: str = "add_remove",
    sensitivity: float = 1.0,
) -> PrivacyCost:
    """The guarantee of private_top_k (Algorithm 2 or 3: one output distribution) and so of
    exponential_mechanism (k = 1, Gumbel), from the calibration of privacy.calibrate.

    Gumbel(b): k steps of a (1/b)-range-bounded exponential mechanism (Durfee & Rogers 2019,
    Lemmas 4.2 and 4.3, counts are monotone): (k/b)-DP, Lemma 4.4 under composition, and
    k/(8 b^2)-zCDP (Cesar & Rogers 2021); plus the (epsilon, delta) pair of Fact 3.3 when the
    calibration used it. Laplace(b): 2k/b-DP and, when calibrated so, Fact 3.2's pair only.
    """
    guarantee = calibrate(noise, k, m, epsilon, delta, neighbours, sensitivity)
    # per-step eta for this relation: replace doubled the scale to keep eta = the add/remove one;
    # sensitivity D multiplied it (the counts h / D have unit steps: privacy.py)
    eps0 = (2.0 if neighbours == "replace" else 1.0) * guarantee.sensitivity / guarantee.scale
    approx = ((guarantee.epsilon, guarantee.delta),) if guarantee.delta > 0 else ()
    if noise == "gumbel":
        return PrivacyCost(
            mechanism=f"gumbel top-{k}",
            epsilon=k * eps0,
            range_bounded=(eps0,) * k,
            rho=k * range_bounded_zcdp(eps0),
            approx=approx,
            sources=(guarantee.derivation, "Durfee & Rogers Lemmas 4.2-4.4; Cesar & Rogers 2021"),
        )
    return PrivacyCost(
        mechanism=f"laplace top-{k}",
        epsilon=2 * k * eps0,
        approx=approx,
        sources=(guarantee.derivation,),
    )


# ----- results ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class MechanismResult(TopKResult):
    """A TopKResult with what the mechanisms beyond Algorithm 3 add.

    bottom: the release ended with the bottom symbol (fewer than k items is then normal);
    k_chosen: the k a mechanism chose itself (Zhu & Wang's adaptive k), else the k asked for;
    cost: the guarantee in every form it supports (for a PrivacyBudget).
    """

    bottom: bool = False
    k_chosen: int | None = None
    cost: PrivacyCost | None = None
    details: dict[str, Any] = field(default_factory=dict)


def oblivious_cost(
    noise: str,
    k: int,
    m: int,
    epsilon: float,
    delta: float = 0.0,
    neighbours: str = "add_remove",
    delta_pad: float = 1e-9,
    sensitivity: float = 1.0,
    counts_epsilon: float = 0.0,
) -> PrivacyCost:
    """The guarantee of an oblivious release (mechanisms/oblivious.py): the one-shot release with
    the server's view of its reads, (eps, delta + (1 + e^eps) delta_pad)-DP for each (eps, delta)
    pair of the one-shot release (oneshot_cost), e^eps taken at eps + `counts_epsilon` when noisy
    counts come with it (their epsilon is added to each pair by noisy_counts.with_counts_cost).
    Only (epsilon, delta) pairs are claimed: the
    miss event is correlated with the noise, so the range-bounded and zCDP forms of the one-shot
    release are not carried over (basic composition applies)."""
    delta_pad = check_delta_pad(delta_pad)
    base = oneshot_cost(noise, k, m, epsilon, delta, neighbours, sensitivity)
    guarantee = calibrate(noise, k, m, epsilon, delta, neighbours, sensitivity)
    pairs = [
        (eps, d + (1.0 + math.exp(min(eps + counts_epsilon, 700.0))) * delta_pad)
        for eps, d in base.dp_pairs()
    ]
    first, rest = pairs[-1], tuple(pairs[:-1])
    return PrivacyCost(
        mechanism=f"oblivious {base.mechanism}",
        epsilon=first[0],
        delta=min(1.0, first[1]),
        approx=tuple((eps, min(1.0, d)) for eps, d in rest),
        sources=(oblivious_guarantee(guarantee, delta_pad, counts_epsilon).derivation,),
    )
