"""PostgresTable(..., mode="live"): release from the user's table as it is now, with no copy.

`PostgresTable(conninfo, table, mode="live")` reads the table itself in each run's snapshot, so
writes need no rebuild: UPDATE, INSERT and DELETE of counts are seen by the next run. The
connection, the table's name and columns, validation and the refusals are those of copy mode
(the SQL store engine's psycopg driver and checks, the PostgreSQL dialect); what live mode adds
is one module per idea:

table.py       LivePostgresTable: the Source protocol over what follows
positions.py   what prepare() installs: a B-tree on (score DESC, id), a unique B-tree on id, and
               a position table (position, id) kept dense by row triggers (swap-remove at O(1)
               per changed item); uninstall(); the digest that proves the triggers unchanged
run.py         a run: one REPEATABLE READ READ ONLY transaction, whose first statement (BEGIN,
               the run's settings, m and the scores' extremes by three index probes, and where
               it pays the sorted cursor's first rows) is one round trip
statements.py  the sorted reads down the (score DESC, id) B-tree, with or without positions
ties.py        runs of tied scores, learnt where the scores are few: positions are then the
               canonical ranks, and a row at a rank is a walk along its run's B-tree entries
draws.py       ranks deep in a long tied run named by uniform draws of its unread items
(oblivious runs pin their plans in run.py's first statement; their reads, and the reads by id
and by position, are the dialect's: adapters/dialects/postgres/live_reads.py, shared with SPI)

By default positions are not ranks: nothing is inferred from tied neighbours and no runs of
tied scores are used (access.py), so each random access of a run is a real read (~20-30 us a row
at m = 10^7, the ~10^4 random accesses of a plateau run included). Where a run learns its runs of
tied scores (ties.py), positions are the canonical ranks of its snapshot (a dense position map,
so the output law is the one-shot law). The choice depends on the data only and changes no
answer's law: an operator diagnostic (`positions_are_ranks`, `score_run_count()`).

Zero-vote items are rows with score 0 (a `from_votes` counts table has them): they count in m and
come last in sorted access.
"""

from __future__ import annotations

from adapters.dialects.postgres.costs import LIVE_OBLIVIOUS_COSTS

from ..copy_mode import PostgresTable
from .table import LivePostgresTable
from .ties import MAX_SCORE_RUNS, RUN_COUNT_ROWS

PostgresTable.mode_classes["live"] = LivePostgresTable

__all__ = ["LIVE_OBLIVIOUS_COSTS", "MAX_SCORE_RUNS", "RUN_COUNT_ROWS", "LivePostgresTable"]
