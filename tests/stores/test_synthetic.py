"""SyntheticSource: canonical order, the rank <-> id bijection, and agreement of all reads."""

from __future__ import annotations

import math

import numpy as np
import pytest

from adapters.memory import ArraySource
from adapters.synthetic import FAMILIES, Feistel, SyntheticSource
from topk_middleware import private_top_k
from topk_middleware.access import AccessError

SMALL = [
    ("zipf", 1, {}),
    ("zipf", 1000, {}),
    ("zipf", 5000, {"top": 300, "exponent": 0.8}),
    ("flat", 37, {}),
    ("uniform", 500, {"top": 10**6}),
    ("uniform", 999, {"top": 40}),
    ("plateau", 400, {}),
    ("plateau", 1000, {"k": 4, "top": 7}),
    ("plateau", 10, {"size": 10}),
]


@pytest.mark.parametrize("family,m,kwargs", SMALL, ids=[f"{f}-{m}" for f, m, _ in SMALL])
@pytest.mark.parametrize("seed", [0, 1])
def test_small_sources_are_canonical_and_bijective(family: str, m: int, kwargs, seed: int) -> None:
    """Exhaustively: ids are a permutation of [0, m), the sorted read is in canonical order
    (score descending, ties by id ascending), and every way of reading agrees with it."""
    source = SyntheticSource(m, family, seed=seed, **kwargs)
    assert source.domain_size() == m
    rows = source.read_sorted(0, m)
    assert rows.positions.tolist() == list(range(m))
    assert sorted(rows.ids.tolist()) == list(range(m))  # a bijection of [0, m)
    canonical = np.lexsort((rows.ids, -rows.scores))
    assert canonical.tolist() == list(range(m))
    assert np.all(rows.scores == np.round(rows.scores)) and np.all(rows.scores >= 0)
    assert source.ranks_of_ids(rows.ids).tolist() == list(range(m))
    assert source.read_ids(rows.ids.tolist()).tolist() == rows.scores.tolist()
    # Random access by rank and the same histogram in an ArraySource agree with sorted access.
    shuffled = np.random.default_rng(seed).permutation(m)
    by_rank = source.read_positions(shuffled)
    assert by_rank.ids.tolist() == rows.ids[shuffled].tolist()
    assert by_rank.scores.tolist() == rows.scores[shuffled].tolist()
    twin = ArraySource(rows.scores, rows.ids).read_sorted(0, m)
    assert twin.ids.tolist() == rows.ids.tolist()
    # Partial sorted reads are slices of the full one.
    part = source.read_sorted(m // 3, 17)
    assert part.ids.tolist() == rows.ids[m // 3 : m // 3 + 17].tolist()


def test_family_scores_match_their_formulas() -> None:
    """Scores computed independently in Python integers."""
    m = 2000
    zipf = SyntheticSource(m, "zipf", top=10**5).read_sorted(0, m).scores
    assert zipf.tolist() == [float(10**5 // (r + 1)) for r in range(m)]
    uniform = SyntheticSource(m, "uniform", top=77).read_sorted(0, m).scores
    assert uniform.tolist() == [float(77 * (m - 1 - r) // (m - 1)) for r in range(m)]
    flat = SyntheticSource(m, "flat", top=5).read_sorted(0, m).scores
    assert set(flat.tolist()) == {5.0}
    # Theorem 5.4's instance: tau = ceil(sqrt(m k)) items in S, |S_L| = tau // k at top - 1.
    k = 3
    plateau = SyntheticSource(m, "plateau", k=k, top=50).read_sorted(0, m).scores
    tau = math.ceil(math.sqrt(m * k))
    assert (plateau == 50).sum() == tau - tau // k
    assert (plateau == 49).sum() == tau // k
    assert (plateau == 0).sum() == m - tau


@pytest.mark.parametrize("family", FAMILIES)
def test_huge_sources_read_consistently(family: str) -> None:
    """m = 1e12: no per-item storage; random ranks round-trip through ids, sorted windows are
    non-increasing and canonical, and random access by id, by rank and sorted access agree."""
    m = 10**12
    source = SyntheticSource(m, family, seed=5)
    rng = np.random.default_rng(6)
    ranks = np.unique(rng.integers(0, m, 20_000))
    rows = source.read_positions(ranks)
    assert np.all((rows.ids >= 0) & (rows.ids < m))
    assert len(np.unique(rows.ids)) == len(ranks)
    assert np.array_equal(source.ranks_of_ids(rows.ids), ranks)
    assert np.array_equal(source.read_ids(rows.ids.tolist()), rows.scores)
    for start in [0, 999_000, m // 2, m - 3000]:
        window = source.read_sorted(start, 3000)
        assert np.all(np.diff(window.scores) <= 0)
        ties = np.diff(window.scores) == 0
        assert np.all(np.diff(window.ids)[ties] > 0)  # ties by id ascending
        again = source.read_positions(window.positions)
        assert np.array_equal(again.ids, window.ids)
    assert len(source.read_sorted(m - 2, 10)) == 2


@pytest.mark.parametrize("n", [*range(1, 70), 255, 256, 257, 1000, 4097])
def test_feistel_is_a_bijection_with_its_inverse(n: int) -> None:
    perm = Feistel(n, key=n * 7919 + 3)
    x = np.arange(n, dtype=np.int64)
    y = perm.apply(x)
    assert sorted(y.tolist()) == list(range(n))
    assert np.array_equal(perm.apply(y, inverse=True), x)
    if n >= 64:
        assert not np.array_equal(y, x)  # it does permute


def test_one_seed_one_answer_on_synthetic_and_array_stores() -> None:
    """Items are named by rank: the same seed gives the same ids on both stores."""
    source = SyntheticSource(3000, "zipf", top=60, seed=2)
    rows = source.read_sorted(0, 3000)
    twin = ArraySource(rows.scores, rows.ids)
    for seed in range(5):
        for method in ("threshold", "oneshot"):
            a = private_top_k(source, 5, 1.0, method=method, seed=seed).items
            b = private_top_k(twin, 5, 1.0, method=method, seed=seed).items
            assert a == b


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="family must be one of"):
        SyntheticSource(10, "pareto")
    with pytest.raises(ValueError, match=r"m must be in \[1, 2\*\*62\]"):
        SyntheticSource(0, "flat")
    with pytest.raises(TypeError, match="m must be an integer"):
        SyntheticSource(1e6, "flat")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="plateau top must be >= 2"):
        SyntheticSource(100, "plateau", top=1)
    with pytest.raises(ValueError, match="more than"):
        SyntheticSource(10**9, "uniform", top=10**8)
    source = SyntheticSource(100, "zipf")
    with pytest.raises(AccessError, match="no item with id 100"):
        source.read_ids([3, 100])
    with pytest.raises(AccessError, match="no item with id 'a'"):
        source.read_ids(["a"])
    with pytest.raises(AccessError, match="rank out of range"):
        source.read_positions(np.array([5, 100]))
