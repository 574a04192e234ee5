"""The guarantee states what it assumes: declared sensitivity scales the noise,
counts from raw votes with bounded contributions, noisy counts from an exact sampler, and scores
the noise cannot resolve refused.

Neighbours throughout: add/remove one client. Independent values: the unit calibrations are
k/epsilon (Gumbel, Fact 3.3 pure) and 2k/epsilon (Laplace, Fact 3.2 pure); the discrete Laplace
law is (1 - q)/(1 + q) q^|z|, q = e^(-1/t) (Canonne, Kamath & Steinke 2020); dp-accounting's PLD
of the discrete Laplace mechanism gives the counts' epsilon.
"""

from __future__ import annotations

import json
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
from tests.helpers import assert_law_and_scale
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
from topk_middleware.privacy import SensitivityError, calibrate
from topk_middleware.release import release_dict

# ----- raw votes: one fixed log, counted independently in numpy --------------------------------
RNG = np.random.default_rng(2026)
N_ITEMS, N_CLIENTS, N_ROWS = 40, 60, 900
VOTES = np.stack(
    [RNG.integers(0, N_CLIENTS, N_ROWS), RNG.zipf(1.6, N_ROWS) % N_ITEMS], axis=1
).astype(np.int64)
WEIGHTS = np.round(RNG.exponential(2.0, N_ROWS), 3)


def reference_counts(max_per_item: float, weighted: bool) -> np.ndarray:
    """sum over clients of min(the client's rows (or weights) for the item, max_per_item);
    weighted: each clipped contribution rounded down to a multiple of 2^-20 and summed exactly
    (Fractions), as adapters/contributions.py promises."""
    per_pair: dict[tuple[int, int], float] = {}
    for (c, i), w in zip(VOTES.tolist(), WEIGHTS.tolist(), strict=True):
        per_pair[(c, i)] = per_pair.get((c, i), 0.0) + (w if weighted else 1.0)
    counts = [Fraction(0)] * N_ITEMS
    for (_, i), total in per_pair.items():
        clipped = Fraction(min(total, max_per_item))
        counts[i] += math.floor(clipped * 2**20) / Fraction(2**20) if weighted else clipped
    return np.array([float(c) for c in counts])


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
    with psycopg.connect(pg_conninfo, autocommit=True) as conn:  # a worker may come back to it
        for name in ("items", "votes"):
            conn.execute(
                sql.SQL("DROP TABLE IF EXISTS {}.{} CASCADE").format(
                    sql.Identifier(pg_schema), sql.Identifier(name)
                )
            )


# What the SQLAlchemy tests made on their servers: dropped at the end of the module.
MADE_TABLES: list[tuple[sa.Engine, str]] = []
MADE_SOURCES: list[Any] = []


@pytest.fixture(scope="module", autouse=True)
def _drop_what_was_made() -> Iterator[None]:
    yield
    for source in MADE_SOURCES:
        source.uninstall()  # its rank and runs tables, its fingerprint row
    for engine, name in MADE_TABLES:
        with engine.begin() as conn:
            sa.Table(name, sa.MetaData()).drop(conn, checkfirst=True)
    MADE_SOURCES.clear()
    MADE_TABLES.clear()


def sa_votes(engine: sa.Engine, suffix: str) -> tuple[str, str]:
    votes, items = f"sem_votes_{suffix}", f"sem_items_{suffix}"
    MADE_TABLES.extend([(engine, votes), (engine, items)])
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
        MADE_SOURCES.append(source)
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
    kept = set()
    for oblivious in (False, True):  # the oblivious guarantee keeps the source's sensitivity
        options = {"oblivious": oblivious}
        r1 = private_top_k(one, 3, 1.0, seed=1, **options)
        r5 = private_top_k(five, 3, 1.0, seed=1, **options)
        assert r5.privacy.sensitivity == 5 and r1.privacy.sensitivity == 1
        assert r5.privacy.per_item_epsilon == pytest.approx(r1.privacy.per_item_epsilon)
        assert "each client changes each count by at most 5" in r5.privacy.derivation
        assert "each client changes each count by at most 1" in r1.privacy.derivation
        assert r5.privacy.scale == pytest.approx(5 * r1.privacy.scale, rel=1e-12)
        assert release_dict(r5.release())["guarantee"]["sensitivity"] == 5
        assert ("oblivious access" in r5.privacy.derivation) is oblivious
        p = r5.privacy  # every field but delta and the derivation is the calibration's
        kept.add((p.epsilon, p.noise, p.scale, p.sensitivity, p.score_bound, p.counts_scale))
    assert len(kept) == 1


