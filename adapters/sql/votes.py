"""`from_votes` on a SQL store, written once: the checks, the counting statement and the record.

A store's from_votes hands this module its dialect (dialect.py: the catalog's columns, quoting,
casts, byte-order comparison, the keyed hash, the comment statement; the from_votes group of
fragments) and its driver (driver.py: how a statement runs); the law of the counts, the record
and the refusals' words are adapters/contributions.py's. Three steps:

* `count_votes`, before any row is read: the bounds (contributions.check_bounds); both tables
  exist and have the columns named; clients and item ids have an equality, item ids a declared
  type; the weight is of a numeric type; vote item ids and item ids are of one type (numbers,
  text, or one other type); the keyed hash exists where max_items_per_client asks for it. It
  returns `Counts`: the statement SELECT id, score over every item of the items table (a LEFT
  JOIN keeps items without votes at 0: m is the size of the public domain), with
  COUNT(DISTINCT client) where that is the count and the clipped, keyed form otherwise
  (contributions.clipped_counts_sql), ids matched and grouped byte for byte.
* `check_votes`, which reads the votes: no vote for an item missing from the items table, no
  weight that is negative, NaN, infinite or not a number. It runs in the transaction that
  counts, wherever the counting happens (here, or in a copy's build).
* `write_counts`: in one transaction, the table `into` refused where it exists (without
  `replace`) or is not a table, the checks, CREATE TABLE ... AS the statement, and the record of
  the bounds (the dialect's comment on the table).

Cost: two catalog lookups; the checks are one anti-join of the votes with the items and one
scan of the weights; the count is one pass (two aggregations and, with the item limit, one
window over each client's pairs: a sort of the (client, item) pairs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import contributions as law
from .dialect import TEXT, Column, Dialect
from .driver import Driver

DOUBLE_MAX = "1.7976931348623157e308"  # the largest finite double: above it, infinity or NaN
KEY = ":" + law.KEY_PARAMETER  # the key's placeholder


@dataclass(frozen=True)
class Counts:
    """What one from_votes call counts on one store: the statement and its checks."""

    select: str  # SELECT id, score: one row per item of the items table
    params: dict[str, Any]  # the key of the keyed hash, where the count needs one
    sensitivity: float | int
    max_items: int | None
    record: str  # contributions.record_text of the bounds
    stray: str  # SELECT count, example: votes for items missing from the items table
    non_numbers: str | None  # SELECT count: weights that are not numbers (types as hints)
    bad_weights: str | None  # SELECT count: negative, NaN or infinite weights
    wheres: tuple[str, str, str, str]  # the votes and items tables, their item and weight


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{what} must be a non-empty name, got {value!r}")
    return value


def count_votes(
    dialect: Dialect,
    driver: Driver,
    *,
    votes: str,
    items: str,
    schema: str | None,
    client: str,
    item: str,
    item_id: str,
    weight: str | None,
    max_per_item: Any,
    max_items_per_client: Any,
) -> Counts:
    """The checks that read no row (module docstring), then the counts' statement."""
    bound, max_items = law.check_bounds(weight, max_per_item, max_items_per_client)
    for value, what in ((votes, "votes"), (items, "items"), (client, "client"), (item, "item")):
        _name(value, what)
    _name(item_id, "item_id")
    if schema is not None:
        _name(schema, "schema")
    if max_items is not None and dialect.keyed_hash(KEY, "''") is None:
        raise ValueError(law.no_hash(dialect.name))
    v_where, i_where = f"{dialect.name} table {votes!r}", f"{dialect.name} table {items!r}"
    v_types = _columns(dialect, driver, schema, votes, v_where)
    i_types = _columns(dialect, driver, schema, items, i_where)
    law.check_columns(
        (v_where, v_types),
        (i_where, i_types),
        client=client,
        item=item,
        item_id=item_id,
        weight=weight,
    )
    item_type = v_types[item]
    q = dialect.quote
    v, i = dialect.qualified(schema, votes), dialect.qualified(schema, items)
    vc = _exact(dialect, f"v.{q(client)}", v_types[client])
    vi = _exact(dialect, f"v.{q(item)}", item_type)
    ii = _exact(dialect, f"i.{q(item_id)}", i_types[item_id])
    params: dict[str, Any] = {}
    if law.simple_count(weight, bound, max_items):
        select = (
            f"SELECT {ii} AS id, count(DISTINCT {vc}) AS score FROM {i} AS i "
            f"LEFT JOIN {v} AS v ON {vi} = {ii} GROUP BY {ii}"
        )
    else:
        counted = law.clipped_counts_sql(
            dialect,
            votes=v,
            client=vc,
            item=vi,
            weight=None if weight is None else f"v.{q(weight)}",
            max_per_item=bound,
            max_items=max_items,
            key=KEY,
        )
        zero = "coalesce(p.score, 0)"
        score = dialect.integer(zero) if weight is None else dialect.double(zero)
        p_it = _exact(dialect, "p.it", item_type)
        select = (
            f"SELECT {ii} AS id, {score} AS score FROM {i} AS i "
            f"LEFT JOIN ({counted}) AS p ON {p_it} = {ii}"
        )
        if max_items is not None:
            params[law.KEY_PARAMETER] = law.fresh_key()
    stray = (
        f"SELECT count(*), min({dialect.text(vi)}) FROM {v} AS v LEFT JOIN {i} AS i "
        f"ON {vi} = {ii} WHERE v.{q(item)} IS NOT NULL AND i.{q(item_id)} IS NULL"
    )
    non_numbers = bad_weights = None
    if weight is not None:
        w = f"v.{q(weight)}"
        as_double, top = dialect.double(w), dialect.double(DOUBLE_MAX)
        bad = f"{w} IS NOT NULL AND NOT ({as_double} >= 0 AND {as_double} <= {top})"
        bad_weights = f"SELECT count(*) FROM {v} AS v WHERE {bad}"
        typed = dialect.non_numbers(w)
        non_numbers = None if typed is None else f"SELECT count(*) FROM {v} AS v WHERE {typed}"
    return Counts(
        select=select,
        params=params,
        sensitivity=bound,
        max_items=max_items,
        record=law.record_text(bound, max_items),
        stray=stray,
        non_numbers=non_numbers,
        bad_weights=bad_weights,
        wheres=(v_where, i_where, item, weight or ""),
    )


