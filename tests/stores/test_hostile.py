"""The hostile battery: bad input, races and faults, one test per class of defect, on
the real stores. Each test failed on the code before the fix it guards."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from adapters.memory import ArraySource
from tests.conftest import STORE_NAMES
from tests.helpers import reference_for
from topk_middleware import private_top_k

# ----- ids come back exactly as given ---------------------------------------------------------


def test_array_source_returns_ids_with_their_type_and_value() -> None:
    source = ArraySource([50, 40, 30, 20, 10], ids=[1, "a", 2.5, "x\x00", b"\xff"])
    rows = source.read_sorted(0, 5)
    assert rows.ids.tolist() == [1, "a", 2.5, "x\x00", b"\xff"]
    assert [type(i) for i in rows.ids.tolist()] == [int, str, float, str, bytes]
    released = private_top_k(source, k=4, epsilon=1e6, seed=1).items  # noise far below the gaps
    assert released == [1, "a", 2.5, "x\x00"]
    assert type(released[0]) is int


def test_array_source_one_and_text_one_are_two_items() -> None:
    source = ArraySource([7, 7, 7], ids=["1", 1, "x"])
    # The documented total order: numbers, then text in code point order.
    assert source.read_sorted(0, 3).ids.tolist() == [1, "1", "x"]
    assert source.read_ids(["1", 1]).tolist() == [7.0, 7.0]


def test_array_source_mixed_ties_follow_the_documented_order() -> None:
    source = ArraySource([1, 1, 1, 1, 1], ids=[b"a", "b", 2, "a", 1.5])
    assert source.read_sorted(0, 5).ids.tolist() == [1.5, 2, "a", "b", b"a"]


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([None, 1, 2], r"ids\[0\] is None .*ids must be int, float, str or bytes"),
        ([1, True, 2], r"ids\[1\] is True \(bool\)"),
        ([1, 2, float("nan")], r"ids\[2\] is NaN"),
        ([1, 1.0, 2], r"duplicate ids, e.g. 1 at indexes 0 and 1"),
        (["a", ("b",), "c"], r"ids\[1\] is \('b',\) \(tuple\)"),
        (np.array([3.0, np.nan, 1.0]), r"ids\[1\] is NaN"),
    ],
)
def test_array_source_refuses_bad_ids_clearly(ids, message) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        ArraySource([1, 2, 3], ids=ids)


# ----- the CLI: bad arguments, no traceback, nothing left behind -------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--m", "0"], "--m must be >= 1"),
        (["--m", "-5"], "--m must be >= 1"),
        (["--m", "10", "--k", "0"], "--k must be >= 1"),
        (["--m", "10", "--k", "11"], "--k = 11 exceeds the number of items"),
        (["--m", "10", "--epsilon", "nan"], "--epsilon must be finite and > 0"),
        (["--m", "10", "--epsilon", "-1"], "--epsilon must be finite and > 0"),
        (["--m", "10", "--seed", "-1"], "--seed must be >= 0"),
        (["--m", "ten"], "invalid int value"),
    ],
)
def test_cli_refuses_bad_arguments_without_traceback_or_file(
    tmp_path: Path, args: list[str], message: str
) -> None:
    data = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, "-m", "frontends", "demo", *args, "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert not data.exists()  # no directory, no empty DuckDB file


def test_cli_reports_a_store_failure_without_traceback(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    done = subprocess.run(
        [sys.executable, "-m", "frontends", "demo", "--m", "10", "--data-dir", str(blocker)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "topk_middleware demo: error:" in done.stderr
    assert "Traceback" not in done.stderr


# ----- PostgreSQL: rank tables that do not belong, refresh, races, faults, types ---------------

PG_ITEMS = 200


@pytest.fixture
def pg_table(pg_conninfo: str, pg_schema: str):
    """A fresh table (id bigint, score bigint) of PG_ITEMS items in the session schema, and a
    function to (re)create it with given scores; the tables are dropped afterwards."""
    import psycopg
    from psycopg import sql

    conn = psycopg.connect(pg_conninfo, autocommit=True)
    name = f"hostile_{uuid.uuid4().hex[:8]}"
    table = sql.Identifier(pg_schema, name)

    def create(scores: list[int], id_type: str = "bigint", score_type: str = "bigint") -> None:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
        conn.execute(
            sql.SQL("CREATE TABLE {} (id {}, score {})").format(
                table, sql.SQL(id_type), sql.SQL(score_type)
            )
        )
        with conn.cursor() as cur:
            cur.executemany(
                sql.SQL("INSERT INTO {} VALUES (%s::text::{}, %s::text::{})").format(
                    table, sql.SQL(id_type), sql.SQL(score_type)
                ),
                [(str(i), str(v)) for i, v in enumerate(scores)],
            )

    create([1000 if i == 16 else i % 17 for i in range(PG_ITEMS)])  # 16 on top
    yield conn, pg_schema, name, create
    for (drop,) in conn.execute(
        "SELECT format('DROP TABLE IF EXISTS %%I.%%I CASCADE', schemaname, tablename) "
        "FROM pg_tables WHERE schemaname = %s AND tablename LIKE %s",
        [pg_schema, name + "%"],
    ).fetchall():
        conn.execute(drop)
    conn.close()


def _pg_source(pg_conninfo: str, schema: str, name: str, frozen: bool = False):
    from adapters.postgres import PostgresTable

    return PostgresTable(pg_conninfo, name, id="id", score="score", schema=schema, frozen=frozen)


def test_pg_rank_table_of_a_recreated_table_is_not_trusted(pg_conninfo, pg_table) -> None:
    from adapters.postgres import RankTableMismatchError

    _, schema, name, create = pg_table
    source = _pg_source(pg_conninfo, schema, name)
    source.prepare()
    assert private_top_k(source, k=1, epsilon=1e6, seed=1).items == [16]
    create([1000 if i == 3 else 0 for i in range(PG_ITEMS)])  # dropped and re-created
    got = private_top_k(source, k=1, epsilon=1e6, seed=1)  # the new table is read, not the copy
    assert got.items == [3] and got.plan["freshness"]["why"] == "another table"
    frozen = _pg_source(pg_conninfo, schema, name, frozen=True)  # served without a proof
    with pytest.raises(RankTableMismatchError, match="earlier table of this name"):
        private_top_k(frozen, k=1, epsilon=1e6, seed=1)
    frozen.close()
    source.prepare()  # no refresh: the rank table of the old table is rebuilt
    assert source.serves_copy()
    assert private_top_k(source, k=1, epsilon=1e6, seed=1).items == [3]
    source.close()


def test_pg_planted_rank_table_is_refused(pg_conninfo, pg_table) -> None:
    from psycopg import sql

    from adapters.postgres import RankTableMismatchError

    conn, schema, name, _ = pg_table
    source = _pg_source(pg_conninfo, schema, name)
    ranks, runs = (
        sql.Identifier(schema, source.rank_table),
        sql.Identifier(schema, source.runs_table),
    )
    conn.execute(sql.SQL("CREATE TABLE {} (rank bigint, id bigint, score float8)").format(ranks))
    conn.execute(sql.SQL("INSERT INTO {} VALUES (0, 199, 1e9), (1, 0, 0)").format(ranks))
    with pytest.raises(RankTableMismatchError, match="prepare\\(\\) did not build it"):
        source.prepare()
    with pytest.raises(RankTableMismatchError, match="does not belong"):
        private_top_k(source, k=1, epsilon=1.0, seed=1)
    source.prepare(refresh=True)  # asked for: replaced
    conn.execute(sql.SQL("COMMENT ON TABLE {} IS 'topk-rank-v1 1 2 3'").format(ranks))
    got = private_top_k(source, k=1, epsilon=1e6, seed=1)  # a forged fingerprint: other oids
    assert got.items == [16] and got.plan["freshness"]["read"] == "table"
    frozen = _pg_source(pg_conninfo, schema, name, frozen=True)
    with pytest.raises(RankTableMismatchError):
        private_top_k(frozen, k=1, epsilon=1.0, seed=1)
    frozen.close()
    source.prepare(refresh=True)
    fingerprint = (
        conn.execute("SELECT obj_description(%s::regclass, 'pg_class')", [ranks.as_string(conn)])
        .fetchone()[0]
        .split("\n")[0]
    )
    for stamp in ("topk-writes-v2 not-a-snapshot digest", "topk-writes-v2 9:3:x,5 digest"):
        conn.execute(
            sql.SQL("COMMENT ON TABLE {} IS {}").format(
                ranks, sql.Literal(fingerprint + "\n" + stamp)
            )
        )  # a forged stamp proves nothing, and breaks no query
        assert not source.serves_copy()
        assert private_top_k(source, k=1, epsilon=1e6, seed=1).items == [16]
    assert runs is not None
    source.close()


def test_pg_refresh_swaps_tables_without_dead_rows(pg_conninfo, pg_table) -> None:
    conn, schema, name, _ = pg_table
    source = _pg_source(pg_conninfo, schema, name)
    source.prepare()
    qualified = f'"{schema}"."{source.rank_table}"'
    size, oid = conn.execute(
        "SELECT pg_relation_size(%s), %s::regclass::oid", [qualified] * 2
    ).fetchone()
    for _ in range(3):
        source.prepare(refresh=True)
    size_after, oid_after = conn.execute(
        "SELECT pg_relation_size(%s), %s::regclass::oid", [qualified] * 2
    ).fetchone()
    beside = [source.dialect.qualified(schema, n) for n in source.copies.names.beside[:2]]
    dead = sum(
        conn.execute("SELECT to_regclass(%s) IS NOT NULL", [n]).fetchone()[0] for n in beside
    )
    assert oid_after != oid  # a new table took the old one's place
    assert size_after == size  # DELETE + INSERT would have doubled it (dead rows)
    assert dead == 0  # nothing left beside it
    source.close()


def test_pg_refresh_waits_for_a_held_run_then_gives_up_without_dead_rows(
    pg_conninfo, pg_table
) -> None:
    """A run holds its snapshot across a refresh: the swap waits swap_timeout, then refuses
    clearly and changes nothing. Before, it fell back to DELETE + INSERT (a table of dead
    rows: the rank table's size doubled)."""
    from psycopg import sql

    conn, schema, name, _ = pg_table
    # the reader reads the copy as promised (frozen), so the refresh has a run to wait for
    reader = _pg_source(pg_conninfo, schema, name, frozen=True)
    writer = _pg_source(pg_conninfo, schema, name)
    writer.prepare()
    qualified = f'"{schema}"."{writer.rank_table}"'
    size, oid = conn.execute(
        "SELECT pg_relation_size(%s), %s::regclass::oid", [qualified] * 2
    ).fetchone()
    conn.execute(
        sql.SQL("UPDATE {} SET score = 5000 WHERE id = 7").format(sql.Identifier(schema, name))
    )
    with reader.snapshot():
        assert reader.read_sorted(0, 1).ids.tolist() == [16]
        with pytest.raises(TimeoutError, match=r"waited 0\.2 s \(swap_timeout\) for runs"):
            writer.prepare(refresh=True, swap_timeout=0.2)
        assert reader.read_sorted(0, 1).ids.tolist() == [16]  # its snapshot, undisturbed
    after = conn.execute("SELECT pg_relation_size(%s), %s::regclass::oid", [qualified] * 2)
    assert after.fetchone() == (size, oid)  # nothing changed, no dead rows
    beside = [writer.dialect.qualified(schema, n) for n in writer.copies.names.beside[:2]]
    assert not any(
        conn.execute("SELECT to_regclass(%s) IS NOT NULL", [n]).fetchone()[0] for n in beside
    )
    writer.prepare(refresh=True)  # the run has ended: swapped
    assert private_top_k(reader, k=1, epsilon=1e6, seed=1).items == [7]
    with pytest.raises(ValueError, match="swap_timeout must be > 0"):
        writer.prepare(refresh=True, swap_timeout=0)
    reader.close()
    writer.close()


def test_pg_concurrent_prepares_wait_for_each_other(pg_conninfo, pg_table) -> None:
    from concurrent.futures import ThreadPoolExecutor

    _, schema, name, _ = pg_table
    sources = [_pg_source(pg_conninfo, schema, name) for _ in range(4)]

    def prepare(i: int) -> None:
        sources[i].prepare(refresh=bool(i % 2))

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(prepare, range(4)))  # raw UniqueViolation / DeadlockDetected before
    assert private_top_k(sources[0], k=1, epsilon=1e6, seed=1).items == [16]
    for s in sources:
        s.close()


