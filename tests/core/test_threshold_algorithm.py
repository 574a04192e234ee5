"""Fagin's Threshold Algorithm (Algorithm 1) against brute force."""

from __future__ import annotations

import numpy as np
import pytest

from topk_middleware import ArrayList, threshold_algorithm

AGGREGATES = {
    "sum": sum,
    "min": min,
    "max": max,
    "weighted": lambda values: sum((i + 1) * v for i, v in enumerate(values)),
}


@pytest.mark.parametrize("aggregate", sorted(AGGREGATES))
@pytest.mark.parametrize("lists", [1, 2, 3, 5])
def test_ta_equals_brute_force(aggregate: str, lists: int) -> None:
    """On random inputs TA returns the k items with the largest aggregate, in order.

    Values are continuous (no ties), so the brute-force answer is unique; any error in the
    stopping rule or the memoisation of seen items changes the answer on some of the 60 inputs.
    """
    f = AGGREGATES[aggregate]
    rng = np.random.default_rng(lists * 100 + len(aggregate))
    for trial in range(60):
        m = int(rng.integers(1, 60))
        k = int(rng.integers(1, m + 1))
        items = [f"item{i}" for i in rng.permutation(m)]
        columns = [rng.exponential(1.0, m) * rng.choice([1, 10]) for _ in range(lists)]
        result = threshold_algorithm([ArrayList(items, col) for col in columns], k, f)
        totals = np.array([f([col[i] for col in columns]) for i in range(m)])
        best = np.argsort(-totals, kind="stable")[:k]
        assert result.items == [items[i] for i in best], (trial, m, k)
        np.testing.assert_allclose(result.scores, totals[best])


def test_ta_stops_early_and_never_completes_an_item_twice() -> None:
    """On skewed lists TA stops after a few steps; each item is completed at most once."""
    m, k = 10_000, 5
    rng = np.random.default_rng(1)
    base = rng.pareto(1.0, m) * 100
    items = list(range(m))
    lists = [ArrayList(items, base + rng.random(m)), ArrayList(items, base + rng.random(m))]
    result = threshold_algorithm(lists, k)
    assert result.steps < 100
    for position, current in enumerate(lists):
        other = lists[1 - position]
        # every random access on `current` completes an item first seen on `other`
        assert current.random_accesses <= other.sorted_accesses
    totals = lists[0].values + lists[1].values
    assert result.items == list(np.argsort(-totals, kind="stable")[:k])


def test_ta_with_ties_returns_a_correct_top_k() -> None:
    """With tied aggregates any k items with the k largest values are correct."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        m = int(rng.integers(2, 30))
        k = int(rng.integers(1, m + 1))
        a, b = rng.integers(0, 3, m).astype(float), rng.integers(0, 3, m).astype(float)
        result = threshold_algorithm(
            [ArrayList(list(range(m)), a), ArrayList(list(range(m)), b)], k
        )
        assert sorted(result.scores, reverse=True) == sorted(a + b, reverse=True)[:k]
        assert [a[i] + b[i] for i in result.items] == result.scores


def test_ta_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one list"):
        threshold_algorithm([], 1)
    with pytest.raises(ValueError, match="k must be >= 1"):
        threshold_algorithm([ArrayList([1], [1.0])], 0)
    with pytest.raises(ValueError, match="same length"):
        ArrayList([1, 2], [1.0])
