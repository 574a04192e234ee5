"""The sorted reads of a live PostgreSQL table, as psycopg.sql compositions the other live modules
share: the canonical order on the (score DESC, id) B-tree (text ids COLLATE "C", byte order), the
sorted walk joined to the position table, the sorted walk alone (positions = ranks), and the
conversion of integer records to numpy rows in one pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from psycopg import sql

from adapters._sql import rows_from_records
from topk_middleware.access import Rows


def order_parts(t: Any) -> list[sql.Composable]:
    """The canonical order's keys on table `t`: score descending, then id ascending (text ids in
    byte order), each to be prefixed by the table's alias."""
    id_key = sql.SQL('{} COLLATE "C"').format(t._id) if t.text_ids else t._id
    return [sql.SQL("{} DESC").format(t._score), sql.SQL("{} ASC").format(id_key)]


def sorted_live_query(t: Any) -> sql.Composable:
    """Sorted access through the position table: (position, id, score) down the B-tree."""
    return sql.SQL(
        "SELECT p.position, b.{id}, b.{score}::float8 FROM {base} AS b JOIN {pos} AS p "
        "ON p.id = b.{id} ORDER BY b.{order}"
    ).format(
        id=t._id,
        score=t._score,
        base=t._base,
        pos=t._pos,
        order=sql.SQL(", b.").join(order_parts(t)),
    )


def sorted_ranked_query(t: Any) -> sql.Composable:
    """Sorted access when positions are ranks: the B-tree alone, no position table."""
    return sql.SQL("SELECT b.{id}, b.{score}::float8 FROM {base} AS b ORDER BY b.{order}").format(
        id=t._id, score=t._score, base=t._base, order=sql.SQL(", b.").join(order_parts(t))
    )


def numeric_rows(records: list[tuple[Any, ...]], depth: int | None = None) -> Rows:
    """Rows from records of integers and a float: (position, id, score), or, with `depth`,
    (id, score) at ranks depth, depth + 1, ... (numpy converts the tuples in one pass)."""
    if not records:
        return rows_from_records([])
    if depth is None:
        table = np.array(records, dtype=[("p", np.int64), ("i", np.int64), ("s", np.float64)])
        return Rows(table["p"].copy(), table["i"].copy(), table["s"].copy())
    table = np.array(records, dtype=[("i", np.int64), ("s", np.float64)])
    ranks = np.arange(depth, depth + len(records), dtype=np.int64)
    return Rows(ranks, table["i"].copy(), table["s"].copy())
