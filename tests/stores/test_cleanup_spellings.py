"""Cleanup never harms the user's table, whatever spelling of its name was used.

On every store, through the command line (`topk-middleware prepare` then `unprepare`, in this
process): the table is prepared under one spelling of its name and unprepared under another
(`t`, `T`, `"t"`, `s.t`, `S.T`, `"s"."t"`, ...: each spelling in turn, the next one cleans up),
and a prepare refused by a NULL score is followed by an unprepare. After each cleanup the
table takes INSERT, UPDATE and DELETE and its rows are as before, and the catalog (tables,
views, indexes, triggers, functions; SQLite's sqlite_stat1 included) is exactly what it was
before the first prepare.

What would fail: an object name derived from the spelling rather than from the table (prepare
as `public.t`, unprepare as `t` dropped the position table and left the triggers, which then
failed every INSERT with `relation ... does not exist`); a refused prepare that leaves its
write log, rank table or triggers behind; an sqlite_stat1 table made by prepare.

Stores: PostgreSQL (psycopg, copy and live mode) at TOPK_PG_DSN, a DuckDB file, SQLite (copy
and live), MariaDB at TOPK_MARIADB_URL (copy and live), Spark (the test run's local session, a
catalog table). Cost: about 40 CLI calls on tables of 20 rows, a few seconds a store.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import duckdb
import psycopg
import pytest
import sqlalchemy as sa

from frontends.cli import EXIT_FAILED, EXIT_OK, main
from tests.frontends.test_cli import postgres_uri
from tests.stores.test_uninstall import PG_DSN, _duckdb_catalog, _pg_catalog, _sa_catalog
from tests.stores_sqlalchemy import DEFAULT_MARIADB_URL

ROWS = [(i, 3 * i) for i in range(1, 21)]


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """(exit code, stderr) of `topk-middleware argv`."""
    try:
        code = main(list(argv))
    except SystemExit as stop:
        code = int(stop.code or 0)
    return code, capsys.readouterr().err


def cycle(
    capsys: pytest.CaptureFixture[str],
    url: str,
    mode: str,
    spellings: list[str],
    catalog: Callable[[], set[Any]],
    execute: Callable[[str], None],
    rows: Callable[[], list[Any]],
    null: str | None = "INSERT INTO {t} VALUES (-1, NULL)",
    table: str = "t",
    writes: tuple[str, ...] = (
        "INSERT INTO {t} VALUES (1000, 7)",
        "UPDATE {t} SET score = score + 1 WHERE id = 1000",
        "DELETE FROM {t} WHERE id = 1000",
    ),
) -> None:
    """Prepare under each spelling, unprepare under the next; then a refused prepare and an
    unprepare under each spelling. After each: the writes succeed, rows and catalog as before."""
    before, kept = catalog(), rows()
    assert kept, "the table is empty"

    def unharmed(after: str) -> None:
        for statement in writes:
            execute(statement.format(t=table))  # raises if a trigger of prepare() was left
        assert rows() == kept, after
        assert catalog() == before, f"{after}: left behind {catalog() - before}"

    for i, spelling in enumerate(spellings):
        other = spellings[(i + 1) % len(spellings)]
        code, err = cli(capsys, "prepare", url, "--table", spelling, "--mode", mode)
        assert code == EXIT_OK, err
        assert catalog() - before, f"prepare as {spelling} made nothing"
        code, err = cli(capsys, "unprepare", url, "--table", other, "--mode", mode)
        assert code == EXIT_OK, err
        unharmed(f"prepare as {spelling}, unprepare as {other}")
    if null is None:
        return
    execute(null.format(t=table))
    null_rows = rows()
    kept, before = null_rows, catalog()
    for spelling in spellings:
        code, err = cli(capsys, "prepare", url, "--table", spelling, "--mode", mode)
        assert code == EXIT_FAILED and "NULL" in err, err
        assert catalog() == before, f"refused prepare as {spelling} left {catalog() - before}"
        code, err = cli(capsys, "unprepare", url, "--table", spelling, "--mode", mode)
        assert code == EXIT_OK, err
        unharmed(f"refused prepare, unprepare as {spelling}")


# ----- PostgreSQL --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["copy", "live"])
def test_postgres_every_spelling(mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    schema = f"spell_{uuid.uuid4().hex[:8]}"
    conn = psycopg.connect(PG_DSN, autocommit=True)
    conn.execute(f"CREATE SCHEMA {schema}")
    try:
        conn.execute(f"SET search_path = {schema}")
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, score bigint)")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO t VALUES (%s, %s)", ROWS)
        # unqualified spellings find the table through the search path, as a user's would
        url = postgres_uri(PG_DSN)
        url += ("&" if "?" in url else "?") + "options=" + quote(f"-csearch_path={schema}")
        s = schema
        spellings = [f"{s}.t", "t", "T", '"t"', f"{s.upper()}.T", f'"{s}"."t"', f'{s}."t"']
        cycle(
            capsys,
            url,
            mode,
            spellings,
            _pg_catalog(conn, schema),
            lambda statement: conn.execute(statement),
            lambda: sorted(conn.execute("SELECT * FROM t").fetchall(), key=repr),
        )
    finally:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
        conn.close()


def test_install_sql_source_then_the_documented_cleanup(capsys: pytest.CaptureFixture[str]) -> None:
    """`install-sql --source public.word_counts` (live mode), `uninstall-sql`, then the cleanup
    uninstall-sql names, `unprepare URL --table word_counts --mode live`: the table takes
    writes and the catalog is as before. A database of its own (the schema topk is one per
    database). Cost: one install, about 2 s."""
    name = f"topk_spell_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    dsn = psycopg.conninfo.make_conninfo(PG_DSN, dbname=name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE word_counts (id bigint PRIMARY KEY, score bigint)")
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO word_counts VALUES (%s, %s)", ROWS)
            catalog = _pg_catalog(conn, "public")
            before = catalog()
            argv = ["install-sql", "--dsn", dsn, "--source", "public.word_counts"]
            assert cli(capsys, *argv)[0] == EXIT_OK
            assert cli(capsys, "uninstall-sql", "--dsn", dsn)[0] == EXIT_OK
            assert catalog() - before  # the live structures stay until unprepare
            url = postgres_uri(dsn)
            argv = ["unprepare", url, "--table", "word_counts", "--mode", "live"]
            assert cli(capsys, *argv)[0] == EXIT_OK
            assert catalog() == before, f"left behind {catalog() - before}"
            conn.execute("INSERT INTO word_counts VALUES (1000, 7)")
            conn.execute("DELETE FROM word_counts WHERE id = 1000")
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# ----- DuckDB ------------------------------------------------------------------------------------
def test_duckdb_every_spelling(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.duckdb"

    def execute(statement: str) -> None:
        with duckdb.connect(str(path)) as con:
            con.execute(statement)

    def rows() -> list[Any]:
        with duckdb.connect(str(path)) as con:
            return sorted(con.execute("SELECT * FROM t").fetchall(), key=repr)

    def catalog() -> set[Any]:
        with duckdb.connect(str(path)) as con:
            return _duckdb_catalog(con)()

    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE t (id BIGINT, score BIGINT)")
        con.executemany("INSERT INTO t VALUES (?, ?)", ROWS)
    spellings = ["t", "T", '"t"', "main.t", 'MAIN."T"']
    cycle(capsys, str(path), "copy", spellings, catalog, execute, rows)


# ----- SQLite and MariaDB (SQLAlchemy) -----------------------------------------------------------
@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[tuple[sa.Engine, str]]:
    url = f"sqlite:///{tmp_path / 'c.sqlite'}"
    engine = sa.create_engine(url)
    yield engine, url
    engine.dispose()


def _sa_rows(engine: sa.Engine, table: str) -> Callable[[], list[Any]]:
    def rows() -> list[Any]:
        with engine.connect() as conn:
            return sorted(map(tuple, conn.exec_driver_sql(f"SELECT * FROM {table}")), key=repr)

    return rows


def _sa_execute(engine: sa.Engine) -> Callable[[str], None]:
    def execute(statement: str) -> None:
        with engine.begin() as conn:
            conn.exec_driver_sql(statement)

    return execute


@pytest.mark.parametrize("mode", ["copy", "live"])
def test_sqlite_every_spelling(
    mode: str, sqlite_engine: tuple[sa.Engine, str], capsys: pytest.CaptureFixture[str]
) -> None:
    engine, url = sqlite_engine
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (id INTEGER PRIMARY KEY, score INTEGER)")
        conn.exec_driver_sql("INSERT INTO t VALUES " + ", ".join(map(str, ROWS)))

    def catalog() -> set[Any]:  # sqlite_stat1 counted: prepare() does not make it
        with engine.connect() as conn:
            return set(conn.exec_driver_sql("SELECT type, name, tbl_name FROM sqlite_master"))

    spellings = ["t", "T", '"t"', "main.t", 'MAIN."T"']
    cycle(capsys, url, mode, spellings, catalog, _sa_execute(engine), _sa_rows(engine, "t"))


def test_sqlite_keeps_the_owners_statistics(
    sqlite_engine: tuple[sa.Engine, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Where the owner keeps statistics (ANALYZE made sqlite_stat1), prepare refreshes them for
    what it builds and unprepare leaves the table with the owner's rows."""
    engine, url = sqlite_engine
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (id INTEGER PRIMARY KEY, score INTEGER)")
        conn.exec_driver_sql("CREATE INDEX t_score ON t (score)")
        conn.exec_driver_sql("INSERT INTO t VALUES " + ", ".join(map(str, ROWS)))
        conn.exec_driver_sql("ANALYZE")
    stats = "SELECT tbl, idx FROM sqlite_stat1 ORDER BY 1, 2"
    with engine.connect() as conn:
        owners = list(conn.exec_driver_sql(stats))
    assert owners
    assert cli(capsys, "prepare", url, "--table", "t")[0] == EXIT_OK
    with engine.connect() as conn:
        assert len(list(conn.exec_driver_sql(stats))) > len(owners)  # the copy's, analysed
    assert cli(capsys, "unprepare", url, "--table", "T")[0] == EXIT_OK
    with engine.connect() as conn:
        assert list(conn.exec_driver_sql(stats)) == owners