def test_pg_statement_timeout_stops_prepare_clearly(pg_conninfo, pg_table) -> None:
    from psycopg import sql

    conn, schema, name, _ = pg_table
    conn.execute(
        sql.SQL("INSERT INTO {} SELECT g, g % 7 FROM generate_series(1000, 300000) g").format(
            sql.Identifier(schema, name)
        )
    )
    source = _pg_source(pg_conninfo, schema, name)
    with pytest.raises(TimeoutError, match=r"statement_timeout of 0\.001 s"):
        source.prepare(statement_timeout=0.001)
    assert not source.has_rank_table()  # nothing half-built
    source.prepare()
    source.close()


def test_pg_terminated_connection_reconnects(pg_conninfo, pg_table) -> None:
    import psycopg

    from adapters.postgres import PostgresTable

    conn, schema, name, _ = pg_table
    source = _pg_source(pg_conninfo, schema, name)
    source.prepare()
    conn.execute("SELECT pg_terminate_backend(%s)", [source._conn.info.backend_pid])
    assert private_top_k(source, k=1, epsilon=1e6, seed=1).items == [16]  # reconnected
    with pytest.raises(ConnectionError, match=r"lost during the run.*the next run reconnects"):
        with source.snapshot():
            conn.execute("SELECT pg_terminate_backend(%s)", [source._conn.info.backend_pid])
            source.read_sorted(0, 5)
    assert private_top_k(source, k=1, epsilon=1e6, seed=1).items == [16]
    source.close()
    theirs = psycopg.connect(pg_conninfo, autocommit=True)
    borrowed = PostgresTable(theirs, name, id="id", score="score", schema=schema)
    conn.execute("SELECT pg_terminate_backend(%s)", [theirs.info.backend_pid])
    with pytest.raises(ConnectionError, match="make a PostgresTable with a new connection"):
        private_top_k(borrowed, k=1, epsilon=1.0, seed=1)


