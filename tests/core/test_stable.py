"""StableTopK (Zhu & Wang 2022, Algorithms 1-5): the gap selection's exact distribution, the PTR
test's exact pass probability, the sorted prefix it reads, and the target-k variant."""

from __future__ import annotations

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
from topk_middleware.mechanisms.stable import stable_top_k


def test_gap_selection_is_the_exponential_mechanism() -> None:
    """A1 draws j with probability proportional to exp(eps1 (gap_j + r(j)) / 2), eps1 = 2
    sqrt(rho) (Algorithm 1 with Gumbel(2/eps1)); 4,000 runs (every cell expected 90 times or
    more), Pearson's chi-square and the score test of the scale at 5e-4 each
    (tests.helpers.assert_law_and_scale). Fails if the Gumbel scale or the regulariser were
    wrong: no regulariser, half or twice lam, or a scale 20% off fail with probability 1.0, a
    scale 10% too small 0.99995, 10% too large 0.997 (simulated, 40,000 samples of 4,000; the
    chi-square alone of 8,000 runs: 1.0 for each)."""
    scores = np.array([20.0, 18, 17, 13, 12, 11, 10, 9, 1, 0, 0, 0])
    rho, k_bar, lam, k = 0.5, 8, 0.7, 4
    eps1 = 2 * math.sqrt(rho / 2)  # A3 runs A2 at rho/2
    gaps = scores[:k_bar] - scores[1 : k_bar + 1]
    j = np.arange(1, k_bar + 1)

    def law(scale: float) -> np.ndarray:
        logits = (gaps - lam * np.abs(j - k)) / scale
        probs = np.exp(logits - logits.max())
        return probs / probs.sum()

    n = 4_000
    chosen = Counter(
        stable_top_k(ArraySource(scores), rho, 1e-6, k=k, k_bar=k_bar, lam=lam, seed=s).k_chosen
        for s in range(n)
    )
    observed = np.array([chosen[int(x)] for x in j])
    assert observed.sum() == n and law(2 / eps1).min() * n >= 90
    assert_law_and_scale(observed, law, 2 / eps1)


@pytest.mark.parametrize(("test", "q"), [("gaussian", 6.5), ("laplace", 10.0)])
def test_ptr_pass_probability(test: str, q: float) -> None:
    """Given k~ = 5 (the one large gap), the test passes with probability
    P(N(0, 1/rho) > 1 + sqrt(2 ln(1/dt)/rho) - max(1, q)) (A4) or
    P(Lap(1/sqrt(rho)) > 1 - q + ln(1/dt)/sqrt(rho)) (A5). Binomial test over the runs that
    chose 5."""
    rho, dt = 0.5, 1e-3
    scores = np.r_[np.full(5, 1000.0 + q), np.full(95, 1000.0)]
    scores[:5] += np.arange(5)[::-1] * 1e-3  # tiny gaps inside the top 5
    sigma = 1 / math.sqrt(rho)
    q_true = scores[4] - scores[5]
    if test == "gaussian":
        p = stats.norm.sf(1 + sigma * math.sqrt(2 * math.log(1 / dt)) - max(1, q_true), scale=sigma)
    else:
        eps2 = math.sqrt(rho)
        p = stats.laplace.sf(1 - q_true + math.log(1 / dt) / eps2, scale=1 / eps2)
    assert 0.2 < p < 0.9
    runs, passed, other_passed = 0, 0, 0
    for s in range(3_000):
        r = stable_top_k(ArraySource(scores), rho, dt, k_bar=20, test=test, seed=s)  # type: ignore[arg-type]
        assert (r.accesses.sorted, r.accesses.random) == (21, 0)
        assert sorted(r.items) == ([] if r.bottom else list(range(r.k_chosen or 0)))
        if r.k_chosen == 5:  # the PTR noise is independent of A1's choice
            runs += 1
            passed += not r.bottom
        else:  # a gap of at most 1e-3: passes with probability <= dt
            other_passed += not r.bottom
    assert runs > 1_000 and other_passed <= 3
    assert stats.binomtest(passed, runs, p).pvalue > 1e-3


