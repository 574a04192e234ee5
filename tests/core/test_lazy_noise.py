"""The lazy noise oracle (Algorithm 4): exact laws, consistency, Plackett-Luce, memory.

Statistical tests use fixed seeds and fail when the p-value of a KS or chi-square test against
the exact law falls below ALPHA: a wrong conditional formula (e.g. the missing shift u_(r) of
Theorem 4.10 (3), or a wrong Beta parameter), a biased choice of item or position, or a lost
digit in the top tail shifts these laws far beyond that tolerance at these sample sizes.
"""

from __future__ import annotations

import itertools
import math
import tracemalloc
from collections import Counter

import numpy as np
import pytest
from scipy import stats

from adapters.memory import ArraySource
from adapters.synthetic import SyntheticSource
from tests.helpers import assert_law_and_scale, assert_varies, laplace_set_law, threshold_run
from topk_middleware.lazy_noise import LazyNoiseList
from topk_middleware.noise import Gumbel, Laplace, NoiseDistribution
from topk_middleware.privacy import calibrate

ALPHA = 1e-3


def lists(distribution: NoiseDistribution, m: int, runs: int, seed: int):
    root = np.random.default_rng(seed)
    for child in root.spawn(runs):
        yield LazyNoiseList(distribution, m, child)


# ----- the top of the list at large m ------------------------------------------------------------
@pytest.mark.parametrize("batched", [False, True])
def test_largest_noise_at_1e9_is_gumbel_b_ln_m(batched: bool) -> None:
    """The max of m i.i.d. Gumbel(0, b) is Gumbel(b ln m, b) (no reference implementation)."""
    m, b = 10**9, 2.0
    tops = []
    for noise_list in lists(Gumbel(b), m, 3000, seed=11):
        if batched:
            tops.append(float(noise_list.next_sorted_batch(1)[1][0]))
        else:
            tops.append(noise_list.next_sorted()[1])
    assert stats.kstest(tops, stats.gumbel_r(loc=b * math.log(m), scale=b).cdf).pvalue > ALPHA


def test_largest_laplace_noise_at_1e12_has_the_law_of_the_max() -> None:
    """P(max <= z) = F(z)^m with F the Laplace CDF, here at m = 1e12 (z > 0 for sure)."""
    m, b = 10**12, 0.5
    tops = [nl.next_sorted()[1] for nl in lists(Laplace(b), m, 3000, seed=12)]

    def cdf(z: np.ndarray) -> np.ndarray:
        return np.exp(m * np.log1p(-0.5 * np.exp(-np.asarray(z) / b)))

    assert stats.kstest(tops, cdf).pvalue > ALPHA


def test_top_positions_at_1e12_after_random_accesses() -> None:
    """Positions 0 and 4 at m = 1e12, reached after random accesses placed items (so they have a
    sampled successor), follow Beta(j + 1, m - j) in the survival scale: the numerics stay exact
    where V ~ 1e-12."""
    m, b = 10**12, 1.0
    dist = Gumbel(b)
    first, fifth = [], []
    for nl in lists(dist, m, 2000, seed=13):
        for item in range(3):
            nl.noise_of(item)
        noises = [nl.next_sorted()[1] for _ in range(5)]
        first.append(float(dist.survival(noises[0])))
        fifth.append(float(dist.survival(noises[4])))
    assert stats.kstest(first, stats.beta(1, m).cdf).pvalue > ALPHA
    assert stats.kstest(fifth, stats.beta(5, m - 4).cdf).pvalue > ALPHA


