"""Runs of tied scores of a live PostgreSQL table, learnt in a run's snapshot, and the canonical
rows at ranks read from them (LivePostgresTable, table.py).

Count data often has few distinct scores (a plateau, small counts, zeros). In the run's
transaction, right after m, one query skips down the (score DESC, id) B-tree (a recursive CTE:
one index probe per distinct score, stopping past `max_score_runs`) and, if the scores were at
most that many, counts runs by index scan, each count stopped at `run_count_rows` / (number of
runs) rows: each run but the last, the last (lowest score: on count data the one very large run
of zeros) sized as m minus the others, or, where another run reached the bound, counted too, that
one then sized from m (`sized_runs`). Counting costs a heap visit per row once writes have
cleared the table's visibility map (about 0.3-0.5 us a row: 60,000 rows outside the zeros were
18-29 ms of a 1e7 plateau run after 1% writes), so only the runs above the first *gap* are
counted: down to the first score below RUN_GAP_RATIO (1/2) times the one above it. Where two runs
or more lie below that gap, the run serves the head (`read_score_runs_head`: their first ranks and
where the rest begins) and the core bounds a score past it between the least score and the first
score below the gap, which on a plateau above small counts settles every random access there
without a read (access.py, ScoreRuns); the runs below are counted in the run's snapshot only when
a rank there is read (`full_runs`), in full where two of them are too large for the bound.

With the runs, positions are the canonical ranks of the snapshot: the row at a rank is read at
(its run's score, its offset in the run) through the B-tree, walked from the nearer of the run's
start, the last row the sorted cursor served, and the run's end (`read_ranks`: one query a
batch, ~2.5 us a row walked on a table whose visibility map the writes cleared).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from psycopg import sql

from adapters._sql import plain_values, rows_from_records
from topk_middleware.access import AccessError, Rows

from .statements import order_parts

# A run learns its snapshot's runs of tied scores when there are at most `max_score_runs`
# distinct scores (one index probe each; 0: never) and counting all runs but the largest reads at
# most `run_count_rows` rows; it then serves positions = ranks.
MAX_SCORE_RUNS = 32
RUN_COUNT_ROWS = 1 << 18
# The runs are counted down to the first score below this fraction of the one above it (a gap):
# the runs below, if two or more, are counted only when a rank there is read.
RUN_GAP_RATIO = 0.5


@dataclass
class ScoreRuns:
    """The snapshot's runs of tied scores, in canonical order: first rank and size of the runs
    sized so far (all of them, or a head: `complete`), and every run's score (as float8 for the
    core, and as the column's own value for index lookups)."""

    first: np.ndarray
    sizes: np.ndarray
    scores: np.ndarray
    values: list[Any]

    @property
    def complete(self) -> bool:
        return len(self.first) == len(self.scores)

    @property
    def end(self) -> int:
        """The rank past the runs sized: m when complete, else where the runs not sized begin."""
        return int(self.first[-1] + self.sizes[-1])


def out_of_step(t: Any, m: int) -> AccessError:
    """The error of runs that hold more rows than the position table's m."""
    return AccessError(
        f"{t.where} has more rows by its runs of tied scores than its {m} "
        "positions: the position table is out of step (call prepare())"
    )


def score_runs(t: Any, reader: Any, m: int) -> ScoreRuns | None:
    """The snapshot's runs of tied scores if they are few and cheap to count, else None: their
    head only where a gap in the scores cuts them (module docstring).

    One query: a skip scan down the (score DESC, id) B-tree (a recursive CTE, one index probe
    per distinct score, stopping past `max_score_runs`), then, if the scores were few, a count by
    index scan of each run above the first *gap* (a score below RUN_GAP_RATIO times the one
    above it) but the last run, each count stopped at `run_count_rows` / (number of runs) rows.
    Where the gap leaves two runs or more below it, they are not counted: the run serves the head
    (`ScoreRuns.complete` False), and `full_runs` counts the rest when a rank there is read.
    Otherwise (no such gap) every run but the last is counted as `sized_runs` says."""
    limit = t.max_score_runs
    if limit < 1:
        return None
    records = reader.execute(runs_query(t, head=True)).fetchall()
    if not records or len(records) > limit:
        return None
    values = [r[0] for r in records]
    scores = np.asarray([r[1] for r in records], dtype=np.float64)
    if not bool(np.all(np.diff(scores) < 0)):
        return None  # scores equal as float8
    head = sum(1 for r in records if r[3])  # the runs above the first gap
    if head < len(records) - 1:
        sizes = np.asarray([r[2] for r in records[:head]], dtype=np.int64)
        if int(sizes.max()) < max(t.run_count_rows, 1) // len(records):
            first = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
            if int(sizes.sum()) + len(records) - head > m:
                raise out_of_step(t, m)
            return ScoreRuns(first, sizes, scores, values)
        records = reader.execute(runs_query(t, head=False)).fetchall()
    return sized_runs(t, reader, m, records, values, scores)


