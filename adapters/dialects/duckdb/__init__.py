"""DuckDB as a dialect of the SQL store engine (adapters/sql/): what differs from other SQL
stores, and only that (DuckDBTable in adapters/duckdb.py is its constructor).

* names quoted with double quotes; a name is looked up without case, under every spelling SQL
  reads it (`resolve`), so each spelling derives the same copy's names;
* text ids compare byte by byte (`COLLATE "binary"`) everywhere, whatever `default_collation`
  the connection has set;
* the copy (copy.py): DuckDB has no index-ordered scan, so the copy is a table written in rank
  order, whose row ids are ranks (sorted reads are row id ranges the zone maps serve) and whose
  unique ART index on rank serves short batches of reads by rank; its record is a fingerprint
  in its comment, checked by the run's first query (a scan of the catalog); after writes a
  refresh keeps the changed rows in a small delta merged on read (delta.py);
* freshness: no trigger and no catalog value that an UPDATE in place changes, so nothing proves
  a copy current (freshness.Unprovable): a run that is not frozen reads the table as it is now
  (table.py: row id slots, the in-store one-shot in three queries);
* keyed uniforms: sha256() of "key:position", its first 13 hex digits;
* SQLAlchemyTable's copy on DuckDB (duckdb-engine; adapters/sqlalchemy/copy_table.py): its
  declared layout (sql/recorded.py: the schema named, `main` where none is given; no index on
  the table of counts), its mark from the CREATE statements duckdb_tables() keeps
  (`identity_fact_sql`, no lasting identity: the table oids are the catalog's version), proven
  current by comparing the copy with the table (freshness.Compared), a stale copy's run reading
  the table as DuckDBTable's does, or a rebuild where that is priced cheaper;
* the measured costs below (benchmarks/wallclock.py, benchmarks/sizes.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from adapters._sql import sql_name_spellings
from adapters.sql.dialect import FLOAT, INTEGER, TEXT, Column, Dialect
from adapters.sql.driver import Driver
from adapters.sql.freshness import Compared, Unprovable
from topk_middleware.access import Rows, StoreCosts
from topk_middleware.keyed_noise import oneshot_query, uniform_from_hex_sql
from topk_middleware.mechanisms.oblivious import ObliviousCosts

INTEGER_TYPES = (
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
)
NUMERIC_TYPES = (*INTEGER_TYPES, "FLOAT", "DOUBLE", "DECIMAL")
TEXT_TYPES = ("VARCHAR",)

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
# m = 10^5 / 10^6 / 10^7 (d = 2,027 / 6,445 / 20,414); the table read as it is now, by row id
# slot (table.py), 10.8 / 34 / 94-114 ms.
OBLIVIOUS_COSTS_COPY = ObliviousCosts(fixed=3e-3, sorted_row=1e-6, random_row=3e-6)
OBLIVIOUS_COSTS_LIVE = ObliviousCosts(fixed=6e-3, sorted_row=1e-6, random_row=3.3e-6)

# A table read as it is now is read whole (adapters/sql/whole.py) up to this many rows: below it
# one read and a release in memory cost less than the table's run (its first statements and the
# in-store one-shot's three), measured by benchmarks/sizes.py.
WHOLE_READ_ROWS = 20_000

# Where a run's catalog lookups find tables: the current database, the schema without case.
WHERE_SCHEMA = (
    "database_name = current_database() "
    "AND lower(schema_name) = lower(coalesce(:schema, current_schema()))"
)


# The catalog's tables are scanned whole (and filtered in Python) up to this many: a filter in
# the query costs more than the scan of a small catalog (0.25 ms against 0.2 ms at 40 tables).
CATALOG_SCAN_MAX = 200


def rows_of(result: dict[str, Any], position: str = "rank") -> Rows:
    """Rows in position order from DuckDB's columns (text ids as Python strings)."""
    ranks = np.asarray(result[position], dtype=np.int64)
    ids = np.asarray(result["id"])
    if ids.dtype.kind in "US":
        ids = ids.astype(object)
    scores = np.asarray(result["score"], dtype=np.float64)
    if len(ranks) > 1 and not bool(np.all(ranks[1:] > ranks[:-1])):
        order = np.argsort(ranks, kind="stable")
        ranks, ids, scores = ranks[order], ids[order], scores[order]
    return Rows(ranks, ids, scores)


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


def literal(text: str) -> str:
    """A DuckDB string literal (quotes doubled)."""
    return "'" + text.replace("'", "''") + "'"


