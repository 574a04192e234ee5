"""The dialects SQLAlchemyTable(mode="live") serves, and each one's LiveSQL (live_sql.py): those
whose B-tree indexes can be declared (score DESC, id ASC) and read in that order."""

from __future__ import annotations

from sqlalchemy.engine import Engine

from .live_sql import LiveSQL
from .mysql_live import MySQLLive
from .postgres.live import PostgresLive
from .sqlite_live import SQLiteLive

LIVE_SQL: dict[str, type[LiveSQL]] = {
    "postgresql": PostgresLive,
    "sqlite": SQLiteLive,
    "mysql": MySQLLive,
    "mariadb": MySQLLive,
}
LIVE_DIALECTS = tuple(LIVE_SQL)


def live_sql(engine: Engine) -> LiveSQL:
    """The LiveSQL of the engine's dialect; ValueError (before anything is read) for another."""
    found = LIVE_SQL.get(engine.dialect.name)
    if found is None:
        raise ValueError(
            f"mode='live' reads sorted access through a B-tree index on the table, which "
            f"dialect {engine.dialect.name!r} cannot serve in order (PostgreSQL, MariaDB / "
            "MySQL and SQLite can): use mode='copy' (DuckDB)"
        )
    return found()
