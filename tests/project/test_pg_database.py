"""tests/pg_database.py: each test process works in a PostgreSQL database of its own."""

from __future__ import annotations

import os
import socket
import uuid

import psycopg
import pytest
from psycopg import sql

from tests import pg_database
from tests.stores_postgres import _connect


def test_this_process_has_a_database_of_its_own(pg_conninfo: str) -> None:
    """TOPK_PG_DSN names the database made for this process (its comment names this pid), not
    the server's database it was given."""
    if not pg_database._made:
        pytest.skip("no server at TOPK_PG_DSN: pg_conninfo started or skipped one")
    name = psycopg.conninfo.conninfo_to_dict(os.environ["TOPK_PG_DSN"])["dbname"]
    assert name == pg_database._made["name"]
    with _connect(pg_conninfo) as conn:
        current, comment = conn.execute(
            "SELECT current_database(), shobj_description(oid, 'pg_database') FROM pg_database "
            "WHERE datname = current_database()"
        ).fetchone()
    assert current == name
    assert comment == pg_database.COMMENT.format(host=socket.gethostname(), pid=os.getpid())


def test_orphans_of_dead_processes_are_dropped_and_others_kept(pg_conninfo: str) -> None:
    """A database whose comment names a process of this host that is gone is dropped; one
    naming a live process (this one) is kept."""
    prefix = f"topk_orphans_{uuid.uuid4().hex[:6]}_t"
    dead, alive = f"{prefix}_gw0_dead", f"{prefix}_gw1_alive"
    gone = 2**22 + 12345  # above the largest pid Linux allows (2**22): no process has it
    with _connect(pg_conninfo) as conn:
        try:
            for name, pid in ((dead, gone), (alive, os.getpid())):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                comment = pg_database.COMMENT.format(host=socket.gethostname(), pid=pid)
                conn.execute(
                    sql.SQL("COMMENT ON DATABASE {} IS {}").format(
                        sql.Identifier(name), sql.Literal(comment)
                    )
                )
            pg_database._drop_orphans(conn, prefix)
            left = {
                r[0]
                for r in conn.execute(
                    "SELECT datname FROM pg_database WHERE datname LIKE %s", [prefix + "%"]
                )
            }
            assert left == {alive}
        finally:
            for name in (dead, alive):
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
