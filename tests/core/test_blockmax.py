"""Block-max pruning of the private threshold algorithm (mechanisms/threshold.py, Algorithm 3).

Where positions are ranks a run settles most random accesses from the bounds the sorted order
gives their scores (CountedAccess.score_bounds) and reads only the rows that could change the
stop step or the top-k. The reference is the unpruned run (`unpruned_run`: Algorithm 3 through a
CountedAccess that knows no bound, so it reads every random access) over an ArraySource whose
positions are its input indexes (`positions="input"`) with the input already in canonical order,
so that every position is the same item as in the rank-ordered store. Real stores, no mocks.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import topk_middleware.access as access_module
from adapters.memory import ArraySource
from benchmarks.common import family_scores
from tests.helpers import (
    CountingSource,
    RunsKept,
    assert_law_and_scale,
    plackett_luce,
    reference_like,
)
from topk_middleware import Batching, private_top_k
from topk_middleware.access import (
    ZONE_MAP_ROWS,
    AccessStats,
    CountedAccess,
    RunTraits,
    StoreCosts,
)
from topk_middleware.lazy_noise import LazyNoiseList
from topk_middleware.mechanisms.threshold import private_threshold_top_k
from topk_middleware.noise import make_noise
from topk_middleware.noise_list import EagerNoiseList
from topk_middleware.planner import plan_run, threshold_seconds
from topk_middleware.privacy import calibrate
from topk_middleware.randomness import make_rng
from topk_middleware.release import unranked_order

FAMILIES = ("zipf", "plateau", "distinct", "uniform", "flat")
BATCHINGS = [None, Batching.sequential(), Batching(first=3, growth=1.5)]


def canonical(scores: Any) -> np.ndarray:
    """The scores in canonical order (descending; ties keep input order, as ids 0..m-1 do)."""
    scores = np.asarray(scores, dtype=np.float64)
    return scores[np.argsort(-scores, kind="stable")]


def unpruned(scores: np.ndarray) -> ArraySource:
    """The reference store: the same items at the same positions, positions not declared ranks."""
    return ArraySource(scores, positions="input")


class Unbounded(CountedAccess):
    """CountedAccess that knows no bound on a score it has not read: every random access beyond
    the prefix is read, as before block-max pruning (the reference run)."""

    def score_bounds(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        positions = np.asarray(positions, dtype=np.int64)
        found, known = self._known.lookup(positions)
        return np.where(found, known, -np.inf), np.where(found, known, np.inf)


@dataclass
class Reference:
    items: list[Any]
    accesses: AccessStats


def unpruned_run(
    source: Any,
    k: int,
    seed: int,
    noise: str = "gumbel",
    oracle: str = "lazy",
    batching: Batching | None = None,
) -> Reference:
    """private_top_k(source, k, 1.0, method="threshold", ...) through `Unbounded`: the same
    noise draws in the same order, no pruning."""
    rng = make_rng(seed)
    with source.snapshot():
        access = Unbounded(source, rng=rng)
        guarantee = calibrate(noise, k, access.m, 1.0, 0.0, "add_remove")
        distribution = make_noise(noise, guarantee.scale)
        if oracle == "lazy":
            noise_list: Any = LazyNoiseList(distribution, access.m, rng)
        else:
            noise_list = EagerNoiseList.draw(distribution, access.m, rng)
        positions = private_threshold_top_k(access, noise_list, k, batching or Batching())
        items = access.ids_of(positions)
    return Reference(unranked_order(items) if noise == "laplace" else items, access.stats)


def histograms(rng: np.random.Generator) -> Iterator[tuple[str, np.ndarray, int]]:
    """Random histograms with and without ties, in canonical order, with a k for each."""
    for trial in range(60):
        m = int(rng.integers(2, 3000))
        shape = trial % 5
        if shape == 0:
            h = rng.integers(0, 5, m).astype(float)  # few values: long tied runs
        elif shape == 1:
            h = np.floor(rng.pareto(1.1, m) * 30)  # skewed counts with ties
        elif shape == 2:
            h = rng.random(m) * 100.0  # distinct, spread over the noise's reach
        elif shape == 3:
            h = rng.exponential(200.0, m)  # distinct, a long tail far below the noise
        else:
            top = math.isqrt(m * 5) + 1  # distinct plateau within 0.001 over a deep tail
            h = np.concatenate([50.0 - 0.001 * rng.random(top), rng.random(m) * 40.0])
        k = [1, 5, int(rng.integers(1, min(m, 60) + 1))][trial % 3]
        yield f"shape{shape}-m{len(h)}-k{k}", canonical(h), k


def assert_same_as_unpruned(source: Any, scores: np.ndarray, k: int, **options: Any) -> Any:
    """The run on `source` releases the unpruned run's items, in order, at its sorted and random
    counts, and every random access is a fetched, inferred or bounded row."""
    want = unpruned_run(unpruned(scores), k, **options)
    got = private_top_k(source, k, 1.0, method="threshold", **options)
    assert got.items == want.items, options
    assert (got.accesses.sorted, got.accesses.random) == (
        want.accesses.sorted,
        want.accesses.random,
    ), options
    a = got.accesses
    assert a.rows_fetched + a.rows_inferred + a.rows_bounded >= a.random
    return got


def test_random_histograms_release_what_the_unpruned_run_releases() -> None:
    """60 random histograms (ties, skewed, distinct spread within the noise's reach, distinct
    far below it, a distinct plateau), three seeds and three batchings each, Gumbel and Laplace:
    same items, order and sorted/random counts as the unpruned run, and pruning does happen.
    Fails if a pruned item could have changed the stop step or entered the top-k (a bound used
    the wrong side, a straddling item left unread, a tie broken on a bound)."""
    rng = np.random.default_rng(13)
    bounded = 0
    for name, h, k in histograms(rng):
        source = ArraySource(h)
        for seed, batching, noise in itertools.product(range(3), BATCHINGS, ("gumbel", "laplace")):
            options = dict(seed=seed, noise=noise, oracle="eager")
            if batching is not None:
                options["batching"] = batching
            got = assert_same_as_unpruned(source, h, k, **options)
            bounded += got.accesses.rows_bounded
        eager: dict[str, Any] = dict(seed=5, oracle="eager")  # one noise vector for both
        oneshot = private_top_k(source, k, 1.0, method="oneshot", **eager).items
        assert private_top_k(source, k, 1.0, method="threshold", **eager).items == oneshot, name
    assert bounded > 10_000


@pytest.mark.parametrize("family", FAMILIES)
def test_benchmark_families_release_what_the_unpruned_run_releases(family: str) -> None:
    """The benchmark families at m = 2 * 10^5 (the plateau and zipf keep runs of tied scores in
    ArraySource), ten seeds, k = 10, the default (lazy) noise list: same items and counts as the
    unpruned run. Fails as above, or if the runs and the bounds disagree."""
    h = canonical(family_scores(family, 200_000, 10))
    source = ArraySource(h)
    for seed in range(10):
        assert_same_as_unpruned(source, h, 10, seed=seed)


@pytest.mark.parametrize("store", ["duckdb", "postgres"])
def test_stores_prune_as_array_source_does(request: pytest.FixtureRequest, store: str) -> None:
    """DuckDB and PostgreSQL (copy mode) give, for several seeds and families (distinct, zipf,
    plateau, random data with and without ties), the unpruned run's items and counts, and the
    very AccessStats of ArraySource (rows fetched, round trips, inferred and bounded rows
    included): every rank-ordered store prunes alike. Fails if a store's rank map or scores
    differ from ArraySource's, or if pruning depended on the store."""
    make: Callable[[Any, Any], Any] = request.getfixturevalue(f"make_{store}_source")
    rng = np.random.default_rng(3)
    data = {
        "distinct": family_scores("distinct", 20_000, 10),
        "zipf": family_scores("zipf", 20_000, 10).astype(float),
        "plateau": family_scores("plateau", 20_000, 10).astype(float),
        "ties": rng.integers(0, 6, 3000).astype(float),
        "spread": np.round(rng.random(3000) * 100.0, 6),
    }
    for name, scores in data.items():
        h = canonical(scores)
        source = make(h, None)
        reference = reference_like(source, h)
        for seed in range(3):
            got = assert_same_as_unpruned(source, h, 10, seed=seed)
            want = private_top_k(reference, 10, 1.0, method="threshold", seed=seed)
            assert got.accesses == want.accesses, (name, seed)
        if name == "distinct":
            assert got.accesses.rows_bounded > got.accesses.random // 2


