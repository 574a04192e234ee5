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
"""

from __future__ import annotations

import math
import numbers
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
