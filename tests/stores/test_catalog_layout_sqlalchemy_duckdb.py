"""The catalog a SQLAlchemyTable copy leaves on DuckDB (duckdb-engine), pinned: a table prepared
by any version of the code works under any other with no migration (names, types, keys, the
shared fingerprints table and its rows are a contract).

For a table with integer ids, one with text ids and one with INTEGER ids and DECIMAL scores,
the tests spell out every object prepare() makes: the rank table and its runs table (columns,
types, nullability, primary keys), the index on the copy's ids, and the shared table
topk_rank_fingerprints with the copy's row, the names derived as the code derives them (digests
of the schema's, table's, columns' and copy's names, the schema made explicit: `main`). DuckDB
has no triggers: nothing records writes, and no index is put on the table of counts. The copy's
mark is checked against its formula (a hash of the CREATE statements of the table and of the
copy, as duckdb_tables() holds them). Then the same layout is written by hand (no line of the
adapters' code): a run that is not frozen reads it as current (the copy compared with the
table) and, after one write, as stale; prepare() keeps it, and uninstall() leaves the catalog as
it was before.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from adapters.memory import ArraySource
from adapters.sqlalchemy import SQLAlchemyTable
from tests.stores.test_catalog_layout_sqlalchemy import Names, canonical, mark, rows_of
from topk_middleware import private_top_k

pytest.importorskip("duckdb_engine")

# (table, id type, score type, the copy's id type, the copy's score type)
TABLES = [
    ("votes", "BIGINT", "BIGINT", "BIGINT", "BIGINT"),
    ("words", "VARCHAR(100)", "DOUBLE", "VARCHAR", "DOUBLE"),
    ("counts", "INTEGER", "DECIMAL(18,3)", "INTEGER", "DECIMAL(18,3)"),
]
FACT = (
    "SELECT sql FROM duckdb_tables() WHERE database_name = current_database() "
    "AND schema_name = 'main' AND table_name = ?"
)


@pytest.fixture
def engine(tmp_path: Any) -> Iterator[sa.Engine]:
    """An engine on an empty DuckDB database file of its own."""
    engine = sa.create_engine(f"duckdb:///{tmp_path / 'layout.duckdb'}")
    yield engine
    engine.dispose()


def catalog(engine: sa.Engine) -> set[tuple[Any, ...]]:
    """Every table, column (but the tables of counts'), index and key of the database, and the
    rows of topk_rank_fingerprints (marks masked)."""
    out: set[tuple[Any, ...]] = set()
    counts = tuple(t[0] for t in TABLES)
    with engine.connect() as conn:
        run = conn.exec_driver_sql
        names = set()
        for schema, name in run("SELECT schema_name, table_name FROM duckdb_tables()"):
            names.add(name)
            out.add(("table", schema, name))
        for table, column, kind, nullable in run(
            "SELECT table_name, column_name, data_type, is_nullable FROM duckdb_columns()"
        ):
            if table not in counts:
                out.add(("column", table, column, kind, nullable))
        for table, name, unique, expressions in run(
            "SELECT table_name, index_name, is_unique, expressions FROM duckdb_indexes()"
        ):
            out.add(("index", table, name, unique, str(expressions)))
        for table, kind, columns in run(
            "SELECT table_name, constraint_type, constraint_column_names FROM "
            "duckdb_constraints() WHERE constraint_type IN ('PRIMARY KEY', 'UNIQUE')"
        ):
            if table not in counts:
                out.add(("key", table, kind, tuple(columns)))
        if "topk_rank_fingerprints" in names:
            for name, _ in run("SELECT rank_table, mark FROM topk_rank_fingerprints"):
                out.add(("row", "topk_rank_fingerprints", name, "<mark>"))
    return out


def layout(table: str, id_type: str, score_type: str) -> set[Any]:
    n = Names("main", table, "id", "score")
    return {
        ("table", "main", n.ranks),
        ("column", n.ranks, "rank", "BIGINT", False),
        ("column", n.ranks, "id", id_type, False),
        ("column", n.ranks, "score", score_type, False),
        ("key", n.ranks, "PRIMARY KEY", ("rank",)),
        ("index", n.ranks, n.id_index, False, "[id]"),
        ("table", "main", n.runs),
        ("column", n.runs, "run", "BIGINT", False),
        ("column", n.runs, "first_rank", "BIGINT", False),
        ("column", n.runs, "score", score_type, False),
        ("key", n.runs, "PRIMARY KEY", ("first_rank",)),
        ("table", "main", "topk_rank_fingerprints"),
        ("column", "topk_rank_fingerprints", "rank_table", "VARCHAR", False),
        ("column", "topk_rank_fingerprints", "mark", "BIGINT", False),
        ("key", "topk_rank_fingerprints", "PRIMARY KEY", ("rank_table",)),
        ("row", "topk_rank_fingerprints", n.ranks, "<mark>"),
    }


def create_counts(engine: sa.Engine, table: str, id_type: str, score_type: str) -> None:
    ids, scores = rows_of("words" if id_type.startswith("VARCHAR") else "votes")
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"CREATE TABLE {table} (id {id_type} PRIMARY KEY, score {score_type} NOT NULL)"
        )
        conn.execute(
            sa.text(f"INSERT INTO {table} (id, score) VALUES (:i, :s)"),
            [{"i": i, "s": s} for i, s in zip(ids, scores, strict=True)],
        )


def facts(engine: sa.Engine, *tables: str) -> list[Any]:
    with engine.connect() as conn:
        return [conn.exec_driver_sql(FACT, (t,)).scalar() for t in tables]


@pytest.mark.parametrize("which", [0, 1, 2], ids=["integer ids", "text ids", "decimal scores"])
def test_copy_layout_is_pinned(engine: sa.Engine, which: int) -> None:
    """prepare() makes exactly the pinned objects, its mark follows its formula, and
    uninstall() leaves the database as it was."""
    table, id_type, score_type, copy_id, copy_score = TABLES[which]
    create_counts(engine, table, id_type, score_type)
    before = catalog(engine)
    source = SQLAlchemyTable(engine, table)
    source.prepare()
    assert catalog(engine) - before == layout(table, copy_id, copy_score)
    n = Names("main", table, "id", "score")
    with engine.connect() as conn:
        stored = conn.execute(
            sa.text("SELECT mark FROM topk_rank_fingerprints WHERE rank_table = :r"),
            {"r": n.ranks},
        ).scalar()
        ranked = conn.exec_driver_sql(f"SELECT rank, id, score FROM {n.ranks} ORDER BY rank").all()
    assert stored == mark(facts(engine, table, n.ranks))
    ids, scores = rows_of("words" if id_type.startswith("VARCHAR") else "votes")
    assert [(i, float(s)) for _, i, s in ranked] == canonical(ids, scores)
    assert [r for r, _, _ in ranked] == list(range(len(ids)))
    got = private_top_k(source, k=3, epsilon=1.0, seed=1)
    assert got.plan["freshness"]["copy"] == "current", got.plan["freshness"]
    source.uninstall()
    assert catalog(engine) == before


def by_hand(engine: sa.Engine, table: str, copy_id: str, copy_score: str) -> None:
    """The copy of `table` in the pinned layout, written without the adapters' code."""
    n = Names("main", table, "id", "score")
    ids, scores = rows_of("words" if copy_id == "VARCHAR" else "votes")
    ranked = canonical(ids, scores)
    with engine.begin() as conn:
        run = conn.exec_driver_sql
        run(f"CREATE TABLE {n.ranks} (rank BIGINT NOT NULL, id {copy_id} NOT NULL, "
            f"score {copy_score} NOT NULL, PRIMARY KEY (rank))")  # fmt: skip
        run(f"CREATE INDEX {n.id_index} ON {n.ranks} (id)")
        run(f"CREATE TABLE {n.runs} (run BIGINT NOT NULL, first_rank BIGINT NOT NULL, "
            f"score {copy_score} NOT NULL, PRIMARY KEY (first_rank))")  # fmt: skip
        conn.execute(
            sa.text(f"INSERT INTO {n.ranks} VALUES (:rank, :id, :score)"),
            [{"rank": r, "id": i, "score": s} for r, (i, s) in enumerate(ranked)],
        )
        run(f"INSERT INTO {n.runs} SELECT row_number() OVER (ORDER BY min(rank)) - 1, "
            f"min(rank), score FROM {n.ranks} GROUP BY score")  # fmt: skip
        run("CREATE TABLE topk_rank_fingerprints (rank_table VARCHAR NOT NULL, "
            "mark BIGINT NOT NULL, PRIMARY KEY (rank_table))")  # fmt: skip
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO topk_rank_fingerprints VALUES (?, ?)",
            (n.ranks, mark(facts(engine, table, n.ranks))),
        )


