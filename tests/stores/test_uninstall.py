"""uninstall() removes everything prepare() made, on every store and mode, and nothing else.

Each test lists the store's catalog (tables, views, indexes, triggers, functions) before
prepare(), checks that prepare() added objects, runs uninstall(), and checks that the catalog is
exactly what it was before: the table of counts and its rows untouched, an index the table had
before kept. Also: uninstall() is idempotent, refuses a rank table prepare() did not build (a
user's table of that name survives), and a release after uninstall() needs prepare() again.
Servers: PostgreSQL at TOPK_PG_DSN, MariaDB at TOPK_MARIADB_URL (as tests/stores_*.py); Spark:
the test run's local session (tests/stores_spark.py), its test in the "spark" group.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import duckdb
import numpy as np
import psycopg
import pytest
import sqlalchemy as sa

from adapters._sql import RankTableMismatchError
from adapters.duckdb import DuckDBTable
from adapters.postgres import PostgresTable
from adapters.sqlalchemy import SQLAlchemyTable
from tests.stores_postgres import DEFAULT_PG_DSN
from tests.stores_sqlalchemy import DEFAULT_MARIADB_URL, postgres_url_and_args
from topk_middleware.access import AccessError
from topk_middleware.api import private_top_k

M = 200
SCORES = np.random.default_rng(3).permutation(M).astype(np.int64) * 3
IDS = np.arange(1000, 1000 + M)
PG_DSN = os.environ.get("TOPK_PG_DSN", DEFAULT_PG_DSN)


def _rows(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted(rows, key=repr)


def _check_cycle(catalog: Callable[[], set[Any]], source: Any, counts: Callable[[], Any]) -> None:
    """prepare() adds to the catalog, uninstall() brings it back exactly, twice over."""
    before, rows = catalog(), counts()
    source.prepare()
    made = catalog() - before
    assert made, "prepare() made no catalog object"
    assert before <= catalog()
    top = private_top_k(source, k=3, epsilon=30.0, seed=1).items
    source.uninstall()
    assert catalog() == before, f"left behind: {catalog() - before}"
    assert counts() == rows
    source.uninstall()  # idempotent
    assert catalog() == before
    source.prepare()  # and prepare() works again
    assert private_top_k(source, k=3, epsilon=30.0, seed=1).items == top
    source.uninstall()
    assert catalog() == before


# ----- DuckDB ------------------------------------------------------------------------------------
def _duckdb_catalog(con: duckdb.DuckDBPyConnection) -> Callable[[], set[Any]]:
    def catalog() -> set[Any]:
        found: set[Any] = set()
        for kind, query in (
            ("table", "SELECT schema_name, table_name, comment FROM duckdb_tables()"),
            ("view", "SELECT schema_name, view_name FROM duckdb_views() WHERE NOT internal"),
            ("index", "SELECT schema_name, index_name, table_name FROM duckdb_indexes()"),
            ("sequence", "SELECT schema_name, sequence_name FROM duckdb_sequences()"),
        ):
            found |= {(kind, *row) for row in con.execute(query).fetchall()}
        return found

    return catalog


def test_duckdb_uninstall_after_prepare_and_refresh(tmp_path: Any) -> None:
    con = duckdb.connect(str(tmp_path / "u.duckdb"))
    con.execute("CREATE TABLE votes (id BIGINT, score BIGINT)")
    con.executemany(
        "INSERT INTO votes VALUES (?, ?)", list(zip(IDS.tolist(), SCORES.tolist(), strict=True))
    )
    con.execute("CREATE TABLE other (x INT)")  # a bystander
    catalog = _duckdb_catalog(con)
    source = DuckDBTable(con, "votes")
    counts = lambda: _rows(con.execute("SELECT * FROM votes").fetchall())  # noqa: E731
    _check_cycle(catalog, source, counts)
    # with a pending delta (refresh by delta makes the shadow, delta and skip tables)
    before = catalog()
    source.prepare()
    con.execute("UPDATE votes SET score = score + 1 WHERE id = 1000")
    source.refresh()
    assert {row[2] for row in catalog() - before} >= {
        source.shadow_table,
        source.delta_table,
        source.skip_table,
    }
    source.uninstall()
    assert catalog() == before


def test_duckdb_uninstall_refuses_a_table_prepare_did_not_build(tmp_path: Any) -> None:
    con = duckdb.connect(str(tmp_path / "u.duckdb"))
    con.execute("CREATE TABLE votes AS SELECT range AS id, range AS score FROM range(10)")
    source = DuckDBTable(con, "votes")
    con.execute(f'CREATE TABLE "{source.rank_table}" (rank BIGINT, id BIGINT, score DOUBLE)')
    with pytest.raises(RankTableMismatchError, match="not built by prepare"):
        source.uninstall()
    assert con.execute(f'SELECT count(*) FROM "{source.rank_table}"').fetchone() == (0,)


# ----- PostgreSQL (psycopg) ----------------------------------------------------------------------
@pytest.fixture
def pg_schema() -> Iterator[tuple[psycopg.Connection[Any], str]]:
    conn = psycopg.connect(PG_DSN, autocommit=True)
    schema = f"uninst_{uuid.uuid4().hex[:10]}"
    conn.execute(f"CREATE SCHEMA {schema}")
    conn.execute(f"CREATE TABLE {schema}.votes (id bigint PRIMARY KEY, score bigint NOT NULL)")
    with conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {schema}.votes VALUES (%s, %s)",
            list(zip(IDS.tolist(), SCORES.tolist(), strict=True)),
        )
    try:
        yield conn, schema
    finally:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
        conn.close()


def _pg_catalog(conn: psycopg.Connection[Any], schema: str) -> Callable[[], set[Any]]:
    def catalog() -> set[Any]:
        relations = conn.execute(
            "SELECT 'relation', c.relkind::text, c.relname, "
            "coalesce(obj_description(c.oid, 'pg_class'), '') FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s",
            [schema],
        ).fetchall()
        triggers = conn.execute(
            "SELECT 'trigger', t.tgname, c.relname, '' FROM pg_trigger t JOIN pg_class c ON "
            "c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND NOT t.tgisinternal",
            [schema],
        ).fetchall()
        functions = conn.execute(
            "SELECT 'function', p.proname, '', '' FROM pg_proc p JOIN pg_namespace n "
            "ON n.oid = p.pronamespace WHERE n.nspname = %s",
            [schema],
        ).fetchall()
        return set(relations) | set(triggers) | set(functions)

    return catalog


@pytest.mark.parametrize("mode", ["copy", "live"])
def test_postgres_uninstall(pg_schema: tuple[psycopg.Connection[Any], str], mode: str) -> None:
    conn, schema = pg_schema
    source = PostgresTable(PG_DSN, "votes", schema=schema, mode=mode)
    counts = lambda: _rows(conn.execute(f"SELECT * FROM {schema}.votes").fetchall())  # noqa: E731
    try:
        _check_cycle(_pg_catalog(conn, schema), source, counts)
    finally:
        source.close()


def test_postgres_live_uninstall_drops_the_id_index_it_made(
    pg_schema: tuple[psycopg.Connection[Any], str],
) -> None:
    conn, schema = pg_schema
    conn.execute(f"ALTER TABLE {schema}.votes DROP CONSTRAINT votes_pkey")
    catalog = _pg_catalog(conn, schema)
    before = catalog()
    source = PostgresTable(PG_DSN, "votes", schema=schema, mode="live")
    try:
        source.prepare()
        names = {row[2] for row in catalog() - before}
        assert {source.order_index, source.live_id_index} <= names
        source.uninstall()
        assert catalog() == before
    finally:
        source.close()


def test_postgres_uninstall_refuses_a_table_prepare_did_not_build(
    pg_schema: tuple[psycopg.Connection[Any], str],
) -> None:
    conn, schema = pg_schema
    source = PostgresTable(PG_DSN, "votes", schema=schema)
    try:
        conn.execute(f'CREATE TABLE {schema}."{source.rank_table}" (rank bigint)')
        with pytest.raises(RankTableMismatchError, match="not built by prepare"):
            source.uninstall()
        assert conn.execute(f"SELECT to_regclass('{schema}.\"{source.rank_table}\"')").fetchone()[0]
    finally:
        source.close()


# ----- SQLAlchemy: SQLite, PostgreSQL, MariaDB, DuckDB -------------------------------------------
def _engine(dialect: str, tmp_path: Any) -> sa.Engine:
    if dialect == "sqlite":
        return sa.create_engine(f"sqlite:///{tmp_path / 'u.sqlite'}")
    if dialect == "duckdb":
        return sa.create_engine(f"duckdb:///{tmp_path / 'u.duckdb'}")
    if dialect == "postgresql":
        url, args = postgres_url_and_args()
        return sa.create_engine(url, connect_args=args)
    return sa.create_engine(os.environ.get("TOPK_MARIADB_URL", DEFAULT_MARIADB_URL))


def _sa_catalog(engine: sa.Engine, schema: str | None, name: str = "") -> Callable[[], set[Any]]:
    """The catalog objects of the database (MariaDB: those naming the table `name`, since the
    database is shared with the tests of other workers; routines all)."""

    def catalog() -> set[Any]:
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                # sqlite_stat1 is SQLite's own statistics table (ANALYZE makes it once per file;
                # the rows of a dropped table go with it): not an object of prepare()'s.
                rows = conn.exec_driver_sql(
                    "SELECT type, name, tbl_name FROM sqlite_master "
                    "WHERE name NOT LIKE 'sqlite_stat%'"
                )
                return set(rows.fetchall())
            if engine.dialect.name in ("mysql", "mariadb"):
                found: set[Any] = set()
                for kind, query in (
                    ("table", "SELECT table_name, '' FROM information_schema.tables"),
                    ("index", "SELECT index_name, table_name FROM information_schema.statistics"),
                    (
                        "trigger",
                        "SELECT trigger_name, event_object_table FROM information_schema.triggers",
                    ),
                    ("routine", "SELECT routine_name, '' FROM information_schema.routines"),
                ):
                    where = (
                        "trigger_schema" if kind == "trigger" else
                        "routine_schema" if kind == "routine" else "table_schema"
                    )  # fmt: skip
                    rows = conn.exec_driver_sql(f"{query} WHERE {where} = DATABASE()")
                    found |= {
                        (kind, *row)
                        for row in rows.fetchall()
                        if kind == "routine" or any(name in str(value) for value in row)
                    }
                return found
            if engine.dialect.name == "duckdb":  # duckdb-engine does not reflect indexes
                tables = conn.exec_driver_sql("SELECT 'table', table_name FROM duckdb_tables()")
                indexes = conn.exec_driver_sql(
                    "SELECT 'index', table_name, index_name FROM duckdb_indexes()"
                )
                return set(tables.fetchall()) | set(indexes.fetchall())
            inspector = sa.inspect(conn)
            found = set()
            for table in inspector.get_table_names(schema=schema):
                found.add(("table", table))
                for index in inspector.get_indexes(table, schema=schema):
                    found.add(("index", table, index["name"]))
            return found

    return catalog


@pytest.mark.parametrize(
    ("dialect", "mode"),
    [
        ("sqlite", "copy"),
        ("sqlite", "live"),
        ("postgresql", "copy"),
        ("postgresql", "live"),
        ("mariadb", "copy"),
        ("mariadb", "live"),
        ("duckdb", "copy"),
    ],
)
def test_sqlalchemy_uninstall(dialect: str, mode: str, tmp_path: Any) -> None:
    engine = _engine(dialect, tmp_path)
    name = f"votes_{uuid.uuid4().hex[:8]}"
    schema = None
    try:
        if dialect == "postgresql":
            schema = f"uninst_{uuid.uuid4().hex[:10]}"
            with engine.begin() as conn:
                conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
        table = sa.Table(
            name,
            sa.MetaData(),
            sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("score", sa.BigInteger, nullable=False),
            schema=schema,
        )
        with engine.begin() as conn:
            table.create(conn)
            conn.execute(
                sa.insert(table),
                [{"id": i, "score": s} for i, s in zip(IDS.tolist(), SCORES.tolist(), strict=True)],
            )
        catalog = _sa_catalog(engine, schema, name)
        source = SQLAlchemyTable(engine, name, schema=schema, mode=mode)

        def counts() -> list[tuple[Any, ...]]:
            with engine.connect() as conn:
                return _rows([tuple(r) for r in conn.execute(sa.select(table)).fetchall()])

        _check_cycle(catalog, source, counts)
    finally:
        with engine.begin() as conn:
            if schema is not None:
                conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
            elif dialect == "mariadb":
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
        engine.dispose()


# ----- Spark -----------------------------------------------------------------------------------
@pytest.mark.xdist_group("spark")
def test_spark_uninstall_every_version(spark: Any, tmp_path: Any) -> None:
    """Every version, its runs and the manifests go, wherever the copy lives (here a `file:`
    URI, through Hadoop's FileSystem); the source and a bystander file stay. The storage is
    the catalog: the files under the copy's parent, but the source's, listed before and after."""
    from adapters.spark import SparkTable

    rows = [(int(i), int(s)) for i, s in zip(IDS.tolist(), SCORES.tolist(), strict=True)]
    path = str(tmp_path / "votes")
    spark.createDataFrame(rows, "id BIGINT, score BIGINT").write.parquet(path)
    (tmp_path / "bystander.txt").write_text("kept")

    def catalog() -> set[Any]:  # every file but the source's (checked by counts)
        found = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
        return {f for f in found if not f.startswith("votes/")}

    source = SparkTable(spark, path, copy=f"file:{tmp_path}/votes-copy", keep=3)
    counts = lambda: _rows(spark.read.parquet(path).collect())  # noqa: E731
    _check_cycle(catalog, source, counts)
    before = catalog()
    source.prepare()
    scores = [(i, (s + 7) % 601) for i, s in rows]  # a second version
    spark.createDataFrame(scores, "id BIGINT, score BIGINT").write.mode("overwrite").parquet(path)
    source.prepare(refresh=True)
    assert len({p.split("/")[1] for p in catalog() - before if p.startswith("votes-copy/v=")}) == 2
    source.uninstall()
    assert catalog() == before and not (tmp_path / "votes-copy").exists()
    with pytest.raises(AccessError, match="call prepare"):
        private_top_k(source, k=1, epsilon=1.0, seed=0)