@pytest.mark.parametrize(
    ("id_type", "score_type", "error", "message"),
    [
        ("bigint", "money", TypeError, "must be numeric, it is money"),
        ("bigint", "oid", TypeError, "must be numeric, it is oid"),
        ("json", "bigint", TypeError, "ids must have an equality and an order"),
    ],
)
def test_pg_unusable_types_are_refused_at_construction(
    pg_conninfo, pg_table, id_type, score_type, error, message
) -> None:
    _, schema, name, create = pg_table
    create([1, 2, 3], id_type=id_type, score_type=score_type)
    with pytest.raises(error, match=message):
        _pg_source(pg_conninfo, schema, name)


def test_pg_numeric_beyond_float8_and_long_ids_are_refused_clearly(pg_conninfo, pg_table) -> None:
    from psycopg import sql

    conn, schema, name, create = pg_table
    create([1, 2, 3], score_type="numeric")
    conn.execute(
        sql.SQL("UPDATE {} SET score = 1e309 WHERE id = 1").format(sql.Identifier(schema, name))
    )
    source = _pg_source(pg_conninfo, schema, name)
    with pytest.raises(ValueError, match="beyond the float8 range"):
        source.prepare()
    source.close()
    create([1, 2, 3], id_type="text")
    conn.execute(
        sql.SQL("UPDATE {} SET id = %s WHERE id = '1'").format(sql.Identifier(schema, name)),
        [uuid.uuid4().hex * 400],  # 12,800 bytes that do not compress well enough
    )
    source = _pg_source(pg_conninfo, schema, name)
    with pytest.raises(ValueError, match="an id of 12800 bytes"):
        source.prepare()
    source.close()


# ----- SQLAlchemy: what is released is what was validated; odd schemas --------------------------


@pytest.mark.parametrize("dialect", ["postgres", "mariadb"])
def test_sqlalchemy_duplicate_committed_during_prepare_is_never_released(
    request: pytest.FixtureRequest, dialect: str
) -> None:
    """A writer commits a duplicate id right after validation, before the copy. PostgreSQL:
    the copy reads the validated snapshot (the duplicate is not copied). MariaDB: the copy is
    checked and refused. Before the fix the rank table held the item twice (m = 11 for 10)."""
    import sqlalchemy as sa

    from adapters.sqlalchemy import SQLAlchemyTable

    engine = request.getfixturevalue(f"sqlalchemy_{dialect}_engine")
    name = f"hostile_{uuid.uuid4().hex[:8]}"
    table = sa.Table(
        name, sa.MetaData(), sa.Column("id", sa.BigInteger), sa.Column("score", sa.BigInteger)
    )
    table.create(engine)
    with engine.begin() as conn:
        conn.execute(table.insert(), [{"id": i, "score": i} for i in range(10)])
    source = SQLAlchemyTable(engine, name)
    hook = "_validate" if hasattr(source, "_validate") else "validate"  # not yet on the engine
    validate = getattr(source, hook)

    def validate_then_write(*conn: object) -> object:
        checked = validate(*conn)
        with engine.begin() as writer:  # another connection, committed
            writer.execute(table.insert().values(id=9, score=100))
        return checked

    setattr(source, hook, validate_then_write)
    try:
        if dialect == "mariadb":
            with pytest.raises(ValueError, match="changed while prepare\\(\\) copied it"):
                source.prepare()
        else:
            source.prepare()
            copy = SQLAlchemyTable(engine, name, frozen=True)  # the copy, read as built
            assert copy.domain_size() == 10
            assert copy.read_sorted(0, 10).ids.tolist() == list(range(9, -1, -1))
            if hasattr(source, "copies"):  # on the SQL store engine a run proves its copy
                with pytest.raises(ValueError, match="duplicate ids"):  # stale: reads the table
                    source.domain_size()
    finally:
        with engine.begin() as conn:
            for t in (source.runs_table_name, source.rank_table_name, name):
                conn.execute(
                    sa.text(f"DROP TABLE IF EXISTS {engine.dialect.identifier_preparer.quote(t)}")
                )


