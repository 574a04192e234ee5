# ruff: noqa: F811  (the fixtures of test_sql_function.py, imported by name)
"""The SQL functions against a hostile analyst on the real PostgreSQL.

Each test reruns an attack as a low-privilege role (LOGIN, EXECUTE on the functions, USAGE on the
table's schema, no SELECT on the table), as test_sql_function.py's roles are made, and asserts what
the role learns: no plan text or bound value through debug settings, none of the function's reads
in the statistics views, a cancel / statement_timeout / terminate answered within a second of
being asked (bound 1.5 s: the interrupt is checked every interrupts.INTERVAL = 0.05 s), the
budget never under-charged, a planted ledger recipe refused without running, refusals without
the data's facts (they go to topk.refusals), no release past a used-up total, and the project's
refusal for a name the role may not use.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql

from frontends import sql_function
from topk_middleware.mechanisms.joint import smallest_joint_epsilon

from ..frontends.test_sql_function import (  # noqa: F401  (fixtures)
    ANALYST_FUNCTIONS,
    _sessions_per_test,
    installed,
    make_role,
    register,
    release,
    spent,
    zipf_table,
)
from ..sql_sessions import kept, session
from ..stores_postgres import ID_COLUMN, SCORE_COLUMN, _connect, create_table

# One worker runs the module (its module fixtures and kept sessions serve every test), and, as a
# group, it starts at the beginning of the run (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("sql-hardening")

BY_NAME = "topk.private_top_k"  # one front takes a regclass or a name as text
JOINT = "topk.joint_top_k"
# joint_top_k(k = 30) on slow_table at the smallest epsilon its work cap admits (joint.py's
# JOINT_MAX_WORK): seconds of threshold enumeration in the server
SLOW_EPSILON = smallest_joint_epsilon(30, 5000)
REFUSED_FOR_DATA = "refused for a reason in the table's data"


def notices_of(conn: psycopg.Connection[Any]) -> list[str]:
    seen: list[str] = []
    conn.add_notice_handler(
        lambda d: seen.append(f"{d.severity} {d.message_primary} {d.message_detail or ''}")
    )
    return seen


def test_debug_settings_show_no_plan_or_bound_value(
    zipf_table: str, make_role: Callable[..., str]
) -> None:
    """debug_print_parse / rewritten / plan, client_min_messages = debug5, force_custom_plan and
    trace_sort set by the analyst: of the notices it receives, none is about the function's own
    queries (the position table, the score column, a LIMIT parameter) or carries a score of the
    table; the analyst's own top-level statement may still be printed."""
    analyst = make_role(epsilon=50.0)
    with _connect(analyst) as conn:
        seen = notices_of(conn)
        for setting in (
            "debug_print_parse = on",
            "debug_print_rewritten = on",
            "debug_print_plan = on",
            "debug_pretty_print = on",
            "plan_cache_mode = force_custom_plan",
            "trace_sort = on",
            "client_min_messages = debug5",
        ):
            conn.execute(f"SET {setting}")
        seen.clear()
        for k in (3, 40, 200):
            rows = conn.execute(
                "SELECT * FROM topk.private_top_k(%s::regclass, %s, %s)", [zipf_table, k, 1e-3]
            ).fetchall()
            assert len(rows) == k
    # What remains is about the analyst's own three statements: one parse tree, one rewritten
    # tree and one plan each (an internal query would add its own).
    assert sum(n.startswith("LOG plan:") for n in seen) == 3, [n[:40] for n in seen]
    assert sum(n.startswith("LOG parse tree:") for n in seen) == 3
    text = "\n".join(seen)
    assert "_topk_pos" not in text and f'"{SCORE_COLUMN}"' not in text
    assert "begin tuple sort" not in text and "PLANNEDSTMT" not in text.split("topk.private")[0]
    scores = {str(int(1e5 / r)) for r in range(1, 100)}  # zipf_table's top scores, >= 1010
    leaked = scores & set(re.findall(r"\b\d{3,6}\b", text))
    assert not leaked, sorted(leaked)[:5]


