"""CountedAccess: scores known without reading rows, and ids at release.

The canonical order sorts scores descending, so a rank between two known ranks of equal score has
that score, and a store that keeps its runs of tied scores (ScoreRuns) fixes every rank's score.
CountedAccess answers such random accesses without reading the row (rows_inferred). These tests
check that every inferred score is the true one, that nothing is inferred between unequal
neighbours, that the accounting adds up against an independent counter, when the runs are read,
and that ids at inferred ranks are read, in one round trip, when they are released.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from adapters.memory import ArraySource
from tests.helpers import CountingSource, plateau_histogram
from topk_middleware import private_top_k
from topk_middleware.access import (
    AccessError,
    CountedAccess,
    Rows,
    RunTraits,
    StoreTraits,
    TraitsError,
)
from topk_middleware.accounting import PrivacyBudget


def tied_counts(m: int, seed: int = 0) -> np.ndarray:
    """Count data: a few large counts and a long tail of small tied ones (zipf-like)."""
    rng = np.random.default_rng(seed)
    return np.floor(1000.0 / (1 + rng.permutation(m))).astype(np.float64)


def canonical_scores(source: ArraySource) -> np.ndarray:
    return source.read_sorted(0, source.domain_size()).scores


@pytest.mark.parametrize("prefix", [0, 1, 50])
def test_inferred_scores_are_the_true_scores(prefix: int) -> None:
    """Random accesses over a tied histogram: every score equals the store's, many are inferred,
    and rows read plus rows inferred is exactly the distinct ranks asked beyond the prefix. Fails if
    a score is inferred across unequal neighbours or a rank is read twice."""
    m = 20_000
    source = ArraySource(tied_counts(m))
    truth = canonical_scores(source)
    counter = CountingSource(source)  # forwards no runs: neighbours only
    access = CountedAccess(counter)
    access.fetch_sorted_until(prefix)
    rng = np.random.default_rng(1)
    asked: set[int] = set()
    for size in (5, 50, 500, 5000):
        ranks = rng.integers(0, m, size)
        np.testing.assert_array_equal(access.random_accesses(ranks), truth[ranks])
        asked.update(int(r) for r in ranks if r >= prefix)
    a = access.stats
    assert a.rows_inferred > len(asked) // 2  # most of a tied tail is never read
    assert counter.rank_rows + a.rows_inferred == len(asked)
    assert a.random == 5 + 50 + 500 + 5000


def test_nothing_is_inferred_between_distinct_scores() -> None:
    m = 5_000
    source = ArraySource(np.arange(m, dtype=np.float64))
    counter = CountingSource(source)
    access = CountedAccess(counter)
    ranks = np.random.default_rng(2).integers(0, m, 2_000)
    np.testing.assert_array_equal(access.random_accesses(ranks), m - 1.0 - ranks)
    assert access.stats.rows_inferred == 0
    assert counter.rank_rows == len(np.unique(ranks))


def test_one_by_one_random_accesses_infer_too() -> None:
    """The sequential path (one random access at a time) uses the same neighbours."""
    m = 10_000
    source = ArraySource(tied_counts(m, seed=3))
    truth = canonical_scores(source)
    access = CountedAccess(CountingSource(source))
    ranks = np.random.default_rng(4).choice(m, 3_000, replace=False)
    got = [access.random_access(int(r)) for r in ranks]
    np.testing.assert_array_equal(got, truth[ranks])
    assert access.stats.rows_inferred > 1_000
    assert access.stats.rows_fetched + access.stats.rows_inferred == len(ranks)


def test_ids_at_inferred_ranks_are_read_in_one_round_trip() -> None:
    m = 10_000
    ids = [f"item-{i}" for i in range(m)]
    source = ArraySource(tied_counts(m, seed=5), ids=ids)
    truth = source.read_sorted(0, m)
    counter = CountingSource(source)
    access = CountedAccess(counter)
    access.fetch_sorted_until(10)
    ranks = np.random.default_rng(6).choice(np.arange(10, m), 2_000, replace=False)
    access.random_accesses(ranks[:20])  # read: they become the neighbours of later ranks
    access.random_accesses(ranks)
    inferred = [int(r) for r in ranks if int(r) not in access._ids_by_position]
    assert len(inferred) == access.stats.rows_inferred > 0
    wanted = [3, *inferred[:7]]
    calls, rows = counter.calls, counter.rank_rows
    assert access.ids_of(wanted) == [truth.ids[r] for r in wanted]
    assert (counter.calls - calls, counter.rank_rows - rows) == (1, 7)
    assert access.ids_of(wanted) == [truth.ids[r] for r in wanted]  # now known: no read
    assert counter.calls - calls == 1


def test_ids_of_an_unknown_rank_is_refused() -> None:
    access = CountedAccess(ArraySource(tied_counts(100)))
    with pytest.raises(AccessError, match="not known"):
        access.ids_of([50])


class _RunsCounter(ArraySource):
    """ArraySource that counts how often its runs are read."""

    runs_read = 0

    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        self.runs_read += 1
        return super().read_score_runs()


def test_runs_are_read_once_rank_reads_would_reach_their_count() -> None:
    """Ski rental: rows are read by rank while the rows read so far plus the batch stay below the
    number of runs; then the runs are read once (counted as rows and one round trip) and every
    later random access is answered from them, exactly. Fails if runs are read early, twice, or
    give a wrong score."""
    m = 30_000
    source = _RunsCounter(tied_counts(m, seed=9))
    truth = canonical_scores(source)
    runs = source.score_run_count()
    assert 20 < runs < 200
    access = CountedAccess(source)
    rng = np.random.default_rng(10)
    first = rng.choice(m, runs // 2, replace=False)  # below the count: read by rank
    np.testing.assert_array_equal(access.random_accesses(first), truth[first])
    assert source.runs_read == 0
    before = access.stats.rows_fetched
    assert before == len(first) - access.stats.rows_inferred
    later = rng.choice(m, 5_000, replace=False)  # would pass the count: runs instead
    np.testing.assert_array_equal(access.random_accesses(later), truth[later])
    assert source.runs_read == 1
    assert access.stats.rows_fetched == before + runs
    assert access.stats.round_trips == 1 + 1 + 1  # domain size, the first batch, the runs
    np.testing.assert_array_equal(access.random_accesses(np.arange(m)), truth)
    assert source.runs_read == 1 and access.stats.rows_fetched == before + runs


def test_runs_do_not_change_answers_or_access_counts() -> None:
    """Runs change what is read, never what the algorithm sees: the same items and sequential
    access counts with and without them, for both noises, in threshold runs (pinned: the
    planner could pick a one-shot on these small tables, which reads no runs). On zipf-like
    tied counts the runs stop before the runs pay off; on a plateau of five tied scores they
    are read (once per run) and the rows fetched differ. Fails if an answer or a count moved."""
    plateau = np.random.default_rng(11).permutation(np.repeat([50.0, 40.0, 30.0, 20.0, 10.0], 1000))
    for scores, read in ((tied_counts(5_000, seed=11), False), (plateau, True)):
        with_runs, without = _RunsCounter(scores), CountingSource(ArraySource(scores))
        fetched = [0, 0]
        for seed in range(15):
            for noise in ("gumbel", "laplace"):
                a = private_top_k(with_runs, 5, 1.0, noise=noise, seed=seed, method="threshold")
                b = private_top_k(without, 5, 1.0, noise=noise, seed=seed, method="threshold")
                assert a.method == b.method == "threshold"
                assert a.items == b.items
                assert (a.accesses.sorted, a.accesses.random) == (
                    b.accesses.sorted,
                    b.accesses.random,
                )
                fetched[0] += a.accesses.rows_fetched
                fetched[1] += b.accesses.rows_fetched
        assert (with_runs.runs_read > 0) == read
        assert (fetched[0] != fetched[1]) == read


class _HeadOfRuns(_RunsCounter):
    """ArraySource that, like PostgreSQL's live tables, gives a head of its runs first: the first
    ranks of the runs down to `cut` of them (in hand, the rest unsized), and the full runs only
    when asked (counted in runs_read)."""

    def __init__(self, scores: np.ndarray, cut: int) -> None:
        super().__init__(scores)
        self.cut = cut

    def run_traits(self) -> RunTraits:
        return RunTraits(score_runs_in_hand=True)

    def read_score_runs_head(self) -> tuple[np.ndarray, np.ndarray]:
        first, scores = ArraySource.read_score_runs(self)
        return first[: self.cut + 1], scores


def test_a_head_of_runs_bounds_the_rest_and_changes_no_answer() -> None:
    """A head of runs fixes the scores of its ranks; past it a score lies between the least and
    the first run not sized, and the full runs are read (once) only where those bounds do not
    settle a random access. With one seed the items and sequential access counts equal those
    of the full runs, on histograms whose runs are cut at every place, for both noises; on a
    plateau above a tail of small counts the full runs are never read and the tail is settled by
    bounds. Fails if a bound were wrong (another item released or a count changed), or if the
    full runs were read where the bounds settle everything."""
    rng = np.random.default_rng(21)
    settled = completed = 0  # runs settling a bound, runs reading the full runs
    for trial in range(40):
        m = int(rng.integers(20, 400))
        scores = np.floor(rng.pareto(1.0, m) * 3.0)
        runs = len(np.unique(scores))
        if runs < 2:
            continue
        cut = int(rng.integers(0, runs - 1))
        k = int(rng.integers(1, min(m, 12) + 1))
        for noise in ("gumbel", "laplace"):
            seed = trial * 2 + (noise == "laplace")
            options = {"noise": noise, "seed": seed, "method": "threshold"}
            want = private_top_k(_RunsCounter(scores), k, 0.5, **options)
            source = _HeadOfRuns(scores, cut)
            got = private_top_k(source, k, 0.5, **options)
            settled += got.accesses.rows_bounded > 0
            completed += source.runs_read > 0
            assert got.items == want.items, (trial, cut, noise)
            assert (got.accesses.sorted, got.accesses.random) == (
                want.accesses.sorted,
                want.accesses.random,
            )
    assert settled > 20 and completed > 20, (settled, completed)
    scores = plateau_histogram(20_000, 5, height=1000.0)
    zeros = np.flatnonzero(scores == 0)
    scores[zeros[:600]] = np.arange(600) % 3 + 1  # a tail of 1, 2 and 3 below the plateau
    for seed in range(5):
        source = _HeadOfRuns(scores, 1)  # the plateau sized; 3, 2, 1 and 0 not
        got = private_top_k(source, 5, 1.0, method="threshold", seed=seed)
        want = private_top_k(ArraySource(scores), 5, 1.0, method="threshold", seed=seed)
        assert got.items == want.items and source.runs_read == 0
        assert got.accesses.rows_bounded > 0
        assert (got.accesses.sorted, got.accesses.random) == (
            want.accesses.sorted,
            want.accesses.random,
        )
    access = CountedAccess(_HeadOfRuns(scores, 1))
    truth = canonical_scores(ArraySource(scores))
    tail = np.arange(200, 1_000)  # every score past the plateau: the full runs, read once
    np.testing.assert_array_equal(access.random_accesses(tail), truth[tail])
    assert access.source.runs_read == 1  # type: ignore[attr-defined]


class _BadRuns(ArraySource):
    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        first, scores = super().read_score_runs()
        return first, scores[::-1]  # ascending: not the canonical order


def test_inconsistent_runs_are_refused() -> None:
    access = CountedAccess(_BadRuns(tied_counts(2_000)))
    with pytest.raises(AccessError, match="runs of tied scores are inconsistent"):
        access.random_accesses(np.arange(1_000, 2_000))


class _ShiftingSource(ArraySource):
    """A broken store: rows read by rank after the first read come back with other scores."""

    reads = 0

    def read_positions(self, ranks: np.ndarray) -> Rows:
        rows = super().read_positions(ranks)
        self.reads += 1
        if self.reads > 1:
            return Rows(rows.positions, rows.ids, rows.scores + 1.0)
        return rows


def test_a_changed_row_at_release_is_detected() -> None:
    """An id read at release must come with the score the run used; if not, the snapshot broke."""
    m = 1_000
    access = CountedAccess(_ShiftingSource(tied_counts(m, seed=7)))
    ranks = np.random.default_rng(8).choice(m, 300, replace=False)
    access.random_accesses(ranks[:20])
    access.random_accesses(ranks)
    inferred = [int(r) for r in ranks if int(r) not in access._ids_by_position]
    assert inferred
    with pytest.raises(AccessError, match="snapshot"):
        access.ids_of(inferred[:1])


def test_sorted_reads_read_ahead_as_far_as_the_store_asks() -> None:
    """A store naming `sorted_read_rows` gets at least that many rows per sorted read after the
    first (capped at m: fewer round trips for the same prefix); the answers and the sequential
    access counts of threshold runs (pinned) do not change, and their round trips do not rise."""
    scores = tied_counts(3_000, seed=12)
    plain, ahead = CountingSource(ArraySource(scores)), CountingSource(ArraySource(scores))
    ahead.sorted_read_rows = 1_000  # type: ignore[attr-defined]
    access = CountedAccess(ahead)
    access.fetch_sorted_until(5)
    assert (access.prefix_fetched, ahead.sorted_rows) == (5, 5)  # the first read: as asked
    access.fetch_sorted_until(6)
    assert (access.prefix_fetched, ahead.sorted_rows, ahead.calls) == (1_005, 1_005, 3)
    access.fetch_sorted_until(2_500)
    assert access.prefix_fetched == 2_500  # asked beyond the read-ahead: exactly that
    access.fetch_sorted_until(2_600)
    assert access.prefix_fetched == 3_000  # capped at m
    for seed in range(10):
        first = private_top_k(plain, 5, 1.0, seed=seed, method="threshold")
        second = private_top_k(ahead, 5, 1.0, seed=seed, method="threshold")
        assert first.method == second.method == "threshold"
        assert first.items == second.items
        a, b = first.accesses, second.accesses
        assert (a.sorted, a.random) == (b.sorted, b.random)
        assert b.round_trips <= a.round_trips


class ScoresWithoutRows(CountingSource):
    """ArraySource(positions="input") that also tells scores at positions without rows
    (PositionScores), counting those answers independently."""

    positions_are_ranks = False

    def __init__(self, inner: ArraySource, wrong: bool = False) -> None:
        super().__init__(inner)
        self.scored = 0
        self.wrong = wrong

    def read_position_scores(self, positions: np.ndarray) -> tuple[np.ndarray, int, int]:
        self.scored += len(positions)
        scores = self.inner.read_positions(positions).scores
        return (scores[:-1] if self.wrong else scores), 0, len(positions)


def test_scores_without_rows_change_no_answer_and_ids_are_read_at_release() -> None:
    """A store whose positions are not ranks and that tells scores without rows gives the same
    answers and sorted / random access counts as when it reads the rows; its answers are counted
    as inferred, and the released items' rows (ids) are read in one batch at the end. (A
    plateau: the prefix's last score bounds no sampled item below the threshold, so the
    scores are asked for.)"""
    m = 5000
    scores = plateau_histogram(m, 5, height=3.0)
    ids = np.array([f"id{i}" for i in range(m)], dtype=object)
    scored = 0
    for seed in range(8):
        plain = CountingSource(ArraySource(scores, ids, positions="input"))
        told = ScoresWithoutRows(ArraySource(scores, ids, positions="input"))
        want = private_top_k(plain, k=5, epsilon=0.5, seed=seed)
        got = private_top_k(told, k=5, epsilon=0.5, seed=seed)
        assert got.items == want.items
        assert (got.accesses.sorted, got.accesses.random) == (
            want.accesses.sorted,
            want.accesses.random,
        )
        assert got.accesses.rows_inferred == told.scored
        assert told.rank_rows <= 5  # only the released items' rows, never the sampled ones
        assert got.accesses.rows_fetched == told.rows
        scored += told.scored
    assert scored > 0  # some runs needed scores their bounds did not settle


def test_scores_without_rows_of_the_wrong_length_are_refused() -> None:
    source = ScoresWithoutRows(ArraySource(tied_counts(100), positions="input"), wrong=True)
    access = CountedAccess(source)
    with pytest.raises(AccessError, match="scores for"):
        access.fetch_positions(np.array([3, 50, 70]))


class _Bare:
    """The Source protocol over an ArraySource, without traits; counts every call."""

    def __init__(self, scores: np.ndarray) -> None:
        self.inner, self.calls = ArraySource(scores), 0

    def domain_size(self) -> int:
        self.calls += 1
        return self.inner.domain_size()

    def snapshot(self) -> Any:
        self.calls += 1
        return self.inner.snapshot()

    def read_sorted(self, start: int, count: int) -> Rows:
        self.calls += 1
        return self.inner.read_sorted(start, count)

    def read_positions(self, positions: np.ndarray) -> Rows:
        self.calls += 1
        return self.inner.read_positions(positions)

    def read_ids(self, ids: Any) -> np.ndarray:
        self.calls += 1
        return self.inner.read_ids(ids)


@pytest.mark.parametrize("oblivious", [False, True])
def test_a_source_without_traits_is_refused_before_it_is_read(oblivious: bool) -> None:
    """A source that declares no traits (so no sensitivity) is refused with the project's
    words before any call reaches it, and nothing is charged; one whose traits() gives another
    record is refused too. Fails if a default sensitivity were assumed."""
    bare = _Bare(tied_counts(200))
    budget = PrivacyBudget(5.0)
    with pytest.raises(TraitsError, match="_Bare declares no traits: a store defines traits"):
        private_top_k(bare, 3, 1.0, seed=1, oblivious=oblivious, budget=budget)
    assert bare.calls == 0 and budget.releases == []

    class Wrong(_Bare):
        def traits(self) -> dict[str, float]:
            return {"sensitivity": 1.0}

    with pytest.raises(TraitsError, match=r"Wrong.traits\(\) returned dict, not a StoreTraits"):
        private_top_k(Wrong(tied_counts(200)), 3, 1.0, seed=1, oblivious=oblivious)
    with pytest.raises(TypeError, match="sensitivity"):
        StoreTraits()  # type: ignore[call-arg]  # no default sensitivity


def test_declared_traits_reach_the_release() -> None:
    """What a store declares is what the release states: its sensitivity scales the noise
    (twice the unit scale at sensitivity 2), and run traits that say positions are not ranks
    make the core name items apart from their ranks."""

    class Declared(_Bare):
        def __init__(self, scores: np.ndarray, sensitivity: float, ranks: bool) -> None:
            super().__init__(scores)
            self.sensitivity, self.ranks = sensitivity, ranks

        def traits(self) -> StoreTraits:
            return StoreTraits(self.sensitivity)

        def run_traits(self) -> RunTraits:
            return RunTraits(positions_are_ranks=self.ranks)

    scores = tied_counts(2_000, seed=3)
    unit = private_top_k(Declared(scores, 1.0, True), 5, 1.0, seed=2, method="threshold")
    double = private_top_k(Declared(scores, 2.0, True), 5, 1.0, seed=2, method="threshold")
    assert double.privacy.scale == pytest.approx(2 * unit.privacy.scale)
    assert double.privacy.sensitivity == 2.0
    assert CountedAccess(Declared(scores, 1.0, True)).ranked
    assert not CountedAccess(Declared(scores, 1.0, False)).ranked
