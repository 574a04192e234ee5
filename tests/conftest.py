"""Shared test setup.

Store fixtures for the conformance suite live in one plugin module per store (tests/stores_*.py).
Each defines a fixture `make_<name>_source` (name with '-' as '_') that returns a function
`(scores, ids) -> Source` building that store over the given histogram, and cleans up afterwards,
and a fixture `write_<name>_source` returning `(source, item_id, new_score) -> bool`: a concurrent
writer for the snapshot test (see tests/stores/test_conformance.py). A plugin may add a
session-scoped `shared_<name>_source` of the same signature that builds one source per distinct
histogram for the whole session (tests/helpers.py shared_sources): tests that only read get it
through `make_store` or `read_only_maker`; a test that writes asks for `make_<name>_source`.

Parallel runs. `make test` and plain `pytest` run the suite on one worker process per core plus one
(pytest-xdist; the options are in pyproject.toml: `-n auto --dist loadgroup`, and
tests/xdist_groups.py sets what `auto` means; `-n 0` runs it in one process). Tests go to workers
one by one, so a test must not depend on another test's leftovers, and anything it makes on a
server must be its own: each worker has its own PostgreSQL database (tests/pg_database.py: made at
the worker's start from TOPK_PG_DSN's server, dropped at its end; so whatever is one per database,
such as the SQL functions' schema `topk` and its settings row, is one per worker), its own schema
in it (`pg_schema`), its own temporary directories (DuckDB and SQLite files), and the fixtures name
tables, roles and ledger principals with a random suffix (uuid). That covers a new test file with
no further work.

Groups. Tests marked with one group run on one worker, in file order:

    pytestmark = pytest.mark.xdist_group("name")   # at the top of the test module

(or `@pytest.mark.xdist_group("name")` on a test function or class; tests/xdist_groups.py
reads the marks from the files' syntax, so write them literally as above). Groups are handed out
before the single tests, so a group also starts at the beginning of the run. Use one

* for something one per server that tests share (a cluster-wide setting, a directory such as
  /var/lib/topk_middleware), so that they never race each other, whichever files they are in;
* for an expensive session-scoped fixture (a local Spark session): it is built once per worker
  that uses it, so give every file using it the same group;
* for a module whose fixtures are costly and whose tests are many, or slow: it keeps them on
  one worker and starts them first. Keep a group's total time well under the suite's (it runs
  serially).

Today's groups: "sql-function", "sql-hardening", "sql-observer", "sql-keys" (the SQL functions'
tests: one worker's PL/Python sessions, kept between tests, serve each file), "spark",
"bench-harness"
(tests/project/test_benchmarks.py: its fixed `topk_bench_*` tables and the module-scoped sweep),
"mariadb-general-log" (tests/privacy/test_secrets.py: MariaDB's general log, a server-wide setting),
"redteam" (tests/privacy/test_redteam.py: one database of the red team benchmark,
its module fixtures).
"""

from collections.abc import Callable
from typing import Any

import pytest

pytest_plugins = [
    "tests.pg_database",
    "tests.stores_memory",
    "tests.stores_duckdb",
    "tests.stores_postgres",
    "tests.stores_sqlalchemy",
    "tests.stores_spark",
    "tests.stores_ibis",
    "tests.stores_clickhouse",
    "tests.sql_sessions",
    "tests.xdist_groups",
    "tests.temp_root",
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

# IbisTable (adapters/ibis.py) over three Ibis backends: rank-ordered (positions are ranks).
IBIS_STORE_NAMES: list[str] = ["ibis-duckdb", "ibis-sqlite", "ibis-postgres"]

# The stores every conformance test runs against, in this order.
STORE_NAMES: list[str] = [
    "memory",
    "duckdb",
    "postgres",
    "sqlalchemy-sqlite",
    "sqlalchemy-postgres",
    "sqlalchemy-mariadb",
    "sqlalchemy-duckdb",
    "clickhouse",
    *LIVE_STORE_NAMES,
    *IBIS_STORE_NAMES,
]


def read_only_maker(request: pytest.FixtureRequest, name: str) -> Callable[[Any, Any], Any]:
    """The plugin's session-wide `shared_<name>_source` if it has one, else its
    `make_<name>_source`: for tests that only read the sources they make."""
    fixture = name.replace("-", "_")
    try:
        return request.getfixturevalue(f"shared_{fixture}_source")
    except pytest.FixtureLookupError:
        return request.getfixturevalue(f"make_{fixture}_source")


@pytest.fixture(params=STORE_NAMES)
def make_store(request: pytest.FixtureRequest) -> Callable[[Any, Any], Any]:
    """Each store in turn: a function (scores, ids) -> Source, for tests that only read (a
    histogram made twice in a session may be served by one source)."""
    return read_only_maker(request, request.param)


@pytest.fixture(autouse=True)
def _small_tables_read_as_large_ones(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL, MariaDB and SQLite read a table of at most `whole_read_rows` rows whole
    (adapters/sql/whole.py: 3,000-20,000, measured); the suite's tables of those stores are far
    smaller, and its tests of the copy, of the table's reads and of reading around the writes
    are about the tables past the crossover. So they run with whole_read_rows = 0 and
    whole_read_alone_rows = 0 (what a table past both gets), and a test marked `whole_reads`
    (tests/stores/test_whole_read_sql.py) with the dialects' measured crossovers. DuckDB's (20,000)
    holds everywhere."""
    if request.node.get_closest_marker("whole_reads") is not None:
        return
    from adapters.dialects.mysql import MySQLDialect
    from adapters.dialects.postgres import PostgresDialect
    from adapters.dialects.sqlite import SQLiteDialect

    for dialect in (PostgresDialect, MySQLDialect):
        monkeypatch.setattr(dialect, "whole_read_rows", 0)
        monkeypatch.setattr(dialect, "whole_read_alone_rows", 0)
    monkeypatch.setattr(SQLiteDialect, "whole_read_rows", 0)
