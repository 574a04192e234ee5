"""Noisy counts beside a private top-k: the budget split, the noise, and the guarantee of both.

`private_top_k(..., with_counts=True, counts_share=s)` spends (1 - s) epsilon (and all of delta)
on the selection and s epsilon on the counts. The counts of the k selected items are read by
random access (counted) and each gets independent discrete Laplace noise of scale
t = k ceil(D) / (s epsilon), D the source's sensitivity:

* A client changes each count by at most D (the source's declaration), so the floor of each
  count by at most ceil(D) (|floor a - floor b| <= ceil |a - b|); the discrete Laplace
  mechanism with scale t on one integer of sensitivity ceil(D) is (ceil(D) / t)-DP (Canonne,
  Kamath & Steinke 2020, discrete_noise.py), so each count is (s epsilon / k)-DP.
* Which items' counts are released is the selection's output: the counts step is chosen
  adaptively from it, and basic composition, which holds for adaptively chosen mechanisms
  (Dwork & Roth 2014, Theorem 3.16 and Section 3.5), gives the whole release
  ((1 - s) epsilon's guarantee + s epsilon, delta)-DP.

The cost charged to a budget (once) carries the pure / approximate pairs and, when the selection
has a zCDP form, rho_selection + k (s epsilon / k)^2 / 2 (Bun & Steinke 2016, Proposition 1.4).
The 95% interval's half-width is exact for the discrete Laplace law (discrete_noise.py).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from .accounting import PrivacyCost, pure_dp_zcdp
from .discrete_noise import discrete_laplace, discrete_laplace_half_width
from .privacy import PrivacyGuarantee

COUNT_INTERVAL_LEVEL = 0.95


def check_counts_share(counts_share: Any) -> float:
    """The share of epsilon spent on the counts: a real number strictly between 0 and 1."""
    if isinstance(counts_share, bool) or not isinstance(counts_share, numbers.Real):
        raise TypeError(f"counts_share must be a number in (0, 1), got {counts_share!r}")
    share = float(counts_share)
    if not (0.0 < share < 1.0):
        raise ValueError(f"counts_share must be in (0, 1), got {counts_share!r}")
    return share


@dataclass(frozen=True)
class CountsPlan:
    """How the counts are noised: the exact rational scale, its epsilon and the interval."""

    k: int
    epsilon: float  # spent on the counts (basic composition over the k counts)
    sensitivity: int  # ceil(D): the most one client moves a count's floor
    scale: Fraction  # discrete Laplace scale t = k ceil(D) / epsilon, exactly
    half_width: int  # P(|noise| <= half_width) >= 95%

    @classmethod
    def make(cls, k: int, epsilon: float, sensitivity: float) -> CountsPlan:
        whole = math.ceil(sensitivity)
        scale = Fraction(k * whole) / Fraction(epsilon)  # exact: epsilon is a double
        return cls(
            k,
            epsilon,
            whole,
            scale,
            discrete_laplace_half_width(float(scale), COUNT_INTERVAL_LEVEL),
        )

    def release(self, rng: np.random.Generator, scores: np.ndarray) -> tuple[int, ...]:
        """floor(count) + discrete Laplace noise for each score, as Python ints."""
        return tuple(
            math.floor(float(score)) + discrete_laplace(rng, self.scale) for score in scores
        )


def split_epsilon(epsilon: float, counts_share: float) -> tuple[float, float]:
    """(selection epsilon, counts epsilon): basic composition adds them back to epsilon."""
    counts = epsilon * counts_share
    return epsilon - counts, counts


def with_counts_guarantee(selection: PrivacyGuarantee, plan: CountsPlan) -> PrivacyGuarantee:
    """The guarantee of the selection and its noisy counts together (module docstring)."""
    return dataclasses.replace(
        selection,
        epsilon=selection.epsilon + plan.epsilon,
        derivation=(
            f"selection: {selection.derivation}; counts: discrete Laplace scale "
            f"{float(plan.scale):.6g} on each of {plan.k} counts of sensitivity "
            f"{plan.sensitivity} (Canonne, Kamath & Steinke 2020), epsilon {plan.epsilon:.6g} "
            "by basic composition; whole: basic composition (Dwork & Roth 2014, Thm 3.16)"
        ),
        counts_epsilon=plan.epsilon,
        counts_scale=float(plan.scale),
    )


def with_counts_cost(selection: PrivacyCost, plan: CountsPlan) -> PrivacyCost:
    """The cost of the selection plus its counts, charged once (module docstring)."""
    pairs = tuple((eps + plan.epsilon, delta) for eps, delta in selection.dp_pairs())
    rho = None
    if selection.rho is not None:
        rho = selection.rho + plan.k * pure_dp_zcdp(plan.epsilon / plan.k)
    return PrivacyCost(
        mechanism=f"{selection.mechanism} with noisy counts",
        epsilon=None if selection.epsilon is None else selection.epsilon + plan.epsilon,
        delta=selection.delta,
        rho=rho,
        approx=tuple(p for p in pairs if p[1] > 0.0),
        sources=(
            *selection.sources,
            "counts: k discrete Laplace releases, basic composition (Dwork & Roth Thm 3.16); "
            "zCDP: Bun & Steinke 2016 Prop. 1.4",
        ),
    )
