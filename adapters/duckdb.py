"""DuckDBTable: wrap an existing DuckDB table of per-item counts.

Canonical order (topk_middleware/access.py): score descending, ties by id ascending; VARCHAR ids
compare by `COLLATE "binary"`, i.e. byte order of their UTF-8 text, whatever `default_collation`
the connection has set.

DuckDB has no index-driven ORDER BY, so `prepare()` writes a rank-ordered copy (rank, id, score) of
the table. Rows are stored in rank order, so the per-row-group min/max ("zone maps") of the rank
column let a range `rank BETWEEN a AND b` (sorted access) skip every other row group. A batch of
sampled ranks (random access by rank, the positional index) is one query: an IN list served by an
ART index on rank when it is short, one scan of the rank column when it is long. Runs read that
copy, so a run sees the table as of the last `prepare()`; `prepare(refresh=True)` updates it.
After writes, `refresh()` (what `prepare(refresh=True)` does once a copy exists) costs about one
scan, not a sort: one pass finds the changed rows and keeps them in a small delta merged with the
copy on read, folded into a new copy past `fold_fraction` of m (adapters/duckdb_delta.py).
Without the copy every read is a full scan of the live table (correct, slow; `check()` says so).

Freshness (docs/freshness.md): DuckDB has no triggers and no cheap proof that a copy is
current, so unless the table is `frozen=True` (the caller's promise that it does not change
after `prepare()`/`refresh()`) a run reads the table as it is now: its checks from aggregates
DuckDB answers without a pass, and the in-store one-shot on the table itself, keyed noise on
rowids (`_live_oneshot`). Frozen runs read the copy.

Every read of a run happens in one DuckDB transaction on a connection of its own (`snapshot()`):
writers on other connections, including a concurrent `prepare(refresh=True)`, do not change what
the run sees.

Size: one class, DuckDBTable, whose methods share one connection, one snapshot and the
rank table's names; the delta kept after writes is its own module (duckdb_delta.py), and the
reads of a table that is not frozen another (duckdb_live.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import duckdb
import numpy as np

from topk_middleware.access import AccessError, Rows, RunTraits, StoreCosts, StoreTraits
from topk_middleware.keyed_noise import KeyedNoise, oneshot_query, uniform_from_hex_sql
from topk_middleware.mechanisms.oblivious import ObliviousCosts
from topk_middleware.planner import PROBE_ROWS
from topk_middleware.privacy import resolve_declared
from topk_middleware.validation import first_line

from ._sql import (
    FINGERPRINT_TAG,
    AccessCheck,
    AccessPath,
    RankTableMismatchError,
    TableFacts,
    plain_values,
    raise_if_invalid,
    rank_table_name,
    scores_in_order,
    sql_name_spellings,
)
from .contributions import parse_record
from .dialects.votes import DuckDBVotes
from .duckdb_delta import (
    CACHE_MAX_ROWS,
    FOLD_FRACTION,
    DeltaCache,
    DeltaNames,
    DeltaRefresh,
    DeltaView,
    RefreshReport,
    empty_delta_sql,
    load_cache,
    parse_delta_comment,
    shadow_sql,
)
from .duckdb_live import CATALOG_SCAN_MAX, LiveRead, _Run, live_costs
from .sql.driver import DuckDBDriver
from .sql.votes import count_votes, write_counts

NUMERIC_TYPES = (
    "TINYINT",
    "SMALLINT",
    "INTEGER",
    "BIGINT",
    "HUGEINT",
    "UTINYINT",
    "USMALLINT",
    "UINTEGER",
    "UBIGINT",
    "UHUGEINT",
    "FLOAT",
    "DOUBLE",
    "DECIMAL",
)
TEXT_TYPES = ("VARCHAR",)
# Random access by rank: up to this many ranks are looked up in the rank index, key by key.
INDEX_LOOKUP_MAX = 1000
# A range read of the rank table costs about 0.7 ms up to this many rows (then 0.1 ms more per
# 2,000 or so; measured at m = 10^7): sorted reads fetch at least this many.
SORTED_READ_ROWS = 8192
# The fingerprint holds the copy's first rows (the planner's probe: a frozen run serves them from
# its catalog scan instead of a range read of the copy, ~0.4 ms at m = 10^7), where the ids are
# integers or text of at most HEAD_TEXT_MAX characters in all.
HEAD_ROWS = PROBE_ROWS
HEAD_TEXT_MAX = 1 << 14
# Why a rank table does not fit its table (the fingerprint's verdicts that callers act on).
NOT_BUILT = "prepare() did not build it"
ROWS_DIFFER = "it was built from"
# Measured at m = 10^7 on a 2-core machine (DESIGN; benchmarks/wallclock.py): a batch of random
# reads by rank is a semi-join over the rank column, 15-40 ms whatever its size; the in-store
# one-shot's keyed hash (SHA-256) costs 0.3-0.4 us a hashed row here. The in-store one-shot's
# statement costs 3-23 ms besides (the fastest of 25 runs at m = 10^3 to 10^5, loaded), a full
# read of the copy 0.4 / 0.5 / 2.3 ms at m = 10^3 / 10^4 / 10^5: below about 10^5 rows the full
# read wins (benchmarks/sizes.py).
STORE_COSTS = StoreCosts(
    round_trip=1e-3,
    sorted_row=5e-8,
    random_batch=1e-3,
    random_row=1e-7,
    random_batch_item=2e-9,
    oneshot_row=4e-7,
    full_read_row=2e-8,
    oneshot_query=5e-3,
)

# Oblivious releases (the deadline's model, mechanisms/oblivious.py), measured on an idle 2-core
# machine (work of 5-7 releases, k = 10): the rank-ordered copy (frozen) 7.3 / 26 / 79-113 ms at
# m = 10^5 / 10^6 / 10^7 (d = 2,027 / 6,445 / 20,414); the table read as it is now, by rowid
# slot (adapters/duckdb_live.py), 10.8 / 34 / 94-114 ms.
OBLIVIOUS_COSTS_COPY = ObliviousCosts(fixed=3e-3, sorted_row=1e-6, random_row=3e-6)
OBLIVIOUS_COSTS_LIVE = ObliviousCosts(fixed=6e-3, sorted_row=1e-6, random_row=3.3e-6)


def quote_identifier(name: str) -> str:
    """A DuckDB identifier in double quotes (embedded quotes doubled): any name is taken literally.

    The duckdb Python package exposes no quoting function, so this is the one place names are
    quoted (tested with spaces, quotes, capitals and keywords).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"an identifier must be a non-empty string, got {name!r}")
    if "\x00" in name:
        raise ValueError(f"an identifier cannot contain a NUL character: {name!r}")
    return '"' + name.replace('"', '""') + '"'


