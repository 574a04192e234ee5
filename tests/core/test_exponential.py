"""exponential_mechanism: the law exp(eps h) / sum, its guarantee, and its O(sqrt(m)) cost.

The chi-square tests fail (p < ALPHA at these fixed seeds) if the selection probabilities differ
from exp(epsilon h_i) / sum_j exp(epsilon h_j): e.g. a noise scale of 2/epsilon (the textbook EM
with sensitivity factor 2) or a uniform choice among tied items would be rejected.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

from adapters.memory import ArraySource
from adapters.synthetic import SyntheticSource
from tests.helpers import CountingSource, assert_law_and_scale
from topk_middleware import Batching, exponential_mechanism
from topk_middleware.mechanisms.exponential import exponential_mechanism as direct

ALPHA = 1e-3


def em_probabilities(h: np.ndarray, epsilon: float) -> np.ndarray:
    """exp(epsilon h_i) / sum_j exp(epsilon h_j), computed stably and independently."""
    logits = epsilon * (h - h.max())
    weights = np.exp(logits)
    return weights / weights.sum()


def em_law(h: np.ndarray) -> Callable[[float], np.ndarray]:
    """The law at noise scale s: em_probabilities(h, 1 / s)."""
    return lambda scale: em_probabilities(h, 1.0 / scale)


@pytest.mark.parametrize(
    "h,epsilon,runs",
    [
        (np.array([3.0, 2.0, 2.0, 1.0, 0.0, 0.0]), 1.0, 2000),
        (np.array([5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]), 0.4, 1500),
        (np.array([1.0, 1.0, 1.0, 1.0]), 2.0, 5000),
    ],
)
def test_output_law_is_exp_eps_h(h: np.ndarray, epsilon: float, runs: int) -> None:
    """Pearson's chi-square and the score test of the scale at 5e-4 each
    (tests.helpers.assert_law_and_scale). A scale of 2/epsilon or a uniform choice fails the
    first two with probability 1.0, a scale 20% off either way with 0.998 or more (simulated,
    40,000 samples; the chi-square alone of 5,000 runs: 1.0). All tied (no score
    test), 5,000 runs: an item favoured by 3 points (0.28 against 0.25) fails with probability
    0.86, by 5 points 1.0 (noncentral chi-square)."""
    source = ArraySource(h)
    counts = Counter(exponential_mechanism(source, epsilon, seed=s).items[0] for s in range(runs))
    observed = np.array([counts[i] for i in range(len(h))])
    assert observed.sum() == runs
    assert_law_and_scale(observed, em_law(h), 1.0 / epsilon)


def test_output_law_on_a_synthetic_plateau() -> None:
    """m = 12 items, 4 on a plateau at count 1 (the k = 1 instance of Theorem 5.4), 8 at 0:
    3,000 runs, the tests above; a scale of 2/epsilon or a uniform choice fails with probability
    1.0, 20% too small 1.0, 20% too large 0.998 (simulated, 40,000 samples; the chi-square
    alone of 5,000 runs: 1.0 and 0.9999)."""
    source = SyntheticSource(12, "plateau", top=2, size=4, seed=3)
    rows = source.read_sorted(0, 12)
    h = dict(zip(rows.ids.tolist(), rows.scores.tolist(), strict=True))
    runs, epsilon = 3000, 1.5
    counts = Counter(exponential_mechanism(source, epsilon, seed=s).items[0] for s in range(runs))
    ids = sorted(h)
    observed = np.array([counts[i] for i in ids])
    assert_law_and_scale(observed, em_law(np.array([h[i] for i in ids])), 1.0 / epsilon)


def test_guarantee_is_epsilon_dp_with_gumbel_scale_one_over_epsilon() -> None:
    """Fact 3.3 with k = 1: Gumbel(1/eps0) gives eps0-DP, so eps0 = epsilon."""
    result = exponential_mechanism(ArraySource([4.0, 1.0, 0.0]), 0.25, seed=1)
    assert result.privacy.epsilon == pytest.approx(0.25, rel=1e-12)
    assert result.privacy.delta == 0.0
    assert result.privacy.scale == pytest.approx(4.0, rel=1e-12)
    assert result.privacy.noise == "gumbel"
    assert len(result.items) == 1 and result.method == "threshold"
    assert direct is exponential_mechanism


def test_accesses_within_the_corollary_4_3_bound() -> None:
    """Plateau, m = 1e6: the mean cost over 40 runs is below 2 (sqrt(m) + sqrt(m/2)) = 3414
    (Theorem 4.2 with k = 1), and the counted accesses are exactly what the store served to the
    sequential algorithm with sequential batching (checked by an independent counter)."""
    m = 10**6
    source = SyntheticSource(m, "plateau")
    totals = [exponential_mechanism(source, 1.0, seed=s).accesses.total for s in range(40)]
    assert np.mean(totals) < 2 * (np.sqrt(m) + np.sqrt(m / 2))
    counter = CountingSource(source)
    result = exponential_mechanism(counter, 1.0, seed=7, batching=Batching.sequential())
    a = result.accesses
    assert a.sorted == counter.sorted_rows
    # A random access reads its row unless its score is pinned by tied neighbours (inferred) or
    # its bounds show it cannot matter (bounded); the released item's id is read at the end if its
    # score was inferred: at most one more row.
    assert a.rows_inferred > 0  # the plateau's tail is tied
    assert 0 <= counter.rank_rows - (a.random - a.rows_inferred - a.rows_bounded) <= 1


def test_bad_epsilon_is_refused_before_any_read() -> None:
    counter = CountingSource(ArraySource([1.0, 2.0]))
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="epsilon must be finite and > 0"):
            exponential_mechanism(counter, bad)
    assert counter.calls == 0