@pytest.mark.parametrize("mode", ["copy", "live"])
def test_mariadb_every_spelling(mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    """MariaDB keeps the case of table names (lower_case_table_names = 0 on Linux) and quotes
    with backticks: the spellings are the name and database.name."""
    url = os.environ.get("TOPK_MARIADB_URL", DEFAULT_MARIADB_URL)
    engine = sa.create_engine(url)
    name = f"spell_{uuid.uuid4().hex[:8]}"
    database = engine.url.database
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE TABLE {name} (id BIGINT PRIMARY KEY, score BIGINT)")
            conn.exec_driver_sql(f"INSERT INTO {name} VALUES " + ", ".join(map(str, ROWS)))
        cycle(
            capsys,
            url,
            mode,
            [name, f"{database}.{name}"],
            _sa_catalog(engine, None, name),
            _sa_execute(engine),
            _sa_rows(engine, name),
            table=name,
        )
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
        engine.dispose()


# ----- Spark -------------------------------------------------------------------------------------
@pytest.mark.xdist_group("spark")
def test_spark_every_spelling(spark: Any) -> None:
    """A catalog table's copy is named from the catalog's spelling (database.table): prepared
    as `T`, uninstalled as `default.t` (and so on), nothing of it stays in the warehouse; a
    prepare refused by a NULL score writes nothing. Spark has no command line here: SparkTable
    itself. The catalog: the warehouse's files but the table's own."""
    from adapters.spark import SparkTable

    name = f"spell_{uuid.uuid4().hex[:8]}"
    warehouse = Path(spark.conf.get("spark.sql.warehouse.dir").removeprefix("file:"))
    spark.createDataFrame(ROWS, "id BIGINT, score BIGINT").write.saveAsTable(name)

    def catalog() -> set[str]:
        files = {str(p.relative_to(warehouse)) for p in warehouse.rglob("*") if p.is_file()}
        return {f for f in files if not f.startswith(f"{name}/")}

    def rows() -> list[Any]:
        return sorted(map(tuple, spark.table(name).collect()))

    try:
        before, kept = catalog(), rows()
        spellings = [name.upper(), f"default.{name}", f"`default`.`{name}`", name]
        for i, spelling in enumerate(spellings):
            SparkTable(spark, spelling).prepare()
            assert catalog() - before, f"prepare as {spelling} wrote no copy"
            SparkTable(spark, spellings[(i + 1) % len(spellings)]).uninstall()
            assert catalog() == before, f"prepare as {spelling}: left {catalog() - before}"
        spark.sql(f"INSERT INTO {name} VALUES (1000, 7)")
        assert rows() == sorted([*kept, (1000, 7)])
        spark.sql(f"INSERT INTO {name} VALUES (-1, NULL)")
        with pytest.raises(ValueError, match="NULL"):
            SparkTable(spark, name).prepare()
        assert catalog() == before
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")