def test_reads_stay_out_of_the_statistics_views(
    zipf_table: str, make_role: Callable[..., str]
) -> None:
    """pg_stat_xact_user_tables, which any role reads, shows none of a release's scans of the
    table or its position table within the analyst's transaction (track_counts off inside)."""
    analyst = make_role(epsilon=50.0)
    table = zipf_table.split(".")[-1].strip('"').replace('""', '"')
    query = (
        "SELECT coalesce(sum(coalesce(seq_scan, 0) + coalesce(idx_scan, 0) + "
        "coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0)), 0) FROM "
        "pg_stat_xact_user_tables WHERE relname IN (%s, %s)"
    )
    with _connect(analyst) as conn, conn.transaction():
        names = [table, f"{table}_topk_pos"]
        before = conn.execute(query, names).fetchone()[0]
        conn.execute(
            "SELECT * FROM topk.private_top_k(%s::regclass, %s, %s)", [zipf_table, 50, 1e-2]
        ).fetchall()
        after = conn.execute(query, names).fetchone()[0]
    assert before == after == 0


EXPLAIN_COUNTERS = (
    "Shared Hit Blocks",
    "Shared Read Blocks",
    "Shared Dirtied Blocks",
    "Shared Written Blocks",
    "Local Hit Blocks",
    "Local Read Blocks",
    "Temp Read Blocks",
    "Temp Written Blocks",
    "WAL Records",
    "WAL FPI",
    "WAL Bytes",
)


def explained(conn: psycopg.Connection[Any], query: str, params: Any = None) -> dict[str, int]:
    """The top node's buffer and WAL counters in EXPLAIN (ANALYZE, BUFFERS, WAL) of `query`."""
    plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) " + query, params)
    top = plan.fetchone()[0][0]["Plan"]
    return {name: int(top.get(name, 0)) for name in EXPLAIN_COUNTERS}


def test_hidden_io_adds_nothing_to_the_callers_explain(
    pg_conninfo: str, pg_schema: str, installed: Any
) -> None:
    """topk._hide_io_begin / _hide_io_end (library topk_server), which every front calls around
    its body: a function that scans a 100,000-row table (and, in a second form, writes to it)
    between them adds nothing to its caller's EXPLAIN (ANALYZE, BUFFERS, WAL), while the same
    function without them shows the scan's pages and the write's WAL records. Nested pairs
    restore once, at the outermost end. A call cut off between the two by statement_timeout
    leaves nothing behind: the next statement's counters are whole, neither hidden nor negative."""
    assert installed.native, "no library topk_server on the server: make server-side"
    table = sql.Identifier(pg_schema, f"hidden_{uuid.uuid4().hex[:8]}")
    with _connect(pg_conninfo) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} AS SELECT g AS x FROM generate_series(1, 100000) g").format(
                table
            )
        )
        conn.execute(sql.SQL("VACUUM {}").format(table))
        body = sql.SQL(
            "CREATE FUNCTION pg_temp.touch(hidden int, write boolean) RETURNS bigint "
            "LANGUAGE plpgsql AS $$ DECLARE n bigint; BEGIN "
            "FOR i IN 1..hidden LOOP PERFORM topk._hide_io_begin(); END LOOP; "
            "IF write THEN INSERT INTO {t} SELECT generate_series(1, 100); END IF; "
            "SELECT count(*) INTO n FROM {t}; "
            "IF hidden = 2 THEN PERFORM topk._hide_io_end(); SELECT n + count(*) INTO n FROM {t};"
            " END IF; "
            "IF hidden > 0 THEN PERFORM topk._hide_io_end(); END IF; "
            "RETURN n; END $$"
        ).format(t=table)
        conn.execute(body)
        for hidden in (0, 1, 2):  # the catalog and the library into the backend's caches
            conn.execute("SELECT pg_temp.touch(%s, false)", [hidden])
        shown = explained(conn, "SELECT pg_temp.touch(0, false)")
        assert shown["Shared Hit Blocks"] + shown["Shared Read Blocks"] >= 400  # 443 pages
        assert explained(conn, "SELECT pg_temp.touch(1, false)") == dict.fromkeys(
            EXPLAIN_COUNTERS, 0
        )
        assert explained(conn, "SELECT pg_temp.touch(2, false)") == dict.fromkeys(
            EXPLAIN_COUNTERS, 0
        )
        with conn.transaction(force_rollback=True):
            written = explained(conn, "SELECT pg_temp.touch(0, true)")
            assert written["WAL Records"] >= 100
            hidden = explained(conn, "SELECT pg_temp.touch(1, true)")
        assert hidden == dict.fromkeys(EXPLAIN_COUNTERS, 0)
        conn.execute(
            "CREATE FUNCTION pg_temp.stuck() RETURNS void LANGUAGE plpgsql AS $$ BEGIN "
            "PERFORM topk._hide_io_begin(); PERFORM pg_catalog.pg_sleep(5); END $$"
        )
        conn.execute("SET statement_timeout = '200ms'")
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT pg_temp.stuck()")
        conn.execute("RESET statement_timeout")
        after = explained(conn, "SELECT pg_temp.touch(0, false)")
        assert after["Shared Hit Blocks"] + after["Shared Read Blocks"] >= 400
        assert min(after.values()) >= 0
        assert explained(conn, "SELECT pg_temp.touch(1, false)") == dict.fromkeys(
            EXPLAIN_COUNTERS, 0
        )
        conn.execute(sql.SQL("DROP TABLE {}").format(table))


