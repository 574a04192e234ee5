"""topk.private_top_k inside the real PostgreSQL (frontends/sql_function.py).

`make test` installs PL/Python and the library topk_server first (scripts/ensure-server-side.sh);
these tests install the schema topk into the test database (install-sql, idempotent), register
tables of the session's schema (live mode) and call the function as analyst roles made for the
test (LOGIN, EXECUTE on the function, USAGE on the schema to name the table, no SELECT on it),
dropped at the end.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from itertools import permutations
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql
from scipy import stats

from frontends import cli, sql_function
from frontends.sql import bodies as bodies_module
from topk_middleware.accounting import PrivacyCost, compose, oblivious_cost, oneshot_cost
from topk_middleware.ledger import cost_from_json
from topk_middleware.mechanisms.joint import joint_cost
from topk_middleware.mechanisms.limited_domain import limited_domain_cost
from topk_middleware.mechanisms.oblivious import oblivious_depth, oblivious_guarantee
from topk_middleware.mechanisms.peeling import peeling_cost
from topk_middleware.noisy_counts import CountsPlan
from topk_middleware.privacy import calibrate

from ..helpers import assert_law_and_scale
from ..sql_sessions import close_sessions, kept, session
from ..stores_postgres import ID_COLUMN, SCORE_COLUMN, TABLE, _connect, create_table

# The schema topk is one per database, and each test process has a database of its own
# (tests/pg_database.py). One worker runs the module (its module fixtures and kept sessions serve
# every test), and, as a group, it starts at the beginning of the run (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("sql-function")

FUNCTION = "topk.private_top_k"  # one signature: GRANT names the function alone, as docs/sql.md
# What an analyst role is granted EXECUTE on: the releases (install.sql revokes it from PUBLIC).
ANALYST_FUNCTIONS = (
    FUNCTION,
    "topk.exponential_mechanism",
    "topk.peeling_top_k",
    "topk.joint_top_k",
    "topk.limited_domain_top_k",
)


@pytest.fixture(scope="module")
def installed(topk_installed: sql_function.Installed) -> sql_function.Installed:
    return topk_installed


@pytest.fixture(autouse=True)
def _sessions_per_test(close_test_sessions: None) -> None:
    """Each test's analyst sessions are closed after it (tests/sql_sessions.py)."""


@pytest.fixture(scope="module")
def register(
    pg_conninfo: str, pg_schema: str, installed: sql_function.Installed
) -> Callable[..., str]:
    """(scores, ids=None) -> the registered table's name as regclass prints it."""

    def make(scores: Any, ids: Any = None) -> str:
        name = TABLE.format(uuid.uuid4().hex[:8])
        with kept(pg_conninfo) as conn:
            create_table(conn, pg_schema, name, scores, ids)
        return sql_function.register_source(
            pg_conninfo, name, ID_COLUMN, SCORE_COLUMN, schema=pg_schema, grant=("PUBLIC",)
        )

    return make


@pytest.fixture(scope="module")
def zipf_table(register: Callable[..., str]) -> str:
    return register(np.floor(1e5 / np.arange(1, 5001)))


@pytest.fixture(scope="module")
def make_role(pg_conninfo: str, pg_schema: str, installed: Any) -> Iterator[Callable[..., str]]:
    """(epsilon=None, delta=1e-6, functions=ANALYST_FUNCTIONS) -> the DSN of a new analyst role,
    with EXECUTE on `functions` and that budget if given. The administrator's session is kept
    for the module (its server process has the project loaded)."""
    made: list[str] = []

    def make(
        epsilon: float | None = None,
        delta: float = 1e-6,  # the oblivious default carries (1 + e^eps) 1e-9
        functions: tuple[str, ...] = ANALYST_FUNCTIONS,
    ) -> str:
        role = f"topk_analyst_{uuid.uuid4().hex[:8]}"
        conn = session(pg_conninfo, keep=True)
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                sql.Identifier(pg_schema), sql.Identifier(role)
            )
        )
        for function in functions:
            conn.execute(
                sql.SQL("GRANT EXECUTE ON FUNCTION " + function + " TO {}").format(
                    sql.Identifier(role)
                )
            )
        if epsilon is not None:
            conn.execute("SELECT topk.grant_budget(%s, %s, %s)", [role, epsilon, delta])
        made.append(role)
        return psycopg.conninfo.make_conninfo(pg_conninfo, user=role)

    yield make
    close_sessions([psycopg.conninfo.make_conninfo(pg_conninfo, user=role) for role in made])
    with kept(pg_conninfo) as conn:
        for role in made:
            conn.execute(
                "DELETE FROM topk.topk_ledger_charges WHERE principal = topk.principal(%s)", [role]
            )
            conn.execute(
                "DELETE FROM topk.topk_ledger_principals WHERE principal = topk.principal(%s)",
                [role],
            )
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.fixture(scope="module")
def bystander(make_role: Callable[..., str]) -> str:
    """One analyst (budget 100, delta TOTAL_DELTA) shared by the tests whose calls are all
    refused: each asserts that it is still charged nothing, so one charge in any of them fails
    that test. Its session is kept for the module."""
    dsn = make_role(epsilon=100.0, delta=TOTAL_DELTA)
    session(dsn, keep=True)
    return dsn


def release(dsn: str, table: str, k: int, epsilon: float, *extra: Any) -> list[tuple[int, str]]:
    """One call of topk.private_top_k in the role's session (tests/sql_sessions.py)."""
    args = ", ".join(["%s"] * len(extra))
    query = f"SELECT * FROM topk.private_top_k(%s::regclass, %s, %s{', ' if extra else ''}{args})"
    return session(dsn).execute(query, [table, k, epsilon, *extra]).fetchall()


def spent(admin: str, dsn: str) -> tuple[float, int]:
    role = psycopg.conninfo.conninfo_to_dict(dsn)["user"]
    row = (
        session(admin, keep=True)
        .execute("SELECT epsilon, releases FROM topk.spent(%s)", [role])
        .fetchone()
    )
    return float(row[0]), int(row[1])


