"""Small tables read whole on PostgreSQL (PostgresTable, psycopg) and SQLite (SQLAlchemyTable):
after a first run has counted the table, each run is one statement and no transaction
(adapters/sql/whole.py alone_run), whether the copy is current or written since; its release
and access counts are ArraySource's; exact scores come from the rows read; a copy found stale
at most whole_read_rows rows is read whole without pricing the other ways (no change-log
facts); a table past the crossover is read the other way."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from psycopg import sql

from adapters.dialects.postgres import PostgresDialect
from adapters.dialects.postgres.tables import packed_whole
from adapters.postgres import PostgresTable
from adapters.sql.whole import MEMORY_COSTS
from adapters.sqlalchemy import SQLAlchemyTable
from tests.helpers import plateau_histogram, reference_like
from tests.stores_postgres import ID_COLUMN, SCORE_COLUMN, _connect, create_table
from topk_middleware import private_top_k

pytestmark = pytest.mark.whole_reads

M = 1000
SCORES = np.floor(np.random.default_rng(5).pareto(1.3, M) * 8) / 2  # halves: float8, ties


def count_calls(source: Any) -> dict[str, int]:
    """Statements and transactions the source's driver sends from here on."""
    counts = {"statements": 0, "transactions": 0}
    driver = source.driver
    execute, transaction = driver.execute, driver.transaction

    def counted_execute(*args: Any, **kwargs: Any) -> Any:
        counts["statements"] += 1
        return execute(*args, **kwargs)

    def counted_transaction(*args: Any, **kwargs: Any) -> Any:
        counts["transactions"] += 1
        return transaction(*args, **kwargs)

    driver.execute, driver.transaction = counted_execute, counted_transaction
    return counts


@pytest.fixture
def pg(pg_conninfo: str, pg_schema: str) -> Iterator[Any]:
    """make(ids) -> (PostgresTable not frozen over SCORES and ids, prepared; run(statement))."""
    conn = _connect(pg_conninfo)
    made: list[tuple[PostgresTable, str]] = []

    def make(ids: Any) -> tuple[PostgresTable, Any]:
        name = f"whole_{uuid.uuid4().hex[:8]}"
        create_table(conn, pg_schema, name, SCORES, ids)
        source = PostgresTable(
            pg_conninfo, name, id=ID_COLUMN, score=SCORE_COLUMN, schema=pg_schema
        )
        source.prepare()
        made.append((source, name))
        names = {
            "{t}": sql.Identifier(pg_schema, name).as_string(conn),
            "{id}": sql.Identifier(ID_COLUMN).as_string(conn),
            "{score}": sql.Identifier(SCORE_COLUMN).as_string(conn),
        }

        def run(statement: str) -> None:
            for key, value in names.items():
                statement = statement.replace(key, value)
            conn.execute(statement)

        return source, run

    yield make
    for source, name in made:
        source.uninstall()
        source.close()
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(pg_schema, name)))
    conn.close()


def _released_as_array_source(source: Any, ids: Any, sent: Any) -> None:
    reference = reference_like(source, SCORES, np.asarray(ids, dtype=object))
    reference.store_costs = MEMORY_COSTS  # auto prices it as the rows read whole
    for seed in range(3):
        for method in ("threshold", "oneshot", "auto"):
            before = dict(sent())
            got = private_top_k(source, k=5, epsilon=0.5, method=method, seed=seed)
            assert {key: sent()[key] - before[key] for key in before} == {
                "statements": 1,
                "transactions": 0,
            }, (seed, method)
            want = private_top_k(reference, k=5, epsilon=0.5, method=method, seed=seed)
            assert got.accesses == want.accesses, (seed, method)
            # the one-shot's order differs from ArraySource's on the engine's every read (the
            # copy's too, and DuckDB's); its set does not
            same = set if method == "oneshot" else list
            assert same(got.items) == same(want.items), (seed, method)
            assert got.plan["freshness"]["read"] == "table whole"


