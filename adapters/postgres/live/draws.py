"""Items deep in a long run of tied scores of a live PostgreSQL table, named by uniform draws
(access.ExchangeableTies) instead of a walk along the run.

PostgreSQL's B-tree keeps no subtree counts, so an offset is a walk, ~2.5 us a row on a table
whose visibility map the writes cleared (measured at m = 10^7: 0.26 s for an id 10^5 deep in a
run, 2.2-2.6 s for 10^6). Items of one run are exchangeable: the mechanism decided everything
beyond the fetched prefix from the runs' scores alone, so a bijection between a run's unread
ranks and its unread items drawn independently of the noise leaves the output law unchanged. A
release therefore names a rank more than RUN_WALK_ROWS rows from every walk's start by a uniformly
random item of the run's unread middle (the items between the canonical rows RUN_WALK_ROWS from
either end), drawn from the run's generator: uniform positions of the position table, kept when
their row is in that middle and not drawn before (rejection sampling; one query per round, about
(ranks to name) / (middle / m) positions), unless walking is the cheaper of the two for that run
(a short run in a large table). Ranks near either end keep their canonical rows. Once a run has
drawn items, sorted access may not reach its middle (no mechanism reads on after naming its
release: refused as a broken invariant). With a seed the draw is reproducible; the answer for a
seed then equals the rank-ordered ArraySource's except for items deep in a tied run, which are
the same in law.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from psycopg import sql

from adapters._sql import rows_from_records
from topk_middleware.access import AccessError, Rows

from .ties import ScoreRuns, read_ranks, walks

# A released rank further than this from every start of a walk along its run is named by a draw
# from the run's unread middle (module docstring).
RUN_WALK_ROWS = 1024
# What one drawn position costs (a position-table probe and a row) in rows walked along a run.
DRAW_COST_IN_WALKED_ROWS = 4
# Positions drawn per round of the rejection sampling, at most, and rounds at most (each round
# expects 1.5 times the items it needs: running out means the positions do not cover the run).
DRAW_BATCH_MAX = 1 << 16
DRAW_ROUNDS_MAX = 64


@dataclass
class Middle:
    """The unread middle of one long run, whose items a release names by uniform draws: ranks
    [first, stop), items with the run's score and an id strictly between `low` and `high` (the
    canonical rows at first - 1 and stop)."""

    first: int
    stop: int
    low: Any
    high: Any
    named: dict[int, tuple[Any, float]] = field(default_factory=dict)  # rank -> drawn row
    taken: set[Any] = field(default_factory=set)  # ids drawn


def ranks_exchangeable(t: Any, run: Any, ranks: np.ndarray, rng: np.random.Generator) -> Rows:
    """Rows for ranks beyond the fetched prefix of a run serving ranks: a rank deep in a long run
    named by a uniform draw from the run's unread middle (module docstring), the others by their
    canonical rows."""
    runs = run.runs
    if ranks.max() >= runs.end and not runs.complete:
        runs = t._full_runs(run)
    j, _, front, back = walks(run, runs, ranks)
    walk = np.minimum(front, back)
    deep = (ranks >= run.depth) & (walk > RUN_WALK_ROWS)
    for index, middle in run.middles.items():  # ranks of a middle opened before: drawn
        if middle is not None:
            deep |= (j == index) & (ranks >= middle.first) & (ranks < middle.stop)
    named: dict[int, tuple[Any, float]] = {}
    walked = ~deep
    for index in np.unique(j[deep]).tolist():
        wanted = deep & (j == index)
        found = open_middle(t, run, runs, index, ranks[wanted], walk[wanted])
        if found is None:
            walked |= wanted
            continue
        named.update(t._draw(run, runs, index, found, ranks[wanted], rng))
    if walked.any():
        rows = read_ranks(t, run, runs, ranks[walked])
        named.update(
            zip(
                rows.positions.tolist(),
                zip(rows.ids.tolist(), rows.scores.tolist(), strict=True),
                strict=True,
            )
        )
    return rows_from_records([(r, *named[r]) for r in ranks.tolist()])


def open_middle(
    t: Any, run: Any, runs: ScoreRuns, index: int, ranks: np.ndarray, walk: np.ndarray
) -> Middle | None:
    """The run's unread middle, opened at its first deep rank (its bounds read as canonical
    rows), or None where walking to the ranks costs less than drawing them (decided once per run
    and snapshot, from its size: data, never noise)."""
    if index in run.middles:
        return run.middles[index]  # type: ignore[no-any-return]
    start = max(int(runs.first[index]), run.depth)
    stop = int(runs.first[index] + runs.sizes[index]) - 1 - RUN_WALK_ROWS
    first = start + RUN_WALK_ROWS + 1
    share = (stop - first) / run.m
    if len(ranks) / share * DRAW_COST_IN_WALKED_ROWS >= float(walk.sum()):
        run.middles[index] = None
        return None
    bounds = read_ranks(t, run, runs, np.asarray([first - 1, stop], dtype=np.int64))
    low, high = bounds.ids.tolist()
    middle = run.middles[index] = Middle(first, stop, low, high)
    return middle


def draw(
    t: Any,
    run: Any,
    runs: ScoreRuns,
    index: int,
    middle: Middle,
    ranks: np.ndarray,
    rng: np.random.Generator,
) -> dict[int, tuple[Any, float]]:
    """Name the ranks of a middle not named yet by uniform items of the middle neither drawn nor
    read by rank yet: uniform positions, kept in draw order when their row lies in the middle."""
    pending = sorted(set(ranks.tolist()) - middle.named.keys())
    share = (middle.stop - middle.first) / run.m
    key = sql.SQL('b.{} COLLATE "C"' if t.text_ids else "b.{}").format(t._id)
    query = sql.SQL(
        "SELECT p.position, b.{id}, b.{score}::float8 FROM {pos} AS p JOIN {base} AS b "
        "ON b.{id} = p.id WHERE p.position = ANY(%s::bigint[]) AND b.{score} = %s "
        "AND {key} > %s AND {key} < %s"
    ).format(id=t._id, score=t._score, pos=t._pos, base=t._base, key=key)
    with t._reading() as cur:
        for _ in range(DRAW_ROUNDS_MAX):
            if not pending:
                break
            size = min(DRAW_BATCH_MAX, math.ceil(1.5 * len(pending) / share) + 8)
            drawn = rng.integers(0, run.m, size=size)
            _, first_seen = np.unique(drawn, return_index=True)
            order = drawn[np.sort(first_seen)]  # distinct positions, in draw order
            params = [order.tolist(), runs.values[index], middle.low, middle.high]
            found = {p: (i, s) for p, i, s in cur.execute(query, params).fetchall()}
            for position in order.tolist():
                row = found.get(position)
                if row is None or row[0] in middle.taken or row[0] in run.served:
                    continue
                middle.taken.add(row[0])
                middle.named[pending.pop(0)] = row
                if not pending:
                    break
        if pending:
            raise AccessError(
                f"{t.where}: {len(pending)} item(s) of a run of tied scores could not be "
                f"drawn in {DRAW_ROUNDS_MAX} rounds: the position table is out of step"
            )
    return {r: middle.named[r] for r in ranks.tolist()}
