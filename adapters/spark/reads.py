"""The reads of a SparkTable's run: sorted access by rank, random access by rank and by id, and
the runs of tied scores (the Source protocol's reads, access.py).

On the copy, a read is one Spark query (0.05-0.4 s whatever its size) with bucket filters,
pruned when Spark plans it, and rank ranges, which skip Parquet row groups by their min/max;
sorted reads fetch ahead (SORTED_READ_ROWS, or twice the prefix) and keep the prefix in the
run. On the table itself (direct.py), the top rows of the run's pass serve sorted reads up to
DIRECT_SORTED_MAX and the rows read serve reads by id; a read beyond refreshes the copy first
(run.to_copy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from topk_middleware.access import AccessError, Rows

from .._sql import scores_in_order
from .direct import read_top
from .layout import (
    DIRECT_SORTED_MAX,
    MAX_RANGES,
    SORTED_READ_ROWS,
    Run,
    arrow_rows,
    bucket_of,
    buckets_between,
    concat_rows,
    empty_rows,
)
from .run import copy_state, state, to_copy


def read_score_runs(t: Any) -> tuple[np.ndarray, np.ndarray]:
    """ScoreRuns: (first rank, score) of every run, in rank order: from the manifest's row,
    else one query."""
    run = copy_state(t)
    version = run.version
    assert version is not None
    if version.runs_first is not None and version.runs_score is not None:
        return version.runs_first, version.runs_score
    path = f"{t.copy}/v={version.name}/runs"
    got = t._query(
        lambda: (
            t.spark.read.schema("score DOUBLE, first_rank BIGINT")
            .parquet(path)
            .orderBy("first_rank")
            .toArrow()
        )
    )
    return got.column("first_rank").to_numpy(), got.column("score").to_numpy()


def read_sorted(t: Any, start: int, count: int) -> Rows:
    """Rows of ranks [start, start + count): from the prefix read ahead, else one query over
    the buckets holding them, reading on to at least SORTED_READ_ROWS (or twice the prefix).
    On the table itself, the top rows of the run's pass (a top-N query where they do not
    reach), and beyond DIRECT_SORTED_MAX the copy, refreshed."""
    run = state(t)
    start = int(start)
    if run.direct is not None:
        facts = run.direct.facts
        stop = min(start + int(count), facts.m)
        if stop <= start:
            return empty_rows(t._id_type)
        if stop > facts.canonical and stop <= DIRECT_SORTED_MAX:
            read_top(t, run.direct, max(stop, min(facts.m, 2 * facts.canonical)))
        if stop <= facts.canonical:
            ranks = np.arange(start, max(start, stop), dtype=np.int64)
            return Rows(ranks, facts.ids[start:stop], facts.scores[start:stop])
        to_copy(t, run)
    assert run.version is not None
    m = run.version.m
    stop = min(start + int(count), m)
    if stop <= start:
        return empty_rows(run.version.id_type)
    have = 0 if run.ahead is None else len(run.ahead)
    if start > have:
        return read_range(t, run, start, stop)
    if stop > have:
        end = min(m, max(stop, 2 * have, SORTED_READ_ROWS))
        more = read_range(t, run, have, end)
        run.ahead = more if run.ahead is None else concat_rows(run.ahead, more)
    a = run.ahead
    assert a is not None
    return Rows(a.positions[start:stop], a.ids[start:stop], a.scores[start:stop])


def read_range(t: Any, run: Run, start: int, stop: int) -> Rows:
    """Rows of ranks [start, stop) of the run's version in one query (bucket and rank-range
    filters); an AccessError if the copy lacks some (it is damaged)."""
    buckets = ", ".join(map(str, buckets_between(start, stop)))
    where = f"bucket IN ({buckets}) AND rank >= {start} AND rank < {stop}"
    rows = fetch(t, run, where)
    if len(rows) != stop - start:
        raise AccessError(
            f"{t.where}: the copy returned {len(rows)} rows for ranks "
            f"[{start}, {stop}); it is damaged: call prepare(refresh=True)"
        )
    return rows


def read_positions(t: Any, ranks: np.ndarray) -> Rows:
    """Rows at the given ranks in one query: bucket filters (pruned when Spark plans) and
    up to MAX_RANGES rank ranges (row groups skipped by min/max), then the exact ranks."""
    run = copy_state(t)
    assert run.version is not None
    wanted = np.unique(np.asarray(ranks, dtype=np.int64))
    if not len(wanted):
        return empty_rows(run.version.id_type)
    if wanted[0] < 0 or wanted[-1] >= run.version.m:
        raise AccessError(f"rank out of range [0, {run.version.m})")
    buckets = sorted({bucket_of(int(r)) for r in wanted})
    gaps = np.diff(wanted)
    cuts = np.sort(np.argsort(gaps)[::-1][: MAX_RANGES - 1]) if len(gaps) else []
    lows = [int(wanted[0])] + [int(wanted[c + 1]) for c in cuts]
    highs = [int(wanted[c]) for c in cuts] + [int(wanted[-1])]
    ranges = " OR ".join(f"(rank >= {a} AND rank <= {b})" for a, b in zip(lows, highs, strict=True))
    where = f"bucket IN ({', '.join(map(str, buckets))}) AND ({ranges})"
    if len(wanted) <= 10 * MAX_RANGES:
        where += f" AND rank IN ({', '.join(map(str, wanted.tolist()))})"
    rows = fetch(t, run, where)
    keep = np.isin(rows.positions, wanted)
    rows = Rows(rows.positions[keep], rows.ids[keep], rows.scores[keep])
    if len(rows) != len(wanted):
        raise AccessError(f"{t.where}: the copy lacks some of the ranks asked for")
    return rows


def read_ids(t: Any, ids: Sequence[Any]) -> np.ndarray:
    """Scores of the named items: one query, a join with the ids asked for (on the table
    itself, none for the rows the run already read)."""
    run = state(t)
    wanted = [v.item() if isinstance(v, np.generic) else v for v in ids]
    if not wanted:
        return np.empty(0, dtype=np.float64)
    if run.direct is not None:
        known = run.direct.known
        facts = run.direct.facts
        known.update(zip(facts.ids.tolist(), facts.scores.tolist(), strict=True))
        if all(v in known for v in wanted):
            return scores_in_order(known, wanted, t.where)
    id_type = t._id_type if run.version is None else run.version.id_type
    try:
        asked = t.spark.createDataFrame([(v,) for v in wanted], f"id {id_type}")
    except Exception:
        raise AccessError(f"{t.where}: ids of another type than the table's") from None
    rows = t._columns(run.direct.frame) if run.direct is not None else run.data
    got = t._query(
        lambda: rows.join(asked, "id", "left_semi").select("id", "score").toArrow(),
        direct=run.direct is not None,
    )
    found = dict(zip(got.column("id").to_pylist(), got.column("score").to_pylist(), strict=True))
    return scores_in_order(found, wanted, t.where)


def fetch(t: Any, run: Run, where: str) -> Rows:
    """The rows of the run's version that `where` (Spark SQL) keeps, in rank order."""
    got = t._query(lambda: run.data.where(where).select("rank", "id", "score").toArrow())
    return arrow_rows(got, "rank")
