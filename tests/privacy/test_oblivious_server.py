"""Oblivious releases seen from the server (DESIGN invariant 12), on the real PostgreSQL server
and DuckDB: what an observer of the store sees does not tell neighbouring tables apart.

* Python API, PostgreSQL copy and live (the live table with its runs-of-ties shortcut enabled,
  which oblivious mode must turn off): every statement the server receives (its text and the
  size of each parameter, captured on the wire by the connection's cursor classes) and the
  server's table statistics (pg_stat_user_tables: scans and tuples read) are identical for two
  tables one client apart (a head of 26 vs 27 votes) and for two unrelated data families.
* DuckDB: the same rows fetched and round trips.
* The SQL function with its defaults, called by a role holding EXECUTE only: a distinguisher
  that sees pg_stat_xact_user_tables of its own transaction, the buffer and WAL counters of
  EXPLAIN (ANALYZE, BUFFERS, WAL) of its call and the call's wall time, trained on 30 calls per
  table and tested on 100 fresh calls, tells the neighbours apart (one of them made by an
  UPDATE and not vacuumed since) with accuracy <= 0.75 (the issue's target; a (1, 0)-DP release
  allows at most e/(1 + e) = 0.73). EXPLAIN of a call counts none of the function's reads (the
  library topk_server); on a server without it, with oblivious => false, the same
  distinguisher reaches >= 0.9 on two tables of different shape, so it has the power to see an
  adaptive run.
"""

from __future__ import annotations

import time
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from typing import Any

import duckdb
import numpy as np
import psycopg
import pytest
import sqlalchemy as sa
from psycopg import sql

from adapters.duckdb import DuckDBTable
from adapters.postgres import PostgresTable
from adapters.sql.driver import Int8Array
from adapters.sqlalchemy import SQLAlchemyTable
from frontends import sql_function
from tests.stores_duckdb import ID_COLUMN as DUCK_ID
from tests.stores_duckdb import SCORE_COLUMN as DUCK_SCORE
from tests.stores_duckdb import create_table as duck_create_table
from tests.stores_postgres import ID_COLUMN, SCORE_COLUMN, _connect, create_table
from topk_middleware import private_top_k
from topk_middleware.mechanisms.oblivious import oblivious_depth

# One worker runs the module, and, as a group, it starts at the beginning of the run (its
# distinguisher tests mostly wait out oblivious deadlines; tests/conftest.py).
pytestmark = [
    pytest.mark.xdist_group("sql-observer"),
    # the reader role's oblivious runs (the channel accepted) say once per source that the
    # statistics views show their buffers (asserted in test_a_neighbour_made_by_an_update)
    pytest.mark.filterwarnings("ignore:.*may not set track_counts:UserWarning"),
]

M, K, EPSILON = 20_000, 10, 1.0


def neighbours(m: int = M) -> tuple[np.ndarray, np.ndarray]:
    """A head of 26 votes over a plateau, and the same with one more client voting for it."""
    rng = np.random.default_rng(20)
    base = rng.integers(0, 4, size=m).astype(float)
    base[:40] = 20.0
    base[0] = 26.0
    other = base.copy()
    other[0] = 27.0
    return base, other


def zipf(m: int = M) -> np.ndarray:
    return np.floor(1e5 / np.arange(1, m + 1))


class LoggedCursor(psycopg.Cursor):  # type: ignore[type-arg]
    """What the server receives: each statement's text and the size of each parameter."""

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        self.connection.statements.append(_shape(self, query, params))  # type: ignore[attr-defined]
        return super().execute(query, params, **kwargs)


class LoggedServerCursor(psycopg.ServerCursor):  # type: ignore[type-arg]
    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        self.connection.statements.append(_shape(self, query, params))  # type: ignore[attr-defined]
        return super().execute(query, params, **kwargs)

    def fetchmany(self, size: int = 0) -> Any:
        self.connection.statements.append(("FETCH", (size,)))  # type: ignore[attr-defined]
        return super().fetchmany(size)