@pytest.fixture(scope="module")
def slow_table(register: Callable[..., str]) -> str:
    """A table on which joint_top_k(k = 30, SLOW_EPSILON) enumerates as many thresholds as its
    work cap admits: 5,000 dense integer counts, every gap a threshold (3.4 s in the client
    under load 20)."""
    return register(20_000 - np.arange(5000))


def interrupted(dsn: str, table: str, interrupt: Callable[[int], None] | None, setup: str = ""):
    """Run joint_top_k on `table` as `dsn`; 1 s in, call interrupt(backend pid). (seconds from
    the interrupt to the error, the error)."""
    conn = _connect(dsn)
    pid = conn.info.backend_pid
    # The session's first call imports the project into the server (about a second of C-level
    # imports, not interruptible): done before the clock starts.
    conn.execute("SELECT * FROM topk.my_budget()").fetchall()
    if setup:
        conn.execute(setup)
    started = time.monotonic()
    timer = None
    asked: list[float] = []
    if interrupt is not None:

        def fire() -> None:
            asked.append(time.monotonic())
            interrupt(pid)

        timer = threading.Timer(1.0, fire)
        timer.start()
    error: Exception | None = None
    try:
        conn.execute(f"SELECT * FROM {JOINT}(%s::regclass, 30, %s, false)", [table, SLOW_EPSILON])
    except psycopg.Error as caught:
        error = caught
    ended = time.monotonic()
    if timer is not None:
        timer.join()
    conn.close()
    return ended - (asked[0] if asked else started), error


def test_cancel_timeout_and_terminate_stop_a_release_within_a_second(
    pg_conninfo: str, slow_table: str, make_role: Callable[..., str]
) -> None:
    analyst = make_role(epsilon=10.0)
    with _connect(pg_conninfo) as admin:

        def cancel(pid: int) -> None:
            admin.execute("SELECT pg_cancel_backend(%s)", [pid])

        seconds, error = interrupted(analyst, slow_table, cancel)
        assert isinstance(error, psycopg.errors.QueryCanceled) and seconds < 1.5, (seconds, error)

        seconds, error = interrupted(analyst, slow_table, None, "SET statement_timeout = '1s'")
        assert isinstance(error, psycopg.errors.QueryCanceled), error
        assert seconds < 2.5, seconds  # the timeout fires 1 s in: answered within 1.5 s

        def terminate(pid: int) -> None:
            admin.execute("SELECT pg_terminate_backend(%s)", [pid])

        seconds, error = interrupted(analyst, slow_table, terminate)
        assert isinstance(error, psycopg.OperationalError) and seconds < 1.5, (seconds, error)
    # Each attempt was charged before it read (never under-charged): three releases of 1e-9.
    assert spent(pg_conninfo, analyst)[1] == 3


@pytest.fixture(scope="module")
def padded_table(pg_conninfo: str, pg_schema: str, installed: Any) -> str:
    """A table registered with an operator's deadline of PADDED_DEADLINE seconds: its default
    (oblivious) release sleeps that long before it returns (the padding)."""
    name = f"topk_padded_{uuid.uuid4().hex[:8]}"
    with _connect(pg_conninfo) as conn:
        create_table(conn, pg_schema, name, np.floor(1e5 / np.arange(1, 20_001)), None)
    return sql_function.register_source(
        pg_conninfo,
        name,
        ID_COLUMN,
        SCORE_COLUMN,
        schema=pg_schema,
        deadline=PADDED_DEADLINE,
        grant=("PUBLIC",),
    )


