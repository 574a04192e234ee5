"""Never stale: a release reflects the table as of its start on every store, after UPDATE, INSERT
and DELETE, unless the caller opted in to a frozen copy (DESIGN invariant 14; docs/freshness.md).

Each store wraps a table of distinct even scores 0, 2, ..., 598 (ids 0..299) and is prepared;
then writers on connections of their own commit an UPDATE, an INSERT and DELETEs, and a release
with every method must name the new top-3. epsilon = 10^4 makes the Gumbel scale 2k/epsilon =
6e-4 (privacy.calibrate), so a gap of 2 between scores is crossed by the noise with probability
below exp(-3000): the released items are the exact top-3 of the table the release read.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
import psycopg
import pytest
import sqlalchemy as sa
from psycopg import sql

from adapters.duckdb import DuckDBTable
from adapters.postgres import PostgresTable
from tests.helpers import assert_law_and_scale
from tests.stores_duckdb import create_table as create_duckdb_table
from tests.stores_postgres import ID_COLUMN, SCORE_COLUMN
from tests.stores_postgres import create_table as create_postgres_table
from topk_middleware import private_top_k

SCORES = np.arange(300, dtype=np.int64) * 2
K = 3
EPSILON = 1e4
METHODS = ("auto", "threshold", "oneshot")

COPY_STORES = [
    "duckdb",
    "postgres",
    "sqlalchemy-sqlite",
    "sqlalchemy-postgres",
    "sqlalchemy-mariadb",
    "sqlalchemy-duckdb",
    "clickhouse",
]
LIVE_STORES = [
    "postgres-live",
    "sqlalchemy-live-sqlite",
    "sqlalchemy-live-postgres",
    "sqlalchemy-live-mariadb",
]


@dataclass
class Store:
    """A source over the table and a writer that commits SQL on a connection of its own."""

    source: Any
    execute: Callable[[str, dict[str, Any]], None]
    table: str  # quoted, qualified
    id: str  # quoted
    score: str  # quoted
    frozen: Callable[[], Any] | None = None  # the same table wrapped with frozen=True

    def update(self, item: int, score: int) -> None:
        self.execute(
            f"UPDATE {self.table} SET {self.score} = :score WHERE {self.id} = :item",
            {"item": item, "score": score},
        )

    def insert(self, item: int, score: int) -> None:
        self.execute(
            f"INSERT INTO {self.table} ({self.id}, {self.score}) VALUES (:item, :score)",
            {"item": item, "score": score},
        )

    def delete(self, item: int) -> None:
        self.execute(f"DELETE FROM {self.table} WHERE {self.id} = :item", {"item": item})


def _duckdb_store() -> Iterator[Store]:
    con = duckdb.connect()
    name = "Fresh Counts"
    create_duckdb_table(con, name, SCORES, None)
    source = DuckDBTable(con, name, id="Item ID", score="select")
    source.prepare()
    writer = con.cursor()

    def execute(statement: str, params: dict[str, Any]) -> None:
        writer.execute(statement.replace(":item", "$item").replace(":score", "$score"), params)

    def frozen() -> DuckDBTable:
        return DuckDBTable(con, name, id="Item ID", score="select", frozen=True)

    yield Store(source, execute, '"Fresh Counts"', '"Item ID"', '"select"', frozen)
    con.close()


def _postgres_store(conninfo: str, schema: str, live: Any = None) -> Iterator[Store]:
    """PostgresTable in copy mode over a new table, or the live table `live` made by the
    conformance fixture (which drops it)."""
    conn = psycopg.connect(conninfo, autocommit=True)
    if live is None:
        name = f"fresh_{uuid.uuid4().hex[:8]}"
        create_postgres_table(conn, schema, name, SCORES, None)
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD PRIMARY KEY ({})").format(
                sql.Identifier(schema, name), sql.Identifier(ID_COLUMN)
            )
        )
        source = PostgresTable(conninfo, name, id=ID_COLUMN, score=SCORE_COLUMN, schema=schema)
        source.prepare()
    else:
        source, name = live, live.table
    mode = "copy" if live is None else "live"
    table = sql.Identifier(schema, name).as_string(conn)

    def execute(statement: str, params: dict[str, Any]) -> None:
        conn.execute(statement.replace(":item", "%(item)s").replace(":score", "%(score)s"), params)

    def frozen() -> PostgresTable:
        return PostgresTable(
            conninfo, name, id=ID_COLUMN, score=SCORE_COLUMN, schema=schema, frozen=True
        )

    quote = sql.Identifier
    yield Store(
        source,
        execute,
        table,
        quote(ID_COLUMN).as_string(conn),
        quote(SCORE_COLUMN).as_string(conn),
        frozen if mode == "copy" else None,
    )
    if live is not None:
        conn.close()
        return
    source.close()
    for drop in (source.table, source.rank_table, source.runs_table):
        conn.execute(
            sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(sql.Identifier(schema, drop))
        )
    conn.close()


def _clickhouse_store(con: Any) -> Iterator[Store]:
    """ClickHouseTable over a MergeTree table that takes standard UPDATE (lightweight updates:
    patch parts) as well as ALTER UPDATE, INSERT and lightweight DELETE."""
    from adapters.clickhouse import ClickHouseTable
    from adapters.dialects.clickhouse import ClickHouseDialect
    from adapters.sql.driver import ChdbDriver

    driver = ChdbDriver(con)
    name = f"Fresh Counts {uuid.uuid4().hex[:8]}"
    table = ClickHouseDialect().quote(name)
    driver.execute(
        f"CREATE TABLE {table} (`Item ID` Int64, `select` Int64) ENGINE = MergeTree "
        "ORDER BY `Item ID` SETTINGS enable_block_number_column = 1, "
        "enable_block_offset_column = 1"
    )
    driver.execute(f"INSERT INTO {table} SELECT number, 2 * number FROM numbers({len(SCORES)})")
    source = ClickHouseTable(con, name, id="Item ID", score="select")
    source.prepare()

    def execute(statement: str, params: dict[str, Any]) -> None:
        driver.execute(statement, params)

    def frozen() -> ClickHouseTable:
        return ClickHouseTable(con, name, id="Item ID", score="select", frozen=True)

    yield Store(source, execute, table, "`Item ID`", "`select`", frozen)
    source.uninstall()
    driver.execute(f"DROP TABLE IF EXISTS {table} SYNC")


def _sqlalchemy_store(source: Any) -> Store:
    engine: sa.Engine = source.engine
    preparer = engine.dialect.identifier_preparer

    def execute(statement: str, params: dict[str, Any]) -> None:
        with engine.begin() as conn:
            conn.execute(sa.text(statement), params)

    return Store(
        source,
        execute,
        preparer.quote(source.table_name),
        preparer.quote("id"),
        preparer.quote("score"),
    )


@pytest.fixture(params=COPY_STORES + LIVE_STORES)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    name: str = request.param
    if name == "duckdb":
        yield from _duckdb_store()
    elif name == "clickhouse":
        yield from _clickhouse_store(request.getfixturevalue("clickhouse_connection"))
    elif name in ("postgres", "postgres-live"):
        conninfo = request.getfixturevalue("pg_conninfo")
        schema = request.getfixturevalue("pg_schema")
        live = None
        if name == "postgres-live":
            live = request.getfixturevalue("make_postgres_live_source")(SCORES, None)
        yield from _postgres_store(conninfo, schema, live)
    else:
        make = request.getfixturevalue(f"make_{name.replace('-', '_')}_source")
        options = {} if "live" in name else {"frozen": False}
        yield _sqlalchemy_store(make(SCORES, None, **options))


def top(store: Store, method: str) -> list[Any]:
    result = private_top_k(store.source, k=K, epsilon=EPSILON, method=method, seed=7)
    return [int(item) for item in result.items]


def test_a_release_reads_the_table_as_of_its_start(store: Store) -> None:
    """UPDATE, INSERT, DELETE: each release, by every method, names the top-3 of the table as
    it is when the release starts (no refresh called)."""
    for method in METHODS:
        assert top(store, method) == [299, 298, 297], method
    store.update(5, 10_000)
    for method in METHODS:
        assert top(store, method) == [5, 299, 298], method
    store.insert(1000, 20_000)
    for method in METHODS:
        assert top(store, method) == [1000, 5, 299], method
    store.delete(1000)
    store.delete(299)
    for method in METHODS:
        assert top(store, method) == [5, 298, 297], method


@pytest.mark.parametrize("store", ["duckdb", "postgres"], indirect=True)
def test_a_frozen_copy_is_served_as_promised(store: Store) -> None:
    """frozen=True is the caller's promise that the table does not change: the copy of the last
    prepare() is served without a proof (here, knowingly, after a write), while the default
    wrapper of the same table reads the write."""
    assert store.frozen is not None
    store.update(5, 10_000)
    frozen = store.frozen()
    assert frozen.serves_copy()
    result = private_top_k(frozen, k=K, epsilon=EPSILON, method="threshold", seed=1)
    assert [int(i) for i in result.items] == [299, 298, 297]
    assert not store.source.serves_copy()
    assert top(store, "threshold") == [5, 299, 298]


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
def test_postgres_copy_is_proven_current_until_a_write(store: Store) -> None:
    """The write counter: right after prepare() the copy is served (proven current in the run's
    first query); any write statement, even one that changes no score, ends the proof until
    prepare(refresh=True)."""
    assert store.source.serves_copy()
    store.update(5, 10)  # the score it had: a write all the same
    assert not store.source.serves_copy()
    store.source.prepare(refresh=True)
    assert store.source.serves_copy()
    assert top(store, "threshold") == [299, 298, 297]


@pytest.mark.parametrize(
    "store",
    ["sqlalchemy-sqlite", "sqlalchemy-postgres", "sqlalchemy-mariadb", "sqlalchemy-duckdb"],
    indirect=True,
)
def test_sqlalchemy_copy_says_how_it_knew(store: Store) -> None:
    """SQLAlchemy copy mode proves its copy current by the triggers' record (DuckDB, without
    triggers, by comparing the copy with the table); after a write the run reads the table
    itself (the in-store one-shot on it; MariaDB: a full read; DuckDB: read whole, the table
    being below its measured crossover, as DuckDBTable's), and a refresh makes the copy
    current again. result.diagnostics.plan["freshness"] says which."""
    duckdb = store.source.engine.dialect.name == "duckdb"
    proof = "compared" if duckdb else "triggers"
    result = private_top_k(store.source, k=K, epsilon=EPSILON, seed=1)
    assert result.plan["freshness"] == {"refreshes": 0, "copy": "current", "proof": proof}
    store.update(5, 10_000)
    result = private_top_k(store.source, k=K, epsilon=EPSILON, seed=1)
    assert [int(i) for i in result.items] == [5, 299, 298]
    report = result.plan["freshness"]
    read = "table whole" if duckdb else "table"
    assert report["copy"] == "stale" and report["read"] == read, report
    in_store = store.source.engine.dialect.name not in ("mysql", "mariadb", "duckdb")
    assert result.plan["in_store"] == in_store
    store.source.prepare(refresh=True)
    result = private_top_k(store.source, k=K, epsilon=EPSILON, seed=1)
    assert result.plan["freshness"]["copy"] == "current"


def test_duckdb_checks_what_it_reads_now() -> None:
    """DuckDB reads the table itself: bad rows written since prepare() are refused, in the
    project's words, before anything is released."""
    con = duckdb.connect()
    create_duckdb_table(con, "t", SCORES, None)
    source = DuckDBTable(con, "t", id="Item ID", score="select")
    source.prepare()
    con.execute('UPDATE t SET "select" = -1 WHERE "Item ID" = 3')
    with pytest.raises(ValueError, match="has 1 negative score"):
        private_top_k(source, k=K, epsilon=1.0)
    con.execute('UPDATE t SET "select" = NULL WHERE "Item ID" = 3')
    with pytest.raises(ValueError, match="has 1 NULL score"):
        private_top_k(source, k=K, epsilon=1.0)
    con.execute('UPDATE t SET "select" = 4, "Item ID" = 2 WHERE "Item ID" = 3')
    with pytest.raises(ValueError, match="duplicate ids"):
        private_top_k(source, k=K, epsilon=1.0)


def test_duckdb_one_shot_on_the_table_has_the_exponential_law() -> None:
    """The one-shot on the table as it is now (keyed noise on rowids, split at the default
    level, rowids with holes from deletes and new ones from inserts) releases item i as top-1
    with probability exp(h_i / b) / sum_j exp(h_j / b) (Gumbel-max, Fact 3.3 with k = 1). Five
    items stand out of 69,995 zeros by ln(m) + 0, 0.5, ..., 2 scales; 500 seeded releases (every
    cell expected 27 times or more), Pearson's chi-square and the score test of the scale at
    5e-4 each (tests.helpers.assert_law_and_scale: fails with probability 0.001 if the law
    holds; a noise scale 10% too large fails with probability 0.99997, 10% too small 0.91, 20%
    too small 1.0: simulated, 40,000 samples of 500; the chi-square alone at 1e-3 took 800
    releases for 0.9999, 0.90 and 0.9998)."""
    from topk_middleware.privacy import calibrate

    m, epsilon = 70_000, 1.0
    b = calibrate("gumbel", 1, m, epsilon, 0.0).scale
    lifts = np.array([0.0, 0.5, 1.0, 1.5, 2.0])
    tops = b * (np.log(m) + lifts)
    con = duckdb.connect()
    con.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, score DOUBLE NOT NULL)")
    zeros = np.arange(100, 100 + m - 5 + 500)
    con.execute("INSERT INTO t SELECT unnest(?::BIGINT[]), 0.0", [zeros.tolist()])
    holes = (100 + 140 * np.arange(500)).tolist()
    con.execute("DELETE FROM t WHERE id IN (SELECT unnest(?::BIGINT[]))", [holes])  # 500 holes
    con.execute(
        "INSERT INTO t SELECT unnest(?::BIGINT[]), unnest(?::DOUBLE[])",
        [list(range(5)), tops.tolist()],
    )
    source = DuckDBTable(con, "t")
    with source.snapshot():
        assert source.domain_size() == m and source.oneshot_positions() > m

    def law(scale: float) -> np.ndarray:
        weights = np.concatenate([np.exp(tops / scale), [m - 5.0]])
        return weights / weights.sum()

    counts = np.zeros(6)
    runs = 500
    for seed in range(runs):
        result = private_top_k(source, k=1, epsilon=epsilon, method="oneshot", seed=seed)
        assert result.plan["in_store"]
        item = int(result.items[0])
        counts[item if item < 5 else 5] += 1
    assert law(b).min() * runs >= 27
    assert_law_and_scale(counts, law, b)