@pytest.mark.parametrize("text", [False, True])
def test_postgres_small_table_runs_are_one_statement_and_no_transaction(
    pg: Any, text: bool
) -> None:
    """A current copy, then 1% of the rows written: every run after the first is the one
    read of the table (fails with whole_read_alone off: five round trips, BEGIN, the catalog,
    the proof, the read, COMMIT)."""
    ids = [f"{'aAbB'[i % 4]}{i:05d}" for i in range(M)] if text else list(range(M))
    source, run = pg(ids)
    private_top_k(source, k=5, epsilon=0.5, seed=0)  # the first run counts the table
    counts = count_calls(source)
    _released_as_array_source(source, ids, lambda: counts)
    run("UPDATE {t} SET {score} = {score} + 1000 WHERE {id} = " + ("'a00000'" if text else "0"))
    before = dict(counts)
    got = private_top_k(source, k=1, epsilon=1e4, seed=1)
    assert got.items == [ids[0]]  # the table as it is now
    assert counts["statements"] - before["statements"] == 1
    assert counts["transactions"] == before["transactions"] == 0
    with source.snapshot():
        assert source.read_exact_scores([ids[0], ids[1]]) == [
            int(SCORES[0]) + 1000,
            int(SCORES[1]),
        ]
    assert counts["statements"] - before["statements"] == 2


def test_postgres_stale_small_copy_is_read_whole_without_pricing(pg: Any) -> None:
    """The first run of an object over a written copy: the catalog, the copy's first query and
    the read, in one transaction; no change-log facts (fails without: five statements)."""
    source, run = pg(list(range(M)))
    run("UPDATE {t} SET {score} = {score} + 1000 WHERE {id} = 7")
    counts = count_calls(source)
    got = private_top_k(source, k=1, epsilon=1e4, seed=1)
    assert got.items == [7]
    assert got.plan["freshness"]["copy"] == "stale"
    assert got.plan["freshness"]["read"] == "table whole"
    assert counts == {"statements": 3, "transactions": 1}


def test_postgres_past_the_crossover_opens_its_transaction(
    pg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One row past whole_read_rows: the copy's run, in its transaction, every time."""
    monkeypatch.setattr(PostgresDialect, "whole_read_rows", M - 1)
    source, _ = pg(list(range(M)))
    private_top_k(source, k=5, epsilon=0.5, seed=0)
    counts = count_calls(source)
    for seed in range(1, 3):
        got = private_top_k(source, k=5, epsilon=0.5, seed=seed)
        assert got.plan["freshness"]["copy"] == "current"
    assert counts["transactions"] == 2


def test_postgres_live_small_table_runs_are_one_statement(pg_conninfo: str, pg_schema: str) -> None:
    """Live mode: the first run opens on the position table; every later one is the one read
    of the table, no transaction, the release ArraySource's, a write seen by the next run (fails
    without: BEGIN and the facts, the runs of tied scores, reads, COMMIT). An oblivious run
    takes no such shortcut; after uninstall() a run refuses again (call prepare())."""
    conn = _connect(pg_conninfo)
    name = f"whole_{uuid.uuid4().hex[:8]}"
    ids = list(range(M))
    create_table(conn, pg_schema, name, SCORES, ids)
    source = PostgresTable(
        pg_conninfo, name, id=ID_COLUMN, score=SCORE_COLUMN, schema=pg_schema, mode="live"
    )
    try:
        source.prepare()
        first = private_top_k(source, k=5, epsilon=0.5, seed=0)
        assert "read" not in first.plan["freshness"]
        counts = count_calls(source)
        sent = {"cursors": 0}
        cursor = source._conn.cursor

        def counted_cursor(*args: Any, **kwargs: Any) -> Any:
            sent["cursors"] += 1
            return cursor(*args, **kwargs)

        source._conn.cursor = counted_cursor
        _released_as_array_source(source, ids, lambda: counts)
        table = sql.Identifier(pg_schema, name)
        conn.execute(
            sql.SQL("UPDATE {} SET {} = {} + 1000 WHERE {} = 3").format(
                table, *map(sql.Identifier, (SCORE_COLUMN, SCORE_COLUMN, ID_COLUMN))
            )
        )
        before = dict(counts)
        got = private_top_k(source, k=1, epsilon=1e4, seed=1)
        assert got.items == [3] and got.plan["freshness"]["read"] == "table whole"
        assert counts["statements"] - before["statements"] == 1
        assert counts["transactions"] == 0
        assert sent["cursors"] == counts["statements"]  # nothing beside the driver's reads
        source._conn.cursor = cursor
        hidden = private_top_k(source, k=5, epsilon=0.5, seed=0, oblivious=True)
        assert "read" not in (hidden.plan.get("freshness") or {})
        source.uninstall()
        with pytest.raises(ValueError, match="prepare"):
            private_top_k(source, k=5, epsilon=0.5, seed=0)
    finally:
        source.uninstall()
        source.close()
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(pg_schema, name)))
        conn.close()