PADDED_DEADLINE = 3.0


def default_release(dsn: str, table: str, interrupt: Callable[[int], None] | None, setup: str = ""):
    """topk.private_top_k(table, 10, 1) with its defaults (oblivious) as `dsn`; 1 s in, call
    interrupt(backend pid). (seconds from the interrupt, or the start, to the end; the error)."""
    conn = _connect(dsn)
    pid = conn.info.backend_pid
    conn.execute("SELECT * FROM topk.my_budget()").fetchall()  # the session's imports
    if setup:
        conn.execute(setup)
    asked: list[float] = []
    timer = None
    if interrupt is not None:

        def fire() -> None:
            asked.append(time.monotonic())
            interrupt(pid)

        timer = threading.Timer(1.0, fire)
    started = time.monotonic()
    if timer is not None:
        timer.start()
    error: Exception | None = None
    try:
        conn.execute("SELECT * FROM topk.private_top_k(%s::regclass, 10, 1.0)", [table]).fetchall()
    except psycopg.Error as caught:
        error = caught
    ended = time.monotonic()
    if timer is not None:
        timer.join()
    conn.close()
    return ended - (asked[0] if asked else started), error


def test_cancel_and_timeout_stop_the_default_oblivious_release_within_a_second(
    pg_conninfo: str, padded_table: str, make_role: Callable[..., str]
) -> None:
    """The default release of a table whose operator set a 3 s deadline runs 3 s or more (the
    padding, slept in slices of 50 ms with an interrupt check after each); a pg_cancel_backend
    1 s in, or a statement_timeout of 1 s, ends it within 1 s (a padding slept in one piece, or
    a padding loop that never checks, would run to its 3 s). Each attempt stays charged."""
    analyst = make_role(epsilon=10.0)
    seconds, error = default_release(analyst, padded_table, None)
    assert error is None and seconds >= PADDED_DEADLINE, (seconds, error)
    with _connect(pg_conninfo) as admin:

        def cancel(pid: int) -> None:
            admin.execute("SELECT pg_cancel_backend(%s)", [pid])

        seconds, error = default_release(analyst, padded_table, cancel)
        assert isinstance(error, psycopg.errors.QueryCanceled) and seconds < 1.0, (seconds, error)
    seconds, error = default_release(analyst, padded_table, None, "SET statement_timeout = '1s'")
    assert isinstance(error, psycopg.errors.QueryCanceled), error
    assert seconds < 2.0, seconds  # the timeout fires 1 s in: answered within 1 s
    assert spent(pg_conninfo, analyst)[1] == 3


def test_a_release_past_the_sql_functions_bounds_is_refused_before_any_charge(
    pg_conninfo: str, zipf_table: str, make_role: Callable[..., str]
) -> None:
    """k above MAX_RELEASE_K is refused in the request's own terms; nothing is charged."""
    analyst = make_role(epsilon=10.0)
    with _connect(analyst) as conn, pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        conn.execute(
            "SELECT * FROM topk.private_top_k(%s::regclass, %s, 1.0)",
            [zipf_table, sql_function.MAX_RELEASE_K + 1],
        )
    assert f"k = {sql_function.MAX_RELEASE_K + 1}" in (caught.value.diag.message_primary or "")
    assert spent(pg_conninfo, analyst) == (0.0, 0)


def test_excessive_work_is_refused_before_any_charge(
    pg_conninfo: str, zipf_table: str, make_role: Callable[..., str]
) -> None:
    analyst = make_role(epsilon=10.0)
    started = time.monotonic()
    with _connect(analyst) as conn, pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        conn.execute(f"SELECT * FROM {JOINT}(%s::regclass, 20000, 1.0, false)", [zipf_table])
    assert time.monotonic() - started < 5.0
    assert "too much work" in (caught.value.diag.message_primary or "")
    assert spent(pg_conninfo, analyst) == (0.0, 0)


