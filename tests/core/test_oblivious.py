"""Oblivious releases (topk_middleware/mechanisms/oblivious.py) on every store.

What is checked: the depth is the hypergeometric bound (computed here from exact log-binomials,
not scipy.stats.hypergeom); the release has the one-shot law (Gumbel: Plackett-Luce exact
probabilities, chi-square; Laplace, k = 1: the exact law by numerical integration); the miss
rate is the hypergeometric tail (binomial test) and a miss still releases the one-shot answer;
every store serves the same numbers of rows and round trips for neighbouring tables; the
guarantee and its charge are (eps, delta + (1 + e^eps) delta_pad); bad arguments are refused
before anything is read or charged.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

import duckdb
import numpy as np
import pytest
from scipy import integrate, stats

from adapters.memory import ArraySource
from tests.helpers import plackett_luce
from tests.stores.test_duckdb_delta import pending
from topk_middleware import PrivacyBudget, private_top_k
from topk_middleware.access import StoreCosts, StoreTraits, parameters_in_text
from topk_middleware.accounting import BudgetExceeded, oblivious_cost
from topk_middleware.mechanisms.exponential import exponential_mechanism
from topk_middleware.mechanisms.oblivious import miss_probability, oblivious_depth


def log_binomial(n: int, r: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(r + 1) - math.lgamma(n - r + 1)


def tail_below(m: int, d: int, k: int) -> float:
    """P(Hypergeometric(m, d, d) < k) from its pmf C(d, j) C(m - d, d - j) / C(m, d)."""
    total = log_binomial(m, d)
    return sum(math.exp(log_binomial(d, j) + log_binomial(m - d, d - j) - total) for j in range(k))


class CountingSource:
    """ArraySource that counts the rows it served by kind (what a store observer would see)."""

    def __init__(self, inner: ArraySource) -> None:
        self.inner = inner
        self.log: list[tuple[str, int]] = []

    def traits(self) -> StoreTraits:
        return self.inner.traits()

    def domain_size(self) -> int:
        return self.inner.domain_size()

    def snapshot(self) -> Any:
        return self.inner.snapshot()

    def read_sorted(self, start: int, count: int) -> Any:
        rows = self.inner.read_sorted(start, count)
        self.log.append(("sorted", len(rows)))
        return rows

    def read_positions(self, positions: np.ndarray) -> Any:
        rows = self.inner.read_positions(positions)
        self.log.append(("positions", len(rows)))
        return rows

    def read_ids(self, ids: Any) -> np.ndarray:
        self.log.append(("ids", len(ids)))
        return self.inner.read_ids(ids)


def test_depth_is_the_hypergeometric_bound() -> None:
    """k = 10, delta_pad = 1e-9, m = 10^7: 20,414 (about 2 sqrt(mk) = 20,000, below Theorem
    4.2's expected-cost bound 2 (sqrt(mk) + sqrt(m/2)) = 24,472), the least depth whose tail is
    within delta_pad."""
    m, k, pad = 10**7, 10, 1e-9
    d = oblivious_depth(m, k, pad)
    assert d == 20_414
    assert tail_below(m, d, k) <= pad < tail_below(m, d - 1, k)
    assert d < 2 * (math.sqrt(m * k) + math.sqrt(m / 2))
    for m, k, pad in ((10**5, 1, 1e-6), (10**6, 20, 1e-9), (5_000, 3, 0.1)):
        d = oblivious_depth(m, k, pad)
        assert tail_below(m, d, k) <= pad < tail_below(m, d - 1, k)
        assert miss_probability(m, k, d) == pytest.approx(tail_below(m, d, k), rel=1e-6)


@pytest.mark.parametrize(
    ("m", "k", "d"),
    [
        (10**7, 10, 20_414),
        (10**7, 10, 20_413),
        (10**8, 10**5, 3_191_355),
        (10**10, 10, 646_046),
        (10**6, 1, 4_542),
        (100, 30, 60),  # 2d > m: the least overlap is 20
        (50, 20, 30),
        (1000, 5, 501),
        (10, 1, 3),
        (1000, 10, 5),  # d < k: a miss for sure
    ],
)
def test_miss_probability_is_scipys_hypergeometric_tail(m: int, k: int, d: int) -> None:
    """miss_probability (log1p products and the pmf's ratio, no scipy import in the release
    path) against scipy.stats.hypergeom.cdf(k - 1; m, d, d): relative 1e-9 up to m = 10^8
    (a term or a sign off, or the ratio's (m - 2d + x + 1) as (m - d + x + 1), fails it);
    5e-6 at m = 10^10, where scipy's own log-gamma differences lose digits."""
    expected = float(stats.hypergeom.cdf(k - 1, m, d, d))
    assert miss_probability(m, k, d) == pytest.approx(expected, rel=1e-9 if m <= 10**8 else 5e-6)


def test_depth_search_is_the_least_depth_by_scipy() -> None:
    """oblivious_depth (doubling, then bisection) is the least d with scipy's tail <= delta_pad:
    bisection over [k, m] with scipy.stats.hypergeom, for small and large m and k."""

    def least(m: int, k: int, pad: float) -> int:
        low, high = k, m
        while low < high:
            mid = (low + high) // 2
            low, high = (
                (low, mid)
                if stats.hypergeom.cdf(k - 1, m, mid, mid) <= pad
                else (
                    mid + 1,
                    high,
                )
            )
        return low

    for m, k, pad in ((10**7, 10, 1e-9), (10**9, 1000, 1e-12), (100, 50, 1e-6), (20, 5, 0.01)):
        assert oblivious_depth(m, k, pad) == least(m, k, pad)


def test_reads_are_fixed_by_public_facts_alone() -> None:
    """Neighbouring histograms (one client apart at the head, as 26 vs 27 in the issue) and
    different data families: the same reads (kind and size, in order), the same counts."""
    m, k = 20_000, 10
    rng = np.random.default_rng(5)
    zipf = np.minimum(rng.zipf(1.3, size=m), 10**6).astype(float)
    plateau = np.full(m, 3.0)
    plateau[:50] = 26.0
    neighbour = plateau.copy()
    neighbour[0] += 1.0
    distinct = rng.permutation(m).astype(float)
    d = oblivious_depth(m, k, 1e-9)
    logs = []
    for scores in (zipf, plateau, neighbour, distinct):
        for seed in (1, 2):
            source = CountingSource(ArraySource(scores))
            result = private_top_k(source, k, 1.0, oblivious=True, seed=seed)
            assert not result.plan["miss"]
            assert result.accesses.rows_fetched == 2 * d
            assert result.accesses.round_trips == 3
            assert len(set(result.items)) == k
            logs.append(source.log)
    assert all(log == [("sorted", d), ("positions", d)] for log in logs)


def test_gumbel_release_is_plackett_luce() -> None:
    """Ranked top-2 over m = 400 (2d < m: the fixed-depth path), chi-square against the exact
    Plackett-Luce law with weights exp(h / b) (Gumbel-max trick), 4,000 fixed-seed runs; misses
    are frequent here (delta_pad = 0.2) and must not change the law."""
    m, k, eps = 400, 2, 1.0
    scores = np.zeros(m)
    scores[:4] = [6.0, 5.0, 4.0, 3.0]
    source = ArraySource(scores)
    rng = np.random.default_rng(11)
    runs = 4_000
    got: Counter[tuple[int, ...]] = Counter()
    misses = 0
    for _ in range(runs):
        result = private_top_k(source, k, eps, oblivious=True, delta_pad=0.2, seed=rng, deadline=0)
        got[tuple(result.items)] += 1
        misses += result.plan["miss"]
        assert not result.plan["full_read"]
    scale = result.privacy.scale
    weights = np.exp(scores / scale)
    top = range(4)
    cells = [(a, b) for a in top for b in top if a != b]
    expected = [runs * plackett_luce(weights, c) for c in cells]
    observed = [got[c] for c in cells]
    expected.append(runs - sum(expected))
    observed.append(runs - sum(observed))
    assert stats.chisquare(observed, expected).pvalue > 1e-3
    assert misses > 0  # the miss path ran and kept the law


def test_laplace_release_is_the_one_shot_law() -> None:
    """k = 1 with Laplace(b): P(i wins) = integral of f(z - h_i) prod_{j != i} F(z - h_j) dz
    (numerical integration), chi-square over 3,000 fixed-seed oblivious runs."""
    m = 300
    scores = np.zeros(m)
    scores[:3] = [4.0, 3.0, 2.0]
    source = ArraySource(scores)
    first = private_top_k(source, 1, 1.0, noise="laplace", oblivious=True, delta_pad=0.1, seed=0)
    b = first.privacy.scale
    law = stats.laplace(scale=b)

    def win(i: int) -> float:
        others = np.delete(scores, i)
        levels, counts = np.unique(others, return_counts=True)

        def density(z: float) -> float:
            return law.pdf(z - scores[i]) * np.prod(law.cdf(z - levels) ** counts)

        return integrate.quad(density, -60 * b, 60 * b, points=[0, 2, 3, 4], limit=400)[0]

    exact = [win(i) for i in range(3)]
    runs = 3_000
    rng = np.random.default_rng(3)
    got = Counter(
        private_top_k(
            source, 1, 1.0, noise="laplace", oblivious=True, delta_pad=0.1, seed=rng, deadline=0
        ).items[0]
        for _ in range(runs)
    )
    observed = [got[i] for i in range(3)] + [runs - sum(got[i] for i in range(3))]
    expected = [runs * p for p in exact] + [runs * (1 - sum(exact))]
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_laplace_top_k_set_is_the_one_shot_law() -> None:
    """k = 2 with Laplace(b): the released set is {a, b} exactly when min(X_a, X_b) beats every
    other X_j = h_j + Z_j, so P({a, b}) = integral of [f_a(z) (1 - F_b(z)) + f_b(z) (1 - F_a(z))]
    prod_{j not in {a, b}} F_j(z) dz (numerical integration); chi-square over 3,000 fixed-seed
    oblivious runs (2d < m, misses frequent at delta_pad = 0.2), the release a set."""
    m, k = 300, 2
    scores = np.zeros(m)
    scores[:4] = [5.0, 4.0, 3.0, 2.0]
    source = ArraySource(scores)
    first = private_top_k(source, k, 1.0, noise="laplace", oblivious=True, delta_pad=0.2, seed=0)
    assert 2 * first.plan["depth"] < m and not first.plan["full_read"]
    law = stats.laplace(scale=first.privacy.scale)
    b_scale = first.privacy.scale

    def pair(a: int, b: int) -> float:
        others = np.delete(scores, [a, b])
        levels, counts = np.unique(others, return_counts=True)

        def density(z: float) -> float:
            tie = law.pdf(z - scores[a]) * law.sf(z - scores[b])
            tie += law.pdf(z - scores[b]) * law.sf(z - scores[a])
            return tie * np.prod(law.cdf(z - levels) ** counts)

        points = [0.0, 2.0, 3.0, 4.0, 5.0]
        return integrate.quad(density, -60 * b_scale, 60 * b_scale, points=points, limit=400)[0]

    cells = [(a, b) for a in range(4) for b in range(a + 1, 4)]
    exact = [pair(a, b) for a, b in cells]
    runs = 3_000
    rng = np.random.default_rng(13)
    got: Counter[frozenset[int]] = Counter()
    misses = 0
    for _ in range(runs):
        result = private_top_k(
            source, k, 1.0, noise="laplace", oblivious=True, delta_pad=0.2, seed=rng, deadline=0
        )
        assert result.items == sorted(result.items)  # a set: in id order, not by noisy value
        got[frozenset(result.items)] += 1
        misses += result.plan["miss"]
    observed = [got[frozenset(c)] for c in cells]
    expected = [runs * p for p in exact]
    observed.append(runs - sum(observed))
    expected.append(runs - sum(expected))
    assert stats.chisquare(observed, expected).pvalue > 1e-3
    assert misses > 0


@pytest.mark.parametrize("noise", ["gumbel", "laplace"])
def test_with_counts_are_the_released_items_counts_plus_discrete_laplace(noise: str) -> None:
    """Oblivious with_counts: each released count is floor(count) of the item it stands beside
    (in the release's order, a set's id order for Laplace) plus discrete Laplace noise of scale
    t = k / (share epsilon), whatever the depth path (fixed depth, miss, full read); the
    residuals of 1,500 runs (k = 3) against the exact pmf (chi-square). The counts are read
    exactly, by id, after the selection: k more random accesses in one more round trip, a
    shape fixed by k."""
    from topk_middleware.discrete_noise import discrete_laplace_pmf

    m, k, eps, share = 400, 3, 2.0, 0.5
    scores = np.floor(np.linspace(60.0, 0.0, m))
    by_id = dict(enumerate(scores.tolist()))
    source = ArraySource(scores)
    rng = np.random.default_rng(17)
    residuals: list[int] = []
    options = {"noise": noise, "oblivious": True, "delta_pad": 0.3, "deadline": 0}
    plain = private_top_k(source, k, eps, seed=0, **options)
    counted = private_top_k(source, k, eps, seed=0, with_counts=True, **options)
    assert not plain.plan["miss"] and not counted.plan["miss"]
    assert counted.accesses.sorted == plain.accesses.sorted
    assert counted.accesses.random == plain.accesses.random + k
    assert counted.accesses.rows_fetched == plain.accesses.rows_fetched + k
    assert counted.accesses.round_trips == plain.accesses.round_trips + 1
    for _ in range(1_500):
        result = private_top_k(
            source, k, eps, noise=noise, oblivious=True, delta_pad=0.3, seed=rng, deadline=0,
            with_counts=True, counts_share=share,
        )  # fmt: skip
        assert result.counts is not None and len(result.counts) == k
        if noise == "laplace":
            assert result.items == sorted(result.items)
        residuals += [
            c - math.floor(by_id[i]) for i, c in zip(result.items, result.counts, strict=True)
        ]
    t = k / (share * eps)
    values, seen = np.unique(residuals, return_counts=True)
    edge = 8
    pmf = discrete_laplace_pmf(np.arange(-edge, edge + 1), t)
    observed = [int(seen[values < -edge].sum())]
    observed += [int(seen[values == v].sum()) for v in range(-edge, edge + 1)]
    observed += [int(seen[values > edge].sum())]
    tail = (1.0 - pmf.sum()) / 2.0
    expected = len(residuals) * np.concatenate(([tail], pmf, [tail]))
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_miss_rate_is_the_hypergeometric_tail() -> None:
    """A large delta_pad makes misses frequent: their rate over 600 runs on each of two tables
    P(Hypergeom(m, d, d) < k) (two-sided binomial test), whatever the data, and a miss reads
    the whole table once (2d + m rows) and is flagged."""
    m, k, pad = 2_000, 5, 0.4
    d = oblivious_depth(m, k, pad)
    p = tail_below(m, d, k)
    rng = np.random.default_rng(7)
    for scores in (np.arange(m, dtype=float), np.full(m, 2.0)):
        source = ArraySource(scores)
        misses = 0
        runs = 600
        for _ in range(runs):
            result = private_top_k(
                source, k, 1.0, oblivious=True, delta_pad=pad, seed=rng, deadline=0
            )
            if result.plan["miss"]:
                misses += 1
                assert result.accesses.rows_fetched == 2 * d + m
            else:
                assert result.accesses.rows_fetched == 2 * d
        assert stats.binomtest(misses, runs, p).pvalue > 1e-3


def test_small_domains_read_everything() -> None:
    """When 2d >= m a full read (m rows, also fixed) replaces the two batches."""
    scores = np.arange(50, dtype=float)
    result = private_top_k(ArraySource(scores), 5, 1.0, oblivious=True, seed=1)
    assert result.plan["full_read"] and result.accesses.rows_fetched == 50


def test_guarantee_and_charge() -> None:
    """(eps, delta + (1 + e^eps) delta_pad), stated in the guarantee and charged to a budget
    before any row is read; the exponential mechanism (k = 1) too."""
    scores = np.arange(5_000, dtype=float)
    pad = 1e-7
    result = private_top_k(ArraySource(scores), 3, 0.5, 1e-6, oblivious=True, delta_pad=pad)
    assert result.privacy.epsilon <= 0.5
    base = private_top_k(ArraySource(scores), 3, 0.5, 1e-6, method="oneshot").privacy
    assert result.privacy.delta == pytest.approx(
        base.delta + (1 + math.exp(base.epsilon)) * pad, rel=1e-12
    )
    assert "delta_pad" in result.privacy.derivation
    cost = oblivious_cost("gumbel", 3, 5_000, 0.5, 0.0, delta_pad=pad)
    assert cost.epsilon == pytest.approx(0.5) and cost.delta == pytest.approx(
        (1 + math.exp(0.5)) * pad
    )
    budget = PrivacyBudget(0.5, (1 + math.exp(0.5)) * pad * 0.99)
    source = CountingSource(ArraySource(scores))
    with pytest.raises(BudgetExceeded):
        private_top_k(source, 3, 0.5, oblivious=True, delta_pad=pad, budget=budget)
    assert source.log == []
    one = exponential_mechanism(ArraySource(scores), 1.0, seed=4, oblivious=True)
    assert len(one.items) == 1 and one.plan["oblivious"]
    assert one.privacy.delta == pytest.approx((1 + math.e) * 1e-9)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"delta_pad": 0.0}, "delta_pad must be in (0, 1)"),
        ({"delta_pad": 1.0}, "delta_pad must be in (0, 1)"),
        ({"delta_pad": float("nan")}, "delta_pad must be in (0, 1)"),
        ({"delta_pad": "small"}, "delta_pad must be a number"),
        ({"delta_pad": True}, "delta_pad must be a number"),
        ({"oblivious": True, "method": "oneshot_in_store"}, "cannot run obliviously"),
        ({"oblivious": True, "method": "oneshot"}, "cannot run obliviously"),
        ({"oblivious": "yes"}, "oblivious must be True or False"),
    ],
)
def test_bad_arguments_are_refused_before_any_read(kwargs: dict, message: str) -> None:
    source = CountingSource(ArraySource(np.arange(100, dtype=float)))
    with pytest.raises(
        (ValueError, TypeError), match=message.replace("(", r"\(").replace(")", r"\)")
    ):
        private_top_k(source, 3, 1.0, **kwargs)
    assert source.log == []


