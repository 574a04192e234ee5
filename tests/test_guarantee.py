"""The guarantee states what it assumes: declared sensitivity scales the noise,
counts from raw votes with bounded contributions, noisy counts from an exact sampler, and scores
the noise cannot resolve refused.

Neighbours throughout: add/remove one client. Independent values: the unit calibrations are
k/epsilon (Gumbel, Fact 3.3 pure) and 2k/epsilon (Laplace, Fact 3.2 pure); the discrete Laplace
law is (1 - q)/(1 + q) q^|z|, q = e^(-1/t) (Canonne, Kamath & Steinke 2020); dp-accounting's PLD
of the discrete Laplace mechanism gives the counts' epsilon.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Any

import duckdb
import numpy as np
import psycopg
import pytest
import sqlalchemy as sa
from psycopg import sql
from scipy import stats

from adapters.duckdb import DuckDBTable
from adapters.memory import ArraySource
from adapters.postgres import PostgresTable
from adapters.sqlalchemy import SQLAlchemyTable
from topk_middleware import (
    BudgetExceeded,
    PrivacyBudget,
    joint_top_k,
    limited_domain_top_k,
    peeling_top_k,
    private_top_k,
    stable_top_k,
)
from topk_middleware.accounting import oneshot_cost
from topk_middleware.discrete_noise import (
    discrete_laplace,
    discrete_laplace_half_width,
    discrete_laplace_pmf,
)
from topk_middleware.noisy_counts import CountsPlan
from topk_middleware.privacy import calibrate
from topk_middleware.release import release_dict

# ----- raw votes: one fixed log, counted independently in numpy --------------------------------
RNG = np.random.default_rng(2026)
N_ITEMS, N_CLIENTS, N_ROWS = 40, 60, 900
VOTES = np.stack(
    [RNG.integers(0, N_CLIENTS, N_ROWS), RNG.zipf(1.6, N_ROWS) % N_ITEMS], axis=1
).astype(np.int64)
WEIGHTS = np.round(RNG.exponential(2.0, N_ROWS), 3)


def reference_counts(max_per_item: float, weighted: bool) -> np.ndarray:
    """sum over clients of min(the client's rows (or weights) for the item, max_per_item)."""
    per_pair: dict[tuple[int, int], float] = {}
    for (c, i), w in zip(VOTES.tolist(), WEIGHTS.tolist(), strict=True):
        per_pair[(c, i)] = per_pair.get((c, i), 0.0) + (w if weighted else 1.0)
    counts = np.zeros(N_ITEMS)
    for (_, i), total in per_pair.items():
        counts[i] += min(total, max_per_item)
    return counts


def client_items() -> dict[int, set[int]]:
    items: dict[int, set[int]] = {}
    for c, i in VOTES.tolist():
        items.setdefault(c, set()).add(i)
    return items


def table_counts(source: Any) -> np.ndarray:
    with source.snapshot():
        rows = source.read_sorted(0, N_ITEMS)
    counts = np.zeros(N_ITEMS)
    counts[np.asarray(rows.ids, dtype=np.int64)] = rows.scores
    return counts


@pytest.fixture(scope="module")
def duck() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("CREATE TABLE items AS SELECT range AS id FROM range(?)", [N_ITEMS])
    con.execute("CREATE TABLE votes (client BIGINT, item BIGINT, w DOUBLE)")
    con.executemany(
        "INSERT INTO votes VALUES (?, ?, ?)",
        [(c, i, w) for (c, i), w in zip(VOTES.tolist(), WEIGHTS.tolist(), strict=True)],
    )
    return con


@pytest.fixture(scope="module")
def pg(pg_conninfo: str, pg_schema: str) -> Iterator[tuple[str, str]]:
    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        s = sql.Identifier(pg_schema)
        conn.execute(sql.SQL("CREATE TABLE {}.items (id bigint)").format(s))
        conn.execute(
            sql.SQL("INSERT INTO {}.items SELECT generate_series(0, %s - 1)").format(s), [N_ITEMS]
        )
        conn.execute(
            sql.SQL("CREATE TABLE {}.votes (client bigint, item bigint, w float8)").format(s)
        )
        with conn.cursor() as cur:
            cur.executemany(
                sql.SQL("INSERT INTO {}.votes VALUES (%s, %s, %s)").format(s),
                [(c, i, w) for (c, i), w in zip(VOTES.tolist(), WEIGHTS.tolist(), strict=True)],
            )
    yield pg_conninfo, pg_schema


def sa_votes(engine: sa.Engine, suffix: str) -> tuple[str, str]:
    votes, items = f"sem_votes_{suffix}", f"sem_items_{suffix}"
    meta = sa.MetaData()
    t_items = sa.Table(
        items, meta, sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False)
    )
    t_votes = sa.Table(
        votes,
        meta,
        sa.Column("client", sa.BigInteger),
        sa.Column("item", sa.BigInteger),
        sa.Column("w", sa.Double),  # 8 bytes on every dialect (MariaDB FLOAT is 4)
    )
    meta.drop_all(engine)
    meta.create_all(engine)
    with engine.begin() as conn:
        conn.execute(t_items.insert(), [{"id": i} for i in range(N_ITEMS)])
        conn.execute(
            t_votes.insert(),
            [
                {"client": c, "item": i, "w": w}
                for (c, i), w in zip(VOTES.tolist(), WEIGHTS.tolist(), strict=True)
            ],
        )
    return votes, items


