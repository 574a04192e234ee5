"""Counts from raw events with bounded contributions: the law every store's `from_votes` counts
by, the SQL that writes it, the record kept with the counts, and the refusals in the project's
words. The SQL stores run it through adapters/sql/votes.py, Spark through adapters/spark/votes.py.

A client's contribution to an item is the number of its vote rows for the item (or the sum of
their `weight`), clipped at `max_per_item`; with `max_items_per_client` = L the client keeps only
the L items it voted for whose keyed hash SHA-256(key || len(client) || ':' || client || item) is
smallest (`clipped_counts_sql`), the key 32 fresh bytes from the secure generator, sent as a bind
parameter and never composed into the statement (a DBAPI that writes parameters into the text it
sends, pymysql or psycopg2, puts it there: the key fixes which items each client keeps, and the
bound below holds for any key). The hash names the client as well as the item, so each
client keeps its own uniformly random L of its n_c items (every L-subset equally likely for a
random key): each count becomes, in expectation, the sum over the item's clients of
min(1, L / n_c) times their clipped contribution. Which items a client keeps depends only on the
key and the client's own items, so removing a client removes only its own clipped
contributions: each count moves by at most `max_per_item`, all in the same direction, and at
most L counts move. The source's sensitivity is `max_per_item`. Every store hashes the same
message in the same way, so for one key every store keeps the same items.

Weighted counts are exact (`FIXED_POINT`): each clipped contribution is rounded down to a
multiple of 2^-20 and summed as an integer number of those units, the total clamped at 2^53
units (2^33 as a count) and divided by 2^20 in a double, which holds every such value exactly.
A sum of doubles would round, and one client could then move a rounded count by ceil(D) + 1;
with exact sums a client moves each count by at most D (rounding down keeps the contribution at
most D; the clamp is monotone and moves a count by no more than its input moved). The clip also
keeps a contribution at 0 or more, so a weight written between the checks and the count (a
negative one a concurrent writer slipped in) still moves no count by more than D; valid weights
never meet that floor.

The bounds are recorded with the table of counts (`record_text`): a table comment on DuckDB,
PostgreSQL and MariaDB / MySQL, a comment inside the CREATE TABLE statement on SQLite. Every
adapter reads it when it wraps a table (`parse_record`) and uses it where the caller declares
nothing, and refuses a declaration below it (privacy.resolve_declared): a table built with
max_per_item = 5 and opened later as a plain table keeps its sensitivity 5.
"""

from __future__ import annotations

import math
import numbers
import re
from typing import TYPE_CHECKING, Any, Protocol

from topk_middleware.randomness import secure_rng

if TYPE_CHECKING:
    from .sql.dialect import Column

UNTYPED = "untyped"  # a column kind (beside sql/dialect.py's): no declared type


def check_bounds(
    weight: str | None, max_per_item: Any, max_items_per_client: Any
) -> tuple[float | int, int | None]:
    """Refuse bad bounds before anything is read: max_per_item a positive number (an integer
    when there is no weight: counts of rows), max_items_per_client None or a positive integer."""
    if weight is not None and (not isinstance(weight, str) or not weight):
        raise TypeError(f"weight must be a column name or None, got {weight!r}")
    if isinstance(max_per_item, bool) or not isinstance(max_per_item, numbers.Real):
        raise TypeError(f"max_per_item must be a positive number, got {max_per_item!r}")
    if not (math.isfinite(max_per_item) and max_per_item > 0):
        raise ValueError(f"max_per_item must be finite and > 0, got {max_per_item!r}")
    if weight is None and not float(max_per_item).is_integer():
        raise ValueError(
            f"max_per_item must be a whole number when there is no weight (a client's votes for "
            f"an item are counted), got {max_per_item!r}"
        )
    bound: float | int = int(max_per_item) if weight is None else float(max_per_item)
    if max_items_per_client is not None:
        if isinstance(max_items_per_client, bool) or not isinstance(
            max_items_per_client, numbers.Integral
        ):
            raise TypeError(
                f"max_items_per_client must be a positive integer or None, got "
                f"{max_items_per_client!r}"
            )
        if max_items_per_client < 1:
            raise ValueError(f"max_items_per_client must be >= 1, got {max_items_per_client}")
        max_items_per_client = int(max_items_per_client)
    return bound, max_items_per_client


