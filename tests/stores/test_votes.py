"""from_votes, written once (adapters/sql/votes.py over adapters/contributions.py): on every store
the same checks before anything is written, each refusal in the same words, and the same law.

Stores: DuckDBTable, PostgresTable, SQLAlchemyTable on SQLite, PostgreSQL, MariaDB and DuckDB,
and SparkTable. Each refusal is asserted by its whole text but for the store's name and type
names, and each store must write nothing when it refuses (no counts table; on SQLAlchemy, whose
copy holds the counts, no rank table). A refusal must be the project's: never a driver's
message ("Binder Error", "operator does not exist", "Conversion Error"), never a wrong one (a
DATE item against integer ids is not a vote for a missing item), never silence (a text or
boolean weight is not counted as 0 or 1). SQLAlchemy counts in prepare(), so every build checks
the votes again; the keyed hash is SHA-256 on every store, so one key keeps the same items.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import duckdb
import numpy as np
import psycopg
import pytest
import sqlalchemy as sa
from psycopg import sql

import adapters.contributions as contributions
from adapters.duckdb import DuckDBTable
from adapters.postgres import PostgresTable
from adapters.sql.engine import SQLTable
from adapters.sqlalchemy import SQLAlchemyTable

# Column types by role, in each store's words.
TYPES = {
    "duckdb": {"int": "BIGINT", "text": "VARCHAR", "float": "DOUBLE", "bool": "BOOLEAN"},
    "postgres": {"int": "bigint", "text": "text", "float": "float8", "bool": "boolean"},
    "sqlite": {"int": "BIGINT", "text": "TEXT", "float": "REAL", "bool": "BOOLEAN"},
    "mariadb": {"int": "BIGINT", "text": "VARCHAR(100)", "float": "DOUBLE", "bool": "BOOLEAN"},
}
for _types in TYPES.values():
    _types["date"] = "DATE"


class Store:
    """One store as the tests drive it: tables made by DDL, from_votes called as its users do."""

    name = ""  # how the store's messages name it
    types: dict[str, str] = {}  # noqa: RUF012
    not_finite = ("'inf'::DOUBLE", "'nan'::DOUBLE")  # SQL of the doubles it holds beyond

    def __init__(self) -> None:
        self.made: list[str] = []

    def sql(self, statement: str, rows: list[tuple[Any, ...]] = ()) -> None:
        raise NotImplementedError

    def placeholders(self, n: int) -> str:
        return ", ".join(["?"] * n)

    def quote(self, name: str) -> str:
        return '"' + name + '"'

    def create(self, name: str, columns: dict[str, str], rows: list[tuple[Any, ...]]) -> None:
        ddl = ", ".join(f"{self.quote(c)} {self.types[t]}" for c, t in columns.items())
        self.sql(f"CREATE TABLE {self.quote(name)} ({ddl})")
        self.made.append(name)
        if rows:
            marks = self.placeholders(len(columns))
            self.sql(f"INSERT INTO {self.quote(name)} VALUES ({marks})", rows)

    def from_votes(self, votes: str, items: str, **options: Any) -> Any:
        raise NotImplementedError

    def tables(self) -> set[str]:
        raise NotImplementedError

    def counts(self, source: Any) -> dict[Any, float]:
        with source.snapshot():
            rows = source.read_sorted(0, source.domain_size())
        return dict(zip(rows.ids.tolist(), rows.scores.tolist(), strict=True))

    def close(self) -> None:
        pass


class DuckDBStore(Store):
    name = "DuckDB"
    types = TYPES["duckdb"]

    def __init__(self) -> None:
        super().__init__()
        self.con = duckdb.connect()

    def sql(self, statement: str, rows: list[tuple[Any, ...]] = ()) -> None:
        if rows:
            self.con.executemany(statement, rows)
        else:
            self.con.execute(statement)

    def from_votes(self, votes: str, items: str, **options: Any) -> Any:
        return DuckDBTable.from_votes(self.con, votes, items, **options)

    def tables(self) -> set[str]:
        return {r[0] for r in self.con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}


class PostgresStore(Store):
    name = "PostgreSQL"
    types = TYPES["postgres"]
    not_finite = ("'Infinity'", "'NaN'")

    def __init__(self, conninfo: str, schema: str) -> None:
        super().__init__()
        self.conninfo, self.schema = conninfo, schema
        self.conn = psycopg.connect(conninfo, autocommit=True)
        self.conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        self.opened: list[Any] = []

    def placeholders(self, n: int) -> str:
        return ", ".join(["%s"] * n)

    def sql(self, statement: str, rows: list[tuple[Any, ...]] = ()) -> None:
        if rows:
            with self.conn.cursor() as cur:
                cur.executemany(statement, rows)
        else:
            self.conn.execute(statement)

    def from_votes(self, votes: str, items: str, **options: Any) -> Any:
        source = PostgresTable.from_votes(
            self.conninfo, votes, items, schema=self.schema, **options
        )
        self.opened.append(source)
        return source

    def tables(self) -> set[str]:
        found = self.conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", [self.schema]
        )
        return {r[0] for r in found.fetchall()}

    def close(self) -> None:
        for source in self.opened:
            source.close()
        for name in reversed(self.made):
            self.conn.execute(
                sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(sql.Identifier(name))
            )
        self.conn.close()


class SQLAlchemyStore(Store):
    """SQLAlchemyTable: from_votes defines the counts, prepare() counts them into its copy."""

    def __init__(self, engine: sa.Engine, dialect: str) -> None:
        super().__init__()
        self.engine = engine
        self.types = TYPES.get(dialect, TYPES["duckdb"])
        self.name = {"sqlite": "SQLite", "postgres": "PostgreSQL", "mariadb": "MariaDB"}.get(
            dialect, "DuckDB"
        )
        self.not_finite = {
            "sqlite": ("1e999",),  # NaN is stored as NULL
            "postgres": PostgresStore.not_finite,
            "mariadb": (),  # DOUBLE holds neither
        }.get(dialect, Store.not_finite)
        self.sources: list[SQLAlchemyTable] = []

    def quote(self, name: str) -> str:
        return self.engine.dialect.identifier_preparer.quote(name)

    def sql(self, statement: str, rows: list[tuple[Any, ...]] = ()) -> None:
        with self.engine.begin() as conn:
            if rows:
                marks = iter(range(100))
                text = re.sub(r"\?", lambda _: f":p{next(marks)}", statement)
                conn.execute(
                    sa.text(text), [{f"p{i}": v for i, v in enumerate(row)} for row in rows]
                )
            else:
                conn.exec_driver_sql(statement)

    def from_votes(self, votes: str, items: str, **options: Any) -> Any:
        source = SQLAlchemyTable.from_votes(
            self.engine, votes, items, rank_table=f"v_r_{uuid.uuid4().hex[:8]}", **options
        )
        self.sources.append(source)
        source.prepare()
        return source

    def tables(self) -> set[str]:
        """This store's tables on a server other tests share: the ones named by this test's
        tables, and the copies of its sources."""
        own = {n for s in self.sources for n in (s.rank_table_name, s.runs_table_name)}
        tags = {name.rsplit("_", 1)[-1] for name in self.made}
        return {
            t
            for t in sa.inspect(self.engine).get_table_names()
            if t in own or any(tag in t for tag in tags)
        }

    def close(self) -> None:
        for source in self.sources:
            source.uninstall()
        with self.engine.begin() as conn:
            for name in reversed(self.made):
                sa.Table(name, sa.MetaData()).drop(conn, checkfirst=True)


STORES = [
    "duckdb",
    "postgres",
    "sqlalchemy-sqlite",
    "sqlalchemy-postgres",
    "sqlalchemy-mariadb",
    "sqlalchemy-duckdb",
]


WRITING = ["duckdb", "postgres"]  # the stores whose from_votes writes a table `into`
KEYED = [s for s in STORES if s != "sqlalchemy-sqlite"]  # SQLite has no SHA-256


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    kind = request.param
    if kind == "duckdb":
        made: Store = DuckDBStore()
    elif kind == "postgres":
        made = PostgresStore(
            request.getfixturevalue("pg_conninfo"), request.getfixturevalue("pg_schema")
        )
    else:
        dialect = kind.split("-")[1]
        made = SQLAlchemyStore(request.getfixturevalue(f"sqlalchemy_{dialect}_engine"), dialect)
    yield made
    made.close()


def names() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"votes_{tag}", f"items_{tag}"


def refused(
    store: Store, error: type[Exception], text: str, votes: str, items: str, **options: Any
) -> None:
    """from_votes is refused with exactly `text` (a regular expression of the whole message),
    and leaves no table behind."""
    before = store.tables()
    with pytest.raises(error) as caught:
        store.from_votes(votes, items, **options)
    assert re.fullmatch(text, str(caught.value)), str(caught.value)
    assert store.tables() == before


def test_missing_tables_and_columns_are_refused_by_name(store: Store) -> None:
    votes, items = names()
    store.create(items, {"id": "int"}, [(1,), (2,)])
    store.create(votes, {"client": "int", "item": "int", "w": "float"}, [(1, 1, 1.0)])
    s = store.name
    refused(store, ValueError, rf"{s} table 'no_votes_x' does not exist", "no_votes_x", items)
    refused(store, ValueError, rf"{s} table 'no_items_x' does not exist", votes, "no_items_x")
    columns = re.escape("(columns: ['client', 'item', 'w'])")
    for option in ("client", "item", "weight"):
        refused(
            store,
            ValueError,
            rf"{s} table '{votes}' has no column 'nope' {columns}",
            votes,
            items,
            **{option: "nope"},
            **({"max_per_item": 2} if option == "weight" else {}),
        )
    refused(
        store,
        ValueError,
        rf"{s} table '{items}' has no column 'nope' \(columns: \['id'\]\)",
        votes,
        items,
        item_id="nope",
    )


@pytest.mark.parametrize("weight_type", ["text", "bool", "date"])
def test_a_weight_of_another_type_is_refused_from_the_catalog(
    store: Store, weight_type: str
) -> None:
    """Before any row is read: the votes hold a value that would cast ('2'), and one that
    would not."""
    votes, items = names()
    store.create(items, {"id": "int"}, [(1,), (2,)])
    value = {"text": "2", "bool": True, "date": "2024-01-01"}[weight_type]
    store.create(votes, {"client": "int", "item": "int", "w": weight_type}, [(1, 1, value)])
    if store.name == "MariaDB" and weight_type == "bool":
        store.from_votes(votes, items, weight="w", max_per_item=2)  # BOOLEAN is TINYINT(1)
        return
    refused(
        store,
        TypeError,
        rf"{store.name} table '{votes}' column 'w' is [^:]+: weights must be of a numeric type",
        votes,
        items,
        weight="w",
        max_per_item=2,
    )


@pytest.mark.parametrize(
    "item_type,id_type", [("text", "int"), ("int", "text"), ("date", "int"), ("int", "date")]
)
def test_item_ids_of_two_types_are_refused(store: Store, item_type: str, id_type: str) -> None:
    """A text vote column against integer item ids, and dates against integers, on every store
    alike, from the catalog; ids of two integer or float types match."""
    votes, items = names()
    sample = {"int": 1, "text": "1", "date": "2024-01-01"}
    store.create(items, {"id": id_type}, [(sample[id_type],)])
    store.create(votes, {"client": "int", "item": item_type}, [(1, sample[item_type])])
    s = store.name
    refused(
        store,
        TypeError,
        rf"{s} table '{votes}' column 'item' is [^:]+ and {s} table '{items}' column 'id' is "
        r"[^:]+: item ids must be of one type",
        votes,
        items,
    )


def test_floats_and_integers_are_one_kind_of_id(store: Store) -> None:
    votes, items = names()
    store.create(items, {"id": "int"}, [(1,), (2,), (3,)])
    store.create(votes, {"client": "int", "item": "float"}, [(1, 1.0), (2, 1.0), (1, 3.0)])
    assert store.counts(store.from_votes(votes, items)) == {1: 2.0, 3: 1.0, 2: 0.0}


def test_votes_for_missing_items_and_bad_weights_are_refused_before_counting(
    store: Store,
) -> None:
    votes, items = names()
    store.create(items, {"id": "int"}, [(1,), (2,)])
    store.create(votes, {"client": "int", "item": "int", "w": "float"}, [(1, 1, 1.0)])
    s = store.name
    store.sql(f"INSERT INTO {store.quote(votes)} VALUES (2, 99, 1.0), (3, NULL, 1.0)")
    refused(
        store,
        ValueError,
        rf"{s} table '{votes}' column 'item' has 1 vote\(s\) for items not in the items table "
        rf"\({s} table '{items}'\), e.g. '99': the items table must list every item \(the "
        r"public domain\)",
        votes,
        items,
    )
    store.sql(f"DELETE FROM {store.quote(votes)} WHERE item = 99")
    for value in ("-1.5", *store.not_finite):
        store.sql(f"INSERT INTO {store.quote(votes)} VALUES (4, 2, {value})")
        refused(
            store,
            ValueError,
            rf"{s} table '{votes}' column 'w' has 1 negative, NaN or infinite weight\(s\): "
            r"weights must be finite and >= 0",
            votes,
            items,
            weight="w",
            max_per_item=2,
        )
        store.sql(f"DELETE FROM {store.quote(votes)} WHERE client = 4")
    source = store.from_votes(votes, items, weight="w", max_per_item=2)
    assert store.counts(source) == {1: 1.0, 2: 0.0}


@pytest.mark.parametrize("store", WRITING, indirect=True)
def test_the_table_of_counts_is_never_an_existing_one_unasked(store: Store) -> None:
    """DuckDB and PostgreSQL write `into` (SQLAlchemy keeps its counts in the copy prepare()
    builds): an existing table without replace=True, a view, or one of the tables counted from
    is refused before anything is read."""
    votes, items = names()
    store.create(items, {"id": "int"}, [(1,), (2,)])
    store.create(votes, {"client": "int", "item": "int"}, [(1, 1)])
    s, into = store.name, f"{votes}_counts"
    store.create(into, {"x": "int"}, [])
    refused(
        store,
        ValueError,
        rf"{s} table '{into}' \(where the counts go\) already exists: pass replace=True to "
        r"replace it, or another name as into=",
        votes,
        items,
    )
    view = f"{votes}_view"
    store.sql(f"CREATE VIEW {store.quote(view)} AS SELECT 1 AS x")
    try:
        refused(
            store,
            ValueError,
            rf"{s} table '{view}' \(where the counts go\) is a view, not a table: pass another "
            "name as into=",
            votes,
            items,
            into=view,
            replace=True,
        )
    finally:
        store.sql(f"DROP VIEW {store.quote(view)}")
    refused(
        store,
        ValueError,
        rf"{s} table '{votes}' is where the counts would go and one of the tables they are "
        "counted from: pass another name as into=",
        votes,
        items,
        into=votes,
        replace=True,
    )
    source = store.from_votes(votes, items, replace=True)
    assert store.counts(source) == {1: 1.0, 2: 0.0}


# ----- one law on every store ------------------------------------------------------------------
EVENTS = [
    (c, i, w)
    for c, i, w in zip(
        np.random.default_rng(37).integers(0, 30, 400).tolist(),
        (np.random.default_rng(38).zipf(1.5, 400) % 25).tolist(),
        np.round(np.random.default_rng(39).exponential(1.5, 400), 3).tolist(),
        strict=True,
    )
]


@pytest.fixture
def fixed_key(monkeypatch: pytest.MonkeyPatch) -> str:
    key = "5a" * 32
    monkeypatch.setattr(contributions, "fresh_key", lambda: key)
    return key


@pytest.mark.parametrize("store", KEYED, indirect=True)
@pytest.mark.parametrize(
    "bounds",
    [
        {"max_per_item": 2, "max_items_per_client": 2},
        {"weight": "w", "max_per_item": 2.5, "max_items_per_client": 3},
    ],
)
def test_one_key_keeps_the_same_items_on_every_store(
    store: Store, fixed_key: str, bounds: dict[str, Any]
) -> None:
    """SHA-256 of the same message with the same key: the counts of every store equal
    DuckDB's (SQLite has no SHA-256: test_sqlite_refuses_the_item_limit_without_sha256)."""
    votes, items = names()
    store.create(items, {"id": "int"}, [(i,) for i in range(25)])
    store.create(votes, {"client": "int", "item": "int", "w": "float"}, EVENTS)
    reference = DuckDBStore()
    reference.create(items, {"id": "int"}, [(i,) for i in range(25)])
    reference.create(votes, {"client": "int", "item": "int", "w": "float"}, EVENTS)
    want = reference.counts(reference.from_votes(votes, items, **bounds))
    assert store.counts(store.from_votes(votes, items, **bounds)) == want
    unlimited = {**bounds, "max_items_per_client": None}
    assert want != reference.counts(reference.from_votes(votes, items, into="u", **unlimited))


