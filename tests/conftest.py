"""Shared test setup.

Store fixtures for the conformance suite live in one plugin module per store (tests/stores_*.py).
Each defines a fixture `make_<name>_source` (name with '-' as '_') that returns a function
`(scores, ids) -> Source` building that store over the given histogram, and cleans up afterwards.
"""

pytest_plugins = ["tests.stores_memory", "tests.stores_sqlalchemy"]

# The stores every conformance test runs against, in this order.
STORE_NAMES: list[str] = [
    "memory",
    "sqlalchemy-sqlite",
    "sqlalchemy-postgres",
    "sqlalchemy-mariadb",
    "sqlalchemy-duckdb",
]