def test_sqlalchemy_prepare_has_refresh(sqlalchemy_sqlite_engine) -> None:
    import sqlalchemy as sa

    from adapters.sqlalchemy import SQLAlchemyTable

    name = f"hostile_{uuid.uuid4().hex[:8]}"
    with sqlalchemy_sqlite_engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {name} (id INTEGER, score INTEGER)")
        conn.exec_driver_sql(f"INSERT INTO {name} VALUES (1, 5), (2, 3)")
    source = SQLAlchemyTable(sqlalchemy_sqlite_engine, name)
    source.prepare()
    with sqlalchemy_sqlite_engine.begin() as conn:
        conn.exec_driver_sql(f"UPDATE {name} SET score = 9 WHERE id = 2")
    source.prepare()  # kept: a filled rank table is the snapshot of the last build
    copy = SQLAlchemyTable(sqlalchemy_sqlite_engine, name, frozen=True)  # reads the copy as built
    assert copy.read_sorted(0, 1).ids.tolist() == [1]
    assert source.read_sorted(0, 1).ids.tolist() == [2]  # a run proves it stale: the table
    source.prepare(refresh=True)
    assert copy.read_sorted(0, 1).ids.tolist() == [2]
    assert source.read_sorted(0, 1).ids.tolist() == [2]
    assert sa is not None


def test_sqlalchemy_sqlite_untyped_id_and_missing_schema_are_refused(
    sqlalchemy_sqlite_engine,
) -> None:
    from adapters.sqlalchemy import SQLAlchemyTable

    name = f"hostile_{uuid.uuid4().hex[:8]}"
    with sqlalchemy_sqlite_engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {name} (id, score INTEGER)")
    with pytest.raises(TypeError, match="column 'id' has no declared type"):
        SQLAlchemyTable(sqlalchemy_sqlite_engine, name)
    with pytest.raises(ValueError, match="schema 'nowhere' does not exist"):
        SQLAlchemyTable(sqlalchemy_sqlite_engine, name, schema="nowhere")


def test_sqlalchemy_mariadb_backticks_and_long_ids(sqlalchemy_mariadb_engine) -> None:
    from adapters.sqlalchemy import SQLAlchemyTable

    engine = sqlalchemy_mariadb_engine
    a, b = f"hostile_{uuid.uuid4().hex[:8]}", f"hostile_{uuid.uuid4().hex[:8]}"
    made = []
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE TABLE {a} (`i``d` INT, `sc``ore` INT)")
            conn.exec_driver_sql(f"INSERT INTO {a} VALUES (1, 3), (2, 5)")
            conn.exec_driver_sql(f"CREATE TABLE {b} (id VARCHAR(2000), score INT)")
            conn.exec_driver_sql(f"INSERT INTO {b} VALUES (REPEAT('x', 700), 9), ('y', 1)")
        source = SQLAlchemyTable(engine, a, id="i`d", score="sc`ore")
        made.append(source)
        source.prepare()
        assert source.read_sorted(0, 2).ids.tolist() == [2, 1]
        long_ids = SQLAlchemyTable(engine, b)  # "Specified key was too long" before
        made.append(long_ids)
        long_ids.prepare()
        assert long_ids.read_sorted(0, 1).ids.tolist() == ["x" * 700]
        with engine.begin() as conn:
            conn.exec_driver_sql(f"UPDATE {b} SET id = REPEAT('z', 1500) WHERE id = 'y'")
        with pytest.raises(ValueError, match="an id of 1500 characters"):  # "Data too long"
            long_ids.prepare(refresh=True)
    finally:
        with engine.begin() as conn:
            for s in made:
                for t in (s.runs_table_name, s.rank_table_name):
                    conn.exec_driver_sql(f"DROP TABLE IF EXISTS `{t}`")
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {a}, {b}")


# ----- from_votes: mismatched item types, an existing output table -----------------------------


def test_duckdb_from_votes_refuses_mismatched_types_and_existing_output() -> None:
    import duckdb

    from adapters.duckdb import DuckDBTable

    con = duckdb.connect()
    con.execute("CREATE TABLE items (id BIGINT); INSERT INTO items VALUES (1), (2)")
    con.execute("CREATE TABLE votes (client INT, item VARCHAR); INSERT INTO votes VALUES (1, '1')")
    with pytest.raises(TypeError, match="item ids must be of one type"):
        DuckDBTable.from_votes(con, "votes", "items")
    con.execute("CREATE TABLE votes2 (client INT, item BIGINT); INSERT INTO votes2 VALUES (1, 1)")
    con.execute("CREATE TABLE votes2_counts (x INT)")
    with pytest.raises(ValueError, match=r"'votes2_counts' .* already exists: pass replace=True"):
        DuckDBTable.from_votes(con, "votes2", "items")
    DuckDBTable.from_votes(con, "votes2", "items", replace=True).prepare()


def test_pg_from_votes_refuses_mismatched_types_and_existing_output(pg_conninfo, pg_table) -> None:
    from psycopg import sql

    from adapters.postgres import PostgresTable

    conn, schema, name, _ = pg_table
    votes = f"{name}_votes"
    conn.execute(
        sql.SQL("CREATE TABLE {} (client int, item text)").format(sql.Identifier(schema, votes))
    )
    with pytest.raises(TypeError, match="item ids must be of one type"):
        PostgresTable.from_votes(pg_conninfo, votes, name, schema=schema)
    conn.execute(
        sql.SQL("ALTER TABLE {} ALTER item TYPE bigint USING item::bigint").format(
            sql.Identifier(schema, votes)
        )
    )
    conn.execute(
        sql.SQL("CREATE TABLE {} (x int)").format(sql.Identifier(schema, votes + "_counts"))
    )
    with pytest.raises(ValueError, match="already exists: pass replace=True"):
        PostgresTable.from_votes(pg_conninfo, votes, name, schema=schema)
    PostgresTable.from_votes(pg_conninfo, votes, name, schema=schema, replace=True).close()


