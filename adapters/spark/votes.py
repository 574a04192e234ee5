"""Counts from raw events on Spark, each client's contribution bounded: `SparkTable.from_votes`.

Spark keeps its own engine (DataFrames, not a connection), but the idea is adapters/
contributions.py's, as on the SQL stores (adapters/sql/votes.py): the bounds and the columns'
types are checked by the same functions and refused in the same words, and the clipped count is
the same SQL (`clipped_counts_sql` in Spark's words, `SparkCounts`): a client adds to an item
min(its vote rows for the item, or the sum of their weights, `max_per_item`, weighted sums in
fixed point), to at most `max_items_per_client` of its items, those whose keyed hash
SHA-256(key || len(client) || ':' || client || item) is smallest (`sha2`: the same choice as the
other stores make for the same key), the key 32 fresh bytes from the secure generator. Removing a
client then moves each count by at most `max_per_item`, all in one direction: the source's
sensitivity. The counts are not stored, so there is no record: the source carries its bounds.

The key is a parameter of the query (`:contribution_key`), never in its text; Spark binds it into
the plan of the counts' DataFrame, so every evaluation of the counts (prepare(), a read of the
table itself) keeps the same items, and whoever can read the driver's query plans (Spark UI,
event log) can read it: it tells which items each client kept, which that reader can count from
the votes anyway.
"""

from __future__ import annotations

from typing import Any

from .. import contributions as law
from ..contributions import check_bounds, clipped_counts_sql, fresh_key, simple_count
from ..sql.dialect import FLOAT, INTEGER, TEXT, Column
from .layout import functions_for, named_column

INTEGERS = ("tinyint", "smallint", "int", "bigint")
FLOATS = ("float", "double", "decimal")


class SparkCounts:
    """Spark SQL's fragments of the clipped count (contributions.CountsSQL)."""

    def text(self, expr: str) -> str:
        return f"CAST({expr} AS STRING)"

    def text_length(self, expr: str) -> str:
        return f"length({expr})"

    def concat(self, *parts: str) -> str:
        return f"concat({', '.join(parts)})"

    def keyed_hash(self, key: str, message: str) -> str | None:
        return f"sha2(concat({key}, {message}), 256)"

    def floor_units(self, expr: str) -> str:
        return f"CAST(floor({expr}) AS BIGINT)"

    def double(self, expr: str) -> str:
        return f"CAST({expr} AS DOUBLE)"


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def column_type(type_name: str) -> Column:
    """A Spark column type (DataFrame.dtypes' spelling) as the checks read it."""
    if type_name in INTEGERS:
        kind = INTEGER
    elif type_name.startswith(FLOATS):
        kind = FLOAT
    else:
        kind = TEXT if type_name == "string" else type_name
    return Column(kind, type_name, not type_name.startswith("map<"))


def read_input(spark: Any, what: Any, role: str) -> tuple[Any, str]:
    """(the DataFrame, where it is in messages) of a catalog table, a Parquet path or a
    DataFrame (a clear error where it cannot be read)."""
    if not isinstance(what, str):
        return what, f"Spark DataFrame of {role}"
    where = f"Parquet path {what!r}" if "/" in what else f"Spark table {what!r}"
    try:
        df = spark.read.parquet(what) if "/" in what else spark.read.table(what)
        df.columns  # noqa: B018 - a path's schema is read here: a missing one fails now
    except Exception:
        raise ValueError(law.no_table(where)) from None
    return df, where


def counts_from_votes(
    spark: Any,
    votes: Any,
    items: Any,
    *,
    client: str,
    item: str,
    item_id: str,
    weight: str | None,
    max_per_item: Any,
    max_items_per_client: Any,
) -> tuple[Any, float]:
    """(the counts as a DataFrame (id, score) over every item of `items`, the sensitivity).

    Bounds and column types are checked first; then one Spark job refuses votes for items
    missing from `items` and negative, NaN or infinite weights, before anything is counted."""
    bound, max_items = check_bounds(weight, max_per_item, max_items_per_client)
    F = functions_for(spark)
    v, v_where = read_input(spark, votes, "votes")
    i, i_where = read_input(spark, items, "items")
    v_types = {name: column_type(kind) for name, kind in v.dtypes}
    i_types = {name: column_type(kind) for name, kind in i.dtypes}
    law.check_columns(
        (v_where, v_types),
        (i_where, i_types),
        client=client,
        item=item,
        item_id=item_id,
        weight=weight,
    )
    domain = i.select(named_column(spark, item_id).alias("id"))
    voted = v.where(named_column(spark, item).isNotNull())
    stray = voted.select(named_column(spark, item).alias("id")).join(domain, "id", "left_anti")
    example = F.min(F.col("id").cast("string")).alias("e")
    checks = [stray.agg(F.count(F.lit(1)).alias("n"), example)]
    if weight is not None:
        w = named_column(spark, weight).cast("double")
        bad = v.where(w.isNotNull() & ~((w >= 0) & (w < float("inf"))))
        checks.append(bad.agg(F.count(F.lit(1)).alias("n"), F.lit(None).cast("string")))
    found = checks[0] if len(checks) == 1 else checks[0].unionAll(checks[1])
    got = found.collect()
    if got[0][0]:
        raise ValueError(law.stray_votes(v_where, item, got[0][0], i_where, got[0][1]))
    if weight is not None and got[1][0]:
        raise ValueError(law.bad_weights(v_where, weight, got[1][0]))
    if simple_count(weight, bound, max_items):
        counted = voted.groupBy(named_column(spark, item).alias("id")).agg(
            F.count_distinct(named_column(spark, client)).alias("score")
        )
    else:
        query = clipped_counts_sql(
            SparkCounts(),
            votes="{votes}",
            client=f"v.{_quoted(client)}",
            item=f"v.{_quoted(item)}",
            weight=None if weight is None else f"CAST(v.{_quoted(weight)} AS DOUBLE)",
            max_per_item=bound,
            max_items=max_items,
            key=f":{law.KEY_PARAMETER}",
        )
        args = {} if max_items is None else {law.KEY_PARAMETER: fresh_key()}
        counted = spark.sql(query, args=args, votes=v).select(
            F.col("it").alias("id"), F.col("score")
        )
    kind = "BIGINT" if weight is None else "DOUBLE"
    counts = domain.join(counted, "id", "left").select(
        "id", F.coalesce(F.col("score"), F.lit(0)).cast(kind).alias("score")
    )
    return counts, float(bound)