def _shape(cur: Any, query: Any, params: Any) -> tuple[str, tuple[int, ...]]:
    text = query.as_string(cur.connection) if isinstance(query, sql.Composable) else str(query)
    values = params.values() if isinstance(params, dict) else (params or ())
    sizes = tuple(_size(v) for v in values)
    return text, sizes


def _size(value: Any) -> int:
    """A parameter's size: elements of an array (a binary int8[] counted from its bytes)."""
    if isinstance(value, Int8Array):
        return (len(value) - 20) // 12  # a 20-byte header, then (length, int8) per element
    return len(value) if isinstance(value, list | tuple | bytes | str) else -1


def logged_connection(conninfo: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(conninfo, autocommit=True)
    conn.cursor_factory = LoggedCursor
    conn.server_cursor_factory = LoggedServerCursor
    conn.statements = []  # type: ignore[attr-defined]
    return conn


def table_stats(conninfo: str, schema: str) -> dict[str, tuple[int, ...]]:
    """pg_stat_user_tables and pg_statio_user_tables of the schema's tables, by name (scans and
    tuples read, heap and index buffers touched: what any role may read)."""
    with _connect(conninfo) as conn:
        conn.execute("SET stats_fetch_consistency = none")
        rows = conn.execute(
            "SELECT t.relname, t.seq_scan, t.seq_tup_read, coalesce(t.idx_scan, 0), "
            "coalesce(t.idx_tup_fetch, 0), "
            "coalesce(io.heap_blks_read, 0) + coalesce(io.heap_blks_hit, 0), "
            "coalesce(io.idx_blks_read, 0) + coalesce(io.idx_blks_hit, 0) "
            "FROM pg_stat_user_tables AS t JOIN pg_statio_user_tables AS io USING (relid) "
            "WHERE t.schemaname = %s",
            [schema],
        ).fetchall()
    return {name: tuple(values) for name, *values in rows}


@pytest.fixture
def schema(pg_conninfo: str) -> Iterator[str]:
    name = f"topk_obliv_{uuid.uuid4().hex[:8]}"
    with _connect(pg_conninfo) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    yield name
    with _connect(pg_conninfo) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


def vacuum_schema(conninfo: str, schema: str) -> None:
    """VACUUM (ANALYZE, INDEX_CLEANUP ON) the schema's tables, autovacuum off them: the
    planner's statistics and the visibility maps stay fixed for the measurement (autovacuum
    lands at moments of the server's clock and load; docs/oblivious.md: what is left). Index
    cleanup is forced: a VACUUM that finds few dead rows skips it, and the dead rows' index
    entries and their pages' lost all-visible marks would stay."""
    with _connect(conninfo) as admin:
        for (table,) in admin.execute(
            "SELECT format('%%I.%%I', schemaname, tablename) FROM pg_tables WHERE schemaname = %s",
            [schema],
        ).fetchall():
            admin.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
            all_visible(admin, table)


def all_visible(admin: psycopg.Connection[Any], table: str, seconds: float = 60.0) -> None:
    """VACUUM `table` until every page of it is marked all-visible: VACUUM marks a page so only
    once no open transaction (another test's, on this shared database) could still see an older
    state of it, and until then index-only scans visit the heap (docs/oblivious.md)."""
    deadline = time.monotonic() + seconds
    while True:
        admin.execute(f"VACUUM (ANALYZE, INDEX_CLEANUP ON) {table}")
        pages, visible = admin.execute(
            "SELECT relpages, relallvisible FROM pg_class WHERE oid = %s::regclass", [table]
        ).fetchone()
        if visible >= pages:
            return
        assert time.monotonic() < deadline, f"{table}: {visible} of {pages} pages all-visible"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def reader(pg_conninfo: str) -> Iterator[str]:
    """A role that may read the tests' schemas but not set track_counts: its oblivious runs are
    refused (tests/privacy/test_statistics_channel.py) unless the table accepts the channel, and
    then the statistics views show their reads (PostgresTable.hides_statistics() is False)."""
    role = f"topk_reader_{uuid.uuid4().hex[:8]}"
    with _connect(pg_conninfo) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    yield psycopg.conninfo.make_conninfo(pg_conninfo, user=role)
    with _connect(pg_conninfo) as conn:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def fresh_source(
    conninfo: str, schema: str, scores: np.ndarray, mode: str, reader: str | None = None
) -> PostgresTable:
    """A table of `scores` in its own (new) schema, prepared in `mode` ("live-sparse": live,
    ids 7, 10, 13, ... so that positions come from the position table, not from the ids),
    vacuumed, read through a connection that logs what it sends: as the `reader` role (granted
    what a run reads; the table accepts the statistics channel, which this module measures)
    where given, else as the superuser of `conninfo`."""
    ids = 7 + 3 * np.arange(len(scores)) if mode == "live-sparse" else None
    mode = "live" if mode == "live-sparse" else mode
    with _connect(conninfo) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        create_table(conn, schema, "votes", scores, ids)
    owner = PostgresTable(conninfo, "votes", ID_COLUMN, SCORE_COLUMN, schema=schema, mode=mode)
    owner.prepare()
    owner.close()
    if reader is not None:
        role = psycopg.conninfo.conninfo_to_dict(reader)["user"]
        with _connect(conninfo) as conn:
            for grant in (
                "GRANT USAGE ON SCHEMA {} TO {}",
                "GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}",
            ):
                conn.execute(sql.SQL(grant).format(sql.Identifier(schema), sql.Identifier(role)))
    vacuum_schema(conninfo, schema)
    source = PostgresTable(
        logged_connection(reader or conninfo),
        "votes",
        ID_COLUMN,
        SCORE_COLUMN,
        schema=schema,
        mode=mode,
    )
    assert source.hides_statistics() == (reader is None)
    source.accept_statistics_channel = reader is not None
    if mode == "live":
        assert source.max_score_runs > 0  # the runs-of-ties shortcut is on outside this mode
    return source


def observe(
    conninfo: str, schema: str, source: PostgresTable, seeds: range, settle: bool = True
) -> list[Any]:
    """Per release of `source`: the statements the server received and the change of the
    schema's table statistics (`settle`: once they have changed and settled, else 0.5 s after
    the release's flush). A first release is left out: it also reads each B-tree's metapage
    into the connection's caches."""
    conn = source._conn  # the logging connection of fresh_source
    private_top_k(source, K, EPSILON, oblivious=True, seed=0, deadline=0)
    conn.execute("SELECT pg_stat_force_next_flush()")  # earlier reads, before the first
    time.sleep(0.05)
    seen = []
    for seed in seeds:
        before = table_stats(conninfo, schema)
        conn.statements.clear()  # type: ignore[attr-defined]
        result = private_top_k(source, K, EPSILON, oblivious=True, seed=seed, deadline=0)
        statements = list(conn.statements)  # type: ignore[attr-defined]
        conn.execute("SELECT pg_stat_force_next_flush()")
        if settle:
            after = settled_stats(conninfo, schema, before)
        else:
            time.sleep(0.5)
            after = table_stats(conninfo, schema)
        delta = {t: tuple(np.subtract(after[t], before.get(t, (0,) * 6))) for t in after}
        assert not result.plan["miss"] and not result.plan["full_read"]
        seen.append((statements, delta, result.accesses.rows_fetched))
    return seen


def observe_python_api(
    conninfo: str, schema: str, scores: np.ndarray, mode: str, seeds: range, reader: str | None
) -> list[Any]:
    """Release from a fresh table of `scores` (its own schema) as `reader` (or the superuser):
    per release, the statements the server received and the change of the schema's table
    statistics."""
    source = fresh_source(conninfo, schema, scores, mode, reader)
    try:
        return observe(conninfo, schema, source, seeds)
    finally:
        source._conn.close()


def settled_stats(conninfo: str, schema: str, before: Any) -> Any:
    """The schema's table statistics once the release's flush has reached them: read until they
    differ from `before` and two reads 0.1 s apart agree (a loaded server publishes late)."""
    last = table_stats(conninfo, schema)
    for _ in range(50):
        time.sleep(0.1)
        now = table_stats(conninfo, schema)
        if now == last and now != before:
            return now
        last = now
    return last


@pytest.mark.parametrize("mode", ["copy", "live", "live-sparse"])
def test_postgres_statements_and_statistics_do_not_depend_on_the_data(
    pg_conninfo: str, schema: str, mode: str, reader: str
) -> None:
    """Neighbours (26 vs 27 at the head) and a zipf table, each vacuumed, released by a role
    that may not set track_counts: every release sends the same statements with the same
    parameter sizes, and touches the same tables the same way: scans, tuples, heap and index
    buffers (pg_statio_user_tables). Live tables with ids 0..m-1 read the drawn rows by id,
    others through the position table (live-sparse)."""
    low, high = neighbours()
    observed = [
        observe_python_api(pg_conninfo, schema, scores, mode, range(3), reader)
        for scores in (low, high, zipf())
    ]
    d = oblivious_depth(M, K, 1e-9)
    first = observed[0][0]
    assert first[2] == 2 * d
    for runs in observed:
        for statements, delta, rows in runs:
            assert rows == 2 * d
            assert statements == first[0]
            assert delta == first[1]
    # the sorted batch and the random batch: d rows each, one parameter of d positions
    assert any(sizes == (d,) for _, sizes in first[0])
    through_positions = any("_topk_pos" in text and sizes == (d,) for text, sizes in first[0])
    assert through_positions == (mode == "live-sparse")


def update_head(conninfo: str, schema: str, score: float) -> None:
    with _connect(conninfo) as conn:
        conn.execute(
            sql.SQL("UPDATE {} SET {} = %s WHERE {} = 0").format(
                sql.Identifier(schema, "votes"),
                sql.Identifier(SCORE_COLUMN),
                sql.Identifier(ID_COLUMN),
            ),
            [int(score)],
        )


def shapes(seen: list[Any]) -> set[Any]:
    """What a release sent and how many rows it read, without the statistics."""
    return {(tuple(statements), rows) for statements, _, rows in seen}


def buffers(seen: list[Any]) -> set[Any]:
    """The statistics of each release, but the write counter's (a copy's freshness check reads
    it: its size follows how many tables of the schema were written, not their counts)."""
    return {
        tuple(sorted((t, v) for t, v in delta.items() if t != "topk_write_counts"))
        for _, delta, _ in seen
    }


@pytest.mark.parametrize("mode", ["copy", "live"])
def test_a_neighbour_made_by_an_update(
    pg_conninfo: str, schema: str, mode: str, reader: str
) -> None:
    """The neighbour of a table (26 -> 27 at the head) made by an UPDATE of it, as docs/
    oblivious.md states it, released by a role that may not set track_counts. Live: the same
    statements, parameter sizes and rows; until a VACUUM the update's leftovers (the old row
    version, a page no longer all-visible) are met by the reads of the top rows, so the
    buffers differ from the unwritten table's; after a VACUUM that cleans the indexes they are
    the same again. Copy: the write leaves the copy unproven, so an oblivious release rebuilds
    it first (a full rebuild before the padded window: what shows that the table was written)
    and then reads it with the statements of the unwritten table; after a VACUUM its buffers
    are those of the unwritten table too."""
    low, high = neighbours()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        before = observe_python_api(pg_conninfo, schema, low, mode, range(2), reader)
    told = [w for w in said if "may not set track_counts" in str(w.message)]
    assert len(told) == 1  # once per source
    assert len(shapes(before)) == 1 and len(buffers(before)) == 1
    source = fresh_source(pg_conninfo, schema, low, mode, reader)
    try:
        update_head(pg_conninfo, schema, high[0])
        if mode == "copy":  # the reader may read the rebuilt copy
            owner = PostgresTable(pg_conninfo, "votes", ID_COLUMN, SCORE_COLUMN, schema=schema)
            owner.prepare(refresh=True)
            owner.close()
            role = psycopg.conninfo.conninfo_to_dict(reader)["user"]
            with _connect(pg_conninfo) as conn:
                conn.execute(
                    sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(
                        sql.Identifier(schema), sql.Identifier(role)
                    )
                )
        written = observe(pg_conninfo, schema, source, range(2))
        assert shapes(written) == shapes(before)  # live: as before; copy: the rebuilt copy
        if mode == "live":
            assert buffers(written) != buffers(before)
        vacuum_schema(pg_conninfo, schema)
        again = observe(pg_conninfo, schema, source, range(2))
    finally:
        source._conn.close()
    assert shapes(again) == shapes(before)
    assert buffers(again) == buffers(before)


@pytest.mark.parametrize("mode", ["copy", "live", "live-sparse"])
def test_a_role_that_may_set_track_counts_leaves_no_statistics(
    pg_conninfo: str, schema: str, mode: str
) -> None:
    """Released by a role that may set track_counts (here a superuser;
    PostgresTable.hides_statistics()), oblivious runs leave the schema's statistics where they
    were (scans, tuples, heap and index buffers: all zero), before and after an UPDATE that
    makes the neighbour and is not vacuumed, with the same statements as ever."""
    low, high = neighbours()
    source = fresh_source(pg_conninfo, schema, low, mode)
    try:
        before = observe(pg_conninfo, schema, source, range(2), settle=False)
        update_head(pg_conninfo, schema, high[0])
        if mode == "copy":
            source.prepare(refresh=True)
        written = observe(pg_conninfo, schema, source, range(2), settle=False)
    finally:
        source._conn.close()
    assert shapes(written) == shapes(before) and len(shapes(before)) == 1
    for _, delta, _ in before + written:
        assert all(v == 0 for t, values in delta.items() for v in values), delta


@pytest.mark.parametrize("mode", ["copy", "live"])
def test_sqlalchemy_on_postgresql_leaves_no_statistics_where_the_role_may(
    pg_conninfo: str, schema: str, mode: str
) -> None:
    """SQLAlchemyTable on PostgreSQL, as a superuser (hides_statistics()): oblivious releases
    on a table written since its last VACUUM leave the schema's statistics where they were
    (their backends flushed by closing them), while one adaptive release moves them."""
    low, high = neighbours()
    with _connect(pg_conninfo) as conn:
        create_table(conn, schema, "votes", low, None)
    engine = sa.create_engine(
        "postgresql+psycopg://", connect_args=psycopg.conninfo.conninfo_to_dict(pg_conninfo)
    )
    try:
        source = SQLAlchemyTable(
            engine, "votes", id=ID_COLUMN, score=SCORE_COLUMN, schema=schema, mode=mode
        )
        source.prepare()
        vacuum_schema(pg_conninfo, schema)
        update_head(pg_conninfo, schema, high[0])
        if mode == "copy":
            source.prepare(refresh=True)
        assert source.hides_statistics()

        def flushed() -> dict[str, tuple[int, ...]]:
            engine.dispose()  # the pool's backends end, and flush what they counted
            time.sleep(0.5)
            return table_stats(pg_conninfo, schema)

        before = flushed()
        for seed in range(3):
            private_top_k(source, K, EPSILON, oblivious=True, seed=seed, deadline=0)
        assert flushed() == before
        private_top_k(source, K, EPSILON, method="threshold", seed=0)
        engine.dispose()
        assert settled_stats(pg_conninfo, schema, before) != before
    finally:
        engine.dispose()


@pytest.mark.parametrize("mode", ["copy", "live", "live-sparse"])
def test_plans_are_pinned(pg_conninfo: str, schema: str, mode: str, reader: str) -> None:
    """The plans of an oblivious run follow neither the planner's statistics nor the session's
    cost settings nor the plan cache: after three releases, the session's planner costs are
    turned upside down (sequential pages dear, random ones cheap, operators costly), the tables
    are analyzed again on a sample of 100 rows, and six more releases (past psycopg's and
    PostgreSQL's fifth execution, where a query would be prepared and its plan cached) touch the
    same buffers with the same statements."""
    low, _ = neighbours()
    source = fresh_source(pg_conninfo, schema, low, mode, reader)
    try:
        first = observe(pg_conninfo, schema, source, range(3))
        for setting in ("random_page_cost = 0.01", "seq_page_cost = 50", "cpu_operator_cost = 5"):
            source._conn.execute(f"SET {setting}")
        with _connect(pg_conninfo) as admin:
            for (table,) in admin.execute(
                "SELECT format('%%I.%%I', schemaname, tablename) FROM pg_tables "
                "WHERE schemaname = %s",
                [schema],
            ).fetchall():
                admin.execute(f"SET default_statistics_target = 1; ANALYZE {table}")
        later = observe(pg_conninfo, schema, source, range(3, 9))
    finally:
        source._conn.close()
    assert len(shapes(first + later)) == 1
    assert len(buffers(first + later)) == 1


@pytest.mark.parametrize("frozen", [True, False])
def test_duckdb_reads_do_not_depend_on_the_data(frozen: bool) -> None:
    """The rank-ordered copy (frozen) reads the top row, then d rows of each list; the table
    read as it is now (not frozen: rowid slots, dialects/duckdb/table.py) takes its top score
    from the run's first query and reads d rows of each list."""
    counts = set()
    for scores in (*neighbours(), zipf()):
        con = duckdb.connect()
        try:
            duck_create_table(con, "votes", scores, None)
            source = DuckDBTable(con, "votes", id=DUCK_ID, score=DUCK_SCORE, frozen=frozen)
            source.prepare()
            for seed in range(3):
                result = private_top_k(source, K, EPSILON, oblivious=True, seed=seed, deadline=0)
                counts.add((result.accesses.rows_fetched, result.accesses.round_trips))
        finally:
            con.close()
    assert counts == {(2 * oblivious_depth(M, K, 1e-9), 3)}  # frozen copy and live table alike


# ----- the SQL function, as a hostile analyst with EXECUTE only ----------------------------------
@pytest.fixture(scope="module")
def installed(topk_installed: sql_function.Installed) -> sql_function.Installed:
    return topk_installed


@pytest.fixture(scope="module")
def analyst_schema(pg_conninfo: str, installed: Any) -> Iterator[str]:
    name = f"topk_obliv_fn_{uuid.uuid4().hex[:8]}"
    with _connect(pg_conninfo) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    yield name
    with _connect(pg_conninfo) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


def register(conninfo: str, schema: str, scores: np.ndarray) -> str:
    name = f"votes_{uuid.uuid4().hex[:8]}"
    with _connect(conninfo) as conn:
        create_table(conn, schema, name, scores, None)
    return sql_function.register_source(
        conninfo, name, ID_COLUMN, SCORE_COLUMN, schema=schema, grant=("PUBLIC",)
    )


@pytest.fixture(scope="module")
def analyst(pg_conninfo: str, analyst_schema: str) -> Iterator[str]:
    role = f"topk_obliv_{uuid.uuid4().hex[:8]}"
    with _connect(pg_conninfo) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                sql.Identifier(analyst_schema), sql.Identifier(role)
            )
        )
        conn.execute(
            sql.SQL("GRANT EXECUTE ON FUNCTION topk.private_top_k TO {}").format(
                sql.Identifier(role)
            )
        )
        conn.execute("SELECT topk.grant_budget(%s, %s, %s)", [role, 1e6, 0.5])
    yield psycopg.conninfo.make_conninfo(pg_conninfo, user=role)
    with _connect(pg_conninfo) as conn:
        conn.execute(
            "DELETE FROM topk.topk_ledger_charges WHERE principal = topk.principal(%s)", [role]
        )
        conn.execute(
            "DELETE FROM topk.topk_ledger_principals WHERE principal = topk.principal(%s)", [role]
        )
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