@pytest.mark.parametrize("store", ["sqlalchemy-live-mariadb"], indirect=True)
def test_mariadb_live_after_truncate(store: Store) -> None:
    """TRUNCATE fires no DELETE trigger on MariaDB (it re-creates the table): re-inserting ids
    that had positions must not fail the writer's INSERT (the trigger found them placed), and
    the next release rebuilds the positions and names the new table's top-3."""
    assert top(store, "threshold") == [299, 298, 297]
    store.execute(f"TRUNCATE TABLE {store.table}", {})
    for item, score in ((7, 5), (8, 3), (9, 1), (10, 0)):
        store.insert(item, score)  # ids that had positions before the TRUNCATE
    for method in METHODS:
        assert top(store, method) == [7, 8, 9], method
    store.execute(f"TRUNCATE TABLE {store.table}", {})
    store.insert(500, 9)  # an id never seen; the old positions are still there
    store.insert(501, 8)
    store.insert(502, 7)
    assert top(store, "threshold") == [500, 501, 502]


SQLALCHEMY_COPY = [
    "sqlalchemy-sqlite",
    "sqlalchemy-postgres",
    "sqlalchemy-mariadb",
    "sqlalchemy-duckdb",
]


@pytest.mark.parametrize("store", SQLALCHEMY_COPY, indirect=True)
def test_sqlalchemy_copy_after_truncate_and_recreate(store: Store) -> None:
    """TRUNCATE (SQLite: DELETE without WHERE) and a table dropped and re-created with the same
    definition (MariaDB's TRUNCATE is one: a new table id; SQLite may reuse the root page; the
    triggers go with the table): the release names the table's top-3, never the copy's."""
    from tests.stores_sqlalchemy import create_counts_table

    source = store.source
    sqlite = source.engine.dialect.name == "sqlite"
    store.execute(f"DELETE FROM {store.table}" if sqlite else f"TRUNCATE TABLE {store.table}", {})
    for item, score in ((7, 5), (8, 3), (9, 1), (10, 0)):
        store.insert(item, score)
    for method in METHODS:
        assert top(store, method) == [7, 8, 9], method
    with source.engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {store.table}")
    create_counts_table(source.engine, source.table_name, SCORES[::-1], None)  # id 0 on top
    for method in METHODS:
        assert top(store, method) == [0, 1, 2], method
    source.prepare()  # rebuilds the copy of the new table and its triggers
    assert top(store, "threshold") == [0, 1, 2]
    result = private_top_k(source, k=K, epsilon=EPSILON, seed=2)
    assert result.plan["freshness"]["copy"] == "current"
    store.update(1, 10_000)
    assert top(store, "auto") == [1, 0, 2]


