"""Fixed-size reads of the copy for oblivious releases (topk_middleware/mechanisms/oblivious.py;
the SQL is the dialect's `oblivious_sql`).

What a server observer sees of an oblivious release must follow from public facts only (m, k,
delta_pad, the column types: DESIGN invariant 12). Once per run, before its first oblivious
read, the dialect pins the plans for the run's transaction and probes the copy's layout: where
ranks have fixed heap addresses (integer ids: fixed-width rows written in rank order), sorted
reads are one range and reads by rank one address each; otherwise each rank is one index
lookup. Every read checks that it got back exactly the ranks it asked for (never a wrong
answer). Where the dialect has no such reads (`oblivious_sql` is None) the copy's plain reads
serve: their sizes already follow from m and the ranks asked.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from adapters._sql import rows_from_records
from topk_middleware.access import Rows


def _layout(t: Any, run: Any) -> int | None:
    """Once per run: pin the plans and probe the layout; the rows per heap page where ranks
    have fixed addresses (integer ids), else None."""
    if not run.probed:
        sql = t.dialect.oblivious_sql
        probe = t.driver.one(sql.layout_probe(run.ranks, run.m), prepare=False)
        run.rows_per_page = sql.rows_per_page(probe, run.m) if t.integer_ids else None
        run.probed = True
    return run.rows_per_page


def oblivious_sorted(t: Any, run: Any, start: int, stop: int) -> Rows | None:
    """Ranks [start, stop) of the copy: one range of its rank index, which with a fixed layout
    covers the same pages whatever the data (integer ids: packed); with other ids (rows of
    varying width) one lookup per rank, so the pages counted do not follow the ids' lengths.
    None where the dialect has no oblivious reads, or for a full read of text ids (its size is
    public anyway)."""
    sql = t.dialect.oblivious_sql
    if sql is None or not (t.integer_ids or stop < run.m):
        return None
    per_page = _layout(t, run)
    if per_page is not None:
        packed = t.driver.one(
            sql.sorted_packed_sql(run.ranks),
            {"start": int(start), "stop": int(stop)},
            binary=True,
            prepare=False,
        )
        wanted = np.arange(start, stop, dtype=np.int64)
        return sql.check_positions(sql.unpack(packed), wanted, t.where)
    records = t.driver.execute(
        sql.sorted_lookups_sql(run.ranks), {"first": int(start), "last": int(stop) - 1},
        prepare=False,
    )  # fmt: skip
    return rows_from_records(records)


def oblivious_positions(t: Any, run: Any, ranks: np.ndarray) -> Rows | None:
    """The rows at `ranks`, each read on its own (one heap page per rank by its address on a
    fixed layout, else one rank index lookup per rank), in rank order."""
    sql = t.dialect.oblivious_sql
    if sql is None:
        return None
    per_page = _layout(t, run)
    wanted = np.unique(ranks)
    value = sql.positions_value(wanted, t.driver.binary_arrays)
    if per_page is not None:
        packed = t.driver.one(
            sql.tid_rows_sql(run.ranks, per_page), {"positions": value},
            binary=True, prepare=False,
        )  # fmt: skip
        rows = sql.unpack(packed)
        order = np.argsort(rows.positions, kind="stable")
        rows = Rows(rows.positions[order], rows.ids[order], rows.scores[order])
        return sql.check_positions(rows, wanted, t.where)
    return rows_from_records(
        t.driver.execute(sql.lookups_sql(run.ranks), {"positions": value}, prepare=False)
    )


__all__ = ["oblivious_positions", "oblivious_sorted"]