def test_postgres_after_a_stale_copy_a_larger_table_is_read_whole_alone(
    pg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past whole_read_rows and at most whole_read_alone_rows: while the copy is current each
    run is the copy's, in its transaction; after a run that found it written since, each run
    is one packed statement and no transaction, released as ArraySource releases; a refreshed
    copy is proven again (fails without whole_read_alone_rows: every run after the write reads
    the table in a transaction of 6-10 statements)."""
    monkeypatch.setattr(PostgresDialect, "whole_read_rows", M // 2)
    monkeypatch.setattr(PostgresDialect, "whole_read_alone_rows", M)
    ids = list(range(M))
    source, run = pg(ids)
    counts = count_calls(source)
    for seed in range(2):
        got = private_top_k(source, k=5, epsilon=0.5, seed=seed)
        assert got.plan["freshness"]["copy"] == "current"
    assert counts["transactions"] == 2
    run("UPDATE {t} SET {score} = {score} WHERE {id} = 3")  # the write log: stale
    got = private_top_k(source, k=5, epsilon=0.5, seed=2)
    assert got.plan["freshness"]["copy"] == "stale"
    assert got.plan["freshness"]["read"] == "table"
    assert counts["transactions"] == 3
    _released_as_array_source(source, ids, lambda: counts)
    source.prepare(refresh=True)
    before = counts["transactions"]
    got = private_top_k(source, k=5, epsilon=0.5, seed=3)
    assert got.plan["freshness"]["copy"] == "current"
    assert counts["transactions"] == before + 1


PACKED_CASES = [
    ("UPDATE {t} SET {id} = NULL WHERE {id} = 2", "has 1 NULL id"),
    ("UPDATE {t} SET {score} = -1 WHERE {id} = 2", "has 1 negative score"),
    ("UPDATE {t} SET {id} = 1 WHERE {id} = 2", r"has duplicate ids \(1 extra row"),
    ("DELETE FROM {t}", "is empty"),
    ("ALTER TABLE {t} ALTER {score} TYPE numeric USING {score} + 0.5", None),
]


@pytest.mark.parametrize(("statement", "match"), PACKED_CASES)
def test_postgres_packed_whole_reads_check_what_the_rows_hold(
    pg: Any, statement: str, match: str | None
) -> None:
    """Integer ids and counts read whole alone come packed; a NULL, a negative count, a
    repeated id or an empty table is refused in the project's words, and a count column altered
    to fractions since is read as it is (the rows that do not pack are read as rows)."""
    counts = np.floor(SCORES).astype(np.int64)
    source, run = pg(list(range(M)))
    run("UPDATE {t} SET {score} = floor({score})")
    assert private_top_k(source, k=1, epsilon=1e4, seed=1).plan["freshness"]["copy"] == "stale"
    run(statement)
    if match is not None:
        with pytest.raises(ValueError, match=match):
            private_top_k(source, k=1, epsilon=1e4, seed=1)
        return
    top = int(np.argmax(counts))
    got = private_top_k(source, k=1, epsilon=1e4, seed=1)
    assert got.items == [top] and got.plan["freshness"]["read"] == "table whole"
    with source.snapshot():
        assert source.read_exact_scores([top]) == [Decimal(int(counts[top])) + Decimal("0.5")]


def test_sqlite_small_table_runs_are_one_statement(tmp_path: Any) -> None:
    """SQLAlchemyTable on SQLite: every run after the first is one statement on the DBAPI
    cursor (SQLAlchemy's before_cursor_execute), the release ArraySource's; a write is seen by
    the next run (fails with whole_read_alone off)."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'whole.sqlite'}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (id INTEGER PRIMARY KEY, score INTEGER NOT NULL)")
        conn.execute(
            sa.table("t", sa.column("id"), sa.column("score")).insert(),
            [{"id": i, "score": int(s)} for i, s in enumerate(SCORES)],
        )
    source = SQLAlchemyTable(engine, "t")
    source.prepare()
    private_top_k(source, k=5, epsilon=0.5, seed=0)
    sent = {"statements": 0}

    def cursor_execute(*_: Any) -> None:
        sent["statements"] += 1

    sa.event.listen(engine, "before_cursor_execute", cursor_execute)
    counts = count_calls(source)
    _released_as_array_source(
        source, list(range(M)), lambda: {**sent, "transactions": counts["transactions"]}
    )
    assert counts["statements"] == sent["statements"]
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE t SET score = score + 1000 WHERE id = 3")
    before = sent["statements"]
    assert private_top_k(source, k=1, epsilon=1e4, seed=1).items == [3]
    assert sent["statements"] - before == 1
    source.uninstall()
    engine.dispose()


def test_mariadb_small_table_runs_are_one_statement(
    sqlalchemy_mariadb_engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLAlchemyTable on MariaDB: at most whole_read_rows rows, every run after the first is
    one statement on the DBAPI cursor and no run transaction, the release ArraySource's, a
    write seen by the next run; past it, a current copy's run opens its transaction, and after
    a run that found the copy written since each run is the one read again, up to
    whole_read_alone_rows (fails with MariaDB's whole reads off: BEGIN, the snapshot, the
    catalog, the proof, the read, COMMIT)."""
    from adapters.dialects.mysql import MySQLDialect

    engine = sqlalchemy_mariadb_engine
    name = f"whole_{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {name} (id BIGINT PRIMARY KEY, score BIGINT NOT NULL)")
        conn.execute(
            sa.table(name, sa.column("id"), sa.column("score")).insert(),
            [{"id": i, "score": int(s)} for i, s in enumerate(SCORES)],
        )
    source = SQLAlchemyTable(engine, name)
    sent = {"statements": 0}

    def cursor_execute(*_: Any) -> None:
        sent["statements"] += 1

    try:
        source.prepare()
        private_top_k(source, k=5, epsilon=0.5, seed=0)
        sa.event.listen(engine, "before_cursor_execute", cursor_execute)
        counts = count_calls(source)
        _released_as_array_source(
            source, list(range(M)), lambda: {**sent, "transactions": counts["transactions"]}
        )
        with engine.begin() as conn:
            conn.exec_driver_sql(f"UPDATE {name} SET score = score + 1000 WHERE id = 3")
        before = sent["statements"]
        assert private_top_k(source, k=1, epsilon=1e4, seed=1).items == [3]
        assert sent["statements"] - before == 1
        monkeypatch.setattr(MySQLDialect, "whole_read_rows", M // 2)
        monkeypatch.setattr(MySQLDialect, "whole_read_alone_rows", M)
        source.prepare(refresh=True)
        got = private_top_k(source, k=1, epsilon=1e4, seed=1)
        assert got.plan["freshness"]["copy"] == "current"
        with engine.begin() as conn:
            conn.exec_driver_sql(f"UPDATE {name} SET score = score + 5000 WHERE id = 4")
        got = private_top_k(source, k=1, epsilon=1e4, seed=1)
        assert got.items == [4] and got.plan["freshness"]["copy"] == "stale"
        before = dict(sent), counts["transactions"]
        got = private_top_k(source, k=1, epsilon=1e4, seed=1)
        assert got.items == [4] and got.plan["freshness"]["read"] == "table whole"
        assert (sent["statements"], counts["transactions"]) == (
            before[0]["statements"] + 1,
            before[1],
        )
    finally:
        if sa.event.contains(engine, "before_cursor_execute", cursor_execute):
            sa.event.remove(engine, "before_cursor_execute", cursor_execute)
        source.uninstall()
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE {name}")


def test_a_plateau_read_whole_is_released_as_array_source_chooses(tmp_path: Any) -> None:
    """The planner prices the rows in memory by what runs over them cost in Python: on a tied
    plateau auto takes the one-shot over the rows read, as an ArraySource priced alike does
    (fails with reads priced at microseconds: the threshold run, 4.5 ms of Python against
    0.13 ms at 10^3 rows)."""
    scores = plateau_histogram(M, 10)
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'plateau.sqlite'}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (id INTEGER PRIMARY KEY, score INTEGER NOT NULL)")
        conn.execute(
            sa.table("t", sa.column("id"), sa.column("score")).insert(),
            [{"id": i, "score": int(s)} for i, s in enumerate(scores)],
        )
    source = SQLAlchemyTable(engine, "t")
    source.prepare()
    private_top_k(source, k=10, epsilon=1.0, seed=0)
    reference = reference_like(source, scores, np.arange(M))
    reference.store_costs = MEMORY_COSTS  # auto prices it as the rows read whole
    for seed in range(1, 3):
        got = private_top_k(source, k=10, epsilon=1.0, seed=seed)
        want = private_top_k(reference, k=10, epsilon=1.0, seed=seed)
        assert got.plan["freshness"]["read"] == "table whole"
        assert got.plan["auto"]["chosen"] == want.plan["auto"]["chosen"] == "oneshot_full_read"
        assert got.accesses == want.accesses
    source.uninstall()
    engine.dispose()


def test_postgres_integer_columns_are_read_packed_and_a_null_is_refused(
    pg_conninfo: str, pg_schema: str
) -> None:
    """Integer ids and scores read alone come back as one bytea of int8 pairs
    (tables.packed_whole): the arrays are the table's, the release and access counts
    ArraySource's, exact scores Python ints; with a NULL score nothing is packed, the rows are
    read as rows and the run refuses as validate() does."""
    conn = _connect(pg_conninfo)
    name = f"whole_{uuid.uuid4().hex[:8]}"
    scores = np.floor(SCORES * 3).astype(np.int64)
    ids = np.random.default_rng(3).permutation(M)
    create_table(conn, pg_schema, name, scores, ids)
    source = PostgresTable(
        pg_conninfo, name, id=ID_COLUMN, score=SCORE_COLUMN, schema=pg_schema, mode="live"
    )
    table = sql.Identifier(pg_schema, name)
    try:
        source.prepare()
        private_top_k(source, k=5, epsilon=0.5, seed=0)  # counts the table
        got = packed_whole(source.driver, source)
        assert got is not None and got["id"].dtype == got["score"].dtype == np.int64
        by_id = dict(zip(got["id"].tolist(), got["score"].tolist(), strict=True))
        assert by_id == dict(zip(ids.tolist(), scores.tolist(), strict=True))
        reference = reference_like(source, scores, ids)
        reference.store_costs = MEMORY_COSTS
        for seed in range(2):
            for method in ("threshold", "auto"):
                mine = private_top_k(source, k=5, epsilon=0.5, method=method, seed=seed)
                want = private_top_k(reference, k=5, epsilon=0.5, method=method, seed=seed)
                assert mine.items == want.items and mine.accesses == want.accesses
                assert mine.plan["freshness"]["read"] == "table whole"
        top = int(ids[np.argmax(scores)])
        with source.snapshot():
            exact = source.read_exact_scores([top])
        assert exact == [int(scores.max())] and type(exact[0]) is int
        conn.execute(
            sql.SQL("UPDATE {} SET {} = NULL WHERE {} = 5").format(
                table, sql.Identifier(SCORE_COLUMN), sql.Identifier(ID_COLUMN)
            )
        )
        assert packed_whole(source.driver, source) is None
        with pytest.raises(ValueError, match="NULL"):
            private_top_k(source, k=5, epsilon=0.5, seed=1)
    finally:
        source.uninstall()
        source.close()
        conn.execute(sql.SQL("DROP TABLE {}").format(table))
        conn.close()