def test_distinct_reads_far_fewer_rows() -> None:
    """On the distinct family at m = 10^6 (no ties: nothing inferred) the unpruned run reads
    every random access beyond the prefix by rank, about sqrt(mk) = 3162 rows; the pruned run
    reads 20 and settles the rest by bounds, with the same answer. Exact counts for
    seed 0. Fails if pruning stops pruning (or reads the zone map where it need not)."""
    h = canonical(family_scores("distinct", 10**6, 10))
    pruned, plain = CountingSource(ArraySource(h)), CountingSource(unpruned(h))
    got = private_top_k(pruned, 10, 1.0, method="threshold", seed=0, batching=Batching())
    want = unpruned_run(plain, 10, seed=0, batching=Batching())
    assert got.items == want.items
    assert (got.accesses.sorted, got.accesses.random) == (3164, 3162)
    assert (want.accesses.sorted, want.accesses.random) == (3164, 3162)
    assert plain.rank_rows > 3000 and pruned.rank_rows < 100
    assert got.accesses.rows_fetched < want.accesses.rows_fetched - 3000
    # 20 rows read by rank (the first block: nothing bounds it yet), 3132 accesses bounded, and
    # the other 10 at ranks sorted access reached (served by the prefix).
    assert (pruned.rank_rows, got.accesses.rows_bounded) == (20, 3132)
    assert got.accesses.rows_fetched == pruned.rows and got.accesses.round_trips == pruned.calls