@pytest.mark.parametrize("which", [0, 1, 2], ids=["integer ids", "text ids", "decimal scores"])
def test_a_copy_written_by_hand_in_the_layout_is_read_as_current(
    engine: sa.Engine, which: int
) -> None:
    """The pinned layout written without the adapters' code: read as current by a run that is
    not frozen (the same release as ArraySource's), as stale after a write, kept by prepare();
    read by a frozen run; uninstall() removes every object of it."""
    table, id_type, score_type, copy_id, copy_score = TABLES[which]
    create_counts(engine, table, id_type, score_type)
    before = catalog(engine)
    by_hand(engine, table, copy_id, copy_score)
    assert catalog(engine) - before == layout(table, copy_id, copy_score)
    source = SQLAlchemyTable(engine, table)
    ids, scores = rows_of("words" if copy_id == "VARCHAR" else "votes")
    got = private_top_k(source, k=3, epsilon=1.0, seed=1, method="threshold")
    assert got.plan["freshness"]["copy"] == "current", got.plan["freshness"]
    dtype = np.int64 if which == 0 else np.float64
    reference = ArraySource(np.array(scores, dtype=dtype), ids)
    want = private_top_k(reference, k=3, epsilon=1.0, seed=1, method="threshold").items
    assert got.items == want
    frozen = SQLAlchemyTable(engine, table, frozen=True)
    got = private_top_k(frozen, k=3, epsilon=1.0, seed=1, method="threshold")
    assert got.plan["freshness"]["copy"] == "frozen" and got.items == want
    source.prepare()  # kept: nothing to rebuild
    assert catalog(engine) - before == layout(table, copy_id, copy_score)
    with engine.begin() as conn:
        conn.execute(
            sa.text(f"UPDATE {table} SET score = :s WHERE id = :i"),
            {"s": Decimal(1000) if which == 2 else 1000, "i": ids[5]},
        )
    got = private_top_k(source, k=1, epsilon=1e6, seed=1)
    assert got.plan["freshness"]["copy"] == "stale" and got.items == [ids[5]]
    source.uninstall()
    assert catalog(engine) == before
