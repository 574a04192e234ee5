"""ClickHouse as a dialect of the SQL store engine (adapters/sql/), on chdb: ClickHouse in
process. What differs from other SQL stores, and only that:

* statements run through chdb's `query(sql, "ArrowTable", params=...)`; parameters are
  ClickHouse query parameters (`{name:Type}`), bound by the server, never pasted into the
  statement text: the key and exceedances of the in-store one-shot stay out of it.
* reflection from system.tables and system.columns; names quoted with backquotes.
* the copy is a MergeTree table ordered by rank, with a small index granularity
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

import numpy as np

from topk_middleware.access import StoreCosts
from topk_middleware.keyed_noise import uniform_from_hex_sql
from topk_middleware.validation import first_line

from ..sql.dialect import FLOAT, INTEGER, TEXT, Dialect

try:
    import chdb
except ImportError as error:  # pragma: no cover - the 'clickhouse' extra
    raise ImportError(
        "adapters.clickhouse needs chdb: pip install 'topk_middleware[clickhouse]'"
    ) from error

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


def _param(value: Any) -> Any:
    """A parameter value in the text form ClickHouse parses it from: a string with its
    backslashes, tabs and newlines escaped; an array of strings as a quoted array literal
    (chdb would send its elements unquoted). Still a parameter, never statement text."""
    if isinstance(value, str):
        return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
    if isinstance(value, list) and value and isinstance(value[0], str):
        quoted = (v.replace("\\", "\\\\").replace("'", "\\'") for v in value)
        return "[" + ",".join(f"'{v}'" for v in quoted) + "]"
    return value


class ClickHouseError(RuntimeError):
    """A statement ClickHouse refused, in one line."""


class ClickHouseDialect(Dialect):
    """The dialect over one chdb connection (or session), or a database path it opens."""

    name = "ClickHouse"
    supports_in_store_oneshot = True
    parameters_in_text = False
    costs = STORE_COSTS

    def __init__(self, connection: Any) -> None:
        if isinstance(connection, str):
            connection = chdb.connect(connection)
        if not callable(getattr(connection, "query", None)):
            raise TypeError(
                "ClickHouseTable needs a chdb connection (chdb.connect(path)), a chdb session "
                f"or a database path, got {type(connection).__name__}"
            )
        self.connection = connection

    def query(self, sql: str, params: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
        values = {name: _param(value) for name, value in (params or {}).items()}
        try:
            table = self.connection.query(sql, "ArrowTable", params=values or None)
        except Exception as error:  # chdb raises its own RuntimeError subclasses
            raise ClickHouseError(f"ClickHouse: {first_line(error)}") from None
        if table is None or not hasattr(table, "column_names"):
            return {}
        return {
            name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names
        }

    def quote(self, name: str) -> str:
        return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"

    def resolve(self, table: str, namespace: str | None) -> tuple[str, str]:
        if namespace is None:
            namespace = str(self.query("SELECT currentDatabase() AS db")["db"][0])
            if not self._exists(namespace, table) and table.count(".") == 1:
                namespace, table = table.split(".")
        return namespace, table

    def _exists(self, namespace: str, table: str) -> bool:
        got = self.query(
            "SELECT count() AS n FROM system.tables WHERE database = {db:String} "
            "AND name = {t:String}",
            {"db": namespace, "t": table},
        )
        return bool(got["n"][0])

    def columns(self, namespace: str, table: str) -> dict[str, str] | None:
        if not self._exists(namespace, table):
            return None
        got = self.query(
            "SELECT name, type FROM system.columns WHERE database = {db:String} "
            "AND table = {t:String} ORDER BY position",
            {"db": namespace, "t": table},
        )
        return {str(n): kind_of(str(t)) for n, t in zip(got["name"], got["type"], strict=True)}

    def create_rank_table(self, target: str, source: str, id: str, score: str) -> None:
        self.query(
            f"CREATE TABLE {target} ENGINE = MergeTree ORDER BY rank "
            f"SETTINGS index_granularity = {INDEX_GRANULARITY} AS "
            f"SELECT toInt64(row_number() OVER (ORDER BY {score} DESC, {id} ASC) - 1) AS rank, "
            f"{id} AS id, {score} AS score FROM {source}"
        )

    def create_runs_table(self, target: str, ranks: str) -> None:
        self.query(
            f"CREATE TABLE {target} ENGINE = MergeTree ORDER BY first AS "
            f"SELECT min(rank) AS first, score FROM {ranks} GROUP BY score"
        )

    def drop_table(self, qualified: str) -> None:
        self.query(f"DROP TABLE IF EXISTS {qualified} SYNC")

    def create_manifest(self, target: str) -> None:
        self.query(
            f"CREATE TABLE IF NOT EXISTS {target} (version UInt64, fingerprint String, "
            "m UInt64, runs UInt64) ENGINE = MergeTree ORDER BY version"
        )

    def record_version(
        self, manifest: str, version: int, fingerprint: str, m: int, runs: int
    ) -> None:
        self.query(
            f"INSERT INTO {manifest} SELECT {{v:UInt64}}, {{f:String}}, {{m:UInt64}}, {{r:UInt64}}",
            {"v": version, "f": fingerprint, "m": m, "r": runs},
        )

    def forget_version(self, manifest: str, version: int) -> None:
        self.query(f"DELETE FROM {manifest} WHERE version = {{v:UInt64}}", {"v": version})

    def tables_like(self, namespace: str, prefix: str) -> list[str]:
        got = self.query(
            "SELECT name FROM system.tables WHERE database = {db:String} "
            "AND startsWith(name, {p:String})",
            {"db": namespace, "p": prefix},
        )
        return [str(n) for n in got.get("name", [])]

    def fingerprint(self, namespace: str, table: str) -> str:
        where = {"db": namespace, "t": table}
        got = self.query(
            "SELECT engine, toString(uuid) AS uuid, "
            "toString(metadata_modification_time) AS meta FROM system.tables "
            "WHERE database = {db:String} AND name = {t:String}",
            where,
        )
        if not len(got.get("engine", [])):
            return "gone"
        engine = str(got["engine"][0])
        facts = [engine, str(got["uuid"][0]), str(got["meta"][0])]
        if engine.endswith("MergeTree"):
            parts = self.query(
                "SELECT arrayStringConcat(arraySort(groupArray(name)), ',') AS parts "
                "FROM system.parts WHERE database = {db:String} AND table = {t:String} "
                "AND active",
                where,
            )
            facts.append(str(parts["parts"][0]))
        else:
            rows = self.query(
                "SELECT count() AS n, sum(cityHash64(*)) AS h FROM "
                + self.qualified(namespace, table)
            )
            facts += [str(rows["n"][0]), str(rows["h"][0])]
        return hashlib.sha256("\0".join(facts).encode()).hexdigest()

    def costs_for(self, m: int) -> StoreCosts:
        """STORE_COSTS, the keyed one-shot's scans of a copy of m rows added."""
        return replace(self.costs, oneshot_fixed=ONESHOT_ITEM * m)

    def in_array(self, param: str, kind: str) -> str:
        return f"{{{param}:Array({'String' if kind == TEXT else 'Int64'})}}"

    def double(self, expr: str) -> str:
        return f"toFloat64({expr})"

    def keyed_uniform(self, key_param: str, position: str) -> str:
        digest = f"SHA256(concat({{{key_param}:String}}, ':', toString({position})))"
        bits = f"bitShiftRight(reinterpretAsUInt64(reverse(substring({digest}, 1, 8))), 12)"
        return uniform_from_hex_sql(f"toFloat64({bits})")

    def oneshot_sql(self, ranks: str, noise_sql: str, score: str, bound: float, k: int) -> str:
        """keyed_noise.py's split and cut in ClickHouse's words: the exceedances and the k
        first ranks bound the k-th best value from below (`low`), so only rows whose score can
        reach it are hashed; k is a literal (a public fact), the rest are parameters."""
        keyed = f"{score} + {noise_sql}"
        slack = float(bound)
        if not math.isfinite(slack):
            raise ValueError("the keyed noise has no finite bound")
        not_drawn = "r.rank NOT IN (SELECT position FROM e)"
        return (
            "WITH e AS (SELECT tupleElement(pz, 1) AS position, tupleElement(pz, 2) AS z FROM "
            "(SELECT arrayJoin(arrayZip({positions:Array(Int64)}, {noises:Array(Float64)})) "
            "AS pz)), "
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


__all__ = ["INDEX_GRANULARITY", "STORE_COSTS", "ClickHouseDialect", "ClickHouseError", "kind_of"]