def test_sqlite_refuses_the_item_limit_without_sha256(
    sqlalchemy_sqlite_engine: sa.Engine,
) -> None:
    store = SQLAlchemyStore(sqlalchemy_sqlite_engine, "sqlite")
    try:
        votes, items = names()
        store.create(items, {"id": "int"}, [(1,)])
        store.create(votes, {"client": "int", "item": "int"}, [(1, 1)])
        refused(
            store,
            ValueError,
            "max_items_per_client needs SHA-256 in the database, which SQLite does not have: "
            "leave it None, or count the votes on a store that has it",
            votes,
            items,
            max_items_per_client=1,
        )
        # a declared REAL column may still hold text in SQLite: refused, not counted as 0
        store.sql(f'CREATE TABLE "{votes}_w" (client INTEGER, item INTEGER, w REAL)')
        store.made.append(f"{votes}_w")
        store.sql(f"INSERT INTO \"{votes}_w\" VALUES (1, 1, 'many'), (2, 1, 1.5)")
        refused(
            store,
            ValueError,
            rf"SQLite table '{votes}_w' column 'w' has 1 value\(s\) that are not numbers: "
            "weights must be numbers",
            f"{votes}_w",
            items,
            weight="w",
            max_per_item=2,
        )
    finally:
        store.close()


