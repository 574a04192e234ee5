"""A PostgreSQL database of its own for each test process (each pytest-xdist worker, or the one
process of `pytest -n 0`).

Before collection, this plugin creates the database `<TOPK_PG_DSN's dbname>_<worker>_<random>` on
the server of TOPK_PG_DSN and points TOPK_PG_DSN at it for the rest of the process (fixtures,
module constants and subprocesses all read it from there). At the end of the process it drops
the database again (`DROP DATABASE ... WITH (FORCE)`: server sessions a test left open do not keep
it). So everything that is one per database (the SQL functions' schema `topk` and its single
`topk.settings` row, the statistics views of test_oblivious_server.py, fixed table names) is one
per worker, and tests touching it can run on several workers at once.

Each database has synchronous_commit = off (ALTER DATABASE; the sessions of the SQL functions'
servers too): a commit returns before its WAL record is flushed, so the suite's thousands of
ledger commits do not each wait for an fsync (about 8 ms on this machine's disk under load, 0.7
ms without). What other sessions see, locks, and what survives a killed client are the same; only
a crash of the server itself could lose the last commits, and no test crashes it.

Each database carries a comment naming the host and the process that made it; a database whose
process on this host is gone (a run killed with SIGKILL) is dropped by the next run's setup.

Needs a role that may create databases (a superuser, as the SQL functions' tests need anyway).
When the server is unreachable, nothing is done here: tests/stores_postgres.py says what to do.
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

DEFAULT_PG_DSN = "host=127.0.0.1 port=5432 dbname=test"
COMMENT = "topk_middleware test database of {host} pid {pid}"
_made: dict[str, str] = {}  # "server": the DSN of the server's own database, "name": ours


def _process_name(config: pytest.Config) -> str:
    worker = getattr(config, "workerinput", {}).get("workerid")
    return worker or "main"


def _controller(config: pytest.Config) -> bool:
    """The xdist controller, which runs no test (its workers make their own databases)."""
    if hasattr(config, "workerinput"):
        return False
    return bool(getattr(config.option, "numprocesses", None)) and config.getvalue("dist") != "no"


def _drop_orphans(conn: psycopg.Connection[Any], prefix: str) -> None:
    """Drop test databases of this host whose creating process no longer runs."""
    host = socket.gethostname()
    rows = conn.execute(
        "SELECT d.datname, pg_catalog.shobj_description(d.oid, 'pg_database') FROM "
        "pg_catalog.pg_database AS d WHERE d.datname LIKE %s",
        [prefix.replace("_", r"\_") + r"\_%"],
    ).fetchall()
    for name, comment in rows:
        for pid_text in _orphan_pid(comment, host):
            try:
                os.kill(int(pid_text), 0)
            except ProcessLookupError:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
            except PermissionError:  # a live process of another user
                pass


def _orphan_pid(comment: str | None, host: str) -> list[str]:
    head = COMMENT.format(host=host, pid="")
    if not comment or not comment.startswith(head):
        return []
    pid = comment[len(head) :]
    return [pid] if pid.isdigit() else []


def pytest_configure(config: pytest.Config) -> None:
    if _controller(config) or config.getoption("help", False) or config.getoption("version", 0):
        return
    server = os.environ.get("TOPK_PG_DSN", DEFAULT_PG_DSN)
    try:
        conn = psycopg.connect(server, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError:
        return  # stores_postgres.pg_conninfo reports it (or starts a throwaway server)
    with conn:
        base = conn.execute("SELECT current_database()").fetchone()[0]
        prefix = f"{base[:40]}_t"
        name = f"{prefix}_{_process_name(config)}_{uuid.uuid4().hex[:8]}"
        _drop_orphans(conn, prefix)
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except psycopg.errors.InsufficientPrivilege as error:
            raise pytest.UsageError(
                f"the tests give each worker a database of its own, and the role of TOPK_PG_DSN="
                f"{server!r} may not create one ({error}): use a superuser or grant CREATEDB"
            ) from None
        conn.execute(
            sql.SQL("COMMENT ON DATABASE {} IS {}").format(
                sql.Identifier(name),
                sql.Literal(COMMENT.format(host=socket.gethostname(), pid=os.getpid())),
            )
        )
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET synchronous_commit = off").format(sql.Identifier(name))
        )
    _made.update(server=server, name=name)
    os.environ["TOPK_PG_DSN"] = psycopg.conninfo.make_conninfo(server, dbname=name)


def pytest_unconfigure(config: pytest.Config) -> None:
    if not _made:
        return
    server, name = _made.pop("server"), _made.pop("name")
    os.environ["TOPK_PG_DSN"] = server
    with psycopg.connect(server, autocommit=True, connect_timeout=5) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