XACT_STATS = (
    "SELECT coalesce(sum(seq_scan), 0), coalesce(sum(seq_tup_read), 0), "
    "coalesce(sum(idx_scan), 0), coalesce(sum(idx_tup_fetch), 0) FROM pg_stat_xact_user_tables"
)


# What EXPLAIN (ANALYZE, BUFFERS, WAL) of a call counts at its top node: buffers and WAL.
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
STATISTICS, COUNTERS = slice(0, 4), slice(4, 4 + len(EXPLAIN_COUNTERS))


def watch(conn: psycopg.Connection[Any], table: str, extra: str) -> np.ndarray:
    """One call as the analyst sees it: in one transaction, pg_stat_xact_user_tables before and
    after (this backend's reads of every table; PostgreSQL 15 keeps earlier transactions' counts
    there until it flushes them, hence the difference), the buffer and WAL counters of EXPLAIN
    (ANALYZE, BUFFERS, WAL) of the call, and the call's wall time."""
    call = f"SELECT * FROM topk.private_top_k(%s::regclass, {K}, {EPSILON}{extra})"
    with conn.transaction(force_rollback=True):
        before = np.array(conn.execute(XACT_STATS).fetchone(), dtype=float)
        started = time.perf_counter()
        explain = "EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) "
        plan = conn.execute(explain + call, [table]).fetchone()[0]
        seconds = time.perf_counter() - started
        after = np.array(conn.execute(XACT_STATS).fetchone(), dtype=float)
    top = plan[0]["Plan"]
    counters = [float(top.get(key, 0)) for key in EXPLAIN_COUNTERS]
    return np.array([*(after - before), *counters, seconds])


