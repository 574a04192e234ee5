"""How the privacy ledger's store (adapters/ledger.py) opens its files and connections.

A SQLite or DuckDB ledger file is created readable by its owner only; a SQLite ledger runs its
transactions as BEGIN IMMEDIATE in write-ahead-log mode; a DuckDB ledger's writers in one
process take turns; and a read of one statement runs outside any transaction (`one_read`), so
that on PostgreSQL it is one round trip instead of three (BEGIN, the read, ROLLBACK).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa

# The execution option that tells the SQLite begin listener to open no transaction.
SINGLE_READ = "topk_ledger_single_read"


@contextlib.contextmanager
def one_read(engine: sa.Engine, dialect: str) -> Iterator[sa.Connection]:
    """A connection for one read statement, run outside any transaction: PostgreSQL in
    autocommit (the statement sees one snapshot, and no BEGIN nor ROLLBACK goes to the server),
    SQLite without BEGIN IMMEDIATE (a reader of a write-ahead log takes no lock), DuckDB as
    before. Only for a single statement: two reads through it may see two states."""
    with engine.connect() as conn:
        if dialect == "postgresql":
            conn.execution_options(isolation_level="AUTOCOMMIT")
        elif dialect == "sqlite":
            conn.execution_options(**{SINGLE_READ: True})
        yield conn


_TURNS: dict[str, threading.Lock] = {}
_TURNS_LOCK = threading.Lock()


def duckdb_turns(ledger: str) -> threading.Lock:
    """The lock this process's writers to one DuckDB ledger (its file) take turns with."""
    with _TURNS_LOCK:
        return _TURNS.setdefault(ledger, threading.Lock())


def ledger_file(url: sa.URL) -> Path | None:
    """The database file of a SQLite / DuckDB ledger URL (None: a server, or in memory)."""
    if url.get_backend_name() not in ("sqlite", "duckdb"):
        return None
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file:") or database.startswith("md:"):
        return None
    return Path(database)


def owner_only(path: Path) -> None:
    """chmod 0600 a file this process owns, if it exists (a DuckDB write-ahead log, which DuckDB
    creates with the process umask; it holds charges until the next checkpoint)."""
    try:
        if path.stat().st_uid == os.geteuid():
            path.chmod(0o600)
    except FileNotFoundError:
        pass


def create_private(path: Path, dialect: str) -> None:
    """Create a new ledger file readable and writable by its owner only (0600): SQLite accepts
    an empty file as a new database (its journals take the database file's mode); DuckDB does
    not, so it creates the file itself under the umask 077. An existing file is left as it is."""
    if path.exists():
        return
    if dialect == "sqlite":
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            pass
        return
    import duckdb

    with _UMASK_LOCK:
        old = os.umask(0o077)
        try:
            duckdb.connect(str(path)).close()
        finally:
            os.umask(old)
    owner_only(path)


_UMASK_LOCK = threading.Lock()


def immediate_transactions(engine: sa.Engine, wal: bool) -> None:
    """SQLite: let SQLAlchemy (not pysqlite) open transactions, and open them with BEGIN
    IMMEDIATE, which takes the database's write lock at once (one charge at a time). A ledger
    file is kept in write-ahead-log mode with synchronous = FULL: a commit is one fsync of the
    log (about 3 ms here, against about 17 ms for the rollback journal's several), still
    durable before it returns (invariant 10). The log and its index (-wal, -shm) take the
    database file's mode (0600); the file must be on a local disk (SQLite's WAL needs shared
    memory). A connection marked SINGLE_READ (one_read) opens no transaction: its one SELECT
    reads the last committed state without taking the write lock."""

    @sa.event.listens_for(engine, "connect")
    def _no_driver_transactions(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        if wal:
            dbapi_connection.execute("PRAGMA journal_mode = WAL")
            dbapi_connection.execute("PRAGMA synchronous = FULL")

    @sa.event.listens_for(engine, "begin")
    def _begin_immediate(conn: sa.Connection) -> None:
        if not conn.get_execution_options().get(SINGLE_READ):
            conn.exec_driver_sql("BEGIN IMMEDIATE")


__all__ = [
    "SINGLE_READ",
    "create_private",
    "duckdb_turns",
    "immediate_transactions",
    "ledger_file",
    "one_read",
    "owner_only",
]
