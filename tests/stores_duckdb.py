"""Conformance store: DuckDBTable over an in-memory DuckDB database.

`make_duckdb_source(scores, ids)` writes the histogram into a table whose name and columns need
quoting (spaces, quotes, capitals, a keyword), runs prepare() and returns the DuckDBTable.
`write_duckdb_source(source, item, score)` is a concurrent writer: from a second connection it
sets the item's score and refreshes the rank table, committed; it returns True (new runs see it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import duckdb
import numpy as np
import pytest

from adapters.duckdb import DuckDBTable, quote_identifier

TABLE = 'Vote "Counts" {}'
ID_COLUMN = "Item ID"
SCORE_COLUMN = "select"


def create_table(con: duckdb.DuckDBPyConnection, name: str, scores: Any, ids: Any) -> None:
    """(ID_COLUMN, SCORE_COLUMN): BIGINT or VARCHAR ids, BIGINT scores if all whole, else DOUBLE."""
    scores = np.asarray(scores)
    ids = np.arange(len(scores)) if ids is None else np.asarray(ids)
    integral = bool(np.all(np.isfinite(scores)) and np.all(scores == np.round(scores)))
    text = not np.issubdtype(ids.dtype, np.integer)
    id_type, score_type = ("VARCHAR" if text else "BIGINT"), ("BIGINT" if integral else "DOUBLE")
    con.execute(
        f"CREATE TABLE {quote_identifier(name)} AS SELECT "
        f"unnest(?::{id_type}[]) AS {quote_identifier(ID_COLUMN)}, "
        f"unnest(?::{score_type}[]) AS {quote_identifier(SCORE_COLUMN)}",
        [
            [str(v) for v in ids.tolist()] if text else ids.tolist(),
            [int(v) for v in scores.tolist()] if integral else scores.tolist(),
        ],
    )


@pytest.fixture
def duckdb_connection() -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect()
    yield con
    con.close()


@pytest.fixture
def make_duckdb_source(
    duckdb_connection: duckdb.DuckDBPyConnection,
) -> Callable[[Any, Any], DuckDBTable]:
    made = iter(range(10**6))

    def make(scores: Any, ids: Any = None) -> DuckDBTable:
        name = TABLE.format(next(made))
        create_table(duckdb_connection, name, scores, ids)
        source = DuckDBTable(duckdb_connection, name, id=ID_COLUMN, score=SCORE_COLUMN, frozen=True)
        source.prepare()
        return source

    return make


@pytest.fixture
def write_duckdb_source(
    duckdb_connection: duckdb.DuckDBPyConnection,
) -> Callable[[DuckDBTable, Any, float], bool]:
    def write(source: DuckDBTable, item: Any, score: float) -> bool:
        writer = duckdb_connection.cursor()  # a second connection to the same database
        try:
            writer.execute(
                f"UPDATE {quote_identifier(source.table)} SET {quote_identifier(SCORE_COLUMN)} = ? "
                f"WHERE {quote_identifier(ID_COLUMN)} = ?",
                [score, item],
            )
            DuckDBTable(
                writer, source.table, id=ID_COLUMN, score=SCORE_COLUMN, frozen=True
            ).prepare(refresh=True)
        finally:
            writer.close()
        return True

    return write
