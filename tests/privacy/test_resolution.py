"""Scores a double cannot resolve against the noise, and exact ties (privacy.score_bound).

Every mechanism reads min(score, B), B a public power of two (at most 2^53) whose ulp is at most
1/1024 of the noise scale and of the sensitivity: a release on data beyond B is the release on
the clamped data, stated in the guarantee, never a refusal (a refusal would be a bit about the
data outside the guarantee). Exact ties of score + noise, frequent near B, follow the one-shot's
rule (smaller position first) in every method: seeded releases are identical across them.

Independent values: B is computed here from its definition (the largest power of two whose ulp
times 1024 is at most min(scale, D), capped at 2^53); the reference releases run on the clamped
histogram built here with numpy.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import numpy as np
import psycopg
import pytest

from adapters.memory import ArraySource
from topk_middleware import (
    BudgetExceeded,
    PrivacyBudget,
    joint_top_k,
    limited_domain_top_k,
    peeling_top_k,
    private_top_k,
)
from topk_middleware.mechanisms.oblivious import oblivious_depth
from topk_middleware.mechanisms.pay_what_you_get import PayWhatYouGet
from topk_middleware.noise import make_noise
from topk_middleware.randomness import make_rng


def bound_for(scale: float, sensitivity: float = 1.0) -> float:
    """B by its definition, searched over the powers of two (not privacy.score_bound's frexp)."""
    best = 0.0
    for e in range(-1074, 54):
        b = 2.0**e
        if math.ulp(b) * 1024 <= min(scale, sensitivity):
            best = b
    return best


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


# Data beyond the bound, each in id order = score order (so that the clamped reference, whose
# ties are ordered by id, gives every item the same position): k = 10.
M = 1000
BEYOND = [
    ("1e300 plateau", np.full(M, 1e300), 1.0),
    ("2^60 + 256 j", 2.0**60 + 256.0 * np.arange(M - 1, -1, -1), 1.0),
    ("1e15 at epsilon 1000", np.r_[np.full(500, 1e15), np.full(500, 1e15 - 1)], 1000.0),
]
METHODS: list[dict[str, Any]] = [
    {"method": "auto", "oracle": "eager"},  # either choice: the full read's noise vector
    {"method": "threshold"},
    {"method": "threshold", "oracle": "eager"},
    {"method": "oneshot"},
    {"method": "oneshot_full_read"},
    {"method": "auto", "oblivious": True, "delta": 1e-6},
    {"method": "oneshot_full_read", "oblivious": True, "delta": 1e-6},
]


def test_the_bound_is_its_definition() -> None:
    from topk_middleware.privacy import score_bound

    for scale in (1e-300, 1e-3, 0.37, 1.0, 3.0, 10.0, 4e290):
        for sensitivity in (0.25, 1.0, 5.0, 1e6):
            assert score_bound(scale, sensitivity) == bound_for(scale, sensitivity)
    assert score_bound(1e6, 1e6) == 2.0**53  # the cap: every integer below is a double


@pytest.mark.parametrize("name,scores,epsilon", BEYOND, ids=[b[0] for b in BEYOND])
@pytest.mark.parametrize("options", METHODS, ids=lambda o: "-".join(map(str, o.values())))
def test_scores_beyond_the_bound_are_released_as_the_bound(
    name: str, scores: np.ndarray, epsilon: float, options: dict[str, Any]
) -> None:
    """Served (nothing refused), charged once, nothing read before the charge (an exhausted
    budget reads no row), the guarantee names B, and each seeded release is the release on
    min(scores, B). Without the clamp the plateaus' values round back to the score and the
    release would be items 0..9 (the smallest positions) every time."""
    k = 10
    scale = k / epsilon
    bound = bound_for(scale)
    clamped = ArraySource(np.minimum(scores, bound))
    source = Counting(scores)
    releases = set()
    for seed in range(4):
        # (an oblivious release at epsilon 1000 has delta 1: no budget holds it)
        vacuous = options.get("oblivious") and epsilon > 100
        # room for one release, not two: pure composition, or two deltas that do not fit
        room = 1.5e-6 if options.get("oblivious") else 0.0
        budget = None if vacuous else PrivacyBudget(epsilon=epsilon, delta=room)
        got = private_top_k(source, k, epsilon, seed=seed, budget=budget, **options)
        want = private_top_k(clamped, k, epsilon, seed=seed, **options)
        assert got.items == want.items and len(set(got.items)) == k
        assert got.privacy.score_bound == bound and f"scores above {bound:.17g}" in (
            got.privacy.derivation
        )
        releases.add(tuple(got.items))
        if budget is None:
            continue
        assert len(budget.releases) == 1
        before = source.rows
        with pytest.raises(BudgetExceeded):
            private_top_k(source, k, epsilon, seed=seed, budget=budget, **options)
        assert source.rows == before  # refused before any row was read
    assert len(releases) > 1  # the noise decides, not rounding


@pytest.mark.parametrize("store", ["duckdb", "postgres", "sqlalchemy-sqlite"])
def test_the_in_store_one_shot_clamps_too(request: pytest.FixtureRequest, store: str) -> None:
    """The store computes min(score, B) + keyed noise in SQL: its seeded release on 2^60 + 256 j
    is its release on the clamped table (same positions, same key), and varies with the seed
    (unclamped, item 0, 256 above the next, would win every time)."""
    make = request.getfixturevalue(f"make_{store.replace('-', '_')}_source")
    m, k, epsilon = 400, 3, 3.0
    scores = 2.0**60 + 256.0 * np.arange(m - 1, -1, -1)
    bound = bound_for(k / epsilon)
    raw, clamped = make(scores, None), make(np.minimum(scores, bound), None)
    firsts = set()
    for seed in range(4):
        got = private_top_k(raw, k, epsilon, method="oneshot_in_store", seed=seed)
        want = private_top_k(clamped, k, epsilon, method="oneshot_in_store", seed=seed)
        assert got.diagnostics.plan["in_store"] and got.items == want.items
        firsts.add(got.items[0])
    assert len(firsts) > 1


def eager_values(scores: np.ndarray, k: int, epsilon: float, seed: int) -> np.ndarray:
    """min(h, B) + Z with the noise vector a seeded full read (and the eager oracle) draws."""
    scale = k / epsilon
    noises = make_noise("gumbel", scale).sample(make_rng(seed), len(scores))
    return np.minimum(scores, bound_for(scale)) + noises


@pytest.mark.parametrize(
    "scores",
    [np.full(1000, 1e300), 2.0**60 + 256.0 * np.arange(1000), np.full(100, 1e300)],
    ids=["1e300 plateau", "2^60 + 256 j", "small plateau"],
)
def test_exact_ties_follow_the_one_shot_rule_in_every_method(scores: np.ndarray) -> None:
    """At the bound (scale 1 = the sensitivity: the doubles near B are 1/1024 of a noise scale
    apart) values of min(h, B) + Z tie often. The threshold run (eager oracle: the full read's
    noise vector), auto with it, the one-shot, the full read and the oblivious full read (and,
    on 100 items, oblivious auto, whose depth covers the table) release the same items for
    every seed. TA's own stopping rule (>= tau) stops before an unseen item that ties the k-th
    best with a smaller position, and fails this test on a few seeds."""
    m, k = len(scores), 40
    epsilon = float(k)  # scale 1
    methods: list[dict[str, Any]] = [
        {"method": "threshold", "oracle": "eager"},
        {"method": "auto", "oracle": "eager"},
        {"method": "oneshot"},
        {"method": "oneshot_full_read", "oblivious": True},
    ]
    if 2 * oblivious_depth(m, k, 1e-9) >= m:
        methods.append({"method": "auto", "oblivious": True})
    source = ArraySource(scores)
    ties = 0
    for seed in range(150):
        want = private_top_k(source, k, epsilon, method="oneshot_full_read", seed=seed).items
        for options in methods:
            got = private_top_k(source, k, epsilon, seed=seed, **options).items
            assert got == want, (seed, options)
        values = np.sort(eager_values(scores, k, epsilon, seed))[::-1]
        ties += int(np.any(values[: k + 1][1:] == values[: k + 1][:-1]))
    assert ties >= 10  # the data does exercise exact ties at the top


def test_limited_domain_and_pay_what_you_get_are_shift_invariant_below_the_bound() -> None:
    """Durfee-Rogers Algorithm 1 on 16 j and on S + 16 j: for S = 2^20 (far below B = 2^42 at
    epsilon 1) the seeded releases are identical; for S = 2^56 the counts are read as B, and
    the release is the one on the all-B table (no silent change of law: the guarantee names
    B), which differs from the 16 j one."""
    m, k, k_bar, epsilon, delta = 60, 3, 8, 1.0, 1e-6
    ladder = 16.0 * np.arange(m - 1, -1, -1)  # id order = score order
    bound = bound_for(1.0 / epsilon)
    assert bound == 2.0**42
    differs = 0
    for seed in range(40):
        base = limited_domain_top_k(ArraySource(ladder), k, k_bar, epsilon, delta, seed=seed)
        near = limited_domain_top_k(
            ArraySource(2.0**20 + ladder), k, k_bar, epsilon, delta, seed=seed
        )
        far = limited_domain_top_k(
            ArraySource(2.0**56 + ladder), k, k_bar, epsilon, delta, seed=seed
        )
        flat = limited_domain_top_k(
            ArraySource(np.full(m, bound)), k, k_bar, epsilon, delta, seed=seed
        )
        assert (near.items, near.bottom) == (base.items, base.bottom)
        assert (far.items, far.bottom) == (flat.items, flat.bottom)
        assert far.privacy.score_bound == bound and "scores above" in far.privacy.derivation
        differs += (far.items, far.bottom) != (base.items, base.bottom)
    assert differs > 20
    session = PayWhatYouGet(k_star=6, l_star=2, epsilon=epsilon, delta=delta)
    far = session.top_k(ArraySource(2.0**56 + ladder), k, k_bar, seed=5)
    flat = limited_domain_top_k(ArraySource(np.full(m, bound)), k, k_bar, epsilon, delta, seed=5)
    assert (far.items, far.bottom) == (flat.items, flat.bottom)
    near = session.top_k(ArraySource(2.0**20 + ladder), k, k_bar, seed=6)
    base = limited_domain_top_k(ArraySource(ladder), k, k_bar, epsilon, delta, seed=6)
    assert (near.items, near.bottom) == (base.items, base.bottom)


def test_resolvable_large_counts_are_released_unchanged() -> None:
    """2^40 + 256 j at epsilon 1, k = 10 (B = 2^42): below the bound nothing is clamped, and the
    release is the one on 256 j (shift invariance of the one-shot law; same noise)."""
    ladder = 256.0 * np.arange(999, -1, -1)
    for seed in range(5):
        got = private_top_k(ArraySource(2.0**40 + ladder), 10, 1.0, seed=seed).items
        assert got == private_top_k(ArraySource(ladder), 10, 1.0, seed=seed).items


def test_peeling_and_the_joint_mechanism_read_the_bound_too() -> None:
    """Peeling (weights exp(eps h / k)) and the joint mechanism on 2^60 + 256 j: their seeded
    releases are those on the all-B table, and the guarantee names B. Unclamped, 256 j alone
    (25.6 logits apart at eps / k = 0.1) would decide peeling's order."""
    m, k, epsilon = 60, 3, 0.3
    scores = 2.0**60 + 256.0 * np.arange(m - 1, -1, -1)
    differ = 0
    for seed in range(6):
        peeled = peeling_top_k(ArraySource(scores), k, epsilon, seed=seed)
        bound = bound_for(k / epsilon)
        flat = peeling_top_k(ArraySource(np.full(m, bound)), k, epsilon, seed=seed)
        assert peeled.items == flat.items and peeled.privacy.score_bound == bound
        differ += peeled.items != [0, 1, 2]
        joint = joint_top_k(ArraySource(scores), k, epsilon, seed=seed)
        bound = bound_for(1.0 / epsilon)
        assert (
            joint.items == joint_top_k(ArraySource(np.full(m, bound)), k, epsilon, seed=seed).items
        )
        assert "scores above" in joint.privacy.derivation
    assert differ > 3


@pytest.mark.parametrize("store", ["postgres", "sqlalchemy-sqlite", "sqlalchemy-postgres"])
def test_a_table_read_around_a_stale_copy_clamps_too(
    request: pytest.FixtureRequest, pg_conninfo: str, pg_schema: str, store: str
) -> None:
    """A copy no longer proven current (a write since prepare()) is read around: the in-store
    one-shot runs on the table itself (adapters/*/table_read.py), which must read
    min(score, B) + noise too. On 2^60 + 256 j at scale 1 the unclamped values are 256 noise
    scales apart and item 0 would win every seed; clamped, they tie at B and the noise decides."""
    import sqlalchemy as sa
    from psycopg import sql

    from adapters.postgres import PostgresTable
    from adapters.sqlalchemy import SQLAlchemyTable

    m, k, epsilon = 400, 3, 3.0
    scores = [2**60 + 256 * j for j in range(m - 1, -1, -1)]
    name = f"clamp_{uuid.uuid4().hex[:8]}"
    if store == "postgres":
        ident = sql.Identifier(pg_schema, name)
        writer = psycopg.connect(pg_conninfo, autocommit=True)
        writer.execute(
            sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, score bigint)").format(ident)
        )
        with writer.cursor() as cur:
            cur.executemany(
                sql.SQL("INSERT INTO {} VALUES (%s, %s)").format(ident), list(enumerate(scores))
            )
        source: Any = PostgresTable(pg_conninfo, name, schema=pg_schema)

        def write() -> None:
            writer.execute(sql.SQL("UPDATE {} SET score = score WHERE id = 7").format(ident))

        def drop() -> None:
            writer.execute(sql.SQL("DROP TABLE {}").format(ident))
            writer.close()
    else:
        engine: sa.Engine = request.getfixturevalue(
            f"sqlalchemy_{store.removeprefix('sqlalchemy-')}_engine"
        )
        with engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE TABLE {name} (id BIGINT PRIMARY KEY, score BIGINT)")
            table = sa.table(name, sa.column("id"), sa.column("score"))
            conn.execute(table.insert(), [{"id": i, "score": s} for i, s in enumerate(scores)])
        source = SQLAlchemyTable(engine, name)

        def write() -> None:
            with engine.begin() as conn:
                conn.exec_driver_sql(f"UPDATE {name} SET score = score WHERE id = 7")

        def drop() -> None:
            with engine.begin() as conn:
                conn.exec_driver_sql(f"DROP TABLE {name}")

    try:
        source.prepare()
        write()  # the copy is no longer proven current
        firsts = set()
        for seed in range(6):
            got = private_top_k(source, k, epsilon, method="oneshot", seed=seed)
            assert got.plan["in_store"] and got.plan["freshness"]["read"] == "table"
            assert got.privacy.score_bound == bound_for(k / epsilon)
            firsts.add(got.items[0])
        assert len(firsts) > 1
    finally:
        source.uninstall()
        drop()