def runs_query(t: Any, head: bool) -> sql.Composable:
    """The skip scan of the distinct scores and the counts of the runs (module docstring): rows
    (score, score as float8, count or NULL, above the first gap); `head`: count the runs above
    the first gap only. The gap is found in numeric (float8 arithmetic raises on underflow, e.g.
    half of 5e-324)."""
    return sql.SQL(
        "WITH RECURSIVE d(s, n) AS ("
        "(SELECT b.{score}, 1 FROM {base} AS b WHERE b.{score} IS NOT NULL "
        "ORDER BY b.{score} DESC LIMIT 1) "
        "UNION ALL SELECT (SELECT b.{score} FROM {base} AS b WHERE b.{score} < d.s "
        "ORDER BY b.{score} DESC LIMIT 1), d.n + 1 FROM d "
        "WHERE d.s IS NOT NULL AND d.n <= {limit}), "
        "g AS (SELECT s, n, lag(s) OVER (ORDER BY n) AS above FROM d WHERE s IS NOT NULL), "
        "r AS (SELECT s, n, count(*) FILTER (WHERE s::numeric < {ratio}::numeric * "
        "above::numeric) OVER (ORDER BY n) = 0 AS head FROM g), "
        "t AS (SELECT count(*) AS runs FROM r) "
        "SELECT r.s, r.s::float8, CASE WHEN t.runs <= {limit} AND r.n < t.runs{only} THEN "
        "(SELECT count(*) FROM (SELECT 1 FROM {base} AS b WHERE b.{score} = r.s "
        "LIMIT {budget} / t.runs) AS c) END, r.head FROM r, t ORDER BY r.n"
    ).format(
        score=t._score,
        base=t._base,
        limit=sql.Literal(t.max_score_runs),
        ratio=sql.Literal(RUN_GAP_RATIO),
        budget=sql.Literal(max(t.run_count_rows, 1)),
        only=sql.SQL(" AND r.head" if head else ""),
    )


def sized_runs(
    t: Any, reader: Any, m: int, records: list[Any], values: list[Any], scores: np.ndarray
) -> ScoreRuns | None:
    """Every run sized from counts of all runs but the last: the last (lowest score: on count
    data the one very large run of zeros) is sized as m minus the others. If instead another run
    reached the bound, the last is counted too (a second query) and at most one run may be that
    large (else None): its size is m minus the others'. So a run costs O(distinct scores + rows
    outside the largest run) whatever m is."""
    budget = max(t.run_count_rows, 1)
    sizes = np.asarray([r[2] or 0 for r in records], dtype=np.int64)
    bound = budget // len(records)
    capped = np.flatnonzero(sizes >= bound)
    if len(capped) > 1:
        return None  # two large runs: costly to count
    if len(capped):  # the large run is not the last: count the last too
        count = sql.SQL(
            "SELECT count(*) FROM (SELECT 1 FROM {base} AS b WHERE b.{score} = %s "
            "LIMIT {bound}) AS c"
        ).format(base=t._base, score=t._score, bound=sql.Literal(bound))
        sizes[-1] = reader.execute(count, [values[-1]]).fetchone()[0]
        if sizes[-1] >= bound:
            return None
        large = int(capped[0])
    else:
        large = len(sizes) - 1
    sizes[large] = m - (int(sizes.sum()) - int(sizes[large]))
    if sizes[large] < (bound if len(capped) else 1):
        raise out_of_step(t, m)
    first = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    return ScoreRuns(first, sizes, scores, values)


