"""What differs between the dialects SQLAlchemyTable(mode="live") serves (adapters/sqlalchemy/
live_mode.py): one `LiveSQL` object per dialect (sqlite_live.py, mysql_live.py, postgres/live.py;
live.py picks it by the engine's dialect) says how ids are keyed and compared, how the position
keeper (position table, count row, triggers) is installed, dropped and checked, how a list of
values is bound, and how a plan is read. The defaults here are what PostgreSQL and SQLite share.

Each method takes the live table `t` (its names, columns and engine) and builds its statements
with SQLAlchemy Core or, for trigger bodies, from identifiers quoted by the engine's preparer.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

TRIGGER_EVENTS = ("ins", "del", "upd")  # the row triggers every dialect installs


class LiveSQL:
    """The live mode's statements of one dialect (module docstring)."""

    # The scores' column type is kept by the store (not on SQLite, where a type is a hint).
    typed_scores = True

    def check_server(self, t: Any) -> None:
        """Refuse a server that cannot serve live mode, before anything is read."""

    def position_id_type(self, t: Any, id_type: sa.types.TypeEngine[Any]) -> Any:
        """The id column's type in the position table: the user's."""
        return id_type.copy()

    def order_key(self, t: Any, column: Any) -> Any:
        """The id as indexed and ordered: in byte order (LiveBase._id_key)."""
        return t._id_key(column)

    def match_key(self, t: Any, column: Any) -> Any:
        """The id as matched for equality, so that the unique index on id serves the lookup."""
        return column

    def unique_id_is_ours(self, t: Any) -> bool:
        """Whether only prepare()'s own unique index on id counts (not the table's key)."""
        return False

    def id_index_key(self, t: Any) -> Any:
        """The key of the unique index on id that prepare() makes where the table has none."""
        return t._id_column

    def before_index(self, conn: Connection, t: Any, name: Any) -> None:
        """Run before an index of prepare() is created (if it does not exist yet)."""

    def count_mark(self, t: Any) -> Any:
        """The count row's `hole` as filled: NULL (scratch for SQLite's triggers)."""
        return sa.null()

    def analyzes(self, t: Any) -> bool:
        """Whether prepare() refreshes the planner's statistics of the table and the positions."""
        return False

    def install(self, t: Any) -> None:
        """Create the position and count tables, fill them and install the triggers."""
        raise NotImplementedError

    def drop_triggers(self, conn: Connection, t: Any) -> None:
        """Drop the triggers prepare() installed, where they exist."""
        prefix = t._schema_prefix()
        for event in TRIGGER_EVENTS:
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {prefix}{t._trigger(event)}")

    def positions_current(self, t: Any, conn: Connection) -> bool:
        """Whether the positions describe the table (the run's first read may rebuild them)."""
        return True

    def refill(self, t: Any) -> None:
        """Fill the positions again (a dialect whose positions_current() can say False)."""

    def one_of(self, column: Any, name: str, type_: sa.types.TypeEngine[Any]) -> Any:
        """`column` is one of the values of list parameter `name`: an expanding IN list."""
        return column.in_(sa.bindparam(name, expanding=True))

    def before_explain(self, conn: Connection) -> None:
        """Settings of check()'s transaction (rolled back) before its EXPLAINs."""

    def explain_live(self, t: Any, conn: Connection, query: Any) -> tuple[bool, str]:
        """(full scan?, how) for one probe of check()."""
        return t._explain(conn, query)

    # ----- the table found and checked, and a run's transaction (adapters/sqlalchemy/live_base.py)

    # Whether the driver writes every parameter into the statement text (every MariaDB / MySQL
    # driver tested does): then an oblivious release does not send it the drawn positions.
    parameters_in_text = False
    # Whether statistics views show other roles the blocks a run reads (PostgreSQL's
    # pg_statio_user_tables), which an oblivious run hides where its role may.
    statistics_views = False
    # Whether the catalog matches names without case (fold: how SQL reads an unquoted name).
    nocase = False

    def fold(self, word: str) -> str:
        """An unquoted name as SQL reads it: lower case."""
        return word.lower()

    def check_engine(self, engine: Engine) -> None:
        """Refuse a client library that cannot serve live mode, before anything is read."""

    def few_params(self, engine: Engine) -> bool:
        """Whether the client library takes fewer parameters per statement than most."""
        return False

    def byte_order(self, t: Any, column: Any) -> Any:
        """Text compared in byte order."""
        raise NotImplementedError

    def not_finite(self, score: Any) -> Any:
        """A condition true for NaN or infinite scores of a float column (None: none stored)."""
        return None

    def not_numeric(self, score: Any) -> Any:
        """A condition true for a stored value that is not a number (None: the type says)."""
        return None

    def id_length_limit(self, column: Any) -> tuple[Any, int, str] | None:
        """(length of a text id, the most an index takes, its unit), None without a limit."""
        return None

    def explain(self, conn: Connection, statement: str) -> tuple[bool, str]:
        """(full scan?, how) for one statement, from the dialect's EXPLAIN."""
        raise NotImplementedError

    def snapshot_connection(self, conn: Connection) -> Connection:
        """The run's connection with its isolation level set (the strongest read-consistent)."""
        return conn

    def begin_snapshot(self, conn: Connection) -> None:
        """Statements that make the open transaction the run's read-only snapshot."""

    def end_snapshot(self, conn: Connection) -> None:
        """Statements after the snapshot's transaction is rolled back."""

    def statistics_role(self, engine: Engine) -> tuple[bool, str]:
        """(whether the engine's role may set track_counts, its name): no statistics views."""
        return False, ""

    def reflected(self, table: sa.Table) -> sa.Table:
        """The reflected table as the catalog names its columns."""
        return table

    def comment_query(self, engine: Engine, table: str, schema: str | None) -> Any:
        """The query of the text that may hold a from_votes record for `table`."""
        raise NotImplementedError
