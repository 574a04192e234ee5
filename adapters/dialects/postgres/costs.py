"""What PostgreSQL's reads cost: the measured records the planner and the engine's choices read.

Measured on this project's 2-core machine (DESIGN; benchmarks/wallclock.py, sizes.py,
freshness_copy.py, oblivious.py), against the store's own one-shot query.
"""

from __future__ import annotations

import dataclasses

from topk_middleware.access import StoreCosts
from topk_middleware.mechanisms.oblivious import ObliviousCosts

# The copy at m = 10^7: 20,000 rows by rank range in about 20 ms, 10^4 random ranks in about
# 80 ms, a packed full read 3.5 s, the in-store one-shot's keyed hash (SHA-256) about 0.6 us a
# hashed row.
STORE_COSTS = StoreCosts(
    round_trip=2e-4,
    sorted_row=1e-6,
    random_batch=2e-3,
    random_row=8e-6,
    oneshot_row=6e-7,
    full_read_row=4e-7,
)

# Oblivious releases (mechanisms/oblivious.py: the deadline's model), measured at m = 10^5 to
# 10^6 on the test server (2 cores shared by several loads: the 90th percentile of the work at a
# load average of 8 is 49 ms at 10^6): reads from the rank table (one heap page per drawn rank,
# a read from the operating system once the copy outgrows the buffer cache), and, for a copy
# not proven current, from the table itself (both batches scan it: `scan_row` per item).
OBLIVIOUS_COSTS = ObliviousCosts(
    fixed=3e-3,
    sorted_row=5e-7,
    random_row=4e-6,
    random_miss=1e-5,
    cached_rows=1.5e6,
    full_row=2e-6,
)
STALE_OBLIVIOUS_COSTS = dataclasses.replace(OBLIVIOUS_COSTS, scan_row=8e-7)

# Oblivious releases of a live table (adapters/postgres/live/), measured at m = 10^5 to
# 10^6 on the test server (2 cores shared by several loads: the median work at 10^6 is 30 ms at
# a load average of 5, 61 ms at 8): a drawn position costs an id lookup (and a position-table
# lookup where the ids are not 0..m-1), which miss the buffer cache once the table and its
# B-trees outgrow it.
LIVE_OBLIVIOUS_COSTS = ObliviousCosts(
    fixed=4e-3,
    sorted_row=5e-7,
    random_row=5e-6,
    random_miss=1e-5,
    cached_rows=8e5,
    full_row=3e-6,
)

# What reads through SPI cost inside the server (frontends/plpython.py: rows come back as Python
# dicts, a few microseconds each): the oblivious deadline's model, generous on a busy server; an
# oblivious release through SPI measured on the test server at m = 10^5 to 10^6 under load (90th
# percentiles of the work).
SPI_COSTS = StoreCosts(
    round_trip=5e-4,
    sorted_row=1e-5,
    random_batch=2e-3,
    random_row=2e-5,
    full_read_row=1e-5,
)
SPI_OBLIVIOUS_COSTS = ObliviousCosts(
    fixed=5e-3,
    sorted_row=2e-6,
    random_row=6e-6,
    random_miss=1.2e-5,
    cached_rows=8e5,
    full_row=5e-6,
)

# The table itself, at m = 10^6 (benchmarks/freshness_copy.py): an aggregate pass or a filtered
# scan about 25-40 ms (3e-8 s a row), a rebuild of the copy 2.3-6 s (prepare(refresh=True):
# 2.5e-6 s a row), a keyed hash about 0.6 us a row.
SCAN_ROW = 3.5e-8
REBUILD_ROW = 2.5e-6
HASH_ROW = 6e-7

# Reading around the changes, at m = 10^7 zipf with 6 x 10^5 entries logged (benchmarks/
# sizes.py, load 4-5): the facts 12-27 ms (sums over the statements' tally, B-tree probes), the
# one-shot 45-58 ms (about 1,000 probes: the top k, the exceedances, the rows above the cut); no
# entry is read, so an entry costs only the deeper B-trees it makes.
ENTRY_SECONDS = 2e-8
AROUND_FIXED = 2e-2


def table_costs(m: int) -> StoreCosts:
    """What reads of the table itself cost (the planner's input in a table run): every sorted
    read is an ORDER BY .. LIMIT OFFSET over a scan, a batch of random reads by rank a window
    over the whole table, the in-store one-shot a TID scan and a range read (one scan where no
    B-tree leads with the score)."""
    return StoreCosts(
        round_trip=2e-4 + SCAN_ROW * m,
        sorted_row=1e-6,
        random_batch=1e-2,
        random_row=1e-6,
        random_batch_item=6e-7,
        oneshot_row=HASH_ROW,
        full_read_row=1e-6,
        oneshot_fixed=2e-3 + SCAN_ROW * m,
        sorted_scans=True,
    )


def refresh_seconds(m: int) -> float:
    """A rebuild of the copy (prepare(refresh=True)) and a threshold run on it."""
    return 5e-3 + REBUILD_ROW * m


# A table read as it is now is read whole (adapters/sql/whole.py) up to this many rows: one
# read of (id, score) (alone: packed, tables.packed_whole) and a release in memory against the
# run on the copy or the position table (a transaction of several round trips, more on a
# plateau or a spread of scores: the in-store one-shot on its slots, or the copy read around
# the changes, each priced first by a query of its facts). Measured by benchmarks/sizes.py
# with PostgresTable (psycopg), copy and live modes, current and after 1% writes, five
# families, 5 releases each (load 4-6): the geometric mean of the store's query time over the
# release's, the run's against the read whole, 0.18 / 0.37 at 10^4 rows, 0.21 / 0.53 at
# 1.5 * 10^4, 0.21 / 0.44 at 2 * 10^4 (the read whole faster at 13 points of 19), 0.34 / 0.41
# at 3 * 10^4 (11 of 20). The run stays faster on skewed scores (zipf, sparse: 3-8 ms against
# 7-15 ms at 10^4-2 * 10^4); the read whole bounds the rest (the run's 10-130 ms on plateaus
# and spreads, read whole 6-18 ms).
WHOLE_READ_ROWS = 20_000
# After a run that found the copy written since (or read none), a table of at most this many
# rows is read whole alone, packed (tables.packed_whole): SQLAlchemy on psycopg, zipf, after 1%
# of the rows written, median of 9-11 releases at a load average of 8-9: 10,000 rows 23 ms
# against the table's run's 49 ms, 20,000 26 against 66, 100,000 142 against 138 (PostgreSQL's
# own query 12-17 ms at 10^4 and 2 x 10^4, 50-65 ms at 10^5). A current copy's run is faster
# on zipf (10^4: 14 ms; 2 x 10^4: 16 against 26-51 ms whole).
WHOLE_READ_ALONE_ROWS = 50_000


def table_seconds(m: int, hashed: int) -> float:
    """The in-store one-shot on the table: the aggregate pass, the range read, the hashes."""
    return 2e-3 + 2 * SCAN_ROW * m + HASH_ROW * hashed


def around_seconds(entries: int) -> float:
    """A release read around `entries` entries logged: the facts and the one-shot."""
    return AROUND_FIXED + 2 * ENTRY_SECONDS * entries


__all__ = [
    "OBLIVIOUS_COSTS",
    "SPI_COSTS",
    "SPI_OBLIVIOUS_COSTS",
    "STALE_OBLIVIOUS_COSTS",
    "STORE_COSTS",
    "WHOLE_READ_ALONE_ROWS",
    "WHOLE_READ_ROWS",
    "around_seconds",
    "refresh_seconds",
    "table_costs",
    "table_seconds",
]