def from_votes_on(store: str, request: pytest.FixtureRequest) -> Callable[..., Any]:
    """(**bounds) -> the counts source from_votes builds on that store."""
    if store == "duckdb":
        con = request.getfixturevalue("duck")
        return lambda **kw: DuckDBTable.from_votes(con, "votes", "items", replace=True, **kw)
    if store == "postgres":
        dsn, schema = request.getfixturevalue("pg")
        return lambda **kw: PostgresTable.from_votes(
            dsn, "votes", "items", schema=schema, replace=True, **kw
        )
    engine = request.getfixturevalue(f"sqlalchemy_{store.split('-')[1]}_engine")
    votes, items = sa_votes(engine, uuid.uuid4().hex[:6])

    def make(**kw: Any) -> Any:
        source = SQLAlchemyTable.from_votes(
            engine, votes, items, rank_table=f"sem_r_{uuid.uuid4().hex[:8]}", **kw
        )
        source.prepare()
        return source

    return make


STORES = ["duckdb", "postgres", "sqlalchemy-sqlite", "sqlalchemy-postgres", "sqlalchemy-mariadb"]


# ----- 1. sensitivity --------------------------------------------------------------------------
@pytest.mark.parametrize("noise,unit", [("gumbel", 1.0), ("laplace", 2.0)])
@pytest.mark.parametrize("sensitivity", [1, 2.5, 5])
def test_calibration_scales_with_sensitivity(noise: str, unit: float, sensitivity: float) -> None:
    """Pure calibrations: scale = D * unit * k / epsilon (privacy.py), computed here by hand;
    the approximate Gumbel one (delta > 0): D times the unit-sensitivity scale, same epsilon."""
    k, eps = 7, 0.8
    g = calibrate(noise, k, 1000, eps, 0.0, sensitivity=sensitivity)
    assert g.scale == pytest.approx(sensitivity * unit * k / eps, rel=1e-12)
    assert g.sensitivity == sensitivity and g.epsilon == pytest.approx(eps)
    assert f"at most {sensitivity:g}" in g.derivation
    approx_unit = calibrate("gumbel", k, 1000, eps, 1e-6)
    approx = calibrate("gumbel", k, 1000, eps, 1e-6, sensitivity=sensitivity)
    assert approx.scale == pytest.approx(sensitivity * approx_unit.scale, rel=1e-12)
    assert approx.epsilon == approx_unit.epsilon and approx.delta == approx_unit.delta
    cost = oneshot_cost(noise, k, 1000, eps, 0.0, sensitivity=sensitivity)
    assert cost.epsilon == pytest.approx(eps)  # the charge does not change with D


def test_sensitivity_changes_the_output_law_as_predicted() -> None:
    """Exponential mechanism on (0, 5): P(item 1) = e^(5 eps / D) / (1 + e^(5 eps / D))
    (Gumbel-max: Plackett-Luce with weights exp(h / scale)); chi-square over 4000 seeded runs."""
    runs, eps = 4000, 0.4
    for sensitivity in (1, 5):
        source = ArraySource([0.0, 5.0], sensitivity=sensitivity)
        wins = sum(
            private_top_k(source, 1, eps, method="oneshot_full_read", seed=s).items[0] == 1
            for s in range(runs)
        )
        p = 1.0 / (1.0 + math.exp(-5.0 * eps / sensitivity))
        assert stats.binomtest(wins, runs, p).pvalue > 1e-3


