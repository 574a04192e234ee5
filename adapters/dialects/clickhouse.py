"""ClickHouse as a dialect of the SQL store engine (adapters/sql/), on chdb: ClickHouse in
process. What differs from other SQL stores, and only that:

* statements run through the chdb driver (adapters/sql/driver.py ChdbDriver); parameters are
  ClickHouse query parameters, bound by the server, never pasted into the statement text: the
  key and exceedances of the in-store one-shot stay out of it.
* reflection from system.tables and system.columns; names quoted with backquotes.
* the copy is kept as numbered versions in a manifest (copies.VersionedCopy: ClickHouse has no
  transaction to hold a run's snapshot while a refresh swaps tables), each a MergeTree table
  ordered by rank, with a small index granularity
  (INDEX_GRANULARITY rows), so that a batch of reads by rank reads few granules; ties in the
  canonical order are by id in byte order, which is how ClickHouse compares String.
* the freshness proof. ClickHouse has no triggers, so no write can be logged as it happens.
  A MergeTree table's rows live in immutable *parts*: every INSERT adds a part, every mutation
  (ALTER UPDATE / DELETE, lightweight DELETE and UPDATE) rewrites parts under new names,
  TRUNCATE and DROP PARTITION remove them, and a table made again gets a new UUID. So the
  fingerprint is the table's UUID, metadata time and the sorted names of its active parts
  (system.parts: one small query, whatever the table's size). A background merge renames parts
  without changing a row: the copy is then rebuilt for nothing (a false "stale", never a false
  "current"); `OPTIMIZE TABLE ... FINAL` before prepare() settles the parts. A table of any
  other engine (Memory, Log) has no parts: its fingerprint is a hash of every row
  (count and sum of cityHash64 over the id and score: one scan).
* keyed uniforms: SHA256() of "key:position", its first 8 bytes read big-endian, shifted to 52
  bits.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import replace
from typing import Any

from adapters.sql.copies import VersionedCopy
from adapters.sql.dialect import FLOAT, INTEGER, TEXT, Column, Dialect
from adapters.sql.driver import Driver
from adapters.sql.freshness import Fingerprint
from topk_middleware.access import StoreCosts
from topk_middleware.keyed_noise import capped_sql, uniform_from_hex_sql

INDEX_GRANULARITY = 128  # rows per granule of the copy: a read by rank reads about this many

# Measured on chdb 4.4 (ClickHouse 26.9), 2 shared cores (benchmarks/clickhouse.py): a
# statement costs a few milliseconds; a batch of reads by rank reads a granule per rank and
# walks the rank index; the keyed one-shot hashes about 2 x 10^5 rows a second (SHA-256 per
# row) and a full read brings about 3 x 10^5 rows a second into the client.
STORE_COSTS = StoreCosts(
    round_trip=5e-3,
    sorted_row=2e-7,
    random_batch=5e-3,
    random_row=2e-5,
    random_batch_item=1e-9,
    oneshot_row=5e-6,
    full_read_row=3e-6,
    oneshot_fixed=0.0,
)
ONESHOT_ITEM = 4e-7  # the keyed one-shot's scans of the copy, per item (the cut, the joins)

_INTEGERS = ("Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64")
_FLOATS = ("Float32", "Float64", "Decimal")


def kind_of(type_name: str) -> str:
    """INTEGER, FLOAT, TEXT, or the type's own name, for a ClickHouse column type."""
    inner = type_name
    for wrapper in ("Nullable(", "LowCardinality("):
        if inner.startswith(wrapper):
            inner = inner[len(wrapper) : -1]
    if inner in _INTEGERS:
        return INTEGER
    if inner.startswith(_FLOATS):
        return FLOAT
    if inner == "String":
        return TEXT
    return type_name


