"""Conformance stores: IbisTable (adapters/ibis.py) over three Ibis backends.

`make_ibis_duckdb_source`, `make_ibis_sqlite_source`, `make_ibis_postgres_source` write the
histogram into a table whose name and columns need quoting (tests/stores_duckdb.py,
tests/stores_postgres.py; SQLite here) and wrap `backend.table(name)` in an IbisTable; no copy,
no preparation. The writers commit a new score from a connection of their own: DuckDB and
PostgreSQL return True (new runs see it); SQLite returns False when the run's read transaction
holds the database (the writer waits 0.2 s, then gives up), True otherwise.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import ibis
import numpy as np
import psycopg
import pytest
from psycopg import sql

from adapters.ibis import IbisTable
from tests.helpers import shared_sources
from tests.stores_duckdb import create_table as create_duckdb_table
from tests.stores_postgres import create_table as create_postgres_table

TABLE = 'Vote "Counts" {}'
ID_COLUMN = "Item ID"
SCORE_COLUMN = "select"


def _duckdb_sources() -> Iterator[Callable[[Any, Any], IbisTable]]:
    raw = duckdb.connect()
    backend = ibis.duckdb.from_connection(raw)

    def make(scores: Any, ids: Any = None) -> IbisTable:
        name = TABLE.format(uuid.uuid4().hex[:8])
        create_duckdb_table(raw, name, scores, ids)
        source = IbisTable(backend.table(name), id=ID_COLUMN, score=SCORE_COLUMN)
        source.raw, source.table_name = raw, name  # for the writer
        return source

    yield make
    raw.close()


@pytest.fixture
def make_ibis_duckdb_source() -> Iterator[Callable[[Any, Any], IbisTable]]:
    yield from _duckdb_sources()


@pytest.fixture(scope="session")
def shared_ibis_duckdb_source() -> Iterator[Callable[[Any, Any], IbisTable]]:
    yield from shared_sources(_duckdb_sources())


@pytest.fixture
def write_ibis_duckdb_source() -> Callable[[IbisTable, Any, float], bool]:
    def write(source: IbisTable, item: Any, score: float) -> bool:
        writer = source.raw.cursor()
        try:
            writer.execute(
                f'UPDATE "{_quoted(source.table_name)}" SET "{SCORE_COLUMN}" = ? '
                f'WHERE "{ID_COLUMN}" = ?',
                [score, item],
            )
        finally:
            writer.close()
        return True

    return write


def _quoted(name: str) -> str:
    return name.replace('"', '""')


def create_sqlite_table(path: Path, name: str, scores: Any, ids: Any) -> None:
    scores = np.asarray(scores)
    ids = np.arange(len(scores)) if ids is None else np.asarray(ids)
    integral = bool(np.all(scores == np.round(scores)))
    text = not np.issubdtype(ids.dtype, np.integer)
    with sqlite3.connect(path) as conn:
        conn.execute(
            f'CREATE TABLE "{_quoted(name)}" ("{ID_COLUMN}" {"TEXT" if text else "INTEGER"} '
            f'PRIMARY KEY, "{SCORE_COLUMN}" {"INTEGER" if integral else "REAL"})'
        )
        conn.executemany(
            f'INSERT INTO "{_quoted(name)}" VALUES (?, ?)',
            zip(
                [str(v) for v in ids.tolist()] if text else ids.tolist(),
                [int(v) for v in scores.tolist()] if integral else scores.tolist(),
                strict=True,
            ),
        )
    conn.close()


def _sqlite_sources(folder: Path) -> Iterator[Callable[[Any, Any], IbisTable]]:
    path = folder / f"ibis_{uuid.uuid4().hex[:8]}.sqlite"
    backends: list[Any] = []

    def make(scores: Any, ids: Any = None) -> IbisTable:
        name = TABLE.format(uuid.uuid4().hex[:8])
        create_sqlite_table(path, name, scores, ids)
        backend = ibis.sqlite.connect(path)
        backends.append(backend)
        source = IbisTable(backend.table(name), id=ID_COLUMN, score=SCORE_COLUMN)
        source.path, source.table_name = path, name
        return source

    yield make
    for backend in backends:
        backend.disconnect()


@pytest.fixture
def make_ibis_sqlite_source(tmp_path: Path) -> Iterator[Callable[[Any, Any], IbisTable]]:
    yield from _sqlite_sources(tmp_path)


@pytest.fixture(scope="session")
def shared_ibis_sqlite_source(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[[Any, Any], IbisTable]]:
    yield from shared_sources(_sqlite_sources(tmp_path_factory.mktemp("ibis_sqlite")))


@pytest.fixture
def write_ibis_sqlite_source() -> Callable[[IbisTable, Any, float], bool]:
    def write(source: IbisTable, item: Any, score: float) -> bool:
        conn = sqlite3.connect(source.path, timeout=0.2)
        try:
            with conn:
                conn.execute(
                    f'UPDATE "{_quoted(source.table_name)}" SET "{SCORE_COLUMN}" = ? '
                    f'WHERE "{ID_COLUMN}" = ?',
                    (score, item),
                )
            return True
        except sqlite3.OperationalError as error:
            if "locked" not in str(error):
                raise
            return False  # the run's read transaction holds the database: nothing written
        finally:
            conn.close()

    return write


def _postgres_backend(conninfo: str) -> Any:
    parts = psycopg.conninfo.conninfo_to_dict(conninfo)
    return ibis.postgres.connect(
        host=parts.get("host"),
        port=int(parts.get("port", 5432)),
        database=parts.get("dbname"),
        user=parts.get("user"),
        password=parts.get("password"),
    )


def _postgres_sources(conninfo: str, schema: str) -> Iterator[Callable[[Any, Any], IbisTable]]:
    conn = psycopg.connect(conninfo, autocommit=True)
    backend = _postgres_backend(conninfo)
    made: list[str] = []

    def make(scores: Any, ids: Any = None) -> IbisTable:
        name = TABLE.format(uuid.uuid4().hex[:8])
        create_postgres_table(conn, schema, name, scores, ids)
        made.append(name)
        source = IbisTable(backend.table(name, database=schema), id=ID_COLUMN, score=SCORE_COLUMN)
        source.conninfo, source.schema, source.table_name = conninfo, schema, name
        return source

    yield make
    backend.disconnect()
    for name in made:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(schema, name)))
    conn.close()


@pytest.fixture
def make_ibis_postgres_source(
    pg_conninfo: str, pg_schema: str
) -> Iterator[Callable[[Any, Any], IbisTable]]:
    yield from _postgres_sources(pg_conninfo, pg_schema)


@pytest.fixture(scope="session")
def shared_ibis_postgres_source(
    pg_conninfo: str, pg_schema: str
) -> Iterator[Callable[[Any, Any], IbisTable]]:
    yield from shared_sources(_postgres_sources(pg_conninfo, pg_schema))


@pytest.fixture
def write_ibis_postgres_source() -> Callable[[IbisTable, Any, float], bool]:
    def write(source: IbisTable, item: Any, score: float) -> bool:
        with psycopg.connect(source.conninfo, autocommit=True) as writer:
            writer.execute(
                sql.SQL("UPDATE {} SET {} = %s WHERE {} = %s").format(
                    sql.Identifier(source.schema, source.table_name),
                    sql.Identifier(SCORE_COLUMN),
                    sql.Identifier(ID_COLUMN),
                ),
                (score, item),
            )
        return True

    return write