def reopen(store: str, built: Any, request: pytest.FixtureRequest, **declared: Any) -> Any:
    """The table from_votes built, opened again as a plain table by name (no bounds passed)."""
    if store == "duckdb":
        return DuckDBTable(request.getfixturevalue("duck"), "votes_counts", **declared)
    if store == "postgres":
        dsn, schema = request.getfixturevalue("pg")
        return PostgresTable(dsn, "votes_counts", schema=schema, **declared)
    # SQLAlchemy's from_votes keeps its counts in the rank table prepare() fills
    engine = request.getfixturevalue(f"sqlalchemy_{store.split('-')[1]}_engine")
    opened = SQLAlchemyTable(
        engine,
        built.rank_table_name,
        id="id",
        score="score",
        rank_table=f"sem_o_{uuid.uuid4().hex[:8]}",
        **declared,
    )
    MADE_SOURCES.append(opened)
    opened.prepare()
    return opened


@pytest.mark.parametrize("store", STORES)
def test_from_votes_tables_keep_their_sensitivity_when_opened_again(
    store: str, request: pytest.FixtureRequest
) -> None:
    """The bounds from_votes used are recorded with the table: opened again by name (as the CLI
    and install-sql do) it keeps sensitivity 5 and, where built with one, the item bound; the
    release's noise is 5 unit scales; a declaration below the record is refused before anything
    is read, one above it is used."""
    make = from_votes_on(store, request)
    limit = None if store == "sqlalchemy-sqlite" else 3  # SQLite has no hash for the limit
    built = make(max_per_item=5, max_items_per_client=limit)
    opened = reopen(store, built, request)
    assert (opened.sensitivity, opened.max_items_per_client) == (5, limit)
    r = private_top_k(opened, 3, 1.0, method="oneshot_full_read", seed=1)
    assert r.privacy.sensitivity == 5 and r.privacy.scale == pytest.approx(5 * 3 / 1.0)
    assert "each client changes each count by at most 5" in r.privacy.derivation
    with pytest.raises(SensitivityError, match=r"records sensitivity 5 .* and 1 was declared"):
        reopen(store, built, request, sensitivity=1)
    assert reopen(store, built, request, sensitivity=7).sensitivity == 7
    if limit is not None:
        with pytest.raises(SensitivityError, match="keeps at most 3 items"):
            reopen(store, built, request, max_items_per_client=2)
    plain = make()  # max_per_item = 1 is recorded too: a declaration of 2 is honoured
    assert reopen(store, plain, request).sensitivity == 1
    assert reopen(store, plain, request, sensitivity=2).sensitivity == 2


def test_a_table_without_record_takes_the_declaration(duck: duckdb.DuckDBPyConnection) -> None:
    duck.execute(
        "CREATE OR REPLACE TABLE plain_counts AS SELECT range AS id, range AS score FROM range(20)"
    )
    assert DuckDBTable(duck, "plain_counts").sensitivity == 1
    assert DuckDBTable(duck, "plain_counts", sensitivity=0.5).sensitivity == 0.5
    with pytest.raises(ValueError, match="sensitivity must be finite and > 0"):
        DuckDBTable(duck, "plain_counts", sensitivity=-1)


