"""The catalog SQLAlchemyTable.from_votes leaves on SQLite and PostgreSQL, pinned: a copy of
counted votes prepared by any version of the code works under any other with no migration.

For counts of one vote per client (integer item ids) and of clipped weights (text item ids,
max_per_item=2), the tests spell out what prepare() makes: the copy named after the votes and
items tables with a digest of their names, columns and (where they are not one vote per client
and item) the weight and the record of the bounds; its runs table and the index on its ids;
the copy's columns and their types; the record of the bounds (PostgreSQL: the copy's comment;
SQLite: a comment inside its CREATE TABLE statement); the copy's row of topk_rank_fingerprints,
whose mark is a hash of the catalog facts of the votes table, the items table and the copy.
Nothing is put on the votes or items tables. Then the same layout is written by hand (no line of
the adapters' code): a run reads it as current (compared with the counts), after a vote is
written the run has the copy rebuilt first and reads the new counts, and uninstall() leaves the
catalog as it was before.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from adapters.sqlalchemy import SQLAlchemyTable

TAG = "topk-rank-v1"
RECORD = (
    "topk_middleware from_votes: sensitivity={:.1f} max_items_per_client=none (each client's "
    "contribution to one count clipped at the sensitivity)"
)


def digest(*parts: str) -> str:
    return hashlib.sha1("\x00".join(parts).encode("utf-8")).hexdigest()[:10]


def mark(facts: list[Any]) -> int:
    text = "\x00".join([TAG, *("" if f is None else str(f) for f in facts)])
    return int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest()[:8], "big", signed=True)


# (weighted?, text ids?) per case: one vote per client, and weights clipped at 2
CASES = {"votes": (False, False), "weights": (True, True)}


class Names:
    """The names of one from_votes copy, as the code derives them (no schema given)."""

    def __init__(self, votes: str, items: str, weighted: bool) -> None:
        bounds = ("w", RECORD.format(2.0)) if weighted else ()
        key = digest("", votes, items, "client", "item", "id", *bounds)
        self.ranks = f"{votes}__{items}__topk_votes_{key}"
        self.runs = self.ranks + "_runs"
        self.id_index = f"ix_topk_{digest('', self.ranks)}_id"
        self.record = RECORD.format(2.0 if weighted else 1.0)


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest) -> sa.Engine:
    return request.getfixturevalue(f"sqlalchemy_{request.param}_engine")


@pytest.fixture(params=sorted(CASES))
def tables(engine: sa.Engine, request: pytest.FixtureRequest) -> Iterator[tuple[str, str, str]]:
    """(case, votes, items): the items 0..5 and votes for some of them."""
    tag = uuid.uuid4().hex[:8]
    votes, items = f"pv_{tag}", f"pi_{tag}"
    text = CASES[request.param][1]
    id_type = "VARCHAR(20)" if text else "BIGINT"
    weight = "DOUBLE PRECISION" if engine.dialect.name == "postgresql" else "DOUBLE"
    ids = [f"i{i}" if text else i for i in range(6)]
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {items} (id {id_type})")
        conn.exec_driver_sql(f"CREATE TABLE {votes} (client BIGINT, item {id_type}, w {weight})")
        conn.execute(sa.text(f"INSERT INTO {items} VALUES (:i)"), [{"i": i} for i in ids])
        rows = [(1, ids[0], 1.5), (2, ids[0], 3.0), (1, ids[2], 0.5), (3, ids[2], 1.0)]
        conn.execute(
            sa.text(f"INSERT INTO {votes} VALUES (:c, :i, :w)"),
            [{"c": c, "i": i, "w": w} for c, i, w in rows],
        )
    yield request.param, votes, items
    with engine.begin() as conn:
        for name in (votes, items):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")


def expected_counts(case: str) -> dict[Any, float]:
    weighted, text = CASES[case]
    ids = [f"i{i}" if text else i for i in range(6)]
    scores = [1.5 + 2.0, 0, 0.5 + 1.0] if weighted else [2, 0, 2]
    return {ids[i]: float(scores[i]) if i < 3 else 0.0 for i in range(6)}


def make(engine: sa.Engine, case: str, votes: str, items: str) -> Any:
    options = {"weight": "w", "max_per_item": 2} if CASES[case][0] else {}
    return SQLAlchemyTable.from_votes(engine, votes, items, **options)


def catalog(engine: sa.Engine, names: Names) -> set[tuple[Any, ...]]:
    """The copy's tables (columns, types), indexes, record and fingerprint row; the tables and
    indexes on the votes and items tables."""
    out: set[tuple[Any, ...]] = set()
    with engine.connect() as conn:
        run = conn.exec_driver_sql
        if engine.dialect.name == "sqlite":
            for kind, name, table, sql in run(
                "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE tbl_name LIKE ?",
                (names.ranks + "%",),
            ):
                out.add((kind, name, table))
                if kind == "table":
                    columns = run(
                        'SELECT name, upper(type), "notnull", pk FROM pragma_table_info(?)',
                        (name,),
                    ).all()
                    out.add(("columns", name, tuple(tuple(c) for c in columns)))
                    out.add(("record", name, f"/* {names.record} */" in sql))
        else:
            for name, kind, comment in run(
                "SELECT c.relname, c.relkind, obj_description(c.oid, 'pg_class') FROM pg_class c "
                "WHERE c.relnamespace = current_schema()::regnamespace AND c.relname LIKE %(p)s",
                {"p": names.ranks.replace("_", r"\_") + "%"},
            ):
                out.add((kind, name, comment))
            for table, column, type_, collation in run(
                "SELECT table_name, column_name, data_type, collation_name FROM "
                "information_schema.columns WHERE table_schema = current_schema() "
                "AND table_name LIKE %(p)s",
                {"p": names.ranks.replace("_", r"\_") + "%"},
            ):
                out.add(("column", table, column, type_, collation))
        if sa.inspect(conn).has_table("topk_rank_fingerprints"):
            for name in conn.execute(
                sa.text("SELECT rank_table FROM topk_rank_fingerprints WHERE rank_table = :n"),
                {"n": names.ranks},
            ).scalars():
                out.add(("row", "topk_rank_fingerprints", name))
    return out


def layout(engine: sa.Engine, case: str, names: Names) -> set[tuple[Any, ...]]:
    weighted, text = CASES[case]
    r, u = names.ranks, names.runs
    if engine.dialect.name == "sqlite":
        score = "DOUBLE" if weighted else "BIGINT"
        id_type = "TEXT" if text else "BIGINT"
        return {
            ("table", r, r),
            ("columns", r, (("rank", "BIGINT", 1, 1), ("id", id_type, 1, 0),
                            ("score", score, 1, 0))),
            ("record", r, True),
            ("index", f"sqlite_autoindex_{r}_1", r),
            ("index", names.id_index, r),
            ("table", u, u),
            ("columns", u, (("run", "BIGINT", 1, 0), ("first_rank", "BIGINT", 1, 1),
                            ("score", score, 1, 0))),
            ("record", u, False),
            ("index", f"sqlite_autoindex_{u}_1", u),
            ("row", "topk_rank_fingerprints", r),
        }  # fmt: skip
    score = "double precision" if weighted else "bigint"
    id_column = ("text", "C") if text else ("bigint", None)
    return {
        ("r", r, names.record),
        ("i", f"{r}_pkey", None),
        ("r", u, None),
        ("i", f"{u}_pkey", None),
        ("column", r, "rank", "bigint", None),
        ("column", r, "id", *id_column),
        ("column", r, "score", score, None),
        ("column", u, "run", "bigint", None),
        ("column", u, "first_rank", "bigint", None),
        ("column", u, "score", score, None),
        ("row", "topk_rank_fingerprints", r),
    }


def facts(conn: sa.Connection, *tables: str) -> list[Any]:
    """The catalog facts a copy's mark is a hash of: SQLite, each table's root page and CREATE
    statement; PostgreSQL, each table's oid."""
    if conn.dialect.name == "sqlite":
        sql = "SELECT rootpage || ' ' || sql FROM sqlite_master WHERE type = 'table' AND name = :t"
    else:
        sql = "SELECT to_regclass(:t)::oid::text"
    return [conn.execute(sa.text(sql), {"t": t}).scalar() for t in tables]