def simple_count(weight: str | None, max_per_item: float, max_items: int | None) -> bool:
    """COUNT(DISTINCT client) suffices: no weight, one vote per item, no item limit."""
    return weight is None and max_per_item == 1 and max_items is None


def fresh_key() -> str:
    """The keyed hash's key: 32 bytes from the secure generator, as hex (a bind parameter)."""
    return secure_rng().bytes(32).hex()


FIXED_POINT = 2**20  # weighted contributions in units of 2^-20 (module docstring)
UNITS_BOUND = 2**53  # a total above is clamped: a double holds every integer up to it
KEY_PARAMETER = "contribution_key"  # the name of the keyed hash's key among the parameters


class CountsSQL(Protocol):
    """The fragments of a store's SQL the clipped count is written in (each takes and returns
    SQL text)."""

    def text(self, expr: str) -> str:
        """`expr` as text (its canonical spelling: 42, abc)."""
        ...

    def text_length(self, expr: str) -> str:
        """The number of characters of the text `expr`."""
        ...

    def concat(self, *parts: str) -> str:
        """The texts `parts` joined."""
        ...

    def keyed_hash(self, key: str, message: str) -> str | None:
        """SHA-256 of the text `key` || `message` (UTF-8), as bytes or lower-case hex (one
        order); None where the store has no SHA-256."""
        ...

    def floor_units(self, expr: str) -> str:
        """The largest 64-bit integer <= `expr` (a number >= 0)."""
        ...

    def double(self, expr: str) -> str:
        """`expr` as a double."""
        ...


def _at_most(expr: str, bound: str) -> str:
    """`expr` clipped into [0, bound] (CASE: every store has it; NaN compares above every
    number where a store has NaN, so it clips to the bound)."""
    return f"CASE WHEN {expr} > {bound} THEN {bound} WHEN {expr} > 0 THEN {expr} ELSE 0 END"


def clipped_counts_sql(
    sql: CountsSQL,
    *,
    votes: str,
    client: str,
    item: str,
    weight: str | None,
    max_per_item: float,
    max_items: int | None,
    key: str,
) -> str:
    """SELECT it, score over `votes AS v` with clipped contributions (module docstring).
    `client`, `item`, `weight` are SQL expressions over v (quoted identifiers; ids as compared
    byte for byte), `key` the placeholder of the key's parameter, `sql` the store's
    fragments.
    The bounds are numbers the caller validated, never user text. Cost: one aggregation of the
    votes by (client, item), a window over each client's pairs with the item limit, and one
    aggregation by item."""
    bound = repr(max_per_item)
    if weight is None:
        contrib, total = _at_most("count(*)", bound), "sum(contrib)"
    else:
        clipped = _at_most(f"sum(coalesce({weight}, 0))", bound)
        contrib = sql.floor_units(f"({clipped}) * {FIXED_POINT}")
        units = f"CASE WHEN sum(contrib) > {UNITS_BOUND} THEN {UNITS_BOUND} ELSE sum(contrib) END"
        total = f"{sql.double(units)} / {FIXED_POINT}"
    per_pair = (
        f"SELECT {client} AS c, {item} AS it, {contrib} AS contrib "
        f"FROM {votes} AS v WHERE {client} IS NOT NULL AND {item} IS NOT NULL "
        f"GROUP BY {client}, {item}"
    )
    if max_items is not None:
        who, what = sql.text("c"), sql.text("it")
        # len(client) || ':' || client || item: the length names the (client, item) pair
        message = sql.concat(sql.text(sql.text_length(who)), "':'", who, what)
        hashed = sql.keyed_hash(key, message)
        if hashed is None:
            raise ValueError("max_items_per_client needs SHA-256 in the database")
        per_pair = (
            "SELECT c, it, contrib FROM (SELECT c, it, contrib, row_number() OVER "
            f"(PARTITION BY c ORDER BY {hashed}, {what}) AS r "
            f"FROM ({per_pair}) AS p) AS kept WHERE r <= {int(max_items)}"
        )
    return f"SELECT it, {total} AS score FROM ({per_pair}) AS pairs GROUP BY it"


# ----- the refusals, in the same words on every store --------------------------------------------
def no_table(where: str) -> str:
    return f"{where} does not exist"


def no_column(where: str, column: str, columns: list[str]) -> str:
    return f"{where} has no column {column!r} (columns: {columns})"


def not_comparable(where: str, column: str, type_name: str) -> str:
    return (
        f"{where} column {column!r} is {type_name}, which has no equality to group or join "
        "by: clients and item ids must be numbers, text or another comparable type"
    )