def test_the_cli_and_its_json_keep_the_recorded_sensitivity(tmp_path: Any) -> None:
    """A DuckDB file whose counts from_votes built with max_per_item=5: `release` without
    --sensitivity states 5 and uses 5 unit scales; --sensitivity 1 is refused in one line."""
    from tests.frontends.test_cli import run_process

    path = tmp_path / "votes.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE items AS SELECT range AS id FROM range(?)", [N_ITEMS])
        con.execute("CREATE TABLE votes (client BIGINT, item BIGINT)")
        con.executemany("INSERT INTO votes VALUES (?, ?)", VOTES.tolist())
        DuckDBTable.from_votes(con, "votes", "items", max_per_item=5).prepare()
    base = ["release", path, "--table", "votes_counts", "--k", 3, "--epsilon", 1.0]
    done = run_process([*base, "--adaptive", "--method", "oneshot_full_read", "--json"])
    assert done.returncode == 0, done.stderr
    guarantee = json.loads(done.stdout)["guarantee"]
    assert guarantee["sensitivity"] == 5 and guarantee["scale"] == pytest.approx(15.0)
    done = run_process([*base, "--explain"])  # the oblivious default's derivation
    assert done.returncode == 0, done.stderr
    assert "assumes each client changes each count by at most 5" in done.stdout
    assert "delta_pad" in done.stdout
    done = run_process([*base, "--sensitivity", 1])
    assert done.returncode != 0 and "records sensitivity 5" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


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
    assert table_counts(weighted).tolist() == reference_counts(2.5, True).tolist()  # exact


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
        MADE_SOURCES.append(source)
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
    """10,000 seeded draws against (1 - q)/(1 + q) q^|z|, the tail beyond |z| > 6t pooled in
    one cell: Pearson's chi-square and the score test of the scale at 5e-4 each
    (tests.helpers.assert_law_and_scale). A scale 10% off fails with probability 1.0, 5% off
    0.93 or more at every scale here (simulated, 40,000 samples of 10,000; the chi-square alone
    of 20,000 draws: 0.9999 or more, and 0.87, 0.92 and 0.999)."""
    rng = np.random.default_rng(11)
    draws = np.array([discrete_laplace(rng, scale) for _ in range(10_000)])
    cut = int(6 * scale)
    support = np.arange(-cut, cut + 1)
    observed = np.array([(draws == z).sum() for z in support] + [(np.abs(draws) > cut).sum()])

    def law(t: float) -> np.ndarray:
        pmf = discrete_laplace_pmf(support, t)
        return np.append(pmf, 1.0 - pmf.sum())

    assert_law_and_scale(observed, law, float(scale))


def test_half_width_is_the_least_95_percent_interval() -> None:
    for t in (0.3, 1.0, 4.0, 20.0, 137.5):
        w = discrete_laplace_half_width(t)
        inside = discrete_laplace_pmf(np.arange(-w, w + 1), t).sum()
        assert inside >= 0.95
        if w > 0:
            assert discrete_laplace_pmf(np.arange(-w + 1, w), t).sum() < 0.95


def test_counts_fall_in_their_95_percent_interval_at_the_stated_rate() -> None:
    """600 releases of 5 integer counts: count_error is w, and the rate of |noisy - true| <= w
    is the exact coverage P(|Z| <= w) of the discrete Laplace law (binomial test), within
    sampling error (3 sd) of 95%."""
    scores = np.floor(1e4 / np.arange(1, 201)).astype(np.int64)
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


@pytest.mark.parametrize("t", [0.5, 3.0])
def test_fractional_counts_are_covered_by_their_interval(t: float) -> None:
    """Weighted (fractional) counts: released as round(count) + Z with count_error w + 1, so
    the interval holds for the count itself. Each count's coverage P(|round(c) + Z - c| <= w + 1)
    is computed here from the exact law, and the hits over 800 releases of 5 counts match their
    sum (normal approximation of the Poisson-binomial, 4 sd), and are at least 95% (3 se).
    The interval floor(count) +/- w would cover about 86.5% at t = 0.5."""
    k, share = 5, 0.5
    epsilon = k / (share * t)  # counts scale t = k ceil(D) / (s epsilon), D = 1
    fractions = np.random.default_rng(3).random(200)
    scores = np.floor(1e4 / np.arange(1, 201)) + fractions
    source = ArraySource(scores)
    plan = CountsPlan.make(k, epsilon * share, 1.0, integer_counts=False)
    assert float(plan.scale) == pytest.approx(t)
    support = np.arange(-60 * int(t + 1), 60 * int(t + 1) + 1)
    pmf = discrete_laplace_pmf(support, t)
    hits, expected, variance, total, old_hits = 0, 0.0, 0.0, 0, 0
    for seed in range(800):
        r = private_top_k(source, k, epsilon, seed=seed, with_counts=True, counts_share=share)
        assert r.count_error == plan.half_width + 1
        true = scores[np.asarray(r.items)]
        for released, c in zip(r.counts, true, strict=True):
            hits += abs(released - c) <= r.count_error
            rounded = math.floor(c + 0.5)
            p = float(pmf[np.abs(rounded + support - c) <= r.count_error].sum())
            expected, variance = expected + p, variance + p * (1 - p)
            old_hits += abs(released - (rounded - math.floor(c)) - c) <= plan.half_width
            total += 1
    assert abs(hits - expected) < 4 * math.sqrt(variance)
    assert hits / total >= 0.95 - 3 * math.sqrt(0.95 * 0.05 / total)
    if t == 0.5:  # the interval floor(count) + Z +/- w falls short of 95%
        assert old_hits / total < 0.93


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


