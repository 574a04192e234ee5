"""SQLAlchemyTable copy mode on PostgreSQL reading a stale copy around the rows written since it
was made: the PostgreSQL dialect's change log (adapters/dialects/postgres/changes.py) in
SQLAlchemyTable's layout (adapters/sql/recorded.py: the change log's stamp line after the write
log's in topk_write_stamps). As in test_around_postgres.py, reading around is priced at zero
(`around_seconds`), so what is tested is what the reads return, not the choice.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from adapters.dialects import postgres as postgres_dialect
from adapters.sqlalchemy import SQLAlchemyTable
from tests.stores.test_around_postgres import EPSILON, SCORES, WRITES, K
from tests.stores_sqlalchemy import unique_name
from topk_middleware import private_top_k


@pytest.fixture
def table(sqlalchemy_postgres_engine: sa.Engine) -> Iterator[tuple[SQLAlchemyTable, Any]]:
    engine = sqlalchemy_postgres_engine
    name = unique_name("around_sa")
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {name} (id bigint PRIMARY KEY, score bigint)")
        conn.execute(
            sa.table(name, sa.column("id"), sa.column("score")).insert(),
            [{"id": i, "score": int(s)} for i, s in enumerate(SCORES)],
        )
    source = SQLAlchemyTable(engine, name)
    source.prepare()

    def run(statement: str) -> None:
        with engine.begin() as conn:
            conn.exec_driver_sql(statement.replace("{t}", name))

    yield source, run
    source.uninstall()
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")


@pytest.mark.parametrize("write", ["update", "insert", "delete", "update then delete", "id moved"])
def test_sqlalchemy_on_postgres_reads_a_stale_copy_around_the_writes(
    table: tuple[SQLAlchemyTable, Any], monkeypatch: pytest.MonkeyPatch, write: str
) -> None:
    """After each kind of write, the one-shot names the table's current top-3 reading the copy
    around the changed rows, and m is the current count. Fails where SQLAlchemyTable's layout
    keeps no change log (the run reads the table: `read` "table")."""
    monkeypatch.setattr(postgres_dialect, "around_seconds", lambda entries: 0.0)
    source, run = table
    statements, expected, m = WRITES[write]
    for statement in statements:
        run(statement)
    assert not source.serves_copy()
    for method in ("auto", "oneshot"):
        result = private_top_k(source, k=K, epsilon=EPSILON, method=method, seed=3)
        assert [int(i) for i in result.items] == expected, method
        assert result.plan["freshness"]["read"] == "around", method
    with source.snapshot():
        assert source.domain_size() == m


def test_sqlalchemy_on_postgres_is_current_again_after_a_refresh(
    table: tuple[SQLAlchemyTable, Any],
) -> None:
    """The copy's stamp carries the change log's line without breaking the write log's proof:
    proven current after prepare() and after prepare(refresh=True), stale after a write."""
    source, run = table
    assert source.serves_copy()
    run("UPDATE {t} SET score = 10000 WHERE id = 5")
    assert not source.serves_copy()
    source.prepare(refresh=True)
    assert source.serves_copy()
    result = private_top_k(source, k=K, epsilon=EPSILON, seed=3)
    assert [int(i) for i in result.items] == [5, 299, 298]
    assert result.plan["freshness"]["copy"] == "current"
