"""PostgreSQL copy mode reading a stale copy around the rows written since it was made
(adapters/sql/around.py, adapters/dialects/postgres/changes.py, docs/freshness.md).

The planner reads around where that is priced below reading the table; on these small tables
the table read is priced cheaper, so the `around` fixture prices reading around at zero
(adapters/dialects/postgres `around_seconds`): what is tested is what the reads return, not the
choice.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql

from adapters.dialects import postgres as postgres_dialect
from adapters.memory import ArraySource
from adapters.postgres import PostgresTable
from topk_middleware import private_top_k
from topk_middleware.privacy import calibrate

SCORES = np.arange(300, dtype=np.int64) * 2
K = 3
EPSILON = 1e4  # Gumbel scale 6e-4: a gap of 2 is never crossed (test_freshness_postgres.py)


@pytest.fixture
def around(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres_dialect, "around_seconds", lambda entries: 0.0)


def _make(conn: psycopg.Connection[Any], t: sql.Composable, scores: Any, key: bool) -> None:
    kind = "float8" if np.asarray(scores).dtype.kind == "f" else "bigint"
    primary = " PRIMARY KEY" if key else ""
    conn.execute(sql.SQL(f"CREATE TABLE {{}} (id bigint{primary}, score {kind})").format(t))
    with conn.cursor() as cur, cur.copy(sql.SQL("COPY {} FROM STDIN").format(t)) as copy:
        for row in enumerate(np.asarray(scores).tolist()):
            copy.write_row(row)


@pytest.fixture
def table(pg_conninfo: str, pg_schema: str) -> Iterator[tuple[PostgresTable, Any]]:
    writer = psycopg.connect(pg_conninfo, autocommit=True)
    name = f"around_{uuid.uuid4().hex[:8]}"
    t = sql.Identifier(pg_schema, name)
    _make(writer, t, SCORES, key=True)
    source = PostgresTable(pg_conninfo, name, schema=pg_schema)
    source.prepare()

    def run(statement: str) -> None:
        writer.execute(sql.SQL(statement).format(t=t))

    yield source, run
    source.uninstall()
    source.close()
    writer.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(t))
    writer.close()


def _top(source: PostgresTable, method: str = "auto") -> tuple[list[int], dict[str, Any]]:
    result = private_top_k(source, k=K, epsilon=EPSILON, method=method, seed=3)
    return [int(i) for i in result.items], result.plan["freshness"]


WRITES = {
    "update": (["UPDATE {t} SET score = 10000 WHERE id = 5"], [5, 299, 298], 300),
    "insert": (["INSERT INTO {t} VALUES (1000, 10000), (1001, 1)"], [1000, 299, 298], 302),
    "delete": (["DELETE FROM {t} WHERE id IN (299, 298)"], [297, 296, 295], 298),
    "update then delete": (
        ["UPDATE {t} SET score = 10000 WHERE id = 5", "DELETE FROM {t} WHERE id = 5"],
        [299, 298, 297],
        299,
    ),
    "delete then insert": (
        ["DELETE FROM {t} WHERE id = 7", "INSERT INTO {t} VALUES (7, 9000)"],
        [7, 299, 298],
        300,
    ),
    "insert then delete": (
        ["INSERT INTO {t} VALUES (2000, 9000)", "DELETE FROM {t} WHERE id = 2000"],
        [299, 298, 297],
        300,
    ),
    "id moved": (["UPDATE {t} SET id = 5000, score = 9000 WHERE id = 3"], [5000, 299, 298], 300),
    "many statements": (
        [f"UPDATE {{t}} SET score = score + {i} WHERE id = {i}" for i in range(40)]
        + ["UPDATE {t} SET score = 0 WHERE id >= 297"],
        [296, 295, 294],
        300,
    ),
}


@pytest.mark.parametrize("write", list(WRITES))
def test_a_release_read_around_the_writes_is_the_current_tables(
    table: tuple[PostgresTable, Any], around: None, write: str
) -> None:
    """After each kind of write, every method names the table's current top-3 and m is the
    current count, the copy read around the changed rows (the one-shot) or the table (the
    threshold method). Fails if the last entry of an id does not decide its row, or if an
    unchanged row of the copy is lost or a changed one served from the copy."""
    source, run = table
    statements, expected, m = WRITES[write]
    for statement in statements:
        run(statement)
    assert not source.serves_copy()
    for method in ("auto", "oneshot", "threshold"):
        top, freshness = _top(source, method)
        assert top == expected, method
        assert freshness["read"] == "around", method
    with source.snapshot():
        assert source.domain_size() == m
        assert source.oneshot_positions() >= m


@pytest.mark.parametrize(
    "statement",
    [
        "ALTER TABLE {t} DISABLE TRIGGER ALL",
        "DROP TRIGGER {upd} ON {t}",
        "ALTER TABLE {t} DROP CONSTRAINT {pkey}",
    ],
)
def test_reading_around_ends_where_its_facts_change(
    table: tuple[PostgresTable, Any], around: None, statement: str
) -> None:
    """A change trigger disabled or dropped, or the unique index gone: the run reads the table
    (the writes are still seen). Fails if the change log's digest misses the fact."""
    source, run = table
    upd = sql.Identifier(source.change_triggers[1]).as_string(source._conn)
    pkey = sql.Identifier(source.table + "_pkey").as_string(source._conn)
    run(statement.replace("{upd}", upd).replace("{pkey}", pkey))
    run("UPDATE {t} SET score = 10000 WHERE id = 5")
    top, freshness = _top(source)
    assert top == [5, 299, 298]
    assert freshness["read"] == "table"


