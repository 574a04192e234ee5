"""Noisy counts beside a private top-k: the budget split, the noise, and the guarantee of both.

`private_top_k(..., with_counts=True, counts_share=s)` spends (1 - s) epsilon (and all of delta)
on the selection and s epsilon on the counts. The counts of the k selected items are read by
random access (counted), exactly where the store can (`CountedAccess.exact_scores_of`: integer
columns as Python ints, with no detour through a double), and each is released as

    c~ = min(round(count), C) + Z,   Z ~ discrete Laplace of scale t = n ceil(D) / (s eps)

with D the source's sensitivity, L its bound on how many items one client counts in
(`max_items_per_client`), n = min(k, L) under add/remove-one-client neighbours and min(k, 2L)
under replace-one-client neighbours (the old client's L items and the new one's; n = k where the
source declares no L), round() to the nearest integer (halves up;
the identity on integer counts), and C = COUNT_BOUND (2^62, room for the noise in a signed
64-bit integer) or, where the counts can only be read as doubles, 2^53 (below which a double
holds every integer, so an integer count read as a double and then clamped is exact).

* Privacy. A client changes each count by at most D (a replaced client too: it removes at most
  D from a count and its replacement adds at most D, so the count moves by at most D either
  way), so round(count) by at most ceil(D) (round(x) = floor(x + 1/2), and |floor a - floor b|
  <= ceil |a - b|), and the clamp by no more (monotone, 1-Lipschitz); it changes at most n of the
  k counts released. So the vector of k rounded counts moves by at most n ceil(D) in L1 norm,
  and k independent discrete Laplace noises of scale t make it (n ceil(D) / t) = s epsilon -DP
  (Canonne, Kamath &
  Steinke 2020, discrete_noise.py; the L1 form of the Laplace mechanism's proof, Dwork & Roth
  2014, Theorem 3.6, holds for the discrete law term by term).
* Which items' counts are released is the selection's output: the counts step is chosen
  adaptively from it, and basic composition, which holds for adaptively chosen mechanisms
  (Dwork & Roth 2014, Theorem 3.16 and Section 3.5), gives the whole release
  ((1 - s) epsilon's guarantee + s epsilon, delta)-DP.
* The interval. `count_error` is w, the least integer with P(|Z| <= w) >= 95% (exact for the
  discrete Laplace law), where the source's counts are integers (an integer column: a public
  fact of its schema): then count lies in c~ +/- w with probability P(|Z| <= w). Elsewhere the
  counts may be fractional (weighted votes) and |round(count) - count| <= 1/2, so count_error
  is w + 1 and count lies in c~ +/- (w + 1) with probability at least P(|Z| <= w) >= 95%. Both
  hold for counts up to C (above it the release is about C).
* Timing. The exact sampler loops a random number of times (its running time grows with |Z|).
  The k noises are drawn after the charge and before any row is read; in an oblivious release
  that is inside the padded window, whose deadline adds `counts_seconds(k)`: COUNT_DRAWS_FLOOR
  plus COUNT_DRAW_SECONDS a count (a single draw measured median 46-59 us, slowest of 3,000
  draws 0.8-6.7 ms on the loaded 2-core development machine, scales 1/2 to 2^40; 10,000 draws
  took 4.9-5.3 s, 0.5 ms a draw, at load average 26). At most COUNTS_MAX_K counts a release
  (refused before anything is read or charged), so the draws and their padding stay within a
  few seconds.

The cost charged to a budget (once) carries the pure / approximate pairs and, when the selection
has a zCDP form, rho_selection + n (s epsilon / n)^2 / 2 with n as above: at most n counts
move, each by at most ceil(D), so each is (s epsilon / n)-DP and its zCDP is that squared over 2
(Bun & Steinke 2016, Proposition 1.4), summed over the n (their Lemma 2.3).
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
COUNT_BOUND = 2**62  # counts above are released about it (a signed 64-bit integer holds c~)
DOUBLE_COUNT_BOUND = 2**53  # the same where counts are read as doubles (module docstring)
COUNT_DRAW_SECONDS = 1e-3  # a bound on the mean time of one exact draw (module docstring)
COUNT_DRAWS_FLOOR = 0.05  # room for the slowest single draws (module docstring: Timing)
COUNTS_MAX_K = 4000  # the most noisy counts one release draws (module docstring: Timing)
INT64_MAX = 2**63 - 1


def counts_seconds(k: int) -> float:
    """A bound on the time to draw k count noises: what an oblivious release's deadline adds for
    them (they are drawn inside its padded window)."""
    return COUNT_DRAWS_FLOOR + k * COUNT_DRAW_SECONDS


def check_counts_k(k: int) -> None:
    """Refuse noisy counts for more than COUNTS_MAX_K items (work known before anything is read
    or charged: k exact draws and their padding)."""
    if k > COUNTS_MAX_K:
        raise ValueError(
            f"with_counts releases at most {COUNTS_MAX_K} counts (k = {k}): ask for a smaller k, "
            "or release the items without counts"
        )


def check_counts_share(counts_share: Any) -> float:
    """The share of epsilon spent on the counts: a real number strictly between 0 and 1."""
    if isinstance(counts_share, bool) or not isinstance(counts_share, numbers.Real):
        raise TypeError(f"counts_share must be a number in (0, 1), got {counts_share!r}")
    share = float(counts_share)
    if not (0.0 < share < 1.0):
        raise ValueError(f"counts_share must be in (0, 1), got {counts_share!r}")
    return share


def whole_count(value: Any) -> int:
    """round(value) (halves up) as a Python int, exactly: ints as they are, doubles and decimals
    through their exact rational value."""
    if isinstance(value, int | np.integer):
        return int(value)
    exact = Fraction(value.item() if isinstance(value, np.generic) else value)
    return math.floor(exact + Fraction(1, 2))


@dataclass(frozen=True)
class CountsPlan:
    """How the counts are noised: the exact rational scale, its epsilon and the interval."""

    k: int
    epsilon: float  # spent on the counts (the k counts together)
    sensitivity: int  # ceil(D): the most one client moves a rounded count
    changed: int  # min(k, L), min(k, 2L) under replace: how many of the k counts can move
    scale: Fraction  # discrete Laplace scale t = changed * ceil(D) / epsilon, exactly
    half_width: int  # w: P(|Z| <= w) >= 95%, the least such
    integer_counts: bool  # the source's counts are integers (its schema says so)

    @classmethod
    def make(
        cls,
        k: int,
        epsilon: float,
        sensitivity: float,
        max_items: int | None = None,
        integer_counts: bool = True,
        neighbours: str = "add_remove",
    ) -> CountsPlan:
        whole = math.ceil(sensitivity)
        # replacing a client removes its items' counts and adds the new client's: 2L move
        moved = (
            None if max_items is None else int(max_items) * (2 if neighbours == "replace" else 1)
        )
        changed = k if moved is None else min(k, moved)
        scale = Fraction(changed * whole) / Fraction(epsilon)  # exact: epsilon is a double
        return cls(
            k,
            epsilon,
            whole,
            changed,
            scale,
            discrete_laplace_half_width(float(scale), COUNT_INTERVAL_LEVEL),
            bool(integer_counts),
        )

    @property
    def count_error(self) -> int:
        """The released interval's half-width (module docstring): w, or w + 1 where counts may
        be fractional."""
        return self.half_width if self.integer_counts else self.half_width + 1

    def draw(self, rng: np.random.Generator) -> tuple[int, ...]:
        """The k noises, exactly (drawn before any read: module docstring, Timing)."""
        return tuple(discrete_laplace(rng, self.scale) for _ in range(self.k))

    def release(
        self, noises: tuple[int, ...], values: list[Any], exact: bool = True
    ) -> tuple[int, ...]:
        """min(round(count), C) + Z for each count read (`exact`: read without a double,
        C = COUNT_BOUND; else C = DOUBLE_COUNT_BOUND), as Python ints within a signed 64-bit
        integer (a noise beyond it, far past any realistic scale, is saturated)."""
        bound = COUNT_BOUND if exact else DOUBLE_COUNT_BOUND
        return tuple(
            max(-INT64_MAX, min(INT64_MAX, max(0, min(whole_count(v), bound)) + z))
            for v, z in zip(values, noises, strict=True)
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
            f"selection: {selection.derivation}; counts: each released as min(round(count), "
            f"C) + discrete Laplace noise of scale {float(plan.scale):.6g} (C = 2^62, or 2^53 "
            "where the store serves counts as doubles; Canonne, Kamath "
            f"& Steinke 2020): the {plan.k} rounded counts move by at most {plan.changed} x "
            f"{plan.sensitivity} in L1 norm (at most {plan.changed} of them, each by at most "
            f"ceil(sensitivity)), epsilon {plan.epsilon:.6g}; whole: basic composition (Dwork "
            "& Roth 2014, Thm 3.16)"
        ),
        counts_epsilon=plan.epsilon,
        counts_scale=float(plan.scale),
    )


def with_counts_cost(selection: PrivacyCost, plan: CountsPlan) -> PrivacyCost:
    """The cost of the selection plus its counts, charged once (module docstring)."""
    pairs = tuple((eps + plan.epsilon, delta) for eps, delta in selection.dp_pairs())
    rho = None
    if selection.rho is not None:
        # at most `changed` counts move, each (epsilon / changed)-DP: their zCDP adds up
        rho = selection.rho + plan.changed * pure_dp_zcdp(plan.epsilon / plan.changed)
    return PrivacyCost(
        mechanism=f"{selection.mechanism} with noisy counts",
        epsilon=None if selection.epsilon is None else selection.epsilon + plan.epsilon,
        delta=selection.delta,
        rho=rho,
        approx=tuple(p for p in pairs if p[1] > 0.0),
        sources=(
            *selection.sources,
            "counts: k discrete Laplace noises on an L1-sensitivity-bounded vector, pure "
            "epsilon; whole: basic composition (Dwork & Roth Thm 3.16); zCDP: Bun & Steinke "
            "2016 Prop. 1.4",
        ),
    )