# ----- order statistics anywhere in the list -----------------------------------------------------
def positions_after(pattern: str, nl: LazyNoiseList, m: int, rng: np.random.Generator) -> list:
    """Run an access pattern, then sorted access through the whole list: noises by position."""
    noises: list[float] = []
    if pattern == "sorted":
        noises = [nl.next_sorted()[1] for _ in range(m)]
    elif pattern == "batch":
        noises = nl.next_sorted_batch(m)[1].tolist()
    elif pattern == "random-then-sorted":
        for item in rng.permutation(m)[: m // 3].tolist():
            nl.noise_of(item)
        noises = [nl.next_sorted()[1] for _ in range(m)]
    elif pattern == "random-then-batch":
        for item in rng.permutation(m)[: m // 3].tolist():
            nl.noise_of(item)
        noises = nl.next_sorted_batch(m // 2)[1].tolist()
        noises += nl.next_sorted_batch(m)[1].tolist()
    elif pattern == "many-random-then-sorted":  # noises_of: vectorised placement by levels
        nl.noises_of(rng.permutation(m)[: m // 2])
        noises = [nl.next_sorted()[1] for _ in range(m)]
    elif pattern == "gaps-then-many-random":  # noises_of into gaps holding 0, 1 or many
        items = rng.permutation(m)
        for item in items[:3].tolist():
            nl.noise_of(item)
        nl.noises_of(items[3 : m // 2])  # 17 fresh: the vectorised path (BATCH_MIN = 16)
        noises = nl.next_sorted_batch(m)[1].tolist()
    elif pattern == "interleaved":
        while len(noises) < m:
            nl.noise_of(int(rng.integers(m)))
            noises.append(nl.next_sorted()[1])
    return noises


@pytest.mark.parametrize(
    "pattern",
    [
        "sorted",
        "batch",
        "random-then-sorted",
        "random-then-batch",
        "many-random-then-sorted",
        "gaps-then-many-random",
        "interleaved",
    ],
)
@pytest.mark.parametrize("distribution", [Gumbel(1.5), Laplace(1.0)], ids=["gumbel", "laplace"])
def test_order_statistics_follow_their_beta_laws(
    pattern: str, distribution: NoiseDistribution
) -> None:
    """V_(j) = P(Z > Z_(j)) ~ Beta(j + 1, m - j) (0-based) at the first, a middle and the last
    position, however the positions were reached (without or with sampled neighbours)."""
    m, runs = 40, 1500
    rng = np.random.default_rng(21)
    by_position: dict[int, list[float]] = {0: [], 13: [], m // 2: [], m - 1: []}
    for nl in lists(distribution, m, runs, seed=22):
        noises = positions_after(pattern, nl, m, rng)
        for j, values in by_position.items():
            values.append(float(distribution.survival(noises[j])))
    for j, values in by_position.items():
        p = stats.kstest(values, stats.beta(j + 1, m - j).cdf).pvalue
        assert p > ALPHA, (pattern, j, p)


@pytest.mark.parametrize("distribution", [Gumbel(1.0), Laplace(2.0)], ids=["gumbel", "laplace"])
def test_random_access_noise_is_the_noise_distribution(distribution: NoiseDistribution) -> None:
    """The noise of one item is marginally the noise law itself: for the first random access
    (no neighbours) and for one made after sorted and random accesses (both neighbours)."""
    m = 10**6
    first, later = [], []
    for nl in lists(distribution, m, 3000, seed=23):
        first.append(nl.noise_of(5))
        nl.next_sorted_batch(3)
        for item in range(10, 20):
            nl.noise_of(item)
        later.append(nl.noise_of(7))
    cdf = lambda z: 1.0 - distribution.survival(z)  # noqa: E731
    assert stats.kstest(first, cdf).pvalue > ALPHA
    assert stats.kstest(later, cdf).pvalue > ALPHA
    # Many at once (noises_of): the first and the last of 40 fresh items.
    head, tail = [], []
    for nl in lists(distribution, m, 1500, seed=24):
        nl.next_sorted_batch(5)
        noises = nl.noises_of(np.arange(100, 140))
        head.append(noises[0])
        tail.append(noises[-1])
    assert stats.kstest(head, cdf).pvalue > ALPHA
    assert stats.kstest(tail, cdf).pvalue > ALPHA


def test_noises_of_places_items_at_uniform_positions() -> None:
    """m = 40, 20 items placed at once: the sorted position of the first and the last of them is
    uniform on [0, 40) (chi-square)."""
    m, runs = 40, 2000
    first, last = [], []
    for nl in lists(Gumbel(1.0), m, runs, seed=33):
        nl.noises_of(np.arange(20))
        order = nl.next_sorted_batch(m)[0].tolist()
        first.append(order.index(0))
        last.append(order.index(19))
    for sample in (first, last):
        assert stats.chisquare(np.bincount(sample, minlength=m)).pvalue > ALPHA


# ----- the item order: a uniform permutation (Lemma 4.1) -----------------------------------------
@pytest.mark.parametrize("pattern", ["sorted", "batch", "random-first", "mixed", "all-random"])
def test_item_order_is_a_uniform_permutation(pattern: str) -> None:
    """m = 4: all 24 orders equally likely (chi-square), with rejection and exact selection."""
    m, runs = 4, 4800
    counts: Counter[tuple[int, ...]] = Counter()
    for nl in lists(Gumbel(1.0), m, runs, seed=31):
        if pattern == "sorted":
            order = [nl.next_sorted()[0] for _ in range(m)]
        elif pattern == "batch":
            order = nl.next_sorted_batch(m)[0].tolist()
        elif pattern == "random-first":
            nl.noise_of(2)
            nl.noise_of(0)
            order = [nl.next_sorted()[0] for _ in range(m)]
        elif pattern == "all-random":  # positions by rejection, then by exact selection
            for item in (1, 3, 0, 2):
                nl.noise_of(item)
            order = [nl.next_sorted()[0] for _ in range(m)]
        else:
            nl.noise_of(3)
            order = [nl.next_sorted()[0]]
            order += nl.next_sorted_batch(2)[0].tolist()
            order.append(nl.next_sorted()[0])
        counts[tuple(order)] += 1
    observed = [counts[p] for p in itertools.permutations(range(m))]
    assert sum(observed) == runs  # every order is a permutation of the 4 items
    assert stats.chisquare(observed).pvalue > ALPHA


@pytest.mark.parametrize("m,count", [(60, 20), (400, 100)])
def test_batched_items_are_uniform(m: int, count: int) -> None:
    """Batches by rejection (one at a time for 20 items; vectorised with duplicate removal and
    top-up for 100 of 400): the items at the first and last batch positions are uniform on [m)."""
    runs = 8000
    firsts, lasts = [], []
    for nl in lists(Laplace(1.0), m, runs, seed=32):
        nl.noise_of(0)  # one placed item the batch must avoid
        items = nl.next_sorted_batch(count)[0]
        assert len(set(items.tolist())) == count
        firsts.append(int(items[0]))
        lasts.append(int(items[-1]))
    for sample in (firsts, lasts):
        # The order is a uniform permutation whatever was placed first (item 0 may sit inside
        # the batch): every item is at a given position with probability 1/m.
        assert stats.chisquare(np.bincount(sample, minlength=m)).pvalue > ALPHA


# ----- consistency under any interleaving --------------------------------------------------------
@pytest.mark.parametrize("m", [1, 2, 3, 7, 50, 1000])
@pytest.mark.parametrize("distribution", [Gumbel(0.7), Laplace(3.0)], ids=["gumbel", "laplace"])
def test_any_interleaving_is_consistent(m: int, distribution: NoiseDistribution) -> None:
    """An item's noise never changes, sorted access never repeats an item, and noises never
    increase along positions, for random interleavings of the four kinds of access (one item,
    many items, next position, next batch of positions)."""
    rng = np.random.default_rng(m)
    for nl in lists(distribution, m, 20, seed=40 + m):
        known: dict[int, float] = {}
        served: list[tuple[int, float]] = []
        while len(served) < m:
            op = rng.integers(4)
            if op == 0:
                item = int(rng.integers(m))
                noise = nl.noise_of(item)
                assert known.setdefault(item, noise) == noise
            elif op == 1:
                served.append(nl.next_sorted())
            elif op == 2:
                items, noises = nl.next_sorted_batch(int(rng.integers(0, 5)))
                served.extend(zip(items.tolist(), noises.tolist(), strict=True))
            else:
                asked = rng.integers(0, m, size=int(rng.integers(0, 40)))
                for item, noise in zip(asked.tolist(), nl.noises_of(asked).tolist(), strict=True):
                    assert known.setdefault(item, noise) == noise
        items = [item for item, _ in served]
        noises = [noise for _, noise in served]
        assert sorted(items) == list(range(m))  # each item exactly once
        assert all(a >= b for a, b in itertools.pairwise(noises))
        for item, noise in served:
            assert known.setdefault(item, noise) == noise
            assert nl.noise_of(item) == noise
        with pytest.raises(IndexError):
            nl.next_sorted()
        assert nl.next_sorted_batch(3)[0].size == 0


def test_large_batches_use_sorted_chunks_consistently() -> None:
    """Batches are kept in sorted chunks (merged as they grow: each chunk more than twice the
    next, so O(log n) of them); lookups by random access, rejection of placed items and the final
    exact path must all see them."""

    def geometric(chunks: list) -> bool:
        return all(len(a[0]) > 2 * len(b[0]) for a, b in itertools.pairwise(chunks))

    m = 20_000
    for nl in lists(Gumbel(1.0), m, 3, seed=50):
        served = list(zip(*nl.next_sorted_batch(5_000), strict=True))
        assert len(nl._placed.chunks.chunks) == 1
        known = {int(i): float(z) for i, z in served}
        for item in range(0, m, 7):  # in chunks or new
            noise = nl.noise_of(item)
            assert known.setdefault(item, noise) == noise
        served += [nl.next_sorted() for _ in range(50)]  # scalar rejection checks the chunk
        served += list(zip(*nl.next_sorted_batch(5_000), strict=True))
        assert geometric(nl._placed.chunks.chunks) and len(nl._placed.chunks.chunks) <= 14
        while nl.cursor < m:
            served += list(zip(*nl.next_sorted_batch(3_000), strict=True))
        items = [int(i) for i, _ in served]
        noises = [float(z) for _, z in served]
        assert sorted(items) == list(range(m))
        assert all(a >= b for a, b in itertools.pairwise(noises))
        assert all(nl.noise_of(i) == z for i, z in zip(items, noises, strict=True))
        assert all(known[i] == nl.noise_of(i) for i in known)


def test_bad_input_is_refused() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="m must be in"):
        LazyNoiseList(Gumbel(1.0), 0, rng)
    with pytest.raises(TypeError, match="m must be an integer"):
        LazyNoiseList(Gumbel(1.0), 10.0, rng)  # type: ignore[arg-type]
    nl = LazyNoiseList(Gumbel(1.0), 10, rng)
    with pytest.raises(IndexError, match="outside the domain"):
        nl.noise_of(10)
    with pytest.raises(TypeError, match="integer rank"):
        nl.noise_of(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-negative integer"):
        nl.next_sorted_batch(-1)
    with pytest.raises(IndexError, match="outside the domain"):
        nl.noises_of([1, 10])
    with pytest.raises(TypeError, match="integer ranks"):
        nl.noises_of([0.5])


# ----- the lazy threshold algorithm --------------------------------------------------------------
def plackett_luce(weights: np.ndarray, k: int) -> dict[tuple[int, ...], float]:
    """Exact probabilities of every ranked k-list under Plackett-Luce with these weights."""
    probs = {}
    for ranked in itertools.permutations(range(len(weights)), k):
        p, left = 1.0, float(weights.sum())
        for i in ranked:
            p *= weights[i] / left
            left -= weights[i]
        probs[ranked] = p
    return probs


@pytest.mark.parametrize("oracle", ["lazy", "eager"])
def test_lazy_threshold_follows_plackett_luce(oracle: str) -> None:
    """Gumbel noise: the ranked top-k of the threshold method (pinned: threshold_run fails if
    another mechanism ran) has law Plackett-Luce with weights exp(h / scale), scale = k / epsilon
    (Fact 3.3 calibration), with the lazy and eager oracles: 2,500 runs, the pairs expected
    fewer than 5 times pooled, Pearson's chi-square and the score test of the scale at 5e-4
    each (tests.helpers.assert_law_and_scale). A scale 20% off fails with probability 1.0, 10%
    too small 0.96, 10% too large 0.88 (simulated, 40,000 samples of 2,500; size 0.0018; the
    chi-square alone of 4,000 runs: 1.0, 0.90 and 0.78)."""
    h = np.array([3.0, 2.0, 2.0, 1.0, 0.0])
    k, epsilon, runs = 2, 2.0, 2500
    source = ArraySource(h)
    counts = Counter(
        tuple(threshold_run(source, k, epsilon, seed=s, oracle=oracle).items) for s in range(runs)
    )
    keys = sorted(plackett_luce(np.exp(h), k))
    rare = np.array([plackett_luce(np.exp(h / (k / epsilon)), k)[key] for key in keys]) * runs < 5

    def law(scale: float) -> np.ndarray:
        probs = plackett_luce(np.exp(h / scale), k)
        p = np.array([probs[key] for key in keys])
        return np.append(p[~rare], p[rare].sum())

    observed = np.array([counts[key] for key in keys])
    assert observed.sum() == runs and rare.any()
    assert_law_and_scale(np.append(observed[~rare], observed[rare].sum()), law, k / epsilon)


def test_lazy_and_eager_runs_cost_the_same_in_law() -> None:
    """The access count of the threshold run is a function of the noise: on a plateau (m = 900,
    30 tied items) its law must be the same with both oracles (two-sample KS on 1500 + 1500
    runs; the counts vary from 2 to about 60 accesses). A lazy list whose joint law of positions
    and items were off would change when the run stops."""
    source = SyntheticSource(900, "plateau")
    cost = {
        oracle: [
            threshold_run(source, 1, 1.0, seed=s, oracle=oracle).accesses.total for s in range(1500)
        ]
        for oracle in ("lazy", "eager")
    }
    for oracle, sample in cost.items():
        assert_varies(sample, f"access counts with the {oracle} oracle")
        assert max(sample) < 900  # the run stopped before reading the whole table
    assert stats.ks_2samp(cost["lazy"], cost["eager"]).pvalue > ALPHA


def test_lazy_threshold_laplace_matches_oneshot() -> None:
    """Laplace noise: the threshold method with the lazy oracle (pinned) has the one-shot
    mechanism's law of the top-1 item, computed exactly (tests.helpers.laplace_set_law):
    chi-square over the 6 items, 3,000 runs. Same power as the two-sample test of 6,000 +
    6,000 runs it replaces (5 degrees of freedom; noncentrality 3,000 x sum d^2 / p in both)."""
    h = np.array([2.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    source = ArraySource(h)
    runs = 3_000
    law = laplace_set_law(h, 1, calibrate("laplace", 1, len(h), 1.0, 0.0).scale)
    lazy = Counter(
        threshold_run(source, 1, 1.0, noise="laplace", seed=s, oracle="lazy").items[0]
        for s in range(runs)
    )
    observed = np.array([lazy[i] for i in range(len(h))])
    assert observed.sum() == runs
    expected = np.array([law[(i,)] for i in range(len(h))]) * runs
    assert stats.chisquare(observed, expected).pvalue > ALPHA


# ----- memory: proportional to accesses, not to m ------------------------------------------------
BYTES_PER_ACCESS = 2_000


def test_run_at_1e10_allocates_memory_proportional_to_accesses() -> None:
    """A lazy threshold run on m = 1e10 items completes and its peak traced allocation is at most
    BYTES_PER_ACCESS per access (the eager list alone would need 80 GB)."""
    source = SyntheticSource(10**10, "plateau", size=5_000)
    tracemalloc.start()
    try:
        result = threshold_run(source, 1, 1.0, seed=3, oracle="lazy")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    total = result.accesses.total
    assert 0 < total < 10**6
    assert source.ranks_of_ids(np.asarray(result.items))[0] < 5_000  # a plateau item wins
    assert peak <= BYTES_PER_ACCESS * total, (peak, total)
