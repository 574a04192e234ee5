"""Conformance store: PostgresTable on the PostgreSQL server at TOPK_PG_DSN.

TOPK_PG_DSN defaults to "host=127.0.0.1 port=5432 dbname=test". Each test session works in a
schema of its own (`topk_test_<random>`), dropped at the end. When the server is unreachable the
tests fail if the CI environment variable is set; otherwise a throwaway server is started with the
`pgserver` package if it is installed, else they are skipped with a message saying how to provide
one.

`make_postgres_source(scores, ids)` writes the histogram (COPY) into a table whose name and columns
need quoting, runs prepare() and returns the PostgresTable. `write_postgres_source(source, item,
score)` is a concurrent writer: on a connection of its own it sets the item's score and refreshes
the rank table, committed; it returns True (new runs see it). The session fixtures
`shared_postgres{,_live,_live_runs}_source` build one table per distinct histogram for the whole
session (tests/helpers.py shared_sources), for the conformance suite's read-only tests.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql

from adapters.postgres import MAX_SCORE_RUNS, PostgresTable
from tests.helpers import RefreshAfterTheRun, shared_sources

DEFAULT_PG_DSN = "host=127.0.0.1 port=5432 dbname=test"
TABLE = 'Vote "Counts" {}'
ID_COLUMN = "Item ID"
SCORE_COLUMN = "select"


def _connect(conninfo: str) -> psycopg.Connection[Any]:
    return psycopg.connect(conninfo, autocommit=True, connect_timeout=5)


@pytest.fixture(scope="session")
def pg_conninfo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A reachable server: TOPK_PG_DSN, or (outside CI) a throwaway pgserver, or a skip."""
    conninfo = os.environ.get("TOPK_PG_DSN", DEFAULT_PG_DSN)
    try:
        _connect(conninfo).close()
    except psycopg.OperationalError as error:
        message = f"PostgreSQL at TOPK_PG_DSN={conninfo!r} is unreachable ({error})"
        if os.environ.get("CI"):
            pytest.fail(message)
        try:
            import pgserver  # type: ignore[import-not-found]
        except ImportError:
            pytest.skip(
                f"{message}; set TOPK_PG_DSN to a server you may create schemas on, or "
                "`pip install pgserver` to let the tests start a throwaway one"
            )
        server = pgserver.get_server(tmp_path_factory.mktemp("pgserver"), cleanup_mode="stop")
        yield server.get_uri()
        server.cleanup()
        return
    yield conninfo


@pytest.fixture(scope="session")
def pg_schema(pg_conninfo: str) -> Iterator[str]:
    """A schema of this test session, dropped with everything in it at the end."""
    schema = f"topk_test_{uuid.uuid4().hex[:10]}"
    with _connect(pg_conninfo) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    yield schema
    with _connect(pg_conninfo) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def create_table(conn: psycopg.Connection[Any], schema: str, name: str, scores: Any, ids: Any):
    """(ID_COLUMN, SCORE_COLUMN): bigint or text ids, bigint scores if all whole, else float8."""
    scores = np.asarray(scores)
    ids = np.arange(len(scores)) if ids is None else np.asarray(ids)
    integral = bool(np.all(np.isfinite(scores)) and np.all(scores == np.round(scores)))
    text = not np.issubdtype(ids.dtype, np.integer)
    table = sql.Identifier(schema, name)
    conn.execute(
        sql.SQL("CREATE TABLE {} ({} {}, {} {})").format(
            table,
            sql.Identifier(ID_COLUMN),
            sql.SQL("text" if text else "bigint"),
            sql.Identifier(SCORE_COLUMN),
            sql.SQL("bigint" if integral else "float8"),
        )
    )
    id_values = [str(v) for v in ids.tolist()] if text else ids.tolist()
    score_values = [int(v) for v in scores.tolist()] if integral else scores.tolist()
    with conn.cursor() as cur, cur.copy(sql.SQL("COPY {} FROM STDIN").format(table)) as copy:
        for row in zip(id_values, score_values, strict=True):
            copy.write_row(row)


@pytest.fixture
def make_postgres_source(
    pg_conninfo: str, pg_schema: str
) -> Iterator[Callable[[Any, Any], PostgresTable]]:
    yield from _copy_sources(pg_conninfo, pg_schema)


@pytest.fixture(scope="session")
def shared_postgres_source(
    pg_conninfo: str, pg_schema: str
) -> Iterator[Callable[[Any, Any], PostgresTable]]:
    yield from shared_sources(_copy_sources(pg_conninfo, pg_schema))


def _copy_sources(
    pg_conninfo: str, pg_schema: str
) -> Iterator[Callable[[Any, Any], PostgresTable]]:
    made: list[PostgresTable] = []
    conn = _connect(pg_conninfo)

    def make(scores: Any, ids: Any = None) -> PostgresTable:
        name = TABLE.format(uuid.uuid4().hex[:8])
        create_table(conn, pg_schema, name, scores, ids)
        source = PostgresTable(  # frozen: these tests are of the copy (test_freshness.py: not)
            pg_conninfo, name, id=ID_COLUMN, score=SCORE_COLUMN, schema=pg_schema, frozen=True
        )
        made.append(source)
        source.prepare()
        return source

    yield make
    for source in made:
        source.close()
        for table in (source.runs_table, source.rank_table, source.table):
            drop = sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(pg_schema, table))
            conn.execute(drop)
    conn.close()


