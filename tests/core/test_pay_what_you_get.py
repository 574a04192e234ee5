"""Pay-what-you-get composition (Durfee & Rogers 2019, Algorithm 2 and Theorem 2)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from adapters.memory import ArraySource
from tests.core.test_accounting import ReadCounter
from topk_middleware.accounting import BudgetExceeded
from topk_middleware.mechanisms.pay_what_you_get import PayWhatYouGet


def gapped() -> ArraySource:
    scores = np.full(1000, 5.0)
    scores[:3] = [900.0, 800.0, 700.0]  # three clear winners, then a plateau
    return ArraySource(scores)


def test_each_call_pays_for_what_it_returned() -> None:
    """Asked for 6 on a histogram with 3 clear winners the call returns them and bottom: it pays
    3 + 1 = 4, not 6. A flat histogram returns bottom alone and pays 1."""
    session = PayWhatYouGet(k_star=10, l_star=4, epsilon=1.0, delta=1e-6)
    r = session.top_k(gapped(), 6, 20, seed=1)
    assert sorted(r.items) == [0, 1, 2] and r.bottom
    assert (session.k_left, session.calls_left) == (6, 3)
    flat = session.top_k(ArraySource(np.full(100, 3.0)), 6, 20, seed=2)
    assert flat.items == [] and flat.bottom
    assert (session.k_left, session.calls_left) == (5, 2)


def test_refusals_read_nothing() -> None:
    session = PayWhatYouGet(k_star=5, l_star=2, epsilon=1.0, delta=1e-6)
    source = ReadCounter(ArraySource(np.arange(100.0)))
    with pytest.raises(BudgetExceeded, match="output budget"):
        session.top_k(source, 6, 20)
    assert source.rows == 0
    session.top_k(gapped(), 2, 20, seed=0)  # two clear winners: pays 2
    session.top_k(gapped(), 2, 20, seed=1)
    with pytest.raises(BudgetExceeded, match="calls"):
        session.top_k(source, 1, 20)
    assert source.rows == 0 and session.calls_left == 0


def test_theorem_2_guarantee() -> None:
    """(eps*, 2 l* delta + delta') with eps* Theorem 1's formula at k*, computed here by hand."""
    session = PayWhatYouGet(k_star=40, l_star=8, epsilon=0.05, delta=1e-8)
    eps, delta = session.guarantee(1e-6)
    L = math.log(1e6)
    expected = min(
        40 * 0.05,
        40 * 0.05 * (math.exp(0.05) - 1) / (math.exp(0.05) + 1) + 0.05 * math.sqrt(80 * L),
        40 * 0.05**2 / 2 + 0.05 * math.sqrt(40 * L / 2),
    )
    assert eps == pytest.approx(expected, rel=1e-12)
    assert delta == pytest.approx(2 * 8 * 1e-8 + 1e-6)
    cost = session.cost()
    assert cost.delta == pytest.approx(16e-8) and cost.range_bounded == (0.05,) * 40


def test_bad_session_parameters() -> None:
    with pytest.raises(ValueError, match="k_star"):
        PayWhatYouGet(k_star=0, l_star=1, epsilon=1.0, delta=1e-6)
    with pytest.raises(ValueError, match="delta"):
        PayWhatYouGet(k_star=3, l_star=1, epsilon=1.0, delta=0.0)
