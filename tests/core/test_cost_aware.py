"""The cost-aware threshold algorithm (mechanisms/cost_aware.py) against Algorithm 3."""

from __future__ import annotations

import numpy as np
import pytest

from adapters.memory import ArraySource
from frontends.cli import zipf_histogram
from tests.helpers import CountingSource, plateau_histogram, random_histograms, threshold_run
from topk_middleware import Batching, CostModel

COSTS = [CostModel(1, 1, 0), CostModel(1, 4, 0), CostModel(1, 50, 0), CostModel(1, 1, 500)]


@pytest.mark.parametrize("positions", ["ranks", "input"])
@pytest.mark.parametrize("costs", COSTS, ids=str)
def test_same_answer_as_the_plain_algorithm(costs: CostModel, positions: str) -> None:
    """With one seed, deferring, pruning and batching random accesses never change the answer:
    a pruned item that belonged to the top k, or a stop before every pending item that could beat
    the k-th best was completed, would show up on some of these 120 histograms (with items named
    by rank, and by positions apart from sorted order)."""
    rng = np.random.default_rng(99)
    for h, k in random_histograms(rng):
        source = ArraySource(h, positions=positions)
        seed = int(rng.integers(1 << 30))
        for noise in ("gumbel", "laplace"):
            plain = threshold_run(source, k, 0.5, noise=noise, seed=seed, oracle="eager")
            for batching in (None, Batching.sequential()):
                aware = threshold_run(
                    source,
                    k,
                    0.5,
                    noise=noise,
                    seed=seed,
                    oracle="eager",
                    costs=costs,
                    batching=batching,
                )
                assert aware.items == plain.items, (len(h), k, costs, batching)


@pytest.mark.parametrize(
    ("family", "histogram"),
    [("plateau", plateau_histogram(10**5, 10)), ("zipf", zipf_histogram(10**5))],
)
def test_expensive_random_access_is_traded_for_sorted(family: str, histogram) -> None:
    """When a random access costs 20 sorted ones, the cost-aware run makes fewer random accesses
    and has a lower modelled cost than Algorithm 3, over the same 30 seeds (exact counts)."""
    source = ArraySource(histogram)
    costs = CostModel(sorted=1, random=20)
    plain_random, aware_random, plain_cost, aware_cost = [], [], [], []
    for seed in range(30):
        plain = threshold_run(source, 10, 1.0, seed=seed, oracle="eager").accesses
        counter = CountingSource(source)
        aware = threshold_run(counter, 10, 1.0, seed=seed, oracle="eager", costs=costs)
        assert aware.diagnostics.plan["cost_aware"] is True
        aware = aware.accesses
        assert aware.rows_fetched == counter.rows and aware.round_trips == counter.calls
        plain_random.append(plain.random)
        aware_random.append(aware.random)
        plain_cost.append(costs.cost(plain))
        aware_cost.append(costs.cost(aware))
    assert np.mean(aware_random) < 0.6 * np.mean(plain_random), family
    assert np.mean(aware_cost) < 0.8 * np.mean(plain_cost), family


def test_schedule_follows_the_cost_of_a_round_trip() -> None:
    """Dearer round trips give a schedule with fewer, larger blocks."""
    m, k = 10**7, 10
    cheap = CostModel(1, 1, 0).batching(k, m)
    dear = CostModel(1, 1, 10_000).batching(k, m)
    assert (cheap.first or 2 * k) < (dear.first or 2 * k)
    source = ArraySource(plateau_histogram(10**5, k))
    trips = {
        name: threshold_run(source, k, 1.0, seed=1, oracle="eager", costs=c).accesses.round_trips
        for name, c in [("cheap", CostModel(1, 1, 0)), ("dear", CostModel(1, 1, 10_000))]
    }
    assert trips["dear"] < trips["cheap"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 1, 0), "sorted must be > 0"),
        ((1, -1, 0), "random must be finite and >= 0"),
        ((1, 1, float("nan")), "round_trip must be finite"),
    ],
)
def test_bad_cost_models_are_refused(args, message) -> None:
    with pytest.raises(ValueError, match=message):
        CostModel(*args)