def releases_in_parallel(
    dsn: str, query: str, arguments: list[Any], calls: int, sessions: int = 4
) -> list[list[tuple[Any, ...]]]:
    """`calls` runs of `query` as the role of `dsn`, spread over `sessions` sessions running at
    once (an oblivious release mostly waits out its deadline: the waits overlap); the rows of
    each call."""

    def run(count: int) -> list[list[tuple[Any, ...]]]:
        with _connect(dsn) as conn:
            return [conn.execute(query, arguments).fetchall() for _ in range(count)]

    shares = [calls // sessions + (i < calls % sessions) for i in range(sessions)]
    with ThreadPoolExecutor(sessions) as pool:
        return [rows for share in pool.map(run, shares) for rows in share]


def test_install_reports_the_server_python(installed: sql_function.Installed) -> None:
    assert installed.server.startswith("Python 3.")
    assert "numpy" in installed.server and "topk_middleware from" in installed.server


def test_install_sql_command(pg_conninfo: str, installed: Any, capsys: Any) -> None:
    assert cli.main(["install-sql", "--dsn", pg_conninfo]) == 0
    out = capsys.readouterr().out
    assert "installed schema topk" in out
    assert "library topk_server: refusals without CONTEXT lines" in out
    assert cli.main(["install-sql", "--dsn", "host=127.0.0.1 port=1 connect_timeout=2"]) == 1
    assert "install-sql: error: cannot connect" in capsys.readouterr().err


def test_a_checkout_the_server_cannot_read_is_staged(
    pg_conninfo: str, installed: Any, tmp_path: Any, zipf_table: str, make_role: Callable[..., str]
) -> None:
    """A checkout in a directory other users cannot enter (a clone in /root, mode 0700) is
    copied where the server's OS user can read it, and the release runs from the copy. Fails
    without sql_function.stage: the server's import of the project is refused. Afterwards a
    default install records again what the other tests use: the checkout itself where the server
    can read it, else its staged copy (a clone under `mktemp -d`)."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    project, _ = sql_function.default_paths()
    for package in sql_function.PROJECT_PACKAGES:
        shutil.copytree(
            f"{project}/{package}", private / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    private.chmod(0o700)
    try:
        done = sql_function.install(pg_conninfo, project_path=str(private))
        assert done.project_path.startswith(sql_function.SERVER_DIR)
        assert f"topk_middleware from {done.project_path}" in done.server
        analyst = make_role(epsilon=5.0)
        assert len(release(analyst, zipf_table, 3, 1.0)) == 3
    finally:
        sql_function.install(pg_conninfo)  # back to the checkout the other tests use
        # sessions that loaded the project from the copy (removed below) are not reused
        close_sessions()
    restored = sql_function.install(pg_conninfo).project_path
    assert restored == installed.project_path != done.project_path
    if sql_function._unreadable(project) is None:
        assert restored == project
    else:
        assert restored.startswith(sql_function.SERVER_DIR)
    # the copy this database recorded before is removed when it records another one
    assert not Path(done.project_path).parent.exists()


def test_uninstall_sql_removes_the_schema_and_the_staged_copy(
    pg_conninfo: str, tmp_path: Any, capsys: Any
) -> None:
    """uninstall-sql in a database of its own: the schema topk and the copy staged for a
    checkout the server cannot read are gone, the checkout itself untouched; a ledger holding
    charges is kept unless --drop-ledger; a second uninstall finds nothing to remove."""
    name = f"topk_uninstall_{uuid.uuid4().hex[:8]}"
    with kept(pg_conninfo) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = psycopg.conninfo.make_conninfo(pg_conninfo, dbname=name)
    try:
        private = tmp_path / "private"
        private.mkdir(mode=0o700)
        project, _ = sql_function.default_paths()
        for package in sql_function.PROJECT_PACKAGES:
            shutil.copytree(
                f"{project}/{package}",
                private / package,
                ignore=shutil.ignore_patterns("__pycache__"),
            )
        private.chmod(0o700)
        done = sql_function.install(dsn, project_path=str(private))
        ledger_role = psycopg.conninfo.conninfo_to_dict(done.ledger_dsn)["user"]
        assert ledger_role.startswith(sql_function.LEDGER_ROLE_PREFIX)
        staged = Path(done.project_path).parent
        assert staged.parent == Path(sql_function.SERVER_DIR) and staged.is_dir()
        with _connect(dsn) as conn:
            conn.execute("SELECT topk.grant_budget(current_user::regrole, 1.0)")
            conn.execute(
                "INSERT INTO topk.topk_ledger_charges (principal, seq, charged_at, mechanism, "
                "cost, epsilon_after, delta_after, rule) VALUES (current_user, 1, now(), 'x', "
                "'{}', 0, 0, 'basic')"
            )
        assert cli.main(["uninstall-sql", "--dsn", dsn]) == 1
        assert "holds 1 charge(s)" in capsys.readouterr().err and staged.is_dir()
        assert cli.main(["uninstall-sql", "--dsn", dsn, "--drop-ledger"]) == 0
        out = capsys.readouterr().out
        assert "dropped schema topk (1 ledger charge(s))" in out and str(staged) in out
        assert not staged.exists() and (private / "topk_middleware").is_dir()
        with _connect(dsn) as conn:
            assert conn.execute("SELECT to_regnamespace('topk')").fetchone()[0] is None
            gone = conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", [ledger_role])
            assert gone.fetchone()[0] == 0  # the ledger's role went with the schema
        assert cli.main(["uninstall-sql", "--dsn", dsn]) == 0
        assert "nothing to remove" in capsys.readouterr().out
    finally:
        with kept(pg_conninfo) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            if "ledger_role" in locals():
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(ledger_role)))


def test_analyst_releases_and_cannot_read_the_counts(
    pg_conninfo: str, zipf_table: str, make_role: Callable[..., str]
) -> None:
    analyst = make_role(epsilon=5.0)
    rows = release(analyst, zipf_table, 5, 1.0)
    assert [position for position, _ in rows] == [1, 2, 3, 4, 5]
    items = [int(item) for _, item in rows]
    assert len(set(items)) == 5 and all(0 <= i < 5000 for i in items)
    # Zipf counts 1e5/r against Gumbel noise of scale 5: the top items are the top items.
    assert set(items) == {0, 1, 2, 3, 4}
    with _connect(analyst) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.SQL(zipf_table)))
    assert spent(pg_conninfo, analyst) == (pytest.approx(1.0), 1)
    # Laplace releases a set: its items come in id order, whatever their noisy scores.
    laplace = [int(item) for _, item in release(analyst, zipf_table, 5, 1.0, 0.0, "laplace")]
    assert laplace == [0, 1, 2, 3, 4]
    assert spent(pg_conninfo, analyst) == (pytest.approx(2.0), 2)
    # The operator's log has the diagnostics, read through SPI: far fewer rows than m.
    role = psycopg.conninfo.conninfo_to_dict(analyst)["user"]
    with kept(pg_conninfo) as conn:
        released_at, diagnostics = conn.execute(
            "SELECT released_at, diagnostics FROM topk.topk_ledger_charges "
            "WHERE principal = topk.principal(%s) AND seq = 1",
            [role],
        ).fetchone()
    facts = json.loads(diagnostics)
    assert released_at is not None and facts["m"] == 5000 and facts["method"] == "oneshot"
    # the oblivious default: two batches of d rows, whatever the counts
    assert facts["accesses"]["rows_fetched"] == 2 * oblivious_depth(5000, 5, 1e-9)
    assert facts["accesses"]["round_trips"] == 3  # m, then the two batches


def test_a_role_without_budget_is_refused(
    pg_conninfo: str, zipf_table: str, make_role: Callable[..., str]
) -> None:
    analyst = make_role()
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="has no privacy budget"):
        release(analyst, zipf_table, 3, 0.5)


def test_over_budget_is_refused_and_rollback_does_not_refund(
    pg_conninfo: str, zipf_table: str, make_role: Callable[..., str]
) -> None:
    analyst = make_role(epsilon=1.0)
    with _connect(analyst) as conn:
        conn.autocommit = False
        assert (
            len(
                conn.execute(
                    "SELECT * FROM topk.private_top_k(%s::regclass, 3, 0.4)", [zipf_table]
                ).fetchall()
            )
            == 3
        )
        conn.rollback()  # the analyst has seen the release: the charge stays
    assert spent(pg_conninfo, analyst) == (pytest.approx(0.4), 1)
    release(analyst, zipf_table, 3, 0.4)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="over the total epsilon = 1"):
        release(analyst, zipf_table, 3, 0.4)
    assert spent(pg_conninfo, analyst) == (pytest.approx(0.8), 2)
    release(analyst, zipf_table, 3, 0.2)  # what is left is still usable
    assert spent(pg_conninfo, analyst) == (pytest.approx(1.0), 3)


def test_the_login_role_pays_not_the_role_it_sets(
    pg_conninfo: str, zipf_table: str, make_role: Callable[..., str]
) -> None:
    analyst, other = make_role(epsilon=1.0), make_role(epsilon=1.0)
    names = [psycopg.conninfo.conninfo_to_dict(d)["user"] for d in (analyst, other)]
    with kept(pg_conninfo) as conn:
        conn.execute(sql.SQL("GRANT {} TO {}").format(*map(sql.Identifier, reversed(names))))
    with _connect(analyst) as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(names[1])))
        conn.execute("SELECT * FROM topk.private_top_k(%s::regclass, 3, 0.5)", [zipf_table])
    assert spent(pg_conninfo, analyst) == (pytest.approx(0.5), 1)
    assert spent(pg_conninfo, other) == (0.0, 0)


def test_concurrent_sessions_never_overspend(
    pg_conninfo: str, zipf_table: str, make_role: Callable[..., str]
) -> None:
    analyst = make_role(epsilon=1.0)
    outcomes: list[str] = []
    start = threading.Barrier(8)

    def session() -> None:
        with _connect(analyst) as conn:
            start.wait()
            for _ in range(2):
                try:
                    conn.execute(
                        "SELECT * FROM topk.private_top_k(%s::regclass, 2, 0.25)", [zipf_table]
                    ).fetchall()
                    outcomes.append("released")
                except psycopg.errors.InsufficientPrivilege:
                    outcomes.append("refused")

    threads = [threading.Thread(target=session) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Counter(outcomes) == {"released": 4, "refused": 12}
    assert spent(pg_conninfo, analyst) == (pytest.approx(1.0), 4)


@pytest.mark.parametrize(
    ("k", "epsilon", "extra", "error", "words"),
    [
        (0, 1.0, (), psycopg.errors.InvalidParameterValue, "k must be >= 1, got 0"),
        (-2, 1.0, (), psycopg.errors.InvalidParameterValue, "k must be >= 1"),
        (
            5001,
            1.0,
            (),
            psycopg.errors.InvalidParameterValue,
            "refused for a reason in the table's data",
        ),
        (3, 0.0, (), psycopg.errors.InvalidParameterValue, "epsilon must be finite and > 0"),
        (3, -1.0, (), psycopg.errors.InvalidParameterValue, "epsilon must be finite and > 0"),
        (3, math.nan, (), psycopg.errors.InvalidParameterValue, "epsilon must be finite"),
        (3, math.inf, (), psycopg.errors.InvalidParameterValue, "epsilon must be finite"),
        (3, 1.0, (1.5,), psycopg.errors.InvalidParameterValue, "delta must be in [0, 1)"),
        (3, 1.0, (0.0, "cauchy"), psycopg.errors.InvalidParameterValue, "noise must be one of"),
        (None, 1.0, (), psycopg.errors.NullValueNotAllowed, "k must not be NULL"),
        (3, None, (), psycopg.errors.NullValueNotAllowed, "epsilon must not be NULL"),
        (3, 1.0, (None,), psycopg.errors.NullValueNotAllowed, "delta must not be NULL"),
        (3, 1.0, (0.0, None), psycopg.errors.NullValueNotAllowed, "noise must not be NULL"),
    ],
)
def test_bad_arguments_get_clear_errors_and_charge_nothing(
    pg_conninfo: str,
    zipf_table: str,
    bystander: str,
    k: Any,
    epsilon: Any,
    extra: tuple[Any, ...],
    error: type[Exception],
    words: str,
) -> None:
    with pytest.raises(error, match=re.escape(words)):
        release(bystander, zipf_table, k, epsilon, *extra)
    assert spent(pg_conninfo, bystander) == (0.0, 0)


def test_unregistered_and_null_sources_are_refused(
    pg_conninfo: str, pg_schema: str, make_role: Callable[..., str]
) -> None:
    analyst = make_role(epsilon=100.0)
    name = TABLE.format("unregistered")
    with kept(pg_conninfo) as conn:
        create_table(conn, pg_schema, name, [3, 2, 1], None)
        table = sql.Identifier(pg_schema, name).as_string(conn)
    with pytest.raises(psycopg.errors.UndefinedObject, match="is not registered"):
        release(analyst, table, 1, 1.0)
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="source must not be NULL"):
        release(analyst, None, 1, 1.0)
    assert spent(pg_conninfo, analyst) == (0.0, 0)


def test_budget_administration(pg_conninfo: str, make_role: Callable[..., str]) -> None:
    analyst = make_role()
    role = psycopg.conninfo.conninfo_to_dict(analyst)["user"]
    with kept(pg_conninfo) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="has no privacy budget"):
            conn.execute("SELECT * FROM topk.spent(%s)", [role])
        for epsilon, delta, words in [
            (0.0, 0.0, "epsilon must be finite and > 0"),
            (math.nan, 0.0, "epsilon must be finite and > 0"),
            (1.0, 1.0, "delta must be in [0, 1)"),
        ]:
            with pytest.raises(psycopg.errors.InvalidParameterValue, match=re.escape(words)):
                conn.execute("SELECT topk.grant_budget(%s, %s, %s)", [role, epsilon, delta])
        with pytest.raises(psycopg.errors.NullValueNotAllowed, match="epsilon must not be NULL"):
            conn.execute("SELECT topk.grant_budget(%s, NULL)", [role])
        with pytest.raises(psycopg.errors.UndefinedObject, match="does not exist"):
            conn.execute("SELECT topk.grant_budget('no_such_role_topk', 1.0)")
        conn.execute("SELECT topk.grant_budget(%s, 1.0, 1e-6)", [role])
        conn.execute("SELECT topk.grant_budget(%s, 3.0)", [role])  # changed, not added
        row = conn.execute("SELECT * FROM topk.spent(%s)", [role]).fetchone()
    assert row == (0.0, 0.0, row[2], 0, 3.0, 0.0)
    # An analyst cannot administer budgets: EXECUTE is the owner's to grant.
    with _connect(analyst) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT topk.grant_budget(%s, 100.0)", [role])


ROLE = object()  # stands for the test's role in the arguments below


def clean_refusal(error: pytest.ExceptionInfo[psycopg.Error], words: str) -> None:
    """The refusal came through the plpgsql front: the project's message, without PL/Python's
    exception name (plpy.Error) or traceback, and without a CONTEXT line (topk._refuse's C
    form)."""
    primary = error.value.diag.message_primary or ""
    assert primary.startswith("topk: ") and words in primary, primary
    assert "plpy" not in primary and "Traceback" not in str(error.value)
    assert error.value.diag.context is None, error.value.diag.context


@pytest.mark.parametrize(
    ("query", "arguments", "error", "words"),
    [
        (
            "SELECT topk.grant_budget(%s, %s, %s)",
            (None, 1.0, 0.0),
            "22004",
            "role must not be NULL",
        ),
        ("SELECT topk.grant_budget(%s, %s, %s)", (ROLE, None, 0.0), "22004", "epsilon must not be"),
        ("SELECT topk.grant_budget(%s, %s, %s)", (ROLE, 1.0, None), "22004", "delta must not be"),
        (
            "SELECT topk.grant_budget(%s, %s, %s)",
            (ROLE, 0.0, 0.0),
            "22023",
            "epsilon must be finite",
        ),
        (
            "SELECT topk.grant_budget(%s, %s, %s)",
            (ROLE, -2.0, 0.0),
            "22023",
            "epsilon must be finite",
        ),
        ("SELECT topk.grant_budget(%s, %s, %s)", (ROLE, math.nan, 0.0), "22023", "epsilon must be"),
        (
            "SELECT topk.grant_budget(%s, %s, %s)",
            (ROLE, 1.0, -0.1),
            "22023",
            "delta must be in [0, 1)",
        ),
        (
            "SELECT topk.grant_budget(%s, %s, %s)",
            (ROLE, 1.0, 1.0),
            "22023",
            "delta must be in [0, 1)",
        ),
        ("SELECT * FROM topk.spent(%s)", (None,), "22004", "role must not be NULL"),
        ("SELECT * FROM topk.spent(%s)", (ROLE,), "42501", "has no privacy budget"),
    ],
)
def test_budget_administration_refusals_are_plain_sql_errors(
    pg_conninfo: str,
    make_role: Callable[..., str],
    query: str,
    arguments: tuple[Any, ...],
    error: str,
    words: str,
) -> None:
    """Fails with the PL/Python bodies called directly: their message starts "plpy.Error: "."""
    role = psycopg.conninfo.conninfo_to_dict(make_role())["user"]
    with kept(pg_conninfo) as conn, pytest.raises(psycopg.Error) as caught:
        conn.execute(query, [role if a is ROLE else a for a in arguments])
    assert caught.value.sqlstate == error
    clean_refusal(caught, words)
    with kept(pg_conninfo) as conn:  # nothing was granted
        left = conn.execute(
            "SELECT count(*) FROM topk.topk_ledger_principals WHERE principal = topk.principal(%s)",
            [role],
        )
        assert left.fetchone()[0] == 0


def test_the_front_rewrites_only_the_project_refusals(pg_conninfo: str, installed: Any) -> None:
    """topk._refuse, the one helper of every front, in its C form (the library topk_server that
    `make test` builds first): a PL/Python refusal of the project comes out as a plain error with
    its SQLSTATE, message and hint and no CONTEXT line, even from inside a PL/pgSQL function;
    anything else is left to the front's bare RAISE (as it came)."""
    assert installed.native, "no library topk_server on the server: make server-side"
    with kept(pg_conninfo) as conn:
        language = conn.execute(
            "SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang "
            "WHERE p.oid = 'topk._refuse(text, text, text)'::regprocedure"
        ).fetchone()[0]
        assert language == "c"
        assert conn.execute(
            "SELECT topk._refuse('22012', 'division by zero', NULL)::text"
        ).fetchone() == ("",)
        with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
            conn.execute("SELECT topk._refuse('22023', 'plpy.Error: topk: k must be >= 1', 'h')")
        with pytest.raises(psycopg.errors.NumericValueOutOfRange) as nested:
            conn.execute(
                "DO $$ BEGIN PERFORM topk._refuse('22003', 'plpy.Error: topk: too big', ''); END $$"
            )
    assert caught.value.diag.message_primary == "topk: k must be >= 1"
    assert caught.value.diag.message_hint == "h"
    assert caught.value.diag.context is None
    assert nested.value.diag.message_primary == "topk: too big"
    assert nested.value.diag.message_hint is None and nested.value.diag.context is None


def test_without_the_library_refusals_keep_their_words(pg_conninfo: str) -> None:
    """topk._refuse's PL/pgSQL form (install.sql: what a server without the library topk_server
    keeps), made in pg_temp: the same SQLSTATE, message and hint, plus PL/pgSQL's CONTEXT line;
    anything else returns."""
    text = resources.files("frontends").joinpath("sql/install.sql").read_text(encoding="utf-8")
    start = text.index("CREATE OR REPLACE FUNCTION topk._refuse(")
    body = text[start : text.index("$$;", start) + 3].replace("topk._refuse", "pg_temp.refuse")
    with kept(pg_conninfo) as conn:
        conn.execute(body)
        returned = conn.execute("SELECT pg_temp.refuse('22012', 'division by zero', NULL)::text")
        assert returned.fetchone() == ("",)
        with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
            conn.execute("SELECT pg_temp.refuse('22023', 'plpy.Error: topk: k must be >= 1', 'h')")
    assert caught.value.diag.message_primary == "topk: k must be >= 1"
    assert caught.value.diag.message_hint == "h"
    assert "PL/pgSQL function" in (caught.value.diag.context or "")
    with kept(pg_conninfo) as conn, pytest.raises(psycopg.errors.UndefinedObject) as caught:
        conn.execute("SELECT topk.grant_budget('no_such_role_topk', 1.0)")
    assert caught.value.diag.message_primary == 'role "no_such_role_topk" does not exist'


def test_a_dropped_table_leaves_the_registry(
    pg_conninfo: str, register: Callable[..., str], make_role: Callable[..., str]
) -> None:
    table = register([5, 4, 3])
    analyst = make_role(epsilon=10.0)
    assert len(release(analyst, table, 1, 1.0)) == 1
    with kept(pg_conninfo) as conn:
        oid = conn.execute("SELECT %s::regclass::oid", [table]).fetchone()[0]
        conn.execute(sql.SQL("DROP TABLE {} CASCADE").format(sql.SQL(table)))
        left = conn.execute("SELECT count(*) FROM topk.sources WHERE source = %s", [oid])
        assert left.fetchone()[0] == 0


def plackett_luce(scores: np.ndarray, scale: float, k: int) -> dict[tuple[int, ...], float]:
    """Exact law of the ranked top-k of scores + Gumbel(scale) noise: Plackett-Luce with weights
    exp(score / scale) (the Gumbel-max trick, applied k times)."""
    weights = np.exp(scores / scale)
    law = {}
    for ranking in permutations(range(len(scores)), k):
        p, left = 1.0, weights.sum()
        for item in ranking:
            p *= weights[item] / left
            left -= weights[item]
        law[ranking] = p
    return law


def test_output_law_is_plackett_luce(
    pg_conninfo: str, register: Callable[..., str], make_role: Callable[..., str]
) -> None:
    """400 unseeded releases (the SQL function has no seed) of the ranked top-2 of 4 items
    against the exact Plackett-Luce law (12 rankings, the least likely expected ~7.6 times):
    Pearson's chi-square and the score test of the scale at 5e-4 each
    (tests.helpers.assert_law_and_scale; false-failure rate 0.1%). Fails if the noise scale,
    the ranking or the snapshot reads are wrong: a scale halved fails with probability 1.0,
    doubled 0.9999, 20% too small 0.41, 20% too large 0.29 (simulated, 40,000 samples of 400;
    the chi-square alone of 600 releases: 1.0, 1.0, 0.29 and 0.17)."""
    scores = np.array([3.0, 2.0, 1.0, 0.0])
    k, epsilon, calls = 2, 1.0, 400
    table = register(scores)
    analyst = make_role(epsilon=1e6, delta=0.5)  # 400 oblivious releases of (1 + e) 1e-9 each
    scale = calibrate("gumbel", k, len(scores), epsilon, 0.0).scale
    rankings = sorted(plackett_luce(scores, scale, k))
    seen: Counter[tuple[int, ...]] = Counter()
    query = "SELECT item FROM topk.private_top_k(%s::regclass, %s, %s) ORDER BY position"
    for rows in releases_in_parallel(analyst, query, [table, k, epsilon], calls):
        seen[tuple(int(item) for (item,) in rows)] += 1

    def law(b: float) -> np.ndarray:
        probs = plackett_luce(scores, b, k)
        return np.array([probs[r] for r in rankings])

    observed = np.array([seen[r] for r in rankings])
    assert observed.sum() == calls and law(scale).min() * calls > 7
    assert_law_and_scale(observed, law, scale)


def test_spi_reads_serve_the_canonical_order_with_ties_and_text_ids(
    pg_conninfo: str, pg_schema: str, register: Callable[..., str]
) -> None:
    """The SPI source inside the server (a test-only, seeded function, never installed). Its
    keyset pages of 7 rows on the (score DESC, id) B-tree, boundaries inside ties of text ids,
    give the canonical order (score descending, ids in byte order) with each row's position; and
    the threshold run (sorted pages, random access by position) equals the one-shot run on the
    same noise (invariant 2)."""
    rng = np.random.default_rng(5)
    scores = np.concatenate([np.full(40, 50.0), rng.integers(0, 6, 160).astype(float)])
    ids = np.array([f"item-{i:05d}" if i % 3 else f"Item {i}" for i in range(200)])
    table = register(scores, ids)
    probe = sql.Identifier(pg_schema, "spi_probe")
    body = (
        "import json\n"
        "from frontends.plpython import SPITable\n"
        "from frontends.sql.sources import registration\n"
        "from topk_middleware import private_top_k\n"
        "f = registration(plpy, GD, source)\n"
        "t = SPITable(plpy, f['relation'], f['id_column'], f['score_column'], f['id_type'], "
        "f['score_type'], f['position_table'], f['trigger_prefix'], bool(f['text_ids']))\n"
        "t.sensitivity = 1.0  # declared by the registration (never assumed)\n"
        "with t.snapshot():\n"
        "    pages = [t.read_sorted(d, 7) for d in range(0, t.domain_size(), 7)]\n"
        "order = [(int(p), i) for r in pages for p, i in zip(r.positions, r.ids)]\n"
        "a = private_top_k(t, 10, 2.0, seed=seed, method='threshold', oracle='eager')\n"
        "b = private_top_k(t, 10, 2.0, seed=seed, method='oneshot_full_read')\n"
        "return json.dumps([order, a.items, b.items, a.method, a.diagnostics.plan['oracle']])\n"
    )
    with kept(pg_conninfo) as conn:
        conn.execute(
            sql.SQL(
                "CREATE FUNCTION {}(source text, seed integer) RETURNS text LANGUAGE plpython3u "
                "AS {}"
            ).format(probe, sql.Literal(sql_function.BOOT + "\n" + body))
        )
        canonical = conn.execute(
            sql.SQL(
                "SELECT p.position, b.{id} FROM {t} AS b JOIN {pos} AS p ON p.id = b.{id} "
                'ORDER BY b.{score} DESC, b.{id} COLLATE "C"'
            ).format(
                id=sql.Identifier(ID_COLUMN),
                score=sql.Identifier(SCORE_COLUMN),
                t=sql.SQL(table),
                pos=sql.SQL(
                    conn.execute(
                        "SELECT position_table::text FROM topk.sources WHERE source = %s::regclass",
                        [table],
                    ).fetchone()[0]
                ),
            )
        ).fetchall()
        assert sorted(canonical, key=lambda r: r[1].encode())[0][1] == "Item 0"
        for seed in range(4):
            (text,) = conn.execute(
                sql.SQL("SELECT {}(%s, %s)").format(probe), [table, seed]
            ).fetchone()
            order, threshold, oneshot, method, oracle = json.loads(text)
            assert [tuple(r) for r in order] == canonical
            assert (method, oracle) == ("threshold", "eager")
            assert threshold == oneshot and len(set(threshold)) == 10


# The first lines of the bodies in a database whose functions were installed while BOOT imported
# the module frontends.sql_function: they stay in the database until install-sql runs again.
SQL_FUNCTION_BOOT = """if "topk" not in GD:
    import site, sys
    _where = plpy.execute("SELECT project_path, site_packages FROM topk.settings")
    if not len(_where):
        plpy.error("topk: not installed (no row in topk.settings): run topk-middleware install-sql")
    sys.path.insert(0, _where[0]["project_path"])
    site.addsitedir(_where[0]["site_packages"])
    from frontends import sql_function
    GD["topk"] = sql_function"""


def test_bodies_importing_frontends_sql_function_keep_working(
    pg_conninfo: str, pg_schema: str, installed: sql_function.Installed
) -> None:
    """A body whose BOOT imports frontends.sql_function, in a session where no other body has
    set GD["topk"], finds there every server_* that an installed function calls, and runs one
    (server_check, which opens the ledger); the bodies install-sql writes import
    frontends.sql.bodies, whose server_* are the same functions."""
    probe = sql.Identifier(pg_schema, "sql_function_boot_probe")
    servers = sorted({f.server for f in sql_function.SQL_FUNCTIONS} | {"server_check"})
    body = (
        "import json\n"
        f"missing = [n for n in {servers!r} if not callable(getattr(GD['topk'], n, None))]\n"
        "return json.dumps([GD['topk'].__name__, missing, GD['topk'].server_check(plpy, GD)])\n"
    )
    with kept(pg_conninfo) as admin:
        admin.execute(
            sql.SQL("CREATE FUNCTION {}() RETURNS text LANGUAGE plpython3u AS {}").format(
                probe, sql.Literal(SQL_FUNCTION_BOOT + "\n" + body)
            )
        )
        bodies = admin.execute(
            "SELECT p.proname, p.prosrc FROM pg_proc AS p JOIN pg_language AS l "
            "ON l.oid = p.prolang WHERE p.pronamespace = 'topk'::regnamespace "
            "AND l.lanname = 'plpython3u'"
        ).fetchall()
    try:
        with psycopg.connect(pg_conninfo, autocommit=True) as fresh:
            (text,) = fresh.execute(sql.SQL("SELECT {}()").format(probe)).fetchone()
        module, missing, server = json.loads(text)
        assert (module, missing) == ("frontends.sql_function", [])
        assert server.startswith("Python 3.") and "topk_middleware from" in server
    finally:
        with kept(pg_conninfo) as admin:
            admin.execute(sql.SQL("DROP FUNCTION {}()").format(probe))
    assert len(bodies) == len(sql_function.SQL_FUNCTIONS) + 1  # and topk._check
    assert all("from frontends.sql import bodies" in source for _, source in bodies)
    assert {getattr(sql_function, name) for name in servers} == {
        getattr(bodies_module, name) for name in servers
    }


# ----- the other mechanisms: topk.exponential_mechanism, peeling_top_k, joint_top_k,
# limited_domain_top_k (each charged its own module's cost through budget=) ----------------------
M = 5000  # rows of zipf_table
MECHANISMS: dict[str, tuple[str, Callable[..., tuple[Any, ...]], Callable[..., PrivacyCost]]] = {
    # name: (the SQL call, (k, epsilon) -> its arguments after the source, (k, epsilon) -> cost)
    "exponential": (
        "topk.exponential_mechanism(%s::regclass, %s)",  # oblivious: the default
        lambda k, epsilon: (epsilon,),
        lambda k, epsilon: oblivious_cost("gumbel", 1, M, epsilon),
    ),
    "peeling": (
        "topk.peeling_top_k(%s::regclass, %s, %s, false)",  # cannot be oblivious
        lambda k, epsilon: (k, epsilon),
        lambda k, epsilon: peeling_cost(k, epsilon),
    ),
    "joint": (
        "topk.joint_top_k(%s::regclass, %s, %s, false)",
        lambda k, epsilon: (k, epsilon),
        lambda k, epsilon: joint_cost(epsilon),
    ),
    "limited_domain": (  # k_bar = 20, delta = 1e-6; epsilon is the per-item Gumbel parameter
        "topk.limited_domain_top_k(%s::regclass, %s, %s, %s, %s, false)",
        lambda k, epsilon: (k, 20, epsilon, 1e-6),
        lambda k, epsilon: limited_domain_cost(k, epsilon, 1e-6),
    ),
}
TOTAL_DELTA = 1e-4  # every analyst's delta below: limited domain needs delta > 0


def call(dsn: str, function: str, source: Any, *arguments: Any) -> list[tuple[int, str | None]]:
    return session(dsn).execute(f"SELECT * FROM {function}", [source, *arguments]).fetchall()


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_mechanism_releases_and_charges_its_own_cost(
    pg_conninfo: str, zipf_table: str, make_role: Callable[..., str], name: str
) -> None:
    """An EXECUTE-only analyst gets k items of the table and is charged exactly the cost the
    mechanism's module states (compared as the ledger's stored cost and as topk.spent's
    composition); the operator's log has the diagnostics. Zipf counts 1e5/r are far apart
    against the noise, so the items are the true top k (set equality: joint is unordered)."""
    function, arguments, cost_of = MECHANISMS[name]
    k = 1 if name == "exponential" else 4
    epsilon = 2.0 if name != "limited_domain" else 0.5
    analyst = make_role(epsilon=100.0, delta=TOTAL_DELTA)
    rows = call(analyst, function, zipf_table, *arguments(k, epsilon))
    assert [position for position, _ in rows] == list(range(1, k + 1))
    assert {int(item) for _, item in rows} == set(range(k))  # type: ignore[arg-type]
    with _connect(analyst) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.SQL(zipf_table)))
    cost = cost_of(k, epsilon)
    role = psycopg.conninfo.conninfo_to_dict(analyst)["user"]
    with kept(pg_conninfo) as conn:
        stored, diagnostics = conn.execute(
            "SELECT cost, diagnostics FROM topk.topk_ledger_charges "
            "WHERE principal = topk.principal(%s)",
            [role],
        ).fetchone()
        charged = conn.execute("SELECT epsilon, releases FROM topk.spent(%s)", [role]).fetchone()
    assert cost_from_json(stored) == cost
    assert charged == (pytest.approx(compose([cost], TOTAL_DELTA).epsilon), 1)
    facts = json.loads(diagnostics)
    assert facts["m"] == M and facts["accesses"]["sorted"] > 0


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_mechanism_over_budget_and_without_budget_is_refused(
    pg_conninfo: str, zipf_table: str, make_role: Callable[..., str], name: str
) -> None:
    """A total of 1.5 times one release's composed epsilon: the first release passes, the second
    is refused before anything is read (the ledger keeps one charge); a role without a budget
    row is refused with the administrator's hint."""
    function, arguments, cost_of = MECHANISMS[name]
    k, epsilon = 2, 0.5
    one = compose([cost_of(k, epsilon)], TOTAL_DELTA).epsilon
    analyst = make_role(epsilon=1.5 * one, delta=TOTAL_DELTA)
    assert len(call(analyst, function, zipf_table, *arguments(k, epsilon))) == (
        1 if name == "exponential" else k
    )
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as caught:
        call(analyst, function, zipf_table, *arguments(k, epsilon))
    clean_refusal(caught, "over the total")
    assert spent(pg_conninfo, analyst) == (pytest.approx(one), 1)
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as caught:
        call(make_role(), function, zipf_table, *arguments(k, epsilon))
    clean_refusal(caught, "has no privacy budget")
    assert "topk.grant_budget" in (caught.value.diag.message_hint or "")