@pytest.mark.parametrize("limit", [1, 2, 3, 8])
def test_counts_noise_scales_with_min_k_l(limit: int) -> None:
    """A source whose clients each count in at most L items: the k counts move in at most
    min(k, L) places, by ceil(D) each, so the scale is min(k, L) ceil(D) / (s eps). Checked
    against dp-accounting: min(k, L) discrete Laplace mechanisms (parameter 1/t, sensitivity
    ceil(D)) composed give s eps; the charged zCDP is the selection's plus min(k, L) times
    (s eps / min(k, L))^2 / 2."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    from topk_middleware.accounting import pure_dp_zcdp

    k, eps, share, sensitivity = 5, 2.0, 0.5, 2.5
    scores = np.floor(1e5 / np.arange(1, 101))
    source = ArraySource(scores, sensitivity=sensitivity, max_items_per_client=limit)
    budget = PrivacyBudget(epsilon=10.0, delta=1e-6)
    r = private_top_k(source, k, eps, seed=1, with_counts=True, counts_share=share, budget=budget)
    changed = min(k, limit)
    t = r.privacy.counts_scale
    assert t == pytest.approx(changed * 3 / (eps * share))  # ceil(2.5) = 3
    one = pld.from_discrete_laplace_mechanism(
        1.0 / t, sensitivity=3, value_discretization_interval=1e-6
    )
    composed = one.self_compose(changed) if changed > 1 else one
    assert composed.get_epsilon_for_delta(1e-12) == pytest.approx(eps * share, rel=1e-4)
    selection = oneshot_cost("gumbel", k, 100, eps * (1 - share), 0.0, sensitivity=sensitivity)
    charged = budget.releases[0]
    assert charged.rho == pytest.approx(
        selection.rho + changed * pure_dp_zcdp(eps * share / changed), rel=1e-12
    )
    unbounded = private_top_k(
        ArraySource(scores, sensitivity=sensitivity), k, eps, seed=1, with_counts=True
    )
    assert unbounded.privacy.counts_scale == pytest.approx(k * 3 / (eps * share))


def test_from_votes_item_bound_lowers_the_counts_noise(duck: duckdb.DuckDBPyConnection) -> None:
    """A from_votes table built with max_items_per_client = 2 (recorded with it): opened again,
    its counts are noised for 2 counts' worth, not k."""
    DuckDBTable.from_votes(
        duck, "votes", "items", replace=True, max_per_item=3, max_items_per_client=2
    )
    source = DuckDBTable(duck, "votes_counts")
    r = private_top_k(source, 4, 2.0, method="oneshot_full_read", seed=2, with_counts=True)
    assert r.privacy.counts_scale == pytest.approx(2 * 3 / 1.0)
    assert r.count_error == CountsPlan.make(4, 1.0, 3, 2).half_width  # BIGINT counts: w


def test_counts_are_carried_by_arrow_and_json() -> None:
    """Arrow and JSON carry the counts, their interval and the guarantee with its sensitivity,
    score bound and the counts' share and scale."""
    source = ArraySource(np.arange(100.0), sensitivity=3)
    r = private_top_k(source, 3, 1.0, seed=2, with_counts=True, oblivious=True)
    table = r.to_arrow()
    assert table.column_names == ["position", "item", "count"]
    assert table.column("count").to_pylist() == list(r.counts)
    assert int(table.schema.metadata[b"topk.count_error"]) == r.count_error
    d = release_dict(r.release())
    assert d["counts"] == list(r.counts) and d["count_error"] == r.count_error
    for guarantee in (json.loads(table.schema.metadata[b"topk.guarantee"]), d["guarantee"]):
        assert guarantee["sensitivity"] == 3 and guarantee["counts_epsilon"] == 0.5
        assert guarantee["counts_scale"] == pytest.approx(3 * 3 / 0.5)
        assert guarantee["score_bound"] == r.privacy.score_bound
        assert "assumes each client changes each count by at most 3" in guarantee["derivation"]


