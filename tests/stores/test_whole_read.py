"""Runs that read a small table whole (adapters/sql/whole.py), on a DuckDB table that is not
frozen: one statement a run, the checks of validate() in numpy, the release from memory equal to
ArraySource's, and a table past the dialect's crossover read the other way."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import duckdb
import numpy as np
import pytest

from adapters.dialects.duckdb import DuckDBDialect
from adapters.duckdb import DuckDBTable
from adapters.sql.whole import MEMORY_COSTS
from tests.helpers import reference_like
from topk_middleware import private_top_k


@pytest.fixture
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect()
    yield con
    con.close()


def table(con: duckdb.DuckDBPyConnection, ids: list[Any], scores: list[float]) -> None:
    kind = "VARCHAR" if isinstance(ids[0], str) else "BIGINT"
    con.execute(f"CREATE OR REPLACE TABLE t (id {kind}, score DOUBLE)")
    con.execute("INSERT INTO t SELECT unnest(?), unnest(?)", [ids, scores])


def freshness(source: DuckDBTable) -> dict[str, Any]:
    with source.snapshot():
        return dict(source.run_freshness() or {})


class Recorder:
    """A connection whose cursors count the statements a run sends."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con, self.statements = con, 0

    def cursor(self) -> Any:
        recorder, inner = self, self.con.cursor()

        class Cursor:
            def execute(self, *args: Any) -> Any:
                recorder.statements += 1
                return inner.execute(*args)

            def __getattr__(self, name: str) -> Any:
                return getattr(inner, name)

        return Cursor()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.con, name)


@pytest.mark.parametrize("text", [False, True])
def test_a_small_table_is_read_whole_in_one_statement_and_released_as_array_source(
    con: duckdb.DuckDBPyConnection, text: bool
) -> None:
    """Text ids tie in byte order whatever the connection's collation ('B' before 'a'); every
    method releases what ArraySource releases under the same seed, with the same access counts;
    each run after the first sends one statement."""
    con.execute("SET default_collation = 'nocase'")
    rng = np.random.default_rng(3)
    scores = np.floor(rng.pareto(1.5, 3000) * 3)
    ids = [f"{'aAbB'[i % 4]}{i:05d}" for i in range(3000)] if text else list(range(3000))
    table(con, ids, scores.tolist())
    source = DuckDBTable(con, "t")
    recorder = Recorder(con)
    source.driver.conn = recorder
    reference = reference_like(source, scores, np.asarray(ids, dtype=object))
    reference.store_costs = MEMORY_COSTS  # auto prices it as the rows read whole
    assert freshness(source)["read"] == "table whole"
    for seed in range(4):
        for method in ("threshold", "oneshot", "auto"):
            before = recorder.statements
            got = private_top_k(source, k=5, epsilon=0.5, method=method, seed=seed)
            assert recorder.statements - before == 1
            want = private_top_k(reference, k=5, epsilon=0.5, method=method, seed=seed)
            assert got.items == want.items and got.accesses == want.accesses, (seed, method)
            assert got.plan["freshness"]["read"] == "table whole"


@pytest.mark.parametrize("family", ["zipf", "plateau", "distinct"])
def test_a_table_read_whole_is_released_by_the_one_shot_over_its_rows(
    con: duckdb.DuckDBPyConnection, family: str
) -> None:
    """At 10^3 rows read whole, auto takes the one-shot over the rows in hand on every family
    (in Python a threshold run's round trips cost about 0.5 ms each, the one-shot 0.07 us a
    row), without reading the top rows first: the release of that method under the same seed,
    the same accesses; at 2 * 10^4 on skewed scores, where the run stops within its first
    block, the threshold run."""
    m = 1000
    scores = {
        "zipf": np.floor(1000.0 / np.arange(1, m + 1)),
        "plateau": np.where(np.arange(m) < 100, 50.0, 0.0),
        "distinct": np.arange(m, dtype=float),
    }[family]
    table(con, list(range(m)), scores.tolist())
    source = DuckDBTable(con, "t")
    for seed in range(3):
        got = private_top_k(source, k=10, epsilon=1.0, seed=seed)
        assert got.plan["freshness"]["read"] == "table whole"
        assert got.plan["auto"]["chosen"] == "oneshot_full_read"
        assert got.plan["auto"]["probe_rows"] == 0
        same = private_top_k(source, k=10, epsilon=1.0, seed=seed, method="oneshot_full_read")
        assert got.items == same.items and got.accesses == same.accesses
    if family == "zipf":
        big = np.floor(10.0**6 / np.arange(1, 20_001) ** 2)
        table(con, list(range(20_000)), big.tolist())
        got = private_top_k(DuckDBTable(con, "t"), k=10, epsilon=1.0, seed=0)
        assert got.plan["freshness"]["read"] == "table whole"
        assert got.plan["auto"]["chosen"] == "threshold"


REFUSED = [
    ("UPDATE t SET id = 1 WHERE id = 2", r"'id' has duplicate ids \(1 extra row\(s\), e.g. 1\)"),
    ("UPDATE t SET id = NULL WHERE id = 2", "'id' has 1 NULL id"),
    ("UPDATE t SET score = NULL WHERE id = 2", "'score' has 1 NULL score"),
    ("UPDATE t SET score = 'nan' WHERE id IN (2, 3)", "'score' has 2 NaN or infinite"),
    ("UPDATE t SET score = -1 WHERE id = 2", "'score' has 1 negative score"),
    ("DELETE FROM t", "'t' is empty"),
    ("ALTER TABLE t ALTER score TYPE VARCHAR", "'score' must be numeric, it holds str"),
]


@pytest.mark.parametrize(("statement", "match"), REFUSED)
def test_the_rows_read_are_checked_as_validate_checks_the_table(
    con: duckdb.DuckDBPyConnection, statement: str, match: str
) -> None:
    table(con, list(range(100)), [float(i) for i in range(100)])
    source = DuckDBTable(con, "t")
    assert private_top_k(source, k=1, epsilon=1e4, seed=1).items == [99]
    assert freshness(source)["read"] == "table whole"
    con.execute(statement)
    with pytest.raises((ValueError, TypeError), match=match):
        private_top_k(source, k=1, epsilon=1e4, seed=1)


def test_a_table_past_the_crossover_is_read_the_other_way(
    con: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At most whole_read_rows rows: read whole; one more, or a table grown past it since the
    last run: the table's own reads (whose release is the in-store one-shot), and back again."""
    monkeypatch.setattr(DuckDBDialect, "whole_read_rows", 500)
    table(con, list(range(500)), [float(i % 17) for i in range(500)])
    source = DuckDBTable(con, "t")
    assert freshness(source)["read"] == "table whole"
    con.execute("INSERT INTO t VALUES (500, 1000)")
    result = private_top_k(source, k=1, epsilon=1e4, seed=1)  # read whole once more
    assert result.items == [500] and result.plan["freshness"]["read"] == "table whole"
    result = private_top_k(source, k=1, epsilon=1e4, seed=1)
    assert result.items == [500] and result.plan["freshness"]["read"] == "table"
    assert result.plan["in_store_reads"] == "the table"
    assert freshness(DuckDBTable(con, "t"))["read"] == "table"  # a first run counts the rows
    con.execute("DELETE FROM t WHERE id < 10")
    private_top_k(source, k=1, epsilon=1e4, seed=1)
    assert freshness(source)["read"] == "table whole"
