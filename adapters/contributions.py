"""Counts from raw events with bounded contributions: the arguments of `from_votes` and the
SQL that clips each client's contribution (DuckDB and PostgreSQL share it; SQLAlchemy builds the
same query with its expression language).

A client's contribution to an item is the number of its vote rows for the item (or the sum of
their `weight`), clipped at `max_per_item`; with `max_items_per_client` = L the client keeps only
the L items it voted for whose keyed hash SHA-256(key || item) is smallest, the key 32 fresh bytes
from the secure generator, sent as a bind parameter (never in statement text). Which items a
client keeps depends only on the key and the client's own items, so removing a client removes
only its own clipped contributions: each count moves by at most `max_per_item`, all in the same
direction, and at most L counts move. The source's sensitivity is `max_per_item`.

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


def clipped_counts_sql(
    *,
    votes: str,
    client: str,
    item: str,
    weight: str | None,
    max_per_item: float,
    max_items: int | None,
    keyed_hash: str,
    item_text: str,
) -> str:
    """SELECT it, score over `votes AS v` with clipped contributions. `client`, `item`, `weight`
    are SQL expressions over v (quoted identifiers, the item with its byte-order collation);
    `keyed_hash` an expression of the key placeholder and `item_text` (the subquery's `it` as
    text). The bounds are numbers the caller validated, never user text."""
    amount = "count(*)" if weight is None else f"sum(coalesce({weight}, 0))"
    bound = repr(max_per_item)
    per_pair = (
        f"SELECT {client} AS c, {item} AS it, least({amount}, {bound}) AS contrib "
        f"FROM {votes} AS v WHERE {client} IS NOT NULL AND {item} IS NOT NULL "
        f"GROUP BY {client}, {item}"
    )
    if max_items is not None:
        per_pair = (
            "SELECT c, it, contrib FROM (SELECT c, it, contrib, row_number() OVER "
            f"(PARTITION BY c ORDER BY {keyed_hash}, {item_text}) AS r FROM ({per_pair}) AS p) "
            f"AS kept WHERE r <= {int(max_items)}"
        )
    return f"SELECT it, sum(contrib) AS score FROM ({per_pair}) AS pairs GROUP BY it"


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
