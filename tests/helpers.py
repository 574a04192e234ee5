"""Test helpers: a counting wrapper around any Source, and small histogram generators."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from adapters.memory import ArraySource
from topk_middleware import private_top_k
from topk_middleware.access import (
    Rows,
    RunTraits,
    ScoreRuns,
    Source,
    StoreTraits,
    positions_are_ranks,
    run_traits,
    store_traits,
)


class CountingSource:
    """Wraps a Source and counts, independently of CountedAccess, every row and call it serves
    (`calls`: the round trips each read made, one unless its rows say none: the first rows a
    store read with m). It keeps whether the source's positions are ranks (that changes what
    the core may infer)."""

    def __init__(self, inner: Source) -> None:
        self.inner = inner
        self.sorted_rows = 0
        self.rank_rows = 0
        self.id_rows = 0
        self.calls = 0
        # the run traits a test gives the wrapper (RunTraits); the inner store's are hidden
        self.sorted_read_rows = 0
        self.sorted_rows_in_hand = 0
        self.score_runs_in_hand = False
        self.store_costs: Any = None

    @property
    def rows(self) -> int:
        return self.sorted_rows + self.rank_rows + self.id_rows

    @property
    def positions_are_ranks(self) -> bool:
        return positions_are_ranks(self.inner)

    def traits(self) -> StoreTraits:
        return store_traits(self.inner)

    def run_traits(self) -> RunTraits:
        return RunTraits(
            positions_are_ranks=self.positions_are_ranks,
            score_runs_in_hand=self.score_runs_in_hand,
            sorted_read_rows=self.sorted_read_rows,
            sorted_rows_in_hand=self.sorted_rows_in_hand,
            costs=self.store_costs,
        )

    def domain_size(self) -> int:
        self.calls += 1
        return self.inner.domain_size()

    def snapshot(self) -> AbstractContextManager[Any]:
        return self.inner.snapshot()

    def read_sorted(self, start: int, count: int) -> Rows:
        rows = self.inner.read_sorted(start, count)
        self.calls += rows.round_trips
        self.sorted_rows += len(rows)
        return rows

    def read_positions(self, ranks: np.ndarray) -> Rows:
        rows = self.inner.read_positions(ranks)
        self.calls += 1
        self.rank_rows += len(rows)
        return rows

    def read_ids(self, ids: Sequence[Any]) -> np.ndarray:
        scores = self.inner.read_ids(ids)
        self.calls += 1
        self.id_rows += len(scores)
        return scores


class _ReadAhead(CountingSource):
    """A CountingSource (which hides the runs) that keeps the inner source's read-ahead and its
    rows in hand."""

    def __init__(self, inner: Source, sorted_read_rows: int, sorted_rows_in_hand: int) -> None:
        super().__init__(inner)
        self.sorted_read_rows = sorted_read_rows
        self.sorted_rows_in_hand = sorted_rows_in_hand


class _ReadAheadRuns(_ReadAhead):
    """A _ReadAhead that keeps the inner source's runs of tied scores."""

    def score_run_count(self) -> int | None:
        return self.inner.score_run_count()  # type: ignore[attr-defined]

    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        return self.inner.read_score_runs()  # type: ignore[attr-defined]


def reference_for(store: Any, scores: Any, ids: Any = None) -> ArraySource:
    """ArraySource(scores, ids) naming items as `store` does: by rank for a rank-ordered store,
    by input index for one whose positions are not ranks (the conformance plugins of live stores
    build them so, see tests/conftest.py LIVE_STORE_NAMES)."""
    return ArraySource(scores, ids, positions="ranks" if positions_are_ranks(store) else "input")


def reference_like(store: Any, scores: Any, ids: Any = None) -> Source:
    """reference_for(store, scores, ids) with the optional capabilities of `store`: it keeps the
    runs of tied scores (ScoreRuns) only if the store does, reads ahead as far
    (sorted_read_rows), has as many first rows in hand (sorted_rows_in_hand) and the same
    costs (auto's plan), so that
    rows_fetched and round_trips, not only the answer and the access counts, must come out
    equal. (CountingSource forwards only the Source protocol, so wrapping hides them.)"""
    reference = reference_for(store, scores, ids)
    traits = run_traits(store)
    keeps_runs = isinstance(store, ScoreRuns) and store.score_run_count() is not None
    like = (_ReadAheadRuns if keeps_runs else _ReadAhead)(
        reference, traits.sorted_read_rows, traits.sorted_rows_in_hand
    )
    like.score_runs_in_hand = keeps_runs and traits.score_runs_in_hand
    like.store_costs = traits.costs  # auto prices its runs as the store's
    return like


def plateau_histogram(m: int, k: int, height: float | None = None) -> np.ndarray:
    """The lower-bound instance of Wu et al. (Theorem 5.4): sqrt(mk) items tied at the top.

    The tied items sit at random positions (fixed seed) so that ids carry no order.
    """
    size = min(m, round(math.sqrt(m * k)))
    scores = np.zeros(m)
    scores[np.random.default_rng(12345).choice(m, size, replace=False)] = height or float(m)
    return scores


