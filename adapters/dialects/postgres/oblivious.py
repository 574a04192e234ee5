"""PostgreSQL's SQL of oblivious reads (topk_middleware/mechanisms/oblivious.py; the engine's
adapters/sql/oblivious.py): pinned plans, addresses fixed by public facts, rows packed.

What a server observer counts (DESIGN invariant 12) is each query's text, its parameter sizes,
its rows, its plan and the buffers its plan touches. The reads of an oblivious release are
written so that all of them follow from public facts (m, k, delta_pad, the column types):

* **Pinned plans.** `PINNED_PLAN_SETTINGS` are set for the run's transaction (`SET LOCAL`,
  `set_config(..., true)`) before its first oblivious read: generic plans (planned without the
  bound positions), no parallel workers, no hash or merge join, no bitmap or sequential scan,
  no sort, no memoize, the joins in the order written. Each query then has one possible plan,
  whatever the planner's statistics say (autovacuum's ANALYZE changes those at moments of its
  own). Queries are sent unprepared (`prepare=False`): psycopg would otherwise prepare a query
  on its fifth execution, and a plan cached under other settings would be reused.
* **One buffer per row, whatever the positions.** PostgreSQL counts a buffer each time a scan
  moves to another page; an index scan that reads two wanted rows of one heap page in a row
  counts that page once, so its count would depend on how the drawn positions fall on pages (a
  function of the noise). Oblivious random reads fetch each row on its own: by its heap address
  on a rank-ordered copy with fixed-width rows (`ctid = ANY(...)`, a TID scan, which reads one
  page per address), else by one index lookup per position (a nested loop over
  `unnest(positions)`: each lookup descends the B-tree and fetches its heap row anew).
* **Heap addresses of a rank-ordered copy.** prepare() writes the rank table with one
  `CREATE TABLE ... AS SELECT` in rank order; with fixed-width columns (integer ids) every heap
  page then holds the same number of rows, so rank r lives at (r // per_page, r % per_page + 1).
  `layout_probe` reads that number from page 0 and checks it on the second page and on the last
  row; a table that fails the check is read by index lookups (decided before any position is
  drawn), and every TID read checks that it got back exactly the ranks it asked for.
* **Packed rows.** Integer ids come back as three bytea values (int8send / float8send), which
  numpy reads in one step instead of building a Python tuple per row; positions go out as one
  binary int8[] where the driver sends one (adapters/sql/driver.py Int8Array), else as one text
  parameter.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from adapters.sql.driver import Int8Array
from topk_middleware.access import AccessError, Rows

from .writes import literal

# Settings of an oblivious run's transaction (module docstring).
PINNED_PLAN_SETTINGS = (
    ("plan_cache_mode", "force_generic_plan"),
    ("max_parallel_workers_per_gather", "0"),
    ("enable_seqscan", "off"),
    ("enable_bitmapscan", "off"),
    ("enable_hashjoin", "off"),
    ("enable_mergejoin", "off"),
    ("enable_material", "off"),
    ("enable_memoize", "off"),
    ("enable_sort", "off"),
    ("enable_incremental_sort", "off"),
    ("enable_gathermerge", "off"),
    ("join_collapse_limit", "1"),
    ("from_collapse_limit", "1"),
    ("jit", "off"),
)

# named apart: a driver returning rows by column name (SPI) would merge columns of one name
PACKED_COLUMNS = (
    "string_agg(int8send(r.rank), ''::bytea) AS ranks, "
    "string_agg(int8send(r.id::int8), ''::bytea) AS ids, "
    "string_agg(float8send(r.score::float8), ''::bytea) AS scores"
)


def pin_plans_sql() -> str:
    """set_config(name, value, true) of every pinned setting, as a select list."""
    return ", ".join(
        f"set_config({literal(name)}, {literal(value)}, true)"
        for name, value in PINNED_PLAN_SETTINGS
    )


def layout_probe(ranks: str, m: int) -> str:
    """One query that pins the plans and returns (rows on heap page 0, the rank of the first row
    of page 1, the rank at the address the layout gives rank m - 1)."""
    last = int(m) - 1
    return (
        f"WITH pins AS MATERIALIZED (SELECT {pin_plans_sql()}), "
        f"page AS MATERIALIZED (SELECT count(*) AS per FROM {ranks} "
        "WHERE ctid >= '(0,1)'::tid AND ctid < '(1,0)'::tid) "
        f"SELECT page.per, (SELECT r.rank FROM {ranks} AS r WHERE r.ctid = '(1,1)'::tid), "
        f"(SELECT r.rank FROM {ranks} AS r WHERE r.ctid = format('(%s,%s)', "
        f"({last})::int8 / greatest(page.per, 1), "
        f"({last})::int8 % greatest(page.per, 1) + 1)::tid) "
        "FROM pins, page"
    )


def rows_per_page(probe: tuple[Any, Any, Any], m: int) -> int | None:
    """The rows per heap page if the probe shows a rank-ordered fixed layout, else None."""
    per, second, last = probe
    per = int(per or 0)
    if per < 1:
        return None
    if m > per and second != per:
        return None
    if last != m - 1:
        return None
    return per


def positions_value(wanted: np.ndarray, binary: bool) -> Any:
    """The positions as one parameter: a binary int8[] where the driver sends one, else text."""
    if binary:
        return Int8Array.of(wanted)
    return "{" + ",".join(map(str, np.asarray(wanted, dtype=np.int64).tolist())) + "}"


def sorted_packed_sql(ranks: str) -> str:
    """Ranks [:start, :stop) of the rank table, packed: one range of its rank B-tree."""
    return f"SELECT {PACKED_COLUMNS} FROM {ranks} AS r WHERE r.rank >= :start AND r.rank < :stop"


def sorted_lookups_sql(ranks: str) -> str:
    """Ranks :first .. :last, one rank B-tree lookup each (rows of varying width)."""
    return (
        "SELECT r.rank, r.id, r.score FROM generate_series(CAST(:first AS int8), "
        "CAST(:last AS int8)) AS q(p) CROSS JOIN LATERAL (SELECT rank, id, score FROM "
        f"{ranks} WHERE rank = q.p OFFSET 0) AS r"
    )


def tid_rows_sql(ranks: str, per_page: int) -> str:
    """The rows at sorted ranks :positions by heap address (one page read per rank), packed."""
    per = int(per_page)
    return (
        f"SELECT {PACKED_COLUMNS} FROM {ranks} AS r WHERE r.ctid = ANY(ARRAY(SELECT "
        f"format('(%s,%s)', q.p / {per}, q.p % {per} + 1)::tid FROM "
        "unnest(CAST(:positions AS int8[])) AS q(p)))"
    )


def lookups_sql(ranks: str) -> str:
    """The rows at :positions, one rank B-tree lookup each, in a nested loop."""
    return (
        "SELECT r.rank, r.id, r.score FROM unnest(CAST(:positions AS int8[])) AS q(p) "
        f"CROSS JOIN LATERAL (SELECT rank, id, score FROM {ranks} WHERE rank = q.p OFFSET 0) "
        "AS r"
    )


def unpack(packed: tuple[Any, Any, Any] | None) -> Rows:
    """Rows from three packed columns (position, id, score), as numpy arrays."""
    if packed is None or packed[0] is None:
        empty = np.empty(0, dtype=np.int64)
        return Rows(empty, empty.copy(), np.empty(0, dtype=np.float64))
    return Rows(
        np.frombuffer(packed[0], ">i8").astype(np.int64),
        np.frombuffer(packed[1], ">i8").astype(np.int64),
        np.frombuffer(packed[2], ">f8").astype(np.float64),
    )


def check_positions(rows: Rows, wanted: np.ndarray, where: str) -> Rows:
    """The rows, if they are exactly the sorted positions `wanted`; else an AccessError (never a
    wrong answer)."""
    if len(rows) != len(wanted) or not np.array_equal(rows.positions, wanted):
        raise AccessError(
            f"{where}: an oblivious read returned other rows than the {len(wanted)} asked for "
            "(the rank table is not laid out in rank order: call prepare(refresh=True))"
        )
    return rows


__all__ = [
    "PACKED_COLUMNS",
    "PINNED_PLAN_SETTINGS",
    "check_positions",
    "layout_probe",
    "pin_plans_sql",
    "rows_per_page",
    "unpack",
]
