"""Randomness and the calibration guard: secure noise without a seed, the floor on epsilon, and
clear errors for bad seeds and budgets (before anything is read or charged)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from randomgen import ChaCha

from adapters.memory import ArraySource
from topk_middleware import (
    BudgetExceeded,
    PrivacyBudget,
    calibrate,
    exponential_mechanism,
    joint_top_k,
    limited_domain_top_k,
    peeling_top_k,
    private_top_k,
    stable_top_k,
)
from topk_middleware.accounting import oneshot_cost
from topk_middleware.randomness import is_secure, make_rng, randbelow

SCORES = np.array([9, 7, 7, 5, 3, 2, 1, 1, 0, 0], dtype=float)


class Untouchable(ArraySource):
    """An ArraySource that fails the test if any row is read."""

    def read_sorted(self, start: int, count: int) -> Any:
        raise AssertionError("a row was read")

    def read_positions(self, positions: Any) -> Any:
        raise AssertionError("a row was read")


def test_unseeded_generator_is_chacha20_from_the_os() -> None:
    rng = make_rng(None)
    assert isinstance(rng.bit_generator, ChaCha) and is_secure(rng)
    assert rng.bit_generator.state["state"]["rounds"] == 20
    assert make_rng(None).random() != make_rng(None).random()  # a fresh OS key each time
    assert not is_secure(make_rng(7))  # seeded: numpy's PCG64, for tests


@pytest.mark.parametrize(
    "release",
    [
        lambda s: private_top_k(s, 2, 1.0),
        lambda s: private_top_k(s, 2, 1.0, method="oneshot", noise="laplace"),
        lambda s: exponential_mechanism(s, 1.0),
        lambda s: joint_top_k(s, 2, 1.0),
        lambda s: peeling_top_k(s, 2, 1.0),
        lambda s: limited_domain_top_k(s, 2, 4, 1.0, 1e-3),
        lambda s: stable_top_k(s, 0.5, 1e-3, k=2),
    ],
)
def test_every_mechanism_draws_from_chacha_without_a_seed(
    release: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unseeded release builds its generator through randomness.secure_rng (ChaCha20, OS
    key), and never numpy's default_rng nor Python's Mersenne Twister."""
    import random

    from topk_middleware import randomness

    made: list[np.random.Generator] = []
    original = randomness.secure_rng

    def watch() -> np.random.Generator:
        made.append(original())
        return made[-1]

    monkeypatch.setattr(randomness, "secure_rng", watch)
    monkeypatch.setattr(np.random, "default_rng", lambda *a: pytest.fail("default_rng used"))
    monkeypatch.setattr(random, "Random", lambda *a: pytest.fail("Mersenne Twister used"))
    release(ArraySource(SCORES))
    assert len(made) == 1 and is_secure(made[0])


def test_joint_reuses_its_uniform_after_a_full_read() -> None:
    """Unseeded joint_top_k (secure generator, saved state for the full-read case) has the
    mechanism's law: every 2-set of a flat histogram equally likely (chi-square, 600 runs,
    45 sets; fails at p < 1e-4)."""
    from scipy.stats import chisquare

    flat = ArraySource(np.zeros(10))
    counts: dict[tuple[Any, ...], int] = {}
    for _ in range(600):
        key = tuple(sorted(joint_top_k(flat, 2, 1.0).items))
        counts[key] = counts.get(key, 0) + 1
    observed = [counts.get(k, 0) for k in counts] + [0] * (45 - len(counts))
    assert chisquare(observed).pvalue > 1e-4


def test_randbelow_is_uniform_on_huge_ranges() -> None:
    rng = make_rng(3)
    n = 3 * 2**70
    draws = [randbelow(rng, n) for _ in range(3000)]
    assert all(0 <= d < n for d in draws)
    thirds = np.bincount([d * 3 // n for d in draws], minlength=3)
    assert thirds.min() > 900  # 1000 expected each; fails if the top bits are biased


@pytest.mark.parametrize("seed", [-1, 1.5, "7", True, [1]])
def test_bad_seed_is_refused_in_our_words(seed: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="seed must be"):
        private_top_k(Untouchable(SCORES), 1, 1.0, seed=seed)


@pytest.mark.parametrize(
    ("noise", "epsilon", "delta"),
    [("gumbel", 1e-310, 0.0), ("laplace", 5e-324, 0.0), ("gumbel", 1e-305, 1e-6)],
)
def test_subnormal_epsilon_is_refused_before_reading_or_charging(
    noise: str, epsilon: float, delta: float
) -> None:
    budget = PrivacyBudget(1.0, 1e-5)
    with pytest.raises(ValueError, match="floor"):
        private_top_k(Untouchable(SCORES), 2, epsilon, delta, noise=noise, budget=budget)
    with pytest.raises(ValueError, match="floor"):
        calibrate(noise, 2, 10, epsilon, delta)
    assert budget.releases == []
    for release in (
        lambda: joint_top_k(Untouchable(SCORES), 1, 1e-310, budget=budget),
        lambda: peeling_top_k(Untouchable(SCORES), 1, 1e-310, budget=budget),
        lambda: exponential_mechanism(Untouchable(SCORES), 1e-310, budget=budget),
    ):
        with pytest.raises(ValueError, match="floor"):
            release()
    assert budget.releases == []


def test_the_floor_itself_is_accepted_and_finite() -> None:
    g = calibrate("laplace", 1, 10, 2e-300, 0.0)
    assert np.isfinite(g.scale) and np.isfinite(make_rng(1).laplace(0, g.scale, 1000)).all()


def test_subnormal_delta_calibrates() -> None:
    """delta = 1e-320: ln(1/delta) is finite (computed as -ln(delta)); the calibration is
    valid and no worse than pure."""
    g = calibrate("gumbel", 10, 100, 1.0, 1e-320)
    assert g.epsilon <= 1.0 and g.scale <= 10.0


@pytest.mark.parametrize(
    ("args", "error"),
    [((True,), TypeError), (("1",), TypeError), ((1.0, "0"), TypeError), ((0.0,), ValueError)],
)
def test_budget_totals_are_checked(args: tuple[Any, ...], error: type) -> None:
    with pytest.raises(error, match="budget"):
        PrivacyBudget(*args)


def test_in_memory_budget_is_thread_safe() -> None:
    """16 threads charging one PrivacyBudget with delta > 0 (the case that overspent): exactly
    the sequential allowance succeeds, 5 trials (with the budget's lock taken out, each of 5
    trials overspent: 23 to 28 releases against 19)."""
    cost = oneshot_cost("gumbel", 1, 10, 0.1, 0.0)
    sequential = PrivacyBudget(1.0, 1e-6)
    allowed = 0
    while True:
        try:
            sequential.charge(cost)
            allowed += 1
        except BudgetExceeded:
            break
    for _ in range(5):
        budget, ok = PrivacyBudget(1.0, 1e-6), []
        barrier = threading.Barrier(16)

        def analyst(
            b: PrivacyBudget = budget, done: list[int] = ok, gate: threading.Barrier = barrier
        ) -> None:
            gate.wait()
            for _ in range(4):
                try:
                    b.charge(cost)
                    done.append(1)
                except BudgetExceeded:
                    pass

        threads = [threading.Thread(target=analyst) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(ok) == allowed and budget.spent().epsilon <= 1.0 * (1 + 1e-12)