def test_a_planted_ledger_recipe_is_refused_and_never_runs(
    pg_conninfo: str, zipf_table: str, make_role: Callable[..., str]
) -> None:
    """A charge row naming os:system (what someone with write access to the ledger could plant)
    is refused on the next release; the command it names never runs in the server."""
    analyst = make_role(epsilon=10.0)
    role = psycopg.conninfo.conninfo_to_dict(analyst)["user"]
    marker = Path(f"/tmp/topk-planted-{uuid.uuid4().hex}")
    cost = {"mechanism": "x", "recipe": ["os:system", [["command", f"touch {marker}"]]]}
    with kept(pg_conninfo) as conn:
        conn.execute(
            "INSERT INTO topk.topk_ledger_charges (principal, seq, charged_at, mechanism, cost, "
            "epsilon_after, delta_after, rule) "
            "VALUES (topk.principal(%s), 1, now(), 'x', %s, 0, 0, 'basic')",
            [role, json.dumps(cost)],
        )
        conn.execute(
            "UPDATE topk.topk_ledger_principals SET charges = 1 "
            "WHERE principal = topk.principal(%s)",
            [role],
        )
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        release(analyst, zipf_table, 3, 0.1)
    assert REFUSED_FOR_DATA in (caught.value.diag.message_primary or "")
    assert not marker.exists()
    reference = re.search(r"R-[0-9a-f]{12}", caught.value.diag.message_primary or "")
    assert reference
    with kept(pg_conninfo) as conn:
        detail = conn.execute(
            "SELECT detail FROM topk.refusals WHERE reference = %s", [reference[0]]
        ).fetchone()[0]
    assert "os:system" in detail and "not run" in detail


@pytest.mark.parametrize(
    ("bad", "fact"),
    [("-7.25", "-7.25"), ("NULL", "NULL"), ("'NaN'", "NaN"), ("'Infinity'", "infinite")],
)
def test_refusals_tell_the_analyst_no_data_fact(
    pg_conninfo: str,
    register: Callable[..., str],
    make_role: Callable[..., str],
    bad: str,
    fact: str,
) -> None:
    """Bad scores and k above m: the analyst gets one message with a reference and neither the
    kind of fault, the value nor m; topk.refusals has them for the operator."""
    table = register([9.5, 5.0, 3.0, 1.0])  # float8 scores; a live table takes writes
    with kept(pg_conninfo) as conn:
        column = sql.Identifier(SCORE_COLUMN).as_string(conn)
        conn.execute(f"UPDATE {table} SET {column} = {bad} WHERE {column} = 3.0")
    analyst = make_role(epsilon=10.0)
    for k in (2, 7):
        with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
            release(analyst, table, k, 1.0)
        message = str(caught.value)
        assert REFUSED_FOR_DATA in message and "nothing was charged" in message
        for data_fact in (fact, "negative", "NULL", "finite", "m = 4", "exceeds", "7.25"):
            assert data_fact not in message.split("HINT")[0], (data_fact, message)
        reference = re.search(r"R-[0-9a-f]{12}", message)
        assert reference
        with kept(pg_conninfo) as conn:
            detail = conn.execute(
                "SELECT detail FROM topk.refusals WHERE reference = %s", [reference[0]]
            ).fetchone()[0]
        assert fact in detail or k == 7
    assert spent(pg_conninfo, analyst) == (0.0, 0)


def test_no_release_past_a_used_up_total(
    pg_conninfo: str, zipf_table: str, make_role: Callable[..., str]
) -> None:
    """A total of 1 spent by one release of 1: a release at epsilon 1e-17 is refused (it would
    not move the float sum), and stays refused."""
    analyst = make_role(epsilon=1.0)
    release(analyst, zipf_table, 2, 1.0)
    for _ in range(3):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="used up"):
            release(analyst, zipf_table, 2, 1e-17)
    assert spent(pg_conninfo, analyst) == (pytest.approx(1.0), 1)


def test_an_analyst_reads_its_own_budget(
    pg_conninfo: str, zipf_table: str, make_role: Callable[..., str]
) -> None:
    analyst = make_role(epsilon=3.0)
    release(analyst, zipf_table, 2, 0.5)
    mine = session(analyst).execute("SELECT epsilon, releases, epsilon_total FROM topk.my_budget()")
    epsilon, releases, total = mine.fetchone()
    assert (epsilon, releases, total) == (pytest.approx(0.5), 1, 3.0)
    assert spent(pg_conninfo, analyst) == (pytest.approx(0.5), 1)


