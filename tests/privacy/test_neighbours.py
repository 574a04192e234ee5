"""Neighbour relations: add/remove one client (the default) and replace one client.

Statistical audit of the replace-one calibration on the worst-case neighbouring pair of a k = 1
selection: h = (1, 0, ..., 0) and h' = (0, 1, ..., 1) (one client's votes replaced: every count
moves by 1, item 0 down, the others up). The event "item 0 is released" has the largest
probability ratio. For each mechanism: the observed frequency matches the exact probability of
the replace-calibrated law (binomial test, fails at p < 1e-4), and a Clopper-Pearson lower bound
(99.9% each side) on the ratio stays below e^epsilon. The add/remove calibration on the same
pair is caught: its lower bound exceeds e^epsilon, so the audit can fail.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from scipy.stats import beta, binomtest

from adapters.memory import ArraySource
from topk_middleware import (
    calibrate,
    exponential_mechanism,
    joint_top_k,
    limited_domain_top_k,
    peeling_top_k,
    private_top_k,
    stable_top_k,
)

M, EPSILON, RUNS = 20, 1.0, 6000
H = np.r_[1.0, np.zeros(M - 1)]
H_PRIME = np.r_[0.0, np.ones(M - 1)]


def exact_p0(a: float, h: np.ndarray) -> float:
    """P(item 0) of the exponential mechanism with weights exp(a h)."""
    w = np.exp(a * h)
    return float(w[0] / w.sum())


def frequency(release: Callable[[ArraySource, int], Any], h: np.ndarray) -> int:
    source = ArraySource(h)
    return sum(release(source, seed).items[0] == 0 for seed in range(RUNS))


def ratio_lower_bound(x: int, y: int, n: int) -> float:
    """A 99.9%-each-side lower bound on p / p' from x and y successes out of n."""
    p_low = beta.ppf(1e-3, x, n - x + 1)
    q_high = beta.ppf(1 - 1e-3, y + 1, n - y)
    return p_low / q_high


MECHANISMS = {
    # name: (release under replace, weight a of exp(a h) it must have)
    "private_top_k": (
        lambda s, seed: private_top_k(s, 1, EPSILON, method="oneshot", seed=seed,
                                      neighbours="replace"),
        EPSILON / 2,
    ),
    "exponential_mechanism": (
        lambda s, seed: exponential_mechanism(s, EPSILON, seed=seed, neighbours="replace"),
        EPSILON / 2,
    ),
    "peeling_top_k": (
        lambda s, seed: peeling_top_k(s, 1, EPSILON, seed=seed, neighbours="replace"),
        EPSILON / 2,
    ),
    "joint_top_k": (
        lambda s, seed: joint_top_k(s, 1, EPSILON, seed=seed, neighbours="replace"),
        EPSILON / 4,  # u = h_i - max h moves by 2 under replace: exp(eps u / 4)
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_replace_one_calibration_passes_the_audit(name: str) -> None:
    release, a = MECHANISMS[name]
    x, y = frequency(release, H), frequency(release, H_PRIME)
    assert binomtest(x, RUNS, exact_p0(a, H)).pvalue > 1e-4
    assert binomtest(y, RUNS, exact_p0(a, H_PRIME)).pvalue > 1e-4
    assert ratio_lower_bound(x, y, RUNS) <= math.exp(EPSILON)


def test_the_add_remove_calibration_fails_the_same_audit() -> None:
    """What the audit catches: weights exp(eps h) on a replace pair give about e^(1.9 eps)."""

    def release(s: ArraySource, seed: int) -> Any:
        return private_top_k(s, 1, EPSILON, method="oneshot", seed=seed)

    x, y = frequency(release, H), frequency(release, H_PRIME)
    assert ratio_lower_bound(x, y, RUNS) > math.exp(EPSILON)


@pytest.mark.parametrize(("noise", "delta"), [("gumbel", 0.0), ("gumbel", 1e-6), ("laplace", 0)])
def test_replace_doubles_the_scale_for_the_same_guarantee(noise: str, delta: float) -> None:
    add_remove = calibrate(noise, 20, 1000, 1.0, delta)
    replace = calibrate(noise, 20, 1000, 1.0, delta, "replace")
    assert replace.scale == 2 * add_remove.scale
    assert (replace.epsilon, replace.delta) == (add_remove.epsilon, add_remove.delta)
    assert "replace one client" in replace.derivation
    assert "add/remove one client" in add_remove.derivation


def test_replace_with_laplace_keeps_only_the_pure_bound() -> None:
    g = calibrate("laplace", 300, 10**4, 0.2, 0.01, "replace")
    assert g.delta == 0.0 and g.scale == pytest.approx(2 * 2 * 300 / 0.2)


@pytest.mark.parametrize(
    "release",
    [
        lambda s: stable_top_k(s, 0.5, 1e-3, k=2, neighbours="replace"),
        lambda s: limited_domain_top_k(s, 2, 4, 1.0, 1e-3, neighbours="replace"),
    ],
)
def test_no_replace_calibration_is_refused_before_reading(release: Any) -> None:
    class Untouchable(ArraySource):
        def read_sorted(self, start: int, count: int) -> Any:
            raise AssertionError("a row was read")

    with pytest.raises(ValueError, match="add/remove-one-client neighbours only"):
        release(Untouchable(np.arange(10.0)))


def test_unknown_relation_is_refused() -> None:
    with pytest.raises(ValueError, match="neighbours must be one of"):
        private_top_k(ArraySource(H), 1, 1.0, neighbours="swap")  # type: ignore[arg-type]
