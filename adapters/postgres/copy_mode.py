"""PostgresTable: wrap an existing PostgreSQL table of per-item counts (psycopg 3).

Canonical order (topk_middleware/access.py): score descending, ties by id ascending; text ids
compare with COLLATE "C", i.e. in byte order, whatever the column's or database's collation.

Design: a rank table is the run's data of record. `prepare()` writes (rank, id, score) with rank
the 0-based position in the canonical order, with a unique B-tree on rank and one on id. Sorted
access at depth t..t+n is a range on the rank B-tree (keyset pagination, the key is rank);
uniform item sampling is a uniform rank, looked up in the same B-tree (`rank = ANY(...)`); random
access by id uses the id B-tree (`id = ANY(...)`). Each batch is one query.

Why not read the live table for sorted access (keyset on a (score DESC, id) B-tree)? Sampling needs
a positional index, and a position is only meaningful in the order it was computed in. If sorted
access read the live table while sampling read ranks computed at `prepare()` time, any write in
between would make the two disagree (an item seen twice or never, a wrong m). Reading both from
the rank table keeps them consistent by construction. Concurrent writers are never blocked and
never change a run; a run serves the copy only where its first query proves it current
("Freshness" below), so its release reflects the table as of its start. Refreshing builds new
tables beside the old ones and swaps them in at the end of its transaction (see `prepare()`), so
runs in progress keep their snapshot; the swap waits for them a bounded time (`swap_timeout`),
then gives up with a clear error and changes nothing (copying the rows in instead would leave a
table's worth of dead rows).

Every read of a run happens in one `REPEATABLE READ READ ONLY` transaction opened by `snapshot()`.
Without a rank table, or with one not proven current, the adapter reads the table in that
snapshot: the in-store one-shot on its rows by ctid (table_read.py), and for an explicit
threshold run sorted access by ORDER BY .. OFFSET (served by a B-tree on (score DESC, id
COLLATE "C") if the table has one), random access by id by `id = ANY(...)` (a B-tree on id if
any), sampling by a window over the whole table (a full scan per batch, whatever the indexes);
`check()` says which, from EXPLAIN.
`prepare()` creates no index on the live table: runs never read it, and indexes there would only
slow its writers.

Runs of tied scores (`ScoreRuns`). With the rank table, in the same transaction, `prepare()` writes
the runs table `<rank_table>_runs`: one row (run, first_rank, score) per distinct score, run its
0-based position, first_rank its first rank (primary key), score strictly descending along runs.
Count data has few distinct scores, so random access by rank is then answered from these rows
without reading the rank table. The snapshot learns how many runs there are in the query that
counts m (the last run's number, found through the primary key: O(log runs), not a count(*)), and
reads them in one query when the core asks. A rank table built before the runs table existed gets
one from the next `prepare()`, computed from the rank table (not the live table); until then
`score_run_count()` is None and runs read rows, as before. A refresh swaps the runs table with
the rank table.

Freshness (docs/freshness.md). Unless the table is `frozen=True`, a run serves the copy only
where it is proven current: `prepare()` installs statement-level triggers that log each writing
transaction (adapters/_pg_writes.py, freshness.py) and stamps the copy with its snapshot (the
second line of the rank table's comment); the run's first query checks the stamp against the
log and the catalog. Otherwise the run reads the table itself in its snapshot, or, where that is
priced dearer or the run is oblivious, has the copy rebuilt first (`_stale_run`).

Size: one class, PostgresTable, whose methods share one connection, one snapshot and the
rank table's names and fingerprint; live mode is its own module (live_mode.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from adapters._pg_writes import STAMP_TAG, UNPROVABLE
from adapters._sql import (
    FINGERPRINT_TAG,
    HIDE_STATISTICS,
    MAX_IDENTIFIER_BYTES,
    AccessCheck,
    AccessPath,
    RankTableMismatchError,
    TableFacts,
    float_array_literal,
    id_array,
    int_array_literal,
    may_hide_statistics_sql,
    plain_values,
    raise_if_invalid,
    rank_table_name,
    rows_from_records,
    scores_in_order,
    sql_name_spellings,
)
from topk_middleware.access import AccessError, Rows, RunTraits, StoreCosts, StoreTraits
from topk_middleware.keyed_noise import KeyedNoise, oneshot_query, uniform_from_hex_sql
from topk_middleware.mechanisms.oblivious import ObliviousCosts
from topk_middleware.privacy import resolve_declared
from topk_middleware.validation import first_line

from ..contributions import parse_record
from ..dialects.votes import PostgresVotes
from ..sql.driver import PsycopgDriver
from ..sql.votes import count_votes, write_counts
from . import oblivious as oblivious_sql
from .around import AroundState, ReadAround, around_seconds
from .freshness import WriteLog
from .table_read import TableRead, TableState, refresh_seconds, table_costs, table_seconds

# Sorted reads of at least this many rows with integer ids come packed in one bytea per column.
PACKED_MIN_ROWS = 50_000
# Score column types: numbers that convert to float8 (money and oid are 'N' types, not counts).
SCORE_TYPES = ("smallint", "integer", "bigint", "real", "double precision", "numeric")
# Id column types without a B-tree order (no count(DISTINCT), no index): refused.
UNORDERED_ID_TYPES = ("json", "xml", "point", "line", "lseg", "box", "path", "polygon", "circle")
# Longest text id (bytes) the unique B-tree on id takes with room to spare (its limit is
# about 2,700 bytes per entry after compression).
MAX_ID_BYTES = 2000
# statement_timeout of prepare()'s statements (seconds), and how often the server checks that
# the client is still there during one (PostgreSQL >= 14): a dead client's work stops.
PREPARE_STATEMENT_TIMEOUT = 3600.0
CLIENT_CHECK_INTERVAL_MS = 1000
# How long (seconds) a refresh waits for runs still reading the old rank table before it gives up
# (nothing changed). New runs queue behind the waiting swap, so the wait is kept short.
SWAP_TIMEOUT = 2.0


def _close_quietly(cursor: Any) -> None:
    """Close a run's server-side cursor after its transaction ended (psycopg then sends no
    CLOSE: the transaction's end closed it)."""
    if cursor is not None and not cursor.closed:
        try:
            cursor.close()
        except psycopg.Error:
            pass  # the connection is broken: nothing is left to close


@dataclass
class _Run:
    ranked: bool
    m: int
    runs: int | None = None  # runs of tied scores in the runs table, if there is one
    stale: bool = False  # the copy is not proven current: the run reads the table itself
    table: TableState | None = None  # the table read by the in-store one-shot (table_read.py)
    around: AroundState | None = None  # the copy read around the changes (around.py)
    freshness: dict[str, Any] = field(default_factory=dict)  # how the run knew (diagnostics)


class _Refresh(Exception):
    """Raised while a run opens: rebuild the copy (outside the run's transaction) and open
    the run again."""


def runs_table_name(rank_table: str) -> str:
    """The runs table of `rank_table`: `<rank_table>_runs`, or, when that passes PostgreSQL's
    63-byte limit (which would truncate it, possibly to the rank table's own name), the rank
    table's name cut short, a hash of the whole of it and `_runs`."""
    name = rank_table + "_runs"
    if len(name.encode("utf-8")) <= MAX_IDENTIFIER_BYTES:
        return name
    suffix = "_" + hashlib.sha1(rank_table.encode("utf-8")).hexdigest()[:8] + "_runs"
    head = rank_table.encode("utf-8")[: MAX_IDENTIFIER_BYTES - len(suffix)]
    return head.decode("utf-8", "ignore") + suffix


MODES = ("copy", "live")
REFRESH_TRIES = 3  # a run that refreshes its copy (oblivious, or priced cheaper) tries this often
# Measured at m = 10^7 on a 2-core machine (DESIGN; benchmarks/wallclock.py): 20,000 rows by
# rank range in about 20 ms, 10^4 random ranks in about 80 ms, a packed full read 3.5 s, the
# in-store one-shot's keyed hash (SHA-256) about 0.6 us a hashed row.
STORE_COSTS = StoreCosts(
    round_trip=2e-4,
    sorted_row=1e-6,
    random_batch=2e-3,
    random_row=8e-6,
    oneshot_row=6e-7,
    full_read_row=4e-7,
)


