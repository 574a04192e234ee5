"""SQLAlchemyTable: wrap an existing table of per-item counts in any SQLAlchemy engine.

copy_table.py SQLAlchemyTable(mode="copy") on the dialects moved onto the SQL store engine
              (PostgreSQL, SQLite, MariaDB / MySQL, DuckDB): the engine and the store's own
              dialect
copy_mode.py  SQLAlchemyTable itself: from_votes() (runs read a rank-ordered copy of the counted
              votes that prepare() writes) and live mode's base; an engine of another dialect
              is refused
live_mode.py  SQLAlchemyTable(mode="live"): runs read the table itself through an index, item
              positions kept by triggers (PostgreSQL, MariaDB / MySQL, SQLite)
"""

from .copy_mode import FINGERPRINTS_TABLE, RankTableMismatchError, SQLAlchemyTable
from .copy_table import SQLAlchemyCopyTable
from .live_mode import SQLAlchemyLiveTable

__all__ = [
    "FINGERPRINTS_TABLE",
    "RankTableMismatchError",
    "SQLAlchemyCopyTable",
    "SQLAlchemyLiveTable",
    "SQLAlchemyTable",
]
