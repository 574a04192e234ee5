"""One conformance suite for every store in tests/conftest.py STORE_NAMES.

A store plugin (tests/stores_<name>.py) provides `make_<name>_source(scores, ids) -> Source` and,
for the snapshot test, `write_<name>_source(source, item_id, new_score) -> bool`: a concurrent
writer that commits, from a connection of its own, a new score for one item and whatever the store
needs for new runs to see it (e.g. a refreshed rank table); it returns whether new runs see it.
A plugin may also provide a session-scoped `shared_<name>_source` with the signature of
`make_<name>_source` that serves one source per distinct histogram: the read-only tests use it,
and the snapshot test, which writes, always gets a table of its own (`store_to_write`).

Every store must serve the canonical order of ArraySource (score descending, ties by id ascending;
text ids in byte order), the same position -> row map (so uniform positions are uniform items),
exact m, and therefore, with one seed, the same private top-k as ArraySource naming items alike
(`reference_for`: by rank, or by input index for the live stores of LIVE_STORE_NAMES).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from adapters.memory import ArraySource
from tests.conftest import LIVE_STORE_NAMES, STORE_NAMES, read_only_maker
from tests.helpers import (
    RUNS_CASES,
    CountingSource,
    RunsKept,
    plateau_histogram,
    reference_for,
    reference_like,
)
from topk_middleware import private_top_k
from topk_middleware.access import AccessError, Rows, Source


@pytest.fixture
def write_memory_source() -> Callable[[Any, Any, float], bool]:
    """ArraySource holds private copies of its arrays: nothing can write to it."""
    return lambda source, item, score: False


def byte_order_ids(m: int) -> list[str]:
    """Distinct text ids whose byte order differs from case-insensitive and locale orders:
    capitals before lower case ('B' < 'a'), non-ASCII after ASCII ('z' < 'ä' < 'é'), digits as
    text ('10' < '9'), inner spaces and underscores. No leading or trailing spaces."""
    alphabet = ["a", "B", "b", "A", "é", "z", "Z", "ä", "0", "9", "_", "ß"]
    ids: list[str] = []
    for length in (1, 2, 3):
        for letters in itertools.product(alphabet, repeat=length):
            ids.append("".join(letters))
    ids += ["a b", "a  b", "10", "2", "Ä", "日本", "e\u0301"]  # "e" + combining accent: not "é"
    rng = np.random.default_rng(1)
    return [ids[i] for i in rng.permutation(len(ids))[:m]]


def dataset(name: str) -> tuple[np.ndarray, Any]:
    """Small histograms with many ties: integer ids, text ids, plateau, skewed."""
    rng = np.random.default_rng(7)
    if name == "int-ties":
        return rng.integers(0, 6, 500).astype(np.float64), rng.permutation(10_000)[:500] - 3000
    if name == "text-ties":
        ids = byte_order_ids(400)
        return rng.integers(0, 4, len(ids)).astype(np.float64), np.asarray(ids, dtype=object)
    if name == "plateau":
        return plateau_histogram(2000, 5), None
    if name == "zipf":
        counts = np.floor(1e5 / np.arange(1, 3001) ** 1.1)
        return rng.permutation(counts), rng.permutation(3000) * 7
    if name == "fractional":
        return np.round(rng.exponential(3.0, 300), 3), None
    raise ValueError(name)


DATASETS = ["int-ties", "text-ties", "plateau", "zipf", "fractional"]


@pytest.fixture(params=STORE_NAMES)
def store(request: pytest.FixtureRequest) -> tuple[str, Callable[[Any, Any], Source]]:
    name = request.param
    return name, read_only_maker(request, name)


@pytest.fixture(params=[name for name in STORE_NAMES if name not in LIVE_STORE_NAMES])
def ranked_store(request: pytest.FixtureRequest) -> tuple[str, Callable[[Any, Any], Source]]:
    """The stores whose positions are ranks (a rank-ordered copy): they keep runs of tied
    scores. (A live store keeps none: tests/stores/test_sqlalchemy_live.py.)"""
    name = request.param
    return name, read_only_maker(request, name)


@pytest.fixture
def store_to_write(
    store: tuple[str, Callable[[Any, Any], Source]], request: pytest.FixtureRequest
) -> tuple[str, Callable[[Any, Any], Source]]:
    """The store of `store`, made by the plugin's per-test `make_<name>_source`: a table of the
    test's own, which it may write to."""
    name = store[0]
    return name, request.getfixturevalue(f"make_{name.replace('-', '_')}_source")


def _writer(request: pytest.FixtureRequest, name: str) -> Callable[[Any, Any, float], bool]:
    fixture = f"write_{name.replace('-', '_')}_source"
    try:
        return request.getfixturevalue(fixture)
    except pytest.FixtureLookupError:
        pytest.fail(f"the plugin of store {name!r} must provide the fixture {fixture}")


