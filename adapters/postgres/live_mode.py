"""PostgresTable(..., mode="live"): release from the user's table as it is now, with no copy.

`PostgresTable(conninfo, table, mode="live")` reads the table itself in each run's snapshot, so
writes need no rebuild: UPDATE, INSERT and DELETE of counts are seen by the next run.

What `prepare()` installs, once (adapters/postgres/copy_mode.py builds nothing else in this mode):

* a B-tree on the table's (score DESC, id) (`COLLATE "C"` for text ids: the canonical order of
  topk_middleware/access.py), and a unique B-tree on id unless the table has one, both with
  CREATE INDEX CONCURRENTLY, so writers are never blocked while they are built. PostgreSQL keeps
  them current on every write;
* a *position table* `<table>_topk_pos (position, id)` with two covering B-trees (position ->
  id, id -> position, both served by index-only scans): positions 0..m-1 are what random access
  and uniform sampling name (access.py, DESIGN invariant 11);
* row triggers on the table that keep positions dense at O(1) per changed item: an inserted item
  takes position m; a deleted item's position is given to the item at position m - 1 (swap-
  remove); a changed id is a delete and an insert; a TRUNCATE empties the position table. Item
  inserts and deletes are serialised by a transaction-level advisory lock (updates of counts take
  no lock and fire no trigger). The trigger reads the last position after taking the lock, which
  only a READ COMMITTED statement sees as it is: an item insert or delete in a REPEATABLE READ or
  SERIALIZABLE transaction is refused with a clear error rather than allowed to misplace one.
  The position table is filled and the triggers created in one
  transaction that holds a SHARE ROW EXCLUSIVE lock on the table for its duration (writers wait
  those seconds once; readers never).

Each run is one REPEATABLE READ READ ONLY transaction. It learns m and checks the scores in one
query of three index probes (the last position; the largest score, which must be finite and not
NULL, NaN sorting there too; the smallest, which must be >= 0), never a count(*). On a connection
in autocommit mode (the one this object opens) that query's statement also begins the
transaction and, where the statistics already say the run reads through the position table
(more distinct scores than the runs below allow), declares the sorted cursor and fetches its
first FIRST_ROWS rows, the planner's probe: a release on skewed data is two round trips, that
statement and the COMMIT. Sorted access
is a server-side cursor over the (score DESC, id) B-tree joined to the position table (FETCH
FORWARD n per read, in binary for integer ids, which numpy converts in one step; any other
start falls back to OFFSET); random access by position goes through
the position table's primary key and the table's id B-tree (`position = ANY(...)`), one query
per batch. Concurrent writers are never blocked and never change a run (the snapshot sees one
state of the table, its positions and its indexes).

By default positions are not ranks: nothing is inferred from tied neighbours and no runs of
tied scores are used (access.py), so each random access of a run is a real read (~20-30 us a row
at m = 10^7, the ~10^4 random accesses of a plateau run included).

Oblivious runs (inside `oblivious_reads()`, mechanisms/oblivious.py; adapters/postgres/
oblivious.py) pin their plans in the first query, take no runs of tied scores, read the top
rows from the (score DESC, id) B-tree alone (access.SortedIds: no position), and read each drawn
position on its own, one lookup of the position table and one of the id B-tree, in a nested
loop. Where the first query finds the integer ids to be exactly 0..m-1 (the least and the
largest id, two probes of the id B-tree, and m), an item's position is its id: the position
table is not read at all (one lookup per drawn position).

Runs of tied scores (`max_score_runs`, default MAX_SCORE_RUNS = 32; 0 turns them off). Count
data often has few distinct scores (a plateau, small counts, zeros). In the run's transaction,
right after m, one query skips down the (score DESC, id) B-tree (a recursive CTE: one index probe
per distinct score, stopping past N) and, if the scores were at most N, counts runs by index
scan, each count stopped at `run_count_rows` / (number of runs) rows: each run but the last, the
last (lowest score: on count data the one very large run of zeros) sized as m minus the others,
or, where another run reached the bound, counted too, that one then sized from m (`_sized_runs`).
Counting costs a heap visit per row once writes have cleared the table's visibility map (about
0.3-0.5 us a row: 60,000 rows outside the zeros were 18-29 ms of a 1e7 plateau run after 1%
writes), so only the runs above the first *gap* are counted: down to the first score below
RUN_GAP_RATIO (1/2) times the one above it. Where two runs or more lie below that gap, the run
serves the head (`read_score_runs_head`: their first ranks and where the rest begins) and the
core bounds a score past it between the least score and the first score below the gap, which on
a plateau above small counts settles every random access there without a read (access.py,
ScoreRuns); the runs below are counted in the run's snapshot only when a rank there is read
(`_full_runs`, also `read_score_runs`), in full where two of them are too large for the bound.
The probe is skipped when the planner's statistics (pg_stats.n_distinct, from the last ANALYZE,
read again every STATISTICS_TTL seconds and at prepare()) put the distinct scores above 2 N: a
stale estimate changes the cost, never an answer. Then
positions are the canonical ranks of that snapshot (a dense position map, so the output law is
the one-shot law): sorted access reads the B-tree alone and returns depths as positions; the core
answers random access from the runs (`ScoreRuns`, read with the run's first queries); the row at
a rank (an id to release) is read at (its run's score, its offset in the run) through the B-tree,
walked from the nearer of: the run's start, the last row the cursor served, the run's end.
Otherwise (more distinct scores, or two runs too large to count) the run uses the position table
as above. The choice depends on the data only and changes no answer's law: an operator
diagnostic (`positions_are_ranks`, `score_run_count()`).

Deep in a long run. PostgreSQL's B-tree keeps no subtree counts, so an offset is a walk, ~2.5 us a
row on a table whose visibility map the writes cleared (measured at m = 10^7: 0.26 s for an id
10^5 deep in a run, 2.2-2.6 s for 10^6). Items of one run are exchangeable: the mechanism decided
everything beyond the fetched prefix from the runs' scores alone, so a bijection between a run's
unread ranks and its unread items drawn independently of the noise leaves the output law
unchanged (access.ExchangeableTies). A release therefore names a rank more than RUN_WALK_ROWS
rows from every walk's start by a uniformly random item of the run's unread middle (the items
between the canonical rows RUN_WALK_ROWS from either end), drawn from the run's generator:
uniform positions of the position table, kept when their row is in that middle and not drawn
before (rejection sampling; one query per round, about (ranks to name) / (middle / m) positions),
unless walking is the cheaper of the two for that run (a short run in a large table). Ranks near
either end keep their canonical rows. Once a run has drawn items, sorted access may not reach its
middle (no mechanism reads on after naming its release: refused as a broken invariant). With a
seed the draw is reproducible; the answer for a seed then equals the rank-ordered ArraySource's
except for items deep in a tied run, which are the same in law.

Zero-vote items are rows with score 0 (a `from_votes` counts table has them): they count in m
and come last in sorted access.

Size: one class, LivePostgresTable, whose methods share the run's snapshot, the position
table and the runs of tied scores; what it shares with copy mode stays in copy_mode.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from adapters._sql import (
    MAX_IDENTIFIER_BYTES,
    AccessCheck,
    AccessPath,
    plain_values,
    rows_from_records,
    scores_in_order,
)
from adapters.dialects.postgres import oblivious as oblivious_sql
from adapters.sql.driver import Int8Array, register_int8_arrays
from topk_middleware.access import AccessError, Rows, RunTraits, ScoreBins
from topk_middleware.mechanisms.oblivious import ObliviousCosts
from topk_middleware.planner import PROBE_ROWS

from .base import PostgresBase, _Refresh, _seq_scans
from .copy_mode import PostgresTable

# Rows per FETCH of the sorted cursor are what the core asks for; the planner is told that a
# run reads a small fraction of the table, so the cursor walks the B-tree instead of sorting.
CURSOR_TUPLE_FRACTION = 1e-6
# A run's first statement (on a connection in autocommit mode) also begins its transaction and,
# where the run will read by the position table, declares the sorted cursor and fetches the
# first FIRST_ROWS rows: the planner's probe (planner.PROBE_ROWS) in the run's one round trip.
FIRST_ROWS = PROBE_ROWS
BEGIN_RUN = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"


# A run learns its snapshot's runs of tied scores when there are at most `max_score_runs`
# distinct scores (one index probe each; 0: never) and counting all runs but the largest reads at
# most `run_count_rows` rows; it then serves positions = ranks (module docstring).
MAX_SCORE_RUNS = 32
RUN_COUNT_ROWS = 1 << 18
# The probe is skipped when pg_stats puts the distinct scores above this many times the limit;
# that estimate (changed by ANALYZE only) is read again after this many seconds, or at prepare().
DISTINCT_ESTIMATE_SLACK = 2
STATISTICS_TTL = 60.0
# The runs are counted down to the first score below this fraction of the one above it (a gap):
# the runs below, if two or more, are counted only when a rank there is read (module docstring).
RUN_GAP_RATIO = 0.5
# A released rank further than this from every start of a walk along its run is named by a draw
# from the run's unread middle (module docstring: "Deep in a long run").
RUN_WALK_ROWS = 1024
# What one drawn position costs (a position-table probe and a row) in rows walked along a run.
DRAW_COST_IN_WALKED_ROWS = 4
# Positions drawn per round of the rejection sampling, at most, and rounds at most (each round
# expects 1.5 times the items it needs: running out means the positions do not cover the run).
DRAW_BATCH_MAX = 1 << 16
DRAW_ROUNDS_MAX = 64


@dataclass
class _ScoreRuns:
    """The snapshot's runs of tied scores, in canonical order: first rank and size of the runs
    sized so far (all of them, or a head: `complete`), and every run's score (as float8 for the
    core, and as the column's own value for index lookups)."""

    first: np.ndarray
    sizes: np.ndarray
    scores: np.ndarray
    values: list[Any]

    @property
    def complete(self) -> bool:
        return len(self.first) == len(self.scores)

    @property
    def end(self) -> int:
        """The rank past the runs sized: m when complete, else where the runs not sized begin."""
        return int(self.first[-1] + self.sizes[-1])


