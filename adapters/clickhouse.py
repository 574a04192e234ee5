"""ClickHouseTable: a table of counts in ClickHouse, run in process by chdb.

    import chdb
    from adapters.clickhouse import ClickHouseTable

    con = chdb.connect("votes.chdb")
    source = ClickHouseTable(con, "item_votes", id="item", score="votes")
    source.prepare()  # once: the rank-ordered copy, in ClickHouse

The store is the SQL store engine (adapters/sql/engine.py) over the chdb driver
(adapters/sql/driver.py) and the ClickHouse dialect (adapters/dialects/clickhouse.py), which
says how a copy is proven current without triggers.
"""

from __future__ import annotations

from typing import Any

from .dialects.clickhouse import STORE_COSTS, ClickHouseDialect
from .sql.driver import ChdbDriver
from .sql.driver import DriverError as ClickHouseError
from .sql.engine import SQLTable

__all__ = ["STORE_COSTS", "ClickHouseError", "ClickHouseTable"]


class ClickHouseTable(SQLTable):
    """A histogram in a ClickHouse table: one row per item, an id column (integer or String)
    and a numeric count column. `connection` is a chdb connection (chdb.connect(path)), a chdb
    session, or a database path to open; `database` defaults to the connection's current one.
    `sensitivity` (default 1) and `max_items_per_client` are declared by whoever built the
    table; `frozen=True` promises that the table does not change after prepare()."""

    def __init__(
        self,
        connection: Any,
        table: str,
        id: str = "id",
        score: str = "score",
        *,
        database: str | None = None,
        frozen: bool = False,
        sensitivity: float | None = None,
        max_items_per_client: int | None = None,
    ) -> None:
        super().__init__(
            ChdbDriver(connection),
            ClickHouseDialect(),
            table,
            id,
            score,
            namespace=database,
            frozen=frozen,
            sensitivity=sensitivity,
            max_items_per_client=max_items_per_client,
        )
