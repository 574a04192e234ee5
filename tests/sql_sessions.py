"""The SQL functions' schema for the tests, and server sessions kept open between calls.

`topk_installed`: the schema topk installed once per test process into its own database
(tests/pg_database.py), dropped with that database at the end.

`session(dsn)`: one open connection per DSN (autocommit), made on first use and reused by later
calls, closed by `close_sessions` (at a role's removal, and at the end of the process). A server
session imports the project into PL/Python on its first call (about 0.3 s of CPU in the server);
reusing the session pays that once per role instead of once per call. A test that needs a fresh
session (a new snapshot, a terminated backend, session settings) opens its own with
stores_postgres._connect.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from frontends import sql_function

from .stores_postgres import _connect

_open: dict[str, psycopg.Connection[Any]] = {}
_kept: set[str] = set()  # sessions that outlive a test (the administrator's, a shared role's)


def session(dsn: str, keep: bool = False) -> psycopg.Connection[Any]:
    """The open connection of `dsn` (a new one if it was never opened, or was closed or broken).
    It is closed after the test (`close_test_sessions`) unless `keep`."""
    conn = _open.get(dsn)
    if conn is None or conn.closed or conn.broken:
        conn = _open[dsn] = _connect(dsn)
    if keep:
        _kept.add(dsn)
    return conn


@contextmanager
def kept(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """`with kept(admin) as conn:` the kept session of `dsn` (not closed on leaving the block)."""
    yield session(dsn, keep=True)


def close_sessions(dsns: Iterable[str] | None = None) -> None:
    """Close the sessions of `dsns` (default: every one)."""
    for dsn in list(_open) if dsns is None else list(dsns):
        conn = _open.pop(dsn, None)
        _kept.discard(dsn)
        if conn is not None:
            conn.close()


@pytest.fixture
def close_test_sessions() -> Iterator[None]:
    """Use (autouse) in a module calling `session`: after each test, its sessions but the kept
    ones are closed (each holds a server process with the project loaded, ~100 MB)."""
    yield
    close_sessions([dsn for dsn in _open if dsn not in _kept])


@pytest.fixture(scope="session")
def topk_installed(pg_conninfo: str) -> Iterator[sql_function.Installed]:
    """The schema topk in this process's database; uninstalled (and any staged copy removed)
    at the end."""
    installed = sql_function.install(pg_conninfo)
    yield installed
    close_sessions()
    sql_function.uninstall(pg_conninfo, drop_ledger=True)