@dataclass
class _Middle:
    """The unread middle of one long run, whose items a release names by uniform draws: ranks
    [first, stop), items with the run's score and an id strictly between `low` and `high` (the
    canonical rows at first - 1 and stop)."""

    first: int
    stop: int
    low: Any
    high: Any
    named: dict[int, tuple[Any, float]] = field(default_factory=dict)  # rank -> drawn row
    taken: set[Any] = field(default_factory=set)  # ids drawn


class _DeclaredCursor:
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
class _LiveRun:
    m: int
    runs: _ScoreRuns | None = None  # set: this run serves positions = ranks
    cursor: psycopg.ServerCursor[Any] | _DeclaredCursor | None = None
    depth: int = 0  # the next depth the cursor serves
    last_id: Any = None  # the id of the last row the cursor served (positions = ranks)
    middles: dict[int, _Middle | None] = field(default_factory=dict)  # by run; None: walked
    served: set[Any] = field(default_factory=set)  # ids of rows read by rank (never drawn)
    dense: bool = False  # an oblivious run over ids 0..m-1: an item's position is its id
    first_rows: int = 0  # sorted rows the run's first statement fetched


def _numeric_rows(records: list[tuple[Any, ...]], depth: int | None = None) -> Rows:
    """Rows from records of integers and a float: (position, id, score), or, with `depth`,
    (id, score) at ranks depth, depth + 1, ... (numpy converts the tuples in one pass)."""
    if not records:
        return rows_from_records([])
    if depth is None:
        table = np.array(records, dtype=[("p", np.int64), ("i", np.int64), ("s", np.float64)])
        return Rows(table["p"].copy(), table["i"].copy(), table["s"].copy())
    table = np.array(records, dtype=[("i", np.int64), ("s", np.float64)])
    ranks = np.arange(depth, depth + len(records), dtype=np.int64)
    return Rows(ranks, table["i"].copy(), table["s"].copy())


def _short_name(base: str, suffix: str) -> str:
    """`base + suffix`, or, past PostgreSQL's 63-byte limit, `base` cut short with a hash."""
    name = base + suffix
    if len(name.encode("utf-8")) <= MAX_IDENTIFIER_BYTES:
        return name
    tag = "_" + hashlib.sha1(base.encode("utf-8")).hexdigest()[:8] + suffix
    head = base.encode("utf-8")[: MAX_IDENTIFIER_BYTES - len(tag)]
    return head.decode("utf-8", "ignore") + tag


# Oblivious releases (mechanisms/oblivious.py: the deadline's model), measured at m = 10^5 to
# 10^6 on the test server (2 cores shared by several loads: the median work at 10^6 is 30 ms at
# a load average of 5, 61 ms at 8): a drawn position costs an id lookup (and a position-table
# lookup where the ids are not 0..m-1), which miss the buffer cache once the table and its
# B-trees outgrow it.
LIVE_OBLIVIOUS_COSTS = ObliviousCosts(
    fixed=4e-3,
    sorted_row=5e-7,
    random_row=5e-6,
    random_miss=1e-5,
    cached_rows=8e5,
    full_row=3e-6,
)