def test_pg_from_votes_refuses_a_text_weight_before_reading(pg_conninfo, pg_table) -> None:
    """A weight column of a text type (numbers in it or not) is refused from the catalog, in
    the project's words, before the votes are read: no raw driver error (DataError, "COALESCE
    types text and integer"), no counts table left."""
    from psycopg import sql

    from adapters.postgres import PostgresTable

    conn, schema, name, _ = pg_table
    votes = f"{name}_votes"
    conn.execute(
        sql.SQL("CREATE TABLE {} (client int, item bigint, w text)").format(
            sql.Identifier(schema, votes)
        )
    )
    conn.execute(
        sql.SQL("INSERT INTO {} VALUES (1, 1, '2'), (2, 3, 'many')").format(
            sql.Identifier(schema, votes)
        )
    )
    with pytest.raises(TypeError, match="column 'w' is text: weights must be of a numeric"):
        PostgresTable.from_votes(pg_conninfo, votes, name, schema=schema, weight="w")
    exists = "SELECT to_regclass(%s) IS NOT NULL"
    assert not conn.execute(exists, [f'"{schema}"."{votes}_counts"']).fetchone()[0]
    # an integer column is a weight like any
    PostgresTable.from_votes(pg_conninfo, votes, name, schema=schema, weight="client").close()
    conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(schema, votes + "_counts")))


def test_sqlalchemy_pg_from_votes_refuses_a_text_weight_before_reading(sa_pg_table) -> None:
    """The same through SQLAlchemy on PostgreSQL: a text weight column (a raw psycopg
    DataError or DatatypeMismatch otherwise) is refused from the catalog, in the words
    PostgresTable uses."""
    import sqlalchemy as sa

    from adapters.sqlalchemy import SQLAlchemyTable

    engine, name, _, _ = sa_pg_table
    votes = f"{name}_votes"
    with engine.begin() as conn:
        conn.exec_driver_sql(f'CREATE TABLE "{votes}" (client text, item bigint, w text)')
        conn.exec_driver_sql(f"INSERT INTO \"{votes}\" VALUES ('a', 1, '2'), ('b', 3, 'x')")
    try:
        for weight in ("w", "client"):
            with pytest.raises(TypeError, match=f"column '{weight}' is text: weights must be"):
                SQLAlchemyTable.from_votes(engine, votes, name, weight=weight)
        with engine.connect() as conn:
            assert not sa.inspect(conn).has_table(f"{votes}_counts")
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP TABLE IF EXISTS "{votes}"')


# ----- DuckDB: rank tables that do not belong ----------------------------------------------------


def _duck_counts(con, scores: list[int], table: str = "c") -> None:
    """(Re)create the counts table `table` (id BIGINT, score BIGINT) with the given scores."""
    con.execute(f"DROP TABLE IF EXISTS {table}")
    con.execute(f"CREATE TABLE {table} (id BIGINT, score BIGINT)")
    con.executemany(f"INSERT INTO {table} VALUES (?, ?)", list(enumerate(scores)))


def test_duckdb_rank_table_of_a_recreated_table_is_not_trusted(tmp_path: Path) -> None:
    """Before: every run below released item 16 from the dropped table's copy."""
    import duckdb

    from adapters.duckdb import DuckDBTable, RankTableMismatchError

    con = duckdb.connect()
    _duck_counts(con, [1000 if i == 16 else i % 17 for i in range(200)])
    source = DuckDBTable(con, "c", frozen=True)
    source.prepare()
    assert private_top_k(source, k=1, epsilon=1e6, seed=1).items == [16]
    _duck_counts(con, [1000 if i == 3 else 0 for i in range(200)])  # same definition, same m
    with pytest.raises(RankTableMismatchError, match="dropped and re-created since"):
        private_top_k(source, k=1, epsilon=1e6, seed=1)
    source.prepare()  # no refresh: not the same table, so rebuilt
    assert private_top_k(source, k=1, epsilon=1e6, seed=1).items == [3]
    # Another object (no proof of identity yet) sees a row count other than the copy's.
    _duck_counts(con, [1000 if i == 5 else 0 for i in range(150)])
    fresh = DuckDBTable(con, "c", frozen=True)
    with pytest.raises(RankTableMismatchError, match="built from 200 rows and the table has 150"):
        private_top_k(fresh, k=1, epsilon=1e6, seed=1)
    assert fresh.is_stale()
    fresh.prepare()
    assert private_top_k(fresh, k=1, epsilon=1e6, seed=1).items == [5]
    con.execute("ALTER TABLE c ALTER score TYPE DOUBLE")  # another definition
    with pytest.raises(RankTableMismatchError, match="definition changed"):
        private_top_k(DuckDBTable(con, "c", frozen=True), k=1, epsilon=1e6, seed=1)


def test_duckdb_prepare_after_reopen_verifies_the_copy(tmp_path: Path) -> None:
    """A file reopened: catalog oids are handed out again (the re-created table gets the old
    one), so prepare() compares the copy with the table. Before: the copy was kept and item 16
    of the dropped table was released."""
    import duckdb

    from adapters.duckdb import DuckDBTable

    path = str(tmp_path / "counts.duckdb")
    with duckdb.connect(path) as con:
        _duck_counts(con, [1000 if i == 16 else i % 17 for i in range(200)])
    source = DuckDBTable(path, "c", frozen=True)
    source.prepare()
    source.close()
    reopened = DuckDBTable(path, "c", frozen=True)  # unchanged: trusted, no prepare() needed
    assert private_top_k(reopened, k=1, epsilon=1e6, seed=1).items == [16]
    reopened.prepare()  # compares, keeps
    reopened.close()
    with duckdb.connect(path) as con:
        _duck_counts(con, [1000 if i == 3 else 0 for i in range(200)])
    again = DuckDBTable(path, "c", frozen=True)
    again.prepare()  # no refresh: the copy differs from the table, so rebuilt
    assert private_top_k(again, k=1, epsilon=1e6, seed=1).items == [3]
    again.close()