def distinguisher_accuracy(dsn: str, tables: tuple[str, str], extra: str) -> float:
    """Train a nearest-mean classifier (features scaled by their spread) on 30 calls per table
    (interleaved), then classify 100 calls on tables drawn by a fair coin: its accuracy."""
    rng = np.random.default_rng(99)
    with psycopg.connect(dsn, autocommit=True) as conn:  # each call its own transaction
        watch(conn, tables[0], extra)  # the session's first call also loads the project
        # training calls interleaved, so that a drift of the machine's load over the run is
        # not learnt as a difference between the tables
        calls = [[watch(conn, t, extra) for t in tables] for _ in range(30)]
        train = [np.array([pair[i] for pair in calls]) for i in range(len(tables))]
        means = [x.mean(axis=0) for x in train]
        spread = np.vstack(train).std(axis=0) + 1e-12
        right = 0
        for _ in range(100):
            which = int(rng.integers(2))
            x = watch(conn, tables[which], extra)
            # nearer to means[1] than to means[0], summed feature by feature: a feature whose
            # means agree adds exactly 0 (a ledger table's reads that change over the run, equal
            # for both tables, cannot swamp the features that differ)
            closer = (means[1] - means[0]) * (2 * x - means[0] - means[1]) / spread**2
            right += int(closer.sum() > 0) == which
    return right / 100


