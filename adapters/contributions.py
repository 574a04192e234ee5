"""Counts from raw events with bounded contributions: the arguments of `from_votes` and the
SQL that clips each client's contribution (DuckDB, PostgreSQL and Spark share it; SQLAlchemy
builds the same query with its expression language).

A client's contribution to an item is the number of its vote rows for the item (or the sum of
their `weight`), clipped at `max_per_item`; with `max_items_per_client` = L the client keeps only
the L items it voted for whose keyed hash SHA-256(key || len(client) || ':' || client || item) is
smallest (`hash_message`), the key 32 fresh bytes from the secure generator, sent as a bind
parameter (never in statement text). The hash names the client as well as the item, so each
client keeps its own uniformly random L of its n_c items (every L-subset equally likely for a
random key): each count becomes, in expectation, the sum over the item's clients of
min(1, L / n_c) times their clipped contribution. Which items a client keeps depends only on the
key and the client's own items, so removing a client removes only its own clipped
contributions: each count moves by at most `max_per_item`, all in the same direction, and at
most L counts move. The source's sensitivity is `max_per_item`.

Weighted counts are exact (`FIXED_POINT`): each clipped contribution is rounded down to a
multiple of 2^-20 and summed as an integer number of those units, the total clamped at 2^53
units (2^33 as a count) and divided by 2^20 in a double, which holds every such value exactly.
A sum of doubles would round, and one client could then move a rounded count by ceil(D) + 1;
with exact sums a client moves each count by at most D (rounding down keeps the contribution at
most D; the clamp is monotone and moves a count by no more than its input moved).

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
from typing import Any

from topk_middleware.randomness import secure_rng


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


def hash_message(as_text: str) -> str:
    """len(client) || ':' || client || item as SQL text over the columns `c` and `it`
    (`as_text` a format string casting {} to text): the length prefix makes the message name
    the (client, item) pair unambiguously."""
    client = as_text.format("c")
    return f"{as_text.format(f'length({client})')} || ':' || {client} || {as_text.format('it')}"


def clipped_counts_sql(
    *,
    votes: str,
    client: str,
    item: str,
    weight: str | None,
    max_per_item: float,
    max_items: int | None,
    keyed_hash: str,
    as_text: str,
    double: str = "DOUBLE",
) -> str:
    """SELECT it, score over `votes AS v` with clipped contributions. `client`, `item`, `weight`
    are SQL expressions over v (quoted identifiers, the item with its byte-order collation);
    `keyed_hash` a format string of the key placeholder around {message} (`hash_message`),
    `as_text` one casting {} to text, `double` the store's name of the double type. The bounds
    are numbers the caller validated, never user text. Weighted contributions are summed in
    fixed point (module docstring)."""
    bound = repr(max_per_item)
    if weight is None:
        contrib, total = f"least(count(*), {bound})", "sum(contrib)"
    else:
        clipped = f"least(sum(coalesce({weight}, 0)), {bound})"
        contrib = f"CAST(floor({clipped} * {FIXED_POINT}) AS BIGINT)"
        total = f"CAST(least(sum(contrib), {UNITS_BOUND}) AS {double}) / {FIXED_POINT}"
    per_pair = (
        f"SELECT {client} AS c, {item} AS it, {contrib} AS contrib "
        f"FROM {votes} AS v WHERE {client} IS NOT NULL AND {item} IS NOT NULL "
        f"GROUP BY {client}, {item}"
    )
    if max_items is not None:
        hashed = keyed_hash.format(message=hash_message(as_text))
        per_pair = (
            "SELECT c, it, contrib FROM (SELECT c, it, contrib, row_number() OVER "
            f"(PARTITION BY c ORDER BY {hashed}, {as_text.format('it')}) AS r "
            f"FROM ({per_pair}) AS p) AS kept WHERE r <= {int(max_items)}"
        )
    return f"SELECT it, {total} AS score FROM ({per_pair}) AS pairs GROUP BY it"


# What from_votes writes beside the table of counts, and how adapters find it again.
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
