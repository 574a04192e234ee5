"""`from_votes(max_items_per_client=L)` keeps each client's own random L items, so bounded counts
stay proportional to the true ones (adapters/contributions.py, docs/guarantee.md).

The events: 4,000 clients, 40 draws each from a Zipf(1.1) law over 500 items (fixed seed). A
client with n_c distinct items keeps a uniformly random L-subset of them (the keyed hash names
the client and the item), so item j's bounded count has expectation E_j = sum over its clients of
min(1, L / n_c) and variance V_j = sum of min(1, L/n_c)(1 - min(1, L/n_c)) (independent clients),
both computed here from the events. Target: each of the true top-10 (by raw events) within 20%
of E_j; 20% of E_j is 4.3 to 6.3 standard deviations for these ten, so a correct build fails
with probability below 1e-4 (the key is fresh and secure: no seed). A rule that keeps the same L
hash-lucky items for every client (one key per item, not per client) sends each of the ten to
about 0 or to its full count, far outside 20%.

Cost: one build per store of 160,000 event rows (about 1 s each).
"""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import numpy as np
import polars as pl
import psycopg
import pytest
from psycopg import sql

import frontends.polars_ns  # noqa: F401  (registers the frame namespace)
from adapters.duckdb import DuckDBTable
from adapters.postgres import PostgresTable
from frontends.polars_ns import clipped_counts

N_CLIENTS, DRAWS, N_ITEMS, LIMIT = 4000, 40, 500, 5
_RNG = np.random.default_rng(35)
_LAW = 1.0 / np.arange(1, N_ITEMS + 1) ** 1.1
EVENTS = _RNG.choice(N_ITEMS, size=(N_CLIENTS, DRAWS), p=_LAW / _LAW.sum())
CLIENTS = np.repeat(np.arange(N_CLIENTS), DRAWS)


def expected_bounded() -> tuple[np.ndarray, np.ndarray]:
    """(E_j, V_j) of the bounded counts (module docstring), from the events alone."""
    mean, var = np.zeros(N_ITEMS), np.zeros(N_ITEMS)
    for row in EVENTS:
        own = np.unique(row)
        kept = min(1.0, LIMIT / len(own))
        mean[own] += kept
        var[own] += kept * (1.0 - kept)
    return mean, var


def assert_top_items_keep_their_share(counts: np.ndarray) -> None:
    mean, var = expected_bounded()
    top = np.argsort(-np.bincount(EVENTS.ravel(), minlength=N_ITEMS), kind="stable")[:10]
    assert (0.2 * mean[top] / np.sqrt(var[top])).min() > 4.0  # the docstring's margin
    ratio = counts[top] / mean[top]
    assert np.all(np.abs(ratio - 1.0) <= 0.2), dict(zip(top.tolist(), ratio.round(3), strict=True))
    # every client keeps exactly min(L, n_c) items: the total is exact
    assert counts.sum() == sum(min(LIMIT, len(np.unique(row))) for row in EVENTS)


def counts_of(con: duckdb.DuckDBPyConnection, query: str) -> np.ndarray:
    counts = np.zeros(N_ITEMS)
    for item, score in con.execute(query).fetchall():
        counts[int(item)] = score
    return counts


@pytest.fixture(scope="module")
def events_frame() -> pl.DataFrame:
    return pl.DataFrame({"client": CLIENTS, "item": EVENTS.ravel()})


def test_duckdb_bounded_counts_keep_the_top_items(events_frame: pl.DataFrame) -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE votes AS SELECT * FROM events_frame")
    con.execute("CREATE TABLE items AS SELECT range AS id FROM range(?)", [N_ITEMS])
    DuckDBTable.from_votes(con, "votes", "items", max_items_per_client=LIMIT)
    assert_top_items_keep_their_share(counts_of(con, "SELECT id, score FROM votes_counts"))


@pytest.fixture
def pg_events(pg_conninfo: str, pg_schema: str) -> Iterator[tuple[str, str]]:
    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        s = sql.Identifier(pg_schema)
        conn.execute(sql.SQL("CREATE TABLE {}.bound_items (id bigint)").format(s))
        conn.execute(
            sql.SQL("INSERT INTO {}.bound_items SELECT generate_series(0, %s - 1)").format(s),
            [N_ITEMS],
        )
        conn.execute(sql.SQL("CREATE TABLE {}.bound_votes (client bigint, item bigint)").format(s))
        with conn.cursor().copy(
            sql.SQL("COPY {}.bound_votes (client, item) FROM STDIN").format(s)
        ) as copy:
            for client, item in zip(CLIENTS.tolist(), EVENTS.ravel().tolist(), strict=True):
                copy.write_row((client, item))
    yield pg_conninfo, pg_schema
    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        for name in ("bound_items", "bound_votes", "bound_votes_counts"):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(pg_schema, name)))


def test_postgres_bounded_counts_keep_the_top_items(pg_events: tuple[str, str]) -> None:
    dsn, schema = pg_events
    PostgresTable.from_votes(
        dsn, "bound_votes", "bound_items", schema=schema, max_items_per_client=LIMIT
    )
    counts = np.zeros(N_ITEMS)
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            sql.SQL("SELECT id, score FROM {}").format(sql.Identifier(schema, "bound_votes_counts"))
        ).fetchall()
    for item, score in rows:
        counts[int(item)] = score
    assert_top_items_keep_their_share(counts)


def test_polars_bounded_counts_keep_the_top_items(events_frame: pl.DataFrame) -> None:
    domain = pl.DataFrame({"id": np.arange(N_ITEMS)})
    got = clipped_counts(events_frame.lazy(), domain, "client", "item", None, 1, LIMIT)
    counts = np.zeros(N_ITEMS)
    counts[got["id"].to_numpy()] = got["score"].to_numpy()
    assert_top_items_keep_their_share(counts)
