# ruff: noqa: F811  (the fixtures of test_sql_function.py, imported by name)
"""`release_key =>` on every SQL release function, called by analysts' own login roles.

What would fail: a second call under a key that releases again or charges again; a key of one
role answering another role's call; a key reused with other arguments (another k, epsilon or
table) that is answered or charged instead of refused in the project's words; two sessions
racing on one key that get two answers or pay twice; a session killed between the charge and
the answer whose retry pays again; the key or its noise secret in any statement text the server
shows or in a message; an install over the keyless functions that loses the analysts' grants.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql

from frontends import sql_function

from ..sql_sessions import kept, session
from ..stores_postgres import ID_COLUMN, SCORE_COLUMN, TABLE, _connect, create_table
from .test_sql_function import (  # noqa: F401  (fixtures)
    _sessions_per_test,
    installed,
    make_role,
    register,
    spent,
    zipf_table,
)

pytestmark = pytest.mark.xdist_group("sql-keys")

KEYED = "SELECT * FROM topk.private_top_k(%s, %s, %s, release_key => %s)"
# name: (the SQL call with its key last, its arguments after the source)
FUNCTIONS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "private_top_k": ("topk.private_top_k(%s, %s, %s, release_key => %s)", (4, 0.5)),
    "with_counts": (
        "topk.private_top_k_with_counts(%s, %s, %s, oblivious => false, release_key => %s)",
        (3, 1.0),
    ),
    "exponential": ("topk.exponential_mechanism(%s, %s, release_key => %s)", (0.5,)),
    "peeling": ("topk.peeling_top_k(%s, %s, %s, false, release_key => %s)", (3, 0.5)),
    "joint": ("topk.joint_top_k(%s, %s, %s, false, release_key => %s)", (3, 0.5)),
    "limited_domain": (
        "topk.limited_domain_top_k(%s, %s, %s, %s, %s, false, release_key => %s)",
        (3, 20, 0.5, 1e-6),
    ),
}
ALL_RELEASES = (
    "topk.private_top_k",
    "topk.private_top_k_with_counts",
    "topk.exponential_mechanism",
    "topk.peeling_top_k",
    "topk.joint_top_k",
    "topk.limited_domain_top_k",
)


def new_key() -> str:
    return f"report-{uuid.uuid4().hex[:8]}"


def role_of(dsn: str) -> str:
    return psycopg.conninfo.conninfo_to_dict(dsn)["user"]


def key_rows(admin: str, dsn: str) -> list[tuple[Any, ...]]:
    """The ledger's rows of the role's keys: (key, noise secret, charge number, stored?)."""
    with kept(admin) as conn:
        return conn.execute(
            "SELECT release_key, noise_key, seq, release IS NOT NULL FROM topk.topk_ledger_keys "
            "WHERE principal = topk.principal(%s) ORDER BY claimed_at",
            [role_of(dsn)],
        ).fetchall()


@pytest.fixture(scope="module")
def padded_table(pg_conninfo: str, pg_schema: str, installed: Any) -> str:
    """A table whose oblivious releases are padded to 3 s (registered with --deadline 3): the
    window between a keyed release's charge and its answer that a kill or a racing session
    lands in."""
    name = TABLE.format(uuid.uuid4().hex[:8])
    with kept(pg_conninfo) as conn:
        create_table(conn, pg_schema, name, np.floor(1e5 / np.arange(1, 2001)), None)
    return sql_function.register_source(
        pg_conninfo, name, ID_COLUMN, SCORE_COLUMN, schema=pg_schema, deadline=3.0,
        grant=("PUBLIC",),
    )  # fmt: skip


def test_a_key_answers_once_charges_once_and_belongs_to_its_role(
    pg_conninfo: str, zipf_table: str, make_role: Callable[..., str]
) -> None:
    analyst, other = make_role(epsilon=5.0), make_role(epsilon=5.0)
    key = new_key()
    first = session(analyst).execute(KEYED, [zipf_table, 5, 0.5, key]).fetchall()
    guarantee = session(analyst).execute("SELECT guarantee FROM topk.last_guarantee()").fetchone()
    again = session(analyst).execute(KEYED, [zipf_table, 5, 0.5, key]).fetchall()
    assert len(first) == 5 and again == first
    assert spent(pg_conninfo, analyst) == (pytest.approx(0.5), 1)
    # the replay states the stored release's guarantee
    assert session(analyst).execute("SELECT guarantee FROM topk.last_guarantee()").fetchone() == (
        guarantee
    )
    # another session of the role (a rerun of the job) gets the same answer, for nothing
    with _connect(analyst) as conn:
        assert conn.execute(KEYED, [zipf_table, 5, 0.5, key]).fetchall() == first
    assert spent(pg_conninfo, analyst) == (pytest.approx(0.5), 1)
    # keys are per role: the same key is a new release of the other role, charged to it
    assert len(session(other).execute(KEYED, [zipf_table, 5, 0.5, key]).fetchall()) == 5
    assert spent(pg_conninfo, other) == (pytest.approx(0.5), 1)
    assert spent(pg_conninfo, analyst) == (pytest.approx(0.5), 1)
    # without a key every call is a release of its own
    session(analyst).execute("SELECT * FROM topk.private_top_k(%s, 5, 0.5)", [zipf_table])
    assert spent(pg_conninfo, analyst) == (pytest.approx(1.0), 2)


@pytest.mark.parametrize(
    ("change", "arguments"),
    [
        ("k", (6, 0.5)),
        ("epsilon", (5, 0.25)),
    ],
)
def test_a_key_with_other_arguments_is_refused_in_words(
    pg_conninfo: str,
    zipf_table: str,
    register: Callable[..., str],
    make_role: Callable[..., str],
    change: str,
    arguments: tuple[Any, ...],
) -> None:
    analyst = make_role(epsilon=5.0)
    key = new_key()
    first = session(analyst).execute(KEYED, [zipf_table, 5, 0.5, key]).fetchall()
    other_table = register(np.floor(1e5 / np.arange(1, 301)))
    for table, args in ((zipf_table, arguments), (other_table, (5, 0.5))):
        with pytest.raises(psycopg.errors.InvalidParameterValue) as error:
            session(analyst).execute(KEYED, [table, *args, key]).fetchall()
        text = str(error.value)
        assert "has used this release key for a release with other arguments" in text
        assert "nothing was read, charged or released" in text
        assert key not in text and "Traceback" not in text and "plpy" not in text
        assert error.value.diag.message_hint == (
            "a retried job passes the same arguments; a new question takes a new key"
        )
    assert spent(pg_conninfo, analyst) == (pytest.approx(0.5), 1)
    assert session(analyst).execute(KEYED, [zipf_table, 5, 0.5, key]).fetchall() == first


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("", "release_key must be a non-empty string"),
        ("x" * 201, "release_key must be at most 200 printable characters (got 201 characters)"),
        ("tab\there", "release_key must be at most 200 printable characters (got 8 characters)"),
    ],
)
def test_a_bad_key_is_refused_before_anything(
    pg_conninfo: str, zipf_table: str, make_role: Callable[..., str], key: str, words: str
) -> None:
    analyst = make_role(epsilon=5.0)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=re.escape(words)):
        session(analyst).execute(KEYED, [zipf_table, 5, 0.5, key]).fetchall()
    assert spent(pg_conninfo, analyst) == (0.0, 0)
    assert key_rows(pg_conninfo, analyst) == []


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_every_release_function_takes_a_key(
    pg_conninfo: str, zipf_table: str, make_role: Callable[..., str], name: str
) -> None:
    analyst = make_role(epsilon=20.0, delta=1e-4, functions=ALL_RELEASES)
    call, arguments = FUNCTIONS[name]
    key = new_key()
    first = session(analyst).execute(f"SELECT * FROM {call}", [zipf_table, *arguments, key])
    rows = first.fetchall()
    epsilon, releases = spent(pg_conninfo, analyst)
    assert releases == 1 and rows
    with _connect(analyst) as conn:
        assert conn.execute(f"SELECT * FROM {call}", [zipf_table, *arguments, key]).fetchall() == (
            rows
        )
    assert spent(pg_conninfo, analyst) == (pytest.approx(epsilon), 1)
    ((stored_key, _, seq, stored),) = key_rows(pg_conninfo, analyst)
    assert (stored_key, seq, stored) == (key, 1, True)


def test_two_sessions_racing_on_one_key_pay_once_and_get_one_answer(
    pg_conninfo: str, padded_table: str, make_role: Callable[..., str]
) -> None:
    """Four sessions of one role call the same keyed release at once; each call is padded to
    3 s, so they overlap between the charge and the answer."""
    analyst = make_role(epsilon=5.0)
    key = new_key()
    start = threading.Barrier(4)
    answers: list[list[tuple[Any, ...]]] = []

    def call() -> None:
        with _connect(analyst) as conn:
            conn.execute("SELECT * FROM topk.my_budget()").fetchall()  # the project imported
            start.wait()
            answers.append(conn.execute(KEYED, [padded_table, 5, 0.5, key]).fetchall())

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == 4 and len(answers[0]) == 5
    assert all(answer == answers[0] for answer in answers)
    assert spent(pg_conninfo, analyst) == (pytest.approx(0.5), 1)
    ((_, _, seq, stored),) = key_rows(pg_conninfo, analyst)
    assert (seq, stored) == (1, True)


def test_a_session_killed_between_charge_and_answer_is_not_charged_again(
    pg_conninfo: str, padded_table: str, make_role: Callable[..., str]
) -> None:
    analyst = make_role(epsilon=5.0)
    key = new_key()
    conn = _connect(analyst)
    conn.execute("SELECT * FROM topk.my_budget()").fetchall()
    pid = conn.info.backend_pid

    def kill_once_charged() -> None:
        with _connect(pg_conninfo) as admin:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                charged = admin.execute(
                    "SELECT count(*) FROM topk.topk_ledger_charges "
                    "WHERE principal = topk.principal(%s)",
                    [role_of(analyst)],
                ).fetchone()[0]
                if charged:
                    admin.execute("SELECT pg_terminate_backend(%s)", [pid])
                    return
                time.sleep(0.02)

    killer = threading.Thread(target=kill_once_charged)
    killer.start()
    with pytest.raises(psycopg.OperationalError):
        conn.execute(KEYED, [padded_table, 5, 0.5, key]).fetchall()
    killer.join()
    conn.close()
    ((_, _, seq, stored),) = key_rows(pg_conninfo, analyst)
    assert (seq, stored) == (1, False)  # charged, answered to nobody
    with _connect(analyst) as retry:
        rows = retry.execute(KEYED, [padded_table, 5, 0.5, key]).fetchall()
        assert retry.execute(KEYED, [padded_table, 5, 0.5, key]).fetchall() == rows
    assert len(rows) == 5
    assert spent(pg_conninfo, analyst) == (pytest.approx(0.5), 1)


def test_neither_the_key_nor_its_noise_secret_is_in_statement_text_or_messages(
    pg_conninfo: str, padded_table: str, make_role: Callable[..., str]
) -> None:
    """pg_stat_activity, read as a superuser while keyed releases run: the ledger connection's
    statements never carry the key or the noise secret (bound parameters); the analyst's own
    statement binds its key as a parameter here, so neither appears in any text either. The
    analyst cannot read the ledger's keys, and a refusal does not repeat the key."""
    analyst = make_role(epsilon=5.0)
    key = f"secret-job-{uuid.uuid4().hex}"
    seen: list[tuple[str, str]] = []  # (application_name, statement text)
    done = threading.Event()

    def watch() -> None:
        with _connect(pg_conninfo) as conn:
            while not done.is_set():
                rows = conn.execute(
                    "SELECT application_name, query FROM pg_stat_activity "
                    "WHERE datname = current_database() "
                    "AND (usename = %s OR application_name = %s)",
                    [role_of(analyst), sql_function.APPLICATION_NAME],
                )
                seen.extend((r[0] or "", r[1] or "") for r in rows)
                time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with _connect(analyst) as conn:
            for _ in range(2):  # the release, then its replay
                conn.execute(KEYED, [padded_table, 5, 0.5, key]).fetchall()
            with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
                conn.execute(KEYED, [padded_table, 4, 0.5, key]).fetchall()
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT noise_key FROM topk.topk_ledger_keys").fetchall()
    finally:
        done.set()
        watcher.join()
    ((_, noise_key, _, _),) = key_rows(pg_conninfo, analyst)
    # the watcher saw the call and the ledger's connection at work during it
    assert any("private_top_k" in text for _, text in seen)
    assert any(app == sql_function.APPLICATION_NAME and text for app, text in seen)
    for _, text in seen:
        assert key not in text and noise_key not in text, text
    message = str(refused.value) + str(refused.value.diag.message_hint)
    assert key not in message and noise_key not in message