@pytest.mark.parametrize("share", [0, 1, -0.1, math.nan, "0.5", True])
def test_bad_counts_share_is_refused(share: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="counts_share must be"):
        private_top_k(ArraySource(np.arange(10.0)), 2, 1.0, with_counts=True, counts_share=share)


# ----- 4. counts read exactly ------------------------------------------------------------------
BIG = 2**55 + 5  # a double holds 2^55 + 8 (or 2^55): a count read as a double is 3 off


def big_counts_source(store: str, request: pytest.FixtureRequest, top: int) -> Any:
    """50 items: item 0 counts `top`, item j counts j, in an integer column of the store."""
    values = [top, *range(1, 50)]
    if store == "memory":
        return ArraySource(np.array(values, dtype=np.int64))
    if store.startswith("duckdb"):
        kind = store.split("-")[1].upper()
        con = duckdb.connect()
        con.execute(f"CREATE TABLE big (id BIGINT, score {kind})")
        con.executemany("INSERT INTO big VALUES (?, ?)", list(enumerate(values)))
        source = DuckDBTable(con, "big")
        source.prepare()
        return source
    if store.startswith("postgres"):
        dsn, schema = request.getfixturevalue("pg")
        name = f"big_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(dsn, autocommit=True) as conn:
            table = sql.Identifier(schema, name)
            conn.execute(sql.SQL("CREATE TABLE {} (id bigint, score bigint)").format(table))
            with conn.cursor() as cur:
                cur.executemany(
                    sql.SQL("INSERT INTO {} VALUES (%s, %s)").format(table), list(enumerate(values))
                )
        source = PostgresTable(dsn, name, schema=schema, mode=store.split("-")[1])
        source.prepare()
        return source
    engine = request.getfixturevalue(f"sqlalchemy_{store.split('-')[-1]}_engine")
    name = f"sem_big_{uuid.uuid4().hex[:8]}"
    MADE_TABLES.append((engine, name))
    table = sa.Table(
        name,
        sa.MetaData(),
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("score", sa.BigInteger),
    )
    with engine.begin() as conn:
        table.create(conn)
        conn.execute(table.insert(), [{"id": i, "score": v} for i, v in enumerate(values)])
    mode = "live" if "-live-" in store else "copy"
    source = SQLAlchemyTable(engine, name, rank_table=f"sem_r_{uuid.uuid4().hex[:8]}", mode=mode)
    MADE_SOURCES.append(source)
    source.prepare()
    return source


@pytest.mark.parametrize(
    "store",
    [
        "memory",
        "duckdb-bigint",
        "duckdb-hugeint",
        "postgres-copy",
        "postgres-live",
        "sqlalchemy-postgres",
        "sqlalchemy-mariadb",
        "sqlalchemy-live-postgres",
    ],
)
@pytest.mark.parametrize("oblivious", [False, True])
def test_counts_above_2_53_are_released_exactly(
    store: str, oblivious: bool, request: pytest.FixtureRequest
) -> None:
    """A true count of 2^55 + 5 in an integer column is noised as 2^55 + 5 (its noise here is
    0: scale 1/1000), never as the double 2^55 + 8; count_error is w (an integer column). The
    selection reads it as the score bound (2^32 at this scale) and still picks it."""
    source = big_counts_source(store, request, BIG)
    r = private_top_k(source, 1, 2000.0, seed=4, with_counts=True, oblivious=oblivious)
    assert r.items == [0] and r.counts == (BIG,)
    assert r.count_error == 0 and r.privacy.counts_scale == pytest.approx(1e-3)
    assert float(BIG) != BIG  # the fault this guards against


