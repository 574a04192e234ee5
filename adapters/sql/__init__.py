"""The SQL store engine: the engine (engine.py) over a driver (driver.py) and a dialect
(dialect.py); the copy's layouts (copies.py), freshness proofs (freshness.py), reads of the table
(table_read.py) and around its changes (around.py), and oblivious reads (oblivious.py)."""

from .dialect import FLOAT, INTEGER, TEXT, Column, Dialect
from .driver import Driver
from .engine import SQLTable

__all__ = ["FLOAT", "INTEGER", "TEXT", "Column", "Dialect", "Driver", "SQLTable"]
