"""The joint exponential mechanism (Gillenwater et al. 2022) against brute-force enumeration of
every k-subset: exact integer counts, and the output distribution (chi-square)."""

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
from tests.helpers import assert_law_and_scale, same_on_store
from topk_middleware.access import Source
from topk_middleware.mechanisms.joint import count_sets, joint_top_k, sample_joint


def utility(counts: np.ndarray, subset: tuple[int, ...]) -> float:
    """-max_i (c_(i) - s_(i)), written from the definition (Lemma 5)."""
    top = np.sort(counts)[::-1]
    mine = np.sort(counts[list(subset)])[::-1]
    return -float(np.max(top[: len(subset)] - mine))


def exact(counts: np.ndarray, k: int, eps: float) -> dict[frozenset[int], float]:
    weights = {
        frozenset(s): math.exp(eps * utility(counts, s) / 2)
        for s in itertools.combinations(range(len(counts)), k)
    }
    total = sum(weights.values())
    return {s: w / total for s, w in weights.items()}


def chi_square_p(samples: Counter, probs: dict[frozenset[int], float], n: int) -> float:
    keys = [key for key in probs if probs[key] * n >= 5]
    observed = [samples[key] for key in keys] + [n - sum(samples[key] for key in keys)]
    expected = [probs[key] * n for key in keys] + [n * (1 - sum(probs[key] for key in keys))]
    if expected[-1] < 1e-9:
        observed, expected = observed[:-1], expected[:-1]
    return float(stats.chisquare(observed, expected).pvalue)


@pytest.mark.parametrize(
    ("counts", "k"),
    [
        ([9, 7, 7, 4, 2, 2, 1, 0], 3),
        ([5, 5, 5, 5, 5, 5], 2),
        ([100, 50, 49, 3, 3, 2, 0, 0, 0], 4),
        ([10.5, 3.25, 3.0, 1.0], 1),
    ],
)
def test_exact_counts_equal_enumeration(counts: list[float], k: int) -> None:
    """N(t) = #{k-subsets with utility >= -t} as exact integers, for every t that occurs."""
    c = np.asarray(counts, dtype=float)
    utilities = [utility(c, s) for s in itertools.combinations(range(len(c)), k)]
    for t in sorted({-u for u in utilities}):
        assert count_sets(c, k, t) == sum(1 for u in utilities if -u <= t)
    assert count_sets(c, k, math.inf) == math.comb(len(c), k)


@pytest.mark.parametrize("positions", ["ranks", "input"])
def test_distribution_equals_enumeration(positions: str) -> None:
    """5,000 releases against exact probabilities over all 35 subsets: Pearson's chi-square and
    the score test of the scale 1 / eps at 5e-4 each (tests.helpers.assert_law_and_scale).
    Fails if the threshold weights, the "exactly t" set counts or the uniform draw within a
    utility class were wrong (ties included: 7, 7 and 2, 2), or, with positions apart from
    ranks, if a drawn rank were mapped to the wrong item: the counts 2 and 4 swapped fail with
    probability 1.0, an epsilon 10% too large 1.0, 10% too small 0.99997 (simulated, 40,000
    samples of 5,000; the chi-square alone of 10,000 releases: 1.0 and 0.99997)."""
    counts = np.array([7.0, 2, 9, 7, 1, 4, 2])
    k, eps, n = 3, 1.0, 5_000
    source = ArraySource(counts, positions=positions)
    samples = Counter(frozenset(joint_top_k(source, k, eps, seed=s).items) for s in range(n))
    subsets = list(exact(counts, k, eps))

    def law(scale: float) -> np.ndarray:
        probs = exact(counts, k, 1.0 / scale)
        return np.array([probs[s] for s in subsets])

    assert law(1.0 / eps).min() * n >= 5
    observed = np.array([samples[s] for s in subsets])
    assert observed.sum() == n
    assert_law_and_scale(observed, law, 1.0 / eps)


def test_undecided_draws_fall_back_to_full_enumeration() -> None:
    """With a negative margin the enumerated thresholds often cannot decide the draw; the
    fallback enumerates everything with the same uniform, and the distribution stays exact."""
    counts = np.array([12.0, 10, 9, 6, 5, 3, 1, 0])
    k, eps, n = 2, 0.8, 10_000
    probs = exact(counts, k, eps)
    rng = np.random.default_rng(11)
    samples = Counter(
        frozenset(sample_joint(counts, len(counts), k, eps, rng, margin=-3.0) or ())
        for _ in range(n)
    )
    assert chi_square_p(samples, probs, n) > 1e-3


def test_prefix_read_is_exact_and_sublinear() -> None:
    """Counts far below c_(k) are never read (sorted accesses stop there); the distribution over
    the sets of the top items is still the exact one."""
    counts = np.array([300.0, 299, 298, 297, 296] + [0.0] * 995)
    k, eps, n = 2, 1.0, 4_000
    source = ArraySource(counts)
    results = [joint_top_k(source, k, eps, seed=s) for s in range(n)]
    assert all(r.accesses.sorted < 100 and r.accesses.random == 0 for r in results)
    samples = Counter(frozenset(r.items) for r in results)
    top = counts[:5]
    probs = exact(top, k, eps)  # sets with a zero-count item weigh < e^-140 of these
    assert chi_square_p(samples, probs, n) > 1e-3


def test_plateau_reads_everything_and_is_uniform() -> None:
    counts = np.full(50, 7.0)
    result = joint_top_k(ArraySource(counts), 5, 1.0, seed=2)
    assert result.accesses.sorted == 50 and len(set(result.items)) == 5
    assert not result.ranked and result.privacy.epsilon == 1.0
    first = Counter(
        item for s in range(2000) for item in joint_top_k(ArraySource(counts), 5, 1.0, seed=s).items
    )
    assert stats.chisquare([first[i] for i in range(50)]).pvalue > 1e-3


def test_large_skewed_domain() -> None:
    from frontends.cli import zipf_histogram

    h = zipf_histogram(10**5)
    assert np.array_equal(h, np.floor(h))  # whole counts: an integer column (the work cap)
    result = joint_top_k(ArraySource(h.astype(np.int64)), 10, 1.0, seed=0)
    truth = set(np.argsort(-h, kind="stable")[:10].tolist())
    assert set(result.items) == truth
    assert result.accesses.sorted < 1000


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        joint_top_k(ArraySource([1.0, 2.0]), 3, 1.0)
    with pytest.raises(TypeError, match="k must be an integer"):
        joint_top_k(ArraySource([1.0, 2.0]), 1.5, 1.0)  # type: ignore[arg-type]


def test_same_answer_on_every_store(make_store: Callable[[Any, Any], Source]) -> None:
    """Ties at the top (counts 0..5 over 500 items): the prefix, the uniform draws within
    segments and the ids of drawn ranks must agree with ArraySource."""
    same_on_store(make_store, "int-ties", lambda s, seed: joint_top_k(s, 3, 2.0, seed=seed))
