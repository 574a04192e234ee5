"""Privacy guarantees of the one-shot top-k mechanism and the calibration of its noise.

Users state the total guarantee a release must meet, (epsilon, delta); the mechanism derives the
per-item noise scale b = 1 / eps0 from it. Sources (Wu, Ohrimenko, Wirth, ICML 2023, Section 3.2):

* Fact 3.3 (Durfee & Rogers 2019): with Z_i ~ Gumbel(1/eps0), the one-shot top-k equals k
  peeling steps of the exponential mechanism (their Lemma 4.2), each eps0-range-bounded as counts
  are monotone under add/remove-one-client neighbours (Lemma 4.3); so for every delta it is
  (eps'', delta)-DP with eps'' their Lemma 4.4 for k steps of eps0:
  eps'' = min{k eps0, k eps0 tanh(eps0/2) + eps0 sqrt(2k ln(1/delta)),
              k eps0^2/2 + eps0 sqrt(k ln(1/delta)/2)}.
  The first two terms are their Corollary 4.1 (eps''); Wu et al. print the second with
  sqrt(k ln(1/delta)), which Corollary 4.1 does not give: we use the cited terms only.
* Fact 3.2 (Qiao et al. 2021): with Z_i ~ Laplace(1/eps0), it is 2 k eps0-DP; and, when m >= 2,
  delta in [0, 0.05] and 8 eps0 sqrt(k ln(m/delta)) <= 0.2, also
  (8 eps0 sqrt(k ln(m/delta)), delta)-DP.

Neighbours. Every guarantee here is for *add/remove one client*: a client adds (or withdraws) at
most one vote per item, so every count moves by at most 1 and all in the same direction. That
monotonicity is what makes Gumbel(1/eps0) eps0-range-bounded per step (Durfee & Rogers Lemma 4.3).
`neighbours="replace"` (one client's votes replaced: counts move by at most 1 in either
direction) doubles the noise scale: the exponential mechanism with a non-monotone quality of
sensitivity 1 and weights exp(eps0 h / 2) is eps0-range-bounded (same Lemma 4.3), so every
range-bounded statement above holds unchanged (Gumbel, pure and approximate). For Laplace only
the pure bound is kept under replace, with twice the scale: a replace pair (h, h') is joined by
two add/remove pairs through (max(h, h')) at half the distance each in units of the doubled
scale, and the pure bound is linear in 1/scale (group privacy of two add/remove steps).

Sensitivity. A source declares `sensitivity` D: the most one client adds to or removes from one
item's count (default 1; `from_votes` sets it to its `max_per_item`). Every statement above is
about the counts h / D, whose add/remove neighbours move each count by at most 1, all in the same
direction; top-k of h / D + Z equals top-k of h + D Z, so the noise scale for sensitivity D is D
times the unit scale, and the guarantee is unchanged. The derivation text states the assumption.

The private threshold algorithm (Algorithm 3) and the lazy oracle (Algorithm 4) have exactly the
one-shot output distribution, so they inherit these guarantees.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .access import store_traits

# The calibration floor (DESIGN invariant 6): a per-item epsilon below this would make the noise
# scale 1/eps0 (and the noise, up to ~745 scales) not a finite double. Refused before anything is
# read or charged.
MIN_ITEM_EPSILON = 1e-300

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
    sensitivity: float = 1.0  # the most one client changes one count (declared by the source)
    counts_epsilon: float = 0.0  # of `epsilon`, what the noisy counts spent (noisy_counts.py)
    counts_scale: float | None = None  # the counts' discrete Laplace scale, when released
    # Scores above it are read as it (score_bound: public, from the scale and the sensitivity)
    score_bound: float | None = None

    def __post_init__(self) -> None:
        # Every guarantee states its assumptions (DESIGN invariant 13), whoever built it.
        if "assumes each client" not in self.derivation:
            text = f"{self.derivation}; {assumption_text(self.sensitivity)}"
            object.__setattr__(self, "derivation", text)

    @property
    def per_item_epsilon(self) -> float:
        """eps0 of Facts 3.2 / 3.3 for the counts h / sensitivity (module docstring)."""
        return self.sensitivity / self.scale


def assumption_text(sensitivity: float) -> str:
    """The assumption every guarantee states: the neighbour relation and the sensitivity."""
    return (
        f"assumes each client changes each count by at most {sensitivity:g} "
        "(add/remove-one-client neighbours; sensitivity declared by the source)"
    )


def _without_assumption(derivation: str) -> str:
    return derivation.split("; assumes each client")[0]


def check_sensitivity(sensitivity: object, where: str = "sensitivity") -> float:
    """A declared sensitivity: a finite real number > 0 (bools refused), as a float."""
    if isinstance(sensitivity, bool) or not isinstance(sensitivity, numbers.Real):
        raise TypeError(f"{where} must be a positive number, got {sensitivity!r}")
    value = float(sensitivity)
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"{where} must be finite and > 0, got {sensitivity!r}")
    return value


def source_sensitivity(source: object) -> float:
    """The sensitivity a source declares in its traits (access.StoreTraits; no default: a source
    that declares no traits is refused, access.store_traits)."""
    return check_sensitivity(store_traits(source).sensitivity, "the source's sensitivity")


class SensitivityError(ValueError):
    """A declared sensitivity (or contribution bound) below what the table records: a fact of
    how the table was registered or built, never of its counts."""


def check_max_items(max_items: object, where: str = "max_items_per_client") -> int | None:
    """A declared bound on how many counts one client changes: None or an integer >= 1."""
    if max_items is None:
        return None
    if isinstance(max_items, bool) or not isinstance(max_items, numbers.Integral):
        raise TypeError(f"{where} must be a positive integer or None, got {max_items!r}")
    if max_items < 1:
        raise ValueError(f"{where} must be >= 1, got {max_items}")
    return int(max_items)


def resolve_declared(
    sensitivity: object,
    max_items: object,
    recorded: tuple[float, int | None] | None,
    where: str,
) -> tuple[float, int | None]:
    """(sensitivity, max_items_per_client) of a source: what the caller declares, else what the
    table records (`recorded`: written by from_votes beside the table), else (1, None).

    A declaration may be larger than the record (more noise: always safe), never smaller: a
    table built with max_per_item = 5 released as sensitivity 1 would get a fifth of the noise
    it needs. Refused with SensitivityError, before anything is read or charged."""
    declared = None if sensitivity is None else check_sensitivity(sensitivity)
    limit = check_max_items(max_items)
    if recorded is None:
        return (1.0 if declared is None else declared), limit
    kept, kept_limit = recorded
    if declared is not None and declared < kept:
        raise SensitivityError(
            f"{where} records sensitivity {kept:g} (each client's contribution to a count was "
            f"clipped at {kept:g} when it was built), and {declared:g} was declared: that would "
            "scale the noise below what the table needs. Declare at least "
            f"{kept:g}, or nothing (the recorded value is used); nothing was read or charged"
        )
    if kept_limit is not None and limit is not None and limit < kept_limit:
        raise SensitivityError(
            f"{where} records that a client keeps at most {kept_limit} items, and "
            f"max_items_per_client = {limit} was declared: declare at least {kept_limit}, or "
            "nothing (the recorded value is used); nothing was read or charged"
        )
    if kept_limit is None and limit is not None:
        raise SensitivityError(
            f"{where} records that its build bounded no client's number of items, and "
            f"max_items_per_client = {limit} was declared: that bound was not enforced; "
            "declare nothing; nothing was read or charged"
        )
    return (kept if declared is None else declared), (kept_limit if limit is None else limit)


def require_unit_sensitivity(source: object, mechanism: str) -> None:
    """Refuse a source whose declared sensitivity is not 1, for a mechanism whose calibration
    relies on unit steps (DESIGN invariant 8: limited domain's +1, StableTopK's gap test, the
    joint and peeling mechanisms' exp(eps h)); checked before anything is read or charged."""
    sensitivity = source_sensitivity(source)
    if sensitivity != 1.0:
        raise SensitivityError(
            f"{mechanism} is calibrated for counts that one client changes by at most 1; this "
            f"source declares sensitivity {sensitivity:g}: use private_top_k (which scales its "
            "noise by the sensitivity); nothing was read or charged"
        )


def range_bounded_composition_epsilon(etas: Sequence[float], delta_prime: float) -> float:
    """Durfee & Rogers 2019, Lemma 4.4: the adaptive composition of eta_i-range-bounded steps is
    (eps', delta')-DP with eps' = min{sum eta_i, sum eta_i (e^eta_i - 1)/(e^eta_i + 1)
    + sqrt(2 sum eta_i^2 ln(1/delta')), sum eta_i^2 / 2 + sqrt((1/2) sum eta_i^2 ln(1/delta'))}."""
    eta = np.asarray(etas, dtype=np.float64)
    first = float(eta.sum())
    if delta_prime <= 0.0:
        return first
    log_term = -math.log(delta_prime)
    squares = float(np.sum(eta**2))
    second = float(np.sum(eta * np.tanh(eta / 2.0))) + math.sqrt(2.0 * squares * log_term)
    third = squares / 2.0 + math.sqrt(0.5 * squares * log_term)
    return min(first, second, third)


def gumbel_topk_epsilon(k: int, eps0: float, delta: float) -> float:
    """Fact 3.3 as its source gives it: eps'' of the one-shot top-k with Gumbel(1/eps0) noise at
    this delta, Durfee & Rogers 2019 Lemma 4.4 with k steps of eps0 (Corollary 4.1 + its third
    term)."""
    return range_bounded_composition_epsilon([eps0] * k, delta)


# Resolution. A double carries 53 significant bits: score + noise resolves the noise only where
# the spacing of the doubles near the score (its ulp) is small against the noise scale. Rather
# than refuse data beyond that (a refusal would be one bit about the data that no guarantee
# covers), every mechanism reads min(score, B) for a public bound B (`score_bound`): clamping is
# monotone and moves a count by no more than the count itself moved, so add/remove neighbours
# stay neighbours with the same sensitivity, and every guarantee holds for the clamped counts
# as it does for any counts. Below B the ulp is at most min(scale, sensitivity) / 2^RESOLUTION_BITS:
# rounding of score + noise moves a comparison by at most 2^-10 noise scales, and rounding an
# exact count read as a double (a numeric column) by at most 2^-11 of the sensitivity. B is at
# most 2^53, below which every integer is a double: an integer count read as a double and then
# clamped is exactly the clamped count (rounding to nearest is monotone and 2^53 is a double).
RESOLUTION_BITS = 10
MAX_SCORE_BOUND = 2.0**53


def score_bound(scale: float, sensitivity: float = 1.0) -> float:
    """B: the largest power of two at most 2^53 whose ulp is at most min(scale, sensitivity) /
    2^RESOLUTION_BITS, so that every double in [0, B] is resolved to that much (module notes
    above). A function of the calibration only, never of the data."""
    unit = min(scale, sensitivity) / 2.0**RESOLUTION_BITS
    exponent = math.frexp(unit)[1] - 1  # floor(log2(unit)), exactly
    return min(MAX_SCORE_BOUND, math.ldexp(1.0, 52 + exponent))


def bound_text(bound: float) -> str:
    """How a guarantee states its score bound."""
    return (
        f"scores above {bound:.17g} (where a double no longer resolves 1/1024 of the noise scale "
        "or of the sensitivity) are read as that bound: clamping is monotone and 1-Lipschitz, "
        "so neighbours stay neighbours with the same sensitivity"
    )


def check_scale(scale: float, what: str) -> None:
    """Refuse a noise scale that is not a finite positive double (the calibration floor)."""
    if not (math.isfinite(scale) and 0.0 < scale <= 1.0 / MIN_ITEM_EPSILON):
        raise ValueError(
            f"{what}: the noise scale {scale:g} is not finite (per-item epsilon below the floor "
            f"{MIN_ITEM_EPSILON:g}); nothing was read or charged"
        )


def laplace_topk_epsilon(k: int, m: int, eps0: float, delta: float) -> float:
    """Fact 3.2: the epsilon of the one-shot top-k with Laplace(1/eps0) noise, at this delta."""
    pure = 2.0 * k * eps0
    if delta <= 0.0 or m < 2 or delta > LAPLACE_ADVANCED_MAX_DELTA:
        return pure
    advanced = 8.0 * eps0 * math.sqrt(k * (math.log(m) - math.log(delta)))
    if advanced > LAPLACE_ADVANCED_MAX_EPSILON:
        return pure
    return min(pure, advanced)


NEIGHBOURS = ("add_remove", "replace")


def check_neighbours(neighbours: str) -> None:
    if neighbours not in NEIGHBOURS:
        raise ValueError(f"neighbours must be one of {NEIGHBOURS}, got {neighbours!r}")


def calibrate(
    noise: str,
    k: int,
    m: int,
    epsilon: float,
    delta: float,
    neighbours: str = "add_remove",
    sensitivity: float = 1.0,
) -> PrivacyGuarantee:
    """The smallest per-item noise whose one-shot top-k meets (epsilon, delta) for this neighbour
    relation (module docstring: "replace" doubles the scale; Laplace then pure only) and this
    sensitivity D (the unit scale times D: module docstring).

    When the approximate-DP bound does not beat the pure one (or its conditions fail), the pure
    calibration is used and the reported delta is 0: the release is then epsilon-DP. A pure
    function of its arguments, kept for the last ones asked (a guarantee is immutable).
    """
    check_neighbours(neighbours)
    sensitivity = check_sensitivity(sensitivity)
    return _calibrated(noise, int(k), int(m), float(epsilon), float(delta), neighbours, sensitivity)


@functools.lru_cache(maxsize=256)
def _calibrated(
    noise: str, k: int, m: int, epsilon: float, delta: float, neighbours: str, sensitivity: float
) -> PrivacyGuarantee:
    """calibrate(), its arguments checked."""
    if neighbours == "add_remove":
        base = _calibrate_add_remove(noise, k, m, epsilon, delta)
        factor, how = 1.0, _without_assumption(base.derivation)
    else:
        base = _calibrate_add_remove(noise, k, m, epsilon, delta if noise == "gumbel" else 0.0)
        factor = 2.0
        how = (
            _without_assumption(base.derivation).replace("(add/remove one client)", "")
            + " (replace one client: twice the scale, Durfee & Rogers Lemma 4.3 non-monotone)"
        )
    scale = factor * sensitivity * base.scale
    check_scale(scale, f"{noise} calibration (sensitivity {sensitivity:g})")
    assumption = assumption_text(sensitivity)
    if neighbours == "replace":
        assumption = assumption.replace("add/remove-one-client", "replace-one-client")
    bound = score_bound(scale, sensitivity)
    return PrivacyGuarantee(
        base.epsilon,
        base.delta,
        noise,
        scale,
        f"{how}; scale = {sensitivity:g} x the unit scale; {bound_text(bound)}; {assumption}",
        sensitivity,
        score_bound=bound,
    )


def _calibrate_add_remove(
    noise: str, k: int, m: int, epsilon: float, delta: float
) -> PrivacyGuarantee:
    if noise == "gumbel":
        eps0 = epsilon / k
        check_scale(k / epsilon, "gumbel calibration")
        how = (
            "Wu et al. 2023, Fact 3.3 (Durfee & Rogers 2019, Cor. 4.1): Gumbel one-shot, "
            "pure: eps = k*eps0 (add/remove one client)"
        )
        used_delta = 0.0
        if delta > 0.0:
            # Lemma 4.4 is increasing in eps0 and <= k*eps0 = epsilon at the pure eps0; its last
            # term grows without bound: double until it passes epsilon, then find the root.
            def excess(e: float) -> float:
                return gumbel_topk_epsilon(k, e, delta) - epsilon

            from scipy.optimize import brentq  # here: half a second to import

            high = 2.0 * eps0
            while excess(high) <= 0.0:
                high *= 2.0
            # excess(eps0) can round to >= 0 when the pure term is the minimum (k eps0 = epsilon
            # up to an ulp): then no advanced eps0 beats the pure one
            advanced = (
                brentq(excess, eps0, high, xtol=1e-300, rtol=1e-14) * (1.0 - 1e-12)
                if excess(eps0) < 0.0
                else eps0
            )  # err below the root: never exceed the requested epsilon
            if advanced > eps0 * (1 + 1e-12):
                eps0 = advanced
                used_delta = delta
                how = (
                    "Wu et al. 2023, Fact 3.3 as Durfee & Rogers 2019 give it (Lemmas 4.2-4.4, "
                    "Cor. 4.1): Gumbel one-shot, eps = min{k*eps0*tanh(eps0/2) + "
                    "eps0*sqrt(2k*ln(1/delta)), k*eps0^2/2 + eps0*sqrt(k*ln(1/delta)/2)} "
                    "(add/remove one client)"
                )
        achieved = gumbel_topk_epsilon(k, eps0, used_delta)
        return PrivacyGuarantee(achieved, used_delta, "gumbel", 1.0 / eps0, how)
    if noise == "laplace":
        check_scale(2.0 * k / epsilon, "laplace calibration")
        eps0 = epsilon / (2.0 * k)
        how = (
            "Wu et al. 2023, Fact 3.2 (Qiao et al. 2021): Laplace one-shot, pure: eps = 2*k*eps0 "
            "(add/remove one client)"
        )
        used_delta = 0.0
        if (
            0.0 < delta <= LAPLACE_ADVANCED_MAX_DELTA
            and m >= 2
            and epsilon <= LAPLACE_ADVANCED_MAX_EPSILON
        ):
            advanced = epsilon / (8.0 * math.sqrt(k * (math.log(m) - math.log(delta))))
            if advanced > eps0:
                eps0 = advanced
                used_delta = delta
                how = (
                    "Wu et al. 2023, Fact 3.2 (Qiao et al. 2021): Laplace one-shot, "
                    "eps = 8*eps0*sqrt(k*ln(m/delta)) (m >= 2, delta <= 0.05, eps <= 0.2) "
                    "(add/remove one client)"
                )
        achieved = laplace_topk_epsilon(k, m, eps0, used_delta)
        return PrivacyGuarantee(achieved, used_delta, "laplace", 1.0 / eps0, how)
    raise ValueError(f"noise must be 'gumbel' or 'laplace', got {noise!r}")
