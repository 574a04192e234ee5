"""A live PostgreSQL table's reads, written once for psycopg (adapters/postgres/live/) and SPI
inside the server (frontends/plpython.py over spi.SPIDriver), over the same structures: the
(score DESC, id) B-tree, the unique B-tree on id, the position table (position, id). Statements
use the engine's `:name` placeholders, which each driver binds its own way, over the quoted
names of `LiveNames`. Cost: one statement a call, one B-tree lookup (two through the position
table) a row.

Oblivious reads (mechanisms/oblivious.py): the top rows from the (score DESC, id) B-tree alone
(positions -1), depths with their positions in one query, and each drawn position on its own in
a nested loop over the sorted positions, through the position table or, where the ids are
exactly 0..m-1 (`dense`), the id B-tree alone (an item's position is its id); integer ids packed
(oblivious.PACKED_COLUMNS). Keyset pages (`pages_sql`) serve sorted access to a driver without
server-side cursors (SPI): each page after the first starts after the last row served, as the
union of the rest of its tie and the lower scores, both index ranges in the columns' own types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from adapters._sql import plain_values, rows_from_records, scores_in_order
from adapters.sql.driver import Driver, Int8Array
from topk_middleware.access import AccessError, Rows

from .oblivious import PACKED_COLUMNS, unpack


@dataclass(frozen=True)
class LiveNames:
    """The quoted names a live table's statements are written over."""

    base: str  # the table, qualified
    pos: str  # its position table, qualified
    id: str
    score: str
    text_ids: bool  # ordered in byte order (COLLATE "C")
    integer_ids: bool  # oblivious reads come back packed

    @property
    def order(self) -> str:
        """The canonical order on alias b: score descending, then id (text in byte order)."""
        key = f'b.{self.id} COLLATE "C"' if self.text_ids else f"b.{self.id}"
        return f"ORDER BY b.{self.score} DESC, {key}"


def _select(n: LiveNames) -> str:
    return f"SELECT p.position, b.{n.id} AS id, b.{n.score}::float8 AS score"


def _joined(n: LiveNames) -> str:
    """The position table first: lookups by position (joins run in the order written where an
    oblivious run pins join_collapse_limit = 1)."""
    return f"{n.pos} AS p JOIN {n.base} AS b ON b.{n.id} = p.id"


def _in_order(n: LiveNames) -> str:
    """The table first: a walk down the (score DESC, id) B-tree, each row's position looked up."""
    return f"{n.base} AS b JOIN {n.pos} AS p ON p.id = b.{n.id}"


def pages_sql(n: LiveNames) -> dict[str, str]:
    """Keyset pages (module docstring): "first" (:count), "offset" (:count, :start), "after"
    (:count after the row (:score, :id), both in the columns' own types); each row
    (position, id, score as float8, raw: the score in its own type)."""
    select = _select(n) + f", b.{n.score} AS raw FROM {_in_order(n)}"
    collate = ' COLLATE "C"' if n.text_ids else ""
    key = f"b.{n.id}{collate}"
    return {
        "first": f"{select} {n.order} LIMIT :count",
        "offset": f"{select} {n.order} LIMIT :count OFFSET :start",
        "after": f"SELECT * FROM (({select} WHERE b.{n.score} = :score AND {key} > :id "
        f"{n.order} LIMIT :count) UNION ALL ({select} WHERE b.{n.score} < :score {n.order} "
        f"LIMIT :count)) AS page ORDER BY raw DESC, id{collate} LIMIT :count",
    }


def read_positions(driver: Driver, n: LiveNames, positions: np.ndarray) -> Rows:
    """The rows at `positions`: the position table's primary key, then the id B-tree."""
    wanted = plain_values(np.asarray(positions, dtype=np.int64))
    if not wanted:
        return rows_from_records([])
    query = f"{_select(n)} FROM {_joined(n)} WHERE p.position = ANY(CAST(:positions AS int8[]))"
    return rows_from_records(driver.execute(query, {"positions": wanted}))


def _by_id(driver: Driver, n: LiveNames, wanted: list[Any], cast: str) -> dict[Any, Any]:
    query = f"SELECT b.{n.id} AS id, b.{n.score}{cast} AS score FROM {n.base} AS b "
    return dict(driver.execute(query + f"WHERE b.{n.id} = ANY(:ids)", {"ids": wanted}))


def read_ids(driver: Driver, n: LiveNames, ids: Sequence[Any], where: str) -> np.ndarray:
    """The scores (float8) of the named items, by the id B-tree."""
    wanted = plain_values(ids)
    if not wanted:
        return np.empty(0, dtype=np.float64)
    return scores_in_order(_by_id(driver, n, wanted, "::float8"), wanted, where)


def read_exact_scores(driver: Driver, n: LiveNames, ids: Sequence[Any], where: str) -> list[Any]:
    """The scores of the named items in the table's own type (the driver's conversions)."""
    wanted = plain_values(ids)
    if not wanted:
        return []
    found = _by_id(driver, n, wanted, "")
    try:
        return [found[item] for item in wanted]
    except KeyError as missing:
        raise AccessError(f"{where} has no item with id {missing.args[0]!r}") from None


def _oblivious_rows(driver: Driver, n: LiveNames, query: str, params: dict[str, Any]) -> Rows:
    """One oblivious read, sent unprepared by a driver that would prepare it later (a plan
    cached under other settings would be reused); integer ids packed (in binary where the
    driver reads binary)."""
    if not n.integer_ids:
        return rows_from_records(driver.execute(query, params, prepare=False))
    found = driver.execute(query, params, prepare=False, binary=driver.binary_reads)
    return unpack(found[0] if found else None)