def as_list(values: np.ndarray) -> list[Any]:
    return np.asarray(values).tolist()


def assert_rows_equal(got: Rows, want: Rows) -> None:
    assert as_list(got.positions) == as_list(want.positions)
    assert as_list(got.ids) == as_list(want.ids)
    np.testing.assert_array_equal(np.asarray(got.scores, dtype=np.float64), want.scores)


@pytest.mark.parametrize("data", DATASETS)
def test_sorted_access_serves_the_canonical_order(store, data: str) -> None:
    """Sorted access in any chunking equals ArraySource's order: ties by id, text in byte order."""
    _, make = store
    scores, ids = dataset(data)
    source = make(scores, ids)
    reference = reference_for(source, scores, ids)
    m = len(scores)
    want = reference.read_sorted(0, m)
    with source.snapshot():
        assert source.domain_size() == m
        assert_rows_equal(source.read_sorted(0, m), want)
        # one-row reads to depth 128: past the end of the first tie run of every data set
        for chunk, depth in ((1, 128), (7, 200), (64, 200)):
            for start in range(0, min(m, depth), chunk):
                assert_rows_equal(
                    source.read_sorted(start, chunk), reference.read_sorted(start, chunk)
                )
        tail = source.read_sorted(m - 3, 10)  # a read past the end returns the rows there are
        assert_rows_equal(tail, reference.read_sorted(m - 3, 10))


def test_text_ids_are_in_byte_order(store) -> None:
    """The canonical order of text ids is the order of their UTF-8 bytes."""
    _, make = store
    ids = ["a", "B", "é", "z", "Z", "ä", "ab", "a b", "10", "9", "Ä", "e\u0301", "_"]
    source = make(np.ones(len(ids)), np.asarray(ids, dtype=object))
    with source.snapshot():
        got = as_list(source.read_sorted(0, len(ids)).ids)
    assert got == sorted(ids, key=lambda s: s.encode("utf-8"))
    assert got.index("B") < got.index("a") < got.index("z") < got.index("ä") < got.index("é")