BAD_MECHANISM_ARGUMENTS = [
    ("exponential", (0.0,), "22023", "epsilon must be finite and > 0"),
    ("exponential", (math.nan,), "22023", "epsilon must be finite and > 0"),
    ("exponential", (None,), "22004", "epsilon must not be NULL"),
    ("peeling", (0, 1.0), "22023", "k must be >= 1"),
    ("peeling", (M + 1, 1.0), "22023", "refused for a reason in the table's data"),
    ("peeling", (3, -1.0), "22023", "epsilon must be finite and > 0"),
    ("peeling", (None, 1.0), "22004", "k must not be NULL"),
    ("joint", (0, 1.0), "22023", "k must be >= 1"),
    ("joint", (M + 1, 1.0), "22023", "is too much work"),  # k > 64: before m is read
    ("joint", (65, 1.0), "22023", "at most k = 64"),
    ("joint", (3, math.inf), "22023", "epsilon must be finite and > 0"),
    ("joint", (3, None), "22004", "epsilon must not be NULL"),
    ("limited_domain", (3, 20, 1.0, 0.0), "22023", "delta must be in (0, 1)"),
    ("limited_domain", (3, 20, 1.0, 1.0), "22023", "delta must be in [0, 1)"),
    ("limited_domain", (3, 2, 1.0, 1e-6), "22023", "k_bar must be >= k"),
    ("limited_domain", (3, M, 1.0, 1e-6), "22023", "refused for a reason in the table's data"),
    ("limited_domain", (0, 20, 1.0, 1e-6), "22023", "k must be >= 1"),
    ("limited_domain", (3, None, 1.0, 1e-6), "22004", "k_bar must not be NULL"),
    ("limited_domain", (3, 20, 1.0, None), "22004", "delta must not be NULL"),
]


