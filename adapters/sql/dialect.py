"""What one SQL store does in its own words: the surface a dialect fills for the engine.

The engine (adapters/sql/) holds every idea a rank-ordered SQL store shares: the copy's
lifecycle, the canonical order, the runs of tied scores, the freshness proof, the reads, the
in-store one-shot, the refusals. A driver (driver.py) says how a statement reaches the store; a
dialect holds only what differs from one store's SQL to the next, as methods and flags, never
as a branch in the engine (docs/writing-a-store.md). Every statement a dialect composes uses
`:name` placeholders, which the driver binds; a dialect method that must read (the catalog, a
fingerprint) gets the driver and runs only what it composed.

The surface, by group (the base gives a portable default where one exists):

* flags: `supports_in_store_oneshot` (keyed noise in SQL), `reads_tables` (a run may read the
  table itself where the copy is stale: table_read.py), `snapshot_isolation` (the isolation
  of a run's and a build's transaction; None: the store has none), `max_id_bytes` (and
  `id_length_unit`), `catalog_version_sql` (a value any change to the catalog moves, where a
  table's identity in the catalog is not lasting);
* the copy's layout and proof for a table (`layout`, `proof`: copies.py, freshness.py; a
  declared copy's trigger proof: `trigger_proof`, with the SQL modules `writes` or
  `row_stamps`);
* names: `quote`, `qualified`, `split`, `literal`, `resolve` (the catalog's spelling of a table,
  so that every spelling derives the same copy names);
* catalog: `columns` (each column's `Column`; `counts_column`: the id and score as the engine
  treats them, or the store's own refusal), `comment` (the text that may hold from_votes'
  record), `identity_fact_sql` (a table's lasting identity), `tables_like`, `exists_sql`,
  `comment_sql` / `comment_statement` (a table's comment, where the layout keeps its record),
  `fingerprint_sql` / `fingerprint`;
* fragments: `double`, `byte_order` (text compared in byte order), `count_if`, `non_finite`,
  `beyond_double`, `id_length`, `member` and `array_value` (an array bound as one parameter),
  `keyed_uniform` (U_p of keyed_noise.py: SHA-256 of "key:position"), `exceedances_sql` (the
  exceedances' rows from two bound arrays), `oneshot_sql`;
* from_votes' counts (votes.py): `text`, `text_length`, `concat`, `keyed_hash` (SHA-256 of the
  key and a message; None: the store has none), `integer`, `floor_units`, `non_numbers` (values
  of a numeric column that are not numbers, where types are hints), `is_table`;
* DDL: `create_rank_table`, `create_runs_table` (`fill_runs_sql`), `create_index_sql`,
  `rename_table_sql`, `rename_index_sql`, `drop_table`, `analyze`, versioned copies' manifest
  (`create_manifest`, `record_version_sql`, `forget_version_sql`), and declared copies'
  tables (recorded.py: `declared_table_sql`, `id_copy_type`, `plain_index_sql`,
  `id_index_key`, `indexes_ids`, `drop_index_sql`, `fingerprints_table_sql`,
  `stamps_table_sql`, `upsert_sql`, `refresh_beside`, `indexes_tables`);
* sessions and errors: `prepare_lock`, `limit_statements`, `lock_timeout`, `run_transaction`,
  `hides_statistics`, `oblivious_reads_seen`, `warn_statistics`, and what an error was
  (`lock_not_available`, `canceled`, `insufficient_privilege`);
* reads the dialect does better than the engine's plain SELECT: `read_ranks` (a range of the
  copy), `read_runs`; the table's own (`open_table`, `known_rows_sql`, `range_read_sql`, or
  a whole strategy: `table_reads`);
  the SQL modules `writes` (a write log), `changes` (a change log, named by `change_names`),
  `oblivious_sql`;
* EXPLAIN: `no_sequential_scans`, `full_scans`;
* costs: `costs`, `costs_for(m)`, `stale_costs(run)`, `oblivious_costs(stale)`, and the prices
  of the ways a stale run can go (`table_seconds`, `refresh_seconds`, `around_seconds`).

A dialect may replace a whole read where its store has a better one (a method of the dialect,
or a strategy object it hands the engine), never by a branch in the engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from adapters._sql import rows_from_records
from topk_middleware.access import Rows, StoreCosts

from .driver import Driver

# The kinds of column the engine tells apart (`Dialect.columns`).
INTEGER, FLOAT, TEXT = "integer", "float", "text"


@dataclass(frozen=True)
class Column:
    """What the engine knows of a column: its kind (INTEGER, FLOAT, TEXT, or the store's type
    name for any other), its type as the store names it, and whether it can hold ids (an
    equality and an order)."""

    kind: str
    type: str
    id_ok: bool = True

    @property
    def integer(self) -> bool:
        return self.kind == INTEGER


class Dialect:
    """The base of every dialect: the flags a store declares and the methods it fills."""

    name = "sql"  # how messages name the store: "<name> table 'x'"
    supports_in_store_oneshot = False
    reads_tables = False
    snapshot_isolation: str | None = None
    max_id_bytes: int | None = None
    whole_read_rows = 0  # a table read as it is now is read whole up to this many rows (whole.py)
    whole_read_alone = False  # a run after a small one is that read alone (whole.alone_run)
    whole_read_alone_rows = 0  # alone, up to this many rows (where above whole_read_rows)
    id_length_unit = "bytes"  # what `id_length` counts
    refresh_beside = False  # a declared copy's refresh builds beside it and swaps (recorded.py)
    indexes_tables = True  # prepare() indexes the table of counts (score, id) where asked
    catalog_version_sql: str | None = None
    prepare_statement_timeout: float | None = None
    swap_timeout = 2.0
    score_types = "integers or floating point numbers"
    id_types = "integers or text"
    costs = StoreCosts()
    writes: Any = None
    row_stamps: Any = None
    trigger_proof: Any = None  # the proof class of a copy declared by SQLAlchemyTable
    sqlalchemy_read_only: Any = None  # SQLAlchemy's options of a read-only transaction, if any
    changes: Any = None
    oblivious_sql: Any = None

    # ----- the copy's layout and its proof ---------------------------------------------------
    def change_names(self, t: Any, prefix: str) -> Any:
        """The names of the change log of `t`'s copy (the `changes` module's), its objects
        named `prefix`_...; None where the dialect keeps no change log (around.py)."""
        return None

    def text_line_sql(self, expr: str, line: int) -> str:
        """SQL of one line (from 1) of the text `expr` (a dialect with a change log)."""
        raise NotImplementedError

    def layout(self, t: Any) -> Any:
        """The copy's layout for table `t` (copies.py), where its constructor names none."""
        raise NotImplementedError

    def proof(self, t: Any) -> Any:
        """The freshness proof for table `t` (freshness.py), where its constructor names none."""
        raise NotImplementedError

    # ----- names ------------------------------------------------------------------------------
    def quote(self, name: str) -> str:
        """A quoted identifier (any text: spaces, quotes, capitals, keywords)."""
        raise NotImplementedError

    def qualified(self, namespace: str | None, name: str) -> str:
        """namespace.name, each part quoted (the name alone without a namespace)."""
        if namespace is None:
            return self.quote(name)
        return f"{self.quote(namespace)}.{self.quote(name)}"

    def split(self, qualified: str) -> tuple[str | None, str]:
        """(namespace, name) of a name `qualified` wrote."""
        q = self.quote("x")[0]
        parts, i = [], 0
        while i < len(qualified):
            if qualified[i] != q:
                raise ValueError(f"not a name this dialect quoted: {qualified!r}")
            part, j = [], i + 1
            while True:
                end = qualified.index(q, j)
                part.append(qualified[j:end])
                if qualified[end + 1 : end + 2] != q:
                    break
                part.append(q)
                j = end + 2
            parts.append("".join(part))
            i = end + 2  # past the closing quote and the dot
        return (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])

    def literal(self, text: str) -> str:
        """A string literal holding `text`."""
        return "'" + text.replace("'", "''") + "'"

    def resolve(self, driver: Driver, table: str, namespace: str | None) -> tuple[Any, str]:
        """The (namespace, table) a name means in the store, however it was spelt: the copy's
        names derive from it, so that cleanup finds them from any spelling."""
        raise NotImplementedError

    # ----- catalog ----------------------------------------------------------------------------
    def columns(self, driver: Driver, namespace: Any, table: str) -> dict[str, Column] | None:
        """The table's columns (Column), in order; None where there is no such table."""
        raise NotImplementedError

    def counts_column(self, where: str, role: str, name: str, column: Column) -> Column:
        """The id (`role` "id") or score column as the engine should treat it, or a refusal in
        the store's own words (a TypeError naming `where` and `name`)."""
        return column

    def id_index_key(self, expr: str) -> str:
        """The id as a B-tree on the table of counts orders it (where an index can say so, in
        byte order)."""
        return self.byte_order(expr)

    def indexes_ids(self, column: Column) -> bool:
        """Whether an index on the table's id column can hold every id whole."""
        return True

    def identity_fact_sql(self, qualified: str) -> str:
        """SQL of a table's lasting identity in the catalog, as text (recorded.py's mark)."""
        raise NotImplementedError

    def comment(self, driver: Driver, namespace: Any, table: str) -> str | None:
        """The text that may hold a from_votes record (adapters/contributions.py): the table's
        comment where the store keeps one; None elsewhere."""
        return None

    def tables_like(self, driver: Driver, namespace: Any, prefix: str) -> list[str]:
        """The names of the tables in `namespace` that start with `prefix`."""
        raise NotImplementedError

    def exists_sql(self, qualified: str) -> str:
        """SQL of whether a relation exists (a scalar boolean)."""
        raise NotImplementedError

    def comment_sql(self, qualified: str) -> str:
        """SQL of a table's comment (a scalar; NULL without one)."""
        raise NotImplementedError

    def comment_line_sql(self, qualified: str, line: int) -> str:
        """SQL of one line (from 1) of a table's comment."""
        raise NotImplementedError

    def comment_statement(self, qualified: str, text: str) -> str:
        return f"COMMENT ON TABLE {qualified} IS {self.literal(text)}"

    def commented_table_sql(self, create: str, qualified: str, text: str) -> list[str]:
        """The statements that create a table (`create`) and keep `text` with it: its comment
        (a store that keeps none may keep a comment inside the CREATE statement)."""
        return [create, self.comment_statement(qualified, text)]

    def fingerprint_sql(self, t: Any, ranks: str) -> str:
        """SQL of the copy's fingerprint: a value that names the table and the copy as they are
        (their identity and the id and score columns' types), recorded with the copy."""
        raise NotImplementedError

    def fingerprint(self, driver: Driver, namespace: Any, table: str) -> str:
        """A value that changes whenever the table's rows may have changed (a write, a rebuild,
        a truncation); it may change without a write (then the copy is rebuilt for nothing),
        never stay put across one (freshness.Fingerprint)."""
        raise NotImplementedError

    # ----- fragments --------------------------------------------------------------------------
    def double(self, expr: str) -> str:
        """SQL of `expr` as a double."""
        return f"CAST({expr} AS DOUBLE PRECISION)"

    def byte_order(self, expr: str) -> str:
        """SQL of a text expression compared in byte order (the canonical order's ties)."""
        return expr

    def count_if(self, condition: str) -> str:
        return f"sum(CASE WHEN {condition} THEN 1 ELSE 0 END)"

    def non_finite(self, expr: str, column: Column) -> str | None:
        """A condition true for NaN or infinite scores, where the column can hold them."""
        return None

    def beyond_double(self, expr: str, column: Column) -> str | None:
        """A condition true for scores a double cannot hold, where the column can hold them."""
        return None

    def id_length(self, expr: str) -> str:
        """SQL of a text id's length in bytes."""
        return f"length({expr})"

    def member(self, expr: str, param: str, kind: str | None) -> str:
        """SQL of `expr` being one of the array bound as `param` (elements of `kind`)."""
        raise NotImplementedError

    def array_value(self, values: Any, kind: str | None, driver: Driver) -> Any:
        """The value an array is bound as (the driver's fastest form the dialect's SQL reads)."""
        return values.tolist() if hasattr(values, "tolist") else list(values)

    def keyed_uniform(self, key_param: str, position: str) -> str:
        """SQL of U_p (keyed_noise.py): the first 52 bits of SHA-256(key ":" position), plus
        1/2, over 2^52."""
        raise NotImplementedError

    def exceedances_sql(self) -> str:
        """SELECT of the (position, noise) rows of the exceedances (keyed_noise.py), from the
        arrays bound as :positions (integers) and :noises (doubles)."""
        raise NotImplementedError

    def oneshot_sql(self, ranks: str, noise_sql: str, bound: float, k: int, cap: float) -> str:
        """SQL of the in-store one-shot over the rank table (keyed_noise.py's split and cut),
        parameters :key, :positions, :noises (and :k, :m where the dialect binds them), columns
        (rank, id, score) of the k best by min(score, cap) + noise."""
        raise NotImplementedError

    # ----- from_votes' counts (votes.py) -------------------------------------------------------
    def text(self, expr: str) -> str:
        """SQL of `expr` as text, in its canonical spelling (42, abc)."""
        return f"CAST({expr} AS VARCHAR)"

    def text_length(self, expr: str) -> str:
        """SQL of the number of characters of the text `expr`."""
        return f"length({expr})"

    def concat(self, *parts: str) -> str:
        """SQL of the texts `parts` joined."""
        return " || ".join(parts)

    def keyed_hash(self, key: str, message: str) -> str | None:
        """SQL of SHA-256 of the text `key` || `message` (UTF-8), as bytes or lower-case hex
        (one order); None where the store has no SHA-256 (no max_items_per_client there)."""
        return None

    def integer(self, expr: str) -> str:
        """SQL of `expr` as a 64-bit integer."""
        return f"CAST({expr} AS BIGINT)"

    def floor_units(self, expr: str) -> str:
        """SQL of the largest 64-bit integer <= `expr` (a number >= 0)."""
        return self.integer(f"floor({expr})")

    def non_numbers(self, expr: str) -> str | None:
        """A condition true where a value of a numeric column is not a number (a store whose
        column types are hints); None where the type holds."""
        return None

    def is_table(self, driver: Driver, namespace: Any, table: str) -> bool:
        """Whether the relation `table`, which exists, is a table (not a view)."""
        return True

    # ----- DDL --------------------------------------------------------------------------------
    def create_rank_table(self, target: str, rows: str) -> list[str]:
        """Statements creating `target` (qualified) as the (rank, id, score) rows of the SELECT
        `rows` (the table in canonical order)."""
        raise NotImplementedError

    def create_runs_table(self, target: str, ranks: str) -> list[str]:
        """Statements creating `target`: the first rank of each run of tied scores of `ranks`."""
        raise NotImplementedError

    def create_index_sql(
        self, index: str, table: str, column: str, *, if_missing: bool = False
    ) -> str:
        raise NotImplementedError

    def fill_runs_sql(self, target: str, ranks: str) -> str:
        """INSERT of the runs of tied scores of `ranks` into the declared runs table `target`
        (run, first_rank, score): the last of `create_runs_table`'s statements here."""
        return self.create_runs_table(target, ranks)[-1]

    # the layout of declared tables (recorded.py)
    def declared_table_sql(
        self, target: str, columns: list[tuple[str, str]], key: str, key_name: str | None
    ) -> str:
        """CREATE TABLE of NOT NULL columns with a primary key (named where `key_name`)."""
        body = ", ".join(f"{self.quote(c)} {kind} NOT NULL" for c, kind in columns)
        name = "" if not key_name else f"CONSTRAINT {self.quote(key_name)} "
        return f"CREATE TABLE {target} ({body}, {name}PRIMARY KEY ({self.quote(key)}))"

    def id_copy_type(self, column: Column) -> str:
        """The copy's id column type: the table's (text in byte order where that differs)."""
        return column.type

    def score_copy_type(self, column: Column) -> str:
        return column.type

    def plain_index_sql(self, index: str, table: str, columns: str) -> str:
        return f"CREATE INDEX IF NOT EXISTS {self.quote(index)} ON {table} ({columns})"

    def drop_index_sql(self, qualified: str, table: str) -> str:
        """Drop the index `qualified` of `table`, if it exists."""
        return f"DROP INDEX IF EXISTS {qualified}"

    def fingerprints_table_sql(self, qualified: str) -> str:
        return (
            f"CREATE TABLE IF NOT EXISTS {qualified} (rank_table VARCHAR(255) NOT NULL, "
            "mark BIGINT NOT NULL, PRIMARY KEY (rank_table))"
        )

    def stamps_table_sql(self, qualified: str) -> str:
        return (
            f"CREATE TABLE IF NOT EXISTS {qualified} (rank_table VARCHAR(255) NOT NULL "
            "PRIMARY KEY, stamp TEXT)"
        )

    def upsert_sql(self, table: str, columns: list[str]) -> str:
        """Insert a row (:column each), replacing the row of the same first column (its
        primary key), in one statement."""
        key, rest = columns[0], columns[1:]
        update = ", ".join(f"{c} = excluded.{c}" for c in rest)
        return (
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
            f"({', '.join(':' + c for c in columns)}) ON CONFLICT ({key}) DO UPDATE SET {update}"
        )

    def rename_table_sql(self, qualified: str, name: str) -> str:
        raise NotImplementedError

    def rename_index_sql(self, qualified: str, name: str) -> str:
        raise NotImplementedError

    def drop_table(self, qualified: str) -> str:
        return f"DROP TABLE IF EXISTS {qualified}"

    def analyze(self, driver: Driver, qualified: str) -> None:
        """Fresh planner statistics for a table prepare() built."""
        driver.execute(self.analyze_sql(qualified))

    def analyze_sql(self, qualified: str) -> str:
        return f"ANALYZE {qualified}"

    def create_manifest(self, target: str) -> str:
        """Create `target`, if missing, as (version, fingerprint, m, runs): the versions of a
        copy kept as versions (copies.VersionedCopy)."""
        raise NotImplementedError

    def record_version_sql(self, manifest: str) -> str:
        """Insert the row (:version, :fingerprint, :m, :runs) into the manifest."""
        return (
            f"INSERT INTO {manifest} (version, fingerprint, m, runs) "
            "VALUES (:version, :fingerprint, :m, :runs)"
        )

    def forget_version_sql(self, manifest: str) -> str:
        """Delete the manifest's row of :version."""
        return f"DELETE FROM {manifest} WHERE version = :version"

    # ----- sessions, transactions, errors -----------------------------------------------------
    @contextmanager
    def prepare_lock(self, driver: Driver, name: str) -> Iterator[None]:
        """Held for the whole of prepare(): concurrent prepares of one copy wait for each other
        (none where the store has no such lock)."""
        yield

    def limit_statements(self, driver: Driver, timeout: float | None) -> None:
        """For the transaction: each statement stops after `timeout` seconds, where the store
        can say so."""

    def lock_timeout(self, driver: Driver, seconds: float | None) -> None:
        """For the transaction: wait for a lock at most `seconds` (None: the default)."""

    @contextmanager
    def run_transaction(self, driver: Driver, oblivious: bool) -> Iterator[None]:
        """A run's transaction: one snapshot for every read, read-only."""
        with driver.transaction(isolation=self.snapshot_isolation, read_only=True):
            yield

    def hides_statistics(self, driver: Driver) -> bool:
        """Whether oblivious runs keep their reads out of statistics every role reads."""
        return False

    def oblivious_reads_seen(
        self, driver: Driver, where: str, accepted: bool = False
    ) -> str | None:
        """StoreTraits.oblivious_reads_seen: where another user of the store would see which
        blocks an oblivious run reads, what it would learn and what closes the channel; None
        where no such user is known, or where the operator `accepted` the channel."""
        return None

    def warn_statistics(self, driver: Driver, where: str) -> None:
        """An oblivious run where the operator accepted the channel of oblivious_reads_seen: a
        warning where it is open, once per table (a dialect object serves one table)."""

    def lock_not_available(self, driver: Driver, error: BaseException) -> bool:
        return False

    def canceled(self, driver: Driver, error: BaseException) -> bool:
        return False

    def insufficient_privilege(self, driver: Driver, error: BaseException) -> bool:
        return False

    # ----- reads ------------------------------------------------------------------------------
    def read_arrays(self, driver: Driver, sql: str, names: tuple[str, ...]) -> dict[str, Any]:
        """The result of `sql` (columns `names`) as numpy arrays by name, from its rows here: a
        column of Python ints as int64, of Python floats as float64, any other (text, bytes,
        decimals, NULLs, booleans, ints past int64, ints and floats mixed) as objects. A
        dialect whose driver reads numpy columns itself says so. Cost: one pass a column."""
        rows = driver.execute(sql)
        out = {}
        for i, name in enumerate(names):
            values = [row[i] for row in rows]
            column = np.asarray(values) if values else np.empty(0)
            kind = column.dtype.kind
            if kind not in "iuf" or (kind == "f" and not all(type(v) is float for v in values)):
                column = np.empty(len(values), dtype=object)
                column[:] = values
            out[name] = column
        return out

    def read_whole(self, driver: Driver, t: Any, sql: str, alone: bool) -> dict[str, Any]:
        """Every row of table `t` as arrays "id" and "score" (whole.py): `sql`'s rows
        (read_arrays). `alone`: the read is a statement of its own outside any transaction, so
        a statement that fails costs only itself (a dialect may then try a faster one first)."""
        return self.read_arrays(driver, sql, ("id", "score"))

    def read_ranks(self, driver: Driver, ranks: str, start: int, stop: int, packed: bool) -> Rows:
        """Ranks [start, stop) of the copy, in rank order."""
        return rows_from_records(
            driver.execute(
                f"SELECT rank, id, score FROM {ranks} WHERE rank >= :start AND rank < :stop "
                "ORDER BY rank",
                {"start": int(start), "stop": int(stop)},
            )
        )

    def read_runs(self, driver: Driver, runs: str | None, count: int | None) -> Any:
        """(first rank, score) of every run of tied scores, in rank order, in one query."""
        rows = driver.execute(f"SELECT first_rank, score FROM {runs} ORDER BY first_rank")
        first = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        scores = np.fromiter((r[1] for r in rows), dtype=np.float64, count=len(rows))
        return first, scores

    def open_table(self, t: Any) -> Any:
        """The first query of a run that reads the table (table_read.py), or None where the
        table has no slots."""
        return None

    def table_reads(self, t: Any) -> Any:
        """A run's reads of the table as it is now the store's own way (engine.Reads), opened
        in the run's transaction; None where the engine's (table_read.py) serve."""
        return None

    # ----- EXPLAIN ----------------------------------------------------------------------------
    def no_sequential_scans(self, driver: Driver) -> None:
        """For the transaction: the planner reads whole only what no index serves."""

    def full_scans(self, driver: Driver, sql: str, params: dict[str, Any]) -> list[str]:
        """The relations a statement would read whole (the store's EXPLAIN)."""
        return []

    # ----- costs ------------------------------------------------------------------------------
    def costs_for(self, m: int) -> StoreCosts:
        """The cost record for a copy of m rows (where a cost grows with the table)."""
        return self.costs

    def stale_costs(self, run: Any) -> StoreCosts:
        """The cost record of a run that reads the table or around the changes."""
        return self.costs

    def oblivious_costs(self, stale: bool) -> Any:
        """The oblivious release's model (mechanisms/oblivious.ObliviousCosts), None for one
        derived from the costs."""
        return None

    def table_seconds(self, m: int) -> float:
        """The in-store one-shot on the table of about m rows."""
        return float("inf")

    def refresh_seconds(self, m: int) -> float:
        """A rebuild of a copy of about m rows and a threshold run on it."""
        return 0.0

    def around_seconds(self, changed: int) -> float:
        """A release read around `changed` entries logged since the copy."""
        return float("inf")


__all__ = ["FLOAT", "INTEGER", "TEXT", "Column", "Dialect"]