def index_names(engine: sa.Engine, *tables: str) -> set[str]:
    inspector = sa.inspect(engine)
    return {ix["name"] for t in tables for ix in inspector.get_indexes(t)}


def test_prepare_makes_the_pinned_copy(engine: sa.Engine, tables: tuple[str, str, str]) -> None:
    case, votes, items = tables
    names = Names(votes, items, CASES[case][0])
    source = make(engine, case, votes, items)
    assert (source.rank_table_name, source.runs_table_name) == (names.ranks, names.runs)
    source.prepare()
    try:
        assert catalog(engine, names) == layout(engine, case, names)
        assert index_names(engine, votes, items) == set()  # nothing on the tables of votes
        with engine.connect() as conn:
            stored = conn.execute(
                sa.text("SELECT mark FROM topk_rank_fingerprints WHERE rank_table = :n"),
                {"n": names.ranks},
            ).scalar()
            assert stored == mark(facts(conn, votes, items, names.ranks))
        with source.snapshot():
            rows = source.read_sorted(0, source.domain_size())
            assert source.run_freshness()["copy"] == "current"
        assert dict(zip(rows.ids.tolist(), rows.scores.tolist(), strict=True)) == (
            expected_counts(case)
        )
    finally:
        source.uninstall()
    assert catalog(engine, names) == set()