@pytest.mark.parametrize(("name", "arguments", "state", "words"), BAD_MECHANISM_ARGUMENTS)
def test_mechanism_bad_arguments_get_clear_errors_and_charge_nothing(
    pg_conninfo: str,
    zipf_table: str,
    bystander: str,
    name: str,
    arguments: tuple[Any, ...],
    state: str,
    words: str,
) -> None:
    with pytest.raises(psycopg.Error) as caught:
        call(bystander, MECHANISMS[name][0], zipf_table, *arguments)
    assert caught.value.sqlstate == state
    clean_refusal(caught, words)
    assert spent(pg_conninfo, bystander) == (0.0, 0)


def test_mechanisms_are_not_executable_by_public(
    pg_conninfo: str, make_role: Callable[..., str]
) -> None:
    """install.sql revokes EXECUTE from PUBLIC on every function of schema topk but
    topk.my_budget() (a role's own budget) and topk.last_guarantee() (its session's last
    release's guarantee): a role granted nothing cannot call any other (nor the PL/Python bodies
    behind the fronts)."""
    nobody = psycopg.conninfo.conninfo_to_dict(make_role(epsilon=1.0, functions=()))["user"]
    with kept(pg_conninfo) as conn:
        callable_ = conn.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc AS p "
            "WHERE p.pronamespace = 'topk'::regnamespace "
            "AND has_function_privilege(%s, p.oid, 'EXECUTE')",
            [nobody],
        ).fetchall()
        names = {
            r[0]
            for r in conn.execute(
                "SELECT proname::text FROM pg_proc WHERE pronamespace = 'topk'::regnamespace"
            )
        }
    assert sorted(callable_) == [("topk.last_guarantee()",), ("topk.my_budget()",)]
    assert {"exponential_mechanism", "_peeling_top_k", "joint_top_k", "_spent"} <= names
    # the owner's preview reads exact counts: it is no SQL function at all
    assert not any("preview" in name for name in names)