@pytest.mark.parametrize("store", STORES)
def test_max_per_item_5_names_5_with_5_times_the_scale(
    store: str, request: pytest.FixtureRequest
) -> None:
    """The issue's target, on every store: the guarantee names 5, the scale is 5x."""
    make = from_votes_on(store, request)
    one, five = make(), make(max_per_item=5)
    assert one.sensitivity == 1 and five.sensitivity == 5
    r1 = private_top_k(one, 3, 1.0, seed=1)
    r5 = private_top_k(five, 3, 1.0, seed=1)
    assert r5.privacy.sensitivity == 5 and r1.privacy.sensitivity == 1
    assert "each client changes each count by at most 5" in r5.privacy.derivation
    assert "each client changes each count by at most 1" in r1.privacy.derivation
    assert r5.privacy.scale == pytest.approx(5 * r1.privacy.scale, rel=1e-12)
    assert release_dict(r5.release())["guarantee"]["sensitivity"] == 5


def test_sensitivity_is_declared_on_every_source_and_refused_when_bad() -> None:
    assert ArraySource([1.0, 2.0], sensitivity=3).sensitivity == 3
    for bad in (0, -1, math.inf, math.nan, True, "2"):
        with pytest.raises((TypeError, ValueError), match="sensitivity must be"):
            ArraySource([1.0, 2.0], sensitivity=bad)


@pytest.mark.parametrize(
    "run",
    [
        lambda s, b: peeling_top_k(s, 2, 1.0, budget=b),
        lambda s, b: joint_top_k(s, 2, 1.0, budget=b),
        lambda s, b: limited_domain_top_k(s, 2, 5, 1.0, 1e-6, budget=b),
        lambda s, b: stable_top_k(s, 0.5, 1e-6, k=2, budget=b),
    ],
)
def test_unit_step_mechanisms_refuse_other_sensitivities(run: Callable[..., Any]) -> None:
    budget = PrivacyBudget(epsilon=100.0, delta=0.1)
    with pytest.raises(ValueError, match="declares sensitivity 2"):
        run(ArraySource(np.arange(50.0), sensitivity=2), budget)
    assert budget.releases == []
    run(ArraySource(np.arange(50.0)), budget)  # unit sensitivity: served


# ----- 2. bounded contributions ----------------------------------------------------------------
@pytest.mark.parametrize("store", STORES)
def test_from_votes_clips_each_clients_contribution(
    store: str, request: pytest.FixtureRequest
) -> None:
    make = from_votes_on(store, request)
    distinct = np.zeros(N_ITEMS)
    for c_items in client_items().values():
        for i in c_items:
            distinct[i] += 1
    assert table_counts(make()).tolist() == distinct.tolist()  # COUNT(DISTINCT client)
    assert table_counts(make(max_per_item=3)).tolist() == reference_counts(3, False).tolist()
    weighted = make(weight="w", max_per_item=2.5)
    assert weighted.sensitivity == 2.5
    np.testing.assert_allclose(table_counts(weighted), reference_counts(2.5, True), rtol=1e-9)


@pytest.mark.parametrize(
    "store", ["duckdb", "postgres", "sqlalchemy-postgres", "sqlalchemy-mariadb"]
)
def test_max_items_per_client_keeps_a_data_independent_subset(
    store: str, request: pytest.FixtureRequest
) -> None:
    """With L = 2: every count is at most the unlimited one, the total is exactly what keeping
    min(L, its items) per client gives, and two builds (fresh keys) keep different subsets."""
    make = from_votes_on(store, request)
    full = reference_counts(3, False)
    limited = [table_counts(make(max_per_item=3, max_items_per_client=2)) for _ in range(4)]
    per_pair: dict[tuple[int, int], int] = {}
    for c, i in VOTES.tolist():
        per_pair[(c, i)] = per_pair.get((c, i), 0) + 1
    for counts in limited:
        assert (counts <= full).all()
        # each client keeps exactly min(2, its items): the number of kept (client, item) pairs
        # is not visible in the sums, but the sums are bounded by the two largest per client
        bound = sum(
            sum(sorted((min(per_pair[(c, i)], 3) for i in items), reverse=True)[:2])
            for c, items in client_items().items()
        )
        assert counts.sum() <= bound
        assert counts.sum() >= sum(min(2, len(items)) for items in client_items().values())
    assert len({tuple(c) for c in limited}) > 1  # the key is fresh each time