class DuckDBTable(LiveRead):
    """A histogram held in a DuckDB table: one row per item of the public domain.

    `table` (in `schema`, default the connection's) has an id column and a numeric score column.
    Names are quoted, never pasted: spaces, quotes, capitals and keywords are fine.
    """

    def traits(self) -> StoreTraits:
        """access.StoreTraits: the declared sensitivity and bound, the score column's type."""
        return StoreTraits(self.sensitivity, self.max_items_per_client, self.integer_scores)

    def run_traits(self) -> RunTraits:
        """access.RunTraits of the run in progress (copy, copy and delta, or the table)."""
        return RunTraits(
            positions_are_ranks=self.positions_are_ranks,
            sorted_read_rows=self.sorted_read_rows,
            sorted_rows_in_hand=self.sorted_rows_in_hand,
            costs=self.store_costs,
            oblivious_costs=self.oblivious_costs,
        )

    def oneshot_reads(self) -> str | None:
        """access.OneShotReads: what the last in-store one-shot read."""
        return self.last_oneshot_reads

    @property
    def sorted_read_rows(self) -> int:
        """How far CountedAccess reads ahead: free on the copy (a row-group range); on the
        table read as it is now every sorted read is a top-N over a scan, so no read-ahead."""
        run = self._run
        return 1 if run is not None and run.live else SORTED_READ_ROWS

    @property
    def sorted_rows_in_hand(self) -> int:
        """access.CountedAccess: how many rows of the canonical order a run has from its first
        query (a frozen copy without a pending delta: its fingerprint holds the first
        HEAD_ROWS), so that a sorted read within them makes no round trip."""
        run = self._run if self._run is not None else self._state()
        return 0 if run.head is None else len(run.head)

    @property
    def store_costs(self) -> StoreCosts:
        """The cost shape: on the copy a batch of random reads is about one scan; on the table
        read as it is now (not frozen) every sorted read is a scan and a batch of random reads
        by rank a sort, while the in-store one-shot is about three scans (live_costs); a copy
        with a pending delta is read as the copy, but its in-store one-shot as the table."""
        run = self._run
        if run is not None and run.live:
            return live_costs(run.m)
        if run is not None and run.delta is not None:  # its one-shot reads the table itself
            return replace(STORE_COSTS, oneshot_fixed=live_costs(run.m).oneshot_fixed)
        return STORE_COSTS

    @property
    def oblivious_costs(self) -> ObliviousCosts:
        """The oblivious release's model: the copy's when the caller promised it current
        (`frozen`, a public choice), else the table's read by rowid slot."""
        return OBLIVIOUS_COSTS_COPY if self.frozen else OBLIVIOUS_COSTS_LIVE

    @property
    def integer_scores(self) -> bool:
        """Whether the score column is of an integer type (the noisy counts' interval is then
        w, else w + 1): the catalog's type when asked, so a column retyped since is seen."""
        cursor = self._con.cursor()
        try:
            kind = cursor.execute(f"DESCRIBE SELECT {self._score} FROM {self._base}").fetchone()
        except duckdb.Error:
            return False
        finally:
            cursor.close()
        return kind is not None and str(kind[1]).startswith(NUMERIC_TYPES[:10])

    def __init__(
        self,
        connection_or_path: duckdb.DuckDBPyConnection | str | os.PathLike[str],
        table: str,
        id: str = "id",
        score: str = "score",
        *,
        schema: str | None = None,
        rank_table: str | None = None,
        sensitivity: float | None = None,
        max_items_per_client: int | None = None,
        frozen: bool = False,
    ) -> None:
        if not isinstance(frozen, bool):
            raise TypeError(f"frozen must be True or False, got {frozen!r}")
        self.frozen = frozen  # the caller's promise: the table does not change after prepare()
        resolve_declared(sensitivity, max_items_per_client, None, "DuckDB table")  # bad: refused
        if isinstance(connection_or_path, duckdb.DuckDBPyConnection):
            self._con = connection_or_path
            self._owns_connection = False
        else:
            self._con = duckdb.connect(os.fspath(connection_or_path))
            self._owns_connection = True
        where = "DuckDB table " + (repr(table) if schema is None else f"{schema!r}.{table!r}")
        table, schema = self._catalog_name(table, schema)  # every object name derives from it
        self.table, self.id_column, self.score_column, self.schema = table, id, score, schema
        self.rank_table = rank_table or rank_table_name(table, id, score)
        prefix = "" if schema is None else quote_identifier(schema) + "."
        self._prefix = prefix
        self._base = prefix + quote_identifier(table)
        self._ranks = prefix + quote_identifier(self.rank_table)
        self._rank_index = self.rank_table + "_rank"
        self.runs_table = self.rank_table + "_runs"  # (first_rank, score) of each tied run
        self._runs = prefix + quote_identifier(self.runs_table)
        self._id = quote_identifier(id)
        self._score = quote_identifier(score)
        self.where = where
        # refresh by delta (adapters/duckdb_delta.py): the shadow, delta and skip tables
        self.shadow_table = self.rank_table + "_shadow"
        self.delta_table = self.rank_table + "_delta"
        self.skip_table = self.rank_table + "_skip"
        self.fold_fraction = FOLD_FRACTION
        self.last_refresh: RefreshReport | None = None
        self._delta_tables_seen = False  # the delta and skip tables were found (never dropped)
        self._delta_sizes: tuple[Any, ...] | None = None  # (delta, skip, gen), from _counts()
        self._delta_cache: DeltaCache | None = None  # the last delta generation read
        self._run: _Run | None = None
        self._catalog_rows = 0  # tables in the last unfiltered scan of the catalog (_lookup)
        self.last_oneshot_reads: str | None = None  # what the last in-store one-shot read
        self._slots_hint: int | None = None  # the row slots the last live run proved
        self._oblivious = False  # inside oblivious_reads(): live tables named by rowid slot
        self._seen_prepared = False  # the last catalog lookup found all that prepare() builds
        # The table's catalog oid when this object last built or verified the rank table: an
        # identity within this open database only (oids are handed out again on reopen).
        self._proven_oid: int | None = None
        self._mark = _Mark(None)  # the rank table's comment last parsed (_mark_of)
        self._text_ids = self._check_columns()
        # The most one client moves a count, and how many counts it moves: declared, else what
        # from_votes recorded with the table (contributions.py), else (1, None).
        self.sensitivity, self.max_items_per_client = resolve_declared(
            sensitivity, max_items_per_client, self._recorded(), self.where
        )
        collate = ' COLLATE "binary"' if self._text_ids else ""
        self._collate = collate  # text ids compare byte-wise everywhere, not only in the order
        self._order = f"{self._score} DESC, {self._id}{collate} ASC"

    # ----- construction from raw votes ----------------------------------------------------------
    @classmethod
    def from_votes(
        cls,
        connection_or_path: duckdb.DuckDBPyConnection | str | os.PathLike[str],
        votes: str,
        items: str,
        *,
        client: str = "client",
        item: str = "item",
        item_id: str = "id",
        into: str | None = None,
        schema: str | None = None,
        replace: bool = False,
        weight: str | None = None,
        max_per_item: float = 1,
        max_items_per_client: int | None = None,
    ) -> DuckDBTable:
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
        dialect, con = (
            DuckDBVotes(),
            (
                connection_or_path
                if isinstance(connection_or_path, duckdb.DuckDBPyConnection)
                else duckdb.connect(os.fspath(connection_or_path))
            ),
        )
        into = into or f"{votes}_counts"
        try:
            driver = DuckDBDriver(con)
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
                con,
                into,
                id="id",
                score="score",
                schema=schema,
                sensitivity=counts.sensitivity,
                max_items_per_client=counts.max_items,
            )
        except BaseException:  # refused: a connection opened here is closed, not left open
            if con is not connection_or_path:
                con.close()
            raise
        source._owns_connection = con is not connection_or_path
        return source

    # ----- checks -------------------------------------------------------------------------------
    def _recorded(self) -> tuple[float, int | None] | None:
        """The bounds from_votes recorded in the table's comment (contributions.py), if any."""
        found = self._con.execute(
            "SELECT comment FROM duckdb_tables() WHERE database_name = current_database() "
            "AND lower(schema_name) = lower(coalesce($schema, current_schema())) "
            "AND lower(table_name) = lower($name)",
            {"schema": self.schema, "name": self.table},
        ).fetchone()
        return None if found is None else parse_record(found[0])

    def _check_columns(self) -> bool:
        """Table and columns exist, the score is numeric; returns whether ids are text."""
        try:
            described = self._con.execute(f"DESCRIBE SELECT * FROM {self._base}").fetchall()
        except duckdb.Error as error:
            raise ValueError(f"{self.where} cannot be read: {first_line(error)}") from None
        temporary = self._con.execute(
            "SELECT count(*) FROM (SELECT table_name AS name, schema_name, temporary FROM "
            "duckdb_tables() UNION ALL SELECT view_name, schema_name, temporary FROM "
            "duckdb_views()) WHERE temporary AND lower(name) = lower($name) "
            "AND ($schema IS NULL OR lower(schema_name) = lower($schema))",
            {"name": self.table, "schema": self.schema},
        ).fetchone()[0]
        if temporary:
            raise ValueError(
                f"{self.where} is a temporary table or view of this connection (con.register() "
                "of an Arrow table or a DataFrame makes one): the adapter reads through cursors "
                "of its own, which do not see it. Copy it into a table (CREATE TABLE name AS "
                f"SELECT * FROM {self._base}), or release from it in memory with "
                "ArraySource.from_arrow(table, id=..., score=...) or ArraySource.from_polars"
            )
        types = {name: kind for name, kind, *_ in described}
        for column in (self.id_column, self.score_column):
            if column not in types:
                raise ValueError(
                    f"{self.where} has no column {column!r} (columns: {sorted(types)})"
                )
        score_type = types[self.score_column]
        if not score_type.startswith(NUMERIC_TYPES):
            raise TypeError(
                f"{self.where} column {self.score_column!r} must be numeric, it is {score_type}"
            )
        return types[self.id_column].startswith(TEXT_TYPES)

    def validate(self, cursor: duckdb.DuckDBPyConnection | None = None) -> int:
        """Check every row (one pass): no NULL/NaN/infinite/negative score, no NULL or duplicate
        id, not empty. Returns m. Raises ValueError naming the table and column at fault."""
        con = cursor or self._con
        s = f"{self._score}::DOUBLE"
        row = con.execute(
            f"SELECT count(*), count(*) - count({self._id}), "
            f"count(DISTINCT {self._id}{self._collate}), "
            f"count(*) - count({self._score}), count_if(isnan({s}) OR isinf({s})), "
            f"count_if({self._score} < 0) FROM {self._base}"
        ).fetchone()
        facts = TableFacts(*(int(x or 0) for x in row))
        duplicate = None
        if facts.null_ids == 0 and facts.distinct_ids != facts.rows:
            duplicate = con.execute(
                f"SELECT {self._id}{self._collate} FROM {self._base} "
                f"GROUP BY {self._id}{self._collate} "
                f"HAVING count(*) > 1 LIMIT 1"
            ).fetchone()[0]
        raise_if_invalid(facts, self.where, self.id_column, self.score_column, duplicate)
        return facts.rows

    def _catalog(self, cursor: duckdb.DuckDBPyConnection | None = None) -> tuple[bool, ...]:
        """Whether the rank table, its index on rank and the runs table exist: one catalog
        lookup, which cannot abort a transaction (a query on a missing table would)."""
        con = cursor or self._con
        where = (
            "database_name = current_database() "
            "AND lower(schema_name) = lower(coalesce($schema, current_schema())) "
        )
        table, index, runs = con.execute(
            f"SELECT (SELECT count(*) FROM duckdb_tables() WHERE {where}"
            "AND lower(table_name) = lower($table)), "
            f"(SELECT count(*) FROM duckdb_indexes() WHERE {where}"
            "AND lower(index_name) = lower($index)), "
            f"(SELECT count(*) FROM duckdb_tables() WHERE {where}"
            "AND lower(table_name) = lower($runs))",
            {
                "schema": self.schema,
                "table": self.rank_table,
                "index": self._rank_index,
                "runs": self.runs_table,
            },
        ).fetchone()
        return bool(table), bool(table) and bool(index), bool(table) and bool(runs)

    def has_rank_table(self, cursor: duckdb.DuckDBPyConnection | None = None) -> bool:
        """Whether the rank table exists."""
        return self._catalog(cursor)[0]

    def is_stale(self) -> bool:
        """Whether the table's counts differ from the rank table of the last `prepare()` (True
        when there is none, or when it does not belong to this table). One full scan of the
        table, joined on (id, score)."""
        if not self.has_rank_table():
            return True
        try:
            self._copy_state(self._con)
        except RankTableMismatchError:
            return True
        return self._copy_differs(self._con)

    def _copy_state(self, con: duckdb.DuckDBPyConnection) -> _Run:
        """The state of the copy (with its delta), whether or not runs read it (frozen)."""
        frozen, self.frozen = self.frozen, True
        try:
            return self._state(con)
        finally:
            self.frozen = frozen

    def _copy_differs(self, con: duckdb.DuckDBPyConnection) -> bool:
        """Whether the copy (with its delta, if one is pending) and the table differ: one scan
        of each, joined on (id, score)."""
        delta = self._copy_state(con).delta
        current = self._ranks if delta is None else delta.relation()
        unmatched, live, ranked = con.execute(
            f"SELECT count(*) FILTER (WHERE r.id IS NULL), (SELECT count(*) FROM {self._base}), "
            f"(SELECT count(*) FROM {current}) FROM {self._base} AS b "
            f"LEFT JOIN {current} AS r ON r.id{self._collate} = b.{self._id}{self._collate} "
            f"AND r.score = b.{self._score}::DOUBLE"
        ).fetchone()
        return bool(unmatched or live != ranked)

    def has_rank_index(self, cursor: duckdb.DuckDBPyConnection | None = None) -> bool:
        """Whether the ART index on the rank table's rank column exists."""
        return self._catalog(cursor)[1]

    def check(self) -> AccessCheck:
        """How sorted access and random access will be served, before a run."""
        ranked, indexed, with_runs = self._catalog()
        if not ranked:
            scan = f"no rank table {self.rank_table!r}: a full scan of {self.where} per read; "
            return AccessCheck(
                self.where,
                [
                    AccessPath("sorted", True, scan + "call prepare()"),
                    AccessPath("random by rank", True, scan + "call prepare()"),
                    AccessPath("random by id", True, "hash join over the id column"),
                ],
            )
        if not self.frozen:  # no cheap proof that the copy is current: runs read the table
            now = (
                f"{self.where} as it is now, read whole by one query (the in-store one-shot); "
                f"the copy {self.rank_table!r} serves runs of a frozen table only "
                "(frozen=True; the command line's --frozen)"
            )
            return AccessCheck(
                self.where,
                [
                    AccessPath("sorted", True, now),
                    AccessPath("random by rank", True, now),
                    AccessPath("random by id", True, "hash join over the id column"),
                ],
            )
        return AccessCheck(
            self.where,
            [
                AccessPath("sorted", False, f"rank range on rank-ordered {self.rank_table!r}"),
                AccessPath(
                    "random by rank",
                    False,
                    f"rank lookup in {self.rank_table!r}: "
                    + (
                        "ART index for short batches, a scan of the rank column for long ones"
                        if indexed
                        else "a scan of the rank column per batch (no index on rank: run "
                        "prepare() again)"
                    )
                    + (
                        f"; scores of tied runs from {self.runs_table!r}"
                        if with_runs
                        else " (no runs table: run prepare() again)"
                    ),
                ),
                AccessPath(
                    "random by id",
                    True,
                    f"hash join over the id column of {self.rank_table!r} (one scan per batch; "
                    "the threshold algorithm does not use it)",
                ),
            ],
        )

    # ----- preparation --------------------------------------------------------------------------
    def prepare(self, refresh: bool = False, *, full: bool = False) -> None:
        """Create the rank-ordered copy (rank, id, score) if it is missing (or bring it up to date).

        Idempotent: without `refresh`, an existing copy that belongs to this table is kept. It
        must carry the fingerprint prepare() writes (else: RankTableMismatchError, a table of
        that name that prepare() did not build); one whose fingerprint does not fit the table
        (definition or row count changed) is rebuilt; and unless this object built or verified
        it in this open database, the copy is compared with the table (one scan) and rebuilt if
        they differ (DuckDB has no lasting table identity to tell a stale copy of this table
        from one of an earlier table of that name). With `refresh`, an existing copy is brought
        up to date by `refresh()`: one pass over the table and a small delta, folded into a new
        copy past `fold_fraction` of m (adapters/duckdb_delta.py); `full=True` rebuilds the
        copy by a full sort instead. The table is validated first, in the transaction that
        writes the copy (one snapshot), so a run reading the old copy is not disturbed.
        """
        if self._run is not None:
            raise RuntimeError("prepare() cannot run inside snapshot()")
        if refresh and not full and self._has_delta_layout():
            stored, _, ddl, rows = self._facts(self._con)
            why = self._mismatch(stored, ddl, rows)
            if why is None or why.startswith(ROWS_DIFFER):  # a delta finds the rest
                self.refresh()  # a delta against the shadow: any change is found by the pass
                return
        self._seen_prepared = False
        ranked, indexed, with_runs = self._catalog()
        build = refresh or not ranked
        con = self._con.cursor()
        try:
            con.execute("BEGIN TRANSACTION")
            if not build:
                build = not self._belongs(con)
            if not build and indexed and with_runs:
                con.execute("COMMIT")
                return
            if build:
                self.validate(con)
                con.execute(
                    f"CREATE OR REPLACE TABLE {self._ranks} AS "
                    f"SELECT (row_number() OVER (ORDER BY {self._order}) - 1)::BIGINT AS rank, "
                    f"{self._id} AS id, {self._score}::DOUBLE AS score FROM {self._base} "
                    "ORDER BY rank"
                )
            index = quote_identifier(self._rank_index)
            con.execute(f"CREATE UNIQUE INDEX IF NOT EXISTS {index} ON {self._ranks} (rank)")
            if build or not with_runs:
                con.execute(
                    f"CREATE OR REPLACE TABLE {self._runs} AS SELECT min(rank) AS first_rank, "
                    f"score FROM {self._ranks} GROUP BY score ORDER BY first_rank"
                )
            if build:
                self._write_base_extras(con)
                self._stamp(con)  # with the counts of the base and its runs
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        finally:
            con.close()
        if build:
            self._proven_oid = self._stamped_oid

    def _belongs(self, con: duckdb.DuckDBPyConnection) -> bool:
        """For prepare() without refresh, in its transaction: whether the existing copy belongs
        to the table (keep it) or not (rebuild it). A copy prepare() did not build is refused."""
        stored, oid, ddl, rows = self._facts(con)
        why = self._mismatch(stored, ddl, rows)
        if why == NOT_BUILT:
            raise RankTableMismatchError(
                f"{self.where}: a table named {self.rank_table!r} exists but prepare() did not "
                "build it (no fingerprint): drop it, pass another rank_table name, or call "
                "prepare(refresh=True) to replace it"
            )
        if self._proven_oid is not None and oid == self._proven_oid:
            return why is None or why.startswith(ROWS_DIFFER)  # the same table, maybe stale
        if why is not None:
            return False
        self._proven_oid = None  # not proven: compare the copy with the table
        if self._copy_differs(con):
            return False
        self._proven_oid = oid
        return True

    # ----- refresh by delta (adapters/duckdb_delta.py) ------------------------------------------
    def _names(self) -> DeltaNames:
        q = self._prefix
        return DeltaNames(
            base=self._ranks,
            shadow=q + quote_identifier(self.shadow_table),
            delta=q + quote_identifier(self.delta_table),
            skip=q + quote_identifier(self.skip_table),
            table=self._base,
            id=self._id,
            score=self._score,
            collate=self._collate,
            runs=self._runs,
        )

    def _has_delta_layout(self, cursor: duckdb.DuckDBPyConnection | None = None) -> bool:
        """Whether the rank table, its shadow and the delta and skip tables all exist (one
        catalog lookup, which cannot abort a transaction)."""
        con = cursor or self._con
        names = [self.rank_table, self.shadow_table, self.delta_table, self.skip_table]
        found = con.execute(
            "SELECT count(DISTINCT lower(table_name)) FROM duckdb_tables() "
            "WHERE database_name = current_database() "
            "AND lower(schema_name) = lower(coalesce($schema, current_schema())) "
            "AND lower(table_name) IN (SELECT lower(unnest($names)))",
            {"schema": self.schema, "names": names},
        ).fetchone()[0]
        return int(found) == len(names)

    def _write_base_extras(self, con: duckdb.DuckDBPyConnection) -> None:
        """With a new base, in its transaction: its shadow and an empty delta. Only for a table
        (a view has no row order to keep a shadow in: its refresh is a full rebuild)."""
        is_table = con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
            "AND lower(schema_name) = lower(coalesce($schema, current_schema())) "
            "AND lower(table_name) = lower($table)",
            {"schema": self.schema, "table": self.table},
        ).fetchone()[0]
        if not is_table:
            return
        names = self._names()
        con.execute(shadow_sql(names))
        for statement in empty_delta_sql(names):
            con.execute(statement)

    def _attach_delta(self, run: _Run) -> None:
        """Give the run a view of the delta if it is non-empty: then m counts it, positions are
        not ranks and there are no runs of tied scores (adapters/duckdb_delta.py)."""
        sizes, self._delta_sizes = self._delta_sizes, None  # counted with m by _counts()
        names = self._names()
        if sizes is None:
            if not self._has_delta_layout(run.cursor):
                return
            self._delta_tables_seen = True
            try:
                sizes = run.cursor.execute(
                    f"SELECT (SELECT count(*) FROM {names.delta}), "
                    f"(SELECT count(*) FROM {names.skip}), (SELECT gen FROM {names.delta} LIMIT 1)"
                ).fetchone()
            except duckdb.CatalogException:
                self._delta_tables_seen = False
                raise AccessError(
                    f"the delta tables of {self.where} are gone: run "
                    "prepare(refresh=True, full=True)"
                ) from None
        delta, skip, gen = sizes
        if delta or skip:
            cache = self._delta_cache
            if not self._text_ids and delta <= CACHE_MAX_ROWS and gen is not None:
                if cache is None or cache.gen != gen:  # once per delta generation
                    cache = load_cache(run.cursor, names, int(gen), run.runs is not None)
                    self._delta_cache = cache
            else:
                cache = None
            run.delta = DeltaView(run.cursor, names, run.m, int(delta), int(skip), run.runs, cache)
            run.m, run.runs = run.delta.m, None

    @property
    def positions_are_ranks(self) -> bool:
        """False while a delta is pending: positions are then base ranks, moved and appended
        (adapters/duckdb_delta.py), not ranks of the canonical order; False in oblivious reads
        of a table read as it is now (rowid slots: adapters/duckdb_live.py)."""
        run = self._state()
        return run.delta is None and not run.slots

    def read_position_scores(self, positions: np.ndarray) -> tuple[np.ndarray, int, int] | None:
        """PositionScores: while a delta is pending, scores at positions without their rows
        (the delta's, else the base's runs of tied scores); None otherwise (read the rows)."""
        delta = self._state().delta
        if delta is None:
            return None
        return delta.read_position_scores(np.asarray(positions, dtype=np.int64))

    def refresh(self) -> RefreshReport:
        """Bring the copy up to date after writes to the table, at about the cost of one scan.

        One pass over the table finds the changed rows (score changed, inserted, deleted) and
        writes them into a small delta, merged with the base on read; past `fold_fraction` of m
        (default 5%) the delta is folded into a new base by a full rebuild instead. Without a
        base (or with one built before deltas existed) this is a full build. One transaction:
        runs in progress keep their snapshot. Returns what was done (also `last_refresh`).
        """
        if self._run is not None:
            raise RuntimeError("refresh() cannot run inside snapshot()")
        if not self._has_delta_layout():
            self.prepare(refresh=True, full=True)
            self.last_refresh = RefreshReport("build", m=self.domain_size())
            return self.last_refresh
        con = self._con.cursor()
        job = DeltaRefresh(con, self._names(), self.where)
        try:
            con.execute("BEGIN TRANSACTION")
            keep = job.find_changes(self.fold_fraction)
            if keep:
                job.write_delta()
                self._stamp(con)  # the table's row count as this refresh saw it
            con.execute("COMMIT" if keep else "ROLLBACK")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        finally:
            con.close()
        if keep:
            self._proven_oid = self._stamped_oid
        else:
            self.prepare(refresh=True, full=True)
            job.report.kind = "fold"
            job.report.delta_rows = job.report.skip_rows = 0
            job.report.m = self.domain_size()
        self.last_refresh = job.report
        return job.report

    # ----- the Source protocol ------------------------------------------------------------------
    @contextmanager
    def oblivious_reads(self) -> Iterator[None]:
        """access.ObliviousReads: runs opened inside name the items of a table read as it is
        now by rowid slot, so that the sorted batch is one top-d query and the random batch one
        rowid semi-join, each of a size fixed by d (adapters/duckdb_live.py); the copy's reads
        have fixed sizes already."""
        saved, self._oblivious = self._oblivious, True
        try:
            yield
        finally:
            self._oblivious = saved

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """One transaction on a connection of its own: every read of the run sees one state."""
        if self._run is not None:  # nested: the outer snapshot already holds the transaction
            yield
            return
        cursor = self._con.cursor()
        try:
            if not self.frozen:  # no cheap proof that a copy is current: read the table now
                cursor.execute("BEGIN TRANSACTION READ ONLY")
                self._run = self._live_run(cursor)
                try:
                    yield
                finally:
                    self._run = None
                cursor.execute("COMMIT")
                return
            # Where this object last saw the copy whole, the transaction begins in the same
            # statement as the run's first query (the catalog scan of the fingerprint).
            begun = self._seen_prepared
            counted = self._counts_if_prepared(cursor, begin=True)
            if not begun:
                cursor.execute("BEGIN TRANSACTION READ ONLY")
            if counted is not None:  # as last seen: rank table, its index and runs table
                ranked = indexed = True
                m, runs = counted
            else:
                ranked, indexed, with_runs = self._catalog(cursor)
                self._seen_prepared = ranked and indexed and with_runs
                if ranked:
                    m, runs = self._counts(cursor, with_runs)
                else:
                    warnings.warn(
                        f"{self.where} has no rank table: every read is a full scan; "
                        "call prepare()",
                        stacklevel=3,
                    )
                    m, runs = self.validate(cursor), None
            self._run = _Run(cursor, ranked, m, indexed, runs)
            if ranked:
                self._attach_delta(self._run)
                if self._run.delta is None:  # the planner's probe, without a range read
                    self._run.head = self._mark.head
            try:
                yield
            finally:
                self._run = None
        finally:
            # Closing the connection ends its read-only transaction (a rollback, which for a
            # transaction that wrote nothing is a commit): one statement fewer a run.
            cursor.close()

    def _counts_if_prepared(
        self, cursor: duckdb.DuckDBPyConnection, begin: bool = False
    ) -> tuple[int, int] | None:
        """(m, runs) without the catalog lookup of the index (about 0.3 ms), if this object last
        saw the rank table, its index and the runs table; None if it did not, or if the rank or
        runs table is gone (the catalog scan of `_counts` tells). `begin`: that scan begins the
        transaction (where this object saw them)."""
        if not self._seen_prepared:
            return None
        try:
            m, runs = self._counts(cursor, True, begin)
        except _Gone:
            self._seen_prepared = self._delta_tables_seen = False
            return None
        return m, int(runs)  # type: ignore[arg-type]

    def _state(self, cursor: duckdb.DuckDBPyConnection | None = None) -> _Run:
        """The running snapshot, or a one-read state outside of one (on `cursor`, if given)."""
        if self._run is not None:
            return self._run
        con = cursor or self._con
        if not self.frozen:
            return self._live_run(con)
        ranked, indexed, with_runs = self._catalog(con)
        if not ranked:
            return _Run(con, ranked, self.validate(con), indexed)
        m, runs = self._counts(con, with_runs)
        run = _Run(con, ranked, m, indexed, runs)
        self._attach_delta(run)
        if run.delta is None:
            run.head = self._mark.head
        return run

    def _counts(
        self, con: duckdb.DuckDBPyConnection, with_runs: bool, begin: bool = False
    ) -> tuple[int, int | None]:
        """m and the number of runs of tied scores (None without a runs table), after the
        fingerprint check (`_check_fingerprint`), from one scan of the catalog: the counts of
        the base and its runs are in the fingerprint prepare() writes, the delta's sizes in the
        delta table's comment (a copy written before they were is counted: one more query).
        Raises _Gone where the rank table (or the runs table, `with_runs`) is not there.
        `begin`: the catalog scan begins a read-only transaction, in the same statement."""
        delta, skip = self.delta_table.lower(), self.skip_table.lower()
        layout = (self.shadow_table.lower(), delta, skip)
        stored, oid, ddl, rows, present = self._lookup(
            con,
            full=self._proven_oid is None,
            also=(self.rank_table, self.runs_table, self.shadow_table, delta, skip),
            begin=begin,
        )
        if self.rank_table.lower() not in present or (
            with_runs and self.runs_table.lower() not in present
        ):
            raise _Gone
        self._check_fingerprint(stored, oid, ddl, rows)
        recorded = self._mark_of(stored).counts
        self._delta_tables_seen = seen = all(name in present for name in layout)
        sizes = parse_delta_comment(present.get(delta)) if seen else (0, 0, None)
        parts = []
        if recorded is None:
            runs = f"(SELECT count(*) FROM {self._runs})" if with_runs else "NULL"
            parts.append(f"(SELECT count(*) FROM {self._ranks}), {runs}")
        if sizes is None:  # a delta written before its comment held its sizes
            names = self._names()
            parts.append(
                f"(SELECT count(*) FROM {names.delta}), (SELECT count(*) FROM {names.skip}), "
                f"(SELECT gen FROM {names.delta} LIMIT 1)"
            )
        counted = list(con.execute(f"SELECT {', '.join(parts)}").fetchone()) if parts else []
        if recorded is None:
            m, count = counted[:2]
            counted = counted[2:]
        else:
            m, count = recorded
        self._delta_sizes = sizes if sizes is not None else tuple(counted)
        return int(m), None if count is None or not with_runs else int(count)

    # ----- the fingerprint: does the rank table belong to this table? ---------------------------
    # DuckDB has no lasting table identity (catalog oids are handed out again when a database is
    # reopened: a re-created table can get its predecessor's), so the fingerprint prepare()
    # writes on the rank table (its comment) holds what a run can check cheaply: the mark of
    # prepare(), a hash of the table's definition (its CREATE statement) and, for a table (not
    # a view), its row count. Each run checks them in a first query of its own (a catalog
    # lookup, and a count from metadata: 0.9 ms a run, measured at m = 10^6 on a shared
    # machine). Once this object built or verified the copy, the
    # table's oid in this open database proves it is the same table: a re-created
    # one is refused, and rows written since are the copy's contract (not seen until a
    # refresh). Before that, a row count other than the recorded one is refused (a stale copy
    # cannot be told from another table's). What a run cannot see: a table re-created with the
    # same definition and row count in another process or before a reopen, and score updates
    # since the last prepare() or refresh (the copy's contract). prepare() closes the first
    # gap: unless this object built or verified the copy, it compares the copy with the table
    # (one scan) and rebuilds it if they differ.
    _WHERE_SCHEMA = (
        "database_name = current_database() "
        "AND lower(schema_name) = lower(coalesce($schema, current_schema()))"
    )

    def _lookup(
        self,
        con: duckdb.DuckDBPyConnection,
        full: bool,
        also: Sequence[str] = (),
        begin: bool = False,
    ) -> tuple[Any, ...]:
        """(stored fingerprint, table's oid, table's definition, table's row count, the comments
        of the tables `also` (in the rank table's schema) that exist, by lower-case name): one
        plain scan of the catalog's
        tables (about 0.2 ms; filters, functions and aggregates in it cost several times more),
        filtered here. Once the copy is proven to this object (`full` False), the table's oid
        settles its identity (an ALTER keeps it; the copy stays the snapshot it was): the mark
        and the oid only. Before that, also the definition (a view's from the catalog's views) and,
        for a table, the row count (from metadata). `begin`: the same statement begins a
        read-only transaction first (the scan of the catalog cannot fail and abort it)."""
        home = self._home()
        names = (self.rank_table.lower(), self.table.lower(), *(n.lower() for n in also))
        wanted = set(names)
        # A filter in the query costs more than the scan itself on a small catalog (0.25 ms
        # against 0.2 ms at 40 tables): filtered here while the last scan was small.
        where = ""
        if self._catalog_rows > CATALOG_SCAN_MAX:
            where = f" WHERE lower(table_name) IN ({', '.join(_literal(n) for n in names)})"
        listed = con.execute(
            ("BEGIN TRANSACTION READ ONLY; " if begin else "")
            + "SELECT database_name, schema_name, table_name, table_oid, comment, "
            # the definition only where it is compared (its text is built per table)
            + ("sql" if full else "NULL AS sql")
            + f" FROM duckdb_tables(){where}"
        ).fetchall()
        if not where:
            self._catalog_rows = len(listed)
        found = {
            name.lower(): (oid, comment, sql_text)
            for database, schema, name, oid, comment, sql_text in listed
            if name.lower() in wanted and (database, schema.lower()) == home
        }
        stored = found.get(names[0], (None, None, None))[1]
        oid, _, definition = found.get(names[1], (None, None, None))
        rows = None
        if full:
            if self._is_view():  # a view's row count is its query: not kept
                definition = con.execute(
                    f"SELECT sql FROM duckdb_views() WHERE {self._WHERE_SCHEMA} "
                    "AND lower(view_name) = lower($table)",
                    {"schema": self.schema, "table": self.table},
                ).fetchone()[0]
            else:
                rows = con.execute(f"SELECT count(*) FROM {self._base}").fetchone()[0]
        extra = {name: found[name][1] for name in names[2:] if name in found}
        return stored, oid, definition, rows, extra

    def _home(self) -> tuple[str, str]:
        """(database, lower-case schema) of the table, looked up once."""
        if not hasattr(self, "_home_names"):
            database, schema = self._con.execute(
                "SELECT current_database(), lower(coalesce(?, current_schema()))", [self.schema]
            ).fetchone()
            self._home_names = (database, schema)
        return self._home_names

    def _is_view(self) -> bool:
        """Whether the table is a view (its row count is a query, not kept in the fingerprint)."""
        if not hasattr(self, "_view"):
            self._view = bool(
                self._con.execute(
                    f"SELECT count(*) FROM duckdb_views() WHERE {self._WHERE_SCHEMA} "
                    "AND lower(view_name) = lower($table)",
                    {"schema": self.schema, "table": self.table},
                ).fetchone()[0]
            )
        return self._view

    def _mark_of(self, stored: str | None) -> _Mark:
        """The rank table's comment parsed, kept while the comment stays the same."""
        if self._mark.stored != stored or stored is None:
            self._mark = _parse_mark(stored)
        return self._mark

    def _fingerprint_of(self, ddl: str | None, rows: int | None) -> dict[str, Any]:
        digest = hashlib.sha1((ddl or "").encode("utf-8")).hexdigest()[:16]
        return {"definition": digest, "rows": None if rows is None else int(rows)}

    def _mismatch(self, stored: str | None, ddl: str | None, rows: int | None) -> str | None:
        """Why the stored fingerprint does not fit the table (None when it fits): not built by
        prepare(), another definition, or (checked by the caller where it matters) another row
        count."""
        recorded = self._mark_of(stored).recorded
        if recorded is None:
            return NOT_BUILT
        current = self._fingerprint_of(ddl, rows)
        if recorded.get("definition") != current["definition"]:
            return "the table's definition changed, or it is an earlier table of this name"
        if current["rows"] is not None and recorded.get("rows") != current["rows"]:
            return (
                f"{ROWS_DIFFER} {recorded.get('rows')} rows and the table has {current['rows']}: "
                "rows were added or removed since, or the table was re-created"
            )
        return None

    def _check_fingerprint(
        self, stored: str | None, oid: int | None, ddl: str | None, rows: int | None
    ) -> None:
        """Raise RankTableMismatchError unless the rank table fits the table (see above). Once
        this object built or verified the copy, the table's oid proves it is the same table, and
        rows written since are the copy's contract (not seen until a refresh); before that, a
        row count other than the one recorded cannot be told from another table's."""
        if self._proven_oid is not None:  # the mark, then the oid (see _lookup)
            why = NOT_BUILT if self._mark_of(stored).recorded is None else None
            if why is None and oid != self._proven_oid:
                why = "the table was dropped and re-created since this object's prepare()"
        else:
            why = self._mismatch(stored, ddl, rows)
            if why is not None and why.startswith(ROWS_DIFFER):
                why += "; call prepare() to compare the copy with the table"
        if why is not None:
            raise RankTableMismatchError(
                f"{self.where}: the rank table {self.rank_table!r} does not belong to this table "
                f"({why}): call prepare(refresh=True)"
            )

    def _facts(self, con: duckdb.DuckDBPyConnection) -> tuple[Any, ...]:
        """(stored fingerprint, oid, definition, row count) in `con`'s transaction."""
        return self._lookup(con, full=True)[:4]

    def _stamp(self, con: duckdb.DuckDBPyConnection) -> None:
        """Write the fingerprint of the table, as `con`'s transaction sees it, on the rank
        table (its comment), with a new build mark, the counts of the base and of its runs
        of tied scores, and the base's first HEAD_ROWS rows (what a run reads instead of
        counting or reading them)."""
        _, oid, ddl, rows = self._facts(con)
        base, runs = con.execute(
            f"SELECT (SELECT count(*) FROM {self._ranks}), (SELECT count(*) FROM {self._runs})"
        ).fetchone()
        mark = {
            **self._fingerprint_of(ddl, rows),
            "build": uuid.uuid4().hex,
            "base": int(base),
            "runs": int(runs),
        }
        head = self._head_of(con)
        if head is not None:
            mark["head"] = head
        text = FINGERPRINT_TAG + " " + json.dumps(mark, sort_keys=True)
        con.execute(f"COMMENT ON TABLE {self._ranks} IS {_literal(text)}")
        self._stamped_oid = oid

    def _head_of(self, con: duckdb.DuckDBPyConnection) -> dict[str, Any] | None:
        """The base's first HEAD_ROWS rows for the fingerprint: {"dtype", "ids", "scores"}
        (ranks 0, 1, ...), or None where the ids are neither integers nor text, or too long."""
        got = _rows(
            con.execute(
                f"SELECT rank, id, score FROM {self._ranks} WHERE rank < {HEAD_ROWS} ORDER BY rank"
            ).fetchnumpy()
        )
        if not np.array_equal(got.positions, np.arange(len(got))):
            return None
        ids = got.ids
        if ids.dtype.kind in "iu":
            dtype = ids.dtype.str
        elif ids.dtype == object and all(type(v) is str for v in ids.tolist()):
            if sum(len(v) for v in ids.tolist()) > HEAD_TEXT_MAX:
                return None
            dtype = "text"
        else:
            return None
        return {"dtype": dtype, "ids": ids.tolist(), "scores": got.scores.tolist()}

    def verify_rank_table(self) -> None:
        """Raise RankTableMismatchError unless the rank table's fingerprint fits the table (what
        a run checks; see the comment above `_WHERE_SCHEMA`)."""
        stored, oid, ddl, rows = self._facts(self._con)
        self._check_fingerprint(stored, oid, ddl, rows)

    def _ranked_source(self, ranked: bool) -> str:
        """A relation (rank, id, score) in canonical order: the rank table, or computed."""
        if ranked:
            return self._ranks
        return (
            f"(SELECT (row_number() OVER (ORDER BY {self._order}) - 1)::BIGINT AS rank, "
            f"{self._id} AS id, {self._score}::DOUBLE AS score FROM {self._base})"
        )

    def domain_size(self) -> int:
        return self._state().m

    def serves_copy(self) -> bool:
        """Whether a run started now reads the rank-ordered copy (only where the table is
        frozen: DuckDB has no cheap proof that a copy is current) rather than the table."""
        return self._state().ranked

    def read_sorted(self, start: int, count: int) -> Rows:
        run = self._state()
        if run.delta is not None:
            return run.delta.read_sorted(start, count)
        start, stop = int(start), min(int(start) + int(count), run.m)
        if stop <= start:
            return _rows({"rank": [], "id": [], "score": []})
        if run.slots:
            return self._slot_sorted(run, start, stop - start)
        if run.ranked:
            head = run.head  # the first rows, from the fingerprint the run's first query read
            if head is not None and stop <= len(head):
                return Rows(
                    head.positions[start:stop],
                    head.ids[start:stop],
                    head.scores[start:stop],
                    round_trips=0,
                )
            # The copy is written in rank order, so row ids are ranks: a row id range is a plain
            # range scan. (A predicate on rank from 0 would go through the ART index, row by row,
            # at about 4 us a row.) The ranks that come back prove it; if they ever did not, the
            # read falls back to the rank predicate. No ORDER BY: _rows() sorts if needed.
            query = f"SELECT rank, id, score FROM {self._ranks} WHERE rowid >= ? AND rowid < ?"
            rows = _rows(run.cursor.execute(query, [start, stop]).fetchnumpy())
            if (
                len(rows) == stop - start
                and rows.positions[0] == start
                and rows.positions[-1] == stop - 1
            ):
                return rows  # stop - start distinct ranks from start to stop - 1: all of them
            query = f"SELECT rank, id, score FROM {self._ranks} WHERE rank >= ? AND rank < ?"
            return _rows(run.cursor.execute(query, [start, stop]).fetchnumpy())
        # the score at depth stop - 1 first (a top-N on the score alone), then the canonical
        # order among the rows at or above it only: ties on a plateau are not all sorted by id
        query = (
            f"WITH cut AS (SELECT {self._score} AS s FROM {self._base} "
            f"ORDER BY {self._score} DESC LIMIT 1 OFFSET ?) "
            f"SELECT {self._id} AS id, {self._score}::DOUBLE AS score FROM {self._base} "
            f"WHERE {self._score} >= (SELECT s FROM cut) ORDER BY {self._order} LIMIT ? OFFSET ?"
        )
        result = run.cursor.execute(query, [stop - 1, stop - start, start]).fetchnumpy()
        result["rank"] = np.arange(start, start + len(result["score"]), dtype=np.int64)
        return _rows(result)

    def score_run_count(self) -> int | None:
        """ScoreRuns: how many runs of tied scores the runs table holds (None without one)."""
        return self._state().runs

    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        """ScoreRuns: (first rank, score) of every run of tied scores, in rank order."""
        run = self._state()
        got = run.cursor.execute(
            f"SELECT first_rank, score FROM {self._runs} ORDER BY first_rank"
        ).fetchnumpy()
        return np.asarray(got["first_rank"], dtype=np.int64), np.asarray(got["score"], float)

    def read_positions(self, ranks: np.ndarray) -> Rows:
        run = self._state()
        wanted = plain_values(np.asarray(ranks, dtype=np.int64))
        if not wanted:
            return _rows({"rank": [], "id": [], "score": []})
        if run.delta is not None:
            return run.delta.read_positions(wanted, INDEX_LOOKUP_MAX if run.indexed else 0)
        if run.slots:
            return self._slot_rows(run, wanted)
        source = self._ranked_source(run.ranked)
        if run.indexed and len(wanted) <= INDEX_LOOKUP_MAX:
            # The ART index on rank serves an IN list of constants key by key (about 25 us a key
            # at m = 10^7); a longer list is cheaper as one scan of the rank column.
            keys = ", ".join(str(int(r)) for r in wanted)
            query = f"SELECT rank, id, score FROM {source} WHERE rank IN ({keys})"
            return _rows(run.cursor.execute(query).fetchnumpy())
        query = (
            f"SELECT r.rank, r.id, r.score FROM {source} AS r "
            "WHERE r.rank IN (SELECT unnest(?::BIGINT[]))"
        )
        return _rows(run.cursor.execute(query, [wanted]).fetchnumpy())

    def read_oneshot(self, noise: KeyedNoise, k: int) -> Rows:
        """InStoreOneShot: the k rows of largest score + keyed noise (topk_middleware/
        keyed_noise.py), best first, ties by smaller position, in one query. The key and the
        exceedances are query parameters; SHA-256 of "key:position" gives each item its uniform
        (the PRF assumption)."""
        run = self._state()
        if run.live:
            self.last_oneshot_reads = "the view" if not run.rowids else "the table"
            return self._live_oneshot(run, noise, k)
        if run.table is not None:  # frozen with a pending delta: the table itself is cheaper
            self.last_oneshot_reads = "the table"  # (oneshot_positions chose it)
            return self._live_oneshot(run.table, noise, k)
        self.last_oneshot_reads = "the copy" if run.delta is None else "the copy and its delta"
        if run.delta is not None:  # positions are base ranks moved and appended
            relation, position = run.delta.relation(), "position"
        else:
            relation, position = self._ranked_source(run.ranked), "rank"
        digits = f"('0x' || substr(sha256($key || ':' || r.{position}::VARCHAR), 1, 13))::UBIGINT"
        exceedances = "SELECT unnest($positions::BIGINT[]), unnest($noises::DOUBLE[])"
        query = oneshot_query(
            relation,
            position,
            noise.sql(uniform_from_hex_sql(digits + "::DOUBLE")),
            exceedances,
            noise.bound,
            "$k",
            materialized="MATERIALIZED ",
            score_cap=noise.score_cap,
        )
        params = {
            "key": noise.key,
            "k": int(k),
            "positions": noise.exceed_positions.tolist(),
            "noises": noise.exceed_noises.tolist(),
        }
        got = run.cursor.execute(query, params).fetchnumpy()
        ids = np.asarray(got["id"])
        if ids.dtype.kind in "US":
            ids = ids.astype(object)
        return Rows(
            np.asarray(got["position"], dtype=np.int64), ids, np.asarray(got["score"], float)
        )

    def read_ids(self, ids: Sequence[Any]) -> np.ndarray:
        run = self._state()
        wanted = plain_values(ids)
        if not wanted:
            return np.empty(0, dtype=np.float64)
        if run.delta is not None:
            found = dict(run.cursor.execute(run.delta.read_ids_query(), {"ids": wanted}).fetchall())
            return scores_in_order(found, wanted, self.where)
        source = self._ranks if run.ranked else self._base
        id_col, score_col = ("id", "score") if run.ranked else (self._id, self._score)
        query = (
            f"SELECT {id_col}, {score_col}::DOUBLE FROM {source} "
            f"WHERE {id_col}{self._collate} IN (SELECT unnest(?){self._collate})"
        )
        found = dict(run.cursor.execute(query, [wanted]).fetchall())
        return scores_in_order(found, wanted, self.where)

    def read_exact_scores(self, ids: Sequence[Any]) -> list[Any]:
        """ExactScores: the scores of the named items in the table's own type (BIGINT and
        HUGEINT as Python ints, DECIMAL as Decimals), read from the table in the run's
        snapshot; the rank copy holds doubles."""
        run = self._state()
        wanted = plain_values(ids)
        if not wanted:
            return []
        query = (
            f"SELECT {self._id}, {self._score} FROM {self._base} "
            f"WHERE {self._id}{self._collate} IN (SELECT unnest(?){self._collate})"
        )
        found = dict(run.cursor.execute(query, [wanted]).fetchall())
        try:
            return [found[item] for item in wanted]
        except KeyError as missing:
            raise AccessError(f"{self.where} has no item with id {missing.args[0]!r}") from None

    @property
    def reads_copy(self) -> bool:
        """Whether runs read the rank-ordered copy: only a frozen table's (module docstring);
        the others read the table as it is now and need no copy."""
        return self.frozen

    def _catalog_name(self, table: str, schema: str | None) -> tuple[str, str | None]:
        """(table, schema) as the catalog spells the table or view the name finds (DuckDB
        compares names without case): the name as given, else read as SQL reads it
        (`"T"`, `main."t"`: _sql.sql_name_spellings). So every spelling of one table derives
        one rank table. A name that finds nothing, or more than one, is kept as given
        (validation says so). Cost: one catalog query a spelling."""
        for spelled_schema, spelled in sql_name_spellings(table, schema):
            found = self._con.execute(
                "SELECT DISTINCT schema_name, name FROM (SELECT database_name, schema_name, "
                "table_name AS name FROM duckdb_tables() UNION ALL SELECT database_name, "
                "schema_name, view_name FROM duckdb_views() WHERE NOT internal) "
                "WHERE database_name = current_database() AND lower(name) = lower($name) AND "
                "lower(schema_name) = lower(coalesce($schema, current_schema()))",
                {"name": spelled, "schema": spelled_schema},
            ).fetchall()
            if len(found) == 1:
                home, name = found[0]
                return name, (None if spelled_schema is None else home)
        return table, schema

    # ----- cleanup ------------------------------------------------------------------------------
    def uninstall(self) -> None:
        """Drop everything prepare() and refresh() made: the rank table (its ART index and
        fingerprint go with it), the runs table, and the shadow, delta and skip tables of a
        refresh by delta. The table of counts is not touched. A rank table that prepare() did
        not build (no fingerprint) is refused (RankTableMismatchError) and nothing is dropped.
        Idempotent; runs need prepare() again afterwards."""
        if self._run is not None:
            raise RuntimeError("uninstall() cannot run inside snapshot()")
        con = self._con.cursor()
        try:
            con.execute("BEGIN TRANSACTION")
            stored = self._lookup(con, full=False)[0]
            if self.has_rank_table(con):
                if stored is None or not str(stored).startswith(FINGERPRINT_TAG + " "):
                    raise RankTableMismatchError(
                        f"{self.where}: the table {self.rank_table!r} was not built by prepare() "
                        "(no fingerprint): uninstall() leaves it alone"
                    )
                for name in (
                    self.runs_table,
                    self.shadow_table,
                    self.delta_table,
                    self.skip_table,
                    self.rank_table,
                ):
                    con.execute(f"DROP TABLE IF EXISTS {self._prefix}{quote_identifier(name)}")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        finally:
            con.close()
        self._seen_prepared = False
        self._proven_oid = None
        self._delta_tables_seen = False
        self._delta_sizes = None
        self._delta_cache = None

    def close(self) -> None:
        """Close the connection if this object opened it."""
        if self._owns_connection:
            self._con.close()


