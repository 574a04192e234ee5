"""SQLite as a dialect of the SQL store engine (adapters/sql/): what differs, and only that.

* names: identifiers double-quoted; a name matched without regard to case, in the schema given
  (an attached database) or `main`, the schema made explicit; every object name derives from
  that spelling;
* catalog: a declared type is a hint (pragma_table_info): ids of an integer or text type
  (an undeclared one is refused), scores of a numeric type or none (values that are not numbers
  are refused by validate(): `non_numbers`); SQLite compares text byte for byte (BINARY) by
  default. A table's lasting identity is its root page and CREATE statement (`identity_fact_sql`),
  which a table dropped and made again the same way may keep: prepare() then compares the copy
  with the table once the schema changed since it last looked (`catalog_version_sql`);
* arrays bound as one JSON text parameter, read by json_each(); the keyed uniform of the
  in-store one-shot (keyed_noise.py: SHA-256 of "key:position") is a Python function
  registered on the run's connection (SQLite has no SHA-256), the key a parameter;
* freshness (freshness.RowStamps): row triggers add 1 to the copy's counter in
  topk_write_counts (one writer at a time: nobody waits); the copy is stamped `lite <counter>`
  as its build saw it; a run proves it current where the counter is still that and the three
  triggers are there (a table dropped and made again loses them);
* runs read in one transaction opened by a SAVEPOINT (SQLite's own BEGIN, which fixes the
  snapshot at the first read; in WAL mode writers go on), with PRAGMA query_only;
* a stale copy's run reads the table (table_read.py): positions are rowids less the smallest
  one; a WITHOUT ROWID table or a view is read by rank;
* EXPLAIN QUERY PLAN for check() ("SCAN" of a table: a full scan); measured costs.
"""

from __future__ import annotations

import json
import math
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from adapters._sql import sql_name_spellings
from adapters.contributions import UNTYPED
from adapters.sql.dialect import FLOAT, INTEGER, TEXT, Column, Dialect
from adapters.sql.driver import Driver
from adapters.sql.freshness import RowStamps
from adapters.sql.table_read import TableState, scan_table
from topk_middleware.access import StoreCosts
from topk_middleware.keyed_noise import (
    UNIFORM_BITS,
    UNIFORM_HEX,
    KeyedNoise,
    capped_sql,
    oneshot_query,
)

KEYED_UNIFORM = "topk_keyed_uniform"  # the function registered on a run's connection
EVENTS = ("INSERT", "UPDATE", "DELETE")

# Measured (benchmarks/sizes.py, SQLite 3.40, 2 shared cores): a pass over the table costs
# about 1e-7 s a row, a rebuild of the copy 4e-6 s a row (0.14-0.6 s at 10^5 rows), the keyed
# hash a row about 1e-6 s (a Python function).
SCAN_ROW, REBUILD_ROW, HASH_ROW = 1e-7, 4e-6, 1e-6


def table_costs(m: int, in_store: bool) -> StoreCosts:
    """What reads of the table cost in a run that reads it (a scan or an index walk each)."""
    return StoreCosts(
        round_trip=5e-4 + SCAN_ROW * m,
        sorted_row=1e-6,
        random_batch=1e-2,
        random_row=1e-6,
        random_batch_item=1e-6,
        oneshot_row=HASH_ROW,
        full_read_row=2e-6,
        oneshot_fixed=(2e-3 + SCAN_ROW * m) if in_store else None,
        sorted_scans=True,
    )


def keyed_uniform(key: str, position: int) -> float:
    """U_p of keyed_noise.py: the first 52 bits of SHA-256(key ":" position), plus 1/2, over
    2^52 (KeyedNoise.uniforms, one position)."""
    import hashlib

    digest = hashlib.sha256(f"{key}:{int(position)}".encode("ascii")).hexdigest()
    return (int(digest[:UNIFORM_HEX], 16) + 0.5) / 2.0**UNIFORM_BITS


