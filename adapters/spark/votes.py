"""Counts from raw events on Spark, each client's contribution bounded: `SparkTable.from_votes`.

The same counts as DuckDB's, PostgreSQL's and SQLAlchemy's from_votes (adapters/contributions.py,
whose SQL Spark runs as it is): a client adds to an item min(its vote rows for the item, or the
sum of their weights, `max_per_item`, weighted sums in fixed point), to at most
`max_items_per_client` of its items, those whose keyed hash SHA-256(key || len(client) || ':' ||
client || item) is smallest (`sha2` in Spark; the same choice as the other stores make for the
same key), the key 32 fresh bytes from the secure generator. Removing a client then moves each
count by at most `max_per_item`, all in one direction: the source's sensitivity.

The key is a parameter of the query (`:contribution_key`), never in its text; Spark binds it into
the plan of the counts' DataFrame, so every evaluation of the counts (prepare(), a read of the
table itself) keeps the same items, and whoever can read the driver's query plans (Spark UI,
event log) can read it: it tells which items each client kept, which that reader can count from
the votes anyway.
"""

from __future__ import annotations

from typing import Any

from ..contributions import check_bounds, clipped_counts_sql, fresh_key, simple_count
from .layout import functions_for, named_column


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def read_input(spark: Any, what: Any, label: str, columns: tuple[str, ...]) -> Any:
    """A catalog table, a Parquet path or a DataFrame holding `columns` (a clear error else)."""
    where = f"{label} {what!r}" if isinstance(what, str) else label
    try:
        df = what
        if isinstance(what, str):
            df = spark.read.parquet(what) if "/" in what else spark.read.table(what)
        names = set(df.columns)
    except Exception:
        raise ValueError(f"{where} cannot be read: it does not exist") from None
    for column in columns:
        if column not in names:
            raise ValueError(f"{where} has no column {column!r} (columns: {sorted(names)})")
    return df


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

    Bounds are checked first; then one Spark job refuses votes for items missing from `items`
    and negative, NaN or infinite weights, before anything is counted or written."""
    bound, max_items = check_bounds(weight, max_per_item, max_items_per_client)
    F = functions_for(spark)
    vote_columns = (client, item) if weight is None else (client, item, weight)
    v = read_input(spark, votes, "votes table", vote_columns)
    i = read_input(spark, items, "items table", (item_id,))
    v_kind, i_kind = dict(v.dtypes)[item], dict(i.dtypes)[item_id]
    if (v_kind == "string") != (i_kind == "string"):
        raise TypeError(
            f"votes column {item!r} is {v_kind} and items column {item_id!r} is {i_kind}: "
            "item ids must be of one type"
        )
    domain = i.select(named_column(spark, item_id).alias("id"))
    voted = v.where(named_column(spark, item).isNotNull())
    stray = voted.select(named_column(spark, item).alias("id")).join(domain, "id", "left_anti")
    checks = [stray.agg(F.count(F.lit(1)).alias("n"), F.first("id").cast("string").alias("e"))]
    if weight is not None:
        w = named_column(spark, weight).cast("double")
        bad = v.where(w.isNotNull() & ~((w >= 0) & (w < float("inf"))))
        checks.append(bad.agg(F.count(F.lit(1)).alias("n"), F.lit(None).cast("string")))
    found = checks[0] if len(checks) == 1 else checks[0].unionAll(checks[1])
    got = found.collect()
    if got[0][0]:
        raise ValueError(
            f"the votes have {got[0][0]} vote(s) for items not in the items table (e.g. "
            f"{got[0][1]!r}): the domain must list every item"
        )
    if weight is not None and got[1][0]:
        raise ValueError(
            f"the votes column {weight!r} has {got[1][0]} negative, NaN or infinite weight(s): "
            "weights must be finite and >= 0"
        )
    if simple_count(weight, bound, max_items):
        counted = voted.groupBy(named_column(spark, item).alias("id")).agg(
            F.count_distinct(named_column(spark, client)).alias("score")
        )
    else:
        query = clipped_counts_sql(
            votes="{votes}",
            client=f"v.{_quoted(client)}",
            item=f"v.{_quoted(item)}",
            weight=None if weight is None else f"CAST(v.{_quoted(weight)} AS DOUBLE)",
            max_per_item=bound,
            max_items=max_items,
            keyed_hash="sha2(concat(:contribution_key, {message}), 256)",
            as_text="CAST({} AS STRING)",
        )
        args = {} if max_items is None else {"contribution_key": fresh_key()}
        counted = spark.sql(query, args=args, votes=v).select(
            F.col("it").alias("id"), F.col("score")
        )
    kind = "BIGINT" if weight is None else "DOUBLE"
    counts = domain.join(counted, "id", "left").select(
        "id", F.coalesce(F.col("score"), F.lit(0)).cast(kind).alias("score")
    )
    return counts, float(bound)
