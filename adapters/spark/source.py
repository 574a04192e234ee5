"""The source of a SparkTable: naming it, reading it as a DataFrame, checking its columns, and
listing its files with the copy's versions (the source's fingerprint).

A catalog table is named as the catalog spells it, a DataFrame by a hash of its plan; both name
the copy's default place (table.py). A Parquet path is read with the schema Spark inferred from
its files, inferred again (one Spark job) when its files change. The listing is Hadoop calls on
a classic session, one Spark job on Spark Connect (storage.py); the fingerprint is a SHA-1 of
the files' (path, length, modification time) and the schema, "" where Spark lists no files.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .layout import named_column
from .storage import Listing


def catalog_name(spark: Any, table: str) -> str:
    """A catalog table's name as the catalog spells it, `database.table` (Spark folds and
    unquotes: `T`, `default.t` and `` `default`.`t` `` are one table, with one copy), or the
    name as given where the catalog finds nothing (reading it says so)."""
    try:
        found = spark.catalog.getTable(table)
    except Exception:  # no such table (the read says so), or a catalog that cannot tell
        return table
    named = ".".join([*(found.namespace or []), found.name])  # as written but unquoted
    sensitive = str(spark.conf.get("spark.sql.caseSensitive", "false")).lower()
    return named if sensitive == "true" else named.lower()


def plan_hash(frame: Any) -> str:
    """A short hash of a DataFrame's plan (Spark's semantic hash: equal for equal plans)."""
    try:
        semantic = frame.semanticHash()
    except Exception:
        raise ValueError(
            "the DataFrame cannot be analysed: pass copy= (where its copy goes)"
        ) from None
    return hashlib.sha1(str(semantic).encode()).hexdigest()[:12]


def read_source(t: Any, *, infer: bool = False) -> Any:
    """The source as a DataFrame (a clear error if it cannot be read). A Parquet path is
    read with the schema Spark found in its files (schema inference is a Spark job: made
    once, and again when the files change, `_listing`), or found again if `infer`."""
    if t._frame is not None:
        return t._frame
    try:
        if not t.is_path:
            return t.spark.read.table(t.table)
        if t._schema is not None and not infer:
            return t.spark.read.schema(t._schema[1]).parquet(t.table)
        frame = t.spark.read.parquet(t.table)
    except Exception:
        raise ValueError(
            f"{t.where} cannot be read: it does not exist or is not readable"
        ) from None
    t._schema = (None, frame.schema)  # the files it holds for: set by source_listing
    return frame


def check_columns(t: Any) -> str:
    """The table and its columns exist, ids are integers or text, the score is numeric;
    returns the id column's Spark type (DDL)."""
    from pyspark.sql.types import IntegralType, NumericType, StringType

    try:
        fields = {f.name: f.dataType for f in read_source(t).schema.fields}
    except ValueError:
        raise
    except Exception:
        raise ValueError(
            f"{t.where} cannot be read: it does not exist or is not readable"
        ) from None
    for column in (t.id_column, t.score_column):
        if column not in fields:
            raise ValueError(f"{t.where} has no column {column!r} (columns: {sorted(fields)})")
    id_type, score_type = fields[t.id_column], fields[t.score_column]
    if not isinstance(score_type, NumericType):
        raise TypeError(
            f"{t.where} column {t.score_column!r} must be numeric, it is "
            f"{score_type.simpleString()}"
        )
    if not isinstance(id_type, IntegralType | StringType):
        raise TypeError(
            f"{t.where} column {t.id_column!r} must hold integers or text, it is "
            f"{id_type.simpleString()}"
        )
    return "BIGINT" if isinstance(id_type, IntegralType) else "STRING"


def columns(t: Any, frame: Any = None) -> Any:
    """The source as (id, score): ids as BIGINT or STRING, scores as DOUBLE."""
    return (read_source(t) if frame is None else frame).select(
        named_column(t.spark, t.id_column).cast(t._id_type).alias("id"),
        named_column(t.spark, t.score_column).cast("double").alias("score"),
    )


def source_listing(t: Any, versions: bool = True) -> tuple[str, Any, Listing]:
    """(the source's fingerprint, its DataFrame as listed now, the storage listing with the
    copy's versions): Hadoop calls on a classic session, one job on Spark Connect. A Parquet
    path whose files changed has its schema read again (one job)."""
    if t.table is not None and not t.is_path:
        try:
            t.spark.catalog.refreshTable(t.table)  # drop a cached file listing
        except Exception:
            pass
    try:
        frame = read_source(t)
        files = sorted(frame.inputFiles())
        listing = t._storage.look(files, t.copy if versions else None)
        statuses = tuple((f.path, f.size, f.modified) for f in listing.files)
        if t.is_path and t._schema is not None and t._schema[0] != statuses:
            if t._schema[0] is not None:  # the files changed: so may have their schema
                frame = read_source(t, infer=True)
            t._schema = (statuses, frame.schema)
        schema = frame.schema.json()
    except ValueError:
        raise
    except Exception:
        raise ValueError(f"{t.where} cannot be read: it does not exist") from None
    if not statuses:
        return "", frame, listing
    text = json.dumps({"files": statuses, "schema": schema})
    return hashlib.sha1(text.encode("utf-8")).hexdigest(), frame, listing