def _math_functions() -> bool:
    """Whether this SQLite has ln() (built with its math functions, 3.35 and later)."""
    try:
        sqlite3.connect(":memory:").execute("SELECT ln(2.0)").fetchall()
    except sqlite3.Error:
        return False
    return True


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _match(name: str, names: list[str]) -> str | None:
    """`name` as `names` spell it: exactly, else the one name equal without regard to case."""
    if name in names:
        return name
    alike = [n for n in names if n.lower() == name.lower()]
    return alike[0] if len(alike) == 1 else None


class RowStampSQL:
    """The SQL of SQLite's row stamps (freshness.RowStamps; module docstring)."""

    LOG_TABLE = "topk_write_counts"
    EVENTS = EVENTS

    def __init__(self, dialect: SQLiteDialect) -> None:
        self.d = dialect

    def setup_statements(self, log: str, key: int) -> list[str]:
        """The counter table, and the copy's counter (its write takes the database's write
        lock: the triggers are looked for and made under it)."""
        return [
            f"CREATE TABLE IF NOT EXISTS {log} (copy_key INTEGER PRIMARY KEY, n INTEGER NOT NULL)",
            f"INSERT OR IGNORE INTO {log} (copy_key, n) VALUES ({int(key)}, 0)",
        ]

    def trigger_names(self, driver: Driver, t: Any) -> set[str]:
        master = self.d.qualified(t.namespace, "sqlite_master")
        return {r[0] for r in driver.execute(f"SELECT name FROM {master} WHERE type = 'trigger'")}

    def trigger_sql(self, name: str, event: str, t: Any, log: str, key: int) -> str:
        """A row trigger adding 1 to the copy's counter (a trigger names tables of its own
        schema: the counter table unqualified)."""
        bump = f"UPDATE {self.d.quote(self.LOG_TABLE)} SET n = n + 1 WHERE copy_key = {int(key)};"
        return (
            f"CREATE TRIGGER {self.d.qualified(t.namespace, name)} AFTER {event} ON "
            f"{self.d.quote(t.table)} FOR EACH ROW BEGIN {bump} END"
        )

    def after_new_triggers(self, log: str, key: int) -> list[str]:
        """A copy stamped before these triggers were made proves nothing any more."""
        return [f"UPDATE {log} SET n = n + 1 WHERE copy_key = {int(key)}"]

    def cleanup(self, driver: Driver, log: str, key: int) -> None:
        """Nothing: the counter stays."""

    def stamp_sql(self, t: Any, log: str, key: int, triggers: list[str]) -> str:
        return f"(SELECT 'lite ' || n FROM {log} WHERE copy_key = {int(key)})"

    def proof_sql(self, stamp: str, t: Any, log: str, key: int, triggers: list[str]) -> str:
        """The stamp where the counter is still the stamped one and the triggers are there."""
        master = self.d.qualified(t.namespace, "sqlite_master")
        names = ", ".join(_literal(name) for name in sorted(triggers))
        return (
            f"(SELECT s.stamp FROM (SELECT {stamp} AS stamp) s WHERE s.stamp = 'lite ' || "
            f"(SELECT n FROM {log} WHERE copy_key = {int(key)}) AND (SELECT count(*) FROM "
            f"{master} WHERE type = 'trigger' AND name IN ({names})) = {len(triggers)})"
        )

    def delete_key_sql(self, log: str, key: int) -> str:
        return f"DELETE FROM {log} WHERE copy_key = {int(key)}"

    def users_sql(self, t: Any) -> str:
        """How many triggers name the counter table in their statement (any copy's)."""
        master = self.d.qualified(t.namespace, "sqlite_master")
        return (
            f"SELECT count(*) FROM {master} WHERE type = 'trigger' "
            f"AND instr(sql, {_literal(self.LOG_TABLE)})"
        )


