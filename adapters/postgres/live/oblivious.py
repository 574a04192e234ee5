"""Oblivious reads of a live PostgreSQL table (inside `oblivious_reads()`,
topk_middleware/mechanisms/oblivious.py), over the PostgreSQL dialect's pinned plans and packed
rows (adapters/dialects/postgres/oblivious.py).

An oblivious run pins its plans in its first statement (run.py), takes no runs of tied scores,
reads the top rows from the (score DESC, id) B-tree alone (access.SortedIds: no position), and
reads each drawn position on its own, one lookup of the position table and one of the id B-tree,
in a nested loop. Where the first statement finds the integer ids to be exactly 0..m-1 (the least
and the largest id, two probes of the id B-tree, and m), an item's position is its id: the
position table is not read at all (one lookup per drawn position). Integer ids come back packed
(one bytea a column); each read is one query, sent unprepared. What they cost is the measured
model LIVE_OBLIVIOUS_COSTS (adapters/dialects/postgres/costs.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from psycopg import sql

from adapters._sql import rows_from_records
from adapters.dialects.postgres import oblivious as oblivious_sql
from adapters.sql.driver import Int8Array, register_int8_arrays
from topk_middleware.access import AccessError, Rows

from .statements import order_parts


def _columns(t: Any) -> sql.Composable:
    """The select list: packed columns for integer ids, else (rank, id, score) as rows."""
    if t.integer_ids:
        return sql.SQL(oblivious_sql.PACKED_COLUMNS)
    return sql.SQL("r.rank, r.id, r.score::float8")


def _rows(t: Any, result: Any) -> Rows:
    if t.integer_ids:
        return oblivious_sql.unpack(result.fetchone())
    return rows_from_records(result.fetchall())


def sorted_rows(t: Any, dense: bool, start: int, stop: int) -> Rows:
    """Depths [start, stop) with their positions in one query (no cursor): the (score DESC, id)
    B-tree in a nested loop with the position table's B-tree on id (with `dense` ids, the B-tree
    alone: an item's position is its id)."""
    query = sql.SQL(
        "SELECT {columns} FROM (SELECT {position} AS rank, b.{id} AS id, b.{score} AS score "
        "FROM {base} AS b{join} ORDER BY b.{order} LIMIT %s OFFSET %s) AS r"
    ).format(
        position=sql.SQL("b.{}::int8").format(t._id) if dense else sql.SQL("p.position"),
        join=sql.SQL("")
        if dense
        else sql.SQL(" JOIN {} AS p ON p.id = b.{}").format(t._pos, t._id),
        columns=_columns(t),
        id=t._id,
        score=t._score,
        base=t._base,
        order=sql.SQL(", b.").join(order_parts(t)),
    )
    with t._reading() as cur:
        rows = _rows(
            t, cur.execute(query, [stop - start, start], binary=t.integer_ids, prepare=False)
        )
    if len(rows) != stop - start:
        raise AccessError(f"{t.where}: {len(rows)} rows for depths [{start}, {stop})")
    return rows


def sorted_ids(t: Any, count: int) -> Rows:
    """access.SortedIds: the top `count` rows' ids and scores from the (score DESC, id) B-tree
    alone, without the position table (positions -1)."""
    query = sql.SQL(
        "SELECT {columns} FROM (SELECT -1::int8 AS rank, b.{id} AS id, b.{score} AS score "
        "FROM {base} AS b ORDER BY b.{order} LIMIT %s) AS r"
    ).format(
        columns=_columns(t),
        id=t._id,
        score=t._score,
        base=t._base,
        order=sql.SQL(", b.").join(order_parts(t)),
    )
    with t._reading() as cur:
        rows = _rows(t, cur.execute(query, [count], binary=t.integer_ids, prepare=False))
    if len(rows) != count:
        raise AccessError(f"{t.where}: {len(rows)} rows for the top {count}")
    return rows


def positions(t: Any, dense: bool, wanted: np.ndarray) -> Rows:
    """The rows at `wanted` positions, each read on its own: one lookup of the position table's
    primary key and one of the table's id B-tree per position (with `dense` ids, the id B-tree
    alone), in a nested loop over the sorted positions."""
    wanted = np.unique(wanted)
    query = sql.SQL(
        "SELECT {columns} FROM unnest(%b::int8[]) AS q(p) CROSS JOIN LATERAL "
        "(SELECT q.p AS rank, b.{id} AS id, b.{score} AS score FROM {source} "
        "WHERE {match} OFFSET 0) AS r"
    ).format(
        source=sql.SQL("{} AS b").format(t._base)
        if dense
        else sql.SQL("{} AS p JOIN {} AS b ON b.{} = p.id").format(t._pos, t._base, t._id),
        match=sql.SQL("b.{} = q.p").format(t._id) if dense else sql.SQL("p.position = q.p"),
        columns=_columns(t),
        id=t._id,
        score=t._score,
    )
    with t._reading() as cur:
        register_int8_arrays(cur)
        result = cur.execute(query, [Int8Array.of(wanted)], binary=t.integer_ids, prepare=False)
        rows = _rows(t, result)
    return oblivious_sql.check_positions(rows, wanted, t.where)
