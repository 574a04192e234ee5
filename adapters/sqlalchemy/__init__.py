"""SQLAlchemyTable: wrap an existing table of per-item counts in any SQLAlchemy engine.

table.py       SQLAlchemyTable itself: builds the class of the engine's dialect and the mode
               (an engine of another dialect is refused), and from_votes()
copy_table.py  SQLAlchemyTable(mode="copy") on the SQL store engine (PostgreSQL, SQLite,
               MariaDB / MySQL, DuckDB): the engine and the store's own dialect
votes_table.py SQLAlchemyTable.from_votes(): the same, the copy's source the counting statement
               of the votes (adapters/sql/votes.py)
live_base.py   the table found, reflected and checked, and a run's transaction, for live mode
live_mode.py   SQLAlchemyTable(mode="live"): runs read the table itself through an index, item
               positions kept by triggers (PostgreSQL, MariaDB / MySQL, SQLite)
"""

from .copy_table import SQLAlchemyCopyTable
from .live_mode import SQLAlchemyLiveTable
from .table import FINGERPRINTS_TABLE, RankTableMismatchError, SQLAlchemyTable
from .votes_table import SQLAlchemyVotesTable

__all__ = [
    "FINGERPRINTS_TABLE",
    "RankTableMismatchError",
    "SQLAlchemyCopyTable",
    "SQLAlchemyLiveTable",
    "SQLAlchemyTable",
    "SQLAlchemyVotesTable",
]