def test_limited_domain_shows_bottom_as_a_null_item(
    pg_conninfo: str, register: Callable[..., str], make_role: Callable[..., str]
) -> None:
    """Two counts of 1000 over 48 counts of 5: with k = 3, k_bar = 10, epsilon = 1, delta = 1e-6
    the threshold is 5 + 1 + ln(10 / 1e-6) = 22.1 plus Gumbel(1) noise, so the two large counts
    beat it and no count of 5 does (that would need a Gumbel gap above 17: probability below
    1e-6 per call): the release is those two items, then the bottom symbol as a row with item
    NULL. Fails if the bottom were dropped or shown as an item."""
    table = register(np.concatenate([[1000.0, 1000.0], np.full(48, 5.0)]))
    analyst = make_role(epsilon=100.0, delta=TOTAL_DELTA)
    for _ in range(3):
        rows = call(analyst, MECHANISMS["limited_domain"][0], table, 3, 10, 1.0, 1e-6)
        assert [p for p, _ in rows] == [1, 2, 3]
        assert {rows[0][1], rows[1][1]} == {"0", "1"} and rows[2][1] is None
    cost = limited_domain_cost(3, 1.0, 1e-6)  # charged whatever it released
    assert spent(pg_conninfo, analyst) == (
        pytest.approx(compose([cost] * 3, TOTAL_DELTA).epsilon),
        3,
    )