def test_cost_aware_is_refused() -> None:
    from topk_middleware import CostModel

    source = CountingSource(ArraySource(np.arange(100, dtype=float)))
    with pytest.raises(ValueError, match="cannot run obliviously"):
        private_top_k(source, 3, 1.0, method="threshold", oblivious=True, costs=CostModel())
    assert source.log == []


def test_duckdb_copy_and_pending_delta_read_fixed_sizes() -> None:
    """DuckDB's rank-ordered copy and a copy with a pending delta (positions apart from ranks):
    the same rows and round trips for neighbouring tables, seeds and data."""
    counts = set()
    for seed in (1, 2):
        con = duckdb.connect()
        try:
            source = pending(con, 6_000, seed)
            for run_seed in (3, 4):
                result = private_top_k(source, 5, 1.0, oblivious=True, seed=run_seed)
                assert not result.plan["miss"] and not result.plan["full_read"]
                assert not source.positions_are_ranks
                d = oblivious_depth(result.m, 5, 1e-9)
                assert result.accesses.rows_fetched == 2 * d
                counts.add((result.m, result.accesses.rows_fetched, result.accesses.round_trips))
        finally:
            con.close()
    assert len(counts) == 1


def test_every_store_reads_the_same_for_neighbours(make_store: Any) -> None:
    """Every store of the conformance suite (memory, DuckDB, PostgreSQL copy and live, SQLite,
    MariaDB and DuckDB through SQLAlchemy, live SQLAlchemy tables): neighbouring tables (26 vs
    27 at the head over a tied plateau) read 2d rows and the top row in 4 round trips (the top
    row, two batches, m); MariaDB, whose driver writes parameters into the statement text, reads
    the whole table (m rows) in 3."""
    m, k = 3_000, 3
    low = np.full(m, 2.0)
    low[:20] = 20.0
    low[0] = 26.0
    high = low.copy()
    high[0] = 27.0
    d = oblivious_depth(m, k, 1e-9)
    assert 2 * d < m
    seen = set()
    for scores in (low, high):
        source = make_store(scores, None)
        for seed in (1, 2):
            result = private_top_k(source, k, 1.0, oblivious=True, seed=seed, deadline=0)
            assert not result.plan["miss"] and len(set(result.items)) == k
            seen.add((result.accesses.rows_fetched, result.accesses.round_trips))
    if parameters_in_text(source):  # MariaDB (pymysql): the whole table, no drawn position sent
        assert seen == {(m, 2)} and result.plan["full_read"]
    else:
        assert seen == {(2 * d, 3)}