def update_registered_head(conninfo: str, table: str, score: float) -> None:
    """UPDATE the row of id 0 of a registered table (no VACUUM after it)."""
    with _connect(conninfo) as conn:
        conn.execute(
            sql.SQL("UPDATE {} SET {} = %s WHERE {} = 0").format(
                sql.SQL(table), sql.Identifier(SCORE_COLUMN), sql.Identifier(ID_COLUMN)
            ),
            [int(score)],
        )


@contextmanager
def without_the_library(conninfo: str) -> Iterator[None]:
    """The fronts' I/O helpers in the PL/pgSQL forms of install.sql (what a server without the
    library topk_server keeps: they do nothing), then the library's C forms again."""
    text = resources.files("frontends").joinpath("sql/install.sql").read_text(encoding="utf-8")
    with _connect(conninfo) as admin:
        for name in ("_hide_io_begin", "_hide_io_end"):
            start = text.index(f"CREATE OR REPLACE FUNCTION topk.{name}()")
            admin.execute(text[start : text.index("$$;", start) + 3])
        try:
            yield
        finally:
            assert sql_function._install_native(admin) == (True, "")


def test_sql_function_default_defeats_a_server_observer(
    pg_conninfo: str, analyst_schema: str, analyst: str
) -> None:
    """Neighbours (26 vs 27 at the head), the second made by an UPDATE of a copy of the first
    and not vacuumed since (its old row version and a page no longer all-visible are met by the
    reads of the top rows): with the SQL function's defaults the distinguisher, which sees the
    statistics, EXPLAIN's buffer and WAL counters and the wall time, does no better than
    (1, 0)-DP allows."""
    low, high = neighbours()
    pair = (register(pg_conninfo, analyst_schema, low), register(pg_conninfo, analyst_schema, low))
    update_registered_head(pg_conninfo, pair[1], high[0])
    accuracy = distinguisher_accuracy(analyst, pair, "")
    assert accuracy <= 0.75, accuracy