@pytest.mark.parametrize("data", DATASETS)
def test_rank_map_is_canonical(store, data: str) -> None:
    """Random access by position returns, for every position, the reference's row (the canonical
    row of that rank on a rank-ordered store, the input row on a live one), so a uniform position
    is a uniform item (each item has exactly one position)."""
    _, make = store
    scores, ids = dataset(data)
    source = make(scores, ids)
    reference = reference_for(source, scores, ids)
    m = len(scores)
    everything = np.random.default_rng(3).permutation(m)
    with source.snapshot():
        rows = source.read_positions(np.sort(everything[: m // 2]))
        rest = source.read_positions(np.sort(everything[m // 2 :]))
    got: dict[int, tuple[Any, float]] = {}
    for part in (rows, rest):
        columns = map(as_list, (part.positions, part.ids, part.scores))
        got.update({r: (i, s) for r, i, s in zip(*columns, strict=True)})
    want = reference.read_positions(np.arange(m))
    assert sorted(got) == list(range(m))
    assert [got[r][0] for r in range(m)] == as_list(want.ids)
    assert [got[r][1] for r in range(m)] == as_list(want.scores)
    assert len({got[r][0] for r in range(m)}) == m  # rank -> item is a bijection


@pytest.mark.parametrize("data", ["int-ties", "text-ties"])
def test_random_access_by_id(store, data: str) -> None:
    _, make = store
    scores, ids = dataset(data)
    source = make(scores, ids)
    order = np.random.default_rng(5).permutation(len(scores))[:150]
    wanted = [ids[i].item() if isinstance(ids[i], np.generic) else ids[i] for i in order]
    with source.snapshot():
        got = source.read_ids(wanted)
        np.testing.assert_array_equal(np.asarray(got, dtype=np.float64), scores[order])
        missing = "no such item" if data == "text-ties" else 10**9
        with pytest.raises(AccessError):
            source.read_ids([wanted[0], missing])


@pytest.mark.parametrize("method", ["threshold", "oneshot"])
@pytest.mark.parametrize("data", ["plateau", "zipf"])
def test_access_counts_match_what_the_store_served(store, data: str, method: str) -> None:
    """CountedAccess reports exactly the rows and reads a wrapper around the store observed."""
    _, make = store
    scores, ids = dataset(data)
    counting = CountingSource(make(scores, ids))
    result = private_top_k(counting, k=5, epsilon=1.0, method=method, seed=11)
    a = result.accesses
    assert a.rows_fetched == counting.rows
    assert a.round_trips == counting.calls  # one query per read on every store
    if method == "oneshot":
        assert counting.sorted_rows == len(scores) and a.sorted == len(scores)
    else:
        assert counting.rows < len(scores)  # sublinear on these instances


def test_a_run_sees_one_snapshot(store_to_write, request: pytest.FixtureRequest) -> None:
    """A writer commits, between two batches of a run, a score that would win; the run's answer
    and access counts are those of the data before the write. Fails if any read of the run after
    the write sees it (the item would be released, or the counts would differ)."""
    name, make = store_to_write
    write = _writer(request, name)
    scores, ids = plateau_histogram(1500, 3), np.arange(1500) + 100
    loser = int(np.flatnonzero(scores == 0)[-1])
    loser_id = int(ids[loser])
    source = make(scores, ids)
    reference = private_top_k(
        reference_for(source, scores, ids), k=3, epsilon=1.0, method="threshold", seed=21
    )

    class WriteBetweenBatches(CountingSource):
        def read_sorted(self, start: int, count: int) -> Rows:
            rows = super().read_sorted(start, count)
            if self.sorted_rows == len(rows):  # after the first batch
                self.visible = write(source, loser_id, 1e9)
            return rows

    hooked = WriteBetweenBatches(source)
    result = private_top_k(hooked, k=3, epsilon=1.0, method="threshold", seed=21)
    assert hooked.sorted_rows < len(scores) and hooked.calls >= 3  # the write fell mid-run
    assert result.items == reference.items
    assert (result.accesses.sorted, result.accesses.random) == (
        reference.accesses.sorted,
        reference.accesses.random,
    )
    assert loser_id not in result.items
    if hooked.visible:  # the write was real: the next run sees it
        assert (
            private_top_k(source, k=3, epsilon=1.0, method="threshold", seed=21).items[0]
            == loser_id
        )


ORACLES: list[dict[str, Any]] = [{}, {"oracle": "eager"}]  # the default oracle, and the eager one


@pytest.mark.parametrize("data", ["plateau", "zipf", "text-ties", "int-ties"])
def test_same_seed_same_answer_as_array_source(store, data: str) -> None:
    """With one seed, private_top_k returns the same items, in the same order and at the same
    access counts, on this store as on ArraySource, for several seeds, k, noises, methods and
    oracles. The threshold run reads other positions at each seed, so it runs at three seeds
    with both oracles; the full read reads every row whatever the seed and has no oracle, so
    it runs at one. Fails if the store's canonical order, rank map or m differ anywhere they
    are used."""
    _, make = store
    scores, ids = dataset(data)
    source = make(scores, ids)
    reference = reference_for(source, scores, ids)
    plans = (("threshold", range(3), ORACLES), ("oneshot_full_read", (0,), ORACLES[:1]))
    for method, seeds, oracles in plans:
        for seed, k, noise, oracle in itertools.product(
            seeds, (1, 4), ("gumbel", "laplace"), oracles
        ):
            options: dict[str, Any] = dict(
                k=k, epsilon=2.0, noise=noise, method=method, seed=seed, **oracle
            )
            want = private_top_k(reference, **options)
            got = private_top_k(source, **options)
            assert got.items == want.items, options
            assert got.m == want.m
            assert (got.accesses.sorted, got.accesses.random) == (
                want.accesses.sorted,
                want.accesses.random,
            ), options


# ----- runs of tied scores (ScoreRuns) ------------------------------------------------------
@pytest.mark.parametrize("case", RUNS_CASES)
def test_runs_of_tied_scores_are_those_of_array_source(ranked_store, case: str) -> None:
    """A store keeps the runs of its canonical order (first rank, score of each distinct score),
    counts them with m and reads them in one query: exactly ArraySource's, on ties, zeros, text
    ids, fractional scores, all-tied and one-item data."""
    _, make = ranked_store
    scores, ids = RUNS_CASES[case]
    source = make(scores, ids)
    first, run_scores = ArraySource(scores, ids).read_score_runs()
    with source.snapshot():
        assert source.score_run_count() == len(first)
        got_first, got_scores = source.read_score_runs()
    assert got_first.dtype == np.int64 and got_scores.dtype == np.float64
    assert got_first.tolist() == first.tolist()
    assert got_scores.tolist() == run_scores.tolist()


def test_plateau_random_access_is_answered_by_the_runs(ranked_store) -> None:
    """On the plateau (two runs) the runs are read once and answer the random accesses: the same
    items and AccessStats as ArraySource (which keeps runs too), scores inferred, and fewer rows
    read by rank than random accesses made (counted through RunsKept, which keeps the runs)."""
    _, make = ranked_store
    scores = plateau_histogram(4000, 5)
    source = make(scores, None)
    for seed in range(2):
        want = private_top_k(
            reference_like(source, scores), k=5, epsilon=1.0, method="threshold", seed=seed
        )
        got = private_top_k(source, k=5, epsilon=1.0, method="threshold", seed=seed)
        assert got.items == want.items and got.accesses == want.accesses
        counted = RunsKept(source)
        again = private_top_k(counted, k=5, epsilon=1.0, method="threshold", seed=seed)
        assert again.items == want.items and again.accesses == want.accesses
        assert counted.runs_read == 1 and again.accesses.rows_inferred > 0
        assert counted.rank_rows < again.accesses.random