def test_bad_rows_among_the_changes_are_refused_by_the_table_read(
    table: tuple[PostgresTable, Any], around: None
) -> None:
    """A NULL score written since the copy: reading around declines, the table read refuses
    in the project's words, before anything is released."""
    source, run = table
    run("UPDATE {t} SET score = NULL WHERE id = 5")
    with pytest.raises(Exception, match="score") as error:
        _top(source)
    assert "psycopg" not in type(error.value).__module__


def test_prepare_refresh_empties_the_change_log(
    table: tuple[PostgresTable, Any], around: None
) -> None:
    """prepare(refresh=True) deletes the entries its snapshot saw: the copy is current again,
    and the next write is read around from an empty log."""
    source, run = table
    run("UPDATE {t} SET score = 10000 WHERE id = 5")
    source.prepare(refresh=True)
    assert source.serves_copy()
    assert source.driver.scalar(f"SELECT count(*) FROM {source.changes_table}") == 0
    run("UPDATE {t} SET score = 20000 WHERE id = 6")
    top, freshness = _top(source)
    assert top == [6, 5, 299] and freshness["read"] == "around" and freshness["logged"] == 2


def test_no_unique_key_no_change_log(pg_conninfo: str, pg_schema: str, around: None) -> None:
    """Without a unique B-tree on the id, writes cannot be ordered per id: no change log is
    installed, and a stale copy is read through the table."""
    conn = psycopg.connect(pg_conninfo, autocommit=True)
    name = f"nokey_{uuid.uuid4().hex[:8]}"
    t = sql.Identifier(pg_schema, name)
    _make(conn, t, SCORES, key=False)
    source = PostgresTable(pg_conninfo, name, schema=pg_schema)
    try:
        source.prepare()
        conn.execute(sql.SQL("UPDATE {} SET score = 10000 WHERE id = 5").format(t))
        top, freshness = _top(source)
        assert top == [5, 299, 298] and freshness["read"] == "table"
        exists = conn.execute("SELECT to_regclass(%s)", [source.changes_table])
        assert exists.fetchone()[0] is None
    finally:
        source.uninstall()
        source.close()
        conn.execute(sql.SQL("DROP TABLE {}").format(t))
        conn.close()


def test_read_around_has_the_law_of_the_current_table(
    pg_conninfo: str, pg_schema: str, around: None
) -> None:
    """The one-shot read around the writes releases item i as top-1 with probability
    exp(h_i / b) / sum_j exp(h_j / b) over the *current* rows (Gumbel-max, Fact 3.3, k = 1),
    as a fresh copy would, and as an ArraySource of the current rows does. m = 20,000, split
    at the default level (the exceedances drawn over m_copy + present positions). After the
    copy, one top item is deleted, one updated, one inserted, and 500 zeros are updated (holes
    at their copy ranks, positions past m_copy). Chi-square over 400 seeded releases, each
    against the exact law, p > 0.001 (fails with probability 0.001 per store if the law
    holds; fails surely if a deleted item could win, or the updated or inserted one kept its
    old chance)."""
    from scipy import stats

    m = 20_000
    b = calibrate("gumbel", 1, m, 1.0, 0.0).scale
    lifts = np.array([0.0, 0.5, 1.0, 1.5, 2.0])
    scores = np.zeros(m)
    scores[[10, 20, 30, 40, 50]] = b * (np.log(m) + lifts)
    conn = psycopg.connect(pg_conninfo, autocommit=True)
    name = f"law_{uuid.uuid4().hex[:8]}"
    t = sql.Identifier(pg_schema, name)
    _make(conn, t, scores, key=True)
    source = PostgresTable(pg_conninfo, name, schema=pg_schema)
    try:
        source.prepare()
        top_now = b * (np.log(m) + 1.75)
        conn.execute(sql.SQL("DELETE FROM {} WHERE id = 50").format(t))  # the best one
        conn.execute(sql.SQL("UPDATE {} SET score = %s WHERE id = 10").format(t), [float(top_now)])
        conn.execute(
            sql.SQL("INSERT INTO {} VALUES (%s, %s)").format(t), [m + 7, float(b * np.log(m))]
        )
        conn.execute(sql.SQL("UPDATE {} SET score = 0 WHERE id >= 1000 AND id < 1500").format(t))
        ids, current = zip(
            *conn.execute(sql.SQL("SELECT id, score FROM {} ORDER BY id").format(t)).fetchall(),
            strict=True,
        )
        current_scores = np.array(current, dtype=np.float64)
        order = [10, 20, 30, 40, m + 7]
        weights = np.array(
            [np.exp(current_scores[list(ids).index(i)] / b) for i in order]
            + [float(len(ids) - len(order))]
        )
        expected = weights / weights.sum()
        runs = 400
        memory = ArraySource(current_scores, np.array(ids))
        for store in (source, memory):
            counts = np.zeros(len(order) + 1)
            for seed in range(runs):
                result = private_top_k(store, k=1, epsilon=1.0, method="oneshot", seed=seed)
                if store is source:
                    assert result.plan["freshness"]["read"] == "around"
                item = int(result.items[0])
                counts[order.index(item) if item in order else len(order)] += 1
            assert stats.chisquare(counts, expected * runs).pvalue > 1e-3, store
    finally:
        source.uninstall()
        source.close()
        conn.execute(sql.SQL("DROP TABLE {} CASCADE").format(t))
        conn.close()