def set_score(
    conn: psycopg.Connection[Any], source: PostgresTable, item: Any, score: float
) -> None:
    """Commit a new score for one item of the source's table (conn is in autocommit)."""
    conn.execute(
        sql.SQL("UPDATE {} SET {} = %s WHERE {} = %s").format(
            sql.Identifier(source.schema, source.table),
            sql.Identifier(SCORE_COLUMN),
            sql.Identifier(ID_COLUMN),
        ),
        [score, item],
    )


@pytest.fixture
def write_postgres_source(
    pg_conninfo: str,
) -> Callable[[PostgresTable, Any, float], RefreshAfterTheRun]:
    def write(source: PostgresTable, item: Any, score: float) -> RefreshAfterTheRun:
        with _connect(pg_conninfo) as conn:
            set_score(conn, source, item, score)

        def refresh() -> None:  # waits for the run, which reads the old tables, to end
            writer = PostgresTable(
                pg_conninfo, source.table, id=ID_COLUMN, score=SCORE_COLUMN, schema=source.schema
            )
            writer.prepare(refresh=True, swap_timeout=60)
            writer.close()

        return RefreshAfterTheRun(refresh)

    return write


@pytest.fixture
def make_postgres_live_source(
    pg_conninfo: str, pg_schema: str
) -> Iterator[Callable[[Any, Any], PostgresTable]]:
    """PostgresTable(mode='live') whose positions are the input indexes: the table is created
    with every row (so the column types fit them all), cut to its first row, prepared (which
    installs the position triggers), and the other rows are copied in input order, each taking
    the next position; the position table read back must show it. Runs of tied scores are off
    (`max_score_runs=0`): every histogram takes the position table."""
    yield from _live_sources(pg_conninfo, pg_schema, max_score_runs=0)


@pytest.fixture
def make_postgres_live_runs_source(
    pg_conninfo: str, pg_schema: str
) -> Iterator[Callable[[Any, Any], PostgresTable]]:
    """As make_postgres_live_source, with the default `max_score_runs=MAX_SCORE_RUNS`: on a
    histogram of few distinct scores its runs serve positions = canonical ranks (int-ties,
    text-ties, plateau),
    on one of many the position table's input order (zipf, fractional); the suite's
    reference_for asks the store which."""
    yield from _live_sources(pg_conninfo, pg_schema, max_score_runs=MAX_SCORE_RUNS)


@pytest.fixture(scope="session")
def shared_postgres_live_source(
    pg_conninfo: str, pg_schema: str
) -> Iterator[Callable[[Any, Any], PostgresTable]]:
    yield from shared_sources(_live_sources(pg_conninfo, pg_schema, max_score_runs=0))


@pytest.fixture(scope="session")
def shared_postgres_live_runs_source(
    pg_conninfo: str, pg_schema: str
) -> Iterator[Callable[[Any, Any], PostgresTable]]:
    yield from shared_sources(_live_sources(pg_conninfo, pg_schema, max_score_runs=MAX_SCORE_RUNS))


def _live_sources(
    pg_conninfo: str, pg_schema: str, **options: Any
) -> Iterator[Callable[[Any, Any], PostgresTable]]:
    made: list[PostgresTable] = []
    conn = _connect(pg_conninfo)

    def make(scores: Any, ids: Any = None) -> PostgresTable:
        name = TABLE.format(uuid.uuid4().hex[:8])
        scores = np.asarray(scores)
        ids = np.arange(len(scores)) if ids is None else np.asarray(ids)
        create_table(conn, pg_schema, name, scores, ids)
        table = sql.Identifier(pg_schema, name)
        conn.execute(sql.SQL("TRUNCATE {}").format(table))
        integral = bool(np.all(np.isfinite(scores)) and np.all(scores == np.round(scores)))
        text = not np.issubdtype(ids.dtype, np.integer)
        rows = [
            (str(item) if text else item, int(score) if integral else score)
            for item, score in zip(ids.tolist(), scores.tolist(), strict=True)
        ]
        copy_in = sql.SQL("COPY {} FROM STDIN").format(table)
        with conn.cursor() as cur, cur.copy(copy_in) as copy:
            copy.write_row(rows[0])
        source = PostgresTable(
            pg_conninfo,
            name,
            id=ID_COLUMN,
            score=SCORE_COLUMN,
            schema=pg_schema,
            mode="live",
            **options,
        )
        made.append(source)
        source.prepare()
        with conn.cursor() as cur, cur.copy(copy_in) as copy:
            for row in rows[1:]:
                copy.write_row(row)
        order = conn.execute(
            sql.SQL("SELECT id FROM {} ORDER BY position").format(
                sql.Identifier(pg_schema, source.position_table)
            )
        ).fetchall()
        assert [r[0] for r in order] == [row[0] for row in rows], (
            "copied rows did not take positions in input order"
        )
        return source

    yield make
    for source in made:
        source.close()
        conn.execute(
            sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(
                sql.Identifier(pg_schema, source.table)
            )
        )
        conn.execute(
            sql.SQL("DROP TABLE IF EXISTS {}").format(
                sql.Identifier(pg_schema, source.position_table)
            )
        )
        conn.execute(
            sql.SQL("DROP FUNCTION IF EXISTS {}()").format(
                sql.Identifier(pg_schema, source.trigger_function)
            )
        )
    conn.close()


@pytest.fixture
def write_postgres_live_source(pg_conninfo: str) -> Callable[[PostgresTable, Any, float], bool]:
    """A concurrent writer: commits a new score for one item; a live table needs nothing more."""

    def write(source: PostgresTable, item: Any, score: float) -> bool:
        with _connect(pg_conninfo) as conn:
            set_score(conn, source, item, score)
        return True

    return write


write_postgres_live_runs_source = write_postgres_live_source  # a live table needs nothing more
