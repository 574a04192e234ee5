"""No role that can connect locks the superuser out through the ledger's connections, shown on a
PostgreSQL cluster of the test's own.

The red team's attack: an analyst opens sessions until the server admits no more non-superusers
(max_connections - superuser_reserved_connections of them), then calls topk.my_budget() in each.
Each session's first call opens the ledger's connection to the server; where it logs in as a
superuser (a --ledger-dsn naming one), those connections take the slots PostgreSQL keeps for
superusers, and the superuser is refused ("too many clients already"). The ledger's own
role (install-sql makes it: LOGIN, no superuser) is refused a slot instead, and the analyst's
call gets a refusal in the project's words; the superuser still connects.

The cluster: initdb into a temporary directory as the server's OS user (postgres, when the tests
run as root), started by pg_ctl on a Unix socket in that directory only (no TCP port), with
max_connections 3 and superuser_reserved_connections 1; the SQL functions installed by
`topk-middleware install-sql`; stopped and removed at the end of the module. Cost: 15-20 s at
a load average of 12-13 (initdb 1.2-4 s, two installs of 3 s, four analyst sessions that load
the project into the server, 1-2 s each at that load).

The ledger's role also has a CONNECTION LIMIT (half the slots open to non-superusers, or
install-sql --ledger-connections N): on a second cluster of max_connections 8, two analyst
sessions with the limit 1: the second session's call is refused in the project's words until
the first ends. Cost: about 15 s more (initdb, three installs, a release).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from frontends import cli, sql_function

MAX_CONNECTIONS, RESERVED = 3, 1
ROOMY = 8  # the second cluster's max_connections: the ledger role's limit, not the server's
ANALYST = "topk_mallory"


def _bindir() -> Path:
    """The server programs of the PostgreSQL the tests' server runs (pg_config --bindir)."""
    pg_config = shutil.which("pg_config")
    assert pg_config, "pg_config not found: the PostgreSQL server packages are needed"
    found = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True)
    return Path(found.stdout.strip())


def _as_server_user(command: list[str]) -> list[str]:
    """`command` run as the server's OS user: postgres when the tests run as root (initdb and
    the server refuse root), else the tests' own user."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """The superuser's DSN of a new cluster on a socket in a temporary directory."""
    yield from _cluster(MAX_CONNECTIONS, RESERVED)


@pytest.fixture(scope="module")
def roomy_cluster() -> Iterator[str]:
    """The same with ROOMY slots, RESERVED of them kept for superusers."""
    yield from _cluster(ROOMY, RESERVED)