def test_the_one_shot_read_around_probes_the_change_table_by_its_b_trees(
    table: tuple[PostgresTable, Any], around: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-shot read around the writes reads the change table and the tally only through
    B-trees: EXPLAIN of the statement the run sent, in the run's settings, has no sequential
    scan and no whole-index walk of either (each copy row it looks at is one probe of the id
    B-tree, the changed rows above its cut one range of the score B-tree). Fails where the
    plan may hash or sort every entry (anti joins: at m = 10^7, 10^6 entries hashed to test a
    few rows), or where the changed rows are found by scanning every entry."""
    from adapters.dialects.postgres import changes, seq_scans

    source, run = table
    run("UPDATE {t} SET score = score + 1 WHERE id < 250")  # 500 entries
    run("UPDATE {t} SET score = 10000 WHERE id = 5")  # above the cut: read by the score B-tree
    sent: list[tuple[str, Any]] = []
    execute = source.driver.execute

    def spy(statement: str, params: Any = None, **options: Any) -> Any:
        sent.append((statement, params))
        return execute(statement, params, **options)

    monkeypatch.setattr(source.driver, "execute", spy)
    top, freshness = _top(source, "oneshot")
    assert top == [5, 299, 298] and freshness["read"] == "around"
    assert freshness["logged"] == 502
    oneshot = [(s, p) for s, p in sent if s.startswith("WITH RECURSIVE e(position, z)")]
    assert len(oneshot) == 1
    statement, params = oneshot[0]
    names = source.proof.changes.names
    with source.driver.transaction():
        execute(changes.settings_sql(names))
        execute(changes.oneshot_settings_sql())
        plan = source.driver.scalar("EXPLAIN (FORMAT JSON) " + statement, params)
    read_whole = " ".join(seq_scans(plan))
    assert names.index_prefix not in read_whole, read_whole


def test_a_change_log_without_its_tally_is_completed_by_prepare(
    table: tuple[PostgresTable, Any], around: None
) -> None:
    """A change log whose function writes no tally (and whose change table has no score
    B-tree): the run reads the table (the digest names the tally), and prepare(refresh=True)
    makes the tally and the index and replaces the function, after which the writes are read
    around again. Fails if the digest missed the tally (m counted from no tally rows)."""
    source, run = table
    names = source.proof.changes.names
    with source.driver.transaction():
        source.driver.execute(f"DROP TABLE {names.tally}")
        source.driver.execute(f'DROP INDEX "{source.schema}"."{names.index_prefix}_score"')
        source.driver.execute(
            f"CREATE OR REPLACE FUNCTION {names.function}() RETURNS trigger LANGUAGE plpgsql "
            "AS 'BEGIN RETURN NULL; END'"
        )
    run("UPDATE {t} SET score = 10000 WHERE id = 5")
    top, freshness = _top(source)
    assert top == [5, 299, 298] and freshness["read"] == "table"
    source.prepare(refresh=True)
    run("INSERT INTO {t} VALUES (1000, 20000)")
    top, freshness = _top(source)
    assert top == [1000, 5, 299] and freshness["read"] == "around"
    with source.snapshot():
        assert source.domain_size() == 301