def test_postgres_clients_need_an_equality(pg_conninfo: str, pg_schema: str) -> None:
    """A json client column (no equality: COUNT(DISTINCT) would fail in the server) is refused
    from the catalog, through psycopg and SQLAlchemy alike."""
    store = PostgresStore(pg_conninfo, pg_schema)
    try:
        votes, items = names()
        store.create(items, {"id": "int"}, [(1,)])
        store.sql(f'CREATE TABLE "{votes}" (client json, item bigint)')
        store.made.append(votes)
        text = (
            rf"PostgreSQL table '{votes}' column 'client' is json, which has no equality to "
            "group or join by: clients and item ids must be numbers, text or another "
            "comparable type"
        )
        refused(store, TypeError, text, votes, items)
    finally:
        store.close()


@pytest.mark.parametrize("dialect", ["sqlite", "postgres", "mariadb", "duckdb"])
def test_sqlalchemy_checks_the_votes_in_every_build_of_its_copy(
    request: pytest.FixtureRequest, dialect: str
) -> None:
    """SQLAlchemy counts in prepare(): a weight made negative, or a vote for a missing item,
    written after from_votes is refused by the next build, and the copy stays as it was."""
    store = SQLAlchemyStore(request.getfixturevalue(f"sqlalchemy_{dialect}_engine"), dialect)
    try:
        votes, items = names()
        store.create(items, {"id": "int"}, [(1,), (2,)])
        store.create(votes, {"client": "int", "item": "int", "w": "float"}, [(1, 1, 2.0)])
        source = store.from_votes(votes, items, weight="w", max_per_item=3)
        assert store.counts(source) == {1: 2.0, 2: 0.0}
        store.sql(f"INSERT INTO {store.quote(votes)} VALUES (1, 1, -1.0), (2, 1, 1.0)")
        with pytest.raises(ValueError, match=r"column 'w' has 1 negative, NaN or infinite"):
            source.prepare(refresh=True)
        store.sql(f"DELETE FROM {store.quote(votes)} WHERE w < 0")
        store.sql(f"INSERT INTO {store.quote(votes)} VALUES (3, 7, 1.0)")
        with pytest.raises(ValueError, match=r"1 vote\(s\) for items not in the items table"):
            source.prepare(refresh=True)
        store.sql(f"DELETE FROM {store.quote(votes)} WHERE item = 7")
        source.prepare(refresh=True)
        assert store.counts(source) == {1: 3.0, 2: 0.0}
    finally:
        store.close()


