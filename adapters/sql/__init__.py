"""The SQL store engine (engine.py) and the dialect surface it reads (dialect.py)."""

from .dialect import FLOAT, INTEGER, TEXT, Dialect
from .engine import SQLCopyTable

__all__ = ["FLOAT", "INTEGER", "TEXT", "Dialect", "SQLCopyTable"]
