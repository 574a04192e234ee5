"""PostgreSQL as a dialect of the SQL store engine (adapters/sql/): what differs, and only that.

One dialect over every driver that reaches PostgreSQL (psycopg, an SQLAlchemy Engine, and SPI
inside the server): the SQL is written once here and in the modules beside it.

* names: identifiers double-quoted; a table's name resolved as the catalog spells it (the name
  as given, else read as SQL reads it: `T`, `public."t"`; adapters/_sql.sql_name_spellings),
  each spelling through to_regclass and the search path, the schema made explicit;
* catalog: columns from pg_attribute (scores of a numeric type, ids of any type with an
  equality and an order; text ids compared with COLLATE "C", in byte order), the table's
  comment (from_votes' record);
* from_votes' counts (adapters/sql/votes.py) in the same words through psycopg and SQLAlchemy:
  ids matched in byte order, the keyed hash sha256() of the UTF-8 bytes, a table (not a view)
  where pg_class says so;
* the copy (copies.NamedCopy): `CREATE TABLE .. AS` in canonical order with NOT NULL and CHECK
  constraints and unique B-trees on rank and id, its runs table (run, first_rank, score),
  its record in the rank table's comment, its fingerprint the identity (oid) of the table and
  of the rank table and the number and type of the id and score columns (a table dropped and
  re-created, or a rank table not built by prepare(), gives another); a refresh beside it,
  swapped in under lock_timeout; concurrent prepares serialised by a session advisory lock;
  statement_timeout and client_connection_check_interval (PostgreSQL >= 14) on prepare()'s
  statements;
* freshness: the write log of writes.py (statement triggers), and the change log of
  changes.py a stale copy is read around (adapters/sql/around.py);
* reads: runs in REPEATABLE READ READ ONLY transactions; sorted reads of at least
  PACKED_MIN_ROWS rows with integer ids, and many runs of ties, packed by the server into one
  bytea per column (int8send / float8send) and unpacked by numpy; arrays bound as one text
  parameter (`{1,2,3}`, cast), or in binary where the driver sends int8 arrays so; the keyed
  uniform from sha256(); oblivious runs hide their reads from the statistics views where the
  role may set track_counts, and pin their plans (oblivious.py);
* EXPLAIN (FORMAT JSON) for check(), with sequential scans off; the measured costs;
* a live table's reads by id and by position, its oblivious reads and keyset pages, for psycopg
  and SPI alike (live_reads.py); SPI's driver (spi.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from adapters._sql import (
    FINGERPRINT_TAG,
    HIDE_STATISTICS,
    MAX_IDENTIFIER_BYTES,
    float_array_literal,
    int_array_literal,
    may_hide_statistics_sql,
    rows_from_records,
    sql_name_spellings,
    statistics_accepted,
    statistics_seen,
)
from adapters.sql.dialect import FLOAT, INTEGER, TEXT, Column, Dialect
from adapters.sql.driver import Driver
from adapters.sql.freshness import WriteLog
from topk_middleware.access import Rows, StoreCosts
from topk_middleware.keyed_noise import oneshot_query, uniform_from_hex_sql
from topk_middleware.mechanisms.oblivious import ObliviousCosts

from . import changes, oblivious, tables, writes
from .costs import (
    OBLIVIOUS_COSTS,
    STALE_OBLIVIOUS_COSTS,
    STORE_COSTS,
    WHOLE_READ_ALONE_ROWS,
    WHOLE_READ_ROWS,
    around_seconds,
    refresh_seconds,
    table_costs,
    table_seconds,
)

# Sorted reads of at least this many rows with integer ids come packed in one bytea per column:
# through SQLAlchemy on psycopg (load 5), 1,000 ranks 1.3 ms packed against 2.2 ms as rows,
# 10,000 7.5 against 17 ms, 20,000 14 against 35 ms; 500 1.0 against 1.3 ms.
PACKED_MIN_ROWS = 1_000
# Score column types: numbers that convert to float8 (money and oid are 'N' types, not counts).
SCORE_TYPES = ("smallint", "integer", "bigint", "real", "double precision", "numeric")
INTEGER_TYPES = ("smallint", "integer", "bigint")
# Id column types without a B-tree order (no count(DISTINCT), no index): refused.
UNORDERED_ID_TYPES = ("json", "xml", "point", "line", "lseg", "box", "path", "polygon", "circle")
# Longest text id (bytes) the unique B-tree on id takes with room to spare (its limit is
# about 2,700 bytes per entry after compression).
MAX_ID_BYTES = 2000
# SQLSTATEs the engine tells apart.
LOCK_NOT_AVAILABLE, QUERY_CANCELED, INSUFFICIENT_PRIVILEGE = "55P03", "57014", "42501"
KEYED_DIGITS = (
    "(('x' || encode(substring(sha256((:{key} || ':' || {position})::bytea) FROM 1 FOR 7), "
    "'hex'))::bit(56)::bigint >> 4)::float8"
)
literal = writes.literal


def short_name(base: str, suffix: str) -> str:
    """`base + suffix`, or, where that passes PostgreSQL's 63-byte limit on identifiers (which
    would truncate it, possibly to `base` itself), `base` cut short, the first 8 hex digits of
    SHA-1 of the whole of it, and `suffix`."""
    name = base + suffix
    if len(name.encode("utf-8")) <= MAX_IDENTIFIER_BYTES:
        return name
    tag = "_" + hashlib.sha1(base.encode("utf-8")).hexdigest()[:8] + suffix
    head = base.encode("utf-8")[: MAX_IDENTIFIER_BYTES - len(tag)]
    return head.decode("utf-8", "ignore") + tag


class PostgresDialect(Dialect):
    """PostgreSQL's SQL (module docstring). Stateless but for what it learns of the server once
    per connection (whether its role may hide statistics, and its name) and whether it warned
    that the statistics channel is open (one dialect object serves one table)."""

    name = "PostgreSQL"
    sqlalchemy_read_only = {"postgresql_readonly": True}  # noqa: RUF012
    supports_in_store_oneshot = True
    reads_tables = True
    snapshot_isolation = "REPEATABLE READ"
    max_id_bytes = MAX_ID_BYTES
    prepare_statement_timeout = 3600.0
    swap_timeout = 2.0  # short: new runs queue behind a waiting swap
    refresh_beside = True  # no dead rows left in the copy (recorded.py)
    client_check_ms = 1000
    score_types = ", ".join(SCORE_TYPES)
    id_types = "text, integers, uuid, ..."
    costs = STORE_COSTS
    whole_read_rows = WHOLE_READ_ROWS  # a table read as it is now, up to this many rows
    whole_read_alone = True  # and a run after a small one reads it alone (~1 round trip, not 5)
    whole_read_alone_rows = WHOLE_READ_ALONE_ROWS  # after a run that found the copy stale
    writes = writes  # the write log's SQL (freshness.WriteLog)
    trigger_proof = WriteLog
    changes = changes  # the change log's (around.py)
    oblivious_sql = oblivious  # oblivious reads' (adapters/sql/oblivious.py)

    def __init__(self) -> None:
        self._hides: tuple[Any, bool, str] | None = None
        self._warned = False  # warn_statistics() said so

    # ----- names and catalog --------------------------------------------------------------------
    def quote(self, name: str) -> str:
        return '"' + name.replace('"', '""') + '"'

    def resolve(self, driver: Driver, table: str, namespace: str | None) -> tuple[Any, str]:
        """(schema, table) as the catalog spells the relation the name finds (module
        docstring); a name that finds nothing is kept as given (validation refuses it). One
        catalog lookup a spelling."""
        for spelled_schema, spelled in sql_name_spellings(table, namespace):
            found = driver.one(
                "SELECT n.nspname, c.relname FROM pg_catalog.pg_class c "
                "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.oid = pg_catalog.to_regclass(:name)",
                {"name": self.qualified(spelled_schema, spelled)},
            )
            if found is not None:
                return found[0], found[1]
        return namespace, table

    def columns(self, driver: Driver, namespace: str, table: str) -> dict[str, Column] | None:
        oid = driver.scalar(
            "SELECT pg_catalog.to_regclass(:name)::oid", {"name": self.qualified(namespace, table)}
        )
        if oid is None:
            return None
        rows = driver.execute(
            "SELECT a.attname, t.typcategory, a.attcollation <> 0, "
            "format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
            "JOIN pg_type t ON t.oid = a.atttypid "
            "WHERE a.attrelid = :oid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            {"oid": oid},
        )
        out = {}
        for name, category, collatable, type_name in rows:
            if type_name in INTEGER_TYPES:
                kind = INTEGER
            elif category == "N" and type_name.startswith(SCORE_TYPES):
                kind = FLOAT
            elif collatable and category == "S":  # a string type (not an array of strings)
                kind = TEXT
            else:
                kind = type_name
            out[name] = Column(kind, type_name, type_name.split("(")[0] not in UNORDERED_ID_TYPES)
        return out

    def is_table(self, driver: Driver, namespace: Any, table: str) -> bool:
        """Whether the relation is a table (plain or partitioned), not a view: one lookup."""
        kind = driver.scalar(
            "SELECT relkind FROM pg_catalog.pg_class WHERE oid = pg_catalog.to_regclass(:name)",
            {"name": self.qualified(namespace, table)},
        )
        return kind in ("r", "p")

    def literal(self, text: str) -> str:
        return literal(text)

    def identity_fact_sql(self, qualified: str) -> str:
        """The lasting identity of a relation (its oid), as text."""
        return f"(SELECT to_regclass({literal(qualified)})::oid::text)"

    def index_names(self, driver: Driver, qualified: str) -> dict[tuple[str, ...], str]:
        """The indexes of a table by their columns (the first index of each key)."""
        rows = driver.execute(
            "SELECT i.relname, array_agg(a.attname ORDER BY k.ord) FROM pg_index x "
            "JOIN pg_class i ON i.oid = x.indexrelid CROSS JOIN LATERAL "
            "unnest(x.indkey) WITH ORDINALITY AS k(attnum, ord) JOIN pg_attribute a "
            "ON a.attrelid = x.indrelid AND a.attnum = k.attnum "
            "WHERE x.indrelid = to_regclass(:t) GROUP BY i.relname, i.oid ORDER BY i.oid",
            {"t": qualified},
        )
        out: dict[tuple[str, ...], str] = {}
        for name, columns in rows:
            out.setdefault(tuple(columns), str(name))
        return out

    def comment(self, driver: Driver, namespace: str, table: str) -> str | None:
        return driver.scalar(f"SELECT {self.comment_sql(self.qualified(namespace, table))}")

    def exists_sql(self, qualified: str) -> str:
        return f"pg_catalog.to_regclass({literal(qualified)}) IS NOT NULL"

    def comment_sql(self, qualified: str) -> str:
        return f"obj_description(to_regclass({literal(qualified)}), 'pg_class')"

    def change_names(self, t: Any, prefix: str) -> changes.ChangeNames:
        """The change table `prefix`_changes (with its sequence, tally and function) and the
        triggers `prefix`_ins, _upd, _del."""
        q = lambda name: self.qualified(t.namespace, name)  # noqa: E731
        return changes.ChangeNames(
            t.source,
            t.id_sql,
            t.score_sql,
            t.id_column,
            q(f"{prefix}_changes"),
            q(f"{prefix}_changes_seq"),
            q(f"{prefix}_changes"),
            f"{prefix}_changes",
            tuple(f"{prefix}_{op}" for op in ("ins", "upd", "del")),  # type: ignore[arg-type]
            tally=q(f"{prefix}_changes_tally"),
        )

    def text_line_sql(self, expr: str, line: int) -> str:
        return f"pg_catalog.split_part({expr}, E'\\n', {int(line)})"

    def comment_line_sql(self, qualified: str, line: int) -> str:
        return (
            "pg_catalog.split_part(pg_catalog.obj_description(pg_catalog.to_regclass("
            f"{literal(qualified)}), 'pg_class'), E'\\n', {int(line)})"
        )

    def comment_statement(self, qualified: str, text: str) -> str:
        return f"COMMENT ON TABLE {qualified} IS {literal(text)}"

    def fingerprint_sql(self, t: Any, ranks: str) -> str:
        """SQL of the copy's fingerprint (module docstring): two catalog lookups by key."""
        base, ranks = literal(t.source), literal(ranks)
        id_, score = literal(t.id_column), literal(t.score_column)
        return (
            f"concat_ws(' ', {literal(FINGERPRINT_TAG)}::text, to_regclass({base})::oid, "
            f"to_regclass({ranks})::oid, (SELECT string_agg(a.attnum || ':' || a.atttypid || "
            f"':' || a.atttypmod, ',' ORDER BY a.attname <> {id_}) FROM pg_attribute a "
            f"WHERE a.attrelid = to_regclass({base}) AND NOT a.attisdropped "
            f"AND a.attname IN ({id_}, {score})))"
        )

    # ----- fragments ----------------------------------------------------------------------------
    def byte_order(self, expr: str) -> str:
        return f'{expr} COLLATE "C"'

    def count_if(self, condition: str) -> str:
        return f"count(*) FILTER (WHERE {condition})"

    def non_finite(self, expr: str, column: Column) -> str | None:
        return f"{expr}::float8 IN ('NaN', 'Infinity', '-Infinity')"

    def beyond_double(self, expr: str, column: Column) -> str | None:
        if not column.type.startswith("numeric"):
            return None
        return f"{expr} <> 'NaN'::numeric AND abs({expr}) > 1.7976931348623157e308::numeric"

    def id_length(self, expr: str) -> str:
        return f"octet_length({expr}::text)"

    def member(self, expr: str, param: str, kind: str | None) -> str:
        if kind == INTEGER:
            return f"{expr} = ANY(CAST(:{param} AS bigint[]))"
        return f"{expr} = ANY(:{param})"

    def array_value(self, values: Any, kind: str | None, driver: Driver) -> Any:
        """bigint and float8 arrays as one text parameter (`{1,2,3}`, cast by the statement):
        the driver's list adapter would quote each element; other arrays as lists."""
        if kind == INTEGER:
            return int_array_literal(values)
        if kind == FLOAT:
            return float_array_literal(values)
        return values.tolist() if isinstance(values, np.ndarray) else list(values)

    def text(self, expr: str) -> str:
        return f"CAST({expr} AS text)"

    def keyed_hash(self, key: str, message: str) -> str | None:
        return f"sha256(convert_to({key} || {message}, 'UTF8'))"

    def keyed_uniform(self, key_param: str, position: str) -> str:
        return uniform_from_hex_sql(KEYED_DIGITS.format(key=key_param, position=position))

    def exceedances_sql(self) -> str:
        return "SELECT * FROM unnest(CAST(:positions AS bigint[]), CAST(:noises AS float8[]))"

    def oneshot_sql(self, ranks: str, noise_sql: str, bound: float, k: int, cap: float) -> str:
        """keyed_noise.oneshot_query over the rank table, the rows that can win found by binary
        search through the rank B-tree (:m); k, m, the key and the exceedances parameters."""
        return oneshot_query(
            ranks,
            "rank",
            noise_sql,
            self.exceedances_sql(),
            bound,
            ":k",
            materialized="MATERIALIZED ",
            search_m=":m",
            score_cap=cap,
        )

    # ----- DDL of the copy --------------------------------------------------------------------
    def create_rank_table(self, target: str, rows: str) -> list[str]:
        return [
            f"CREATE TABLE {target} AS SELECT rank, id, score FROM ({rows}) AS r(rank, id, score)",
            f"ALTER TABLE {target} ALTER COLUMN rank SET NOT NULL, "
            "ALTER COLUMN id SET NOT NULL, ALTER COLUMN score SET NOT NULL, "
            "ADD CHECK (score >= 0 AND score < 'Infinity'::float8)",
        ]

    def create_index_sql(
        self, index: str, table: str, column: str, *, if_missing: bool = False
    ) -> str:
        exists = "IF NOT EXISTS " if if_missing else ""
        return f"CREATE UNIQUE INDEX {exists}{self.quote(index)} ON {table} ({self.quote(column)})"

    def create_runs_table(self, target: str, ranks: str) -> list[str]:
        return [
            f"CREATE TABLE {target} (run bigint NOT NULL, first_rank bigint PRIMARY KEY, "
            "score float8 NOT NULL)",
            f"INSERT INTO {target} (run, first_rank, score) "
            "SELECT row_number() OVER (ORDER BY min(rank)) - 1, min(rank), score "
            f"FROM {ranks} GROUP BY score ORDER BY 2",
        ]

    def id_copy_type(self, column: Column) -> str:
        """The copy's id column type: text in byte order, any other type as the table's."""
        return 'TEXT COLLATE "C"' if column.kind == TEXT else column.type

    def rename_table_sql(self, qualified: str, name: str) -> str:
        return f"ALTER TABLE {qualified} RENAME TO {self.quote(name)}"

    def rename_index_sql(self, qualified: str, name: str) -> str:
        return f"ALTER INDEX {qualified} RENAME TO {self.quote(name)}"

    def analyze_sql(self, qualified: str) -> str:
        return f"ANALYZE {qualified}"

    # ----- sessions, transactions, errors -------------------------------------------------------
    @contextmanager
    def prepare_lock(self, driver: Driver, name: str) -> Iterator[None]:
        """A session advisory lock on the copy's name for the whole of prepare(): concurrent
        prepares of one copy wait for each other (released at the end, or by the server if the
        client dies)."""
        key = int.from_bytes(hashlib.sha1(name.encode("utf-8")).digest()[:8], "big", signed=True)
        with driver.transaction():
            driver.execute("SELECT pg_advisory_lock(:key)", {"key": key})
        try:
            yield
        finally:
            if not driver.lost():
                with driver.transaction():
                    driver.execute("SELECT pg_advisory_unlock(:key)", {"key": key})

    def limit_statements(self, driver: Driver, timeout: float | None) -> None:
        """For the transaction: statement_timeout, and the server's check that the client is
        still there (PostgreSQL >= 14): a dead client's work stops."""
        if timeout is not None:
            ms = str(max(1, round(timeout * 1000)))
            driver.execute("SELECT set_config('statement_timeout', :ms, true)", {"ms": ms})
        if driver.server_version >= 140000:
            driver.execute(
                "SELECT set_config('client_connection_check_interval', :ms, true)",
                {"ms": str(self.client_check_ms)},
            )

    def lock_timeout(self, driver: Driver, seconds: float | None) -> None:
        ms = "0" if seconds is None else str(max(1, round(seconds * 1000)))
        driver.execute("SELECT set_config('lock_timeout', :ms, true)", {"ms": ms})

    def lock_not_available(self, driver: Driver, error: BaseException) -> bool:
        return driver.sqlstate(error) == LOCK_NOT_AVAILABLE

    def canceled(self, driver: Driver, error: BaseException) -> bool:
        return driver.sqlstate(error) == QUERY_CANCELED

    def insufficient_privilege(self, driver: Driver, error: BaseException) -> bool:
        return driver.sqlstate(error) == INSUFFICIENT_PRIVILEGE

    @contextmanager
    def run_transaction(self, driver: Driver, oblivious: bool) -> Iterator[None]:
        """A run's REPEATABLE READ READ ONLY transaction; an oblivious run's first statement
        turns track_counts off where the role may (hides_statistics)."""
        with driver.transaction(isolation=self.snapshot_isolation, read_only=True):
            if oblivious and self.hides_statistics(driver):
                driver.execute(HIDE_STATISTICS)
            yield

    def hides_statistics(self, driver: Driver) -> bool:
        """Whether the connection's role may set track_counts (a superuser, or a role granted
        SET ON PARAMETER track_counts, PostgreSQL 15 and later): asked once per connection."""
        return self._statistics_role(driver)[0]

    def _statistics_role(self, driver: Driver) -> tuple[bool, str]:
        """(whether the connection's role may set track_counts, its name): one catalog query
        per connection (a fact of the role, not of the data)."""
        connection = driver.session_key
        if self._hides is not None and self._hides[0] is connection:
            return self._hides[1], self._hides[2]
        allowed, role = driver.one(may_hide_statistics_sql(driver.server_version))
        self._hides = (connection, bool(allowed), str(role))
        return bool(allowed), str(role)

    def oblivious_reads_seen(
        self, driver: Driver, where: str, accepted: bool = False
    ) -> str | None:
        """Where the role may not set track_counts, pg_statio_user_tables shows every role the
        blocks an oblivious run reads: the refusal's words (None where `accepted`)."""
        allowed, role = self._statistics_role(driver)
        return None if allowed or accepted else statistics_seen(where, role)

    def warn_statistics(self, driver: Driver, where: str) -> None:
        """The channel accepted and open (the role may not set track_counts): a warning, once."""
        allowed, role = self._statistics_role(driver)
        if not allowed and not self._warned:
            self._warned = True
            warnings.warn(statistics_accepted(where, role), stacklevel=4)

    # ----- reads --------------------------------------------------------------------------------
    def read_whole(self, driver: Driver, t: Any, sql: str, alone: bool) -> dict[str, Any]:
        """Alone, packed (tables.packed_whole: a statement that fails costs only itself); else,
        or where the rows do not pack, the rows of `sql`."""
        got = tables.packed_whole(driver, t) if alone else None
        return super().read_whole(driver, t, sql, alone) if got is None else got

    def read_ranks(self, driver: Driver, ranks: str, start: int, stop: int, packed: bool) -> Rows:
        """Ranks [start, stop) of the copy: a range of its rank B-tree; packed into one bytea a
        column where `packed` (integer ids) and the range is large: a full read of 10^7 rows in
        about 3.5 s instead of about 11 s as one Python tuple per row."""
        params = {"start": int(start), "stop": int(stop)}
        if packed and stop - start >= PACKED_MIN_ROWS:
            row = driver.one(
                "SELECT string_agg(int8send(rank), ''::bytea), "
                "string_agg(int8send(id::int8), ''::bytea), "
                f"string_agg(float8send(score), ''::bytea) FROM {ranks} "
                "WHERE rank >= :start AND rank < :stop",
                params,
                binary=True,
            )
            return unpack(row, ordered=False)
        return rows_from_records(
            driver.execute(
                f"SELECT rank, id, score FROM {ranks} WHERE rank >= :start AND rank < :stop "
                "ORDER BY rank",
                params,
            )
        )

    def read_runs(self, driver: Driver, runs: str | None, count: int | None) -> Any:
        """(first rank, score) of every run of tied scores in one query, packed when many."""
        if count is not None and count >= PACKED_MIN_ROWS:
            first, scores = driver.one(
                "SELECT string_agg(int8send(first_rank), ''::bytea ORDER BY first_rank), "
                f"string_agg(float8send(score), ''::bytea ORDER BY first_rank) FROM {runs}",
                binary=True,
            )
            return (
                np.frombuffer(first or b"", ">i8").astype(np.int64),
                np.frombuffer(scores or b"", ">f8").astype(np.float64),
            )
        rows = driver.execute(f"SELECT first_rank, score FROM {runs} ORDER BY first_rank")
        first = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        scores = np.fromiter((r[1] for r in rows), dtype=np.float64, count=len(rows))
        return first, scores

    # ----- reads of the table itself (adapters/sql/table_read.py) ---------------------------------
    def open_table(self, t: Any) -> Any:
        return tables.open_table(t)

    def known_rows_sql(self, t: Any, state: Any, noise: Any, k: int, top: bool) -> Any:
        return tables.known_rows_sql(t, state, noise, k, top)

    def range_read_sql(self, t: Any, state: Any, noise: Any, k: int, cut: float) -> Any:
        return tables.range_read_sql(t, state, noise, k, cut)

    # ----- EXPLAIN ------------------------------------------------------------------------------
    def no_sequential_scans(self, driver: Driver) -> None:
        """For the transaction: the planner takes a sequential scan only where no index serves
        the query (that fallback is what check() reports)."""
        driver.execute("SET LOCAL enable_seqscan = off")

    def full_scans(self, driver: Driver, sql: str, params: dict[str, Any]) -> list[str]:
        plan = driver.scalar("EXPLAIN (FORMAT JSON) " + sql, params)
        return sorted(seq_scans(plan if isinstance(plan, list) else json.loads(plan)))

    # ----- costs ----------------------------------------------------------------------------------
    def stale_costs(self, run: Any) -> StoreCosts:
        """What a run that does not read the copy pays: the table's reads (a scan each), the
        one-shot read around the changes priced by them."""
        if run.around is not None:
            return dataclasses.replace(
                table_costs(run.m), oneshot_fixed=around_seconds(run.around.logged)
            )
        return table_costs(run.m) if run.table is not None else STORE_COSTS

    def oblivious_costs(self, stale: bool) -> ObliviousCosts:
        return STALE_OBLIVIOUS_COSTS if stale else OBLIVIOUS_COSTS

    def table_seconds(self, m: int) -> float:
        return table_seconds(m, 0)

    def refresh_seconds(self, m: int) -> float:
        return refresh_seconds(m)

    def around_seconds(self, changed: int) -> float:
        return around_seconds(changed)