@pytest.mark.parametrize("dialect", ["sqlite", "postgres", "mariadb", "duckdb"])
def test_sqlalchemy_counts_votes_on_the_sql_store_engine(
    request: pytest.FixtureRequest, dialect: str
) -> None:
    """SQLAlchemyTable.from_votes is the SQL store engine's table (adapters/sql/engine.py) with
    the counting statement as its source: a run proves the copy current by comparing it with
    the counts, and after a vote has it rebuilt first (never reading the votes in its stead);
    the exact counts come from the copy, in its integer type."""
    store = SQLAlchemyStore(request.getfixturevalue(f"sqlalchemy_{dialect}_engine"), dialect)
    try:
        votes, items = names()
        store.create(items, {"id": "int"}, [(1,), (2,)])
        store.create(votes, {"client": "int", "item": "int"}, [(1, 1), (2, 1)])
        source = store.from_votes(votes, items)
        assert isinstance(source, SQLTable) and source.counts_query
        assert store.counts(source) == {1: 2.0, 2: 0.0}
        store.sql(f"INSERT INTO {store.quote(votes)} VALUES (3, 2), (4, 2), (5, 2)")
        with source.snapshot():
            assert source.run_freshness() == {
                "copy": "current", "proof": "compared", "refreshes": 1
            }  # fmt: skip
            assert source.read_exact_scores([2, 1]) == [3, 2]
    finally:
        store.close()