def test_counts_beyond_2_62_are_released_as_the_bound() -> None:
    """A HUGEINT count of 2^70 + 5 is released about 2^62 (stated: min(round(count), 2^62)), a
    value every store's signed 64-bit column (the SQL function's bigint, Arrow's int64) holds."""
    con = duckdb.connect()
    con.execute("CREATE TABLE huge (id BIGINT, score HUGEINT)")
    con.executemany("INSERT INTO huge VALUES (?, ?)", [(0, 2**70 + 5), (1, 3), (2, 1)])
    source = DuckDBTable(con, "huge")
    source.prepare()
    r = private_top_k(source, 1, 2000.0, seed=4, with_counts=True)
    assert r.counts == (2**62,) and "2^62" in r.privacy.derivation
    assert r.to_arrow().column("count").to_pylist() == [2**62]


# ----- 5. timing of the counts' sampler --------------------------------------------------------
class Logged(ArraySource):
    """An ArraySource that logs its reads in a shared list."""

    log: list[str]

    def read_sorted(self, start: int, count: int) -> Any:
        self.log.append("read")
        return super().read_sorted(start, count)

    def read_positions(self, positions: Any) -> Any:
        self.log.append("read")
        return super().read_positions(positions)

    def read_exact_scores(self, ids: Any) -> list[Any]:
        self.log.append("read")
        return super().read_exact_scores(ids)


@pytest.mark.parametrize("oblivious", [False, True])
def test_the_counts_noise_is_drawn_after_the_charge_and_before_any_read(
    oblivious: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exact sampler's time grows with |Z|: its k draws come after the charge and before
    the first row is read (in an oblivious release: inside the padded window, whose deadline
    adds counts_seconds(k))."""
    import topk_middleware.noisy_counts as noisy_counts

    log: list[str] = []
    draw = noisy_counts.discrete_laplace
    monkeypatch.setattr(
        noisy_counts, "discrete_laplace", lambda rng, scale: log.append("draw") or draw(rng, scale)
    )

    class Budget(PrivacyBudget):
        def charge(self, cost: Any) -> None:
            log.append("charge")
            super().charge(cost)

    source = Logged(np.arange(500, dtype=np.int64))
    source.log = log
    k = 4
    options = {"oblivious": oblivious, "deadline": None}
    budget = Budget(epsilon=10.0, delta=1e-3)
    with_counts = private_top_k(source, k, 2.0, seed=1, with_counts=True, budget=budget, **options)
    assert log[0] == "charge" and log[1 : k + 1] == ["draw"] * k
    assert "draw" not in log[k + 1 :] and "read" in log[k + 1 :]
    if oblivious:
        plain = private_top_k(
            ArraySource(np.arange(500, dtype=np.int64)), k, 2.0, seed=1, **options
        )
        from topk_middleware.mechanisms.oblivious import (
            oblivious_deadline,
            source_oblivious_costs,
        )

        costs = source_oblivious_costs(source)
        d = plain.plan["depth"]
        read = oblivious_deadline(costs, 500, d, k) - oblivious_deadline(costs, 500, d)
        extra = with_counts.plan["deadline"] - plain.plan["deadline"]
        assert read > 0  # reading the k exact counts
        assert extra == pytest.approx(noisy_counts.counts_seconds(k) + read)


def test_noisy_counts_beyond_their_cap_are_refused_before_the_charge() -> None:
    """k > COUNTS_MAX_K with counts: refused in the project's words, nothing charged; at the cap
    the oblivious deadline adds counts_seconds(k) = 0.05 + k / 1000 s (4.05 s at 4,000)."""
    from topk_middleware import noisy_counts

    budget = PrivacyBudget(100.0, 0.5)
    source = ArraySource(np.arange(5000, dtype=np.int64))
    cap = noisy_counts.COUNTS_MAX_K
    with pytest.raises(ValueError, match=f"with_counts releases at most {cap} counts"):
        private_top_k(source, cap + 1, 10.0, with_counts=True, budget=budget)
    assert budget.releases == []
    assert noisy_counts.counts_seconds(cap) == pytest.approx(0.05 + cap * 1e-3)
    got = private_top_k(source, 10, 10.0, with_counts=True, budget=budget, seed=1)
    assert len(got.counts) == 10 and len(budget.releases) == 1
