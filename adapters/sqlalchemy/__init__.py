"""SQLAlchemyTable: wrap an existing table of per-item counts in any SQLAlchemy engine.

copy_mode.py  SQLAlchemyTable(mode="copy"): runs read a rank-ordered copy that prepare() writes
live_mode.py  SQLAlchemyTable(mode="live"): runs read the table itself through an index, item
              positions kept by triggers (PostgreSQL, MariaDB / MySQL, SQLite)
"""

from .copy_mode import FINGERPRINTS_TABLE, RankTableMismatchError, SQLAlchemyTable
from .live_mode import SQLAlchemyLiveTable

__all__ = ["FINGERPRINTS_TABLE", "RankTableMismatchError", "SQLAlchemyLiveTable", "SQLAlchemyTable"]