def test_the_count_keeps_each_contribution_between_0_and_the_bound() -> None:
    """The count itself clips a client's sum into [0, D]: a negative weight a writer adds
    after the checks (PostgreSQL READ COMMITTED, MariaDB) moves no count below the other
    clients' contributions (least(sum, D) alone would count item 1 as -6 here)."""
    from adapters.dialects.duckdb import DuckDBDialect
    from adapters.sql.driver import DuckDBDriver
    from adapters.sql.votes import count_votes

    con = duckdb.connect()
    con.execute("CREATE TABLE items AS SELECT range AS id FROM range(3)")
    con.execute("CREATE TABLE votes (client BIGINT, item BIGINT, w DOUBLE)")
    con.execute("INSERT INTO votes VALUES (1, 1, 2.0), (2, 1, 1.0)")
    counts = count_votes(
        DuckDBDialect(caller_connection=True),
        DuckDBDriver(con),
        votes="votes",
        items="items",
        schema=None,
        client="client",
        item="item",
        item_id="id",
        weight="w",
        max_per_item=1.5,
        max_items_per_client=None,
    )
    con.execute("INSERT INTO votes VALUES (1, 1, -9.0), (3, 2, 0.25)")  # after the checks
    got = dict(con.execute(counts.select, counts.params).fetchall())
    assert got == {0: 0.0, 1: 1.0, 2: 0.25}