def _cluster(max_connections: int, reserved: int) -> Iterator[str]:
    home = Path(tempfile.mkdtemp(prefix="topk_cluster_"))
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(home, owner.pw_uid, owner.pw_gid)
    bindir, data = _bindir(), home / "data"
    run = lambda *args: subprocess.run(  # noqa: E731
        _as_server_user([str(a) for a in args]), capture_output=True, text=True, check=True
    )
    run(bindir / "initdb", "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
    settings = (
        f"-c listen_addresses='' -c unix_socket_directories={home} -p 5432 "
        f"-c max_connections={max_connections} -c superuser_reserved_connections={reserved} "
        "-c fsync=off -c shared_buffers=16MB"
    )
    run(bindir / "pg_ctl", "-D", data, "-l", home / "log", "-w", "-o", settings, "start")
    try:
        yield f"host={home} port=5432 dbname=postgres user=postgres"
    finally:
        run(bindir / "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(home, ignore_errors=True)


def _attack(cluster: str) -> tuple[list[psycopg.Connection[Any]], list[psycopg.Error]]:
    """The analyst's sessions, as many as the server admits, each calling topk.my_budget(): the
    open sessions and the errors their calls raised."""
    dsn = psycopg.conninfo.make_conninfo(cluster, user=ANALYST)
    sessions: list[psycopg.Connection[Any]] = []
    deadline = time.monotonic() + 10
    while True:
        try:
            sessions.append(psycopg.connect(dsn, autocommit=True))
        except psycopg.OperationalError as refused:
            assert "reserved for non-replication superuser" in str(refused), refused
            if len(sessions) == MAX_CONNECTIONS - RESERVED:
                break
            # a connection closed a moment ago (ours) keeps its slot until its backend exits
            assert time.monotonic() < deadline, f"{len(sessions)} analyst sessions admitted"
            time.sleep(0.05)
    errors = []
    for conn in sessions:
        try:
            conn.execute("SELECT * FROM topk.my_budget()").fetchall()
        except psycopg.Error as error:
            errors.append(error)
    return sessions, errors


def _superuser_connects(cluster: str) -> str:
    """'yes', or the server's reason for refusing the superuser."""
    try:
        with psycopg.connect(cluster, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
        return "yes"
    except psycopg.OperationalError as refused:
        return str(refused).rsplit("FATAL:", 1)[-1].strip()


def _quiet(cluster: str, sessions: Sequence[psycopg.Connection[Any]] = ()) -> None:
    """Close `sessions` and wait until no other client is connected (the ledger's connections
    of ended sessions, install-sql's, end a moment after them)."""
    for conn in sessions:
        conn.close()
    deadline = time.monotonic() + 30
    while True:
        if _superuser_connects(cluster) == "yes":
            with psycopg.connect(cluster) as conn:
                others = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                    "AND pid <> pg_backend_pid()"
                ).fetchone()[0]
            if others == 0:
                return
        assert time.monotonic() < deadline, "the analyst's sessions did not end"
        time.sleep(0.1)


def test_an_analyst_holding_every_slot_cannot_lock_the_superuser_out(
    cluster: str, capsys: Any
) -> None:
    """With the ledger's own role the superuser connects while the analyst holds every slot
    open to non-superusers, and the analyst's calls, whose ledger connections find no slot, are
    refused in the project's words (SQLSTATE 53300, no driver message, socket or traceback,
    where a bare failure would show SQLAlchemy's error and a PL/Python traceback). With
    --ledger-dsn naming the superuser, the same attack locks the superuser out: the
    first call's ledger connection takes the reserved slot; install-sql says that it could."""
    assert cli.main(["install-sql", "--dsn", cluster]) == 0
    assert "could lock the superusers out" not in capsys.readouterr().out
    _quiet(cluster)
    with psycopg.connect(cluster, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {ANALYST} LOGIN")
        admin.execute("SELECT topk.grant_budget(%s, 1.0, 1e-6)", [ANALYST])
        socket = admin.execute("SHOW unix_socket_directories").fetchone()[0]
    sessions, errors = _attack(cluster)
    try:
        assert _superuser_connects(cluster) == "yes"
        # the analyst holds every slot open to non-superusers: no ledger connection gets one
        assert len(errors) == len(sessions)
        for error in errors:
            assert error.sqlstate == sql_function.NO_SLOT, error
            primary = error.diag.message_primary or ""
            assert primary.startswith("topk: the budget ledger could not open its connection")
            assert "slots are reserved for non-replication superuser" in primary
            assert "nothing was read, released or charged" in primary
            assert "Traceback" not in str(error) and error.diag.context is None
            assert socket not in str(error) and "sqlalchemy" not in str(error)
    finally:
        _quiet(cluster, sessions)
    assert errors, "the attack never ran out of slots"

    superuser_ledger = psycopg.conninfo.make_conninfo(
        host=socket, port=5432, dbname="postgres", user="postgres"
    )
    assert cli.main(["install-sql", "--dsn", cluster, "--ledger-dsn", superuser_ledger]) == 0
    assert "could lock the superusers out" in capsys.readouterr().out
    _quiet(cluster)
    sessions, _ = _attack(cluster)
    try:
        assert "too many clients already" in _superuser_connects(cluster)
    finally:
        _quiet(cluster, sessions)


def _ledger_limit(cluster: str) -> int:
    with psycopg.connect(cluster) as conn:
        return int(
            conn.execute(
                "SELECT rolconnlimit FROM pg_roles WHERE rolname LIKE 'topk\\_ledger\\_%'"
            ).fetchone()[0]
        )


def test_the_ledger_role_holds_at_most_its_connection_limit(
    roomy_cluster: str, capsys: Any
) -> None:
    """install-sql gives the ledger's role a CONNECTION LIMIT (pg_roles.rolconnlimit): by
    default half the slots open to non-superusers ((8 - 1) // 2 = 3 here), or
    --ledger-connections N. With the limit 1, a release from the first analyst session opens
    the ledger's one connection and runs; the second session's call is refused in the
    project's words (SQLSTATE 53300, the server's reason, the hint naming
    --ledger-connections), charging nothing; once the first session has ended, it runs."""
    cluster = roomy_cluster
    with psycopg.connect(cluster, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {ANALYST} LOGIN")
        admin.execute("CREATE TABLE votes (id bigint, score bigint)")
        admin.execute("INSERT INTO votes SELECT i, 1000 / (i + 1) FROM generate_series(0, 99) i")
    assert cli.main(["install-sql", "--dsn", cluster]) == 0
    assert "ledger connection limit: 3 at once" in capsys.readouterr().out
    assert _ledger_limit(cluster) == (ROOMY - RESERVED) // 2
    command = ["install-sql", "--dsn", cluster, "--ledger-connections", "1"]
    assert cli.main([*command, "--source", "votes", "--grant", ANALYST]) == 0
    assert "ledger connection limit: 1 at once" in capsys.readouterr().out
    assert _ledger_limit(cluster) == 1
    _quiet(cluster)
    with psycopg.connect(cluster, autocommit=True) as admin:
        admin.execute("SELECT topk.grant_budget(%s, 10.0, 1e-6)", [ANALYST])
        admin.execute(f"GRANT EXECUTE ON FUNCTION topk.private_top_k TO {ANALYST}")
    dsn = psycopg.conninfo.make_conninfo(cluster, user=ANALYST)
    release = "SELECT * FROM topk.private_top_k('votes'::regclass, 3, 1.0)"
    first = psycopg.connect(dsn, autocommit=True)
    second = psycopg.connect(dsn, autocommit=True)
    try:
        assert len(first.execute(release).fetchall()) == 3
        with pytest.raises(psycopg.Error) as refused:
            second.execute(release)
        error = refused.value
        assert error.sqlstate == sql_function.NO_SLOT, error
        primary = error.diag.message_primary or ""
        assert primary.startswith("topk: the budget ledger could not open its connection")
        assert "too many connections for role" in primary
        assert "nothing was read, released or charged" in primary
        assert "--ledger-connections" in (error.diag.message_hint or "")
        assert "Traceback" not in str(error) and "sqlalchemy" not in str(error)
        charges = first.execute("SELECT releases FROM topk.my_budget()").fetchone()[0]
        assert charges == 1  # the first session's release only
        first.close()
        deadline = time.monotonic() + 30
        while True:  # the first session's ledger connection ends a moment after it
            try:
                assert len(second.execute(release).fetchall()) == 3
                break
            except psycopg.Error as again:
                assert again.sqlstate == sql_function.NO_SLOT, again
                assert time.monotonic() < deadline, "the ledger's connection was not freed"
                time.sleep(0.2)
    finally:
        _quiet(cluster, [first, second])