class SQLiteDialect(Dialect):
    """SQLite's SQL (module docstring)."""

    name = "SQLite"
    reads_tables = True
    trigger_proof = RowStamps
    score_types = "a numeric type, or none"
    id_types = "INTEGER or TEXT"
    costs = StoreCosts()  # a copy's reads: the generic record (measured alike)
    # A table read as it is now is read whole (adapters/sql/whole.py) up to this many rows: one
    # read and a release in memory against the table's in-store one-shot, measured after 1% of
    # the rows written (median of 11 releases, load 13): 1,000 rows 8.7 ms whole against 19 ms,
    # 3,000 10 against 13, 10,000 26 against 22.
    whole_read_rows = 5_000
    whole_read_alone = True  # a run after a small one reads it alone (whole.alone_run)
    catalog_version_sql = "SELECT schema_version FROM pragma_schema_version"

    def __init__(self) -> None:
        self.row_stamps = RowStampSQL(self)
        self.supports_in_store_oneshot = _math_functions()

    # ----- names and catalog --------------------------------------------------------------------
    def quote(self, name: str) -> str:
        if "\x00" in name:
            raise ValueError(f"a name cannot hold a NUL character, got {name!r}")
        return '"' + name.replace('"', '""') + '"'

    def resolve(self, driver: Driver, table: str, namespace: str | None) -> tuple[Any, str]:
        """(schema, table) as the catalog spells the table or view the name finds (module
        docstring); a name that finds nothing is kept as given (the columns refuse it)."""
        schemas = [str(r[0]) for r in driver.execute("SELECT name FROM pragma_database_list")]
        if namespace is not None and _match(namespace, schemas) is None:
            raise ValueError(f"table {table!r}: schema {namespace!r} does not exist")
        for spelled_schema, spelled in sql_name_spellings(table, namespace):
            home = "main" if spelled_schema is None else _match(spelled_schema, schemas)
            if home is None:
                continue
            master = self.qualified(home, "sqlite_master")
            names = [
                str(r[0])
                for r in driver.execute(
                    f"SELECT name FROM {master} WHERE type IN ('table', 'view')"
                )
            ]
            found = _match(spelled, names)
            if found is not None:
                return home, found
        return namespace or "main", table

    def _kind(self, driver: Driver, namespace: Any, table: str) -> tuple[str, str] | None:
        """(type, CREATE statement) of the table or view `table` (its name without case)."""
        masters = ["sqlite_temp_master", "main.sqlite_master"]
        if namespace is not None:
            masters = [self.qualified(namespace, "sqlite_master")]
        return driver.one(
            " UNION ALL ".join(
                f"SELECT type, coalesce(sql, '') FROM {m} WHERE type IN ('table', 'view') "
                "AND name = :name COLLATE NOCASE"
                for m in masters
            ),
            {"name": table},
        )

    def columns(self, driver: Driver, namespace: Any, table: str) -> dict[str, Column] | None:
        if self._kind(driver, namespace, table) is None:
            return None
        args = {"name": table} if namespace is None else {"name": table, "schema": namespace}
        rows = driver.execute(
            f"SELECT name, type FROM pragma_table_info({', '.join(':' + a for a in args)}) "
            "ORDER BY cid",
            args,
        )
        columns = {}
        for column, declared in rows:
            upper = str(declared or "").upper()
            if not upper:
                kind = UNTYPED
            elif "INT" in upper:
                kind = INTEGER
            elif any(t in upper for t in ("CHAR", "CLOB", "TEXT")):
                kind = TEXT
            elif any(t in upper for t in ("REAL", "FLOA", "DOUB", "NUMERIC", "DECIMAL")):
                kind = FLOAT
            else:
                kind = upper
            columns[column] = Column(kind, str(declared) or "untyped")
        return columns

    def counts_column(self, where: str, role: str, name: str, column: Column) -> Column:
        """Scores are read as floats (an INTEGER column may hold REAL values; a column without
        a declared type is copied as DOUBLE); an id column needs a declared type."""
        if role == "score" and column.kind in (INTEGER, FLOAT, UNTYPED):
            return Column(FLOAT, "DOUBLE" if column.kind == UNTYPED else column.type)
        if column.kind == UNTYPED:
            raise TypeError(
                f"{where} column {name!r} has no declared type: declare it INTEGER or TEXT (ids "
                "of one type), e.g. by copying the table"
            )
        return column

    def comment(self, driver: Driver, namespace: Any, table: str) -> str | None:
        """The table's CREATE statement: SQLite keeps no comments, but keeps that text with
        the comments inside it (where from_votes' copies hold their record)."""
        kind = self._kind(driver, namespace, table)
        return None if kind is None or kind[0] != "table" else kind[1]

    def is_table(self, driver: Driver, namespace: Any, table: str) -> bool:
        kind = self._kind(driver, namespace, table)
        return kind is not None and kind[0] == "table"

    def exists_sql(self, qualified: str) -> str:
        namespace, name = self.split(qualified)
        master = self.qualified(namespace, "sqlite_master")
        return (
            f"EXISTS (SELECT 1 FROM {master} WHERE type IN ('table', 'view') "
            f"AND name = {_literal(name)})"
        )

    def identity_fact_sql(self, qualified: str) -> str:
        """A table's root page and CREATE statement (module docstring)."""
        namespace, name = self.split(qualified)
        master = self.qualified(namespace, "sqlite_master")
        return (
            f"(SELECT rootpage || ' ' || sql FROM {master} WHERE type = 'table' "
            f"AND name = {_literal(name)})"
        )

    # ----- fragments ------------------------------------------------------------------------------
    def double(self, expr: str) -> str:
        return f"CAST({expr} AS REAL)"

    def text(self, expr: str) -> str:
        return f"CAST({expr} AS TEXT)"

    def floor_units(self, expr: str) -> str:
        return self.integer(expr)  # CAST truncates: the floor of a number >= 0

    def byte_order(self, expr: str) -> str:
        return f"{expr} COLLATE BINARY"

    def non_finite(self, expr: str, column: Column) -> str | None:
        return f"{expr} IN (9e999, -9e999)"  # NaN is stored as NULL

    def non_numbers(self, expr: str) -> str | None:
        return f"typeof({expr}) NOT IN ('integer', 'real', 'null')"

    def id_length(self, expr: str) -> str:
        return f"length(CAST({expr} AS BLOB))"

    def member(self, expr: str, param: str, kind: str | None) -> str:
        return f"{expr} IN (SELECT value FROM json_each(:{param}))"

    def array_value(self, values: Any, kind: str | None, driver: Driver) -> Any:
        """An array as one JSON text (json_each reads it)."""
        items = values.tolist() if hasattr(values, "tolist") else list(values)
        return json.dumps(items)

    def keyed_uniform(self, key_param: str, position: str) -> str:
        return f"{KEYED_UNIFORM}(:{key_param}, {position})"

    def oneshot_sql(self, ranks: str, noise_sql: str, bound: float, k: int, cap: float) -> str:
        """keyed_noise.oneshot_query over the rank table, the rows that can win found by binary
        search through the rank primary key (:m)."""
        return oneshot_query(
            ranks,
            "rank",
            noise_sql,
            "SELECT CAST(p.value AS INTEGER), z.value FROM json_each(:positions) AS p "
            "JOIN json_each(:noises) AS z ON z.key = p.key",
            bound,
            ":k",
            search_m=":m",
            score_cap=cap,
        )

    # ----- DDL ------------------------------------------------------------------------------------
    def id_copy_type(self, column: Column) -> str:
        return 'TEXT COLLATE "BINARY"' if column.kind == TEXT else column.type

    def commented_table_sql(self, create: str, qualified: str, text: str) -> list[str]:
        """SQLite keeps no table comments but keeps the CREATE statement, comments inside it
        included: `text` (numbers and words, no "*/") goes right after its opening parenthesis."""
        head = f"CREATE TABLE {qualified} ("
        if not create.startswith(head) or "*/" in text:
            raise ValueError(f"no comment can hold {text!r} in {create[:60]!r}")
        return [f"{head} /* {text} */ {create[len(head) :]}"]

    def create_runs_table(self, target: str, ranks: str) -> list[str]:
        return [
            f"CREATE TABLE {target} (run BIGINT NOT NULL, first_rank BIGINT NOT NULL, "
            "score DOUBLE NOT NULL, PRIMARY KEY (first_rank))",
            f"INSERT INTO {target} (run, first_rank, score) "
            "SELECT row_number() OVER (ORDER BY min(rank)) - 1, min(rank), score "
            f"FROM {ranks} GROUP BY score ORDER BY 2",
        ]

    def plain_index_sql(self, index: str, table: str, columns: str) -> str:
        """CREATE INDEX (the index named in the table's schema, the table without it)."""
        namespace, name = self.split(table)
        return (
            f"CREATE INDEX IF NOT EXISTS {self.qualified(namespace, index)} ON "
            f"{self.quote(name)} ({columns})"
        )

    def analyze(self, driver: Driver, qualified: str) -> None:
        """Planner statistics for what prepare() built, where the database keeps them
        (sqlite_stat1, made by its owner's ANALYZE; prepare() never makes it)."""
        namespace, _ = self.split(qualified)
        master = self.qualified(namespace, "sqlite_master")
        if driver.scalar(f"SELECT count(*) FROM {master} WHERE name = 'sqlite_stat1'"):
            driver.execute(f"ANALYZE {qualified}")

    # ----- runs ---------------------------------------------------------------------------------
    @contextmanager
    def run_transaction(self, driver: Driver, oblivious: bool) -> Iterator[None]:
        """A run's transaction: a SAVEPOINT opens SQLite's own (deferred: its first read fixes
        the snapshot), read-only by PRAGMA query_only; the keyed uniform registered on the
        connection (module docstring)."""
        with driver.transaction():
            driver.execute("SAVEPOINT topk_run")
            driver.execute("PRAGMA query_only = ON")
            connection = driver.dbapi_connection()
            if connection is not None and self.supports_in_store_oneshot:
                connection.create_function(KEYED_UNIFORM, 2, keyed_uniform, deterministic=True)
            try:
                yield
            finally:
                driver.execute("PRAGMA query_only = OFF")

    # ----- reads of the table itself (table_read.py) ----------------------------------------------
    def open_table(self, t: Any) -> TableState | None:
        """One aggregate pass (table_read.scan_table) with the smallest and largest rowid:
        positions are rowids less the smallest one. None for a view or a WITHOUT ROWID table."""
        kind = self._kind(t.driver, t.namespace, t.table)
        if kind is None or kind[0] != "table" or "WITHOUT ROWID" in kind[1].upper():
            return None
        facts = t.driver.one(
            f"SELECT (SELECT rowid FROM {t.source} ORDER BY rowid DESC LIMIT 1) - "
            f"(SELECT rowid FROM {t.source} ORDER BY rowid LIMIT 1) + 1"
        )
        state, (low, high) = scan_table(
            t,
            unique=self._unique_id(t),
            estimate=int(facts[0] or 0),
            extra=["min(rowid)", "max(rowid)"],
        )
        state.offset = int(low)
        state.slots = int(high) - int(low) + 1
        state.score_index = self._score_index(t)
        return state

    def _indexes(self, t: Any) -> list[tuple[bool, list[str]]]:
        """(unique, columns) of each index of the table, and of an INTEGER PRIMARY KEY."""
        args = {"name": t.table, "schema": t.namespace}
        out = []
        for name, unique in t.driver.execute(
            'SELECT name, "unique" FROM pragma_index_list(:name, :schema)', args
        ):
            keys = t.driver.execute(
                "SELECT name FROM pragma_index_info(:index, :schema) ORDER BY seqno",
                {"index": name, "schema": t.namespace},
            )
            out.append((bool(unique), [str(k[0]) for k in keys]))
        for column, declared, pk in t.driver.execute(
            "SELECT name, upper(type), pk FROM pragma_table_info(:name, :schema)", args
        ):
            if pk == 1 and declared == "INTEGER":
                out.append((True, [str(column)]))  # the rowid itself
        return out

    def _unique_id(self, t: Any) -> bool:
        return any(u and cols == [t.id_column] for u, cols in self._indexes(t))

    def _score_index(self, t: Any) -> bool:
        return any(cols[:1] == [t.score_column] for _, cols in self._indexes(t))

    def known_rows_sql(
        self, t: Any, state: TableState, noise: KeyedNoise, k: int, top: bool
    ) -> tuple[str, dict[str, Any]]:
        """The rows at the exceedances' rowids, and the k rows of the top scores where
        `top`: (position, id, score)."""
        pos = f"(rowid - {int(state.offset)})"
        rowids = [int(p) + state.offset for p in noise.exceed_positions.tolist()]
        sql = (
            f"SELECT {pos}, {t.id_sql}, {t.score_sql} FROM {t.source} "
            "WHERE rowid IN (SELECT value FROM json_each(:rowids))"
        )
        params: dict[str, Any] = {"rowids": json.dumps(rowids)}
        if top:
            sql += (
                f" UNION ALL SELECT * FROM (SELECT {pos}, {t.id_sql}, {t.score_sql} "
                f"FROM {t.source} ORDER BY {t.score_sql} DESC LIMIT :k)"
            )
            params["k"] = int(k)
        return sql, params

    def range_read_sql(
        self, t: Any, state: TableState, noise: KeyedNoise, k: int, cut: float
    ) -> tuple[str, dict[str, Any]]:
        """The k best rows by score + keyed noise among those with score >= `cut` outside the
        exceedances: (position, id, score, noisy score)."""
        keyed = noise.sql(self.keyed_uniform("key", "r.pos"))
        params: dict[str, Any] = {
            "key": noise.key,
            "k": int(k),
            "positions": json.dumps(noise.exceed_positions.tolist()),
        }
        where = ""
        if math.isfinite(cut):
            params["cut"] = float(cut)
            where = f" WHERE {t.score_sql} >= :cut"
        query = (
            f"SELECT r.pos, r.id, r.score, {capped_sql('r.score', noise.score_cap)} + {keyed} "
            f"AS v FROM (SELECT rowid - {int(state.offset)} AS pos, {t.id_sql} AS id, "
            f"{t.score_sql} AS score FROM {t.source}{where}) AS r WHERE r.pos NOT IN "
            "(SELECT value FROM json_each(:positions)) ORDER BY v DESC, r.pos LIMIT :k"
        )
        return query, params

    # ----- EXPLAIN --------------------------------------------------------------------------------
    def full_scans(self, driver: Driver, sql: str, params: dict[str, Any]) -> list[str]:
        """The tables EXPLAIN QUERY PLAN scans whole ("SCAN t", not a json_each virtual table).
        A comment unique to the call defeats the driver's statement cache, whose plans keep the
        schema they were prepared against."""
        plan = driver.execute(f"EXPLAIN QUERY PLAN {sql} -- {uuid.uuid4().hex}", params)
        details = [str(row[-1]) for row in plan]
        return [d for d in details if d.startswith("SCAN") and "VIRTUAL TABLE" not in d]

    # ----- costs ----------------------------------------------------------------------------------
    def stale_costs(self, run: Any) -> StoreCosts:
        in_store = run.table is not None and run.table.slots > 0
        return table_costs(run.m, self.supports_in_store_oneshot and in_store)

    def table_seconds(self, m: int) -> float:
        return 2e-3 + 2 * SCAN_ROW * m

    def refresh_seconds(self, m: int) -> float:
        return 5e-3 + REBUILD_ROW * m


__all__ = ["RowStampSQL", "SQLiteDialect", "keyed_uniform", "table_costs"]