def test_zone_map_is_read_once_counted_as_rows_not_accesses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With k = 200 the first block (2k = 400 steps) has more random reads pending than the zone
    map's size: the zone map (log-spaced ranks beyond the prefix) is read once, in one batch,
    counted in rows_fetched (the wrapper sees every row) but not as accesses, and fewer rows are
    read by rank than without it (ZONE_MAP_ROWS set beyond reach). Fails if the zone map is read
    twice, left uncounted, or changes the answer."""
    h = canonical(family_scores("distinct", 10**5, 200))
    batches: list[int] = []

    class Batches(CountingSource):
        def read_positions(self, ranks: np.ndarray) -> Any:
            batches.append(len(ranks))
            return super().read_positions(ranks)

    with_map = Batches(ArraySource(h))
    got = private_top_k(with_map, 200, 1.0, method="threshold", seed=1)
    assert got.items == unpruned_run(unpruned(h), 200, seed=1).items
    assert got.accesses.rows_fetched == with_map.rows
    log_spaced = [n for n in batches if ZONE_MAP_ROWS // 2 <= n <= ZONE_MAP_ROWS]
    assert len(log_spaced) == 1, batches
    monkeypatch.setattr(access_module, "ZONE_MAP_ROWS", 10**9)
    without = CountingSource(ArraySource(h))
    again = private_top_k(without, 200, 1.0, method="threshold", seed=1)
    assert (again.items, again.accesses.random) == (got.items, got.accesses.random)
    assert with_map.rank_rows < without.rank_rows


def test_score_bounds_follow_the_sorted_order() -> None:
    """score_bounds: exact in the prefix and at read ranks, the nearest known scores around an
    unread rank otherwise (-inf / +inf where nothing is known beyond), inferred where they meet;
    no access counted. Fails if a bound is taken from the wrong side."""
    h = np.array([9.0, 8.0, 7.0, 7.0, 7.0, 5.0, 4.0, 3.0, 2.0, 1.0])
    access = CountedAccess(ArraySource(h))
    access.fetch_sorted_until(2)
    lower, upper = access.score_bounds(np.array([1, 5]))
    assert lower.tolist() == [8.0, -np.inf] and upper.tolist() == [8.0, 8.0]
    access.fetch_positions(np.array([2, 4, 8]))
    lower, upper = access.score_bounds(np.array([3, 5, 6, 9, 4]))
    assert lower.tolist() == [7.0, 2.0, 2.0, -np.inf, 7.0]
    assert upper.tolist() == [7.0, 7.0, 7.0, 2.0, 7.0]
    assert access.stats.rows_inferred == 1 and access.is_fetched(3)  # 7 <= h[3] <= 7
    assert (access.stats.sorted, access.stats.random, access.stats.rows_bounded) == (0, 0, 0)


def test_gumbel_pruned_runs_follow_plackett_luce() -> None:
    """The ranked pairs of a pruned Gumbel run over 40 items, five of them near the top and the
    rest 18 or more below (noise scale 1; the tail is settled by bounds, rows_bounded > 0),
    follow Plackett-Luce with weights exp(h / scale): over the 20 ordered pairs of the top five
    and the tail's share (about 1e-8, pooled with any cell expected below 5), 5,000 runs,
    Pearson's chi-square and the score test of the scale at 5e-4 each
    (tests.helpers.assert_law_and_scale). Fails if pruning biased the stop step or the order: a
    law 10% too sharp in scale fails with probability 0.9998, 10% too flat 0.998 (simulated,
    40,000 samples of 5,000; the chi-square alone at 1e-3 took 8,000 runs for 0.9997 and
    0.997)."""
    h = canonical(np.concatenate([[26.0, 25.5, 25.0, 24.0, 23.0], np.linspace(0.0, 5.0, 35)]))
    k, epsilon, runs = 2, 2.0, 5_000
    source = ArraySource(h)
    counts: Counter[tuple[int, ...]] = Counter()
    bounded = 0
    for seed in range(runs):
        result = private_top_k(source, k, epsilon, seed=seed, method="threshold")
        counts[tuple(result.items)] += 1
        bounded += result.accesses.rows_bounded
    assert bounded > 0
    top = list(itertools.permutations(range(5), k))

    def cells(scale: float) -> np.ndarray:
        pairs = np.array([plackett_luce(np.exp(h / scale), o) for o in top])
        return np.append(pairs, 1.0 - pairs.sum())

    keep = cells(k / epsilon) * runs > 5

    def law(scale: float) -> np.ndarray:
        p = cells(scale)
        return np.append(p[keep], p[~keep].sum())

    observed = np.array([counts[o] for o in top])
    observed = np.append(observed, runs - observed.sum())
    assert keep.sum() == 20 and not keep[-1]  # the tail is the pooled cell
    assert_law_and_scale(np.append(observed[keep], observed[~keep].sum()), law, k / epsilon)


def test_planner_prices_pruned_random_reads() -> None:
    """On a rank-ordered store without runs the modelled random reads of a threshold run are
    those of pruning (a few batches, about 2k + 2 ZONE_MAP_ROWS rows: cheaper where rows cost,
    no dearer where batches are flat), and `auto` picks the
    threshold run on zipf, plateau and distinct at m = 10^7 with DuckDB's and PostgreSQL's
    costs. Fails if the model ignored pruning or stopped choosing the threshold algorithm."""
    from adapters.duckdb import STORE_COSTS as DUCKDB_COSTS
    from adapters.postgres import STORE_COSTS as POSTGRES_COSTS
    from adapters.synthetic import SyntheticSource

    class _Priced(SyntheticSource):
        def __init__(self, costs: StoreCosts, *args: Any, **options: Any) -> None:
            super().__init__(*args, **options)
            self.costs = costs

        def run_traits(self) -> RunTraits:
            return RunTraits(costs=self.costs)

    m, k = 10**7, 10
    for costs in (DUCKDB_COSTS, POSTGRES_COSTS):
        plain = threshold_seconds(10_000, k, m, costs, tied_runs=False)
        pruned = threshold_seconds(10_000, k, m, costs, tied_runs=False, pruned=True)
        assert pruned <= plain and (pruned < plain or costs.flat_random_batches(m))
        for family in ("zipf", "plateau", "distinct"):
            source = _Priced(costs, m, family, k=k)
            plan = plan_run(CountedAccess(source), k, k / 1.0)
            assert plan.chosen == "threshold", (family, plan)
            assert plan.threshold_seconds < plan.oneshot_seconds / 2


def test_runs_still_answer_before_the_zone_map() -> None:
    """A store whose runs of tied scores are fewer than the zone map's rows reads the runs, never
    the zone map, and settles random accesses from them (inferred, not bounded): the plateau
    with RunsKept. Fails if the zone map were read where the runs are the better map."""
    h = canonical(family_scores("plateau", 100_000, 10).astype(float))
    counted = RunsKept(ArraySource(h))
    result = private_top_k(counted, 10, 1.0, method="threshold", seed=2)
    assert counted.runs_read == 1 and result.accesses.rows_inferred > 0
    assert counted.rank_rows <= 2 * 10