def _columns(n: LiveNames) -> str:
    return PACKED_COLUMNS if n.integer_ids else "r.rank, r.id, r.score::float8"


def read_top_ids(driver: Driver, n: LiveNames, count: int, where: str) -> Rows:
    """access.SortedIds: the top `count` rows' ids and scores, the (score DESC, id) B-tree
    alone (positions -1)."""
    query = (
        f"SELECT {_columns(n)} FROM (SELECT CAST(-1 AS int8) AS rank, b.{n.id} AS id, "
        f"b.{n.score} AS score FROM {n.base} AS b {n.order} LIMIT :count) AS r"
    )
    rows = _oblivious_rows(driver, n, query, {"count": int(count)})
    if len(rows) != count:
        raise AccessError(f"{where}: {len(rows)} rows for the top {count}")
    return rows


def read_depths(
    driver: Driver, n: LiveNames, dense: bool, start: int, stop: int, where: str
) -> Rows:
    """Oblivious sorted access: depths [start, stop) with their positions in one query, the
    (score DESC, id) B-tree in a nested loop with the position table's B-tree on id (with
    `dense` ids, the B-tree alone: an item's position is its id)."""
    rank = f"CAST(b.{n.id} AS int8)" if dense else "p.position"
    query = (
        f"SELECT {_columns(n)} FROM (SELECT {rank} AS rank, b.{n.id} AS id, b.{n.score} AS "
        f"score FROM {f'{n.base} AS b' if dense else _in_order(n)} {n.order} "
        "LIMIT :count OFFSET :start) AS r"
    )
    rows = _oblivious_rows(driver, n, query, {"count": stop - start, "start": start})
    if len(rows) != stop - start:
        raise AccessError(f"{where}: {len(rows)} rows for depths [{start}, {stop})")
    return rows


def read_each_position(
    driver: Driver, n: LiveNames, dense: bool, positions: np.ndarray, where: str
) -> Rows:
    """The rows at `positions`, each read on its own (module docstring); exactly the sorted
    positions asked for, else an AccessError."""
    wanted = np.unique(np.asarray(positions, dtype=np.int64))
    source = f"{n.base} AS b" if dense else _joined(n)
    match = f"b.{n.id} = q.p" if dense else "p.position = q.p"
    query = (
        f"SELECT {_columns(n)} FROM unnest(CAST(:positions AS int8[])) AS q(p) CROSS JOIN "
        f"LATERAL (SELECT q.p AS rank, b.{n.id} AS id, b.{n.score} AS score FROM {source} "
        f"WHERE {match} OFFSET 0) AS r"
    )
    value = Int8Array.of(wanted) if driver.binary_arrays else wanted.tolist()
    rows = _oblivious_rows(driver, n, query, {"positions": value})
    if len(rows) != len(wanted) or not np.array_equal(rows.positions, wanted):
        raise AccessError(f"{where}: a drawn position has no row (call prepare() again)")
    return rows


def facts_sql(n: LiveNames) -> str:
    """A run's first facts where its settings are pinned elsewhere (SPI: the SQL functions' SET
    clauses): the triggers named :triggers on :relation (three), then m, the largest and the
    smallest score, and, for integer ids, the least and the largest id (with m, whether the ids
    are 0..m-1): catalog lookups and index probes, never a count of the table."""
    ids = (
        f"(SELECT b.{n.id}::int8 FROM {n.base} AS b ORDER BY b.{n.id} ASC LIMIT 1) AS low, "
        f"(SELECT b.{n.id}::int8 FROM {n.base} AS b ORDER BY b.{n.id} DESC LIMIT 1) AS high"
        if n.integer_ids
        else "NULL::int8 AS low, NULL::int8 AS high"
    )
    return (
        "SELECT (SELECT count(*) FROM pg_catalog.pg_trigger WHERE tgrelid = "
        "CAST(:relation AS regclass) AND tgname LIKE :triggers AND NOT tgisinternal) AS triggers, "
        f"(SELECT position + 1 FROM {n.pos} ORDER BY position DESC LIMIT 1) AS m, "
        f"(SELECT b.{n.score}::float8 FROM {n.base} AS b ORDER BY b.{n.score} DESC LIMIT 1) "
        f"AS top, (SELECT b.{n.score}::float8 FROM {n.base} AS b ORDER BY b.{n.score} ASC "
        f"NULLS LAST LIMIT 1) AS bottom, {ids}"
    )


def check_facts(where: str, column: str, m: Any, top: Any, bottom: Any) -> int:
    """m, once the run's first facts show a table with rows whose scores are all finite and
    >= 0 (NULL, NaN and infinity sort first in a descending B-tree); else the refusal."""
    if m is None:
        raise ValueError(f"{where} is empty: there is no item to select")
    column = f"{where} column {column!r}"
    if top is None:
        raise ValueError(f"{column} has NULL score(s)")
    if not np.isfinite(top):
        raise ValueError(f"{column} has non-finite score(s) (NaN or infinite)")
    if bottom < 0:
        raise ValueError(f"{column} has negative score(s), e.g. {bottom!r}")
    return int(m)


__all__ = [
    "LiveNames",
    "check_facts",
    "facts_sql",
    "pages_sql",
    "read_depths",
    "read_each_position",
    "read_exact_scores",
    "read_ids",
    "read_positions",
    "read_top_ids",
]
