"""A run on a live PostgreSQL table: its transaction, its first statement, and what it holds.

Each run is one REPEATABLE READ READ ONLY transaction (`snapshot`). It learns m and checks the
scores in one query of three index probes (the last position; the largest score, which must be
finite and not NULL, NaN sorting there too; the smallest, which must be >= 0), never a count(*),
together with the position table's triggers (three, and unchanged since the positions were
filled: positions.triggers_sql) and the run's settings (no JIT, a small cursor_tuple_fraction, no
sequential scan; an oblivious run pins every plan). On a connection in autocommit mode (the one
the table opens) that query's statement also begins the transaction and, where the statistics
already say the run reads through the position table (more distinct scores than the runs of
tied scores allow: ties.py), declares the sorted cursor and fetches its first FIRST_ROWS rows,
the planner's probe: a release on skewed data is two round trips, that statement and the
COMMIT. The statistics (pg_stats.n_distinct of the score, from the last ANALYZE) are read again
every STATISTICS_TTL seconds and at prepare(): a stale estimate changes the cost, never an
answer.

A run after one that found at most the dialect's `whole_read_rows` rows, not oblivious, reads
the table whole in one statement outside any transaction (adapters/sql/whole.py `alone_run`:
one statement reads one snapshot; its rows are checked, sorted and released from memory, the
positions their ranks): no transaction, no facts, no cursor, no runs of tied scores. At 10^3
rows a run on the position table is several round trips (BEGIN and the facts, the runs of
tied scores, reads, COMMIT) where the read of every row is one. prepare() and uninstall()
forget the size, so the next run opens on the position table (and refuses without it).

A run whose first statement finds the triggers changed since the positions were filled (one
disabled, enabled again or replaced: writes may be missing from the positions) has them filled
again (prepare(), outside the run's transaction) and opens again. A connection lost before the
run read anything is opened again once (where the table owns it: the driver's `ensure`); one
lost during the run gives a ConnectionError, and the next run reconnects.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from adapters._sql import HIDE_STATISTICS
from adapters.dialects.postgres import oblivious as oblivious_sql
from adapters.dialects.postgres.live_reads import check_facts
from adapters.sql.whole import alone_run
from topk_middleware.planner import PROBE_ROWS

from .positions import triggers_sql
from .statements import sorted_live_query
from .ties import ScoreRuns, score_runs

# Rows per FETCH of the sorted cursor are what the core asks for; the planner is told that a
# run reads a small fraction of the table, so the cursor walks the B-tree instead of sorting.
CURSOR_TUPLE_FRACTION = 1e-6
# A run's first statement (on a connection in autocommit mode) also begins its transaction and,
# where the run will read by the position table, declares the sorted cursor and fetches the
# first FIRST_ROWS rows: the planner's probe (planner.PROBE_ROWS) in the run's one round trip.
FIRST_ROWS = PROBE_ROWS
BEGIN_RUN = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
# The probe of the runs of tied scores is skipped when pg_stats puts the distinct scores above
# this many times the limit; that estimate (changed by ANALYZE only) is read again after this
# many seconds, or at prepare().
DISTINCT_ESTIMATE_SLACK = 2
STATISTICS_TTL = 60.0
# Times a run has the positions filled again before it opens on them as they are.
REFILLS = 2


class Refresh(Exception):
    """Raised while a run opens: fill the positions again (outside the run's transaction) and
    open the run again."""


class DeclaredCursor:
    """The sorted cursor declared by the run's first statement, which fetched its first rows
    too: they are served first, then FETCH FORWARD on the named cursor (its transaction's end
    closes it)."""

    def __init__(
        self, conn: psycopg.Connection[Any], name: str, records: list[Any], binary: bool
    ) -> None:
        self._conn, self.name, self._records, self._binary = conn, name, records, binary
        self.closed = False

    def fetch(self, count: int) -> tuple[list[Any], int]:
        """The next `count` rows and the round trips that took (0 while the first rows last)."""
        records, self._records = self._records[:count], self._records[count:]
        if len(records) == count:
            return records, 0
        query = sql.SQL("FETCH FORWARD {} FROM {}").format(
            sql.Literal(count - len(records)), sql.Identifier(self.name)
        )
        with self._conn.cursor(binary=self._binary) as cur:
            records += cur.execute(query).fetchall()
        return records, 1

    def close(self) -> None:
        """CLOSE it if its transaction is still open (a cursor declared anew replaces it)."""
        if not self.closed and self._conn.info.transaction_status == TransactionStatus.INTRANS:
            self._conn.execute(sql.SQL("CLOSE {}").format(sql.Identifier(self.name)))
        self.closed = True


@dataclass
class LiveRun:
    """What a run holds: m, its runs of tied scores (set: it serves positions = ranks), its
    sorted cursor and where it stands, the middles of long runs it named by draws (draws.py)."""

    m: int
    runs: ScoreRuns | None = None  # set: this run serves positions = ranks
    cursor: psycopg.ServerCursor[Any] | DeclaredCursor | None = None
    depth: int = 0  # the next depth the cursor serves
    last_id: Any = None  # the id of the last row the cursor served (positions = ranks)
    middles: dict[int, Any] = field(default_factory=dict)  # by run; None: walked
    served: set[Any] = field(default_factory=set)  # ids of rows read by rank (never drawn)
    dense: bool = False  # an oblivious run over ids 0..m-1: an item's position is its id
    first_rows: int = 0  # sorted rows the run's first statement fetched


def cursor_name(t: Any) -> str:
    return f"topk_sorted_{id(t):x}"


def _close_quietly(cursor: Any) -> None:
    """Close a run's server-side cursor after its transaction ended (psycopg then sends no
    CLOSE: the transaction's end closed it)."""
    if cursor is not None and not cursor.closed:
        try:
            cursor.close()
        except psycopg.Error:
            pass  # the connection is broken: nothing is left to close


def _repeatable_read(conn: psycopg.Connection[Any]) -> None:
    conn.isolation_level, conn.read_only = psycopg.IsolationLevel.REPEATABLE_READ, True


@contextmanager
def snapshot(t: Any) -> Iterator[None]:
    """The run of table `t` (module docstring): one REPEATABLE READ READ ONLY transaction."""
    if t._run is not None or t._whole is not None:  # nested: the outer snapshot holds
        yield
        return
    t.driver.ensure()
    conn = t._conn
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise RuntimeError(
            f"{t.where}: the connection is inside a transaction; snapshot() needs to open "
            "its own REPEATABLE READ READ ONLY transaction"
        )
    whole = alone_run(t)
    if whole is not None:  # a small table: one statement, its own snapshot (module docstring)
        t._whole = whole
        try:
            yield
        finally:
            t._whole = None
        return
    saved = conn.isolation_level, conn.read_only
    _repeatable_read(conn)
    yielded = False
    t._refreshes = 0
    try:
        attempt = 1
        while True:
            try:
                cursor = None
                try:
                    with run_transaction(t, conn):
                        if t._oblivious:
                            hide_statistics(t, conn)
                        t._run = open_run(t, conn)
                        t.last_m = t._run.m
                        yielded = True
                        try:
                            yield
                        finally:
                            cursor = t._end_run()
                finally:  # after the COMMIT or ROLLBACK, which closed it on the server
                    _close_quietly(cursor)
                return
            except Refresh:  # fill the positions outside the run's transaction, open again
                t._refreshes += 1
                conn.isolation_level, conn.read_only = saved
                t.prepare(refresh=True)
                t.driver.ensure()
                conn = t._conn
                _repeatable_read(conn)
                continue
            except psycopg.OperationalError:
                # Lost before the run read anything (a terminated backend is only noticed at
                # the next query): reconnect once, if the connection is ours.
                lost = conn.closed or conn.broken
                if attempt == 2 or yielded or not lost or not t.driver.conninfo:
                    raise
                t.driver.ensure()
                conn = t._conn
                _repeatable_read(conn)
            attempt += 1
    except psycopg.OperationalError as error:
        if not (conn.closed or conn.broken):
            raise
        raise t.driver.lost_error(t.where, error) from None
    finally:
        if not conn.closed:
            conn.isolation_level, conn.read_only = saved


def hide_statistics(t: Any, conn: psycopg.Connection[Any]) -> None:
    """An oblivious run's first statement: track_counts off for its transaction where the role
    may set it (the dialect's hides_statistics). Where it may not, the core refused the release
    (StoreTraits.oblivious_reads_seen) unless the table accepts the channel
    (accept_statistics_channel): the statistics views then show the blocks the run reads,
    which depend on the table's layout (docs/promise.md), said once per source."""
    if t.dialect.hides_statistics(t.driver):
        conn.execute(HIDE_STATISTICS)
    else:
        t.dialect.warn_statistics(t.driver, t.where)


@contextmanager
def run_transaction(t: Any, conn: psycopg.Connection[Any]) -> Iterator[None]:
    """The run's transaction. On a connection in autocommit mode (what the table opens) its
    BEGIN rides on the run's first query (`facts_and_rows`) instead of a round trip of its own;
    COMMIT at the end, ROLLBACK after an error. Oblivious runs keep psycopg's."""
    if not conn.autocommit or t._oblivious:
        with conn.transaction():
            yield
        return
    t._begin_pending = True
    try:
        yield
    except BaseException:
        t._begin_pending = False
        if conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
            try:
                conn.execute("ROLLBACK")
            except psycopg.Error:
                pass  # a broken connection: the error that broke it is raised below
        raise
    if t._begin_pending:  # no query ran (the first one begins the transaction)
        t._begin_pending = False
        return
    conn.execute("COMMIT")


def open_run(t: Any, conn: psycopg.Connection[Any]) -> LiveRun:
    """The run's first statement (`facts_and_rows`), its runs of tied scores where the scores
    are few (ties.score_runs), and its sorted cursor where that statement declared it."""
    now = time.monotonic()
    stale = t.max_score_runs > 0 and (
        t._estimate_read_at is None or now - t._estimate_read_at > STATISTICS_TTL
    )
    # Where the run's first statement begins the transaction and the statistics already say
    # the run takes no runs of tied scores, the same statement declares the sorted cursor and
    # fetches the planner's probe.
    first = 0
    if t._begin_pending and not t._oblivious and not stale:
        estimate = t._estimate
        if t.max_score_runs < 1 or (
            estimate is not None and estimate > DISTINCT_ESTIMATE_SLACK * t.max_score_runs
        ):
            first = FIRST_ROWS
    m, distinct, records = facts_and_rows(t, conn, stale, first)
    if not t._positions_unchanged and t._refreshes < REFILLS:
        raise Refresh  # snapshot() runs prepare(), which fills the positions again
    if stale:
        t._estimate, t._estimate_read_at = distinct, now
    distinct = t._estimate
    few = distinct is None or distinct <= DISTINCT_ESTIMATE_SLACK * t.max_score_runs
    run = LiveRun(m, score_runs(t, conn, m) if few else None)
    run.dense = t._oblivious and t._dense_ids
    if records is not None and run.runs is None:
        run.cursor = DeclaredCursor(conn, cursor_name(t), records, t.integer_ids)
        run.first_rows = len(records)
    return run


def facts_and_rows(
    t: Any, reader: Any, with_estimate: bool = False, first_rows: int = 0
) -> tuple[int, float | None, list[Any] | None]:
    """m, after checking that the position table and its triggers are there and the scores'
    extremes, and, if asked, the planner's estimate of the distinct scores (None without
    statistics; pg_stats costs ~0.9 ms, hence STATISTICS_TTL): one query of catalog lookups and
    three index probes. Where the run's transaction is yet to begin, the same statement begins
    it; with `first_rows`, it then declares the sorted cursor over the position table and
    fetches that many rows (returned; None otherwise)."""
    # The run's settings ride on the same query: no JIT (a cursor is planned for the whole
    # table, whose cost would trigger a compilation of ~50-150 ms for a read of 20 rows), a
    # small cursor_tuple_fraction (walk the B-tree rather than sort), and no sequential scan:
    # every read of a live run has an index path, and statistics gone stale after writes (a
    # value ANALYZE saw in 3 million rows, now in 17,000) made the planner count a run of tied
    # scores by scanning the table (5.3 s at m = 10^7 instead of ~50 ms). An oblivious run pins
    # every plan of its transaction (adapters/dialects/postgres/oblivious.py).
    query = sql.SQL(
        "SELECT set_config('jit', 'off', true), "
        "set_config('cursor_tuple_fraction', {fraction}, true), "
        "set_config('enable_seqscan', 'off', true), {pins}"
        "(SELECT count(*) FROM pg_trigger WHERE tgrelid = {base_name}::regclass "
        "AND tgname LIKE {triggers} AND NOT tgisinternal), "
        "{state} IS NOT DISTINCT FROM obj_description(to_regclass({pos_name}), 'pg_class'), "
        "(SELECT position + 1 FROM {pos} ORDER BY position DESC LIMIT 1), "
        "(SELECT b.{score}::float8 FROM {base} AS b ORDER BY b.{score} DESC LIMIT 1), "
        "(SELECT b.{score}::float8 FROM {base} AS b ORDER BY b.{score} ASC NULLS LAST "
        "LIMIT 1), {ids}"
        + (
            "(SELECT max(CASE WHEN s.n_distinct >= 0 THEN s.n_distinct "
            "ELSE -s.n_distinct * greatest(c.reltuples, 0) END) FROM pg_class AS c "
            "JOIN pg_namespace AS n ON n.oid = c.relnamespace JOIN pg_stats AS s "
            "ON s.schemaname = n.nspname AND s.tablename = c.relname "
            "AND s.attname = {score_name} WHERE c.oid = {base_name}::regclass)"
            if with_estimate
            else "NULL::float8"
        )
    ).format(
        pins=sql.SQL(oblivious_sql.pin_plans_sql()) + sql.SQL(", ")
        if t._oblivious
        else sql.SQL(""),
        # an oblivious run with integer ids: the least and the largest id (dense ids name
        # items by themselves, without the position table: open_run)
        ids=sql.SQL(
            "(SELECT b.{id}::int8 FROM {base} AS b ORDER BY b.{id} ASC LIMIT 1), "
            "(SELECT b.{id}::int8 FROM {base} AS b ORDER BY b.{id} DESC LIMIT 1), "
        ).format(id=t._id, base=t._base)
        if t._oblivious and t.integer_ids
        else sql.SQL("NULL::int8, NULL::int8, "),
        fraction=sql.Literal(str(CURSOR_TUPLE_FRACTION)),
        base_name=sql.Literal(t._base.as_string(t._conn)),
        triggers=sql.Literal(t.trigger_function + "%"),
        state=triggers_sql(t),
        pos_name=sql.Literal(t._pos.as_string(t._conn)),
        pos=t._pos,
        score=t._score,
        base=t._base,
        score_name=sql.Literal(t.score_column),
    )
    begin, t._begin_pending = t._begin_pending, False
    records = None
    try:
        if not begin:
            row = reader.execute(query).fetchone()
        else:  # one statement: BEGIN; the facts[; DECLARE the sorted cursor; FETCH]
            parts = [sql.SQL(BEGIN_RUN), query]
            if first_rows:
                name = sql.Identifier(cursor_name(t))
                parts += [
                    sql.SQL("DECLARE {} NO SCROLL CURSOR FOR ").format(name) + sorted_live_query(t),
                    sql.SQL("FETCH FORWARD {} FROM {}").format(sql.Literal(first_rows), name),
                ]
            cur = reader.execute(sql.SQL("; ").join(parts))
            cur.nextset()
            row = cur.fetchone()
            if first_rows:
                cur.nextset()
                cur.nextset()
                records = cur.fetchall()
        *_, triggers, unchanged, m, top, bottom, low, high, distinct = row
    except psycopg.errors.UndefinedTable:
        triggers, unchanged = 0, True
    if triggers != 3:
        raise ValueError(
            f"{t.where} has no position table {t.position_table!r} with its triggers: "
            "call prepare() (mode='live')"
        )
    # a trigger disabled (and maybe enabled again) or replaced since the positions were filled:
    # writes meanwhile may be missing from them (open_run has them filled again)
    t._positions_unchanged = bool(unchanged)
    m = check_facts(t.where, t.score_column, m, top, bottom)
    # m distinct integer ids (a unique B-tree) from 0 to m - 1 are exactly 0..m-1
    t._dense_ids = low == 0 and high == m - 1
    return m, None if distinct is None else float(distinct), records