def check_votes(driver: Driver, counts: Counts) -> None:
    """The checks that read the votes: votes for items missing from the items table, weights
    that are not numbers (where a store's types are hints), negative, NaN or infinite."""
    v_where, i_where, item, weight = counts.wheres
    found, example = driver.one(counts.stray)
    if found:
        raise ValueError(law.stray_votes(v_where, item, int(found), i_where, example))
    for check, words in (
        (counts.non_numbers, law.non_numeric_weights),
        (counts.bad_weights, law.bad_weights),
    ):
        bad = 0 if check is None else int(driver.scalar(check) or 0)
        if bad:
            raise ValueError(words(v_where, weight, bad))


def write_counts(
    dialect: Dialect,
    driver: Driver,
    counts: Counts,
    *,
    into: str,
    schema: str | None,
    replace: bool,
) -> None:
    """The table of counts `into` (columns id, score) and the record of its bounds, in one
    transaction, after the checks that read the votes."""
    _name(into, "into")
    if not isinstance(replace, bool):
        raise TypeError(f"replace must be True or False, got {replace!r}")
    where = f"{dialect.name} table {into!r}"
    inputs = {counts.wheres[0], counts.wheres[1]}
    if where.casefold() in {w.casefold() for w in inputs}:
        raise ValueError(
            f"{where} is where the counts would go and one of the tables they are counted "
            "from: pass another name as into="
        )
    out = dialect.qualified(schema, into)
    with driver.transaction():
        found = dialect.columns(driver, schema, into) is not None
        if found and not replace:
            raise ValueError(
                f"{where} (where the counts go) already exists: pass replace=True to replace "
                "it, or another name as into="
            )
        if found and not dialect.is_table(driver, schema, into):
            raise ValueError(
                f"{where} (where the counts go) is a view, not a table: pass another name as into="
            )
        check_votes(driver, counts)
        if found:
            driver.execute(f"DROP TABLE {out}")
        driver.execute(f"CREATE TABLE {out} AS {counts.select}", counts.params)
        driver.execute(dialect.comment_statement(out, counts.record))


def _exact(dialect: Dialect, expr: str, column: Column) -> str:
    """`expr` compared and grouped byte for byte: text in byte order (no case, accent or
    trailing space ignored)."""
    return dialect.byte_order(expr) if column.kind == TEXT else expr


def _columns(
    dialect: Dialect, driver: Driver, schema: str | None, table: str, where: str
) -> dict[str, Column]:
    """The table's columns (a clear error where there is no such table)."""
    found = dialect.columns(driver, schema, table)
    if found is None:
        raise ValueError(law.no_table(where))
    return found
