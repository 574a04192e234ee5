"""Shared test setup.

Store fixtures for the conformance suite live in one plugin module per store (tests/stores_*.py).
Each defines a fixture `make_<name>_source` (name with '-' as '_') that returns a function
`(scores, ids) -> Source` building that store over the given histogram, and cleans up afterwards,
and a fixture `write_<name>_source` returning `(source, item_id, new_score) -> bool`: a concurrent
writer for the snapshot test (see tests/test_conformance.py).
"""

from collections.abc import Callable
from typing import Any

import pytest

pytest_plugins = [
    "tests.stores_memory",
    "tests.stores_duckdb",
    "tests.stores_postgres",
    "tests.stores_sqlalchemy",
]

# Live stores: their plugins build them with positions equal to the input indexes (the reference
# is ArraySource(scores, ids, positions="input")), except where a run serves canonical ranks
# (postgres-live-runs on few distinct scores); tests.helpers.reference_for asks the store.
LIVE_STORE_NAMES: list[str] = [
    "postgres-live",
    "postgres-live-runs",
    "sqlalchemy-live-sqlite",
    "sqlalchemy-live-postgres",
    "sqlalchemy-live-mariadb",
]

# The stores every conformance test runs against, in this order.
STORE_NAMES: list[str] = [
    "memory",
    "duckdb",
    "postgres",
    "sqlalchemy-sqlite",
    "sqlalchemy-postgres",
    "sqlalchemy-mariadb",
    "sqlalchemy-duckdb",
    *LIVE_STORE_NAMES,
]


@pytest.fixture(params=STORE_NAMES)
def make_store(request: pytest.FixtureRequest) -> Callable[[Any, Any], Any]:
    """Each store in turn: a function (scores, ids) -> Source."""
    return request.getfixturevalue(f"make_{request.param.replace('-', '_')}_source")