def random_histograms(rng: np.random.Generator):
    """Histograms with ties, plateaus, zeros, k = 1 and k = m."""
    for trial in range(120):
        m = int(rng.integers(1, 200))
        shape = trial % 4
        if shape == 0:  # few distinct values: many ties
            h = rng.integers(0, 4, m).astype(float)
        elif shape == 1:  # a plateau on top of zeros
            h = np.zeros(m)
            h[rng.choice(m, max(1, m // 3), replace=False)] = 50.0
        elif shape == 2:  # skewed
            h = np.floor(rng.pareto(1.2, m) * 20)
        else:  # all tied
            h = np.full(m, 7.0)
        k = [1, m, int(rng.integers(1, m + 1))][trial % 3]
        yield h, k


def same_on_store(make_store: Callable[[Any, Any], Source], data: str, run: Callable) -> None:
    """With one seed the store gives the items and access counts ArraySource gives."""
    from tests.stores.test_conformance import dataset

    scores, ids = dataset(data)
    source = make_store(scores, ids)
    reference = reference_for(source, scores, ids)
    for seed in range(3):
        want, got = run(reference, seed), run(source, seed)
        assert got.items == want.items, seed
        assert (got.accesses.sorted, got.accesses.random) == (
            want.accesses.sorted,
            want.accesses.random,
        )


class RunsKept(CountingSource):
    """A CountingSource that keeps the store's runs of tied scores (CountingSource hides them),
    so that a run can be counted as it really goes: rows read by rank, and reads of the runs.
    `before_runs`, if given, is called once, right before the runs are read."""

    def __init__(self, inner: Source, before_runs: Callable[[], None] | None = None) -> None:
        super().__init__(inner)
        self.sorted_read_rows = run_traits(inner).sorted_read_rows
        self.before_runs = before_runs
        self.runs_read = 0

    def score_run_count(self) -> int | None:
        return self.inner.score_run_count()  # type: ignore[attr-defined]

    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        if self.before_runs is not None:
            self.before_runs()
            self.before_runs = None
        self.runs_read += 1
        return self.inner.read_score_runs()  # type: ignore[attr-defined]


RUNS_CASES: dict[str, tuple[Any, Any]] = {
    "ties, zeros, text ids": (
        [3, 0, 3, 1, 0, 3, 5, 0, 1, 0],
        ["b", "a", "é", "A", "a ", "z", "x", "日本", "B", "Z"],
    ),
    "fractional scores": (np.round(np.random.default_rng(5).random(500) * 4.0, 1), None),
    "all tied at zero": ([0] * 30, None),
    "one item": ([4], ["only"]),
}


def assert_serves_the_runs_of(source: Any, scores: Any) -> None:
    """`source` (prepared) keeps exactly ArraySource's runs of `scores`, and a run on it gives
    ArraySource's items and AccessStats, with random accesses answered from the runs."""
    first, run_scores = ArraySource(scores).read_score_runs()
    with source.snapshot():
        assert source.score_run_count() == len(first)
        got_first, got_scores = source.read_score_runs()
    assert got_first.tolist() == first.tolist() and got_scores.tolist() == run_scores.tolist()
    got = private_top_k(source, k=5, epsilon=1.0, method="threshold", seed=1)
    want = private_top_k(
        reference_like(source, scores), k=5, epsilon=1.0, method="threshold", seed=1
    )
    assert got.items == want.items and got.accesses == want.accesses
    assert got.accesses.rows_inferred > 0


class RefreshAfterTheRun:
    """A refresh started by a writer in the middle of a run, on a thread of its own.

    A PostgreSQL refresh swaps its new tables in only once no run reads the old ones (it waits
    for them: adapters/postgres/copy_mode.py `prepare()`), so a writer inside a run cannot
    finish it there.
    Truthy once the refresh has committed (it waits for the thread; the thread's error, if any,
    is raised), so `if visible:` after the run sees the refresh done."""

    def __init__(self, refresh: Callable[[], None]) -> None:
        import threading

        self.error: BaseException | None = None

        def target() -> None:
            try:
                refresh()
            except BaseException as error:
                self.error = error

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def __bool__(self) -> bool:
        self.thread.join(timeout=120)
        if self.thread.is_alive():
            raise TimeoutError("the refresh started during the run did not finish in 120 s")
        if self.error is not None:
            raise self.error
        return True


def plackett_luce(weights: np.ndarray, ranking: tuple[int, ...]) -> float:
    """P(`ranking`, best first) drawing without replacement, proportional to weights."""
    p, remaining = 1.0, weights.sum()
    for i in ranking:
        p *= weights[i] / remaining
        remaining -= weights[i]
    return p


def threshold_run(source: Any, k: int, epsilon: float, *, oracle: str = "lazy", **options: Any):
    """private_top_k with the threshold method (Algorithm 3) pinned, failing loudly unless the
    threshold algorithm ran with this oracle: a test about the threshold algorithm or an oracle
    must not test the one-shot mechanism the default planner (method="auto") may pick instead."""
    result = private_top_k(source, k, epsilon, method="threshold", oracle=oracle, **options)
    assert result.method == "threshold", f"the {result.method} mechanism ran, not the threshold"
    assert result.diagnostics.plan["oracle"] == oracle, result.diagnostics.plan
    return result


def assert_varies(sample: Sequence[float], what: str = "sample") -> None:
    """A statistical test of a quantity that cannot vary cannot fail: refuse a constant sample."""
    assert float(np.var(np.asarray(sample, dtype=np.float64))) > 0.0, f"{what} is constant"


def laplace_set_law(h: Sequence[float], k: int, scale: float) -> dict[tuple[int, ...], float]:
    """Exact law of the one-shot Laplace release (Algorithm 2: the set of the k largest of
    h + Z, Z i.i.d. Laplace(0, scale)), by quadrature: the set S wins when its smallest noisy
    score, item i at x, has the rest of S above x and every other item below it:
    P(S) = integral over x of sum_{i in S} f_i(x) prod_{j in S - i} S_j(x) prod_{l not in S} F_l(x).
    """
    from itertools import combinations

    from scipy import integrate

    h = [float(v) for v in h]

    def cdf(z: float) -> float:
        return 0.5 * math.exp(z / scale) if z < 0 else 1.0 - 0.5 * math.exp(-z / scale)

    def pdf(z: float) -> float:
        return 0.5 * math.exp(-abs(z) / scale) / scale

    def integrand(x: float, chosen: tuple[int, ...]) -> float:
        below = math.prod(cdf(x - h[o]) for o in range(len(h)) if o not in chosen)
        return below * sum(
            pdf(x - h[i]) * math.prod(1.0 - cdf(x - h[j]) for j in chosen if j != i) for i in chosen
        )

    span = (min(h) - 60 * scale, max(h) + 60 * scale)
    return {
        chosen: integrate.quad(integrand, *span, args=(chosen,), points=sorted(set(h)), limit=200)[
            0
        ]
        for chosen in combinations(range(len(h)), k)
    }


def assert_law_and_scale(
    observed: Sequence[float],
    law: Callable[[float], np.ndarray],
    scale: float,
    alpha: float = 1e-3,
) -> None:
    """The counts `observed` (cells covering every outcome) follow `law(scale)`, the cell
    probabilities of the release at noise scale `scale`: two tests at alpha / 2 each (at most
    alpha in all when the law holds, as far as the normal and chi-square approximations do:
    simulated sizes 0.0008-0.0018 at alpha = 1e-3 for the laws of this suite). Pearson's
    chi-square, against any departure; and the score test of the scale (the derivative of the
    log-likelihood in log(scale) at `scale`, over its standard deviation under the law,
    two-sided, normal), the locally most powerful test against a wrong scale: one degree of
    freedom where the chi-square spreads the same shift over every cell, so a scale off by a
    given fraction fails it at a fraction of the runs the chi-square needs. A law the scale
    does not move (all scores tied) has no score test: the chi-square alone, at alpha."""
    from scipy import stats

    observed = np.asarray(observed, dtype=np.float64)
    n = observed.sum()
    p = np.asarray(law(scale), dtype=np.float64)
    assert p.shape == observed.shape and abs(p.sum() - 1.0) < 1e-9, "cells must cover the law"
    h = 1e-4  # d log p / d log(scale), central differences
    g = (np.log(law(scale * math.exp(h))) - np.log(law(scale * math.exp(-h)))) / (2 * h)
    information = float(p @ (g * g))
    if information < 1e-12:
        assert stats.chisquare(observed, p * n).pvalue > alpha
        return
    z = float(observed @ g) / math.sqrt(n * information)
    assert 2 * stats.norm.sf(abs(z)) > alpha / 2, f"scale score z = {z:.2f}"
    assert stats.chisquare(observed, p * n).pvalue > alpha / 2


def histogram_key(scores: Any, ids: Any = None) -> str:
    """A digest naming one histogram (scores and ids, in input order)."""
    ids = None if ids is None else np.asarray(ids).tolist()
    return hashlib.sha1(repr((np.asarray(scores).tolist(), ids)).encode("utf-8")).hexdigest()


def shared_sources(maker: Iterator[Callable[..., Any]]) -> Iterator[Callable[[Any, Any], Any]]:
    """A store plugin's maker generator (it yields `make`, then cleans up) turned into one that
    builds one source per distinct histogram and serves it again on every later call: for the
    read-only tests of a session-scoped fixture. A test that writes must make its own."""
    make = next(maker)
    made: dict[str, Any] = {}

    def shared(scores: Any, ids: Any = None) -> Any:
        key = histogram_key(scores, ids)
        if key not in made:
            made[key] = make(scores, ids)
        return made[key]

    yield shared
    next(maker, None)  # the maker's cleanup
