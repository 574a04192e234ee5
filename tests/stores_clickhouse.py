"""Conformance store: ClickHouseTable on ClickHouse in process (chdb).

`make_clickhouse_source(scores, ids)` writes the histogram into a MergeTree table whose name and
columns need quoting (spaces, quotes, capitals, a keyword), runs prepare() and returns the
ClickHouseTable, not frozen: every run proves its copy current by the table's parts
(adapters/dialects/clickhouse.py). `write_clickhouse_source(source, item, score)` commits a new
score with a mutation (ALTER UPDATE, waited for) and refreshes the copy; it returns True.
Each test's tables are dropped afterwards (the copy's with uninstall()).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

chdb = pytest.importorskip("chdb", reason="the 'clickhouse' extra (pip install chdb)")

from adapters.clickhouse import ClickHouseTable  # noqa: E402
from adapters.dialects.clickhouse import ClickHouseDialect  # noqa: E402
from adapters.sql.driver import ChdbDriver  # noqa: E402

TABLE = 'Vote "Counts" {}'
ID_COLUMN = "Item ID"
SCORE_COLUMN = "select"


def create_table(con: Any, name: str, scores: Any, ids: Any) -> None:
    """(ID_COLUMN, SCORE_COLUMN): Int64 or String ids, Int64 scores if all whole, else Float64."""
    scores = np.asarray(scores)
    ids = np.arange(len(scores)) if ids is None else np.asarray(ids)
    integral = bool(np.all(np.isfinite(scores)) and np.all(scores == np.round(scores)))
    text = not np.issubdtype(ids.dtype, np.integer)
    id_type, score_type = ("String" if text else "Int64"), ("Int64" if integral else "Float64")
    driver, q = ChdbDriver(con), ClickHouseDialect().quote
    driver.execute(
        f"CREATE TABLE {q(name)} ({q(ID_COLUMN)} {id_type}, {q(SCORE_COLUMN)} {score_type}) "
        f"ENGINE = MergeTree ORDER BY {q(ID_COLUMN)}"
    )
    driver.execute(
        f"INSERT INTO {q(name)} SELECT tupleElement(p, 1), tupleElement(p, 2) FROM "
        f"(SELECT arrayJoin(arrayZip(CAST(:i AS Array({id_type})), "
        f"CAST(:s AS Array({score_type})))) AS p)",
        {
            "i": [str(v) for v in ids.tolist()] if text else ids.tolist(),
            "s": [int(v) for v in scores.tolist()] if integral else scores.tolist(),
        },
    )


@pytest.fixture(scope="session")
def clickhouse_connection() -> Iterator[Any]:
    """One in-process ClickHouse per test worker (chdb keeps one engine per process)."""
    con = chdb.connect(":memory:")
    yield con
    con.close()


@pytest.fixture
def make_clickhouse_source(clickhouse_connection: Any) -> Iterator[Callable[[Any, Any], Any]]:
    made: list[ClickHouseTable] = []
    q = ClickHouseDialect().quote

    def make(scores: Any, ids: Any = None) -> ClickHouseTable:
        name = TABLE.format(uuid.uuid4().hex[:8])
        create_table(clickhouse_connection, name, scores, ids)
        source = ClickHouseTable(clickhouse_connection, name, id=ID_COLUMN, score=SCORE_COLUMN)
        made.append(source)
        source.prepare()
        return source

    yield make
    for source in made:
        source.uninstall()
        clickhouse_connection.query(f"DROP TABLE IF EXISTS {q(source.table)} SYNC")


@pytest.fixture
def write_clickhouse_source(clickhouse_connection: Any) -> Callable[[Any, Any, float], bool]:
    q = ClickHouseDialect().quote

    def write(source: ClickHouseTable, item: Any, score: float) -> bool:
        clickhouse_connection.query(
            f"ALTER TABLE {q(source.table)} UPDATE {q(SCORE_COLUMN)} = {{s:Int64}} "
            f"WHERE {q(ID_COLUMN)} = {{i:Int64}} SETTINGS mutations_sync = 2",
            "CSV",
            params={"s": int(score), "i": int(item)},
        )
        ClickHouseTable(
            clickhouse_connection, source.table, id=ID_COLUMN, score=SCORE_COLUMN
        ).prepare(refresh=True)
        return True

    return write
