"""Shared test setup.

Store fixtures for the conformance suite live in one plugin module per store (tests/stores_*.py).
Each defines a fixture `make_<name>_source` (name with '-' as '_') that returns a function
`(scores, ids) -> Source` building that store over the given histogram, and cleans up afterwards,
and a fixture `write_<name>_source` returning `(source, item_id, new_score) -> bool`: a concurrent
writer for the snapshot test (see tests/test_conformance.py).

Parallel runs. `make test` and plain `pytest` run the suite on several worker processes
(pytest-xdist; the options are in pyproject.toml: `-n 4 --dist loadgroup`; `-n 0` runs it in one
process). Tests go to workers one by one, so a test must not depend on another test's leftovers,
and anything it makes on a server must be its own: each worker has its own PostgreSQL schema
(`pg_schema`), its own temporary directories (DuckDB and SQLite files), and the fixtures name
tables, roles and ledger principals with a random suffix (uuid). That covers a new test file
with no further work.

A server-side singleton (something one per database: the SQL functions' schema `topk` with its
single `topk.settings` row and the staged copy under /var/lib, a fixed table name, a
cluster-wide setting) is shared by marking every test that touches it with one group:

    pytestmark = pytest.mark.xdist_group("topk-schema")   # at the top of the test module

(or `@pytest.mark.xdist_group("topk-schema")` on a test function or class). Tests of one
group run on one worker, in file order (`--dist loadgroup`; tests/xdist_groups.py reads the
marks from the files' syntax, so write them literally as above), so they never race
each other, whichever files they are in. A session-scoped fixture is built once per worker that
uses it: give every test file using an expensive one (a local Spark session) the same group
(e.g. "spark"), and it is built once. Group a file also when its module fixture is costly and
its tests are many and quick. Today's groups: "topk-schema"
(tests/test_sql_function.py), "bench-harness" (tests/test_benchmarks.py: its fixed
`topk_bench_*` tables and the module-scoped sweep).
"""

from collections.abc import Callable
from typing import Any

import pytest

pytest_plugins = [
    "tests.stores_memory",
    "tests.stores_duckdb",
    "tests.stores_postgres",
    "tests.stores_sqlalchemy",
    "tests.stores_spark",
    "tests.xdist_groups",
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
