"""Pay-what-you-get composition (Durfee & Rogers 2019, Algorithm 2 multiLimitDom^{k*, l*}).

A session allows at most l* calls of the limited-domain mechanism (Algorithm 1), each with the
same per-call (epsilon, delta), and a total output budget k*. Call i asks for k_i <= the k* left
and is charged |o_i|, what it returned, the bottom symbol counting as one item. A call that could
exceed the budget (k_i > k* left, or no call left) is refused before any data is read.

Privacy (Theorem 2): for every delta' > 0 the whole session is (eps*, 2 l* delta + delta')-DP with
eps* the formula of Theorem 1 with k* in place of k (accounting.limited_domain_epsilon).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

from ..access import Source
from ..accounting import (
    BudgetExceeded,
    MechanismResult,
    PrivacyBudget,
    PrivacyCost,
    charge,
    limited_domain_epsilon,
)
from ..validation import check_common
from .limited_domain import check_limited_domain, limited_domain_top_k


def pay_what_you_get_cost(k_star: int, l_star: int, epsilon: float, delta: float) -> PrivacyCost:
    """The guarantee of a whole session (Durfee & Rogers 2019, Theorem 2): outside an event of
    probability 2 l* delta it is k* steps of an epsilon-range-bounded mechanism."""
    return PrivacyCost(
        mechanism="pay_what_you_get",
        epsilon=k_star * epsilon,
        delta=2 * l_star * delta,
        range_bounded=(epsilon,) * k_star,
        sources=("Durfee & Rogers 2019, Theorem 2 (pay-what-you-get composition)",),
    )


@dataclass
class PayWhatYouGet:
    """A session of limited-domain top-k calls under Algorithm 2's budget (k*, l*).

    With `budget=`, the worst case of the whole session (Theorem 2) is charged to that
    PrivacyBudget when the session is opened.
    """

    k_star: int
    l_star: int
    epsilon: float
    delta: float
    budget: PrivacyBudget | None = None
    outputs: list[MechanismResult] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("k_star", "l_star"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        check_common(1, self.epsilon, self.delta)
        if self.delta <= 0.0:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")
        self._k_left = int(self.k_star)
        self._calls_left = int(self.l_star)
        charge(self.budget, self.cost())

    @property
    def k_left(self) -> int:
        return self._k_left

    @property
    def calls_left(self) -> int:
        return self._calls_left

    def cost(self) -> PrivacyCost:
        return pay_what_you_get_cost(self.k_star, self.l_star, self.epsilon, self.delta)

    def guarantee(self, delta_prime: float) -> tuple[float, float]:
        """(eps*, 2 l* delta + delta') of Theorem 2."""
        if not (0.0 < delta_prime < 1.0):
            raise ValueError(f"delta_prime must be in (0, 1), got {delta_prime}")
        eps = limited_domain_epsilon(self.k_star, self.epsilon, delta_prime)
        return eps, 2 * self.l_star * self.delta + delta_prime

    def top_k(
        self,
        source: Source,
        k: int,
        k_bar: int,
        *,
        sensitivity: int | None = None,
        seed: int | None = None,
    ) -> MechanismResult:
        """One call of Algorithm 1, charged for what it returns (bottom counts one)."""
        check_limited_domain(k, k_bar, self.epsilon, self.delta, sensitivity)
        if self._calls_left < 1:
            raise BudgetExceeded(f"all l* = {self.l_star} calls of this session are used")
        if k > self._k_left:
            raise BudgetExceeded(
                f"k = {k} exceeds the output budget left, {self._k_left} of k* = {self.k_star}; "
                "nothing was read"
            )
        result = limited_domain_top_k(
            source, k, k_bar, self.epsilon, self.delta, sensitivity=sensitivity, seed=seed
        )
        self._k_left -= len(result.items) + int(result.bottom)
        self._calls_left -= 1
        self.outputs.append(result)
        return result