class ClickHouseDialect(Dialect):
    """ClickHouse's SQL (module docstring)."""

    name = "ClickHouse"
    supports_in_store_oneshot = True
    score_types = "integers or floats"
    id_types = "integers or String"
    costs = STORE_COSTS

    def layout(self, t: Any) -> VersionedCopy:
        return VersionedCopy(t)

    def proof(self, t: Any) -> Fingerprint:
        return Fingerprint(t)

    def quote(self, name: str) -> str:
        return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"

    def resolve(self, driver: Driver, table: str, namespace: str | None) -> tuple[str, str]:
        if namespace is None:
            namespace = str(driver.scalar("SELECT currentDatabase()"))
            if not self._exists(driver, namespace, table) and table.count(".") == 1:
                namespace, table = table.split(".")
        return namespace, table

    def _exists(self, driver: Driver, namespace: str, table: str) -> bool:
        return bool(
            driver.scalar(
                "SELECT count() FROM system.tables WHERE database = :db AND name = :t",
                {"db": namespace, "t": table},
            )
        )

    def columns(self, driver: Driver, namespace: str, table: str) -> dict[str, Column] | None:
        if not self._exists(driver, namespace, table):
            return None
        rows = driver.execute(
            "SELECT name, type FROM system.columns WHERE database = :db AND table = :t "
            "ORDER BY position",
            {"db": namespace, "t": table},
        )
        out = {}
        for name, type_name in rows:
            kind = kind_of(str(type_name))
            out[str(name)] = Column(kind, str(type_name), kind in (INTEGER, TEXT))
        return out

    def tables_like(self, driver: Driver, namespace: str, prefix: str) -> list[str]:
        rows = driver.execute(
            "SELECT name FROM system.tables WHERE database = :db AND startsWith(name, :p)",
            {"db": namespace, "p": prefix},
        )
        return [str(r[0]) for r in rows]

    def fingerprint(self, driver: Driver, namespace: str, table: str) -> str:
        where = {"db": namespace, "t": table}
        row = driver.one(
            "SELECT engine, toString(uuid), toString(metadata_modification_time) "
            "FROM system.tables WHERE database = :db AND name = :t",
            where,
        )
        if row is None:
            return "gone"
        engine = str(row[0])
        facts = [engine, str(row[1]), str(row[2])]
        if engine.endswith("MergeTree"):
            parts = driver.scalar(
                "SELECT arrayStringConcat(arraySort(groupArray(name)), ',') "
                "FROM system.parts WHERE database = :db AND table = :t AND active",
                where,
            )
            facts.append(str(parts))
        else:
            count, digest = driver.one(
                "SELECT count(), sum(cityHash64(*)) FROM " + self.qualified(namespace, table)
            )
            facts += [str(count), str(digest)]
        return hashlib.sha256("\0".join(facts).encode()).hexdigest()

    # ----- fragments ----------------------------------------------------------------------------
    def double(self, expr: str) -> str:
        return f"toFloat64({expr})"

    def count_if(self, condition: str) -> str:
        return f"countIf({condition})"

    def non_finite(self, expr: str, column: Column) -> str | None:
        return f"NOT isFinite({expr})" if column.kind == FLOAT else None

    def member(self, expr: str, param: str, kind: str | None) -> str:
        return f"{expr} IN :{param}"

    def keyed_uniform(self, key_param: str, position: str) -> str:
        digest = f"SHA256(concat(:{key_param}, ':', toString({position})))"
        bits = f"bitShiftRight(reinterpretAsUInt64(reverse(substring({digest}, 1, 8))), 12)"
        return uniform_from_hex_sql(f"toFloat64({bits})")

    def oneshot_sql(self, ranks: str, noise_sql: str, bound: float, k: int, cap: float) -> str:
        """keyed_noise.py's split and cut in ClickHouse's words: the exceedances and the k
        first ranks bound the k-th best value from below (`low`), so only rows whose score can
        reach it are hashed; k is a literal (a public fact), the rest are parameters."""
        score = capped_sql(self.double("r.score"), cap)
        keyed = f"{score} + {noise_sql}"
        slack = float(bound)
        if not math.isfinite(slack):
            raise ValueError("the keyed noise has no finite bound")
        not_drawn = "r.rank NOT IN (SELECT position FROM e)"
        return (
            "WITH e AS (SELECT tupleElement(pz, 1) AS position, tupleElement(pz, 2) AS z FROM "
            "(SELECT arrayJoin(arrayZip(:positions, :noises)) AS pz)), "
            f"known AS (SELECT r.rank AS position, r.id AS id, r.score AS score, {score} + e.z "
            f"AS v FROM {ranks} AS r INNER JOIN e ON r.rank = e.position "
            "WHERE r.rank IN (SELECT position FROM e) UNION ALL "
            f"SELECT r.rank, r.id, r.score, {keyed} FROM {ranks} AS r "
            f"WHERE r.rank < {int(k)} AND {not_drawn}), "
            f"(SELECT min(v) - {slack!r} - 1e-12 * abs(min(v)) FROM "
            f"(SELECT v FROM known ORDER BY v DESC LIMIT {int(k)})) AS low "
            "SELECT position AS rank, id, score FROM (SELECT position, id, score, v FROM known "
            f"UNION ALL SELECT r.rank, r.id, r.score, {keyed} FROM {ranks} AS r "
            f"WHERE r.score >= low AND r.rank >= {int(k)} AND {not_drawn}) "
            f"ORDER BY v DESC, position ASC LIMIT {int(k)}"
        )

    # ----- DDL ------------------------------------------------------------------------------------
    def create_rank_table(self, target: str, rows: str) -> list[str]:
        return [
            f"CREATE TABLE {target} ENGINE = MergeTree ORDER BY rank "
            f"SETTINGS index_granularity = {INDEX_GRANULARITY} AS "
            f"SELECT toInt64(rank) AS rank, id, score FROM ({rows})"
        ]

    def create_runs_table(self, target: str, ranks: str) -> list[str]:
        return [
            f"CREATE TABLE {target} ENGINE = MergeTree ORDER BY first AS "
            f"SELECT min(rank) AS first, score FROM {ranks} GROUP BY score"
        ]

    def drop_table(self, qualified: str) -> str:
        return f"DROP TABLE IF EXISTS {qualified} SYNC"

    def create_manifest(self, target: str) -> str:
        return (
            f"CREATE TABLE IF NOT EXISTS {target} (version UInt64, fingerprint String, "
            "m UInt64, runs UInt64) ENGINE = MergeTree ORDER BY version"
        )

    def record_version_sql(self, manifest: str) -> str:
        return (
            f"INSERT INTO {manifest} SELECT toUInt64(:version), :fingerprint, toUInt64(:m), "
            "toUInt64(:runs)"
        )

    def costs_for(self, m: int) -> StoreCosts:
        """STORE_COSTS, the keyed one-shot's scans of a copy of m rows added."""
        return replace(self.costs, oneshot_fixed=ONESHOT_ITEM * m)


__all__ = ["INDEX_GRANULARITY", "STORE_COSTS", "ClickHouseDialect", "kind_of"]