def test_large_gap_releases_true_set_and_flat_releases_bottom() -> None:
    """Theorem 11: q > 1 + 2 sqrt(2 ln(1/dt)/rho) gives the true set w.p. >= 1 - dt; a flat
    histogram (q = 0) passes with probability <= dt."""
    rng = np.random.default_rng(1)
    scores = rng.integers(0, 50, 100_000).astype(float)
    top = rng.choice(100_000, 7, replace=False)
    scores[top] = 500.0 + np.arange(7)
    flat = ArraySource(np.full(10_000, 42.0))
    for s in range(100):
        r = stable_top_k(ArraySource(scores), 0.5, 1e-9, k_bar=50, seed=s)
        assert set(r.items) == set(top.tolist()) and r.k_chosen == 7
        assert r.accesses.total == 51
        assert stable_top_k(flat, 0.5, 1e-9, k_bar=50, seed=s).bottom


def test_uncapped_reads_everything() -> None:
    r = stable_top_k(ArraySource(np.arange(300.0)), 1.0, 1e-6, seed=0)
    assert r.accesses.sorted == 300 and r.accesses.random == 0


def test_target_k_always_returns_k_items() -> None:
    """A3 returns exactly k distinct items: the released set when k~ = k, an EM among the set
    when k~ > k, and the set plus an EM (private threshold algorithm, random accesses counted)
    on the rest when k~ < k or the test fails."""
    rng = np.random.default_rng(2)
    flat_counts = rng.integers(0, 3, 20_000).astype(float)
    gap = np.r_[np.full(6, 10_000.0) + np.arange(6) * 1000, rng.integers(0, 3, 20_000)]
    for positions in ("ranks", "input"):  # items named by rank, or apart from sorted order
        flat = ArraySource(flat_counts, positions=positions)
        for s in range(30):
            r = stable_top_k(flat, 0.4, 1e-6, k=8, k_bar=40, seed=s)
            assert len(set(r.items)) == 8 and not r.bottom
            assert r.accesses.random > 0  # the EM fallback ran as the private threshold algorithm
            source = ArraySource(gap, positions=positions)
            g = stable_top_k(source, 2.0, 1e-6, k=6, k_bar=40, lam=0.0, seed=s)
            assert set(g.items) == set(range(6))
            assert (g.accesses.sorted, g.accesses.random) == (41, 0)
    # k~ < k on the input-ordered gap: the EM on the rest must never return a removed item.
    # The removed items hold positions 0 and 1, which the suffix gives to positions 500 and 501.
    source = ArraySource(np.r_[10_000.0, 9_000.0, rng.integers(0, 3, 500)], positions="input")
    for s in range(30):
        items = stable_top_k(source, 2.0, 1e-6, k=5, k_bar=40, lam=0.0, seed=s).items
        assert len(set(items)) == 5 and {0, 1} <= set(items)


def test_bad_input() -> None:
    source = ArraySource(np.arange(10.0))
    with pytest.raises(ValueError, match="delta_t"):
        stable_top_k(source, 1.0, 0.0)
    with pytest.raises(ValueError, match="delta must be"):
        stable_top_k(source, 1.0, 1e-6, delta=0.0)
    with pytest.raises(ValueError, match="rho must be finite"):
        stable_top_k(source, -1.0, 1e-6)
    with pytest.raises(TypeError, match="rho"):
        stable_top_k(source, "1", 1e-6)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="test"):
        stable_top_k(source, 1.0, 1e-6, test="cauchy")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k_bar"):
        stable_top_k(source, 1.0, 1e-6, k_bar=0)
    with pytest.raises(ValueError, match="exceeds"):
        stable_top_k(source, 1.0, 1e-6, k=11)


def test_same_answer_on_every_store(make_store: Callable[[Any, Any], Source]) -> None:
    """A2 capped and A3 with its EM fallback (the threshold algorithm on the rest of the
    store, through a rank offset) agree with ArraySource."""
    same_on_store(
        make_store, "zipf", lambda s, seed: stable_top_k(s, 0.5, 1e-6, k_bar=30, seed=seed)
    )
    same_on_store(
        make_store,
        "text-ties",
        lambda s, seed: stable_top_k(s, 0.5, 1e-6, k=6, k_bar=30, seed=seed),
    )