def test_an_install_over_the_keyless_functions_keeps_their_grants(
    pg_conninfo: str, zipf_table: str, make_role: Callable[..., str]
) -> None:
    """The release functions had no key before: an install over such a front drops it (the
    keyed one is made, or kept); the EXECUTE its grantees had is given again on the keyed one."""
    analyst = make_role(epsilon=5.0, functions=())
    role = role_of(analyst)
    keyless = (
        "topk.private_top_k(anycompatible, integer, double precision, double precision, text, "
        "boolean)"
    )
    with kept(pg_conninfo) as conn:  # the keyless front beside the keyed one, as before
        conn.execute(
            "CREATE FUNCTION topk.private_top_k(source anycompatible, k integer, epsilon "
            "double precision, delta double precision DEFAULT 0, noise text DEFAULT 'gumbel', "
            'oblivious boolean DEFAULT true) RETURNS TABLE("position" integer, item text) '
            "LANGUAGE sql AS 'SELECT 1, NULL::text WHERE false'"
        )
        conn.execute(sql.SQL(f"GRANT EXECUTE ON FUNCTION {keyless} TO {{}}").format(
            sql.Identifier(role)))  # fmt: skip
    sql_function.install(pg_conninfo)
    with kept(pg_conninfo) as conn:
        signatures = conn.execute(
            "SELECT p.oid::regprocedure::text, has_function_privilege(%s, p.oid, 'EXECUTE') "
            "FROM pg_proc AS p WHERE p.proname = 'private_top_k' "
            "AND p.pronamespace = 'topk'::regnamespace",
            [role],
        ).fetchall()
    assert signatures == [
        (
            "topk.private_top_k(anycompatible,integer,double precision,double precision,text,"
            "boolean,text)",
            True,
        )
    ]
    assert len(session(analyst).execute(KEYED, [zipf_table, 3, 0.5, new_key()]).fetchall()) == 3