def kind_of(type_name: str) -> str:
    """INTEGER, FLOAT, TEXT, or the type's own name, for a DuckDB column type (a list or an
    array of numbers or text is neither)."""
    if type_name.endswith("]"):
        return type_name
    if type_name.startswith(INTEGER_TYPES):
        return INTEGER
    if type_name.startswith(NUMERIC_TYPES):
        return FLOAT
    if type_name.startswith(TEXT_TYPES):
        return TEXT
    return type_name


# A stale run of SQLAlchemyTable's copy on DuckDB (_stale_run): the table read as it is now
# (table.table_costs: about three scans and the keyed hash past the cut) against a rebuild of
# the copy (a sort of the table into it, and a run on it), per row, measured through
# duckdb-engine at m = 10^5 and 10^6 on 2 shared cores at load 7: a stale run 0.09 / 0.52 s,
# prepare() 0.25 / 2.4 s (a refresh of the filled copy 0.8 / 8.1 s).
TABLE_ROW, REBUILD_ROW = 5e-7, 2.4e-6


class DuckDBDialect(Dialect):
    """DuckDB's SQL (module docstring). `named_schema`: `resolve` names the schema (the
    connection's current one where none is given), as SQLAlchemyTable's copy names derive from
    it."""

    name = "DuckDB"
    supports_in_store_oneshot = True
    reads_tables = True
    indexes_tables = False  # no index-ordered reads: prepare() indexes no table of counts
    score_types = "an integer, floating point or decimal type"
    id_types = "any type with an equality"
    costs = STORE_COSTS
    whole_read_rows = WHOLE_READ_ROWS
    trigger_proof = Compared  # no trigger: a declared copy is compared with the table
    catalog_version_sql = (
        "SELECT string_agg(table_oid::VARCHAR, ' ' ORDER BY table_oid) FROM duckdb_tables() "
        "WHERE database_name = current_database()"
    )

    def __init__(self, named_schema: bool = False, caller_connection: bool = False) -> None:
        """`caller_connection`: statements run on the caller's own connection (from_votes, which
        counts from the frames it registered), whose temporary tables and views `columns`
        finds first and reads, where a source's runs (cursors of their own) refuse them."""
        from .table import CatalogHints

        self.named_schema, self.caller_connection = named_schema, caller_connection
        self.hints = CatalogHints()  # what runs of this dialect's table keep of the catalog

    def layout(self, t: Any) -> Any:
        from .copy import DuckDBCopy

        return DuckDBCopy(t)

    def proof(self, t: Any) -> Unprovable:
        return Unprovable(t)

    def table_reads(self, t: Any) -> Any:
        from .table import TableReads

        return TableReads.open(t)

    # ----- names -----------------------------------------------------------------------------
    def quote(self, name: str) -> str:
        return quote_identifier(name)

    def resolve(self, driver: Driver, table: str, namespace: str | None) -> tuple[Any, str]:
        """(schema, table) as the catalog spells the table or view the name finds (DuckDB
        compares names without case): the name as given, else read as SQL reads it (`"T"`,
        `main."t"`: _sql.sql_name_spellings). A name that finds nothing, or more than one, is
        kept as given (the columns' check says so). One catalog query a spelling."""
        for spelled_schema, spelled in sql_name_spellings(table, namespace):
            found = driver.execute(
                "SELECT DISTINCT schema_name, name FROM (SELECT database_name, schema_name, "
                "table_name AS name FROM duckdb_tables() UNION ALL SELECT database_name, "
                "schema_name, view_name FROM duckdb_views() WHERE NOT internal) "
                "WHERE database_name = current_database() AND lower(name) = lower(:name) AND "
                "lower(schema_name) = lower(coalesce(:schema, current_schema()))",
                {"name": spelled, "schema": spelled_schema},
            )
            if len(found) == 1:
                home, name = found[0]
                named = spelled_schema is not None or self.named_schema
                return (home if named else None), name
        return namespace, table

    # ----- catalog ---------------------------------------------------------------------------
    def _find(self, driver: Driver, namespace: Any, table: str) -> tuple[Any, ...] | None:
        """(database, schema, name, is a view) of the relation the name means on the caller's
        connection: its temporary ones first, names compared without case. One catalog scan."""
        return driver.one(
            "SELECT database_name, schema_name, name, view FROM (SELECT database_name, "
            "schema_name, table_name AS name, false AS view FROM duckdb_tables() UNION ALL "
            "SELECT database_name, schema_name, view_name, true FROM duckdb_views() "
            "WHERE NOT internal) WHERE database_name IN (current_database(), 'temp') "
            "AND lower(schema_name) = lower(coalesce(:schema, current_schema())) "
            "AND lower(name) = lower(:name) ORDER BY database_name = 'temp' DESC LIMIT 1",
            {"schema": namespace, "name": table},
        )

    def is_table(self, driver: Driver, namespace: Any, table: str) -> bool:
        found = self._find(driver, namespace, table)
        return found is not None and not found[3]

    def columns(self, driver: Driver, namespace: Any, table: str) -> dict[str, Column] | None:
        """The columns DuckDB describes (None where the name finds nothing). A temporary table
        or view of the caller's connection (con.register() of a frame makes one) is read where
        statements run on that connection (`caller_connection`: the catalog's columns of the
        relation `_find` finds), else refused: runs read through cursors of their own, which do
        not see it."""
        if self.caller_connection:
            found = self._find(driver, namespace, table)
            if found is None:
                return None
            rows = driver.execute(
                "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = :d "
                "AND schema_name = :s AND table_name = :t ORDER BY column_index",
                {"d": found[0], "s": found[1], "t": found[2]},
            )
            return {str(name): Column(kind_of(str(kind)), str(kind)) for name, kind in rows}
        source = self.qualified(namespace, table)
        if driver.in_transaction and not driver.scalar(f"SELECT {self.exists_sql(source)}"):
            return None  # looked up first: a failed DESCRIBE would end the transaction
        try:
            described = driver.execute(f"DESCRIBE SELECT * FROM {source}")
        except driver.errors:
            return None
        temporary = driver.scalar(
            "SELECT count(*) FROM (SELECT table_name AS name, schema_name, temporary FROM "
            "duckdb_tables() UNION ALL SELECT view_name, schema_name, temporary FROM "
            "duckdb_views()) WHERE temporary AND lower(name) = lower(:name) "
            "AND (:schema IS NULL OR lower(schema_name) = lower(:schema))",
            {"name": table, "schema": namespace},
        )
        if temporary:
            where = "DuckDB table " + (
                repr(table) if namespace is None else f"{namespace!r}.{table!r}"
            )
            raise ValueError(
                f"{where} is a temporary table or view of this connection "
                "(con.register() of an Arrow table or a DataFrame makes one): the adapter reads "
                "through cursors of its own, which do not see it. Copy it into a table (CREATE "
                f"TABLE name AS SELECT * FROM {source}), or release from it in memory with "
                "ArraySource.from_arrow(table, id=..., score=...) or ArraySource.from_polars"
            )
        return {str(name): Column(kind_of(str(kind)), str(kind)) for name, kind, *_ in described}

    def comment(self, driver: Driver, namespace: Any, table: str) -> str | None:
        """The table's comment (from_votes' record, adapters/contributions.py)."""
        return driver.scalar(
            f"SELECT comment FROM duckdb_tables() WHERE {WHERE_SCHEMA} "
            "AND lower(table_name) = lower(:name)",
            {"schema": namespace, "name": table},
        )

    def exists_sql(self, qualified: str) -> str:
        namespace, name = self.split(qualified)
        schema = "current_schema()" if namespace is None else literal(namespace)
        return (
            "EXISTS (SELECT 1 FROM (SELECT database_name, schema_name, table_name AS name FROM "
            "duckdb_tables() UNION ALL SELECT database_name, schema_name, view_name FROM "
            "duckdb_views()) WHERE database_name = current_database() AND lower(schema_name) = "
            f"lower({schema}) AND lower(name) = lower({literal(name)}))"
        )

    def identity_fact_sql(self, qualified: str) -> str:
        """A table's CREATE statement as the catalog keeps it (no lasting identity: a table made
        again the same way has the same one; `catalog_version_sql` tells)."""
        namespace, name = self.split(qualified)
        schema = "current_schema()" if namespace is None else literal(namespace)
        return (
            "(SELECT sql FROM duckdb_tables() WHERE database_name = current_database() "
            f"AND schema_name = {schema} AND table_name = {literal(name)})"
        )

    def read_arrays(self, driver: Any, sql: str, names: tuple[str, ...]) -> dict[str, Any]:
        """DuckDB reads numpy columns itself (fetchnumpy)."""
        return dict(driver.arrays(sql))

    # ----- fragments -------------------------------------------------------------------------
    def double(self, expr: str) -> str:
        return f"{expr}::DOUBLE"

    def byte_order(self, expr: str) -> str:
        return f'{expr} COLLATE "binary"'

    def count_if(self, condition: str) -> str:
        return f"count_if({condition})"

    def non_finite(self, expr: str, column: Column) -> str | None:
        return f"isnan({expr}::DOUBLE) OR isinf({expr}::DOUBLE)"

    def member(self, expr: str, param: str, kind: str | None) -> str:
        if kind == TEXT:
            return f'{expr} COLLATE "binary" IN (SELECT unnest(:{param}) COLLATE "binary")'
        return f"{expr} IN (SELECT unnest(:{param}))"

    def keyed_hash(self, key: str, message: str) -> str | None:
        return f"sha256({key} || {message})"

    def keyed_uniform(self, key_param: str, position: str) -> str:
        digits = f"('0x' || substr(sha256(:{key_param} || ':' || {position}::VARCHAR), 1, 13))"
        return uniform_from_hex_sql(f"{digits}::UBIGINT::DOUBLE")

    def exceedances_sql(self) -> str:
        return "SELECT unnest(CAST(:positions AS BIGINT[])), unnest(CAST(:noises AS DOUBLE[]))"

    def oneshot_sql(self, ranks: str, noise_sql: str, bound: float, k: int, cap: float) -> str:
        """keyed_noise.oneshot_query over a declared rank table (rank, id, score), the
        exceedances unnested from the bound lists :positions and :noises."""
        return oneshot_query(
            ranks,
            "rank",
            noise_sql,
            self.exceedances_sql(),
            bound,
            ":k",
            "MATERIALIZED ",
            score_cap=cap,
        )

    # ----- DDL -------------------------------------------------------------------------------
    def create_rank_table(self, target: str, rows: str) -> list[str]:
        return [f"CREATE OR REPLACE TABLE {target} AS {rows} ORDER BY rank"]

    def create_runs_table(self, target: str, ranks: str) -> list[str]:
        return [
            f"CREATE OR REPLACE TABLE {target} AS SELECT min(rank) AS first_rank, score "
            f"FROM {ranks} GROUP BY score ORDER BY first_rank"
        ]

    def create_index_sql(
        self, index: str, table: str, column: str, *, if_missing: bool = False
    ) -> str:
        missing = "IF NOT EXISTS " if if_missing else ""
        return f"CREATE UNIQUE INDEX {missing}{self.quote(index)} ON {table} ({column})"

    def fill_runs_sql(self, target: str, ranks: str) -> str:
        return (
            f"INSERT INTO {target} (run, first_rank, score) SELECT row_number() OVER (ORDER BY "
            f"min(rank)) - 1, min(rank), score FROM {ranks} GROUP BY score ORDER BY 2"
        )

    def full_scans(self, driver: Driver, sql: str, params: dict[str, Any]) -> list[str]:
        """The tables EXPLAIN (FORMAT JSON) reads whole: a scan with no filter of its own,
        unless it is the probe side of a semi join on `rank` (DuckDB pushes the min and max of
        the wanted ranks into the scan, whose zone maps skip the row groups of a rank-ordered
        copy outside them)."""
        import json

        plan = json.loads(driver.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)[0][1])
        found: list[str] = []

        def walk(node: dict[str, Any], pruned: bool) -> None:
            info = node.get("extra_info") or {}
            if node.get("name", "").endswith("_SCAN") and "Table" in info:
                if "Filters" not in info and not pruned:
                    found.append(str(info["Table"]))
            semi = info.get("Join Type") == "SEMI" and str(info.get("Conditions", "")).startswith(
                "rank = "
            )
            for i, child in enumerate(node.get("children") or []):
                walk(child, semi and i == 0)

        for node in plan:
            walk(node, False)
        return found

    def analyze(self, driver: Driver, qualified: str) -> None:
        """Nothing: DuckDB keeps a table's statistics as it is written."""

    # ----- a stale copy's run (SQLAlchemyTable's declared copy) ------------------------------
    def table_seconds(self, m: int) -> float:
        return 2e-3 + TABLE_ROW * m

    def refresh_seconds(self, m: int) -> float:
        return 5e-3 + REBUILD_ROW * m

    # ----- costs -----------------------------------------------------------------------------
    def oblivious_costs(self, stale: bool) -> ObliviousCosts:
        """The copy's model, or the table's read by row id slot (not frozen)."""
        return OBLIVIOUS_COSTS_LIVE if stale else OBLIVIOUS_COSTS_COPY


__all__ = [
    "CATALOG_SCAN_MAX",
    "NUMERIC_TYPES",
    "OBLIVIOUS_COSTS_COPY",
    "OBLIVIOUS_COSTS_LIVE",
    "STORE_COSTS",
    "TEXT_TYPES",
    "DuckDBDialect",
    "kind_of",
    "literal",
    "quote_identifier",
    "rows_of",
]