def test_each_store_and_mode_has_its_own_deadline_model() -> None:
    """PostgreSQL copy, a copy read from the table itself, live tables, the SQL functions'
    SPI reads and DuckDB's copy (frozen) and table (by rowid slot) each give their own
    ObliviousCosts; a store without one gets a model from its StoreCosts. The deadline grows
    with the noisy counts of with_counts (k of them) and with m past what the store's cache
    holds."""
    import duckdb

    from adapters.dialects.postgres.costs import OBLIVIOUS_COSTS, STALE_OBLIVIOUS_COSTS
    from adapters.duckdb import OBLIVIOUS_COSTS_COPY, OBLIVIOUS_COSTS_LIVE, DuckDBTable
    from adapters.postgres.live import LIVE_OBLIVIOUS_COSTS, LivePostgresTable
    from frontends.plpython import SPI_OBLIVIOUS_COSTS, SPITable
    from topk_middleware.mechanisms.oblivious import (
        costs_from_store,
        oblivious_deadline,
        source_oblivious_costs,
    )

    models = {OBLIVIOUS_COSTS, STALE_OBLIVIOUS_COSTS, LIVE_OBLIVIOUS_COSTS, SPI_OBLIVIOUS_COSTS}
    models |= {OBLIVIOUS_COSTS_COPY, OBLIVIOUS_COSTS_LIVE}
    assert len(models) == 6
    assert LivePostgresTable.oblivious_costs is LIVE_OBLIVIOUS_COSTS
    assert SPITable.oblivious_costs is SPI_OBLIVIOUS_COSTS
    con = duckdb.connect()
    con.execute("CREATE TABLE h AS SELECT range AS id, range AS score FROM range(10)")
    assert source_oblivious_costs(DuckDBTable(con, "h", frozen=True)) is OBLIVIOUS_COSTS_COPY
    assert source_oblivious_costs(DuckDBTable(con, "h")) is OBLIVIOUS_COSTS_LIVE
    source = ArraySource(np.arange(100.0))  # no model, no StoreCosts: the generic guess
    assert source_oblivious_costs(source) == costs_from_store(StoreCosts())
    m, d = 10**7, oblivious_depth(10**7, 10, 1e-9)
    for costs in models:
        plain = oblivious_deadline(costs, m, d)
        assert oblivious_deadline(costs, m, d, counts=10) > plain
        assert plain > oblivious_deadline(costs, 10**6, oblivious_depth(10**6, 10, 1e-9))
    # a copy not proven current scans the table in both batches: far dearer
    assert oblivious_deadline(STALE_OBLIVIOUS_COSTS, m, d) > 10 * oblivious_deadline(
        OBLIVIOUS_COSTS, m, d
    )