def test_exponential_mechanism_law(
    pg_conninfo: str, register: Callable[..., str], make_role: Callable[..., str]
) -> None:
    """600 unseeded calls of topk.exponential_mechanism on counts (3, 2, 1, 0) at epsilon = 1,
    chi-square against its law P(i) = exp(epsilon h_i) / sum_j exp(epsilon h_j)
    (mechanisms/exponential.py, add/remove neighbours; the least likely item expected ~19
    times). A scale off by 2 (exp(h_i / 2)) moves the statistic past 60; false-failure rate
    0.1% (p < 0.001)."""
    scores = np.array([3.0, 2.0, 1.0, 0.0])
    epsilon, calls = 1.0, 600
    table = register(scores)
    analyst = make_role(epsilon=1e6, delta=0.5)  # 600 oblivious releases of (1 + e) 1e-9 each
    seen: Counter[int] = Counter()
    query = "SELECT item FROM topk.exponential_mechanism(%s::regclass, %s)"
    for ((item,),) in releases_in_parallel(analyst, query, [table, epsilon], calls):
        seen[int(item)] += 1
    law = np.exp(epsilon * scores) / np.exp(epsilon * scores).sum()
    observed = np.array([seen[i] for i in range(len(scores))])
    assert observed.sum() == calls and (law * calls).min() > 10
    assert stats.chisquare(observed, law * calls).pvalue > 1e-3