def unpack(packed: Any, ordered: bool = True) -> Rows:
    """Rows from three packed columns (position, id, score) as numpy arrays, in position order
    (a range read comes back in the heap's order)."""
    if packed is None or packed[0] is None:
        return Rows(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64))
    ranks, ids, scores = (
        np.frombuffer(packed[0], ">i8").astype(np.int64),
        np.frombuffer(packed[1], ">i8").astype(np.int64),
        np.frombuffer(packed[2], ">f8").astype(np.float64),
    )
    if not ordered and len(ranks) > 1 and not bool(np.all(ranks[1:] > ranks[:-1])):
        order = np.argsort(ranks, kind="stable")
        ranks, ids, scores = ranks[order], ids[order], scores[order]
    return Rows(ranks, ids, scores)


INDEX_SCANS = ("Index Scan", "Index Only Scan", "Bitmap Index Scan")


def seq_scans(plan: Any, limited: bool = False) -> Iterator[str]:
    """Relations read whole anywhere in an EXPLAIN (FORMAT JSON) plan: by a sequential scan, or
    by an index scan with neither an index condition nor a LIMIT above it (a full index walk)."""
    if isinstance(plan, list):
        for entry in plan:
            yield from seq_scans(entry, limited)
    elif isinstance(plan, dict):
        node = plan.get("Node Type")
        limited = limited or node == "Limit"
        if node == "Seq Scan":
            yield str(plan.get("Relation Name"))
        elif node in INDEX_SCANS and "Index Cond" not in plan and not limited:
            yield f"{plan.get('Relation Name') or plan.get('Index Name')} (whole index)"
        for value in plan.values():
            if isinstance(value, list | dict):
                yield from seq_scans(value, limited)


__all__ = [
    "MAX_ID_BYTES",
    "PACKED_MIN_ROWS",
    "SCORE_TYPES",
    "PostgresDialect",
    "seq_scans",
    "short_name",
]