def full_runs(t: Any, run: Any) -> ScoreRuns:
    """The run's runs of tied scores, every one sized: after a head, the counts of the runs
    below the gap are read now (in the run's snapshot); where two of them are too large to count
    within `run_count_rows`, every run but the last is counted in full (the run already serves
    ranks: slow, never wrong)."""
    runs = run.runs
    if runs is None or runs.complete:
        return runs  # type: ignore[no-any-return]
    with t._reading() as cur:
        records = cur.execute(runs_query(t, head=False)).fetchall()
        if [r[0] for r in records] != runs.values:
            raise AccessError(f"{t.where}: the runs of tied scores changed in a snapshot")
        full = sized_runs(t, cur, run.m, records, runs.values, runs.scores)
        if full is None:
            count = sql.SQL("SELECT count(*) FROM {base} AS b WHERE b.{score} = %s").format(
                base=t._base, score=t._score
            )
            sizes = np.asarray(
                [cur.execute(count, [v]).fetchone()[0] for v in runs.values[:-1]] + [0],
                dtype=np.int64,
            )
            sizes[-1] = run.m - int(sizes.sum())
            if sizes[-1] < 1:
                raise out_of_step(t, run.m)
            first = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
            full = ScoreRuns(first, sizes, runs.scores, runs.values)
    if not np.array_equal(full.first[: len(runs.first)], runs.first) or not np.array_equal(
        full.sizes[: len(runs.sizes)], runs.sizes
    ):
        raise AccessError(f"{t.where}: the runs of tied scores changed in a snapshot")
    run.runs = full
    return full


def walks(run: Any, runs: ScoreRuns, ranks: np.ndarray) -> tuple[np.ndarray, ...]:
    """For each rank: its run, whether the walk starts at the cursor's last row, and the rows to
    walk to it from the run's start (or from the cursor's last row, where the cursor stopped
    inside the run before it) and from the run's end."""
    j = np.searchsorted(runs.first, ranks, side="right") - 1
    start = runs.first[j]
    anchored = (ranks >= run.depth) & (run.depth > start) & (run.last_id is not None)
    front = np.where(anchored, ranks - run.depth, ranks - start)
    back = runs.sizes[j] - 1 - (ranks - start)
    return j, anchored, front, back


def read_ranks(t: Any, run: Any, runs: ScoreRuns, ranks: np.ndarray) -> Rows:
    """Canonical rows at ranks: each is (its run's score, its offset) on the (score DESC, id)
    B-tree, walked from the nearest start (`walks`); one query for the batch. A rank past a head
    of runs has the rest of them counted first (`full_runs`)."""
    if len(ranks) and ranks.max() >= runs.end and not runs.complete:
        runs = t._full_runs(run)
    if len(ranks) and (ranks.min() < 0 or ranks.max() >= runs.end):
        raise AccessError("a rank outside [0, m) was asked for")
    j, anchored, front, back = walks(run, runs, ranks)
    forward = front <= back
    mode = np.where(forward, np.where(anchored, 1, 0), 2)
    id_key = sql.SQL('{} COLLATE "C"').format(t._id) if t.text_ids else t._id
    backward = [sql.SQL("{} ASC").format(t._score), sql.SQL("{} DESC").format(id_key)]
    branch = (
        "(SELECT b.{id} AS id, b.{score}::float8 AS score FROM {base} AS b "
        "WHERE q.mode = {mode} AND b.{score} = (%(scores)s)[q.run + 1]{after} "
        "ORDER BY b.{order} OFFSET q.o LIMIT 1)"
    )
    forward_order = sql.SQL(", b.").join(order_parts(t))
    branches = [
        sql.SQL(branch).format(
            id=t._id,
            score=t._score,
            base=t._base,
            mode=sql.Literal(number),
            after=after,
            order=order,
        )
        for number, after, order in (
            (0, sql.SQL(""), forward_order),
            (1, sql.SQL(" AND b.{} > %(after)s").format(id_key), forward_order),
            (2, sql.SQL(""), sql.SQL(", b.").join(backward)),
        )
    ]
    query = sql.SQL(
        "SELECT q.r, x.id, x.score FROM unnest(%(ranks)s::bigint[], %(runs)s::bigint[], "
        "%(offsets)s::bigint[], %(modes)s::int[]) AS q(r, run, o, mode) CROSS JOIN LATERAL "
        "({}) AS x"
    ).format(sql.SQL(" UNION ALL ").join(branches))
    params = {
        "ranks": plain_values(ranks),
        "runs": plain_values(j),
        "offsets": plain_values(np.where(forward, front, back)),
        "modes": plain_values(mode),
        "scores": runs.values,
        "after": run.last_id,
    }
    with t._reading() as cur:
        rows = rows_from_records(cur.execute(query, params).fetchall())
    run.served.update(rows.ids.tolist())
    return rows
