"""interrupts.check: the core's long loops give a front end's hook the chance to stop them.

What would fail: a long loop of a mechanism without a check (the hook is never called, the run
goes to its end), or check() calling the hook on every iteration (the count test)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from adapters.memory import ArraySource
from topk_middleware import interrupts
from topk_middleware.mechanisms.joint import JOINT_MAX_K, check_joint_size, joint_top_k
from topk_middleware.mechanisms.peeling import PEELING_MAX_WORK, peeling_top_k


class Stop(Exception):
    pass


def test_a_hook_stops_joint_top_k_within_its_interval() -> None:
    """joint_top_k(k = 30, epsilon = 1e-9) on 5,000 zipf counts enumerates every threshold (over
    10 s in this process); a hook raising 0.3 s in stops it within 0.3 s + 2 INTERVAL."""
    source = ArraySource(np.floor(1e5 / np.arange(1, 5001)))
    calls: list[float] = []
    started = time.monotonic()

    def hook() -> None:
        calls.append(time.monotonic())
        if calls[-1] - started > 0.3:
            raise Stop

    with interrupts.checking(hook), pytest.raises(Stop):
        joint_top_k(source, 30, 1e-9, seed=1)
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


def test_peeling_work_known_to_be_excessive_is_refused_before_the_charge() -> None:
    """k passes over m scores with k m above PEELING_MAX_WORK: refused, nothing charged; the
    same budget then pays for a small peeling."""
    from topk_middleware import PrivacyBudget

    budget = PrivacyBudget(100.0)
    m = PEELING_MAX_WORK // 500 + 1  # 4,000,001 zero scores: k = 501 passes are too many
    with pytest.raises(ValueError, match="too much work") as caught:
        peeling_top_k(ArraySource(np.zeros(m)), 501, 1.0, budget=budget)
    assert str(m) not in str(caught.value) and budget.releases == []
    source = ArraySource(np.arange(1000, dtype=float))
    assert len(peeling_top_k(source, 5, 1.0, seed=1, budget=budget).items) == 5
    assert len(budget.releases) == 1