@pytest.mark.parametrize(
    "bad",
    [
        {"votes": None},
        {"client": ""},
        {"item_id": 3},
        {"weight": 1},
        {"max_per_item": "2"},
    ],
)
def test_bad_names_are_refused_before_the_store_is_asked(bad: dict[str, Any]) -> None:
    con = duckdb.connect()
    options: dict[str, Any] = {"votes": "votes", "items": "items", **bad}
    with pytest.raises(TypeError, match="must be"):
        DuckDBTable.from_votes(con, options.pop("votes"), options.pop("items"), **options)


# ----- Spark: its own engine, the same checks and words ---------------------------------------
@pytest.mark.xdist_group("spark")
def test_spark_refuses_in_the_same_words(spark: Any) -> None:
    """Spark reads DataFrames, not a catalog, but its checks are contributions.py's: a text or
    boolean weight (not cast to NULL and counted as 0), dates against integer ids, a table that
    does not exist, a vote for a missing item."""
    from adapters.spark import SparkTable

    items = spark.createDataFrame([(1,), (2,)], "id BIGINT")
    for weight_type, value in (("STRING", "2"), ("BOOLEAN", True)):
        votes = spark.createDataFrame(
            [(1, 1, value)], f"client BIGINT, item BIGINT, w {weight_type}"
        )
        with pytest.raises(TypeError) as caught:
            SparkTable.from_votes(spark, votes, items, weight="w", max_per_item=2)
        assert str(caught.value) == (
            f"Spark DataFrame of votes column 'w' is {weight_type.lower()}: weights must be of "
            "a numeric type"
        )
    dated = spark.createDataFrame([(1, "2024-01-01")], "client BIGINT, item STRING").selectExpr(
        "client", "CAST(item AS DATE) AS item"
    )
    with pytest.raises(TypeError, match="item ids must be of one type"):
        SparkTable.from_votes(spark, dated, items)
    with pytest.raises(ValueError, match=r"^Spark table 'no_such_votes_x' does not exist$"):
        SparkTable.from_votes(spark, "no_such_votes_x", items)
    stray = spark.createDataFrame([(1, 99)], "client BIGINT, item BIGINT")
    with pytest.raises(ValueError) as caught:
        SparkTable.from_votes(spark, stray, items)
    assert str(caught.value) == (
        "Spark DataFrame of votes column 'item' has 1 vote(s) for items not in the items table "
        "(Spark DataFrame of items), e.g. '99': the items table must list every item (the "
        "public domain)"
    )