def test_the_hash_key_never_appears_in_statement_text(
    sqlalchemy_postgres_engine: sa.Engine,
) -> None:
    votes, items = sa_votes(sqlalchemy_postgres_engine, uuid.uuid4().hex[:6])
    statements: list[str] = []
    params: list[Any] = []

    def seen(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        statements.append(statement)
        params.append(parameters)

    sa.event.listen(sqlalchemy_postgres_engine, "before_cursor_execute", seen)
    try:
        source = SQLAlchemyTable.from_votes(
            sqlalchemy_postgres_engine,
            votes,
            items,
            max_items_per_client=1,
            rank_table=f"sem_r_{uuid.uuid4().hex[:8]}",
        )
        source.prepare()
    finally:
        sa.event.remove(sqlalchemy_postgres_engine, "before_cursor_execute", seen)
    keys = [
        v for p in params if isinstance(p, dict) for n, v in p.items() if "contribution_key" in n
    ]
    assert keys and all(len(k) == 64 for k in keys)
    assert not any(k in s for k in keys for s in statements)


def test_bad_bounds_are_refused_before_anything_is_written(duck: duckdb.DuckDBPyConnection) -> None:
    for kwargs, words in (
        ({"max_per_item": 0}, "max_per_item must be finite and > 0"),
        ({"max_per_item": 1.5}, "whole number"),
        ({"max_items_per_client": 0}, "max_items_per_client must be >= 1"),
        ({"max_items_per_client": 1.5}, "positive integer"),
    ):
        with pytest.raises((TypeError, ValueError), match=words):
            DuckDBTable.from_votes(duck, "votes", "items", into="never", **kwargs)
    duck.execute("CREATE OR REPLACE TABLE bad_votes AS SELECT * FROM votes")
    duck.execute("INSERT INTO bad_votes VALUES (1, 1, -2.0)")
    with pytest.raises(ValueError, match="negative, NaN or infinite weight"):
        DuckDBTable.from_votes(duck, "bad_votes", "items", into="never", weight="w", max_per_item=2)
    assert (
        duck.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'never'").fetchone()[
            0
        ]
        == 0
    )


# ----- 3. noisy counts -------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [Fraction(3), Fraction(7, 3), Fraction(1, 2)])
def test_discrete_laplace_law_is_exact(scale: Fraction) -> None:
    """Chi-square of 20,000 seeded draws against (1 - q)/(1 + q) q^|z|; the tail beyond |z| > 6t
    pooled in one cell."""
    rng = np.random.default_rng(11)
    draws = np.array([discrete_laplace(rng, scale) for _ in range(20_000)])
    cut = int(6 * scale)
    support = np.arange(-cut, cut + 1)
    observed = np.array([(draws == z).sum() for z in support] + [(np.abs(draws) > cut).sum()])
    pmf = discrete_laplace_pmf(support, float(scale))
    expected = np.append(pmf, 1.0 - pmf.sum()) * len(draws)
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_half_width_is_the_least_95_percent_interval() -> None:
    for t in (0.3, 1.0, 4.0, 20.0, 137.5):
        w = discrete_laplace_half_width(t)
        inside = discrete_laplace_pmf(np.arange(-w, w + 1), t).sum()
        assert inside >= 0.95
        if w > 0:
            assert discrete_laplace_pmf(np.arange(-w + 1, w), t).sum() < 0.95


def test_counts_fall_in_their_95_percent_interval_at_the_stated_rate() -> None:
    """600 releases of 5 counts: the rate of |noisy - true| <= count_error is the exact coverage
    of the interval (binomial test), and within sampling error (3 sd) of 95%."""
    scores = np.floor(1e4 / np.arange(1, 201))
    source = ArraySource(scores)
    hits = total = 0
    for seed in range(600):
        r = private_top_k(source, 5, 2.0, seed=seed, with_counts=True)
        assert r.counts is not None and len(r.counts) == 5
        assert all(isinstance(c, int) for c in r.counts)
        true = scores[np.asarray(r.items)]
        hits += int(np.sum(np.abs(np.asarray(r.counts) - true) <= r.count_error))
        total += 5
    plan = CountsPlan.make(5, 1.0, 1.0)
    coverage = discrete_laplace_pmf(np.arange(-plan.half_width, plan.half_width + 1), 5.0).sum()
    assert r.count_error == plan.half_width
    assert stats.binomtest(hits, total, coverage).pvalue > 1e-3
    assert abs(hits / total - 0.95) < 3 * math.sqrt(0.95 * 0.05 / total) + (coverage - 0.95)