def test_duckdb_planted_rank_table_is_refused() -> None:
    import duckdb

    from adapters.duckdb import DuckDBTable, RankTableMismatchError, quote_identifier

    con = duckdb.connect()
    _duck_counts(con, [1000 if i == 16 else i % 17 for i in range(200)])
    source = DuckDBTable(con, "c", frozen=True)
    ranks = quote_identifier(source.rank_table)
    con.execute(
        f"CREATE TABLE {ranks} AS SELECT 0::BIGINT AS rank, 199::BIGINT AS id, 1e9 AS score"
    )
    with pytest.raises(RankTableMismatchError, match="prepare\\(\\) did not build it"):
        source.prepare()
    with pytest.raises(RankTableMismatchError, match="does not belong"):
        private_top_k(source, k=1, epsilon=1.0, seed=1)
    source.prepare(refresh=True)  # asked for: replaced
    assert private_top_k(source, k=1, epsilon=1e6, seed=1).items == [16]
    con.execute(f"COMMENT ON TABLE {ranks} IS 'topk-rank-v1 forged'")
    with pytest.raises(RankTableMismatchError, match="did not build it"):
        private_top_k(DuckDBTable(con, "c", frozen=True), k=1, epsilon=1.0, seed=1)


# ----- SQLAlchemy on PostgreSQL: refresh beside and swap, under a lock and a timeout -------------


@pytest.fixture
def sa_pg_table(sqlalchemy_postgres_engine):
    """A table (id bigint, score bigint) of PG_ITEMS items through SQLAlchemy, item 16 on top;
    dropped afterwards with every table whose name starts with its own or topk_."""
    import sqlalchemy as sa

    engine = sqlalchemy_postgres_engine
    name = f"hostile_{uuid.uuid4().hex[:8]}"
    table = sa.Table(
        name, sa.MetaData(), sa.Column("id", sa.BigInteger), sa.Column("score", sa.BigInteger)
    )
    table.create(engine)
    with engine.begin() as conn:
        conn.execute(
            table.insert(),
            [{"id": i, "score": 1000 if i == 16 else i % 17} for i in range(PG_ITEMS)],
        )
    made: list = []
    yield engine, name, table, made
    with engine.begin() as conn:
        for source in made:
            for t in (source.runs_table_name, source.rank_table_name):
                conn.exec_driver_sql(f'DROP TABLE IF EXISTS "{t}"')
        conn.exec_driver_sql(f'DROP TABLE IF EXISTS "{name}"')


def _sa_source(engine, name, made, frozen=False):
    from adapters.sqlalchemy import SQLAlchemyTable

    source = SQLAlchemyTable(engine, name, frozen=frozen)
    made.append(source)
    return source


def _relation(engine, name: str) -> tuple[int, int]:
    import sqlalchemy as sa

    with engine.connect() as conn:
        return tuple(
            conn.execute(
                sa.text("SELECT pg_relation_size(to_regclass(:n)), to_regclass(:n)::oid"),
                {"n": f'"{name}"'},
            ).one()
        )


def test_sqlalchemy_pg_refresh_swaps_tables_without_dead_rows(sa_pg_table) -> None:
    """Before: DELETE + INSERT, the rank table doubled on disk at each refresh until VACUUM."""
    engine, name, table, made = sa_pg_table
    source = _sa_source(engine, name, made)
    source.prepare()
    size, oid = _relation(engine, source.rank_table_name)
    with engine.begin() as conn:
        conn.execute(table.update().where(table.c.id == 7).values(score=5000))
    for _ in range(3):
        source.prepare(refresh=True)
    size_after, oid_after = _relation(engine, source.rank_table_name)
    assert oid_after != oid and size_after == size
    beside = list(source.copies.names.beside[:2])
    assert all(_relation(engine, t) == (None, None) for t in beside)  # nothing left beside
    assert private_top_k(source, k=1, epsilon=1e6, seed=1).items == [7]
    assert not source.is_stale()


def test_sqlalchemy_pg_refresh_waits_for_a_held_run_then_gives_up(sa_pg_table) -> None:
    engine, name, table, made = sa_pg_table
    # the reader reads the copy as promised (frozen), so the refresh has a run to wait for
    reader, writer = _sa_source(engine, name, made, frozen=True), _sa_source(engine, name, made)
    writer.prepare()
    before = _relation(engine, writer.rank_table_name)
    with engine.begin() as conn:
        conn.execute(table.update().where(table.c.id == 7).values(score=5000))
    with reader.snapshot():
        assert reader.read_sorted(0, 1).ids.tolist() == [16]
        with pytest.raises(TimeoutError, match=r"waited 0\.2 s \(swap_timeout\) for runs"):
            writer.prepare(refresh=True, swap_timeout=0.2)
        assert reader.read_sorted(0, 1).ids.tolist() == [16]
    assert _relation(engine, writer.rank_table_name) == before  # nothing changed, no dead rows
    writer.prepare(refresh=True)
    assert private_top_k(reader, k=1, epsilon=1e6, seed=1).items == [7]


def test_sqlalchemy_pg_concurrent_prepares_wait_for_each_other(sa_pg_table) -> None:
    """Four threads prepare one table at once (two with refresh): they queue on the advisory
    lock. Each thread records its error, if any: none is expected."""
    from concurrent.futures import ThreadPoolExecutor

    engine, name, _, made = sa_pg_table
    sources = [_sa_source(engine, name, made) for _ in range(4)]

    def prepare(i: int) -> str | None:
        try:
            sources[i].prepare(refresh=bool(i % 2))
        except Exception as error:
            return f"{type(error).__name__}: {error}"
        return None

    with ThreadPoolExecutor(4) as pool:
        errors = [e for e in pool.map(prepare, range(4)) if e]
    assert errors == []
    assert private_top_k(sources[0], k=1, epsilon=1e6, seed=1).items == [16]


def test_sqlalchemy_pg_statement_timeout_stops_prepare_clearly(sa_pg_table) -> None:
    import sqlalchemy as sa

    engine, name, _, made = sa_pg_table
    with engine.begin() as conn:
        conn.execute(
            sa.text(f'INSERT INTO "{name}" SELECT g, g % 7 FROM generate_series(1000, 300000) g')
        )
    source = _sa_source(engine, name, made)
    with pytest.raises(TimeoutError, match=r"statement_timeout of 0\.001 s"):
        source.prepare(statement_timeout=0.001)
    # a refused prepare leaves nothing behind: not even an empty rank table
    assert not sa.inspect(engine).has_table(source.rank_table_name, schema=source.namespace)
    source.prepare()
    assert source.domain_size() == PG_ITEMS + 299_001


