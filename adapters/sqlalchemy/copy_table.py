"""SQLAlchemyTable in copy mode on the SQL store engine (adapters/sql/): PostgreSQL, SQLite,
MariaDB / MySQL and DuckDB (duckdb-engine) read through an SQLAlchemy Engine with their own
dialect (adapters/dialects/), in SQLAlchemyTable's catalog layout (adapters/sql/recorded.py
RecordedCopy: its rank table names, the shared tables topk_rank_fingerprints and
topk_write_stamps, the indexes on the table of counts), proven current by the dialect's
triggers (PostgreSQL's write log, shared with PostgresTable; SQLite's and MariaDB's row stamps;
DuckDB has none: the copy compared with the table, freshness.Compared): one catalog layout,
whichever code prepared the table (tests/stores/test_catalog_layout.py,
tests/stores/test_catalog_layout_sqlalchemy.py,
tests/stores/test_catalog_layout_sqlalchemy_duckdb.py pin it).

SQLAlchemyTable(engine, ...) builds this class where the engine's dialect is in `DIALECTS` and
the mode is "copy"; an engine of any other dialect is refused (table.SQLAlchemyTable.__new__).
from_votes() builds its subclass over a counting statement (votes_table.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from adapters.dialects.duckdb import DuckDBDialect
from adapters.dialects.mysql import MySQLDialect, is_mariadb
from adapters.dialects.postgres import PostgresDialect
from adapters.dialects.sqlite import SQLiteDialect
from adapters.sql.around import ChangeLog
from adapters.sql.dialect import Dialect
from adapters.sql.driver import SQLAlchemyDriver
from adapters.sql.engine import SQLTable
from adapters.sql.recorded import RecordedCopy, RecordedNames

from .table import DEFAULT_MAX_PARAMS, SQLAlchemyTable, _digest, _fit, _runs_name, engine_of

# The SQLAlchemy dialects on the engine, and the engine's dialect for each engine: the one place
# an SQLAlchemy engine's dialect is chosen (copies, from_votes' counts and their copies).
DIALECTS: dict[str, Callable[[Engine], Dialect]] = {
    "postgresql": lambda engine: PostgresDialect(),
    "sqlite": lambda engine: SQLiteDialect(),
    "mysql": lambda engine: MySQLDialect(is_mariadb(engine)),
    "mariadb": lambda engine: MySQLDialect(True),
    "duckdb": lambda engine: DuckDBDialect(named_schema=True),
}


def recorded_names(t: SQLTable, rank_table: str | None, record: str | None = None) -> RecordedNames:
    """SQLAlchemyTable's names for table `t`'s copy: the digests of (schema, table, id, score)
    and of (schema, rank table)."""
    schema, table = t.namespace, t.table
    digest = _digest(schema, table, t.id_column, t.score_column)
    key = t.dialect.id_index_key(t.id_sql) if t.text_ids else t.id_sql
    indexed = (
        ()
        if not t.dialect.indexes_tables
        else (
            (_fit("ix", f"_topk_{digest}_score_id"), f"{t.score_sql} DESC, {key}"),
            (_fit("ix", f"_topk_{digest}_id"), t.id_sql),
        )
    )
    return copy_names(
        schema,
        rank_table or _fit(table, f"__topk_rank_{digest}"),
        source_indexes=indexed if t.dialect.indexes_ids(t.id_info) else (),
        record=record,
    )


def copy_names(schema: str | None, ranks: str, **more: Any) -> RecordedNames:
    """The names of the copy `ranks` in `schema` (its runs table, its id index, a refresh's
    tables and keys: digests of (schema, rank table)); `more` the rest of RecordedNames."""
    beside = _digest(schema, ranks)
    return RecordedNames(
        schema,
        ranks,
        _runs_name(ranks),
        "",
        _fit("ix", f"_topk_{beside}_id"),
        (f"topk_{beside}_new", f"topk_{beside}_new_runs", "", f"topk_{beside}_new_id"),
        rank_key="",
        runs_key="",
        beside_keys=(f"topk_{beside}_new_pk", f"topk_{beside}_new_runs_pk"),
        **more,
    )


def _prefix(t: SQLTable) -> str:
    return "topk_" + hashlib.sha1(t.copies.names.ranks.encode()).hexdigest()[:12]


def _change_log(t: SQLTable) -> dict[str, ChangeLog]:
    """The proof's change log where the dialect keeps one (PostgreSQL: a stale copy is read
    around the rows written since it, adapters/sql/around.py), its objects `<prefix>_c_...`."""
    names = t.dialect.change_names(t, _prefix(t) + "_c")
    return {} if names is None else {"changes": ChangeLog(t, names)}


class SQLAlchemyCopyTable(SQLTable):
    """A histogram in a table of an SQLAlchemy database whose dialect is on the engine (module
    docstring); the arguments are SQLAlchemyTable's. `max_params` is accepted and checked: the
    dialects here bind arrays as one parameter, so no IN list is cut into chunks."""

    def __init__(
        self,
        engine: Engine | str,
        table: str | sa.Table,
        id: str = "id",
        score: str = "score",
        *,
        schema: str | None = None,
        rank_table: str | None = None,
        max_params: int | None = None,
        mode: str = "copy",
        sensitivity: float | None = None,
        max_items_per_client: int | None = None,
        frozen: bool = False,
    ) -> None:
        engine = engine_of(engine)
        if isinstance(table, sa.Table):
            schema, table = table.schema, table.name
        where = f"table {table!r}" if schema is None else f"table {schema!r}.{table!r}"
        if max_params is not None and max_params < 1:
            raise ValueError(f"max_params must be >= 1, got {max_params}")
        self.engine, self.mode = engine, mode
        self.max_params = int(max_params or DEFAULT_MAX_PARAMS)
        dialect = DIALECTS[engine.dialect.name](engine)
        preparer = engine.dialect.identifier_preparer
        super().__init__(
            SQLAlchemyDriver(engine, read_only=dialect.sqlalchemy_read_only),
            dialect,
            table,
            id,
            score,
            namespace=schema,
            frozen=frozen,
            sensitivity=sensitivity,
            max_items_per_client=max_items_per_client,
            where=where,
            layout=lambda t: RecordedCopy(t, recorded_names(t, rank_table)),
            proof=lambda t: t.dialect.trigger_proof(
                t,
                preparer.format_table(sa.table(t.copies.names.ranks, schema=t.namespace)),
                _prefix(t) + "_w",
                shared=(t.dialect.stamps_table_sql(t.copies.stamps),),
                **_change_log(t),
            ),
        )
        dialect.hides_statistics(self.driver)  # asked once, here: traits() reads it

    @property
    def table_name(self) -> str:
        return self.table

    @property
    def rank_table_name(self) -> str:
        return self.copies.names.ranks

    @property
    def runs_table_name(self) -> str:
        return self.copies.names.runs

    def prepare(
        self,
        refresh: bool = False,
        *,
        index_source: bool = True,
        statement_timeout: float | None = PostgresDialect.prepare_statement_timeout,
        swap_timeout: float = PostgresDialect.swap_timeout,
    ) -> None:
        """Validate the counts and build the copy (adapters/sql/recorded.py); idempotent. With
        `index_source`, indexes on (score DESC, id) and (id) of the table of counts. A rank
        table that prepare() did not build is refused; one built from an earlier table of its
        name, or with `refresh=True`, is rebuilt beside the old one and swapped in, waiting at
        most `swap_timeout` seconds for runs still reading it. Each statement has
        `statement_timeout` seconds (None: the server's setting)."""
        super().prepare(
            refresh,
            index_source=index_source,
            statement_timeout=statement_timeout,
            swap_timeout=swap_timeout,
        )


SQLAlchemyTable.copy_classes.update(dict.fromkeys(DIALECTS, SQLAlchemyCopyTable))

__all__ = ["DIALECTS", "SQLAlchemyCopyTable", "recorded_names"]