class LivePostgresTable(PostgresBase):
    """PostgresTable in live mode (module docstring); built by `PostgresTable(..., mode="live")`."""

    oblivious_costs = LIVE_OBLIVIOUS_COSTS  # type: ignore[assignment]  # one model: no copy

    _live: _LiveRun | None = None  # the run in progress, inside snapshot()
    _dense_ids = False  # whether the last run's first query found ids 0..m-1
    # No in-store one-shot: its keyed noise names items by rank, which a live table does not
    # keep (None takes the method away, so it is not an InStoreOneShot and the planner knows).
    read_oneshot = None  # type: ignore[assignment]

    def __init__(
        self,
        *args: Any,
        max_score_runs: int = MAX_SCORE_RUNS,
        run_count_rows: int = RUN_COUNT_ROWS,
        **kwargs: Any,
    ) -> None:
        for name, value in (("max_score_runs", max_score_runs), ("run_count_rows", run_count_rows)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        super().__init__(*args, **kwargs)
        self.max_score_runs, self.run_count_rows = max_score_runs, run_count_rows
        self._estimate: float | None = None  # pg_stats' distinct scores, read at ...
        self._estimate_read_at: float | None = None  # ... this time.monotonic(), if read
        self._begin_pending = False  # the run's first query begins its transaction
        self._setup_live()

    @contextmanager  # type: ignore[override]
    def oblivious_reads(self) -> Iterator[None]:
        """access.ObliviousReads: no runs of tied scores for the runs opened inside (their probe
        and their walks read as many rows as the data has runs): positions come from the
        position table, read in batches of a fixed size."""
        saved, self.max_score_runs = self.max_score_runs, 0
        try:
            with super().oblivious_reads():
                yield
        finally:
            self.max_score_runs = saved

    def _setup_live(self) -> None:
        schema, table = self.schema, self.table
        self.position_table = _short_name(table, "_topk_pos")
        digest = hashlib.sha1(
            "\x00".join((schema or "", table, self.id_column, self.score_column)).encode()
        ).hexdigest()[:12]
        self.order_index = f"topk_{digest}_order"
        self.live_id_index = f"topk_{digest}_live_id"
        self.trigger_function = f"topk_{digest}_positions"
        self._lock_key = int(digest[:15], 16)  # advisory lock of item inserts and deletes
        qualify = (
            (lambda n: sql.Identifier(n))
            if schema is None
            else (lambda n: sql.Identifier(schema, n))
        )
        self._pos = qualify(self.position_table)
        self._function = qualify(self.trigger_function)

    # ----- preparation --------------------------------------------------------------------------
    def prepare(self, refresh: bool = False) -> None:
        """Install the B-trees, the position table and its triggers if they are missing
        (idempotent; `refresh` is accepted for symmetry and changes nothing: a live table needs
        no rebuild). The table is validated first."""
        if self._run is not None:
            raise RuntimeError("prepare() cannot run inside snapshot()")
        self._estimate_read_at = None  # read the statistics again at the next run
        self.validate()
        conn = self._conn
        if not conn.autocommit and conn.info.transaction_status != TransactionStatus.IDLE:
            raise RuntimeError(f"{self.where}: prepare() needs a connection outside a transaction")
        saved = conn.autocommit
        conn.autocommit = True  # CREATE INDEX CONCURRENTLY cannot run inside a transaction
        try:
            id_key = sql.SQL('{} COLLATE "C"').format(self._id) if self._text_ids else self._id
            conn.execute(
                sql.SQL("CREATE INDEX CONCURRENTLY IF NOT EXISTS {} ON {} ({} DESC, {})").format(
                    sql.Identifier(self.order_index), self._base, self._score, id_key
                )
            )
            if not self._has_unique_id_index():
                conn.execute(
                    sql.SQL("CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {} ON {} ({})").format(
                        sql.Identifier(self.live_id_index), self._base, self._id
                    )
                )
        except psycopg.errors.UniqueViolation:
            raise ValueError(f"{self.where} column {self.id_column!r} has duplicate ids") from None
        finally:
            conn.autocommit = saved
        with conn.transaction():
            installed = self._positions_installed(conn)
            if not installed:
                self._install_positions(conn)
        if not installed:  # set the visibility map: the position B-trees answer alone
            conn.autocommit = True
            try:
                conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(self._pos))
            finally:
                conn.autocommit = saved

    def uninstall(self) -> None:
        """Drop everything prepare() made in this mode: the three triggers on the table, their
        function, the position table (one transaction), then the B-tree on (score DESC, id) and
        the unique B-tree on id if prepare() made it (DROP INDEX CONCURRENTLY: writers are not
        blocked). The table and its rows are not touched; an index the table had before is
        kept. Idempotent; runs need prepare() again afterwards."""
        if self._run is not None:
            raise RuntimeError("uninstall() cannot run inside snapshot()")
        conn = self._conn
        if not conn.autocommit and conn.info.transaction_status != TransactionStatus.IDLE:
            raise RuntimeError(
                f"{self.where}: uninstall() needs a connection outside a transaction"
            )
        with conn.transaction():
            base = self._base.as_string(conn)
            if conn.execute("SELECT to_regclass(%s) IS NOT NULL", [base]).fetchone()[0]:
                for suffix in ("_items", "_ids", "_truncate"):
                    name = sql.Identifier(self.trigger_function + suffix)
                    conn.execute(
                        sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(name, self._base)
                    )
            conn.execute(sql.SQL("DROP FUNCTION IF EXISTS {}()").format(self._function))
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._pos))
        saved = conn.autocommit
        conn.autocommit = True  # DROP INDEX CONCURRENTLY cannot run inside a transaction
        try:
            for index in (self.order_index, self.live_id_index):
                name = (
                    sql.Identifier(index)
                    if self.schema is None
                    else sql.Identifier(self.schema, index)
                )
                conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(name))
        finally:
            conn.autocommit = saved
        self._estimate_read_at = None

    def _has_unique_id_index(self) -> bool:
        """Whether a valid unique B-tree has exactly the id column as its key."""
        query = (
            "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = "
            "i.indrelid AND a.attnum = i.indkey[0] WHERE i.indrelid = %s::regclass AND "
            "i.indisunique AND i.indisvalid AND i.indnatts = 1 AND i.indexprs IS NULL AND "
            "i.indpred IS NULL AND a.attname = %s)"
        )
        with self._reading() as cur:
            base = self._base.as_string(self._conn)
            return bool(cur.execute(query, [base, self.id_column]).fetchone()[0])

    def _positions_installed(self, reader: Any) -> bool:
        """The position table and its three triggers are there, as they were when the
        positions were filled (`_triggers_sql`)."""
        query = sql.SQL(
            "SELECT to_regclass({pos_name}) IS NOT NULL AND (SELECT count(*) = 3 FROM pg_trigger "
            "WHERE tgrelid = {base_name}::regclass AND tgname LIKE {triggers} "
            "AND NOT tgisinternal) AND {state} IS NOT DISTINCT FROM "
            "obj_description(to_regclass({pos_name}), 'pg_class')"
        ).format(
            pos_name=sql.Literal(self._pos.as_string(self._conn)),
            base_name=sql.Literal(self._base.as_string(self._conn)),
            triggers=sql.Literal(self.trigger_function + "%"),
            state=self._triggers_sql(),
        )
        return bool(reader.execute(query).fetchone()[0])

    def _triggers_sql(self) -> sql.Composable:
        """A digest of the position triggers' catalog rows (each row's xmin changes whenever
        the trigger is disabled, enabled or replaced: a write made meanwhile fired nothing, and
        the positions may have missed it)."""
        return sql.SQL(
            "(SELECT md5(string_agg(concat_ws(':', tgname, xmin, tgenabled), ',' "
            "ORDER BY tgname)) FROM pg_trigger WHERE tgrelid = to_regclass({base_name}) "
            "AND tgname LIKE {triggers} AND NOT tgisinternal)"
        ).format(
            base_name=sql.Literal(self._base.as_string(self._conn)),
            triggers=sql.Literal(self.trigger_function + "%"),
        )

    def _install_positions(self, conn: psycopg.Connection[Any]) -> None:
        """Position table, filled in id order, and its triggers: one transaction (the caller's)
        holding a SHARE ROW EXCLUSIVE lock on the table, so no write falls in between."""
        conn.execute(sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(self._base))
        id_type = conn.execute(
            "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
            "WHERE a.attrelid = %s::regclass AND a.attname = %s",
            [self._base.as_string(conn), self.id_column],
        ).fetchone()[0]
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._pos))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {pos} (position bigint NOT NULL, id {type} NOT NULL, "
                "PRIMARY KEY (position) INCLUDE (id), UNIQUE (id) INCLUDE (position))"
            ).format(pos=self._pos, type=sql.SQL(id_type))
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {pos} (position, id) SELECT row_number() OVER (ORDER BY {id}) - 1, "
                "{id} FROM {base}"
            ).format(pos=self._pos, id=self._id, base=self._base)
        )
        where = self.where.replace("'", "''")
        body = sql.SQL(
            """
DECLARE
  freed bigint;
  last bigint;
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'topk_middleware: items of {where} are inserted and deleted under '
      'READ COMMITTED only (a snapshot older than the lock would misplace positions); '
      'count updates may use any level';
  END IF;
  PERFORM pg_advisory_xact_lock({lock});
  IF TG_OP = 'TRUNCATE' THEN
    DELETE FROM {pos};
    RETURN NULL;
  END IF;
  IF TG_OP IN ('DELETE', 'UPDATE') THEN
    DELETE FROM {pos} WHERE id = OLD.{id} RETURNING position INTO freed;
    SELECT position INTO last FROM {pos} ORDER BY position DESC LIMIT 1;
    IF freed IS NOT NULL AND last IS NOT NULL AND last > freed THEN
      UPDATE {pos} SET position = freed WHERE position = last;
    END IF;
  END IF;
  IF TG_OP IN ('INSERT', 'UPDATE') THEN
    IF NEW.{id} IS NULL THEN
      RAISE EXCEPTION 'topk_middleware: {where} takes no NULL id (a live table names items by id)';
    END IF;
    INSERT INTO {pos} (position, id)
      VALUES (coalesce((SELECT position + 1 FROM {pos} ORDER BY position DESC LIMIT 1), 0),
              NEW.{id});
  END IF;
  RETURN NULL;
END
"""
        ).format(lock=sql.Literal(self._lock_key), pos=self._pos, id=self._id, where=sql.SQL(where))
        conn.execute(
            sql.SQL(
                "CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS {body}"
            ).format(fn=self._function, body=sql.Literal(body.as_string(conn)))
        )
        triggers = (
            ("_items", "AFTER INSERT OR DELETE", "FOR EACH ROW"),
            (
                "_ids",
                "AFTER UPDATE OF {id}",
                "FOR EACH ROW WHEN (OLD.{id} IS DISTINCT FROM NEW.{id})",
            ),
            ("_truncate", "AFTER TRUNCATE", "FOR EACH STATEMENT"),
        )
        for suffix, event, each in triggers:
            name = sql.Identifier(self.trigger_function + suffix)
            conn.execute(sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(name, self._base))
            conn.execute(
                sql.SQL(
                    "CREATE TRIGGER {name} "
                    + event
                    + " ON {base} "
                    + each
                    + " EXECUTE FUNCTION {fn}()"
                ).format(name=name, base=self._base, id=self._id, fn=self._function)
            )
            # fired under session_replication_role = replica too (logical replication
            # subscribers, pg_restore): positions must follow every write
            conn.execute(
                sql.SQL("ALTER TABLE {} ENABLE ALWAYS TRIGGER {}").format(self._base, name)
            )
        state = conn.execute(sql.SQL("SELECT ") + self._triggers_sql()).fetchone()[0]
        conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(self._pos, sql.Literal(state)))

    def is_stale(self) -> bool:
        """Never: a live run reads the table as it is."""
        return False

    def has_rank_table(self) -> bool:
        return False

    # ----- the Source protocol ------------------------------------------------------------------
    # snapshot() is PostgresTable's: one REPEATABLE READ READ ONLY transaction (reconnecting once
    # if the connection was lost before the run read anything), whose first query is _live_m.
    @contextmanager
    def _run_transaction(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        """The run's transaction. On a connection in autocommit mode (what this object opens)
        its BEGIN rides on the run's first query (`_live_facts`) instead of a round trip of its
        own; COMMIT at the end, ROLLBACK after an error. Oblivious runs keep psycopg's."""
        if not conn.autocommit or self._oblivious:
            with conn.transaction():
                yield
            return
        self._begin_pending = True
        try:
            yield
        except BaseException:
            self._begin_pending = False
            if conn.info.transaction_status in (
                TransactionStatus.INTRANS,
                TransactionStatus.INERROR,
            ):
                try:
                    conn.execute("ROLLBACK")
                except psycopg.Error:
                    pass  # a broken connection: the error that broke it is raised below
            raise
        if self._begin_pending:  # no query ran (the first one begins the transaction)
            self._begin_pending = False
            return
        conn.execute("COMMIT")

    def _open_run(self, conn: psycopg.Connection[Any]) -> _LiveRun:
        now = time.monotonic()
        stale = self.max_score_runs > 0 and (
            self._estimate_read_at is None or now - self._estimate_read_at > STATISTICS_TTL
        )
        # Where the run's first statement begins the transaction and the statistics already say
        # the run takes no runs of tied scores, the same statement declares the sorted cursor
        # and fetches the planner's probe.
        first = 0
        if self._begin_pending and not self._oblivious and not stale:
            estimate = self._estimate
            if self.max_score_runs < 1 or (
                estimate is not None and estimate > DISTINCT_ESTIMATE_SLACK * self.max_score_runs
            ):
                first = FIRST_ROWS
        m, distinct, records = self._live_facts_and_rows(conn, stale, first)
        if not self._positions_unchanged and getattr(self, "_refreshes", 0) < 2:
            raise _Refresh  # snapshot() runs prepare(), which fills the positions again
        if stale:
            self._estimate, self._estimate_read_at = distinct, now
        distinct = self._estimate
        few = distinct is None or distinct <= DISTINCT_ESTIMATE_SLACK * self.max_score_runs
        run = _LiveRun(m, self._score_runs(conn, m) if few else None)
        run.dense = self._oblivious and self._dense_ids
        if records is not None and run.runs is None:
            run.cursor = _DeclaredCursor(conn, self._cursor_name(), records, self._integer_ids)
            run.first_rows = len(records)
        return run

    @property
    def sorted_rows_in_hand(self) -> int:
        """access.CountedAccess: the sorted rows the run's first statement fetched (0 outside
        a run): a sorted read within them makes no round trip."""
        return 0 if self._run is None else self._run.first_rows

    def _score_runs(self, reader: Any, m: int) -> _ScoreRuns | None:
        """The snapshot's runs of tied scores if they are few and cheap to count, else None:
        their head only where a gap in the scores cuts them (module docstring).

        One query: a skip scan down the (score DESC, id) B-tree (a recursive CTE, one index
        probe per distinct score, stopping past `max_score_runs`), then, if the scores were
        few, a count by index scan of each run above the first *gap* (a score below
        RUN_GAP_RATIO times the one above it) but the last run, each count stopped at
        `run_count_rows` / (number of runs) rows. Where the gap leaves two runs or more below
        it, they are not counted: the run serves the head (`_ScoreRuns.complete` False), and
        `_full_runs` counts the rest when a rank there is read. Otherwise (no such gap) every
        run but the last is counted as `_sized_runs` says."""
        limit = self.max_score_runs
        if limit < 1:
            return None
        records = reader.execute(self._runs_query(head=True)).fetchall()
        if not records or len(records) > limit:
            return None
        values = [r[0] for r in records]
        scores = np.asarray([r[1] for r in records], dtype=np.float64)
        if not bool(np.all(np.diff(scores) < 0)):
            return None  # scores equal as float8
        head = sum(1 for r in records if r[3])  # the runs above the first gap
        if head < len(records) - 1:
            sizes = np.asarray([r[2] for r in records[:head]], dtype=np.int64)
            if int(sizes.max()) < max(self.run_count_rows, 1) // len(records):
                first = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
                if int(sizes.sum()) + len(records) - head > m:
                    raise AccessError(
                        f"{self.where} has more rows by its runs of tied scores than its {m} "
                        "positions: the position table is out of step (call prepare())"
                    )
                return _ScoreRuns(first, sizes, scores, values)
            records = reader.execute(self._runs_query(head=False)).fetchall()
        return self._sized_runs(reader, m, records, values, scores)

    def _runs_query(self, head: bool) -> sql.Composable:
        """The skip scan of the distinct scores and the counts of the runs (module docstring):
        rows (score, score as float8, count or NULL, above the first gap); `head`: count the
        runs above the first gap only. The gap is found in numeric (float8 arithmetic raises on
        underflow, e.g. half of 5e-324)."""
        return sql.SQL(
            "WITH RECURSIVE d(s, n) AS ("
            "(SELECT b.{score}, 1 FROM {base} AS b WHERE b.{score} IS NOT NULL "
            "ORDER BY b.{score} DESC LIMIT 1) "
            "UNION ALL SELECT (SELECT b.{score} FROM {base} AS b WHERE b.{score} < d.s "
            "ORDER BY b.{score} DESC LIMIT 1), d.n + 1 FROM d "
            "WHERE d.s IS NOT NULL AND d.n <= {limit}), "
            "g AS (SELECT s, n, lag(s) OVER (ORDER BY n) AS above FROM d WHERE s IS NOT NULL), "
            "r AS (SELECT s, n, count(*) FILTER (WHERE s::numeric < {ratio}::numeric * "
            "above::numeric) OVER (ORDER BY n) = 0 AS head FROM g), "
            "t AS (SELECT count(*) AS runs FROM r) "
            "SELECT r.s, r.s::float8, CASE WHEN t.runs <= {limit} AND r.n < t.runs{only} THEN "
            "(SELECT count(*) FROM (SELECT 1 FROM {base} AS b WHERE b.{score} = r.s "
            "LIMIT {budget} / t.runs) AS c) END, r.head FROM r, t ORDER BY r.n"
        ).format(
            score=self._score,
            base=self._base,
            limit=sql.Literal(self.max_score_runs),
            ratio=sql.Literal(RUN_GAP_RATIO),
            budget=sql.Literal(max(self.run_count_rows, 1)),
            only=sql.SQL(" AND r.head" if head else ""),
        )

    def _sized_runs(
        self, reader: Any, m: int, records: list[Any], values: list[Any], scores: np.ndarray
    ) -> _ScoreRuns | None:
        """Every run sized from counts of all runs but the last: the last (lowest score: on
        count data the one very large run of zeros) is sized as m minus the others. If instead
        another run reached the bound, the last is counted too (a second query) and at most one
        run may be that large (else None): its size is m minus the others'. So a run costs
        O(distinct scores + rows outside the largest run) whatever m is."""
        budget = max(self.run_count_rows, 1)
        sizes = np.asarray([r[2] or 0 for r in records], dtype=np.int64)
        bound = budget // len(records)
        capped = np.flatnonzero(sizes >= bound)
        if len(capped) > 1:
            return None  # two large runs: costly to count
        if len(capped):  # the large run is not the last: count the last too
            count = sql.SQL(
                "SELECT count(*) FROM (SELECT 1 FROM {base} AS b WHERE b.{score} = %s "
                "LIMIT {bound}) AS c"
            ).format(base=self._base, score=self._score, bound=sql.Literal(bound))
            sizes[-1] = reader.execute(count, [values[-1]]).fetchone()[0]
            if sizes[-1] >= bound:
                return None
            large = int(capped[0])
        else:
            large = len(sizes) - 1
        sizes[large] = m - (int(sizes.sum()) - int(sizes[large]))
        if sizes[large] < (bound if len(capped) else 1):
            raise AccessError(
                f"{self.where} has more rows by its runs of tied scores than its {m} "
                "positions: the position table is out of step (call prepare())"
            )
        first = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        return _ScoreRuns(first, sizes, scores, values)

    def _full_runs(self, run: _LiveRun) -> _ScoreRuns:
        """The run's runs of tied scores, every one sized: after a head, the counts of the runs
        below the gap are read now (in the run's snapshot); where two of them are too large to
        count within `run_count_rows`, every run but the last is counted in full (the run
        already serves ranks: slow, never wrong)."""
        runs = run.runs
        if runs is None or runs.complete:
            return runs  # type: ignore[return-value]
        with self._reading() as cur:
            records = cur.execute(self._runs_query(head=False)).fetchall()
            if [r[0] for r in records] != runs.values:
                raise AccessError(f"{self.where}: the runs of tied scores changed in a snapshot")
            full = self._sized_runs(cur, run.m, records, runs.values, runs.scores)
            if full is None:
                count = sql.SQL("SELECT count(*) FROM {base} AS b WHERE b.{score} = %s").format(
                    base=self._base, score=self._score
                )
                sizes = np.asarray(
                    [cur.execute(count, [v]).fetchone()[0] for v in runs.values[:-1]] + [0],
                    dtype=np.int64,
                )
                sizes[-1] = run.m - int(sizes.sum())
                if sizes[-1] < 1:
                    raise AccessError(
                        f"{self.where} has more rows by its runs of tied scores than its "
                        f"{run.m} positions: the position table is out of step (call prepare())"
                    )
                first = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
                full = _ScoreRuns(first, sizes, runs.scores, runs.values)
        if not np.array_equal(full.first[: len(runs.first)], runs.first) or not np.array_equal(
            full.sizes[: len(runs.sizes)], runs.sizes
        ):
            raise AccessError(f"{self.where}: the runs of tied scores changed in a snapshot")
        run.runs = full
        return full

    # A run serving ranks read its runs with m: the core takes them before any row by rank
    # (a row by rank walks its run: far dearer than the runs).
    score_runs_in_hand = True

    def run_traits(self) -> RunTraits:
        """access.RunTraits: ranks where the run serves them from its runs, which it read with
        m, and the first rows its first statement fetched."""
        return RunTraits(
            positions_are_ranks=self.positions_are_ranks,
            score_runs_in_hand=self.score_runs_in_hand,
            sorted_rows_in_hand=self.sorted_rows_in_hand,
            costs=self.store_costs,
            oblivious_costs=self.oblivious_costs,
        )

    @property
    def positions_are_ranks(self) -> bool:  # type: ignore[override]
        """Whether runs serve positions = canonical ranks: inside a run, that run's choice; outside,
        the choice a run would make now (one short snapshot)."""
        if self._run is not None:
            return self._run.runs is not None
        if self.max_score_runs < 1:
            return False
        with self.snapshot():
            return self._run.runs is not None  # type: ignore[union-attr]

    def _end_run(self) -> Any:
        """Leave the run; its server-side cursor (or None), to be closed once the transaction
        has ended: its COMMIT closes it on the server, so psycopg sends no CLOSE (one round trip
        fewer a release)."""
        run, self._run = self._run, None
        return getattr(run, "cursor", None)

    def _live_m(self, reader: Any) -> int:
        return self._live_facts_and_rows(reader)[0]

    def _cursor_name(self) -> str:
        return f"topk_sorted_{id(self):x}"

    def _live_facts_and_rows(
        self, reader: Any, with_estimate: bool = False, first_rows: int = 0
    ) -> tuple[int, float | None, list[Any] | None]:
        """m, after checking that the position table and its triggers are there and the scores'
        extremes, and, if asked, the planner's estimate of the distinct scores (None without
        statistics; pg_stats costs ~0.9 ms, hence STATISTICS_TTL): one query of catalog lookups
        and three index probes. Where the run's transaction is yet to begin, the same statement
        begins it; with `first_rows`, it then declares the sorted cursor over the position table
        and fetches that many rows (returned; None otherwise)."""
        # The run's settings ride on the same query: no JIT (a cursor is planned for the whole
        # table, whose cost would trigger a compilation of ~50-150 ms for a read of 20 rows),
        # a small cursor_tuple_fraction (walk the B-tree rather than sort), and no sequential
        # scan: every read of a live run has an index path, and statistics gone stale after
        # writes (a value ANALYZE saw in 3 million rows, now in 17,000) made the planner count
        # a run of tied scores by scanning the table (5.3 s at m = 10^7 instead of ~50 ms).
        # An oblivious run pins every plan of its transaction
        # (adapters/dialects/postgres/oblivious.py).
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
            if self._oblivious
            else sql.SQL(""),
            # an oblivious run with integer ids: the least and the largest id (dense ids name
            # items by themselves, without the position table: _open_run)
            ids=sql.SQL(
                "(SELECT b.{id}::int8 FROM {base} AS b ORDER BY b.{id} ASC LIMIT 1), "
                "(SELECT b.{id}::int8 FROM {base} AS b ORDER BY b.{id} DESC LIMIT 1), "
            ).format(id=self._id, base=self._base)
            if self._oblivious and self._integer_ids
            else sql.SQL("NULL::int8, NULL::int8, "),
            fraction=sql.Literal(str(CURSOR_TUPLE_FRACTION)),
            base_name=sql.Literal(self._base.as_string(self._conn)),
            triggers=sql.Literal(self.trigger_function + "%"),
            state=self._triggers_sql(),
            pos_name=sql.Literal(self._pos.as_string(self._conn)),
            pos=self._pos,
            score=self._score,
            base=self._base,
            score_name=sql.Literal(self.score_column),
        )
        begin, self._begin_pending = self._begin_pending, False
        records = None
        try:
            if not begin:
                row = reader.execute(query).fetchone()
            else:  # one statement: BEGIN; the facts[; DECLARE the sorted cursor; FETCH]
                parts = [sql.SQL(BEGIN_RUN), query]
                if first_rows:
                    name = sql.Identifier(self._cursor_name())
                    parts += [
                        sql.SQL("DECLARE {} NO SCROLL CURSOR FOR ").format(name)
                        + self._sorted_live_query(),
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
                f"{self.where} has no position table {self.position_table!r} with its triggers: "
                "call prepare() (mode='live')"
            )
        # a trigger disabled (and maybe enabled again) or replaced since the positions were
        # filled: writes meanwhile may be missing from them (_open_run has them filled again)
        self._positions_unchanged = bool(unchanged)
        if m is None:
            raise ValueError(f"{self.where} is empty: there is no item to select")
        column = f"{self.where} column {self.score_column!r}"
        if top is None:  # NULL sorts first in a descending B-tree
            raise ValueError(f"{column} has NULL score(s)")
        if not np.isfinite(top):  # so do NaN and Infinity
            raise ValueError(f"{column} has non-finite score(s) (NaN or infinite)")
        if bottom < 0:
            raise ValueError(f"{column} has negative score(s), e.g. {bottom!r}")
        # m distinct integer ids (a unique B-tree) from 0 to m - 1 are exactly 0..m-1
        self._dense_ids = low == 0 and high == int(m) - 1
        return int(m), None if distinct is None else float(distinct), records

    def _live_state(self) -> _LiveRun:
        if self._run is None:
            raise RuntimeError(f"{self.where}: live reads happen inside snapshot()")
        return self._run

    def domain_size(self) -> int:
        if self._run is not None:
            return self._run.m
        with self._reading() as cur:
            return self._live_m(cur)

    def score_run_count(self) -> int | None:
        """The number of runs of tied scores a run serving ranks learnt, None otherwise (outside a
        run: what a run would learn now)."""
        if self._run is None:
            if self.max_score_runs < 1:
                return None
            with self.snapshot():
                return self.score_run_count()
        runs = self._run.runs
        return None if runs is None else len(runs.scores)

    def _sorted_live_query(self) -> sql.Composable:
        return sql.SQL(
            "SELECT p.position, b.{id}, b.{score}::float8 FROM {base} AS b JOIN {pos} AS p "
            "ON p.id = b.{id} ORDER BY b.{order}"
        ).format(
            id=self._id,
            score=self._score,
            base=self._base,
            pos=self._pos,
            order=sql.SQL(", b.").join(self._order_parts()),
        )

    def _order_parts(self) -> list[sql.Composable]:
        id_key = sql.SQL('{} COLLATE "C"').format(self._id) if self._text_ids else self._id
        return [sql.SQL("{} DESC").format(self._score), sql.SQL("{} ASC").format(id_key)]

    def _sorted_ranked_query(self) -> sql.Composable:
        """Sorted access when positions are ranks: the B-tree alone, no position table."""
        return sql.SQL(
            "SELECT b.{id}, b.{score}::float8 FROM {base} AS b ORDER BY b.{order}"
        ).format(
            id=self._id,
            score=self._score,
            base=self._base,
            order=sql.SQL(", b.").join(self._order_parts()),
        )

    def read_sorted(self, start: int, count: int) -> Rows:
        run = self._live_state()
        start, stop = int(start), min(int(start) + int(count), run.m)
        if stop <= start:
            return rows_from_records([])
        if self._oblivious and run.runs is None:
            return self._oblivious_sorted(start, stop)
        drawn = [mid.first for mid in run.middles.values() if mid is not None and mid.named]
        if drawn and stop > min(drawn):
            raise AccessError(
                "sorted access after a release named items of a run by draws (module docstring)"
            )
        if run.cursor is None or run.depth != start:
            if run.cursor is not None:
                run.cursor.close()
            # integer ids come in binary and go to numpy in one step (_numeric_rows)
            run.cursor = self._conn.cursor(name=self._cursor_name(), binary=self._integer_ids)
            ranked = run.runs is not None
            query = self._sorted_ranked_query() if ranked else self._sorted_live_query()
            if start:
                query = query + sql.SQL(" OFFSET {}").format(sql.Literal(start))
            run.cursor.execute(query)
            run.depth = start
        if isinstance(run.cursor, _DeclaredCursor):  # its first rows came with the run's start
            records, trips = run.cursor.fetch(stop - start)
        else:
            records, trips = run.cursor.fetchmany(stop - start), 1
        depth, run.depth = run.depth, run.depth + len(records)
        if run.runs is None:
            rows = _numeric_rows(records) if self._integer_ids else rows_from_records(records)
            return rows if trips == 1 else replace(rows, round_trips=trips)
        if records:
            run.last_id = records[-1][0]
        if self._integer_ids:
            return _numeric_rows(records, depth)
        ranks = range(depth, depth + len(records))
        return rows_from_records([(r, i, s) for r, (i, s) in zip(ranks, records, strict=True)])

    def _walks(self, runs: _ScoreRuns, ranks: np.ndarray) -> tuple[np.ndarray, ...]:
        """For each rank: its run, and the rows to walk to it from the run's start (or from the
        cursor's last row, where the cursor stopped inside the run before it) and from the run's
        end."""
        run = self._live_state()
        j = np.searchsorted(runs.first, ranks, side="right") - 1
        start = runs.first[j]
        anchored = (ranks >= run.depth) & (run.depth > start) & (run.last_id is not None)
        front = np.where(anchored, ranks - run.depth, ranks - start)
        back = runs.sizes[j] - 1 - (ranks - start)
        return j, anchored, front, back

    def _read_ranks(self, runs: _ScoreRuns, ranks: np.ndarray) -> Rows:
        """Canonical rows at ranks: each is (its run's score, its offset) on the (score DESC, id)
        B-tree, walked from the nearest start (`_walks`); one query for the batch. A rank past
        a head of runs has the rest of them counted first (`_full_runs`)."""
        run = self._live_state()
        if len(ranks) and ranks.max() >= runs.end and not runs.complete:
            runs = self._full_runs(run)
        if len(ranks) and (ranks.min() < 0 or ranks.max() >= runs.end):
            raise AccessError("a rank outside [0, m) was asked for")
        j, anchored, front, back = self._walks(runs, ranks)
        forward = front <= back
        mode = np.where(forward, np.where(anchored, 1, 0), 2)
        id_key = sql.SQL('{} COLLATE "C"').format(self._id) if self._text_ids else self._id
        backward = [
            sql.SQL("{} ASC").format(self._score),
            sql.SQL("{} DESC").format(id_key),
        ]
        branch = (
            "(SELECT b.{id} AS id, b.{score}::float8 AS score FROM {base} AS b "
            "WHERE q.mode = {mode} AND b.{score} = (%(scores)s)[q.run + 1]{after} "
            "ORDER BY b.{order} OFFSET q.o LIMIT 1)"
        )
        forward_order = sql.SQL(", b.").join(self._order_parts())
        branches = [
            sql.SQL(branch).format(
                id=self._id,
                score=self._score,
                base=self._base,
                mode=sql.Literal(number),
                after=after,
                order=order,
            )
            for number, after, order in (
                (0, sql.SQL(""), forward_order),
                (1, sql.SQL(" AND b.{} > %(after)s").format(id_key), forward_order),
                (2, sql.SQL(""), sql.SQL(", b.").join(backward)),
            )
        ]
        query = sql.SQL(
            "SELECT q.r, x.id, x.score FROM unnest(%(ranks)s::bigint[], %(runs)s::bigint[], "
            "%(offsets)s::bigint[], %(modes)s::int[]) AS q(r, run, o, mode) CROSS JOIN LATERAL "
            "({}) AS x"
        ).format(sql.SQL(" UNION ALL ").join(branches))
        params = {
            "ranks": plain_values(ranks),
            "runs": plain_values(j),
            "offsets": plain_values(np.where(forward, front, back)),
            "modes": plain_values(mode),
            "scores": runs.values,
            "after": run.last_id,
        }
        with self._reading() as cur:
            rows = rows_from_records(cur.execute(query, params).fetchall())
        run.served.update(rows.ids.tolist())
        return rows

    def read_ranks_exchangeable(self, ranks: np.ndarray, rng: np.random.Generator) -> Rows:
        """ExchangeableTies: rows for ranks beyond the fetched prefix, a rank deep in a long run
        named by a uniform draw from the run's unread middle (module docstring), the others by
        their canonical rows."""
        run = self._live_state()
        ranks = np.asarray(ranks, dtype=np.int64)
        if run.runs is None or not len(ranks):
            return self.read_positions(ranks)
        runs = run.runs
        if ranks.max() >= runs.end and not runs.complete:
            runs = self._full_runs(run)
        j, _, front, back = self._walks(runs, ranks)
        walk = np.minimum(front, back)
        deep = (ranks >= run.depth) & (walk > RUN_WALK_ROWS)
        for index, middle in run.middles.items():  # ranks of a middle opened before: drawn
            if middle is not None:
                deep |= (j == index) & (ranks >= middle.first) & (ranks < middle.stop)
        named: dict[int, tuple[Any, float]] = {}
        walked = ~deep
        for index in np.unique(j[deep]).tolist():
            wanted = deep & (j == index)
            middle = self._middle(run, runs, index, ranks[wanted], walk[wanted])
            if middle is None:
                walked |= wanted
                continue
            named.update(self._draw(run, runs, index, middle, ranks[wanted], rng))
        if walked.any():
            rows = self._read_ranks(runs, ranks[walked])
            named.update(
                zip(
                    rows.positions.tolist(),
                    zip(rows.ids.tolist(), rows.scores.tolist(), strict=True),
                    strict=True,
                )
            )
        return rows_from_records([(r, *named[r]) for r in ranks.tolist()])

    def _middle(
        self, run: _LiveRun, runs: _ScoreRuns, index: int, ranks: np.ndarray, walks: np.ndarray
    ) -> _Middle | None:
        """The run's unread middle, opened at its first deep rank (its bounds read as canonical
        rows), or None where walking to the ranks costs less than drawing them (decided once
        per run and snapshot, from its size: data, never noise)."""
        if index in run.middles:
            return run.middles[index]
        start = max(int(runs.first[index]), run.depth)
        stop = int(runs.first[index] + runs.sizes[index]) - 1 - RUN_WALK_ROWS
        first = start + RUN_WALK_ROWS + 1
        share = (stop - first) / run.m
        if len(ranks) / share * DRAW_COST_IN_WALKED_ROWS >= float(walks.sum()):
            run.middles[index] = None
            return None
        bounds = self._read_ranks(runs, np.asarray([first - 1, stop], dtype=np.int64))
        low, high = bounds.ids.tolist()
        middle = run.middles[index] = _Middle(first, stop, low, high)
        return middle

    def _draw(
        self,
        run: _LiveRun,
        runs: _ScoreRuns,
        index: int,
        middle: _Middle,
        ranks: np.ndarray,
        rng: np.random.Generator,
    ) -> dict[int, tuple[Any, float]]:
        """Name the ranks of a middle not named yet by uniform items of the middle neither drawn
        nor read by rank yet: uniform positions, kept in draw order when their row lies in the
        middle."""
        pending = sorted(set(ranks.tolist()) - middle.named.keys())
        share = (middle.stop - middle.first) / run.m
        key = sql.SQL('b.{} COLLATE "C"' if self._text_ids else "b.{}").format(self._id)
        query = sql.SQL(
            "SELECT p.position, b.{id}, b.{score}::float8 FROM {pos} AS p JOIN {base} AS b "
            "ON b.{id} = p.id WHERE p.position = ANY(%s::bigint[]) AND b.{score} = %s "
            "AND {key} > %s AND {key} < %s"
        ).format(id=self._id, score=self._score, pos=self._pos, base=self._base, key=key)
        with self._reading() as cur:
            for _ in range(DRAW_ROUNDS_MAX):
                if not pending:
                    break
                size = min(DRAW_BATCH_MAX, math.ceil(1.5 * len(pending) / share) + 8)
                drawn = rng.integers(0, run.m, size=size)
                _, first_seen = np.unique(drawn, return_index=True)
                order = drawn[np.sort(first_seen)]  # distinct positions, in draw order
                params = [order.tolist(), runs.values[index], middle.low, middle.high]
                found = {p: (i, s) for p, i, s in cur.execute(query, params).fetchall()}
                for position in order.tolist():
                    row = found.get(position)
                    if row is None or row[0] in middle.taken or row[0] in run.served:
                        continue
                    middle.taken.add(row[0])
                    middle.named[pending.pop(0)] = row
                    if not pending:
                        break
            if pending:
                raise AccessError(
                    f"{self.where}: {len(pending)} item(s) of a run of tied scores could not be "
                    f"drawn in {DRAW_ROUNDS_MAX} rounds: the position table is out of step"
                )
        return {r: middle.named[r] for r in ranks.tolist()}

    def read_positions(self, positions: np.ndarray) -> Rows:
        run = self._live_state()
        if run.runs is not None:
            return self._read_ranks(run.runs, np.asarray(positions, dtype=np.int64))
        if self._oblivious and len(positions):
            return self._oblivious_positions(np.asarray(positions, dtype=np.int64))
        wanted = plain_values(np.asarray(positions, dtype=np.int64))
        if not wanted:
            return rows_from_records([])
        query = sql.SQL(
            "SELECT p.position, b.{id}, b.{score}::float8 FROM {pos} AS p JOIN {base} AS b "
            "ON b.{id} = p.id WHERE p.position = ANY(%s::bigint[])"
        ).format(id=self._id, score=self._score, base=self._base, pos=self._pos)
        with self._reading() as cur:
            return rows_from_records(cur.execute(query, [wanted]).fetchall())

    # ----- oblivious reads (dialects/postgres/oblivious.py; plans pinned by _live_facts) --------
    def _oblivious_sorted(self, start: int, stop: int) -> Rows:
        """Depths [start, stop) with their positions in one query (no cursor): the (score DESC,
        id) B-tree in a nested loop with the position table's B-tree on id (with dense ids, the
        B-tree alone: an item's position is its id); integer ids packed."""
        dense = self._live_state().dense
        query = sql.SQL(
            "SELECT {columns} FROM (SELECT {position} AS rank, b.{id} AS id, b.{score} AS score "
            "FROM {base} AS b{join} ORDER BY b.{order} LIMIT %s OFFSET %s) AS r"
        ).format(
            position=sql.SQL("b.{}::int8").format(self._id) if dense else sql.SQL("p.position"),
            join=sql.SQL("")
            if dense
            else sql.SQL(" JOIN {} AS p ON p.id = b.{}").format(self._pos, self._id),
            columns=sql.SQL(oblivious_sql.PACKED_COLUMNS)
            if self._integer_ids
            else sql.SQL("r.rank, r.id, r.score::float8"),
            id=self._id,
            score=self._score,
            base=self._base,
            pos=self._pos,
            order=sql.SQL(", b.").join(self._order_parts()),
        )
        with self._reading() as cur:
            result = cur.execute(
                query, [stop - start, start], binary=self._integer_ids, prepare=False
            )
            rows = (
                oblivious_sql.unpack(result.fetchone())
                if self._integer_ids
                else rows_from_records(result.fetchall())
            )
        if len(rows) != stop - start:
            raise AccessError(f"{self.where}: {len(rows)} rows for depths [{start}, {stop})")
        return rows

    def read_sorted_ids(self, count: int) -> Rows:
        """access.SortedIds, in an oblivious run: the top `count` rows' ids and scores from the
        (score DESC, id) B-tree alone, without the position table (positions -1); integer ids
        packed. Outside one: read_sorted's rows (with their positions)."""
        run = self._live_state()
        count = min(int(count), run.m)
        if not (self._oblivious and run.runs is None):
            return self.read_sorted(0, count)
        query = sql.SQL(
            "SELECT {columns} FROM (SELECT -1::int8 AS rank, b.{id} AS id, b.{score} AS score "
            "FROM {base} AS b ORDER BY b.{order} LIMIT %s) AS r"
        ).format(
            columns=sql.SQL(oblivious_sql.PACKED_COLUMNS)
            if self._integer_ids
            else sql.SQL("r.rank, r.id, r.score::float8"),
            id=self._id,
            score=self._score,
            base=self._base,
            order=sql.SQL(", b.").join(self._order_parts()),
        )
        with self._reading() as cur:
            result = cur.execute(query, [count], binary=self._integer_ids, prepare=False)
            rows = (
                oblivious_sql.unpack(result.fetchone())
                if self._integer_ids
                else rows_from_records(result.fetchall())
            )
        if len(rows) != count:
            raise AccessError(f"{self.where}: {len(rows)} rows for the top {count}")
        return rows

    def _oblivious_positions(self, positions: np.ndarray) -> Rows:
        """The rows at `positions`, each read on its own: one lookup of the position table's
        primary key and one of the table's id B-tree per position (with dense ids, the id
        B-tree alone), in a nested loop over the sorted positions; integer ids packed."""
        wanted = np.unique(positions)
        dense = self._live_state().dense
        query = sql.SQL(
            "SELECT {columns} FROM unnest(%b::int8[]) AS q(p) CROSS JOIN LATERAL "
            "(SELECT q.p AS rank, b.{id} AS id, b.{score} AS score FROM {source} "
            "WHERE {match} OFFSET 0) AS r"
        ).format(
            source=sql.SQL("{} AS b").format(self._base)
            if dense
            else sql.SQL("{} AS p JOIN {} AS b ON b.{} = p.id").format(
                self._pos, self._base, self._id
            ),
            match=sql.SQL("b.{} = q.p").format(self._id) if dense else sql.SQL("p.position = q.p"),
            columns=sql.SQL(oblivious_sql.PACKED_COLUMNS)
            if self._integer_ids
            else sql.SQL("r.rank, r.id, r.score::float8"),
            id=self._id,
            score=self._score,
            base=self._base,
            pos=self._pos,
        )
        with self._reading() as cur:
            register_int8_arrays(cur)
            result = cur.execute(
                query,
                [Int8Array.of(wanted)],
                binary=self._integer_ids,
                prepare=False,
            )
            rows = (
                oblivious_sql.unpack(result.fetchone())
                if self._integer_ids
                else rows_from_records(result.fetchall())
            )
        return oblivious_sql.check_positions(rows, wanted, self.where)

    def read_ids(self, ids: Sequence[Any]) -> np.ndarray:
        wanted = plain_values(ids)
        if not wanted:
            return np.empty(0, dtype=np.float64)
        query = sql.SQL("SELECT {id}, {score}::float8 FROM {base} WHERE {id} = ANY(%s)").format(
            id=self._id, score=self._score, base=self._base
        )
        with self._reading() as cur:
            found = dict(cur.execute(query, [wanted]).fetchall())
        return scores_in_order(found, wanted, self.where)

    def read_exact_scores(self, ids: Sequence[Any]) -> list[Any]:
        """ExactScores: the scores in the table's own type, from the table itself."""
        return self._exact_scores(ids)

    def read_score_histogram(self, bins: ScoreBins) -> tuple[np.ndarray, np.ndarray] | None:
        """access.ScoreHistogramRead: the scores of the table at or below `bins.top`, binned,
        by one aggregate in the run's snapshot (each bin's largest score and size; one scan).
        The run turns sequential scans off (its reads all have an index path); this one is a
        scan, which a B-tree walk made slower (4.1-4.5 s against 2.3-3.1 s for a parallel
        sequential scan at m = 10^7, load average 19), so it turns them on for its statement."""
        self._live_state()
        query = sql.SQL(
            "SELECT max(s), count(*) FROM (SELECT {score}::float8 AS s FROM {base}) AS t "
            "WHERE s <= %s GROUP BY {bin}"
        ).format(score=self._score, base=self._base, bin=sql.SQL(bins.sql("s")))
        with self._reading() as cur:
            was = cur.execute(
                "SELECT current_setting('enable_seqscan'), set_config('enable_seqscan', 'on', true)"
            ).fetchone()[0]
            got = cur.execute(query, [float(bins.top)]).fetchall()
            cur.execute("SELECT set_config('enable_seqscan', %s, true)", [was])
        tops = np.array([row[0] for row in got], dtype=np.float64)
        return tops, np.array([row[1] for row in got], dtype=np.int64)

    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        """Every run's first rank and score: those learnt in the run's first queries, the runs
        below a gap counted now if they were not (`_full_runs`)."""
        run = self._live_state()
        if run.runs is None:
            raise AccessError("this run serves positions apart from ranks: it keeps no runs")
        runs = self._full_runs(run)
        return runs.first.copy(), runs.scores.copy()

    def read_score_runs_head(self) -> tuple[np.ndarray, np.ndarray]:
        """ScoreRuns' head (access.py): the runs learnt in the run's first queries, with no
        further round trip; past a gap, the first ranks of the runs above it and the rank where
        the others begin."""
        runs = self._live_state().runs
        if runs is None:
            raise AccessError("this run serves positions apart from ranks: it keeps no runs")
        if runs.complete:
            return runs.first.copy(), runs.scores.copy()
        return np.append(runs.first, runs.end).astype(np.int64), runs.scores.copy()

    def check(self) -> AccessCheck:
        """How each access kind will be served, from EXPLAIN with sequential scans disabled."""
        with self._conn.transaction(), self._conn.cursor() as cur:
            installed = self._positions_installed(cur)
            if not installed:
                warnings.warn(f"{self.where}: call prepare() (mode='live')", stacklevel=2)
                return AccessCheck(
                    self.where,
                    [
                        AccessPath(a, True, "no position table: call prepare() (mode='live')")
                        for a in ("sorted", "random by position", "random by id")
                    ],
                )
            cur.execute("SET LOCAL enable_seqscan = off")
            probes = [
                ("sorted", self._sorted_live_query() + sql.SQL(" LIMIT 100"), []),
                (
                    "random by position",
                    sql.SQL(
                        "SELECT b.{id} FROM {pos} AS p JOIN {base} AS b ON b.{id} = p.id "
                        "WHERE p.position = ANY(%s::bigint[])"
                    ).format(id=self._id, pos=self._pos, base=self._base),
                    [[1, 2, 3]],
                ),
                (
                    "random by id",
                    sql.SQL("SELECT {score} FROM {base} WHERE {id} = ANY(%s)").format(
                        score=self._score, base=self._base, id=self._id
                    ),
                    [self._sample_ids(cur)],
                ),
            ]
            paths = []
            for access, query, params in probes:
                plan = cur.execute(sql.SQL("EXPLAIN (FORMAT JSON) ") + query, params).fetchone()[0]
                scans = sorted(_seq_scans(plan if isinstance(plan, list) else json.loads(plan)))
                how = f"sequential scan of {', '.join(scans)}" if scans else "index scan"
                paths.append(AccessPath(access, bool(scans), how + " (live table)"))
        return AccessCheck(self.where, paths)


PostgresTable.mode_classes["live"] = LivePostgresTable