# ----- SQLAlchemy: rank tables that do not belong (every dialect) --------------------------------

SA_DIALECTS = ["sqlite", "postgres", "mariadb", "duckdb"]


@pytest.fixture(params=SA_DIALECTS)
def sa_counts(request: pytest.FixtureRequest):
    """An engine of each dialect and a function to (re)create a counts table (id BIGINT, score
    BIGINT) under a fresh name; afterwards every table made is dropped, with its rank and runs
    tables and its fingerprint row."""
    import sqlalchemy as sa

    from adapters.sqlalchemy import FINGERPRINTS_TABLE

    engine = request.getfixturevalue(f"sqlalchemy_{request.param}_engine")
    name = f"hostile_{uuid.uuid4().hex[:8]}"
    table = sa.Table(
        name, sa.MetaData(), sa.Column("id", sa.BigInteger), sa.Column("score", sa.BigInteger)
    )

    def create(scores: list[int]) -> None:
        table.drop(engine, checkfirst=True)
        table.create(engine)
        with engine.begin() as conn:
            conn.execute(table.insert(), [{"id": i, "score": s} for i, s in enumerate(scores)])

    made: list = []
    create([1000 if i == 16 else i % 17 for i in range(PG_ITEMS)])
    yield engine, name, create, made
    quote = engine.dialect.identifier_preparer.quote
    with engine.begin() as conn:
        for source in made:
            for t in (source.runs_table_name, source.rank_table_name):
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {quote(t)}")
            if sa.inspect(conn).has_table(FINGERPRINTS_TABLE):
                conn.exec_driver_sql(
                    f"DELETE FROM {quote(FINGERPRINTS_TABLE)} WHERE rank_table = "
                    f"'{source.rank_table_name}'"
                )
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {quote(name)}")


def test_sqlalchemy_rank_table_of_a_recreated_table_is_not_trusted(sa_counts) -> None:
    """Before: the copy of the dropped table was kept by prepare() and released item 16."""
    from adapters.sqlalchemy import RankTableMismatchError, SQLAlchemyTable

    engine, name, create, made = sa_counts
    source = SQLAlchemyTable(engine, name)
    made.append(source)
    source.prepare()
    assert private_top_k(source, k=1, epsilon=1e6, seed=1).items == [16]
    create([1000 if i == 3 else 0 for i in range(PG_ITEMS)])  # same definition, same m
    got = private_top_k(source, k=1, epsilon=1e6, seed=1)  # not the old copy: the new table
    assert got.items == [3] and got.plan["freshness"]["copy"] == "stale"
    if engine.dialect.name in ("postgresql", "mysql", "mariadb"):  # a lasting table identity
        assert got.plan["freshness"]["why"] == "another table"
        frozen = SQLAlchemyTable(engine, name, frozen=True)  # served without proof: refused
        with pytest.raises(RankTableMismatchError, match="earlier table of this name"):
            private_top_k(frozen, k=1, epsilon=1e6, seed=1)
    source.prepare()  # no refresh: rebuilt (identity, or the copy compared with the table)
    assert private_top_k(source, k=1, epsilon=1e6, seed=1).items == [3]
    create([1000 if i == 5 else 0 for i in range(PG_ITEMS)])
    fresh = SQLAlchemyTable(engine, name)  # another object: nothing proven to it yet
    fresh.prepare()
    assert private_top_k(fresh, k=1, epsilon=1e6, seed=1).items == [5]
    fresh.prepare()  # unchanged since: kept (and compared only where identity is not lasting)
    assert private_top_k(fresh, k=1, epsilon=1e6, seed=1).items == [5]


def test_sqlalchemy_planted_rank_table_is_refused(sa_counts) -> None:
    import sqlalchemy as sa

    from adapters.sqlalchemy import RankTableMismatchError, SQLAlchemyTable

    engine, name, _, made = sa_counts
    source = SQLAlchemyTable(engine, name)
    made.append(source)
    meta, big = sa.MetaData(), sa.BigInteger
    ranks = sa.Table(  # by hand, with the right columns
        source.rank_table_name,
        meta,
        sa.Column("rank", big, primary_key=True, autoincrement=False),
        sa.Column("id", big, nullable=False),
        sa.Column("score", big, nullable=False),
    )
    runs = sa.Table(
        source.runs_table_name,
        meta,
        sa.Column("run", big, nullable=False),
        sa.Column("first_rank", big, primary_key=True, autoincrement=False),
        sa.Column("score", big, nullable=False),
    )
    meta.create_all(engine)
    with engine.begin() as conn:
        conn.execute(
            sa.insert(ranks),
            [
                {"rank": 0, "id": 199, "score": 10**9},
                *({"rank": r, "id": r - 1, "score": 0} for r in range(1, PG_ITEMS)),
            ],
        )
        conn.execute(
            sa.insert(runs),
            [{"run": 0, "first_rank": 0, "score": 10**9}, {"run": 1, "first_rank": 1, "score": 0}],
        )
    with pytest.raises(RankTableMismatchError, match="does not belong"):
        private_top_k(source, k=1, epsilon=1.0, seed=1)  # before: released item 199
    with pytest.raises(RankTableMismatchError, match="prepare\\(\\) did not build it"):
        source.prepare()
    source.prepare(refresh=True)  # asked for: replaced
    assert private_top_k(source, k=1, epsilon=1e6, seed=1).items == [16]
    if engine.dialect.name in ("postgresql", "mysql", "mariadb"):
        # A hand-made copy of the rank table under its name keeps the fingerprint row, not
        # the rank table's identity.
        quote = engine.dialect.identifier_preparer.quote
        ranks = quote(source.rank_table_name)
        with engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE TABLE {quote('copy_' + name)} AS SELECT * FROM {ranks}")
            conn.exec_driver_sql(f"DROP TABLE {ranks}")
            conn.exec_driver_sql(f"ALTER TABLE {quote('copy_' + name)} RENAME TO {ranks}")
        got = private_top_k(source, k=1, epsilon=1e6, seed=1)  # the copy is not served
        assert got.items == [16] and got.plan["freshness"]["why"] == "another table"
        with pytest.raises(RankTableMismatchError, match="does not belong"):
            private_top_k(SQLAlchemyTable(engine, name, frozen=True), k=1, epsilon=1.0, seed=1)


