"""What each SQL store says for from_votes (adapters/sql/votes.py), until its own dialect module
holds it (SQLite's and MariaDB / MySQL's do: dialects/sqlite.py, dialects/mysql.py): PostgreSQL
and DuckDB as dialects (sql/dialect.py) that fill the catalog lookup of a table's columns and
the fragments from_votes' counts are written in. Statements run through the engine's drivers
(sql/driver.py), so PostgreSQL through psycopg and through SQLAlchemy share `PostgresVotes`,
and DuckDB natively and through duckdb_engine share `DuckDBVotes`: one store speaks the same
words whatever the driver.

Only what differs is here: quoting, the casts, SHA-256, text compared byte for byte, and the
catalog: its column types read as kinds (INTEGER, FLOAT, TEXT or the type's own name) and
whether a relation is a table.
"""

from __future__ import annotations

from typing import Any

from ..sql.dialect import FLOAT, INTEGER, TEXT, Column, Dialect
from ..sql.driver import Driver
from .mysql import MySQLDialect
from .sqlite import SQLiteDialect


def _double_quoted(name: str) -> str:
    if "\x00" in name:
        raise ValueError(f"a name cannot hold a NUL character, got {name!r}")
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class PostgresVotes(Dialect):
    """PostgreSQL. Text under a deterministic collation (every built-in one) is equal only byte
    for byte, so ids are compared as they are; the catalog is pg_class and pg_attribute."""

    name = "PostgreSQL"
    INTEGERS = ("smallint", "integer", "bigint")
    FLOATS = ("real", "double precision", "numeric")
    NO_EQUALITY = ("json", "xml", "point", "line", "lseg", "box", "path", "polygon", "circle")

    def quote(self, name: str) -> str:
        return _double_quoted(name)

    def text(self, expr: str) -> str:
        return f"CAST({expr} AS text)"

    def double(self, expr: str) -> str:
        return f"CAST({expr} AS double precision)"

    def keyed_hash(self, key: str, message: str) -> str | None:
        return f"sha256(convert_to({key} || {message}, 'UTF8'))"

    def comment_statement(self, qualified: str, text: str) -> str:
        return f"COMMENT ON TABLE {qualified} IS {_literal(text)}"

    def _catalog(self, driver: Driver, namespace: Any, table: str) -> list[tuple[Any, ...]]:
        return driver.execute(
            "SELECT c.relkind, a.attname, format_type(a.atttypid, a.atttypmod), t.typcategory "
            "FROM pg_catalog.pg_class c LEFT JOIN pg_catalog.pg_attribute a "
            "ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
            "LEFT JOIN pg_catalog.pg_type t ON t.oid = a.atttypid "
            "WHERE c.oid = to_regclass(:name) ORDER BY a.attnum",
            {"name": self.qualified(namespace, table)},
        )

    def columns(self, driver: Driver, namespace: Any, table: str) -> dict[str, Column] | None:
        found = self._catalog(driver, namespace, table)
        if not found:
            return None
        columns = {}
        for _, column, type_name, category in found:
            if column is None:
                continue
            if type_name in self.INTEGERS:
                kind = INTEGER
            elif type_name.startswith(self.FLOATS):
                kind = FLOAT
            else:
                kind = TEXT if category == "S" else type_name
            id_ok = type_name.split("(")[0] not in self.NO_EQUALITY
            columns[column] = Column(kind, type_name, id_ok)
        return columns

    def is_table(self, driver: Driver, namespace: Any, table: str) -> bool:
        found = self._catalog(driver, namespace, table)
        return bool(found) and found[0][0] in ("r", "p")


class DuckDBVotes(Dialect):
    """DuckDB: names match without regard to case; text compares byte for byte under the
    "binary" collation, whatever default_collation says; temporary tables and views (a
    registered DataFrame) are found before the database's own."""

    name = "DuckDB"
    INTEGERS = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT")
    FLOATS = ("FLOAT", "DOUBLE", "DECIMAL")

    def quote(self, name: str) -> str:
        return _double_quoted(name)

    def double(self, expr: str) -> str:
        return f"CAST({expr} AS DOUBLE)"

    def byte_order(self, expr: str) -> str:
        return f'{expr} COLLATE "binary"'

    def keyed_hash(self, key: str, message: str) -> str | None:
        return f"sha256({key} || {message})"

    def comment_statement(self, qualified: str, text: str) -> str:
        return f"COMMENT ON TABLE {qualified} IS {_literal(text)}"

    def _find(self, driver: Driver, namespace: Any, table: str) -> tuple[Any, ...] | None:
        """(database, schema, name, is a view) of the relation the name means."""
        return driver.one(
            "SELECT database_name, schema_name, name, view FROM (SELECT database_name, "
            "schema_name, table_name AS name, false AS view FROM duckdb_tables() UNION ALL "
            "SELECT database_name, schema_name, view_name, true FROM duckdb_views() "
            "WHERE NOT internal) WHERE database_name IN (current_database(), 'temp') "
            "AND lower(schema_name) = lower(coalesce(:schema, current_schema())) "
            "AND lower(name) = lower(:name) ORDER BY database_name = 'temp' DESC LIMIT 1",
            {"schema": namespace, "name": table},
        )

    def columns(self, driver: Driver, namespace: Any, table: str) -> dict[str, Column] | None:
        found = self._find(driver, namespace, table)
        if found is None:
            return None
        rows = driver.execute(
            "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = :d "
            "AND schema_name = :s AND table_name = :t ORDER BY column_index",
            {"d": found[0], "s": found[1], "t": found[2]},
        )
        columns = {}
        for column, type_name in rows:
            unsigned = type_name[1:] if type_name.startswith("U") else type_name
            if unsigned in self.INTEGERS:
                kind = INTEGER
            elif type_name.startswith(self.FLOATS):
                kind = FLOAT
            else:
                kind = TEXT if type_name == "VARCHAR" else type_name
            columns[column] = Column(kind, type_name)
        return columns

    def is_table(self, driver: Driver, namespace: Any, table: str) -> bool:
        found = self._find(driver, namespace, table)
        return found is not None and not found[3]


def sqlalchemy_dialect(engine: Any) -> Dialect:
    """The from_votes dialect of an SQLAlchemy engine's store (a clear error for another)."""
    name = engine.dialect.name
    if name == "postgresql":
        return PostgresVotes()
    if name == "sqlite":
        return SQLiteDialect()
    if name in ("mysql", "mariadb"):
        return MySQLDialect(bool(getattr(engine.dialect, "is_mariadb", False)))
    if name == "duckdb":
        return DuckDBVotes()
    raise ValueError(
        "from_votes through SQLAlchemy counts on PostgreSQL, SQLite, MariaDB / MySQL and "
        f"DuckDB; this engine's dialect is {name!r}"
    )
