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
* the measured costs below (benchmarks/wallclock.py, benchmarks/sizes.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from adapters._sql import sql_name_spellings
from adapters.sql.dialect import FLOAT, INTEGER, TEXT, Column, Dialect
from adapters.sql.driver import Driver
from adapters.sql.freshness import Unprovable
from topk_middleware.access import Rows, StoreCosts
from topk_middleware.keyed_noise import uniform_from_hex_sql
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
    """INTEGER, FLOAT, TEXT, or the type's own name, for a DuckDB column type."""
    if type_name.startswith(INTEGER_TYPES):
        return INTEGER
    if type_name.startswith(NUMERIC_TYPES):
        return FLOAT
    if type_name.startswith(TEXT_TYPES):
        return TEXT
    return type_name


class DuckDBDialect(Dialect):
    """DuckDB's SQL (module docstring)."""

    name = "DuckDB"
    supports_in_store_oneshot = True
    reads_tables = True
    score_types = "an integer, floating point or decimal type"
    id_types = "any type with an equality"
    costs = STORE_COSTS
    whole_read_rows = WHOLE_READ_ROWS

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
                return (None if spelled_schema is None else home), name
        return namespace, table

    # ----- catalog ---------------------------------------------------------------------------
    def columns(self, driver: Driver, namespace: Any, table: str) -> dict[str, Column] | None:
        """The columns DuckDB describes (None where the name finds nothing). A temporary table
        or view of the caller's connection (con.register() of a frame makes one) is refused:
        runs read through cursors of their own, which do not see it."""
        source = self.qualified(namespace, table)
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

    def keyed_uniform(self, key_param: str, position: str) -> str:
        digits = f"('0x' || substr(sha256(:{key_param} || ':' || {position}::VARCHAR), 1, 13))"
        return uniform_from_hex_sql(f"{digits}::UBIGINT::DOUBLE")

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
