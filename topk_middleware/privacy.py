"""Privacy guarantees of the one-shot top-k mechanism and the calibration of its noise.

Users state the total guarantee a release must meet, (epsilon, delta); the mechanism derives the
per-item noise scale b = 1 / eps0 from it. Sources (Wu, Ohrimenko, Wirth, ICML 2023, Section 3.2):

* Fact 3.3 (Durfee & Rogers 2019): with Z_i ~ Gumbel(1/eps0), the one-shot top-k is
  (eps'', delta)-DP for every delta in [0, 1], where
  eps'' = min{k eps0, k eps0 (e^eps0 - 1)/(e^eps0 + 1) + eps0 sqrt(k ln(1/delta))}.
* Fact 3.2 (Qiao et al. 2021): with Z_i ~ Laplace(1/eps0), it is 2 k eps0-DP; and, when m >= 2,
  delta in [0, 0.05] and 8 eps0 sqrt(k ln(m/delta)) <= 0.2, also
  (8 eps0 sqrt(k ln(m/delta)), delta)-DP.

The private threshold algorithm (Algorithm 3) and the lazy oracle (Algorithm 4) have exactly the
one-shot output distribution, so they inherit these guarantees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.optimize import brentq

# Fact 3.2 holds only in this range of delta and of the resulting epsilon.
LAPLACE_ADVANCED_MAX_DELTA = 0.05
LAPLACE_ADVANCED_MAX_EPSILON = 0.2


@dataclass(frozen=True)
class PrivacyGuarantee:
    """The guarantee a release actually provides, and how it was derived."""

    epsilon: float
    delta: float
    noise: str
    scale: float  # per-item noise scale b
    derivation: str

    @property
    def per_item_epsilon(self) -> float:
        return 1.0 / self.scale


def gumbel_topk_epsilon(k: int, eps0: float, delta: float) -> float:
    """Fact 3.3: eps'' of the one-shot top-k with Gumbel(1/eps0) noise, at this delta."""
    pure = k * eps0
    if delta <= 0.0:
        return pure
    advanced = k * eps0 * math.tanh(eps0 / 2.0) + eps0 * math.sqrt(k * math.log(1.0 / delta))
    return min(pure, advanced)


def laplace_topk_epsilon(k: int, m: int, eps0: float, delta: float) -> float:
    """Fact 3.2: the epsilon of the one-shot top-k with Laplace(1/eps0) noise, at this delta."""
    pure = 2.0 * k * eps0
    if delta <= 0.0 or m < 2 or delta > LAPLACE_ADVANCED_MAX_DELTA:
        return pure
    advanced = 8.0 * eps0 * math.sqrt(k * math.log(m / delta))
    if advanced > LAPLACE_ADVANCED_MAX_EPSILON:
        return pure
    return min(pure, advanced)


def calibrate(noise: str, k: int, m: int, epsilon: float, delta: float) -> PrivacyGuarantee:
    """The smallest per-item noise whose one-shot top-k meets (epsilon, delta).

    When the approximate-DP bound does not beat the pure one (or its conditions fail), the pure
    calibration is used and the reported delta is 0: the release is then epsilon-DP.
    """
    if noise == "gumbel":
        eps0 = epsilon / k
        how = "Wu et al. 2023, Fact 3.3 (Durfee & Rogers 2019): Gumbel one-shot, pure: eps = k*eps0"
        used_delta = 0.0
        if delta > 0.0:
            root_term = math.sqrt(k * math.log(1.0 / delta))
            # The advanced branch is increasing in eps0, negative at 0 and >= epsilon at `high`.
            high = epsilon / root_term
            advanced = brentq(
                lambda e: k * e * math.tanh(e / 2.0) + e * root_term - epsilon,
                0.0,
                high,
                xtol=1e-300,
                rtol=1e-14,
            ) * (1.0 - 1e-12)  # err below the root: never exceed the requested epsilon
            if advanced > eps0 * (1 + 1e-12):
                eps0 = advanced
                used_delta = delta
                how = (
                    "Wu et al. 2023, Fact 3.3 (Durfee & Rogers 2019): Gumbel one-shot, "
                    "eps = k*eps0*tanh(eps0/2) + eps0*sqrt(k*ln(1/delta))"
                )
        achieved = gumbel_topk_epsilon(k, eps0, used_delta)
        return PrivacyGuarantee(achieved, used_delta, "gumbel", 1.0 / eps0, how)
    if noise == "laplace":
        eps0 = epsilon / (2.0 * k)
        how = "Wu et al. 2023, Fact 3.2 (Qiao et al. 2021): Laplace one-shot, pure: eps = 2*k*eps0"
        used_delta = 0.0
        if (
            0.0 < delta <= LAPLACE_ADVANCED_MAX_DELTA
            and m >= 2
            and epsilon <= LAPLACE_ADVANCED_MAX_EPSILON
        ):
            advanced = epsilon / (8.0 * math.sqrt(k * math.log(m / delta)))
            if advanced > eps0:
                eps0 = advanced
                used_delta = delta
                how = (
                    "Wu et al. 2023, Fact 3.2 (Qiao et al. 2021): Laplace one-shot, "
                    "eps = 8*eps0*sqrt(k*ln(m/delta)) (m >= 2, delta <= 0.05, eps <= 0.2)"
                )
        achieved = laplace_topk_epsilon(k, m, eps0, used_delta)
        return PrivacyGuarantee(achieved, used_delta, "laplace", 1.0 / eps0, how)
    raise ValueError(f"noise must be 'gumbel' or 'laplace', got {noise!r}")