def test_the_distinguisher_sees_adaptive_releases_without_the_library(
    pg_conninfo: str, analyst_schema: str, analyst: str
) -> None:
    """Its power: with oblivious => false, on a server without the library topk_server (EXPLAIN
    of a call then counts the function's reads), a plateau of 500 items at the top and a zipf
    table of one size (the adaptive run reads ~1,200 index tuples of the first, ~70 of the
    second) are told apart. (With the library, adaptive releases of 20,000 items differ in
    time only, by less than a call's own variation: EXPLAIN counts none of their reads.)"""
    plateau = np.zeros(M)
    plateau[:500] = 1000.0
    tables = (
        register(pg_conninfo, analyst_schema, plateau),
        register(pg_conninfo, analyst_schema, zipf()),
    )
    with without_the_library(pg_conninfo):
        assert distinguisher_accuracy(analyst, tables, ", 0, 'gumbel', false") >= 0.9


def test_explain_of_a_call_counts_none_of_its_reads(
    pg_conninfo: str, analyst_schema: str, analyst: str
) -> None:
    """The analyst's own view of its calls: the fronts keep their bodies' buffer and WAL use out
    of EXPLAIN (ANALYZE, BUFFERS, WAL) of the call (library topk_server), so every counter is 0
    for oblivious and adaptive releases alike, on neighbours, on a neighbour made by an UPDATE
    and not vacuumed since, and on a zipf table; the statistics views of the analyst's
    transaction stay at zero (track_counts off inside). Without the library the same oblivious
    calls count the function's reads (over 2d buffers, d rows of each list). The first call on
    each table is left out: it also reads the catalog into the session's caches."""
    low, high = neighbours()
    tables = [register(pg_conninfo, analyst_schema, s) for s in (low, high, low, zipf())]
    update_registered_head(pg_conninfo, tables[2], high[0])
    modes = ("", ", 0, 'gumbel', false")
    with psycopg.connect(analyst, autocommit=True) as conn:
        for table in tables:  # the session's first calls load the project and the catalog
            watch(conn, table, "")
        seen = [watch(conn, t, mode) for _ in range(2) for t in tables for mode in modes]
        with without_the_library(pg_conninfo):
            shown = [watch(conn, t, "") for t in tables[:2]]
    assert {tuple(x[STATISTICS]) for x in seen} == {(0.0, 0.0, 0.0, 0.0)}
    assert {tuple(x[COUNTERS]) for x in seen} == {(0.0,) * len(EXPLAIN_COUNTERS)}
    for x in shown:
        assert x[4] + x[5] > 2 * oblivious_depth(M, K, 1e-9)  # shared hit + read
