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

from adapters.memory import ArraySource
from tests.helpers import assert_law_and_scale, same_on_store
from tests.helpers import plackett_luce as pl
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


def test_peeling_is_plackett_luce_and_matches_oneshot() -> None:
    """4,000 peeling runs and 4,000 one-shot Gumbel runs (scale k/eps), each against the exact
    Plackett-Luce probabilities: cells expected 5 times or more and the rest pooled (72 cells),
    Pearson's chi-square and the score test of the scale at 5e-4 each
    (tests.helpers.assert_law_and_scale). Fails if peeling used the wrong step epsilon (e.g.
    eps / (2k), a scale twice k / eps: probability 1.0), drew with replacement (a repeated item
    has no cell) or misordered, and either law with a scale 10% off (10% too small: 1.0, too
    large: 0.99995; simulated, 20,000 samples of 4,000; the chi-square of 20,000 peeling runs
    alone: 1.0 and 1.0, and a two-sample test against 20,000 one-shot runs has the power of a
    one-sample test of 10,000 of them)."""
    source = ArraySource(SCORES)
    n = 4_000
    probs = plackett_luce()
    outcomes = list(probs)
    keep = np.array([probs[o] * n >= 5 for o in outcomes])

    def law(scale: float) -> np.ndarray:
        weights = np.exp(np.asarray(SCORES) / scale)
        p = np.array([pl(weights, o) for o in outcomes])
        return np.append(p[keep], p[~keep].sum())

    def cells(counts: Counter) -> np.ndarray:
        observed = np.array([counts[o] for o in outcomes])
        assert observed.sum() == n
        return np.append(observed[keep], observed[~keep].sum())

    assert keep.sum() == 71
    peel = Counter(tuple(peeling_top_k(source, K, EPS, seed=s).items) for s in range(n))
    assert_law_and_scale(cells(peel), law, K / EPS)
    oneshot = Counter(
        tuple(private_top_k(source, K, EPS, method="oneshot", seed=10**6 + s).items)
        for s in range(n)
    )
    assert_law_and_scale(cells(oneshot), law, K / EPS)


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