def _rows(result: dict[str, Any]) -> Rows:
    """Rows in rank order from DuckDB's columns."""
    ranks = np.asarray(result["rank"], dtype=np.int64)
    ids = np.asarray(result["id"])
    if ids.dtype.kind in "US":
        ids = ids.astype(object)
    scores = np.asarray(result["score"], dtype=np.float64)
    if len(ranks) > 1 and not bool(np.all(ranks[1:] > ranks[:-1])):
        order = np.argsort(ranks, kind="stable")
        ranks, ids, scores = ranks[order], ids[order], scores[order]
    return Rows(ranks, ids, scores)


class _Gone(Exception):
    """The rank table (or its runs table) is not in the catalog of this snapshot."""


@dataclass(frozen=True)
class _Mark:
    """A rank table's comment, parsed: the fingerprint prepare() wrote (None: not one), the
    counts of the base and of its runs (None where it was written before it recorded them),
    and the base's first rows (None where it holds none)."""

    stored: str | None
    recorded: dict[str, Any] | None = None
    counts: tuple[int, int] | None = None
    head: Rows | None = None


def _parse_mark(stored: str | None) -> _Mark:
    """The fingerprint in a rank table's comment (DuckDBTable._stamp)."""
    if stored is None or not stored.startswith(FINGERPRINT_TAG + " "):
        return _Mark(stored)
    try:
        recorded = json.loads(stored[len(FINGERPRINT_TAG) + 1 :])
    except ValueError:
        return _Mark(stored)
    if not isinstance(recorded, dict):
        return _Mark(stored)
    try:
        counts: tuple[int, int] | None = (int(recorded["base"]), int(recorded["runs"]))
    except (KeyError, TypeError, ValueError):
        counts = None
    return _Mark(stored, recorded, counts, _head_rows(recorded.get("head")))


def _head_rows(head: Any) -> Rows | None:
    """The base's first rows as the fingerprint holds them (DuckDBTable._head_of), as a range
    read of the rank table would give them; None where they are missing or malformed."""
    try:
        ids, scores, dtype = head["ids"], head["scores"], head["dtype"]
        if len(ids) != len(scores):
            return None
        if dtype == "text":
            if not all(type(v) is str for v in ids):
                return None
            id_array = np.empty(len(ids), dtype=object)
            id_array[:] = ids
        else:
            kind = np.dtype(dtype)
            if kind.kind not in "iu":
                return None
            id_array = np.asarray(ids, dtype=kind)
        values = np.asarray(scores, dtype=np.float64)
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    id_array.setflags(write=False)
    values.setflags(write=False)
    return Rows(np.arange(len(ids), dtype=np.int64), id_array, values, round_trips=0)


def _literal(text: str) -> str:
    """A DuckDB string literal (quotes doubled)."""
    return "'" + text.replace("'", "''") + "'"
