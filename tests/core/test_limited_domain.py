"""Limited-domain top-k (Durfee & Rogers 2019, Algorithm 1): exact output distribution, the
clear-gap and flat cases, sorted access only, and its Theorem 1 guarantee."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from scipy import stats

from adapters.memory import ArraySource
from tests.helpers import same_on_store
from topk_middleware.access import Source
from topk_middleware.mechanisms.limited_domain import limited_domain_top_k, threshold_offset


def exact_outcomes(
    top: list[float], h_next: float, k: int, eps: float, delta: float
) -> dict[tuple, float]:
    """Algorithm 1 as a Gumbel race among the k_bar items and the bottom item with count h_bot:
    the release is the Plackett-Luce order (weights exp(eps h)) cut at the bottom item or after
    k items. Returns the probability of every possible release."""
    k_bar = len(top)
    h_bot = h_next + 1 + math.log(k_bar / delta) / eps
    weight = dict(enumerate(np.exp(eps * (np.asarray(top) - h_bot)).tolist()))
    weight["bot"] = 1.0
    outcomes: dict[tuple, float] = {}
    for length in range(k + 1):
        for items in itertools.permutations(range(k_bar), length):
            release = items if length == k else (*items, "bot")
            p, left = 1.0, sum(weight.values())
            for name in release:
                p *= weight[name] / left
                left -= weight[name]
            outcomes[release] = p
    return outcomes


def test_distribution_is_the_thresholded_gumbel_race() -> None:
    """15,000 runs against the exact probabilities of every outcome (chi-square, 0.1 %): items
    above the noisy threshold in noisy order, at most k, bottom when fewer. Fails if the
    threshold offset, the noise scale or the cut at k were wrong."""
    scores = [33.0, 32.0, 31.0, 27.0, 20.0, 10.0, 0.0]
    k, k_bar, eps, delta = 2, 3, 1.0, 0.3
    source = ArraySource(scores)
    probs = exact_outcomes(scores[:k_bar], scores[k_bar], k, eps, delta)
    assert math.isclose(sum(probs.values()), 1.0)
    n = 15_000
    seen = Counter()
    for s in range(n):
        r = limited_domain_top_k(source, k, k_bar, eps, delta, seed=s)
        seen[(*r.items, "bot") if r.bottom else tuple(r.items)] += 1
    keys = [key for key in probs if probs[key] * n >= 5]
    assert len(keys) == len(probs) == 10  # every release has expected count >= 5
    assert sum(seen.values()) == n and set(seen) <= set(probs)
    observed = [seen[key] for key in keys]
    expected = [probs[key] * n for key in keys]
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_clear_gap_returns_true_top_k() -> None:
    """Lemma 3.1: with h_(k) far above h_(k_bar+1) + 1 + ln(k_bar/delta)/eps all k come out."""
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 10, 10_000).astype(float)
    top = rng.choice(10_000, 5, replace=False)
    scores[top] = [400, 390, 380, 370, 360]
    for s in range(200):
        r = limited_domain_top_k(ArraySource(scores), 5, 20, 0.5, 1e-6, seed=s)
        assert set(r.items) == set(top.tolist()) and not r.bottom
        assert (r.accesses.sorted, r.accesses.random) == (21, 0)


def test_flat_histogram_returns_bottom() -> None:
    """Every count equal: the threshold sits 1 + ln(k_bar/delta)/eps above them all."""
    for s in range(200):
        r = limited_domain_top_k(ArraySource(np.full(500, 50.0)), 5, 30, 1.0, 1e-6, seed=s)
        assert r.items == [] and r.bottom
        assert r.accesses.total == 31 and r.accesses.rows_fetched == 31


def test_restricted_sensitivity_lowers_the_threshold() -> None:
    assert threshold_offset(100, 0.5, 1e-6, None) == pytest.approx(1 + math.log(1e8) / 0.5)
    assert threshold_offset(100, 0.5, 1e-6, 1) == pytest.approx(1 + math.log(1e6) / 0.5)
    assert threshold_offset(3, 0.5, 1e-6, 10) == threshold_offset(3, 0.5, 1e-6, None)


def test_reported_guarantee_is_theorem_1() -> None:
    r = limited_domain_top_k(ArraySource(np.arange(100.0)), 10, 20, 0.1, 1e-7, delta_prime=1e-6)
    assert r.privacy.epsilon == pytest.approx(0.8811, abs=5e-5)
    assert r.privacy.delta == pytest.approx(1e-7 + 1e-6)
    pure = limited_domain_top_k(ArraySource(np.arange(100.0)), 10, 20, 0.1, 1e-7)
    assert (pure.privacy.epsilon, pure.privacy.delta) == (pytest.approx(1.0), 1e-7)


def test_bad_input_is_refused() -> None:
    source = ArraySource(np.arange(10.0))
    with pytest.raises(ValueError, match="k_bar must be >= k"):
        limited_domain_top_k(source, 5, 3, 1.0, 1e-6)
    with pytest.raises(ValueError, match="delta"):
        limited_domain_top_k(source, 2, 3, 1.0, 0.0)
    with pytest.raises(ValueError, match="k_bar = 10 must be < m"):
        limited_domain_top_k(source, 2, 10, 1.0, 1e-6)
    with pytest.raises(ValueError, match="sensitivity"):
        limited_domain_top_k(source, 2, 3, 1.0, 1e-6, sensitivity=0)


def test_same_answer_on_every_store(make_store: Callable[[Any, Any], Source]) -> None:
    same_on_store(
        make_store,
        "zipf",
        lambda s, seed: limited_domain_top_k(s, 5, 40, 0.5, 1e-6, seed=seed),
    )