def test_a_table_named_as_text_resolves_in_the_callers_search_path(
    pg_conninfo: str, pg_schema: str, zipf_table: str, make_role: Callable[..., str]
) -> None:
    """private_top_k('name', ...) with a string literal (the text front): qualified, or
    unqualified in the caller's search_path, as a regclass cast would resolve it."""
    analyst = make_role(epsilon=10.0, functions=(*ANALYST_FUNCTIONS, BY_NAME))
    schema, _, bare = zipf_table.partition(".")
    with _connect(analyst) as conn:
        assert (
            len(
                conn.execute(f"SELECT * FROM topk.private_top_k('{zipf_table}', 2, 1.0)").fetchall()
            )
            == 2
        )
        conn.execute(f"SET search_path = {schema}")
        assert (
            len(conn.execute(f"SELECT * FROM topk.private_top_k('{bare}', 2, 1.0)").fetchall()) == 2
        )
    assert spent(pg_conninfo, analyst)[1] == 2


def test_names_the_role_may_not_use_get_the_project_refusal(
    pg_conninfo: str, pg_schema: str, zipf_table: str, make_role: Callable[..., str]
) -> None:
    """Without USAGE on the table's schema, a regclass 0, a dangling OID, an unregistered table:
    one refusal of the project (undefined_object), no "permission denied for schema", no
    PL/Python traceback, and no CONTEXT line."""
    analyst = make_role(epsilon=10.0, functions=(*ANALYST_FUNCTIONS, BY_NAME))
    role = psycopg.conninfo.conninfo_to_dict(analyst)["user"]
    with kept(pg_conninfo) as conn:
        conn.execute(
            sql.SQL("REVOKE USAGE ON SCHEMA {} FROM {}").format(
                sql.Identifier(pg_schema), sql.Identifier(role)
            )
        )
        unregistered = f"{pg_schema}.never_registered_{uuid.uuid4().hex[:6]}"
        conn.execute(f"CREATE TABLE {unregistered} (id bigint, score bigint)")
    calls = [
        ("SELECT * FROM topk.private_top_k(%s, 2, 1.0)", zipf_table),
        ("SELECT * FROM topk.private_top_k(%s, 2, 1.0)", unregistered),
        ("SELECT * FROM topk.private_top_k(%s, 2, 1.0)", "no_such_schema.t"),
        ("SELECT * FROM topk.private_top_k(0::regclass, 2, 1.0, %s)", 0.0),
        ("SELECT * FROM topk.private_top_k(987654321::oid::regclass, 2, 1.0, %s)", 0.0),
    ]
    for query, argument in calls:
        with pytest.raises(psycopg.errors.UndefinedObject) as caught:
            session(analyst).execute(query, [argument])
        primary = caught.value.diag.message_primary or ""
        assert primary.startswith("topk: ") and "is not registered" in primary, primary
        assert "may not name it" in primary
        assert "permission denied" not in str(caught.value)
        assert "Traceback" not in str(caught.value)
        assert caught.value.diag.context is None, caught.value.diag.context
    assert spent(pg_conninfo, analyst) == (0.0, 0)


def test_no_key_or_password_in_statement_text_while_a_release_runs(
    pg_conninfo: str, slow_table: str, make_role: Callable[..., str]
) -> None:
    """pg_stat_activity (read as a superuser) while a release runs: the statements of the
    analyst's session and of the ledger connection in this database, with placeholders, no
    password and no 32-hex-digit key. (Other sessions of the server, such as other test
    workers', are not the release's and may carry digests of their own.)"""
    analyst = make_role(epsilon=10.0)
    role = psycopg.conninfo.conninfo_to_dict(analyst)["user"]
    texts: list[str] = []

    done = threading.Event()

    def watch() -> None:
        with _connect(pg_conninfo) as conn:
            while not done.is_set():
                rows = conn.execute(
                    "SELECT query FROM pg_stat_activity WHERE datname = current_database() "
                    "AND (usename = %s OR application_name = %s)",
                    [role, sql_function.APPLICATION_NAME],
                )
                texts.extend(r[0] or "" for r in rows)
                time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    _, error = interrupted(analyst, slow_table, None, "SET statement_timeout = '1500ms'")
    done.set()
    watcher.join()
    assert isinstance(error, psycopg.errors.QueryCanceled)
    assert any("joint_top_k" in t for t in texts)
    for text in texts:
        assert "password" not in text.lower() and not re.search(r"\b[0-9a-f]{32}\b", text), text
