"""PostgresBase: what live mode (live_mode.py) shares with the PostgreSQL store: one psycopg
connection (opened and owned from a conninfo string, reconnected when lost; or the caller's),
the table's name as the catalog spells it, its columns checked, validate(), and runs as one
REPEATABLE READ READ ONLY transaction each.

Copy mode is the SQL store engine (adapters/sql/) over the PostgreSQL dialect
(adapters/dialects/postgres/) and the psycopg driver (copy_mode.py). Live mode keeps its own
position keeper here until it moves onto the engine too; this base holds
only what that keeper reads.

Size: one class whose methods share one connection and one snapshot (live mode's base).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from adapters._sql import (
    HIDE_STATISTICS,
    TableFacts,
    may_hide_statistics_sql,
    plain_values,
    raise_if_invalid,
    sql_name_spellings,
)
from adapters.dialects.postgres import MAX_ID_BYTES, SCORE_TYPES, UNORDERED_ID_TYPES, seq_scans
from adapters.dialects.postgres.costs import STORE_COSTS
from topk_middleware.access import AccessError, StoreCosts, StoreTraits
from topk_middleware.privacy import resolve_declared
from topk_middleware.validation import first_line

from ..contributions import parse_record

_seq_scans = seq_scans


def _close_quietly(cursor: Any) -> None:
    """Close a run's server-side cursor after its transaction ended (psycopg then sends no
    CLOSE: the transaction's end closed it)."""
    if cursor is not None and not cursor.closed:
        try:
            cursor.close()
        except psycopg.Error:
            pass  # the connection is broken: nothing is left to close


class _Refresh(Exception):
    """Raised while a run opens: rebuild what the run reads (outside the run's transaction)
    and open the run again."""


class PostgresBase:
    """A histogram held in a PostgreSQL table, one row per item of the public domain, read
    through psycopg (module docstring): the connection, the names, the checks and the run's
    transaction of live mode (`PostgresTable(..., mode="live")`). `conninfo_or_connection` is a
    libpq connection string (this object opens and owns an autocommit connection) or a psycopg
    Connection not inside a transaction. Identifiers are composed with psycopg.sql."""

    reads_copy = True  # the CLI prepares before a run (live mode: the positions)

    def __init__(
        self,
        conninfo_or_connection: str | psycopg.Connection[Any],
        table: str,
        id: str = "id",
        score: str = "score",
        *,
        schema: str | None = None,
        mode: str = "live",
        sensitivity: float | None = None,
        max_items_per_client: int | None = None,
        frozen: bool = False,
    ) -> None:
        if not isinstance(frozen, bool):
            raise TypeError(f"frozen must be True or False, got {frozen!r}")
        self.mode = mode
        self.frozen = frozen
        resolve_declared(
            sensitivity, max_items_per_client, None, "PostgreSQL table"
        )  # bad: refused
        self._oblivious = False  # inside oblivious_reads(): no probe of the runs of ties
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
        self._run: Any = None
        try:  # every name below comes from the catalog's spelling of the table
            table, schema = self._catalog_name(table, schema)
        except BaseException:
            if self._owns_connection:
                self._conn.close()
            raise
        self.table, self.id_column, self.score_column, self.schema = table, id, score, schema
        self._base = sql.Identifier(table) if schema is None else sql.Identifier(schema, table)
        self._id = sql.Identifier(id)
        self._score = sql.Identifier(score)
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

    reads_copy = True  # runs read the rank-ordered copy where it is current (freshness)

    def _sample_ids(self, cur: psycopg.Cursor[Any]) -> list[Any]:
        return [
            row[0]
            for row in cur.execute(
                sql.SQL("SELECT {} FROM {} LIMIT 3").format(self._id, self._base)
            ).fetchall()
        ]

    # ----- preparation --------------------------------------------------------------------------

    # ----- the fingerprint: does the rank table belong to this table? ---------------------------

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

        Its first query (`_open_run`) may ask for what the run reads to be rebuilt first
        (_Refresh: prepare(refresh=True), then the run opens again). A connection lost before
        the run read anything is opened again once (where this object owns it); one lost during
        the run gives a ConnectionError, and the next run reconnects."""
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

    def _state(self) -> Any:
        """The run in progress, or (outside a run) one opened and closed for the question."""
        if self._run is not None:
            return self._run
        with self.snapshot():
            return self._run  # type: ignore[return-value]

    def run_freshness(self) -> dict[str, Any] | None:
        """How the run in progress knew its data current (access.run_freshness): whether the
        copy was proven current, and if not why, what the run read and what each way was
        priced at. Operator diagnostics (result.diagnostics.plan["freshness"])."""
        return None if self._run is None else dict(getattr(self._run, "freshness", {}) or {})

    @property
    def store_costs(self) -> StoreCosts:
        """The measured costs of PostgreSQL's reads (adapters/dialects/postgres/costs.py)."""
        return STORE_COSTS

    def traits(self) -> StoreTraits:
        """access.StoreTraits: the declared sensitivity and bound, the score column's type."""
        return StoreTraits(self.sensitivity, self.max_items_per_client, self.integer_scores)

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
