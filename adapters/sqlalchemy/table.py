"""SQLAlchemyTable: a table of per-item counts in an SQLAlchemy database, served as a Source.

`SQLAlchemyTable(engine, table, ...)` builds the class that serves the engine's dialect and
the mode: copy mode on PostgreSQL, SQLite, MariaDB / MySQL and DuckDB (duckdb-engine) is the
SQL store engine with the store's own dialect (copy_table.py), live mode on PostgreSQL,
SQLite and MariaDB / MySQL is live_mode.py; an engine of another dialect is refused, in one
line, before anything is read (no dialect of the engine's speaks its SQL).
`SQLAlchemyTable.from_votes(...)` counts raw votes into a copy on the engine (votes_table.py).
Each of those modules registers its class here (`copy_classes`, `mode_classes`,
`votes_class`), so that this module imports none of them.

Beside the class: how a URL becomes an Engine (`engine_of`), and the names the copies of
SQLAlchemyTable's catalog layout derive (`_digest`, `_fit`, `_runs_name`: a contract with
tables prepared before, pinned by tests/stores/test_catalog_layout_sqlalchemy*.py).
"""

from __future__ import annotations

import hashlib
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from adapters._sql import RankTableMismatchError
from adapters.sql.recorded import FINGERPRINTS_TABLE
from topk_middleware.validation import first_line, mask_secrets

__all__ = ["FINGERPRINTS_TABLE", "RankTableMismatchError", "SQLAlchemyTable", "engine_of"]

# Rows per IN list: below every driver's parameter limit (psycopg 65535; SQLite 32766 since
# 3.32, 999 before).
DEFAULT_MAX_PARAMS = 10_000
OLD_SQLITE_MAX_PARAMS = 999
# PostgreSQL truncates identifiers at 63 bytes, MariaDB refuses more than 64 characters.
MAX_NAME_BYTES = 63


def _digest(*parts: str | None) -> str:
    return hashlib.sha1("\x00".join(p or "" for p in parts).encode("utf-8")).hexdigest()[:10]


def _fit(name: str, suffix: str) -> str:
    """`name` + `suffix`, the name cut so that the whole fits MAX_NAME_BYTES."""
    head = name.encode("utf-8")[: MAX_NAME_BYTES - len(suffix.encode("utf-8"))]
    return head.decode("utf-8", "ignore") + suffix


def _runs_name(rank_table: str) -> str:
    """The runs table of `rank_table`: `<rank_table>_runs`, or, past MAX_NAME_BYTES (where
    PostgreSQL would truncate it, possibly to the rank table's own name), the name cut short
    with a hash of the whole of it."""
    name = rank_table + "_runs"
    if len(name.encode("utf-8")) <= MAX_NAME_BYTES:
        return name
    return _fit(rank_table, f"_{_digest(rank_table)}_runs")


class SQLAlchemyTable:
    """A histogram in a database table, read through an SQLAlchemy engine.

    `SQLAlchemyTable(engine, "votes_per_item", id="item", score="votes")` wraps an existing table
    with one row per item of the public domain (zero counts included). Call `prepare()` once (and
    again after the counts change) before running `private_top_k` on it.

    `mode="copy"` (the default) serves runs from the rank table built by `prepare()`.
    `mode="live"` reads the table itself through an index, with item positions kept by
    triggers, so that writes need no rebuild (PostgreSQL, MariaDB / MySQL, SQLite; see
    adapters/sqlalchemy/live_mode.py).
    """

    # The class serving each mode other than "copy" (live_mode.py registers itself), and copy
    # mode on the dialects that have moved onto the SQL store engine (copy_table.py).
    mode_classes: dict[str, type[SQLAlchemyTable]] = {}  # noqa: RUF012
    copy_classes: dict[str, type] = {}  # noqa: RUF012
    votes_class: Any = None  # what from_votes() builds (votes_table.py registers it)

    def __new__(cls, *args: Any, mode: str = "copy", **kwargs: Any) -> Any:
        """The class that serves `mode` on the engine's dialect, built (copy mode) or left for
        Python to initialise (a class of `mode_classes`, a subclass of this one)."""
        if cls is not SQLAlchemyTable:
            return super().__new__(cls)
        if mode in cls.mode_classes:
            return super().__new__(cls.mode_classes[mode])
        if mode != "copy":
            raise ValueError(f"mode must be 'copy' or 'live', got {mode!r}")
        if not args and "engine" not in kwargs:
            raise TypeError("SQLAlchemyTable needs an engine: an SQLAlchemy Engine or a URL")
        engine = engine_of(args[0] if args else kwargs.pop("engine"))
        moved = cls.copy_classes.get(engine.dialect.name)
        if moved is None:
            raise ValueError(
                f"SQLAlchemyTable reads PostgreSQL, SQLite, MariaDB / MySQL and DuckDB "
                f"(duckdb-engine) engines; this engine's dialect is {engine.dialect.name!r}, "
                "whose SQL it does not speak: read the counts into an ArraySource, or copy "
                "them into one of those stores"
            )
        return moved(engine, *args[1:], mode=mode, **kwargs)

    # ----- construction from raw votes ------------------------------------------------------
    @classmethod
    def from_votes(
        cls,
        engine: Engine | str,
        votes_table: str,
        items_table: str,
        client: str = "client",
        item: str = "item",
        item_id: str = "id",
        *,
        schema: str | None = None,
        rank_table: str | None = None,
        max_params: int | None = None,
        weight: str | None = None,
        max_per_item: float = 1,
        max_items_per_client: int | None = None,
    ) -> Any:
        """Counts from raw votes with bounded contributions (adapters/contributions.py,
        adapters/sql/votes.py): a client adds to an item min(its rows for the item, or the sum
        of their `weight`, `max_per_item`) (COUNT(DISTINCT client) when that is 1 without
        weight), to at most `max_items_per_client` items chosen by a keyed hash (SHA-256 of a
        fresh secret key, the client and the item, a bound parameter; PostgreSQL, MariaDB /
        MySQL and DuckDB: SQLite has no SHA-256 and refuses it); the source's sensitivity is
        `max_per_item`.

        `items_table` lists the public item domain (column `item_id`); `votes_table` holds
        (client, item[, weight]) rows. An outer join keeps the items without votes (score 0), so
        m is the size of the public domain, not the number of items that happen to have votes.
        NULL clients are not counted. Tables, columns and their types are checked here; the
        votes are checked where they are counted, in every build of the copy by prepare() (a
        vote for an item missing from the domain, a negative, NaN or infinite weight: refused),
        and the copy carries the record of the bounds.
        """
        return cls.votes_class.build(
            engine,
            votes_table,
            items_table,
            client,
            item,
            item_id,
            schema=schema,
            rank_table=rank_table,
            max_params=max_params,
            weight=weight,
            max_per_item=max_per_item,
            max_items_per_client=max_items_per_client,
        )


def engine_of(engine: Engine | str) -> Engine:
    """An SQLAlchemy Engine, or one made from a URL string by sqlalchemy.create_engine (a URL
    SQLAlchemy cannot read, or whose driver is missing, is refused in one line)."""
    if isinstance(engine, Engine):
        return engine
    if not isinstance(engine, str):
        raise TypeError(
            f"engine must be an SQLAlchemy Engine or a URL string such as 'sqlite:///shop.sqlite', "
            f"got {type(engine).__name__}"
        )
    try:
        return sa.create_engine(engine)
    except (ImportError, sa.exc.ArgumentError) as error:
        raise ValueError(
            f"SQLAlchemy cannot make an engine of {mask_secrets(engine)!r}: {first_line(error)}"
        ) from None