def by_hand(engine: sa.Engine, case: str, votes: str, items: str, names: Names) -> None:
    """The copy of the counted votes in the pinned layout, written without the adapters' code."""
    weighted, text = CASES[case]
    sqlite = engine.dialect.name == "sqlite"
    score = "DOUBLE" if sqlite and weighted else "DOUBLE PRECISION" if weighted else "BIGINT"
    id_type = ("TEXT" if sqlite else 'TEXT COLLATE "C"') if text else "BIGINT"
    comment = f"/* {names.record} */" if sqlite else ""
    counts = expected_counts(case)
    key = (lambda i: i.encode()) if text else (lambda i: i)
    ranked = sorted(counts.items(), key=lambda r: (-r[1], key(r[0])))
    cast = float if weighted else int
    with engine.begin() as conn:
        run = conn.exec_driver_sql
        run(f"CREATE TABLE {names.ranks} ( {comment}rank BIGINT NOT NULL, id {id_type} NOT NULL, "
            f"score {score} NOT NULL, PRIMARY KEY (rank))")  # fmt: skip
        if not sqlite:
            literal = names.record.replace("'", "''")
            run(f"COMMENT ON TABLE {names.ranks} IS '{literal}'")
        run(f"CREATE INDEX {names.id_index} ON {names.ranks} (id)")
        run(f"CREATE TABLE {names.runs} (run BIGINT NOT NULL, first_rank BIGINT NOT NULL, "
            f"score {score} NOT NULL, PRIMARY KEY (first_rank))")  # fmt: skip
        conn.execute(
            sa.text(f"INSERT INTO {names.ranks} VALUES (:r, :i, :s)"),
            [{"r": r, "i": i, "s": cast(s)} for r, (i, s) in enumerate(ranked)],
        )
        run(f"INSERT INTO {names.runs} SELECT row_number() OVER (ORDER BY min(rank)) - 1, "
            f"min(rank), score FROM {names.ranks} GROUP BY score")  # fmt: skip
        run("CREATE TABLE IF NOT EXISTS topk_rank_fingerprints (rank_table VARCHAR(255) NOT "
            "NULL, mark BIGINT NOT NULL, PRIMARY KEY (rank_table))")  # fmt: skip
        conn.execute(
            sa.text("INSERT INTO topk_rank_fingerprints VALUES (:n, :m)"),
            {"n": names.ranks, "m": mark(facts(conn, votes, items, names.ranks))},
        )


def test_a_copy_written_by_hand_is_read_then_refreshed_after_a_vote(
    engine: sa.Engine, tables: tuple[str, str, str]
) -> None:
    case, votes, items = tables
    names = Names(votes, items, CASES[case][0])
    by_hand(engine, case, votes, items, names)
    before = catalog(engine, names)
    source = make(engine, case, votes, items)
    try:
        source.prepare()  # kept: it is this definition's copy, and current
        assert catalog(engine, names) == before == layout(engine, case, names)
        with source.snapshot():
            assert source.run_freshness() == {
                "refreshes": 0, "copy": "current", "proof": "compared"
            }  # fmt: skip
            rows = source.read_sorted(0, source.domain_size())
        assert dict(zip(rows.ids.tolist(), rows.scores.tolist(), strict=True)) == (
            expected_counts(case)
        )
        item = "i5" if CASES[case][1] else 5
        with engine.begin() as conn:
            conn.execute(sa.text(f"INSERT INTO {votes} VALUES (9, :i, 1.0)"), {"i": item})
        with source.snapshot():
            assert source.run_freshness()["refreshes"] == 1
            assert source.read_ids([item]).tolist() == [1.0]
        with source.snapshot():
            assert source.run_freshness()["refreshes"] == 0
    finally:
        source.uninstall()
    assert catalog(engine, names) == set()