def no_declared_type(where: str, column: str) -> str:
    return (
        f"{where} column {column!r} has no declared type: declare it INTEGER or TEXT (item ids "
        "of one type)"
    )


def weight_not_numeric(where: str, column: str, type_name: str) -> str:
    return f"{where} column {column!r} is {type_name}: weights must be of a numeric type"


def ids_of_two_types(
    votes_where: str, item: str, item_type: str, items_where: str, item_id: str, id_type: str
) -> str:
    return (
        f"{votes_where} column {item!r} is {item_type} and {items_where} column {item_id!r} is "
        f"{id_type}: item ids must be of one type"
    )


def stray_votes(votes_where: str, item: str, count: int, items_where: str, example: Any) -> str:
    return (
        f"{votes_where} column {item!r} has {count} vote(s) for items not in the items table "
        f"({items_where}), e.g. {example!r}: the items table must list every item (the public "
        "domain)"
    )


def bad_weights(where: str, column: str, count: int) -> str:
    return (
        f"{where} column {column!r} has {count} negative, NaN or infinite weight(s): weights "
        "must be finite and >= 0"
    )


def non_numeric_weights(where: str, column: str, count: int) -> str:
    return (
        f"{where} column {column!r} has {count} value(s) that are not numbers: weights must be "
        "numbers"
    )


def no_hash(store: str) -> str:
    return (
        f"max_items_per_client needs SHA-256 in the database, which {store} does not have: "
        "leave it None, or count the votes on a store that has it"
    )


def check_columns(
    votes: tuple[str, dict[str, Column]],
    items: tuple[str, dict[str, Column]],
    *,
    client: str,
    item: str,
    item_id: str,
    weight: str | None,
) -> None:
    """Refuse, from the catalog alone, columns that are missing or of a type the counts cannot
    take: `votes` and `items` are (where, the table's columns as its dialect reads them:
    sql/dialect.Column). Clients and item ids need
    an equality, item ids a declared type, the weight a numeric type, and vote item ids and
    item ids one type (both numbers, both text, or both of one other type)."""
    from .sql.dialect import FLOAT, INTEGER  # here: the engine's package imports this module

    numbers = (INTEGER, FLOAT)
    (v_where, v_types), (i_where, i_types) = votes, items
    for where, types, names in (
        (v_where, v_types, [client, item] + ([] if weight is None else [weight])),
        (i_where, i_types, [item_id]),
    ):
        for name in names:
            if name not in types:
                raise ValueError(no_column(where, name, list(types)))
    for where, types, column in (
        (v_where, v_types, client),
        (v_where, v_types, item),
        (i_where, i_types, item_id),
    ):
        if not types[column].id_ok:
            raise TypeError(not_comparable(where, column, types[column].type))
        if column != client and types[column].kind == UNTYPED:
            raise TypeError(no_declared_type(where, column))
    if weight is not None and v_types[weight].kind not in (*numbers, UNTYPED):
        raise TypeError(weight_not_numeric(v_where, weight, v_types[weight].type))
    item_type, id_type = v_types[item], i_types[item_id]
    both_numbers = item_type.kind in numbers and id_type.kind in numbers
    if not both_numbers and item_type.kind != id_type.kind:
        raise TypeError(
            ids_of_two_types(v_where, item, item_type.type, i_where, item_id, id_type.type)
        )


# ----- the record: what from_votes writes beside the table of counts ----------------------------
RECORD_TAG = "topk_middleware from_votes:"
_RECORD = re.compile(
    re.escape(RECORD_TAG) + r" sensitivity=([0-9][0-9.e+]*) max_items_per_client=([0-9]+|none)"
)


def record_text(sensitivity: float, max_items: int | None) -> str:
    """The record of a from_votes table (numbers only: safe in any SQL comment or literal)."""
    limit = "none" if max_items is None else str(int(max_items))
    return (
        f"{RECORD_TAG} sensitivity={float(sensitivity)!r} max_items_per_client={limit} "
        "(each client's contribution to one count clipped at the sensitivity)"
    )


def parse_record(text: str | None) -> tuple[float, int | None] | None:
    """(sensitivity, max_items_per_client) from a table's comment or definition, or None if it
    holds no record of from_votes."""
    found = _RECORD.search(text or "")
    if found is None:
        return None
    limit = found.group(2)
    return float(found.group(1)), None if limit == "none" else int(limit)
