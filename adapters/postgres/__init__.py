"""PostgresTable: wrap an existing PostgreSQL table of per-item counts (psycopg 3).

copy_mode.py  PostgresTable(mode="copy"): runs read a rank-ordered copy that prepare() writes
              (the SQL store engine over psycopg and the PostgreSQL dialect)
live/         PostgresTable(mode="live"): runs read the table itself through its B-trees and
              a position table kept current by triggers (LivePostgresTable)
"""

from .copy_mode import MODES, STORE_COSTS, PostgresTable, RankTableMismatchError
from .live import MAX_SCORE_RUNS, LivePostgresTable

__all__ = [
    "MAX_SCORE_RUNS",
    "MODES",
    "STORE_COSTS",
    "LivePostgresTable",
    "PostgresTable",
    "RankTableMismatchError",
]