@pytest.mark.parametrize("store", ["sqlalchemy-postgres"], indirect=True)
def test_sqlalchemy_postgres_copy_after_what_fires_no_dml_trigger(store: Store) -> None:
    """On PostgreSQL the SQLAlchemy copy shares PostgresTable's proof: a rewrite by ALTER TYPE,
    writes with the triggers disabled, and a replica-role session are all seen."""
    t = store.table
    store.execute(
        f"ALTER TABLE {t} ALTER score TYPE bigint USING (CASE WHEN id = 5 THEN 10000 "
        "ELSE score END)",
        {},
    )
    assert top(store, "auto") == [5, 299, 298]
    store.source.prepare(refresh=True)
    store.execute(f"ALTER TABLE {t} DISABLE TRIGGER ALL", {})
    store.update(6, 20_000)
    assert top(store, "auto") == [6, 5, 299]
    store.execute(f"ALTER TABLE {t} ENABLE TRIGGER ALL", {})
    store.source.prepare(refresh=True)
    with store.source.engine.begin() as conn:
        conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
        conn.exec_driver_sql(f"UPDATE {t} SET score = 30000 WHERE id = 7")
    assert top(store, "auto") == [7, 6, 5]


@pytest.mark.parametrize("store", ["postgres-live", "sqlalchemy-live-postgres"], indirect=True)
def test_postgres_live_positions_follow_replica_role_writes(store: Store, pg_conninfo: str) -> None:
    """A session with session_replication_role = replica skips ordinary triggers; the live
    position triggers are ENABLE ALWAYS, so an item inserted there takes a position and is
    released (it was missing from every release before)."""
    conn = psycopg.connect(pg_conninfo, autocommit=True)
    try:
        conn.execute("SET session_replication_role = replica")
        conn.execute(f"INSERT INTO {store.table} ({store.id}, {store.score}) VALUES (1000, 20000)")
        conn.execute(f"DELETE FROM {store.table} WHERE {store.id} = 299")
    finally:
        conn.close()
    for method in METHODS:
        assert top(store, method) == [1000, 298, 297], method


@pytest.mark.parametrize("store", ["postgres-live"], indirect=True)
def test_postgres_live_positions_after_disabled_triggers(store: Store) -> None:
    """Items inserted and deleted while the position triggers were disabled (then enabled
    again) are not in the positions: the run sees the triggers' catalog rows changed, has
    prepare() fill the positions again, and releases the table's top-3."""
    store.execute(f"ALTER TABLE {store.table} DISABLE TRIGGER ALL", {})
    store.insert(1000, 20_000)
    store.delete(299)
    store.execute(f"ALTER TABLE {store.table} ENABLE TRIGGER ALL", {})
    for method in METHODS:
        assert top(store, method) == [1000, 298, 297], method