def test_counts_accounting_matches_dp_accounting_and_is_charged_once() -> None:
    """epsilon = selection + counts (basic composition); the counts' part against dp-accounting's
    PLD of k discrete Laplace mechanisms (parameter 1/t, sensitivity ceil(D))."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    k, eps, share, sensitivity = 4, 1.2, 0.25, 3
    source = ArraySource(np.floor(1e5 / np.arange(1, 101)), sensitivity=sensitivity)
    budget = PrivacyBudget(epsilon=eps)
    r = private_top_k(source, k, eps, seed=3, with_counts=True, counts_share=share, budget=budget)
    assert len(budget.releases) == 1 and budget.spent().epsilon == pytest.approx(eps)
    assert r.privacy.epsilon == pytest.approx(eps) and r.privacy.counts_epsilon == eps * share
    t = r.privacy.counts_scale
    assert t == pytest.approx(k * sensitivity / (eps * share))
    assert r.privacy.scale == pytest.approx(sensitivity * k / (eps * (1 - share)))
    one = pld.from_discrete_laplace_mechanism(
        1.0 / t, sensitivity=sensitivity, value_discretization_interval=1e-6
    )
    composed = one.self_compose(k)
    assert composed.get_epsilon_for_delta(1e-12) == pytest.approx(eps * share, rel=1e-4)
    with pytest.raises(BudgetExceeded):
        private_top_k(source, k, 0.1, with_counts=True, budget=budget)
    assert r.accesses.random >= k  # the counts were read by random access on the winners


def test_counts_are_carried_by_arrow_and_json() -> None:
    r = private_top_k(ArraySource(np.arange(100.0)), 3, 1.0, seed=2, with_counts=True)
    table = r.to_arrow()
    assert table.column_names == ["position", "item", "count"]
    assert table.column("count").to_pylist() == list(r.counts)
    assert int(table.schema.metadata[b"topk.count_error"]) == r.count_error
    d = release_dict(r.release())
    assert d["counts"] == list(r.counts) and d["count_error"] == r.count_error


@pytest.mark.parametrize("share", [0, 1, -0.1, math.nan, "0.5", True])
def test_bad_counts_share_is_refused(share: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="counts_share must be"):
        private_top_k(ArraySource(np.arange(10.0)), 2, 1.0, with_counts=True, counts_share=share)


# ----- 4. resolution ---------------------------------------------------------------------------
class Counting(ArraySource):
    """An ArraySource that counts the rows it serves."""

    rows = 0

    def read_sorted(self, start: int, count: int) -> Any:
        out = super().read_sorted(start, count)
        self.rows += len(out)
        return out

    def read_positions(self, positions: Any) -> Any:
        out = super().read_positions(positions)
        self.rows += len(out)
        return out


@pytest.mark.parametrize(
    "scores,epsilon",
    [
        ([1e300] * 1000, 1.0),
        ([2.0**60 + 256 * j for j in range(1000)], 1.0),
        ([1e15] * 500 + [1e15 - 1] * 500, 1000.0),
    ],
)
@pytest.mark.parametrize("method", ["auto", "threshold", "oneshot", "oneshot_full_read"])
def test_scores_the_noise_cannot_resolve_are_refused(
    scores: list[float], epsilon: float, method: str
) -> None:
    """Refused on every method, nothing charged, at most the top row read (the stated read)."""
    source = Counting(scores)
    budget = PrivacyBudget(epsilon=2000.0)
    with pytest.raises(ValueError, match="beyond what a double resolves"):
        private_top_k(source, 10, epsilon, method=method, budget=budget)
    assert budget.releases == [] and source.rows <= 1


def test_resolvable_large_counts_are_served() -> None:
    """2^40 + 256 j at epsilon 1, k = 10: the noise scale 10 spans 2^10 ulps (ulp 2^-12)."""
    scores = [2.0**40 + 256 * j for j in range(1000)]
    r = private_top_k(ArraySource(scores), 10, 1.0, seed=0)
    assert len(r.items) == 10


def test_exhausted_budget_refuses_before_reading_a_row() -> None:
    budget = PrivacyBudget(epsilon=1.0)
    private_top_k(ArraySource(np.arange(10.0)), 1, 1.0, budget=budget)
    source = Counting(np.arange(10.0))
    with pytest.raises(BudgetExceeded):
        private_top_k(source, 1, 1.0, budget=budget)
    assert source.rows == 0