def test_with_counts_and_a_declared_sensitivity(
    pg_conninfo: str, pg_schema: str, make_role: Callable[..., str]
) -> None:
    """A table registered with sensitivity 5 (install-sql --sensitivity): the counts function
    releases (position, item, count, count_error) with the counts' scale for D = 5, and the
    ledger is charged once, the composed cost (noisy_counts.with_counts_cost)."""
    from topk_middleware.noisy_counts import CountsPlan, with_counts_cost

    name = TABLE.format(uuid.uuid4().hex[:8])
    with kept(pg_conninfo) as conn:
        create_table(conn, pg_schema, name, np.floor(1e5 / np.arange(1, 501)), None)
    table = sql_function.register_source(
        pg_conninfo,
        name,
        ID_COLUMN,
        SCORE_COLUMN,
        schema=pg_schema,
        sensitivity=5,
        grant=("PUBLIC",),
    )
    analyst = make_role(epsilon=10.0, functions=("topk.private_top_k_with_counts",))
    with _connect(analyst) as conn:
        rows = conn.execute(
            "SELECT * FROM topk.private_top_k_with_counts(%s::regclass, 3, 2.0, "
            "oblivious => false)",
            [table],
        ).fetchall()
    plan = CountsPlan.make(3, 1.0, 5)
    assert [r[0] for r in rows] == [1, 2, 3]
    assert {int(r[1]) for r in rows} == {0, 1, 2}  # counts 1e5/r are far apart
    assert all(r[3] == plan.half_width for r in rows)
    true = np.floor(1e5 / (np.array([int(r[1]) for r in rows]) + 1))
    assert (np.abs(np.array([r[2] for r in rows]) - true) <= 20 * float(plan.scale)).all()
    role = psycopg.conninfo.conninfo_to_dict(analyst)["user"]
    with kept(pg_conninfo) as conn:
        stored = conn.execute(
            "SELECT cost FROM topk.topk_ledger_charges WHERE principal = topk.principal(%s)", [role]
        ).fetchall()
    selection = oneshot_cost("gumbel", 3, 500, 1.0, 0.0, sensitivity=5)
    assert [cost_from_json(s) for (s,) in stored] == [with_counts_cost(selection, plan)]


WITH_COUNTS = "topk.private_top_k_with_counts"


def last_guarantee(conn: psycopg.Connection[Any]) -> dict[str, Any] | None:
    cur = conn.execute("SELECT * FROM topk.last_guarantee()")
    row = cur.fetchone()
    return None if row is None else dict(zip([c.name for c in cur.description], row, strict=True))


