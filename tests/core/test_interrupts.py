"""interrupts.check: the core's long loops give a front end's hook the chance to stop them.

What would fail: a long loop of a mechanism without a check (the hook is never called, the run
goes to its end), or check() calling the hook on every iteration (the count test)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from adapters.memory import ArraySource
from topk_middleware import interrupts
from topk_middleware.mechanisms.joint import JOINT_MAX_K, check_joint_size, joint_top_k
from topk_middleware.mechanisms.peeling import peeling_top_k


class Stop(Exception):
    pass


def test_a_hook_stops_joint_top_k_within_its_interval() -> None:
    """joint_top_k(k = 16) on 10^5 dense integer counts at the smallest epsilon its work cap
    admits enumerates about 8,000 thresholds (seconds in this process); a hook raising 0.3 s
    in stops it within 0.3 s + 2 INTERVAL."""
    from topk_middleware.mechanisms.joint import smallest_joint_epsilon

    m, k = 100_000, 16
    counts = np.floor(np.random.default_rng(3).random(m) * 50_000).astype(np.int64)
    source = ArraySource(counts)
    epsilon = smallest_joint_epsilon(k, m)
    calls: list[float] = []
    started = time.monotonic()

    def hook() -> None:
        calls.append(time.monotonic())
        if calls[-1] - started > 0.3:
            raise Stop

    with interrupts.checking(hook), pytest.raises(Stop):
        joint_top_k(source, k, epsilon, seed=1)
    assert time.monotonic() - started < 0.3 + 2 * interrupts.INTERVAL + 0.2
    gaps = np.diff(calls)
    assert len(calls) >= 3 and gaps.min() >= interrupts.INTERVAL * 0.99  # throttled


def test_without_a_hook_check_does_nothing_and_the_hook_is_scoped() -> None:
    interrupts.check()
    seen: list[int] = []
    with interrupts.checking(lambda: seen.append(1)):
        time.sleep(interrupts.INTERVAL * 1.5)
        interrupts.check()
    time.sleep(interrupts.INTERVAL * 1.5)
    interrupts.check()
    assert seen == [1]


def test_joint_work_known_to_be_excessive_is_refused_from_k_and_m() -> None:
    check_joint_size(JOINT_MAX_K, 1000)
    with pytest.raises(ValueError, match="too much work"):
        check_joint_size(JOINT_MAX_K + 1)
    with pytest.raises(ValueError, match="too much memory") as caught:
        check_joint_size(20, 10_000_000)
    assert "10000000" not in str(caught.value) and "10,000,000" not in str(caught.value)


def test_joint_work_is_bounded_by_public_facts_before_the_charge() -> None:
    """The enumeration's work, thresholds x (k + 1) (mechanisms/joint.py), from k, m, epsilon
    and the score column's type alone: integer counts at m = 10^6 pass at epsilon 1 (at most
    floor(cut) + 1 thresholds), not at epsilon 10^-3; non-integer scores at m = 10^6 never (every
    gap may be a threshold); a refusal charges nothing."""
    from topk_middleware import PrivacyBudget
    from topk_middleware.mechanisms.joint import (
        JOINT_MAX_WORK,
        TAIL_LOG_MARGIN,
        joint_thresholds_bound,
        joint_work,
        log_number_of_sets,
        smallest_joint_epsilon,
    )

    m = 1_000_000
    cut = 2.0 * (log_number_of_sets(m, 16) + TAIL_LOG_MARGIN) / 1.0
    assert joint_thresholds_bound(16, m, 1.0, True) == math.floor(cut) + 1
    assert joint_thresholds_bound(16, m, 1.0, False) == 16 * m
    assert joint_work(16, m, 1.0, True) == (math.floor(cut) + 1) * (17**2 + 12)
    check_joint_size(16, m, 1.0, True)
    edge = smallest_joint_epsilon(16, m)
    check_joint_size(16, m, edge, True)
    assert joint_work(16, m, edge * 0.99, True) > JOINT_MAX_WORK
    with pytest.raises(ValueError, match="too much work on this table at this epsilon"):
        check_joint_size(16, m, edge * 0.99, True)
    with pytest.raises(ValueError, match="non-integer scores"):
        check_joint_size(1, m, 1.0, False)
    budget = PrivacyBudget(100.0)
    with pytest.raises(ValueError, match="non-integer scores"):
        joint_top_k(ArraySource(np.linspace(0.0, 1.0, 300_000)), 1, 1.0, budget=budget)
    assert budget.releases == []
    small = ArraySource(np.arange(1000, dtype=np.int64))
    assert len(joint_top_k(small, 4, 1.0, seed=1, budget=budget).items) == 4


def test_peeling_is_one_pass_at_any_k() -> None:
    """Peeling draws its law (Plackett-Luce, Lemma 4.2) in one pass of Gumbel-max: k = m = 10^5
    (PEELING_MAX_K) runs and ranks every item once; k = 2,000 of 10^5 is charged once; k above
    the cap is refused before the charge. (The law itself: tests/privacy/test_privacy_audit.py and
    tests/core/test_peeling.py.)"""
    from topk_middleware import PrivacyBudget

    budget = PrivacyBudget(100.0)
    source = ArraySource(np.arange(100_000, dtype=float))
    ranked = peeling_top_k(source, 100_000, 1.0, seed=1, budget=budget).items
    assert sorted(ranked) == list(range(100_000))
    assert len(peeling_top_k(source, 2000, 1.0, seed=2, budget=budget).items) == 2000
    assert len(budget.releases) == 2
    with pytest.raises(ValueError, match="at most 100,000 items"):
        peeling_top_k(ArraySource(np.zeros(100_001)), 100_001, 1.0, budget=budget)
    assert len(budget.releases) == 2