def test_an_overrun_is_logged_for_the_operator(tmp_path: Any) -> None:
    """A deadline shorter than the work: the release returns when the work ends, says so in its
    diagnostics (deadline_missed, work_seconds) and in the process count, and a ledger's log of
    the release keeps the depth, the deadline, the work's time and the overrun; a release
    within its deadline is padded to it and logged as such."""
    from topk_middleware import PrivacyLedger
    from topk_middleware.mechanisms.oblivious import deadline_misses

    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    budget = ledger.budget("ana", 10.0, 1e-3)
    source = ArraySource(np.arange(20_000, dtype=float))
    before = deadline_misses()
    late = private_top_k(source, 5, 1.0, oblivious=True, deadline=1e-6, budget=budget)
    assert late.plan["deadline_missed"] and late.plan["work_seconds"] > 1e-6
    after = deadline_misses()
    assert after["missed"] == before["missed"] + 1
    assert after["worst_overrun"] >= late.plan["work_seconds"] - 1e-6 - 1e-9
    padded = private_top_k(source, 5, 1.0, oblivious=True, deadline=0.3, budget=budget)
    assert not padded.plan["deadline_missed"] and padded.timings["total"] >= 0.3
    log = [json.loads(row["diagnostics"])["oblivious"] for row in ledger.log("ana")]
    assert [entry["deadline_missed"] for entry in log] == [True, False]
    assert log[0]["deadline"] == 1e-6 and log[1]["deadline"] == 0.3
    assert log[0]["depth"] == oblivious_depth(20_000, 5, 1e-9)
    assert log[0]["work_seconds"] == pytest.approx(late.plan["work_seconds"])
    assert log[1]["miss"] is False and log[1]["full_read"] is False


def test_the_release_path_imports_no_scipy() -> None:
    """A fresh process that loads the SQL functions' server side (frontends.plpython) and runs
    releases (auto, oblivious, Laplace, with noisy counts) never imports scipy: scipy.stats costs
    half a second of CPU in each process that imports it, each PostgreSQL session of the SQL
    functions included (miss_probability's docstring). Fails if a module of the release path
    imports scipy at its top again."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, numpy as np\n"
        "import frontends.plpython\n"
        "from adapters.memory import ArraySource\n"
        "from topk_middleware import private_top_k\n"
        "s = ArraySource(np.arange(5000.0))\n"
        "for options in ({}, {'oblivious': True}, {'noise': 'laplace'}, {'with_counts': True}):\n"
        "    assert len(private_top_k(s, 5, 1.0, seed=1, **options).items) == 5\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