# ----- valid edge inputs, released correctly on every store -------------------------------------

EDGE_IDS = ["", " ", "a", "A", "日本", "e\u0301", "'; DROP TABLE x; --", "tab\there", "x" * 100]
EDGE_SCORES = [1e300, 1e299, 7.0, 7.0, 3.0, 1e-300, 5e-324, 0.0, 1e-300]


@pytest.mark.parametrize("store", STORE_NAMES)
def test_valid_edge_inputs_are_served_and_released_exactly(
    request: pytest.FixtureRequest, store: str
) -> None:
    """Huge and tiny (subnormal) scores, empty, blank, unicode, quoted and 100-character ids (the
    longest the SQLAlchemy plugins' VARCHAR(100) holds; longer ones: the store tests above):
    every row comes back exactly (id and score), in the canonical order, and a release is the
    ArraySource one for the same seed. Fails if a store rounds a score, trims or rewrites an
    id, or refuses a valid input."""
    make = request.getfixturevalue(f"make_{store.replace('-', '_')}_source")
    ids = np.asarray(EDGE_IDS, dtype=object)
    scores = np.asarray(EDGE_SCORES)
    source = make(scores, ids)
    reference = reference_for(source, scores, ids)  # positions as the store's
    m = len(EDGE_IDS)
    with source.snapshot():
        got, want = source.read_sorted(0, m), reference.read_sorted(0, m)
        assert got.ids.tolist() == want.ids.tolist()
        assert got.scores.tolist() == want.scores.tolist()
        assert source.read_ids(EDGE_IDS).tolist() == scores.tolist()
    for method in ("threshold", "oneshot_full_read"):  # auto's choice may differ between the two
        # 1e300 and 1e299 are read as the score bound (2^42: a 1024th of the sensitivity 1
        # and, at epsilon 2, of the noise scale) on every store alike: served, the same
        # release as the reference's
        for epsilon in (2.0, 1e-290):
            for seed in range(3):
                got = private_top_k(source, k=4, epsilon=epsilon, method=method, seed=seed)
                want = private_top_k(reference, k=4, epsilon=epsilon, method=method, seed=seed)
                assert got.items == want.items
                assert got.privacy.score_bound == 2.0**42


@pytest.mark.parametrize("epsilon", [True, "1", None, float("nan"), -1.0])
def test_privacy_budget_refuses_non_numbers_and_bad_values(epsilon) -> None:
    """PrivacyBudget(epsilon=True) was accepted (True counted as 1) and PrivacyBudget('1') gave
    a raw TypeError from a comparison."""
    from topk_middleware import PrivacyBudget

    with pytest.raises((TypeError, ValueError), match="budget epsilon must be"):
        PrivacyBudget(epsilon=epsilon)


# ----- a client killed during prepare(): the server stops its work ------------------------------

KILL_SCRIPT = """
import sys
conninfo, schema, name, kind = sys.argv[1:]
if kind == "postgres":
    from adapters.postgres import PostgresTable
    PostgresTable(conninfo, name, schema=schema).prepare()
else:
    import psycopg, sqlalchemy as sa
    from adapters.sqlalchemy import SQLAlchemyTable
    engine = sa.create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(conninfo))
    SQLAlchemyTable(engine, name, schema=schema).prepare(index_source=False)
"""


@pytest.mark.parametrize("kind", ["postgres", "sqlalchemy"])
def test_pg_prepare_of_a_killed_client_stops_on_the_server(pg_conninfo, pg_table, kind) -> None:
    """kill -9 of a process in the middle of prepare(): its server process stops within a few
    seconds (client_connection_check_interval) and nothing is left half-built. Before, it went
    on to the end of its statement (here a 20 s pass over a slow view; 37 s measured on a big
    table) and the next refresh competed with it."""
    import os
    import signal
    import time

    from psycopg import sql

    conn, schema, name, create = pg_table
    create([i % 7 for i in range(20_000)])
    view = f"{name}_slow"
    conn.execute(  # 1 ms a row: every pass over it takes 20 s
        sql.SQL(
            "CREATE VIEW {} AS SELECT id, score FROM {} WHERE length(pg_sleep(0.001)::text) = 0"
        ).format(sql.Identifier(schema, view), sql.Identifier(schema, name))
    )
    app = f"topk_kill_{uuid.uuid4().hex[:8]}"
    conninfo = f"{pg_conninfo} application_name={app}"
    process = subprocess.Popen(
        [sys.executable, "-c", KILL_SCRIPT, conninfo, schema, view, kind],
        cwd=Path(__file__).resolve().parents[2],
    )
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND state = 'active' "
        "AND query NOT LIKE '%%advisory%%'"
    )
    try:
        deadline = time.monotonic() + 60
        while conn.execute(query, [app]).fetchone()[0] == 0:
            assert process.poll() is None and time.monotonic() < deadline, "prepare() not seen"
            time.sleep(0.1)
        time.sleep(1.0)  # well inside the pass over the view
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        killed = time.monotonic()
        gone = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
        while conn.execute(gone, [app]).fetchone()[0] and time.monotonic() - killed < 30:
            time.sleep(0.2)
        assert time.monotonic() - killed < 10  # the check interval is 1 s
    finally:
        if process.poll() is None:
            process.kill()
    left = [
        conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, t))
        ).fetchone()[0]
        for (t,) in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename LIKE %s",
            [schema, f"{view}%"],
        ).fetchall()
    ]
    # Nothing half-built: PostgresTable leaves no table; SQLAlchemyTable its empty rank and
    # runs tables (created, then filled in a transaction of their own).
    assert left == ([] if kind == "postgres" else [0, 0])
