"""Peeling (Durfee & Rogers 2019, Section 4.1): its ranked output follows Plackett-Luce with weights
exp((epsilon/k) h), i.e. it equals the one-shot Gumbel top-k in distribution (their Lemma 4.2)."""

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
from topk_middleware import private_top_k
from topk_middleware.access import Source
from topk_middleware.mechanisms.peeling import peeling_top_k

SCORES = [6.0, 5.0, 5.0, 3.0, 1.0, 0.0]
K, EPS = 3, 1.5  # per-step weight exp(0.5 h)


def plackett_luce() -> dict[tuple[int, ...], float]:
    weights = np.exp(np.asarray(SCORES) * EPS / K)
    probs = {}
    for seq in itertools.permutations(range(len(SCORES)), K):
        p, left = 1.0, weights.sum()
        for i in seq:
            p *= weights[i] / left
            left -= weights[i]
        probs[seq] = p
    return probs


def chi_square_p(samples: Counter, probs: dict[tuple[int, ...], float], n: int) -> float:
    keys = [key for key in probs if probs[key] * n >= 5]
    observed = [samples[key] for key in keys] + [n - sum(samples[key] for key in keys)]
    expected = [probs[key] * n for key in keys] + [n * (1 - sum(probs[key] for key in keys))]
    return float(stats.chisquare(observed, expected).pvalue)


def test_peeling_is_plackett_luce_and_matches_oneshot() -> None:
    """20,000 peeling runs against the exact Plackett-Luce probabilities (chi-square), and
    against 20,000 one-shot Gumbel runs (scale k/eps; two-sample chi-square). Fails at the
    0.1 % level if peeling used the wrong step epsilon, drew with replacement, or misordered."""
    source = ArraySource(SCORES)
    n = 20_000
    peel = Counter(tuple(peeling_top_k(source, K, EPS, seed=s).items) for s in range(n))
    probs = plackett_luce()
    assert chi_square_p(peel, probs, n) > 1e-3
    oneshot = Counter(
        tuple(private_top_k(source, K, EPS, method="oneshot", seed=10**6 + s).items)
        for s in range(n)
    )
    keys = [key for key in probs if probs[key] * n >= 5]
    table = np.array([[peel[key] for key in keys], [oneshot[key] for key in keys]])
    assert stats.chi2_contingency(table).pvalue > 1e-3


def test_accesses_and_guarantee() -> None:
    result = peeling_top_k(ArraySource(np.arange(1000.0)), 10, 1.0, seed=3)
    assert (result.accesses.sorted, result.accesses.random) == (1000, 0)
    assert result.ranked and len(set(result.items)) == 10
    assert result.privacy.epsilon == 1.0 and result.privacy.delta == 0.0
    cost = result.cost
    assert cost is not None and cost.range_bounded == (0.1,) * 10
    assert cost.rho == pytest.approx(10 * 0.1**2 / 8)
    assert math.isclose(sum(cost.range_bounded), cost.epsilon or 0)


def test_clear_winners_and_determinism() -> None:
    scores = np.zeros(5000)
    scores[[17, 4000, 123]] = [10_000, 9_000, 8_000]
    a = peeling_top_k(ArraySource(scores), 3, 1.0, seed=5)
    b = peeling_top_k(ArraySource(scores), 3, 1.0, seed=5)
    assert a.items == b.items == [17, 4000, 123]


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        peeling_top_k(ArraySource([1.0, 2.0]), 3, 1.0)
    with pytest.raises(ValueError, match="epsilon"):
        peeling_top_k(ArraySource([1.0, 2.0]), 1, 0.0)


def test_same_answer_on_every_store(make_store: Callable[[Any, Any], Source]) -> None:
    same_on_store(make_store, "text-ties", lambda s, seed: peeling_top_k(s, 4, 2.0, seed=seed))
