"""SQLite's part of SQLAlchemyTable(mode="live") (adapters/dialects/live_sql.py): text ids in
BINARY collation (the position table's id column, the unique index on id, every match), row
triggers over the count row (its `hole` is the scratch a trigger without variables needs), one
write transaction (BEGIN IMMEDIATE) for the DDL and the fill, ANALYZE where the database keeps
sqlite_stat1, and EXPLAIN QUERY PLAN for check().

Triggers (row triggers; SQLite has one writer at a time, so nothing waits): AFTER INSERT the new
id takes position n; AFTER DELETE of an id that has a position, the item at position n - 1 takes
the deleted one's (swap-remove, the hole kept in the count row); an UPDATE that changes the id is
both. Cost: O(1) index operations per inserted or deleted item.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from .live_sql import LiveSQL


class SQLiteLive(LiveSQL):
    """SQLite (module docstring)."""

    typed_scores = False
    nocase = True

    def check_engine(self, engine: Engine) -> None:
        if sqlite_version(engine) < (3, 25):
            raise RuntimeError("SQLite >= 3.25 is needed (window functions for the rank table)")

    def few_params(self, engine: Engine) -> bool:
        """SQLite before 3.32 takes at most 999 parameters per statement."""
        return sqlite_version(engine) < (3, 32)

    def byte_order(self, t: Any, column: Any) -> Any:
        return column.collate("BINARY")

    def not_finite(self, score: Any) -> Any:
        return score.in_([math.inf, -math.inf])  # SQLite stores NaN as NULL

    def not_numeric(self, score: Any) -> Any:
        """A column type is only a hint in SQLite: a stored value may be text or a blob."""
        return sa.and_(score.is_not(None), sa.func.typeof(score).not_in(["integer", "real"]))

    def explain(self, conn: Connection, statement: str) -> tuple[bool, str]:
        # A unique comment defeats the driver's statement cache: a cached EXPLAIN keeps the
        # plan of the schema it was prepared against (it never checks the schema cookie).
        nonce = f" -- {uuid.uuid4().hex}"
        plan = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement + nonce)
        details = [row[-1] for row in plan]
        full = any(d.startswith("SCAN") for d in details)
        return full, "; ".join(details)

    def begin_snapshot(self, conn: Connection) -> None:
        """pysqlite opens no transaction before a SELECT (unless the engine was set up to emit
        BEGIN itself): open one, so every read shares one snapshot; PRAGMA query_only."""
        if not getattr(conn.connection.driver_connection, "in_transaction", False):
            conn.exec_driver_sql("BEGIN")
        conn.exec_driver_sql("PRAGMA query_only = ON")

    def end_snapshot(self, conn: Connection) -> None:
        conn.exec_driver_sql("PRAGMA query_only = OFF")
        conn.rollback()  # the transaction the PRAGMA began

    def comment_query(self, engine: Engine, table: str, schema: str | None) -> Any:
        """The table's CREATE statement (SQLite keeps no comments but keeps that text, comments
        inside it included)."""
        preparer = engine.dialect.identifier_preparer
        master = ("" if schema is None else preparer.quote_schema(schema) + ".") + "sqlite_master"
        return sa.text(f"SELECT sql FROM {master} WHERE type = 'table' AND name = :t").bindparams(
            t=table
        )

    def position_id_type(self, t: Any, id_type: sa.types.TypeEngine[Any]) -> Any:
        """Text ids in BINARY collation (byte order, byte equality)."""
        return sa.Text(collation="BINARY") if t._text_ids else id_type.copy()

    def match_key(self, t: Any, column: Any) -> Any:
        """Text ids compared in BINARY collation, as the unique index on id keys them."""
        return column.collate("BINARY") if t._text_ids else column

    def unique_id_is_ours(self, t: Any) -> bool:
        """Text ids: only prepare()'s index compares in BINARY collation for sure."""
        return bool(t._text_ids)

    def id_index_key(self, t: Any) -> Any:
        return t._index_key()

    def analyzes(self, t: Any) -> bool:
        return keeps_stat1(t.engine)

    def install(self, t: Any) -> None:
        n = t._names(qualified=False)  # trigger bodies name tables of their own schema
        prefix = t._schema_prefix()
        binary = " COLLATE BINARY" if t._text_ids else ""
        remove = f"""
    UPDATE {n["count"]} SET n = n - 1,
        hole = (SELECT {n["position"]} FROM {n["pos"]} WHERE id = OLD.{n["id"]}{binary});
    DELETE FROM {n["pos"]} WHERE id = OLD.{n["id"]}{binary};
    UPDATE {n["pos"]} SET {n["position"]} = (SELECT hole FROM {n["count"]})
        WHERE {n["position"]} = (SELECT n FROM {n["count"]});"""
        add = f"""
    INSERT INTO {n["pos"]} ({n["position"]}, id) SELECT n, NEW.{n["id"]} FROM {n["count"]};
    UPDATE {n["count"]} SET n = n + 1;"""
        known = f"EXISTS (SELECT 1 FROM {n['pos']} WHERE id = OLD.{n['id']}{binary})"
        bodies = {
            "ins": f"AFTER INSERT ON {n['table']} BEGIN {add} END",
            "del": f"AFTER DELETE ON {n['table']} WHEN {known} BEGIN {remove} END",
            "upd": f"AFTER UPDATE OF {n['id']} ON {n['table']} "
            f"WHEN OLD.{n['id']}{binary} IS NOT NEW.{n['id']} AND {known} "
            f"BEGIN {remove} {add} END",
        }
        with t.engine.begin() as conn:
            if not conn.connection.driver_connection.in_transaction:  # type: ignore[union-attr]
                conn.exec_driver_sql("BEGIN IMMEDIATE")  # DDL and fill in one write transaction
            t._create_position_tables(conn)
            for event in bodies:
                conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {prefix}{t._trigger(event)}")
            t._fill_positions(conn)
            for event, body in bodies.items():
                conn.exec_driver_sql(f"CREATE TRIGGER {prefix}{t._trigger(event)} {body}")

    def explain_live(self, t: Any, conn: Connection, query: Any) -> tuple[bool, str]:
        """A SCAN of the user's table or of the position table without an index is a full scan
        (a scan of a LIMITed page, a materialized subquery, reads only that page)."""
        statement = str(query.compile(conn, compile_kwargs={"literal_binds": True}))
        tables = {t.table_name, t._pos.name}
        nonce = f" -- {uuid.uuid4().hex}"  # a cached EXPLAIN keeps an old schema's plan
        details = [
            row[-1] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement + nonce)
        ]
        full = any(
            d.split(" ")[0] == "SCAN" and d.split(" ")[1] in tables and "USING" not in d
            for d in details
        )
        return full, "; ".join(details)


def keeps_stat1(engine: Engine) -> bool:
    """Whether a SQLite database keeps planner statistics (sqlite_stat1, made by its owner's
    ANALYZE): prepare() then refreshes them for what it built; it never makes the table."""
    with engine.connect() as conn:
        return sa.inspect(conn).has_table("sqlite_stat1")


def sqlite_version(engine: Engine) -> tuple[int, ...]:
    """The version of the SQLite library the engine's driver links."""
    version = getattr(engine.dialect.dbapi, "sqlite_version_info", None)
    return tuple(version) if version else (0,)