# Oblivious releases (mechanisms/oblivious.py: the deadline's model), measured at m = 10^5 to
# 10^6 on the test server (2 cores shared by several loads: the 90th percentile of the work at a
# load average of 8 is 49 ms at 10^6): reads from the rank table (one heap page per drawn rank,
# a read from the operating system once the copy outgrows the buffer cache), and, for a copy
# not proven current, from the table itself (both batches scan it: `scan_row` per item).
OBLIVIOUS_COSTS = ObliviousCosts(
    fixed=3e-3,
    sorted_row=5e-7,
    random_row=4e-6,
    random_miss=1e-5,
    cached_rows=1.5e6,
    full_row=2e-6,
)
STALE_OBLIVIOUS_COSTS = dataclasses.replace(OBLIVIOUS_COSTS, scan_row=8e-7)


class PostgresTable(WriteLog, TableRead, ReadAround):
    """A histogram held in a PostgreSQL table: one row per item of the public domain.

    `conninfo_or_connection` is a libpq connection string (the adapter opens and owns an
    autocommit connection) or a psycopg Connection that is not inside a transaction.
    Identifiers are composed with psycopg.sql, never pasted. `mode="copy"` (the default) serves
    runs from the rank table `prepare()` writes (module docstring); `mode="live"` reads the table
    itself, through its B-trees and a position table kept current by triggers, with no rebuild
    after writes (adapters/postgres/live_mode.py).
    """

    # What an oblivious release costs: the rank table's model, or the table's own while a run
    # reads it (a copy not proven current).
    oblivious_costs_copy = OBLIVIOUS_COSTS
    oblivious_costs_table = STALE_OBLIVIOUS_COSTS
    # The class serving each mode other than "copy" (live_mode.py registers itself).
    mode_classes: dict[str, type[PostgresTable]] = {}  # noqa: RUF012

    def __new__(cls, *args: Any, mode: str = "copy", **kwargs: Any) -> PostgresTable:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if cls is PostgresTable and mode in cls.mode_classes:
            return super().__new__(cls.mode_classes[mode])
        return super().__new__(cls)

    def __init__(
        self,
        conninfo_or_connection: str | psycopg.Connection[Any],
        table: str,
        id: str = "id",
        score: str = "score",
        *,
        schema: str | None = None,
        rank_table: str | None = None,
        mode: str = "copy",
        sensitivity: float | None = None,
        max_items_per_client: int | None = None,
        frozen: bool = False,
    ) -> None:
        if not isinstance(frozen, bool):
            raise TypeError(f"frozen must be True or False, got {frozen!r}")
        self.mode = mode
        self.frozen = frozen  # the caller's promise: the table does not change after prepare()
        resolve_declared(
            sensitivity, max_items_per_client, None, "PostgreSQL table"
        )  # bad: refused
        self._oblivious = False  # inside oblivious_reads(): no probe of the runs of ties
        self._pinned_run: Any = None  # the run whose plans are pinned (_oblivious_layout)
        self._per_page: int | None = None  # its rank table's rows per heap page, if fixed
        # (connection, whether its role may set track_counts): hides_statistics()
        self._hides_statistics: tuple[Any, bool] | None = None
        self._warned_statistics = False  # _hide_statistics() said so once
        if isinstance(conninfo_or_connection, psycopg.Connection):
            self._conn = conninfo_or_connection
            self._owns_connection = False
        else:
            self._conn = psycopg.connect(conninfo_or_connection, autocommit=True)
            self._owns_connection = True
        self._conninfo = (
            None
            if isinstance(conninfo_or_connection, psycopg.Connection)
            else str(conninfo_or_connection)
        )
        self.where = "PostgreSQL table " + (
            repr(table) if schema is None else f"{schema!r}.{table!r}"
        )
        self._run: _Run | None = None
        try:  # every name below comes from the catalog's spelling of the table
            table, schema = self._catalog_name(table, schema)
        except BaseException:
            if self._owns_connection:
                self._conn.close()
            raise
        self.table, self.id_column, self.score_column, self.schema = table, id, score, schema
        self.rank_table = rank_table or rank_table_name(table, id, score)
        qualify = (
            (lambda n: sql.Identifier(n))
            if schema is None
            else (lambda n: sql.Identifier(schema, n))
        )
        self._base = qualify(table)
        self._ranks = qualify(self.rank_table)
        self.runs_table = runs_table_name(self.rank_table)  # (run, first_rank, score) per tie
        self._runs = qualify(self.runs_table)
        digest = hashlib.sha1(self.rank_table.encode("utf-8")).hexdigest()[:12]
        self.rank_index, self.id_index = f"topk_{digest}_rank", f"topk_{digest}_id"
        self._rank_index = sql.Identifier(self.rank_index)  # unique B-tree on rank
        self._id_index = sql.Identifier(self.id_index)  # unique B-tree on id
        self._id = sql.Identifier(id)
        self._score = sql.Identifier(score)
        self._log_names()  # the write log that proves the copy current (freshness.py)
        self._change_names()  # the change log a stale copy is read around (around.py)
        self._comment: str | None = None  # the rank table's comment, read by the run's first query
        self.last_freshness: dict[str, Any] | None = None  # how the last run knew its data
        try:
            text_ids = self._text_ids = self._check_columns()
            # The most one client moves a count, and how many it moves: declared, else what
            # from_votes recorded in the table's comment (contributions.py), else (1, None).
            self.sensitivity, self.max_items_per_client = resolve_declared(
                sensitivity, max_items_per_client, self._record, self.where
            )
        except BaseException:  # refused: a connection opened here is closed, not left open
            if self._owns_connection:
                self._conn.close()
            raise
        id_key = sql.SQL('{} COLLATE "C"').format(self._id) if text_ids else self._id
        self._order = sql.SQL("{} DESC, {} ASC").format(self._score, id_key)

    # ----- construction from raw votes ----------------------------------------------------------
    @classmethod
    def from_votes(
        cls,
        conninfo_or_connection: str | psycopg.Connection[Any],
        votes: str,
        items: str,
        *,
        client: str = "client",
        item: str = "item",
        item_id: str = "id",
        into: str | None = None,
        schema: str | None = None,
        replace: bool = False,
        mode: str = "copy",
        weight: str | None = None,
        max_per_item: float = 1,
        max_items_per_client: int | None = None,
    ) -> PostgresTable:
        """Count votes per item over the public table of all items, each client's contribution
        bounded (adapters/sql/votes.py: the checks, the count and its record, in one
        transaction; the law: adapters/contributions.py).

        `votes` holds (client, item[, weight]) rows; `items` is the public domain (column
        `item_id`). A client adds to an item min(its rows for the item, or the sum of their
        `weight`, `max_per_item`) (COUNT(DISTINCT client) when that is 1 without weight), to at
        most `max_items_per_client` items chosen by a keyed hash; the source's sensitivity is
        `max_per_item`. The counts go into the table `into` (default `<votes>_counts`) with
        columns (id, score); a LEFT JOIN keeps items without votes (score 0), so m is the size of
        `items`. A vote for an item missing from `items` is an error: the domain must be public
        and complete; so is a negative, NaN or infinite weight.
        """
        dialect, driver = PostgresVotes(), PsycopgDriver(conninfo_or_connection)
        conn, owned = driver.conn, driver.owns
        into = into or f"{votes}_counts"
        try:
            counts = count_votes(
                dialect,
                driver,
                votes=votes,
                items=items,
                schema=schema,
                client=client,
                item=item,
                item_id=item_id,
                weight=weight,
                max_per_item=max_per_item,
                max_items_per_client=max_items_per_client,
            )
            write_counts(dialect, driver, counts, into=into, schema=schema, replace=replace)
            source = cls(
                conn,
                into,
                id="id",
                score="score",
                schema=schema,
                mode=mode,
                sensitivity=counts.sensitivity,
                max_items_per_client=counts.max_items,
            )
        except BaseException:  # refused: a connection opened here is closed, not left open
            if owned:
                conn.close()
            raise
        source._owns_connection = owned
        return source

    # ----- checks -------------------------------------------------------------------------------
    def _catalog_name(self, table: str, schema: str | None) -> tuple[str, str | None]:
        """(table, schema) as the catalog spells the relation the name finds: the name as given,
        else read as SQL reads it (`T`, `public."t"`: _sql.sql_name_spellings), each through
        to_regclass and the search path. So every spelling of one table derives the same rank
        table, position table, triggers and log. A name that finds nothing is kept as given
        (validation says it does not exist). Cost: one catalog lookup a spelling."""
        with self._reading() as cur:
            for spelled_schema, spelled in sql_name_spellings(table, schema):
                name = (
                    sql.Identifier(spelled)
                    if spelled_schema is None
                    else sql.Identifier(spelled_schema, spelled)
                )
                found = cur.execute(
                    "SELECT n.nspname, c.relname FROM pg_catalog.pg_class c "
                    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE c.oid = pg_catalog.to_regclass(%s)",
                    [name.as_string(self._conn)],
                ).fetchone()
                if found is not None:
                    return found[1], found[0]
        return table, schema

    def _check_columns(self) -> bool:
        """Table and columns exist, the score is numeric; returns whether ids are collatable."""
        with self._reading() as cur:
            cur.execute("SELECT to_regclass(%s)::oid", [self._base.as_string(self._conn)])
            oid = cur.fetchone()[0]
            if oid is None:
                raise ValueError(f"{self.where} does not exist (or is not visible)")
            cur.execute(
                "SELECT a.attname, t.typcategory, a.attcollation <> 0, "
                "format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                "JOIN pg_type t ON t.oid = a.atttypid "
                "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped",
                [oid],
            )
            columns = {name: (cat, coll, kind) for name, cat, coll, kind in cur.fetchall()}
            comment = cur.execute("SELECT obj_description(%s, 'pg_class')", [oid]).fetchone()[0]
        self._record = parse_record(comment)  # what from_votes recorded (contributions.py)
        for column in (self.id_column, self.score_column):
            if column not in columns:
                raise ValueError(
                    f"{self.where} has no column {column!r} (columns: {sorted(columns)})"
                )
        category, _, kind = columns[self.score_column]
        if category != "N" or not kind.startswith(SCORE_TYPES):
            raise TypeError(
                f"{self.where} column {self.score_column!r} must be numeric, it is {kind} "
                f"(scores are one of {', '.join(SCORE_TYPES)})"
            )
        self._numeric_scores = kind.startswith("numeric")
        # the noisy counts' interval (noisy_counts.py): counts of an integer type
        self.integer_scores = kind in ("smallint", "integer", "bigint")
        id_kind = columns[self.id_column][2]
        if id_kind.split("(")[0] in UNORDERED_ID_TYPES:
            raise TypeError(
                f"{self.where} column {self.id_column!r} is {id_kind}: ids must have an "
                "equality and an order (text, integers, uuid, ...)"
            )
        self._integer_ids = columns[self.id_column][2] in ("smallint", "integer", "bigint")
        return bool(columns[self.id_column][1])

    def validate(self) -> int:
        """Check every row (one pass): no NULL/NaN/infinite/negative score, no NULL or duplicate
        id, not empty. Returns m. Raises ValueError naming the table and column at fault."""
        s = sql.SQL("{}::float8").format(self._score)
        query = sql.SQL(
            "SELECT count(*), count(*) - count({id}), count(DISTINCT {id}), "
            "count(*) - count({score}), "
            "count(*) FILTER (WHERE {s} IN ('NaN', 'Infinity', '-Infinity')), "
            "count(*) FILTER (WHERE {score} < 0) FROM {base}"
        ).format(id=self._id, score=self._score, s=s, base=self._base)
        with self._reading() as cur:
            self._refuse_unconvertible(cur)
            facts = TableFacts(*(int(x or 0) for x in cur.execute(query).fetchone()))
            duplicate = None
            if facts.null_ids == 0 and facts.distinct_ids != facts.rows:
                duplicate = cur.execute(
                    sql.SQL(
                        "SELECT {id} FROM {base} GROUP BY {id} HAVING count(*) > 1 LIMIT 1"
                    ).format(id=self._id, base=self._base)
                ).fetchone()[0]
        raise_if_invalid(facts, self.where, self.id_column, self.score_column, duplicate)
        return facts.rows

    def _refuse_unconvertible(self, cur: psycopg.Cursor[Any]) -> None:
        """Scores that float8 cannot hold (numeric beyond 1.8e308) and text ids too long for the
        id B-tree: a clear error instead of a cast or index failure."""
        if self._numeric_scores:
            big = cur.execute(
                sql.SQL(
                    "SELECT count(*) FROM {} WHERE {s} <> 'NaN'::numeric "
                    "AND abs({s}) > 1.7976931348623157e308::numeric"
                ).format(self._base, s=self._score)
            ).fetchone()[0]
            if big:
                raise ValueError(
                    f"{self.where} column {self.score_column!r} has {big} score(s) beyond the "
                    "float8 range (about 1.8e308): scores are compared as float8"
                )
        if self._text_ids:
            longest = cur.execute(
                sql.SQL("SELECT max(octet_length({id}::text)) FROM {}").format(
                    self._base, id=self._id
                )
            ).fetchone()[0]
            if longest and longest > MAX_ID_BYTES:
                raise ValueError(
                    f"{self.where} column {self.id_column!r} has an id of {longest} bytes: ids of "
                    f"at most {MAX_ID_BYTES} bytes can be indexed"
                )

    def _catalog(self) -> tuple[bool, bool]:
        """Whether the rank table and the runs table exist: one catalog lookup (a query on a
        missing table would abort the transaction)."""
        names = [
            self._ranks.as_string(self._conn),
            self._runs.as_string(self._conn),
            self._log.as_string(self._conn),
        ]
        with self._reading() as cur:
            cur.execute(
                "SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL, "
                "to_regclass(%s) IS NOT NULL",
                names,
            )
            ranks, runs, log = cur.fetchone()
        self._has_log = bool(log)  # the write log's table (freshness.py)
        return bool(ranks), bool(runs)

    reads_copy = True  # runs read the rank-ordered copy where it is current (freshness)

    def has_rank_table(self) -> bool:
        return self._catalog()[0]

    def is_stale(self) -> bool:
        """Whether the table's counts differ from the rank table of the last `prepare()` (True
        when there is none). One full scan of the table, joined on (id, score)."""
        if not self.has_rank_table():
            return True
        query = sql.SQL(
            "SELECT count(*) FILTER (WHERE r.id IS NULL), (SELECT count(*) FROM {base}), "
            "(SELECT count(*) FROM {ranks}) FROM {base} AS b LEFT JOIN {ranks} AS r "
            "ON r.id = b.{id} AND r.score = b.{score}::float8"
        ).format(base=self._base, ranks=self._ranks, id=self._id, score=self._score)
        with self._reading() as cur:
            unmatched, live, ranked = cur.execute(query).fetchone()
        return bool(unmatched or live != ranked)

    def check(self) -> AccessCheck:
        """How each access kind will be served, from EXPLAIN with sequential scans disabled.

        With `enable_seqscan = off` the planner still picks a sequential scan only when no index
        can serve the query: that is the fallback this check reports. (On small tables PostgreSQL
        may prefer a sequential scan anyway; that is cheap there and not reported.)
        """
        ranked, runs = self._catalog()
        probes = [
            ("sorted", self._sorted_query(ranked), [0, 100] if ranked else [100, 0]),
            ("random by rank", self._ranks_query(ranked), [[1, 2, 3]]),
            ("random by id", self._ids_query(ranked), [[]]),
        ]
        paths = []
        with self._conn.transaction(), self._conn.cursor() as cur:
            cur.execute("SET LOCAL enable_seqscan = off")
            for access, query, params in probes:
                if access == "random by id":
                    params = [self._sample_ids(cur)]
                plan = cur.execute(sql.SQL("EXPLAIN (FORMAT JSON) ") + query, params).fetchone()[0]
                scans = sorted(_seq_scans(plan if isinstance(plan, list) else json.loads(plan)))
                how = (f"sequential scan of {', '.join(scans)}" if scans else "index scan") + (
                    "" if ranked else f" (no rank table {self.rank_table!r}: call prepare())"
                )
                if ranked and access == "random by rank":
                    how += (
                        f"; scores of tied runs from {self.runs_table!r}"
                        if runs
                        else f" (no runs table {self.runs_table!r}: call prepare())"
                    )
                paths.append(AccessPath(access, bool(scans), how))
        return AccessCheck(self.where, paths)

    def _sample_ids(self, cur: psycopg.Cursor[Any]) -> list[Any]:
        return [
            row[0]
            for row in cur.execute(
                sql.SQL("SELECT {} FROM {} LIMIT 3").format(self._id, self._base)
            ).fetchall()
        ]

    # ----- preparation --------------------------------------------------------------------------
    def prepare(
        self,
        refresh: bool = False,
        *,
        statement_timeout: float | None = PREPARE_STATEMENT_TIMEOUT,
        swap_timeout: float = SWAP_TIMEOUT,
    ) -> None:
        """Create the rank table (rank, id, score) if it is missing, or with `refresh=True`
        rebuild it from the table's current state; its unique B-trees on rank and on id if
        they are missing; and the runs table of its tied scores with it (or alone, from the rank
        table, if only the runs table is missing).

        Idempotent: without `refresh`, an existing rank table that belongs to this table (its
        fingerprint, see `verify_rank_table()`) is kept; one built from a table of the same name
        since dropped and re-created is rebuilt; a table of that name that prepare() did not
        build is refused. Validation and copy read one REPEATABLE READ snapshot, so what is
        released is what was validated. A rebuild writes new tables beside the old ones and
        swaps them in at the end of the same transaction (drop, rename): no dead rows, and runs
        in progress keep reading the old ones. The swap waits up to `swap_timeout` seconds for
        runs still reading the old tables, then raises TimeoutError and changes nothing (try
        again when they have ended). Concurrent prepare()
        calls on one rank table wait for each other (a session advisory lock). Each statement
        has `statement_timeout` seconds (None: the server's setting), and the server stops the
        work of a client that went away (client_connection_check_interval, PostgreSQL >= 14).
        """
        if self._run is not None:
            raise RuntimeError("prepare() cannot run inside snapshot()")
        if not swap_timeout > 0:
            raise ValueError(f"swap_timeout must be > 0 seconds, got {swap_timeout}")
        conn = self._usable_connection()
        lock = int.from_bytes(
            hashlib.sha1(self._ranks.as_string(conn).encode("utf-8")).digest()[:8],
            "big",
            signed=True,
        )
        with conn.transaction():
            conn.execute("SELECT pg_advisory_lock(%s)", [lock])  # released below, or at exit
        built = False
        saved = conn.isolation_level
        try:
            with conn.transaction():  # committed before the copy's snapshot (freshness.py)
                self._limit_statements(conn, statement_timeout)
                self._install_log(conn)
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            with conn.transaction():
                self._limit_statements(conn, statement_timeout)
                built = self._prepare_locked(conn, refresh, float(swap_timeout))
        except BaseException as error:
            conn.isolation_level = saved
            self._forget_log(conn)  # refused or stopped: nothing left behind
            if isinstance(error, psycopg.errors.QueryCanceled):
                raise TimeoutError(
                    f"{self.where}: prepare() was stopped by its statement_timeout of "
                    f"{statement_timeout} s ({first_line(error)}); nothing was changed"
                ) from None
            raise
        finally:
            conn.isolation_level = saved
            if not conn.closed:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_unlock(%s)", [lock])
        if built:
            with conn.transaction():
                for table in (self._ranks, self._runs):
                    conn.execute(sql.SQL("ANALYZE {}").format(table))

    def _forget_log(self, conn: psycopg.Connection[Any]) -> None:
        """After a prepare() that failed: the write log it installed is dropped again when no
        copy of this table exists (a copy that exists keeps the log that proves it current)."""
        if conn.closed or conn.broken:
            return
        with conn.transaction():
            ranks = self._ranks.as_string(conn)
            if not conn.execute("SELECT to_regclass(%s) IS NOT NULL", [ranks]).fetchone()[0]:
                self._uninstall_log(conn)

    def _limit_statements(self, conn: psycopg.Connection[Any], timeout: float | None) -> None:
        if timeout is not None:
            if not timeout > 0:
                raise ValueError(f"statement_timeout must be > 0 seconds, got {timeout}")
            ms = str(max(1, round(timeout * 1000)))
            conn.execute("SELECT set_config('statement_timeout', %s, true)", [ms])
        if conn.info.server_version >= 140000:
            conn.execute(
                "SELECT set_config('client_connection_check_interval', %s, true)",
                [str(CLIENT_CHECK_INTERVAL_MS)],
            )

    def _prepare_locked(
        self, conn: psycopg.Connection[Any], refresh: bool, swap_timeout: float = SWAP_TIMEOUT
    ) -> bool:
        """prepare() inside its transaction and lock; returns whether the tables were built."""
        ranked, with_runs = self._catalog()
        if ranked and not refresh:
            stored, current = self._fingerprints(conn)
            if stored is None or not stored.startswith(FINGERPRINT_TAG):
                raise RankTableMismatchError(
                    f"{self.where}: a table named {self.rank_table!r} exists but prepare() did "
                    "not build it (no fingerprint): drop it, pass another rank_table name, or "
                    "call prepare(refresh=True) to replace it"
                )
            refresh = (
                stored.split("\n")[0] != current
            )  # built from an earlier table of this name: rebuild
        if not ranked or refresh:
            self.validate()
            names = self._build_names() if ranked else None
            target = (self._ranks, self._runs) if names is None else names[:2]
            indexes = (self._rank_index, self._id_index) if names is None else names[2:]
            self._build(conn, *target, *indexes)
            if names is not None:
                self._swap(conn, names, swap_timeout)
            self._stamp_writes(conn, self._fingerprints(conn)[1])
            return True
        for index, column in ((self._rank_index, "rank"), (self._id_index, "id")):
            conn.execute(
                sql.SQL("CREATE UNIQUE INDEX IF NOT EXISTS {} ON {} ({})").format(
                    index, self._ranks, sql.Identifier(column)
                )
            )
        if not with_runs:
            self._create_runs(conn, self._runs, self._ranks)
            return True
        return False

    def _build_names(self) -> tuple[sql.Composable, ...]:
        """Names of the tables and indexes a refresh builds beside the old ones."""
        digest = hashlib.sha1(self.rank_table.encode("utf-8")).hexdigest()[:12]
        qualify = (
            sql.Identifier if self.schema is None else (lambda n: sql.Identifier(self.schema, n))
        )
        return (
            qualify(f"topk_{digest}_new"),
            qualify(f"topk_{digest}_new_runs"),
            sql.Identifier(f"topk_{digest}_new_rank"),
            sql.Identifier(f"topk_{digest}_new_id"),
        )

    def _build(
        self,
        conn: psycopg.Connection[Any],
        ranks: sql.Composable,
        runs: sql.Composable,
        rank_index: sql.Composable,
        id_index: sql.Composable,
    ) -> None:
        """Write the rank table, its B-trees and its runs table under the given names."""
        rows = sql.SQL(
            "SELECT row_number() OVER (ORDER BY {order}) - 1, {id}, {score}::float8 FROM {base}"
        ).format(order=self._order, id=self._id, score=self._score, base=self._base)
        for table in (ranks, runs):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))  # only build names
        conn.execute(
            sql.SQL(
                "CREATE TABLE {ranks} AS SELECT rank, id, score FROM ({rows}) AS r(rank, id, score)"
            ).format(ranks=ranks, rows=rows)
        )
        conn.execute(
            sql.SQL(
                "ALTER TABLE {ranks} ALTER COLUMN rank SET NOT NULL, "
                "ALTER COLUMN id SET NOT NULL, ALTER COLUMN score SET NOT NULL, "
                "ADD CHECK (score >= 0 AND score < 'Infinity'::float8)"
            ).format(ranks=ranks)
        )
        for index, column in ((rank_index, "rank"), (id_index, "id")):
            conn.execute(
                sql.SQL("CREATE UNIQUE INDEX {} ON {} ({})").format(
                    index, ranks, sql.Identifier(column)
                )
            )
        self._create_runs(conn, runs, ranks)

    def _swap(
        self, conn: psycopg.Connection[Any], names: tuple[sql.Composable, ...], timeout: float
    ) -> None:
        """Put the new rank and runs tables in place of the old ones: drop the old ones and
        rename the new ones (the short, exclusive end of a refresh). Dropping waits for the runs
        reading the old tables, at most `swap_timeout` seconds (lock_timeout); a run still open
        then (one held open across the refresh) makes the refresh give up: TimeoutError, and
        the whole transaction, new tables included, is rolled back. Copying the rows into the
        old tables instead would leave a table's worth of dead rows."""
        ranks, runs = names[:2]
        try:
            with conn.transaction():  # a savepoint
                conn.execute(
                    "SELECT set_config('lock_timeout', %s, true)",
                    [str(max(1, round(timeout * 1000)))],
                )
                conn.execute(
                    sql.SQL("DROP TABLE {}, {}").format(self._ranks, self._runs)
                    if self._catalog()[1]
                    else sql.SQL("DROP TABLE {}").format(self._ranks)
                )
        except psycopg.errors.LockNotAvailable:
            raise TimeoutError(
                f"{self.where}: prepare(refresh=True) waited {timeout} s (swap_timeout) for runs "
                f"still reading the rank table {self.rank_table!r}; nothing was changed: try "
                "again when they have ended, or pass a longer swap_timeout"
            ) from None
        conn.execute("SELECT set_config('lock_timeout', '0', true)")
        conn.execute(
            sql.SQL("ALTER TABLE {} RENAME TO {}").format(ranks, sql.Identifier(self.rank_table))
        )
        conn.execute(
            sql.SQL("ALTER TABLE {} RENAME TO {}").format(runs, sql.Identifier(self.runs_table))
        )
        digest = hashlib.sha1(self.rank_table.encode("utf-8")).hexdigest()[:12]
        for old, new in (
            (f"topk_{digest}_new_rank", self._rank_index),
            (f"topk_{digest}_new_id", self._id_index),
        ):
            qualified = (
                sql.Identifier(old) if self.schema is None else sql.Identifier(self.schema, old)
            )
            conn.execute(sql.SQL("ALTER INDEX {} RENAME TO {}").format(qualified, new))

    def _create_runs(
        self, conn: psycopg.Connection[Any], runs: sql.Composable, ranks: sql.Composable
    ) -> None:
        """The runs table `runs` of the rank table `ranks`: one row (run, first_rank, score) per
        distinct score."""
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (run bigint NOT NULL, first_rank bigint PRIMARY KEY, "
                "score float8 NOT NULL)"
            ).format(runs)
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {runs} (run, first_rank, score) "
                "SELECT row_number() OVER (ORDER BY min(rank)) - 1, min(rank), score "
                "FROM {ranks} GROUP BY score ORDER BY 2"
            ).format(runs=runs, ranks=ranks)
        )

    # ----- the fingerprint: does the rank table belong to this table? ---------------------------
    def _fingerprint_sql(self, conn: psycopg.Connection[Any]) -> tuple[sql.Composable, ...]:
        """SQL for (the fingerprint stored on the rank table, the current one): the identity
        (oid) of the table and of the rank table, and the number and type of the id and score
        columns. A table dropped and re-created, or a rank table not built by prepare(), gives
        another fingerprint. Two catalog lookups by key: microseconds per run."""
        base, ranks = self._base.as_string(conn), self._ranks.as_string(conn)
        current = sql.SQL(
            "concat_ws(' ', {tag}::text, to_regclass({base})::oid, to_regclass({ranks})::oid, "
            "(SELECT string_agg(a.attnum || ':' || a.atttypid || ':' || a.atttypmod, ',' "
            "ORDER BY a.attname <> {id}) "
            "FROM pg_attribute a WHERE a.attrelid = to_regclass({base}) AND NOT a.attisdropped "
            "AND a.attname IN ({id}, {score})))"
        ).format(
            tag=sql.Literal(FINGERPRINT_TAG),
            base=sql.Literal(base),
            ranks=sql.Literal(ranks),
            id=sql.Literal(self.id_column),
            score=sql.Literal(self.score_column),
        )
        stored = sql.SQL("obj_description(to_regclass({}), 'pg_class')").format(sql.Literal(ranks))
        return stored, current

    def _fingerprints(self, reader: Any) -> tuple[str | None, str]:
        stored, current = self._fingerprint_sql(self._conn)
        return reader.execute(sql.SQL("SELECT {}, {}").format(stored, current)).fetchone()

    def _check_fingerprint(self, stored: str | None, current: str, strict: bool = True) -> bool:
        """Whether the rank table was built from this table (the first line of its comment; the
        second is the write log's stamp, freshness.py). A rank table prepare() did not build
        raises RankTableMismatchError; so does one built from an earlier table of this name
        (dropped and re-created, renamed in, its columns changed) where `strict`, while a run
        that is not frozen reads the table instead (False)."""
        stored = None if stored is None else stored.split("\n")[0]
        if stored != current:
            built = stored is not None and stored.startswith(FINGERPRINT_TAG)
            if built and not strict:
                return False
            why = (
                "prepare() did not build it"
                if not built
                else "it was built from an earlier table of this name, or its columns changed"
            )
            raise RankTableMismatchError(
                f"{self.where}: the rank table {self.rank_table!r} does not belong to this table "
                f"({why}): call prepare(refresh=True)"
            )
        return True

    def verify_rank_table(self) -> None:
        """Raise RankTableMismatchError unless the rank table provably belongs to the current
        table (its fingerprint, see `_fingerprint_sql`). Runs check it in their snapshot."""
        with self._reading() as cur:
            self._check_fingerprint(*self._fingerprints(cur))

    # ----- the Source protocol ------------------------------------------------------------------
    @contextmanager
    def _reading(self) -> Iterator[psycopg.Cursor[Any]]:
        """A cursor for reads: inside the run's transaction, or a short transaction of its own."""
        if self._run is not None or self._conn.autocommit:
            with self._conn.cursor() as cur:
                yield cur
        else:
            with self._conn.transaction(), self._conn.cursor() as cur:
                yield cur

    def _usable_connection(self) -> psycopg.Connection[Any]:
        """The connection, opened again if this object owns it and it was closed or broken (a
        terminated backend, a restarted server); a clear error if it is the caller's."""
        conn = self._conn
        lost = conn.closed or conn.broken
        if not lost and conn.info.transaction_status == TransactionStatus.UNKNOWN:
            lost = True
        if not lost:
            return conn
        if self._owns_connection and self._conninfo is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass
            try:
                self._conn = psycopg.connect(self._conninfo, autocommit=True)
            except psycopg.OperationalError as error:
                raise ConnectionError(
                    f"{self.where}: the connection to PostgreSQL was lost and reconnecting failed "
                    f"({first_line(error)})"
                ) from None
            return self._conn
        raise ConnectionError(
            f"{self.where}: the connection to PostgreSQL was lost (closed or terminated); make a "
            "PostgresTable with a new connection, or with a conninfo string so that it reconnects "
            "by itself"
        )

    def _run_transaction(self, conn: psycopg.Connection[Any]) -> AbstractContextManager[Any]:
        """The run's transaction (snapshot()): psycopg's, begun when entered, committed (rolled
        back after an error) when left."""
        return conn.transaction()

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """One REPEATABLE READ READ ONLY transaction: every read of the run sees one snapshot.

        Its first query counts m and checks that the rank table belongs to the table (the
        fingerprint); a rank table swapped in by a refresh that committed while this snapshot
        was being taken is invisible to it, so that check is tried once more in a new snapshot.
        A connection lost during the run gives a ConnectionError; the next run reconnects
        (when this object opened the connection)."""
        if self._run is not None:  # nested: the outer snapshot already holds the transaction
            yield
            return
        conn = self._usable_connection()
        if conn.info.transaction_status != TransactionStatus.IDLE:
            raise RuntimeError(
                f"{self.where}: the connection is inside a transaction; snapshot() needs to open "
                "its own REPEATABLE READ READ ONLY transaction"
            )
        saved = conn.isolation_level, conn.read_only
        conn.isolation_level, conn.read_only = psycopg.IsolationLevel.REPEATABLE_READ, True
        yielded = False
        self._refreshes = 0
        try:
            attempt = 1
            while True:
                try:
                    cursor = None
                    try:
                        with self._run_transaction(conn):
                            if self._oblivious:
                                self._hide_statistics(conn)
                            self._run = self._open_run(conn)
                            yielded = True
                            try:
                                yield
                            finally:
                                cursor = self._end_run()
                    finally:  # after the COMMIT or ROLLBACK, which closed it on the server
                        _close_quietly(cursor)
                    return
                except _Refresh:  # rebuild the copy outside the run's transaction, open again
                    self._refreshes += 1
                    conn.isolation_level, conn.read_only = saved
                    self.prepare(refresh=True)
                    conn = self._usable_connection()
                    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                    conn.read_only = True
                    continue
                except RankTableMismatchError:
                    if attempt == 2 or yielded:
                        raise
                except psycopg.OperationalError:
                    # Lost before the run read anything (a terminated backend is only noticed
                    # at the next query): reconnect once, if the connection is ours.
                    lost = conn.closed or conn.broken
                    if attempt == 2 or yielded or not lost or not self._conninfo:
                        raise
                    conn = self._usable_connection()
                    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                    conn.read_only = True
                attempt += 1
        except psycopg.OperationalError as error:
            if not (conn.closed or conn.broken):
                raise
            raise ConnectionError(
                f"{self.where}: the connection to PostgreSQL was lost during the run "
                f"({first_line(error)}); "
                + (
                    "the next run reconnects"
                    if self._owns_connection and self._conninfo
                    else "make a PostgresTable with a new connection, or with a conninfo string so "
                    "that it reconnects by itself"
                )
            ) from None
        finally:
            if not conn.closed:
                conn.isolation_level, conn.read_only = saved

    def hides_statistics(self) -> bool:
        """Whether oblivious runs keep their reads out of the statistics views any role reads
        (pg_stat_user_tables, pg_statio_user_tables): they set track_counts off for their
        transaction where the connection's role may set it (a superuser, or a role granted
        `SET ON PARAMETER track_counts`, PostgreSQL 15 and later). Asked of the server once per
        connection; a fact of the role, not of the data (docs/oblivious.md)."""
        conn = self._usable_connection()
        known = self._hides_statistics
        if known is not None and known[0] is conn:
            return known[1]
        query = may_hide_statistics_sql(conn.info.server_version)
        allowed = bool(conn.execute(query).fetchone()[0])
        self._hides_statistics = (conn, allowed)
        return allowed

    def _hide_statistics(self, conn: psycopg.Connection[Any]) -> None:
        """An oblivious run's first statement: track_counts off for its transaction where the
        role may set it (hides_statistics()). Where it may not, the statistics views show the
        pages a run on a live table read, which depend on its layout (docs/promise.md): said
        once per source."""
        if self.hides_statistics():
            conn.execute(HIDE_STATISTICS)
        elif self.mode == "live" and not self._warned_statistics:
            self._warned_statistics = True
            warnings.warn(
                f"{self.where}: this role may not set track_counts, so pg_statio_user_tables, "
                "which every role reads, shows the pages oblivious runs on this live table "
                "read; they depend on the table's layout (index page splits, which VACUUM does "
                "not undo, text ids, writes), so another role can tell neighbouring tables "
                "apart by them; grant this role SET ON PARAMETER track_counts, or release "
                "through the SQL functions (docs/promise.md)",
                stacklevel=4,
            )

    def _open_run(self, conn: psycopg.Connection[Any]) -> Any:
        """What a run needs to know, read in its transaction's first queries: m, the rank table
        and its runs of tied scores where the copy is proven current (or frozen); otherwise
        what reading the table needs (`_stale_run`)."""
        ranked, with_runs = self._catalog()
        refreshes = getattr(self, "_refreshes", 0)
        if not ranked:
            warnings.warn(
                f"{self.where} has no rank table: runs read the table itself; call prepare()",
                stacklevel=5,
            )
            return self._table_run(conn, {"copy": "none", "refreshes": refreshes})
        m, runs, why = self._counts(conn, with_runs)
        if why is None:
            copy = "frozen" if self.frozen else "current"
            return _Run(True, m, runs, freshness={"copy": copy, "refreshes": refreshes})
        return self._stale_run(conn, m, why, refreshes)

    def _stale_run(
        self, conn: psycopg.Connection[Any], copy_m: int, why: str, refreshes: int
    ) -> _Run:
        """A run whose copy is not proven current (`why`): it reads the table itself, or has the
        copy rebuilt first (raises _Refresh). An oblivious run rebuilds it (a full rebuild: what
        the server observer sees then depends on m and on whether the table was written, which
        its statistics views show anyway), unless no copy of this table can be proven current
        (`why` "unprovable": no trigger); any other run takes the cheaper of the one-shot on
        the table and a rebuild plus a threshold run, priced from m (table_read.py), once."""
        report: dict[str, Any] = {"copy": "stale", "why": why, "refreshes": refreshes}
        if self._oblivious:
            if why != "unprovable":
                if refreshes >= REFRESH_TRIES:
                    raise RuntimeError(
                        f"{self.where} kept changing while its copy was refreshed "
                        f"({REFRESH_TRIES} times): try again, or use mode='live'"
                    )
                raise _Refresh
            report["read"] = "table by rank"
            return _Run(False, self.validate(), None, stale=True, freshness=report)
        table, rebuild = table_seconds(copy_m, 0), refresh_seconds(copy_m)
        report |= {"table_seconds": table, "refresh_seconds": rebuild}
        if why == "written":
            with conn.cursor() as cur:
                around = self._around_state(cur, self._comment, copy_m)
            if around is not None:
                seconds = around_seconds(around.changed)
                report |= {"around_seconds": seconds, "changed": around.changed}
                if seconds <= min(table, rebuild):
                    report["read"] = "around"
                    return _Run(False, around.m, None, stale=True, around=around, freshness=report)
        if rebuild < table and why != "unprovable" and refreshes == 0:
            raise _Refresh
        return self._table_run(conn, report)

    def _table_run(self, conn: psycopg.Connection[Any], report: dict[str, Any]) -> _Run:
        """A run that reads the table itself: through the in-store one-shot on its rows by
        ctid (table_read.py), or, where the relation has no ctid (a view), by rank as before."""
        with conn.cursor() as cur:
            found = self._table_state(cur)
        if found is None:
            report["read"] = "table by rank"
            return _Run(False, self.validate(), None, stale=True, freshness=report)
        m, state = found
        report["read"] = "table"
        state.plan = report
        return _Run(False, m, None, stale=True, table=state, freshness=report)

    def _end_run(self) -> Any:
        """Leave the run (keeping what it learnt of the copy's freshness); the server-side
        cursor to close once its transaction has ended (none here)."""
        if self._run is not None:
            self.last_freshness = dict(getattr(self._run, "freshness", {}) or {})
        self._run = None
        return None

    @contextmanager
    def oblivious_reads(self) -> Iterator[None]:
        """access.ObliviousReads: runs opened inside do not probe the runs of tied scores (the
        probe's plan follows the number of distinct scores, which pg_stat_user_tables shows)."""
        saved, self._oblivious = self._oblivious, True
        try:
            yield
        finally:
            self._oblivious = saved

    # ----- oblivious reads (adapters/postgres/oblivious.py) -------------------------------------
    @property
    def oblivious_costs(self) -> ObliviousCosts:
        """The model of the run in progress: the rank table's, or the table's own when the run
        reads it (a write since prepare(): a fact of the table's history, not of its counts)."""
        run = self._run
        if run is not None and not run.ranked:
            return self.oblivious_costs_table
        return self.oblivious_costs_copy

    def _oblivious_layout(self) -> int | None:
        """Once per run that reads the rank table, before its first oblivious read: pin the
        plans for the run's transaction and probe the rank table's heap layout; the rows per
        heap page where ranks have fixed heap addresses (integer ids: fixed-width rows), else
        None. (A run that reads the table itself, a copy not proven current, scans it in every
        batch and keeps the server's plans: its positions filter is hashed in a custom plan.)"""
        run = self._run
        if self._pinned_run is run:
            return self._per_page
        with self._reading() as cur:
            probe = cur.execute(oblivious_sql.layout_probe(self._ranks, run.m), prepare=False)
            per_page = oblivious_sql.rows_per_page(probe.fetchone(), run.m)
        self._pinned_run, self._per_page = run, per_page if self._integer_ids else None
        return self._per_page

    def _oblivious_sorted(self, start: int, stop: int) -> Rows:
        """Ranks [start, stop) of the rank table: one range of its rank B-tree, which with a
        fixed layout covers the same pages whatever the data (integer ids: packed); with other
        ids (rows of varying width) one lookup per rank, so the pages counted do not follow the
        ids' lengths."""
        per_page = self._oblivious_layout()
        with self._reading() as cur:
            if per_page is not None:
                query = sql.SQL("SELECT {} FROM {} AS r WHERE r.rank >= %s AND r.rank < %s").format(
                    oblivious_sql.PACKED_COLUMNS, self._ranks
                )
                packed = cur.execute(query, [start, stop], binary=True, prepare=False)
                rows = oblivious_sql.unpack(packed.fetchone())
                wanted = np.arange(start, stop, dtype=np.int64)
                return oblivious_sql.check_positions(rows, wanted, self.where)
            query = sql.SQL(
                "SELECT r.rank, r.id, r.score FROM generate_series(%s::int8, %s::int8) AS q(p) "
                "CROSS JOIN LATERAL (SELECT rank, id, score FROM {} WHERE rank = q.p OFFSET 0) "
                "AS r"
            ).format(self._ranks)
            records = cur.execute(query, [start, stop - 1], prepare=False).fetchall()
        return rows_from_records(records)

    def _oblivious_positions(self, ranks: np.ndarray) -> Rows:
        """The rows at `ranks`, each read on its own (one heap page per rank by its address on a
        fixed layout, else one rank B-tree lookup per rank), in rank order."""
        per_page = self._oblivious_layout()
        wanted = np.unique(ranks)
        with self._reading() as cur:
            if per_page is not None:
                query = oblivious_sql.tid_rows_query(self._ranks, per_page)
                oblivious_sql.binary_int8_arrays(cur)
                parameter = oblivious_sql.Int8Array.of(wanted)
                packed = cur.execute(query, [parameter], binary=True, prepare=False)
                rows = oblivious_sql.unpack(packed.fetchone())
                order = np.argsort(rows.positions, kind="stable")
                rows = Rows(rows.positions[order], rows.ids[order], rows.scores[order])
                return oblivious_sql.check_positions(rows, wanted, self.where)
            query = sql.SQL(
                "SELECT r.rank, r.id, r.score FROM unnest(%b::int8[]) AS q(p) CROSS JOIN LATERAL "
                "(SELECT rank, id, score FROM {} WHERE rank = q.p OFFSET 0) AS r"
            ).format(self._ranks)
            oblivious_sql.binary_int8_arrays(cur)
            parameter = oblivious_sql.Int8Array.of(wanted)
            records = cur.execute(query, [parameter], prepare=False).fetchall()
        return rows_from_records(records)

    def _state(self) -> _Run:
        """The run in progress, or (outside a run) one opened and closed for the question."""
        if self._run is not None:
            return self._run
        with self.snapshot():
            return self._run  # type: ignore[return-value]

    def _counts(
        self, reader: psycopg.Connection[Any] | psycopg.Cursor[Any], with_runs: bool
    ) -> tuple[int, int | None, str | None]:
        """m, the number of runs of tied scores (None without a runs table) and why the copy is
        not proven current (None: it is, or is frozen): one query, two index probes (the last
        rank, and the number of the last run by the key first_rank), the rank table's
        fingerprint, checked (RankTableMismatchError), and the write log's proof
        (freshness.py)."""
        runs = (
            sql.SQL("(SELECT run + 1 FROM {} ORDER BY first_rank DESC LIMIT 1)").format(self._runs)
            if with_runs and not self._oblivious
            else sql.SQL("NULL::bigint")
        )
        stored, current = self._fingerprint_sql(self._conn)
        query = sql.SQL("SELECT coalesce(max(rank) + 1, 0), {}, {}, {}, {} FROM {}").format(
            runs, stored, current, self._proof_sql(), self._ranks
        )
        # prepared: the proof's catalog subqueries cost ~1-3 ms to plan and ~0.5 ms to run
        m, count, stored_print, current_print, proof = reader.execute(
            query, prepare=True
        ).fetchone()
        why = self._why_stale(stored_print, current_print, proof)
        self._comment = stored_print
        # No row (a runs table created after this snapshot began) is no runs table.
        return int(m), None if count is None else int(count), why

    def _why_stale(self, stored: str | None, current: str, proof: str | None) -> str | None:
        """None where the copy is proven current (or frozen); else "another table" (the copy
        is of a table since dropped and re-created, renamed in, or altered), "written" (a write
        since the copy, or a change to what the proof rests on, or a copy without a stamp), or
        "unprovable" (the copy's stamp says no trigger could prove it: no right to create one,
        a view, a logical replication target)."""
        if not self._check_fingerprint(stored, current, strict=self.frozen):
            return "another table"
        if proof is not None:
            return None
        lines = (stored or "").split("\n")
        stamp = lines[1] if len(lines) > 1 else ""
        if stamp.startswith(STAMP_TAG) and stamp.endswith(UNPROVABLE):
            return "unprovable"
        return "written"

    def serves_copy(self) -> bool:
        """Whether a run started now reads the rank-ordered copy (proven current by the write
        log, or the table is frozen) rather than the table itself: the proof alone, in a
        transaction of its own."""
        if self._run is not None:
            return self._run.ranked
        self._usable_connection()
        ranked, with_runs = self._catalog()
        if not ranked:
            return False
        with self._reading() as cur:
            return self._counts(cur, with_runs)[2] is None

    def run_freshness(self) -> dict[str, Any] | None:
        """How the run in progress knew its data current (access.run_freshness): whether the
        copy was proven current, and if not why, what the run read and what each way was
        priced at. Operator diagnostics (result.diagnostics.plan["freshness"])."""
        return None if self._run is None else dict(getattr(self._run, "freshness", {}) or {})

    @property
    def store_costs(self) -> StoreCosts:
        """The copy's costs, or, in a run that reads the table itself, the table's (each sorted
        read a scan: the planner then takes the in-store one-shot without reading first)."""
        run = self._run
        around = getattr(run, "around", None)  # live mode's runs have none
        if run is not None and around is not None:  # the in-store one-shot, read around
            return dataclasses.replace(
                table_costs(run.m), oneshot_fixed=around_seconds(around.changed)
            )
        table = getattr(run, "table", None)
        return table_costs(run.m) if run is not None and table is not None else STORE_COSTS

    def traits(self) -> StoreTraits:
        """access.StoreTraits: the declared sensitivity and bound, the score column's type."""
        return StoreTraits(self.sensitivity, self.max_items_per_client, self.integer_scores)

    def run_traits(self) -> RunTraits:
        """access.RunTraits: a copy's ranks, the costs of what the run reads."""
        return RunTraits(costs=self.store_costs, oblivious_costs=self.oblivious_costs)

    def oneshot_positions(self) -> int:
        """How many positions the in-store one-shot draws its exceedances from: the table's
        slots in a run that reads the table (table_read.py), else m."""
        run = self._state()
        if getattr(run, "around", None) is not None:
            return run.around.positions
        return run.table.slots if run.table is not None else run.m

    def _ranked_source(self, ranked: bool) -> sql.Composable:
        if ranked:
            return self._ranks
        return sql.SQL(
            "(SELECT row_number() OVER (ORDER BY {order}) - 1 AS rank, {id} AS id, "
            "{score}::float8 AS score FROM {base})"
        ).format(order=self._order, id=self._id, score=self._score, base=self._base)

    def _sorted_query(self, ranked: bool) -> sql.Composable:
        if ranked:
            return sql.SQL(
                "SELECT rank, id, score FROM {} WHERE rank >= %s AND rank < %s ORDER BY rank"
            ).format(self._ranks)
        return sql.SQL(
            "SELECT 0 AS rank, {id} AS id, {score}::float8 AS score FROM {base} "
            "ORDER BY {order} LIMIT %s OFFSET %s"
        ).format(id=self._id, score=self._score, base=self._base, order=self._order)

    def _ranks_query(self, ranked: bool) -> sql.Composable:
        return sql.SQL(
            "SELECT r.rank, r.id, r.score FROM {} AS r WHERE r.rank = ANY(%s::bigint[]) "
            "ORDER BY r.rank"
        ).format(self._ranked_source(ranked))

    def _ids_query(self, ranked: bool) -> sql.Composable:
        if ranked:
            return sql.SQL("SELECT id, score FROM {} WHERE id = ANY(%s)").format(self._ranks)
        return sql.SQL("SELECT {id}, {score}::float8 FROM {base} WHERE {id} = ANY(%s)").format(
            id=self._id, score=self._score, base=self._base
        )

    def domain_size(self) -> int:
        return self._state().m

    def read_sorted(self, start: int, count: int) -> Rows:
        run = self._state()
        start, stop = int(start), min(int(start) + int(count), run.m)
        if stop <= start:
            return rows_from_records([])
        if self._oblivious and self._run is not None and run.ranked:
            if self._integer_ids or stop < run.m:  # a full read's size is public anyway
                return self._oblivious_sorted(start, stop)
        params = [start, stop] if run.ranked else [stop - start, start]
        if run.ranked and self._integer_ids and stop - start >= PACKED_MIN_ROWS:
            rows = self._packed_rows(start, stop)
        else:
            with self._reading() as cur:
                records = cur.execute(self._sorted_query(run.ranked), params).fetchall()
            rows = rows_from_records(records)
        if not run.ranked:
            rows = Rows(np.arange(start, start + len(rows), dtype=np.int64), rows.ids, rows.scores)
        return rows

    def _packed_rows(self, start: int, stop: int) -> Rows:
        """A large range of the rank table with integer ids, each column packed by the server
        into one bytea (string_agg of int8send / float8send) and unpacked by numpy: a full read
        of 10^7 rows in about 3.5 s instead of about 11 s as one Python tuple per row."""
        query = sql.SQL(
            "SELECT string_agg(int8send(rank), ''::bytea), "
            "string_agg(int8send(id::int8), ''::bytea), string_agg(float8send(score), ''::bytea) "
            "FROM {} WHERE rank >= %s AND rank < %s"
        ).format(self._ranks)
        with self._reading() as cur:
            packed = cur.execute(query, [start, stop], binary=True).fetchone()
        if packed is None or packed[0] is None:
            return rows_from_records([])
        ranks, ids, scores = (
            np.frombuffer(packed[0], ">i8").astype(np.int64),
            np.frombuffer(packed[1], ">i8").astype(np.int64),
            np.frombuffer(packed[2], ">f8").astype(np.float64),
        )
        if len(ranks) > 1 and not bool(np.all(ranks[1:] > ranks[:-1])):
            order = np.argsort(ranks, kind="stable")
            ranks, ids, scores = ranks[order], ids[order], scores[order]
        return Rows(ranks, ids, scores)

    def score_run_count(self) -> int | None:
        """ScoreRuns: how many runs of tied scores the runs table holds (None without one)."""
        return self._state().runs

    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        """ScoreRuns: (first rank, score) of every run of tied scores, in rank order, in one
        query (packed in one bytea per column when they are many)."""
        count = self._run.runs if self._run is not None else None
        if count is not None and count >= PACKED_MIN_ROWS:
            query = sql.SQL(
                "SELECT string_agg(int8send(first_rank), ''::bytea ORDER BY first_rank), "
                "string_agg(float8send(score), ''::bytea ORDER BY first_rank) FROM {}"
            ).format(self._runs)
            with self._reading() as cur:
                first, scores = cur.execute(query, binary=True).fetchone()
            return (
                np.frombuffer(first or b"", ">i8").astype(np.int64),
                np.frombuffer(scores or b"", ">f8").astype(np.float64),
            )
        query = sql.SQL("SELECT first_rank, score FROM {} ORDER BY first_rank").format(self._runs)
        with self._reading() as cur:
            records = cur.execute(query).fetchall()
        first = np.fromiter((r[0] for r in records), dtype=np.int64, count=len(records))
        scores = np.fromiter((r[1] for r in records), dtype=np.float64, count=len(records))
        return first, scores

    def read_positions(self, ranks: np.ndarray) -> Rows:
        run = self._state()
        if self._oblivious and self._run is not None and run.ranked and len(ranks):
            return self._oblivious_positions(np.asarray(ranks, dtype=np.int64))
        wanted = plain_values(np.asarray(ranks, dtype=np.int64))
        if not wanted:
            return rows_from_records([])
        with self._reading() as cur:
            records = cur.execute(self._ranks_query(run.ranked), [wanted]).fetchall()
        return rows_from_records(records)

    def read_oneshot(self, noise: KeyedNoise, k: int) -> Rows | None:
        """InStoreOneShot: the k rows of largest score + keyed noise (topk_middleware/
        keyed_noise.py), best first, ties by smaller rank, in one query; the key and the
        exceedances are query parameters, the uniform of rank p the first 52 bits of
        SHA-256("key:p"). A run that reads the table itself runs it there, positions its
        slots (table_read.py). Copy mode only (live mode has none)."""
        run = self._state()
        if run.table is not None:
            return self._table_oneshot(run.table, noise, k)
        if getattr(run, "around", None) is not None:
            return self._around_oneshot(run.around, noise, k)
        digits = (
            "(('x' || encode(substring(sha256((%(key)s || ':' || r.rank)::bytea) FROM 1 FOR 7), "
            "'hex'))::bit(56)::bigint >> 4)::float8"
        )
        text = oneshot_query(
            "{source}",
            "rank",
            noise.sql(uniform_from_hex_sql(digits)),
            "SELECT * FROM unnest(%(positions)s::bigint[], %(noises)s::float8[])",
            noise.bound,
            "%(k)s",
            materialized="MATERIALIZED ",
            search_m="%(m)s" if run.ranked else None,  # the rank table's B-tree on rank
            score_cap=noise.score_cap,
        )
        escaped = text.replace("{", "{{").replace("}", "}}").replace("{{source}}", "{source}")
        query = sql.SQL(escaped).format(source=self._ranked_source(run.ranked))
        params = {
            "key": noise.key,
            "k": int(k),
            "m": int(run.m),
            "positions": int_array_literal(noise.exceed_positions),
            "noises": float_array_literal(noise.exceed_noises),
        }
        with self._reading() as cur:
            records = cur.execute(query, params).fetchall()
        ids = id_array([r[1] for r in records])
        return Rows(
            np.array([r[0] for r in records], dtype=np.int64),
            ids,
            np.array([r[2] for r in records], dtype=np.float64),
        )

    def read_ids(self, ids: Sequence[Any]) -> np.ndarray:
        run = self._state()
        wanted = plain_values(ids)
        if not wanted:
            return np.empty(0, dtype=np.float64)
        with self._reading() as cur:
            found = dict(cur.execute(self._ids_query(run.ranked), [wanted]).fetchall())
        return scores_in_order(found, wanted, self.where)

    def read_exact_scores(self, ids: Sequence[Any]) -> list[Any]:
        """ExactScores: the scores of the named items in the table's own type (bigint as Python
        ints, numeric as Decimals), from the table in the run's snapshot (the rank copy holds
        float8)."""
        self._state()
        return self._exact_scores(ids)

    def _exact_scores(self, ids: Sequence[Any]) -> list[Any]:
        wanted = plain_values(ids)
        if not wanted:
            return []
        query = sql.SQL("SELECT {id}, {score} FROM {base} WHERE {id} = ANY(%s)").format(
            id=self._id, score=self._score, base=self._base
        )
        with self._reading() as cur:
            found = dict(cur.execute(query, [wanted]).fetchall())
        try:
            return [found[item] for item in wanted]
        except KeyError as missing:
            raise AccessError(f"{self.where} has no item with id {missing.args[0]!r}") from None

    # ----- cleanup ------------------------------------------------------------------------------
    def uninstall(self) -> None:
        """Drop everything prepare() made: the rank table (its B-trees on rank and id and its
        fingerprint go with it) and the runs table, in one transaction. The table of counts is
        not touched. A rank table that prepare() did not build (no fingerprint) is refused
        (RankTableMismatchError) and nothing is dropped. Idempotent; runs need prepare() again
        afterwards. Waits for runs still reading the rank table (DROP TABLE's lock)."""
        if self._run is not None:
            raise RuntimeError("uninstall() cannot run inside snapshot()")
        conn = self._usable_connection()
        ranks = self._ranks.as_string(conn)
        with conn.transaction():
            exists, stored = conn.execute(
                "SELECT to_regclass(%s) IS NOT NULL, obj_description(to_regclass(%s), 'pg_class')",
                [ranks, ranks],
            ).fetchone()
            if not exists:  # no copy: the write log of a refused or interrupted prepare()
                self._uninstall_log(conn)
                return
            if stored is None or not stored.startswith(FINGERPRINT_TAG):
                raise RankTableMismatchError(
                    f"{self.where}: the table {self.rank_table!r} was not built by prepare() "
                    "(no fingerprint): uninstall() leaves it alone"
                )
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}, {}").format(self._runs, self._ranks))
            self._uninstall_log(conn)

    def close(self) -> None:
        """Close the connection if this object opened it."""
        if self._owns_connection:
            self._conn.close()


INDEX_SCANS = ("Index Scan", "Index Only Scan", "Bitmap Index Scan")


def _seq_scans(plan: Any, limited: bool = False) -> Iterator[str]:
    """Relations read whole anywhere in an EXPLAIN (FORMAT JSON) plan: by a sequential scan, or
    by an index scan with neither an index condition nor a LIMIT above it (a full index walk)."""
    if isinstance(plan, list):
        for entry in plan:
            yield from _seq_scans(entry, limited)
    elif isinstance(plan, dict):
        node = plan.get("Node Type")
        limited = limited or node == "Limit"
        if node == "Seq Scan":
            yield str(plan.get("Relation Name"))
        elif node in INDEX_SCANS and "Index Cond" not in plan and not limited:
            yield f"{plan.get('Relation Name') or plan.get('Index Name')} (whole index)"
        for value in plan.values():
            if isinstance(value, list | dict):
                yield from _seq_scans(value, limited)