def test_last_guarantee_states_the_sensitivity_and_the_counts(
    pg_conninfo: str, pg_schema: str, make_role: Callable[..., str]
) -> None:
    """topk.last_guarantee(): no row before a release in the session; after one, the guarantee
    with the sensitivity the table was registered with (its sentence in the words), the score
    bound and, after a release with counts, the counts' scale and interval. The oblivious
    default keeps the sensitivity (the oblivious guarantee rebuilt from the calibration)."""
    name = TABLE.format(uuid.uuid4().hex[:8])
    with _connect(pg_conninfo) as conn:
        create_table(conn, pg_schema, name, np.floor(1e5 / np.arange(1, 501)), None)
    table = sql_function.register_source(
        pg_conninfo,
        name,
        ID_COLUMN,
        SCORE_COLUMN,
        schema=pg_schema,
        sensitivity=5,
        grant=("PUBLIC",),
    )
    analyst = make_role(epsilon=20.0, functions=(FUNCTION, WITH_COUNTS))
    with _connect(analyst) as conn:
        assert last_guarantee(conn) is None
        conn.execute("SELECT * FROM topk.private_top_k(%s::regclass, 3, 1.0)", [table])
        got = last_guarantee(conn)
        assert got is not None and got["sensitivity"] == 5 and got["counts_scale"] is None
        expected = oblivious_guarantee(calibrate("gumbel", 3, 500, 1.0, 0.0, sensitivity=5), 1e-9)
        assert (got["epsilon"], got["delta"], got["scale"]) == pytest.approx(
            (expected.epsilon, expected.delta, expected.scale)
        )
        assert got["score_bound"] == expected.score_bound
        assert "assumes each client changes each count by at most 5" in got["guarantee"]
        assert "oblivious access" in got["guarantee"]
        rows = conn.execute(
            "SELECT * FROM topk.private_top_k_with_counts(%s::regclass, 3, 2.0, "
            "oblivious => false)",
            [table],
        ).fetchall()
        got = last_guarantee(conn)
    plan = CountsPlan.make(3, 1.0, 5)  # bigint counts: w
    assert got is not None and got["count_error"] == plan.half_width == rows[0][3]
    assert got["counts_scale"] == pytest.approx(float(plan.scale))
    assert got["counts_epsilon"] == pytest.approx(1.0)
    assert f"Counts: each within +/- {plan.half_width}" in got["guarantee"]


def test_from_votes_tables_register_their_recorded_sensitivity(
    pg_conninfo: str, pg_schema: str, make_role: Callable[..., str], capsys: Any
) -> None:
    """install-sql --source on a table from_votes built with max_per_item = 5 registers 5 when no
    --sensitivity is given (and says so), refuses --sensitivity 1 in one line, and a release
    states 5; a registration below what the table's comment records (the comment written after
    the registration) is refused at release in the project's words, as a fact of the
    registration, not of the data, with nothing charged."""
    from adapters.contributions import record_text
    from adapters.postgres import PostgresTable

    suffix = uuid.uuid4().hex[:6]
    with _connect(pg_conninfo) as conn:
        s = sql.Identifier(pg_schema)
        conn.execute(
            sql.SQL("CREATE TABLE {}.{} AS SELECT g AS id FROM generate_series(0, 29) g").format(
                s, sql.Identifier(f"items_{suffix}")
            )
        )
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.{} AS SELECT g % 11 AS client, (g * 7) % 30 AS item "
                "FROM generate_series(0, 299) g"
            ).format(s, sql.Identifier(f"votes_{suffix}"))
        )
    PostgresTable.from_votes(
        pg_conninfo, f"votes_{suffix}", f"items_{suffix}", schema=pg_schema, max_per_item=5
    ).close()
    source = f"{pg_schema}.votes_{suffix}_counts"
    base = ["install-sql", "--dsn", pg_conninfo, "--source", source, "--grant", "PUBLIC"]
    assert cli.main([*base, "--sensitivity", "1"]) == 1
    err = capsys.readouterr().err
    assert "records sensitivity 5" in err and "Traceback" not in err
    assert cli.main(base) == 0
    out = capsys.readouterr().out
    assert "sensitivity 5: assumes each client changes each count by at most 5" in out
    assert "releasable by PUBLIC" in out
    table = f"{pg_schema}.votes_{suffix}_counts"
    assert sql_function.registered_sensitivity(pg_conninfo, table) == 5
    analyst = make_role(epsilon=10.0)
    with _connect(analyst) as conn:
        conn.execute("SELECT * FROM topk.private_top_k(%s::regclass, 2, 1.0)", [table])
        got = last_guarantee(conn)
        assert got is not None and got["sensitivity"] == 5
    # a plain table registered with 1, whose comment then records 5
    plain = TABLE.format(uuid.uuid4().hex[:8])
    with _connect(pg_conninfo) as conn:
        create_table(conn, pg_schema, plain, np.arange(50.0), None)
    registered = sql_function.register_source(
        pg_conninfo,
        plain,
        ID_COLUMN,
        SCORE_COLUMN,
        schema=pg_schema,
        grant=("PUBLIC",),
    )
    with _connect(pg_conninfo) as conn:
        conn.execute(
            sql.SQL("COMMENT ON TABLE {} IS {}").format(
                sql.Identifier(pg_schema, plain), sql.Literal(record_text(5, None))
            )
        )
    before = spent(pg_conninfo, analyst)
    with _connect(analyst) as conn, pytest.raises(psycopg.Error) as caught:
        conn.execute("SELECT * FROM topk.private_top_k(%s::regclass, 2, 1.0)", [registered])
    clean_refusal(caught, "records sensitivity 5")
    assert "table's data" not in str(caught.value)
    assert "install-sql" in (caught.value.diag.message_hint or "")
    assert spent(pg_conninfo, analyst) == before


def test_a_mechanism_for_unit_steps_refuses_another_sensitivity_in_plain_words(
    pg_conninfo: str, pg_schema: str, make_role: Callable[..., str]
) -> None:
    """limited_domain_top_k on a table registered with sensitivity 2: refused saying so (the
    registration's fact), never as "a reason in the table's data"; nothing charged."""
    name = TABLE.format(uuid.uuid4().hex[:8])
    with _connect(pg_conninfo) as conn:
        create_table(conn, pg_schema, name, np.arange(50.0), None)
    table = sql_function.register_source(
        pg_conninfo,
        name,
        ID_COLUMN,
        SCORE_COLUMN,
        schema=pg_schema,
        sensitivity=2,
        grant=("PUBLIC",),
    )
    analyst = make_role(epsilon=10.0)
    with _connect(analyst) as conn, pytest.raises(psycopg.Error) as caught:
        conn.execute(
            "SELECT * FROM topk.limited_domain_top_k(%s::regclass, 2, 5, 1.0, 1e-6, false)",
            [table],
        )
    clean_refusal(caught, "declares sensitivity 2")
    assert "table's data" not in str(caught.value)
    assert spent(pg_conninfo, analyst) == (0.0, 0)


def test_sql_limited_domain_reads_huge_counts_as_the_score_bound(
    pg_conninfo: str, pg_schema: str, make_role: Callable[..., str]
) -> None:
    """topk.limited_domain_top_k on 2^56 + 16 j: served (not refused, not silently decided by
    rounding), and the session's guarantee names the bound 2^42 (epsilon 1)."""
    name = TABLE.format(uuid.uuid4().hex[:8])
    with _connect(pg_conninfo) as conn:
        create_table(conn, pg_schema, name, 2.0**56 + 16.0 * np.arange(60), None)
    table = sql_function.register_source(
        pg_conninfo,
        name,
        ID_COLUMN,
        SCORE_COLUMN,
        schema=pg_schema,
        grant=("PUBLIC",),
    )
    analyst = make_role(epsilon=10.0)
    with _connect(analyst) as conn:
        rows = conn.execute(
            "SELECT * FROM topk.limited_domain_top_k(%s::regclass, 2, 8, 1.0, 1e-6, false)",
            [table],
        ).fetchall()
        got = last_guarantee(conn)
    assert 1 <= len(rows) <= 3
    assert got is not None and got["score_bound"] == 2.0**42
    assert "scores above 4398046511104" in got["guarantee"]
