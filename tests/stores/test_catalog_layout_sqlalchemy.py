"""The catalog a SQLAlchemyTable copy leaves on SQLite and MariaDB, pinned: a table prepared by
any version of the code works under any other with no migration (names, shared tables, triggers
and recorded rows are a contract).

For a table with integer ids and one with text ids, the tests spell out every object prepare()
makes: the rank table and its runs table (columns, types, collations, keys), the index on the
copy's ids and the two indexes on the table of counts, the shared tables topk_rank_fingerprints
and topk_write_stamps with the copy's rows, the write counter (SQLite: topk_write_counts) or
write log (MariaDB: topk_write_log) and the copy's three row triggers, with the names derived
as the code derives them (digests of the schema's, table's, columns' and copy's names). The
copy's mark is checked against its formula (a hash of the catalog facts of the table and of
the copy), its stamp against the counter or the triggers' creation times. Then the same layout
is written by hand (no line of the adapters' code), a run that is not frozen reads it as current
and, after one write, as stale; prepare() keeps it, and uninstall() leaves the catalog as it
was before.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from adapters.memory import ArraySource
from adapters.sqlalchemy import SQLAlchemyTable
from tests.stores_sqlalchemy import DEFAULT_MARIADB_URL, require_reachable
from topk_middleware import private_top_k

M = 300
TAG = "topk-rank-v1"


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def digest(*parts: str) -> str:
    return sha1("\x00".join(parts))[:10]


def signed64(text: str) -> int:
    return int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest()[:8], "big", signed=True)


def mark(facts: list[Any]) -> int:
    """The mark of a copy: the tag and the catalog facts of the table and of the copy."""
    return signed64("\x00".join([TAG, *("" if f is None else str(f) for f in facts)]))


def flat(sql: str) -> str:
    """A statement with its identifier quotes dropped and its white space made single."""
    return re.sub(r"\s+", " ", sql.replace('"', "").replace("`", "")).strip()


class Names:
    """The names of one table's copy, as the code derives them."""

    def __init__(self, schema: str, table: str, id: str, score: str) -> None:
        source = digest(schema, table, id, score)
        self.ranks = f"{table}__topk_rank_{source}"
        self.runs = self.ranks + "_runs"
        self.id_index = f"ix_topk_{digest(schema, self.ranks)}_id"
        self.score_id, self.by_id = f"ix_topk_{source}_score_id", f"ix_topk_{source}_id"
        self.trigger = f"topk_{sha1(self.ranks)[:12]}_w"
        self.key = signed64(f"{schema}.{self.ranks}")  # the copy's qualified name


# (table, id type, score type, the copy's id type) per store
TABLES = {
    "sqlite": [
        ("votes", "BIGINT", "BIGINT", "BIGINT"),
        ("words", "VARCHAR(100)", "DOUBLE", 'TEXT COLLATE "BINARY"'),
    ],
    "mariadb": [
        ("votes", "BIGINT", "BIGINT", "BIGINT"),
        (
            "words",
            "VARCHAR(100)",
            "DOUBLE",
            "VARCHAR(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin",
        ),
    ],
}


def rows_of(table: str) -> tuple[list[Any], list[float]]:
    ids: list[Any] = list(range(M)) if table == "votes" else [f"w{i:03d}" for i in range(M)]
    return ids, [float((i * 7) % 101) for i in range(M)]


def canonical(ids: list[Any], scores: list[float]) -> list[tuple[Any, float]]:
    """(id, score) in the canonical order: score descending, ties by id (text in byte order)."""
    key = (lambda i: i.encode()) if isinstance(ids[0], str) else (lambda i: i)
    return sorted(zip(ids, scores, strict=True), key=lambda r: (-r[1], key(r[0])))


# ----- SQLite ----------------------------------------------------------------------------------
def sqlite_catalog(engine: sa.Engine) -> set[tuple[Any, ...]]:
    """Every table (columns), index (columns, order, uniqueness) and trigger (statement) of the
    database, and the rows of the shared tables (marks masked)."""
    out: set[tuple[Any, ...]] = set()
    with engine.connect() as conn:
        master = conn.exec_driver_sql("SELECT type, name, tbl_name, sql FROM sqlite_master").all()
        for kind, name, table, sql in master:
            if kind == "table":
                columns = conn.exec_driver_sql(
                    'SELECT name, upper(type), "notnull", pk FROM pragma_table_info(?)', (name,)
                ).all()
                out.add(("table", name, tuple(tuple(c) for c in columns)))
            elif kind == "index":
                unique = conn.exec_driver_sql(
                    'SELECT "unique" FROM pragma_index_list(?) WHERE name = ?', (table, name)
                ).scalar()
                keys = conn.exec_driver_sql(
                    "SELECT name, desc, coll FROM pragma_index_xinfo(?) WHERE key ORDER BY seqno",
                    (name,),
                ).all()
                out.add(("index", name, table, unique, tuple(tuple(k) for k in keys)))
            elif kind == "trigger":
                out.add(("trigger", name, table, flat(sql)))
        shared = {m[1] for m in master if m[0] == "table"}
        for table in ("topk_rank_fingerprints", "topk_write_stamps", "topk_write_counts"):
            if table in shared:
                for key, value in conn.exec_driver_sql(f"SELECT * FROM {table}"):
                    value = "<mark>" if table == "topk_rank_fingerprints" else value
                    out.add(("row", table, key, value))
    return out


def sqlite_layout(table: str, id_type: str, score_type: str, copy_id: str) -> set[Any]:
    n = Names("main", table, "id", "score")
    copy_id = copy_id.split()[0]  # the collation is SQLite's default, BINARY
    bump = f"UPDATE topk_write_counts SET n = n + 1 WHERE copy_key = {n.key}; END"
    return {
        ("table", n.ranks, (("rank", "BIGINT", 1, 1), ("id", copy_id, 1, 0),
                            ("score", score_type, 1, 0))),
        ("index", f"sqlite_autoindex_{n.ranks}_1", n.ranks, 1, (("rank", 0, "BINARY"),)),
        ("index", n.id_index, n.ranks, 0, (("id", 0, "BINARY"),)),
        ("table", n.runs, (("run", "BIGINT", 1, 0), ("first_rank", "BIGINT", 1, 1),
                           ("score", score_type, 1, 0))),
        ("index", f"sqlite_autoindex_{n.runs}_1", n.runs, 1, (("first_rank", 0, "BINARY"),)),
        ("index", n.score_id, table, 0, (("score", 1, "BINARY"), ("id", 0, "BINARY"))),
        ("index", n.by_id, table, 0, (("id", 0, "BINARY"),)),
        ("table", "topk_rank_fingerprints", (("rank_table", "VARCHAR(255)", 1, 1),
                                             ("mark", "BIGINT", 1, 0))),
        ("index", "sqlite_autoindex_topk_rank_fingerprints_1", "topk_rank_fingerprints", 1,
         (("rank_table", 0, "BINARY"),)),
        ("table", "topk_write_stamps", (("rank_table", "VARCHAR(255)", 1, 1),
                                        ("stamp", "TEXT", 0, 0))),
        ("index", "sqlite_autoindex_topk_write_stamps_1", "topk_write_stamps", 1,
         (("rank_table", 0, "BINARY"),)),
        ("table", "topk_write_counts", (("copy_key", "INTEGER", 0, 1), ("n", "INTEGER", 1, 0))),
        *(
            ("trigger", f"{n.trigger}_{event.lower()[:3]}", table,
             f"CREATE TRIGGER {n.trigger}_{event.lower()[:3]} AFTER {event} ON {table} "
             f"FOR EACH ROW BEGIN {bump}")
            for event in ("INSERT", "UPDATE", "DELETE")
        ),
        ("row", "topk_rank_fingerprints", n.ranks, "<mark>"),
        ("row", "topk_write_stamps", n.ranks, "lite 1"),
        ("row", "topk_write_counts", n.key, 1),
    }  # fmt: skip


def sqlite_facts(conn: sa.Connection, *tables: str) -> list[Any]:
    return [
        conn.exec_driver_sql(
            "SELECT rootpage || ' ' || sql FROM sqlite_master WHERE type = 'table' AND name = ?",
            (t,),
        ).scalar()
        for t in tables
    ]


def sqlite_by_hand(engine: sa.Engine, table: str, score_type: str, copy_id: str) -> None:
    """The copy of `table` in the pinned layout, written without the adapters' code."""
    n = Names("main", table, "id", "score")
    ids, scores = rows_of(table)
    ranked = canonical(ids, scores)
    with engine.begin() as conn:
        run = conn.exec_driver_sql
        run(f"CREATE TABLE {n.ranks} (rank BIGINT NOT NULL, id {copy_id} NOT NULL, "
            f"score {score_type} NOT NULL, PRIMARY KEY (rank))")  # fmt: skip
        run(f"CREATE INDEX {n.id_index} ON {n.ranks} (id)")
        run(f"CREATE TABLE {n.runs} (run BIGINT NOT NULL, first_rank BIGINT NOT NULL, "
            f"score {score_type} NOT NULL, PRIMARY KEY (first_rank))")  # fmt: skip
        run(f"CREATE INDEX {n.score_id} ON {table} (score DESC, id)")
        run(f"CREATE INDEX {n.by_id} ON {table} (id)")
        conn.execute(
            sa.text(f"INSERT INTO {n.ranks} VALUES (:rank, :id, :score)"),
            [{"rank": r, "id": i, "score": s} for r, (i, s) in enumerate(ranked)],
        )
        run(f"INSERT INTO {n.runs} SELECT row_number() OVER (ORDER BY min(rank)) - 1, "
            f"min(rank), score FROM {n.ranks} GROUP BY score")  # fmt: skip
        run("CREATE TABLE topk_rank_fingerprints (rank_table VARCHAR(255) NOT NULL, "
            "mark BIGINT NOT NULL, PRIMARY KEY (rank_table))")  # fmt: skip
        run("CREATE TABLE topk_write_stamps (rank_table VARCHAR(255) NOT NULL PRIMARY KEY, "
            "stamp TEXT)")  # fmt: skip
        run("CREATE TABLE topk_write_counts (copy_key INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
        run(f"INSERT INTO topk_write_counts VALUES ({n.key}, 1)")
        bump = f"UPDATE topk_write_counts SET n = n + 1 WHERE copy_key = {n.key};"
        for event in ("INSERT", "UPDATE", "DELETE"):
            run(f"CREATE TRIGGER {n.trigger}_{event.lower()[:3]} AFTER {event} ON {table} "
                f"FOR EACH ROW BEGIN {bump} END")  # fmt: skip
        facts = sqlite_facts(conn, table, n.ranks)
        run("INSERT INTO topk_rank_fingerprints VALUES (?, ?)", (n.ranks, mark(facts)))
        run("INSERT INTO topk_write_stamps VALUES (?, 'lite 1')", (n.ranks,))


# ----- MariaDB ---------------------------------------------------------------------------------
def mariadb_catalog(engine: sa.Engine) -> set[tuple[Any, ...]]:
    """Every table (comment, columns but the tables of counts'), index column and trigger
    (statement) of the database, and the rows of the shared tables (marks masked, trigger
    times as <t>)."""
    out: set[tuple[Any, ...]] = set()
    here = "TABLE_SCHEMA = database()"
    with engine.connect() as conn:
        run = conn.exec_driver_sql
        tables = run(
            f"SELECT TABLE_NAME, TABLE_COMMENT FROM information_schema.TABLES WHERE {here}"
        )
        names = set()
        for name, comment in tables:
            names.add(name)
            out.add(("table", name, comment))
        for row in run(
            "SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLLATION_NAME, COLUMN_KEY "
            f"FROM information_schema.COLUMNS WHERE {here} AND TABLE_NAME NOT IN {COUNTS}"
        ):
            out.add(("column", *row))
        for row in run(
            "SELECT TABLE_NAME, INDEX_NAME, NON_UNIQUE, SEQ_IN_INDEX, COLUMN_NAME, COLLATION "
            f"FROM information_schema.STATISTICS WHERE {here}"
        ):
            out.add(("index", *row))
        for name, event, table, timing, body in run(
            "SELECT TRIGGER_NAME, EVENT_MANIPULATION, EVENT_OBJECT_TABLE, ACTION_TIMING, "
            "ACTION_STATEMENT FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = database()"
        ):
            out.add(("trigger", name, event, table, timing, flat(body)))
        for table in ("topk_rank_fingerprints", "topk_write_stamps", "topk_write_log"):
            if table in names:
                for row in run(f"SELECT * FROM {table}"):
                    value = row[1:]
                    if table == "topk_rank_fingerprints":
                        value = ("<mark>",)
                    elif table == "topk_write_stamps":
                        value = (re.sub(r"@[0-9: .-]+", "@<t>", row[1]),)
                    out.add(("row", table, row[0], *value))
    return out


def mariadb_layout(
    database: str, table: str, id_type: str, score_type: str, copy_id: str
) -> set[Any]:
    n = Names(database, table, "id", "score")
    text = copy_id.startswith("VARCHAR")
    id_column = (
        ("id", "varchar(100)", "NO", "utf8mb4_nopad_bin", "MUL") if text
        else ("id", "bigint(20)", "NO", None, "MUL")
    )  # fmt: skip
    score = "double" if score_type == "DOUBLE" else "bigint(20)"
    upsert = (
        f"INSERT INTO {database}.topk_write_log (copy_key, conn, n) VALUES ({n.key}, "
        "CONNECTION_ID(), 1) ON DUPLICATE KEY UPDATE n = n + 1"
    )
    stamp = ",".join(f"{n.trigger}_{e}@<t>" for e in ("del", "ins", "upd"))
    return {
        ("table", n.ranks, ""),
        ("column", n.ranks, "rank", "bigint(20)", "NO", None, "PRI"),
        ("column", n.ranks, *id_column),
        ("column", n.ranks, "score", score, "NO", None, ""),
        ("index", n.ranks, "PRIMARY", 0, 1, "rank", "A"),
        ("index", n.ranks, n.id_index, 1, 1, "id", "A"),
        ("table", n.runs, ""),
        ("column", n.runs, "run", "bigint(20)", "NO", None, ""),
        ("column", n.runs, "first_rank", "bigint(20)", "NO", None, "PRI"),
        ("column", n.runs, "score", score, "NO", None, ""),
        ("index", n.runs, "PRIMARY", 0, 1, "first_rank", "A"),
        ("index", table, n.score_id, 1, 1, "score", "D"),
        ("index", table, n.score_id, 1, 2, "id", "A"),
        ("index", table, n.by_id, 1, 1, "id", "A"),
        ("table", "topk_rank_fingerprints", ""),
        ("column", "topk_rank_fingerprints", "rank_table", "varchar(255)", "NO",
         "utf8mb4_general_ci", "PRI"),
        ("column", "topk_rank_fingerprints", "mark", "bigint(20)", "NO", None, ""),
        ("index", "topk_rank_fingerprints", "PRIMARY", 0, 1, "rank_table", "A"),
        ("table", "topk_write_stamps", ""),
        ("column", "topk_write_stamps", "rank_table", "varchar(255)", "NO",
         "utf8mb4_general_ci", "PRI"),
        ("column", "topk_write_stamps", "stamp", "text", "YES", "utf8mb4_general_ci", ""),
        ("index", "topk_write_stamps", "PRIMARY", 0, 1, "rank_table", "A"),
        ("table", "topk_write_log", ""),
        ("column", "topk_write_log", "copy_key", "bigint(20)", "NO", None, "PRI"),
        ("column", "topk_write_log", "conn", "bigint(20)", "NO", None, "PRI"),
        ("column", "topk_write_log", "n", "bigint(20)", "NO", None, ""),
        ("index", "topk_write_log", "PRIMARY", 0, 1, "copy_key", "A"),
        ("index", "topk_write_log", "PRIMARY", 0, 2, "conn", "A"),
        *(
            ("trigger", f"{n.trigger}_{event.lower()[:3]}", event, table, "AFTER", upsert)
            for event in ("INSERT", "UPDATE", "DELETE")
        ),
        ("row", "topk_rank_fingerprints", n.ranks, "<mark>"),
        ("row", "topk_write_stamps", n.ranks, f"my {stamp}"),
    }  # fmt: skip


COUNTS = "('votes', 'words')"  # the tables of counts (their keys change with their indexes)
MY_FACT = (
    "SELECT concat_ws(' ', (SELECT TABLE_ID FROM information_schema.INNODB_SYS_TABLES "
    "WHERE NAME = concat(database(), '/', %(t)s)), (SELECT CREATE_TIME FROM "
    "information_schema.TABLES WHERE TABLE_SCHEMA = database() AND TABLE_NAME = %(t)s))"
)
MY_TRIGGERS = (
    "SELECT GROUP_CONCAT(CONCAT(TRIGGER_NAME, '@', CREATED) ORDER BY TRIGGER_NAME) "
    "FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = database() "
    "AND EVENT_OBJECT_TABLE = %(t)s"
)


def mariadb_by_hand(
    engine: sa.Engine, database: str, table: str, score_type: str, copy_id: str
) -> None:
    """The copy of `table` in the pinned layout, written without the adapters' code."""
    n = Names(database, table, "id", "score")
    ids, scores = rows_of(table)
    ranked = canonical(ids, scores)
    with engine.connect() as conn:
        run = conn.exec_driver_sql
        run(f"CREATE TABLE {n.ranks} (`rank` BIGINT NOT NULL, id {copy_id} NOT NULL, "
            f"score {score_type} NOT NULL, PRIMARY KEY (`rank`))")  # fmt: skip
        run(f"CREATE INDEX {n.id_index} ON {n.ranks} (id)")
        run(f"CREATE TABLE {n.runs} (run BIGINT NOT NULL, first_rank BIGINT NOT NULL, "
            f"score {score_type} NOT NULL, PRIMARY KEY (first_rank))")  # fmt: skip
        run(f"CREATE INDEX {n.score_id} ON {table} (score DESC, id)")
        run(f"CREATE INDEX {n.by_id} ON {table} (id)")
        run("CREATE TABLE topk_rank_fingerprints (rank_table VARCHAR(255) NOT NULL, "
            "mark BIGINT NOT NULL, PRIMARY KEY (rank_table))")  # fmt: skip
        run("CREATE TABLE topk_write_stamps (rank_table VARCHAR(255) NOT NULL PRIMARY KEY, "
            "stamp TEXT)")  # fmt: skip
        run("CREATE TABLE topk_write_log (copy_key BIGINT NOT NULL, conn BIGINT NOT NULL, "
            "n BIGINT NOT NULL, PRIMARY KEY (copy_key, conn)) ENGINE=InnoDB")  # fmt: skip
        upsert = (
            f"INSERT INTO {database}.topk_write_log (copy_key, conn, n) VALUES ({n.key}, "
            "CONNECTION_ID(), 1) ON DUPLICATE KEY UPDATE n = n + 1"
        )
        for event in ("INSERT", "UPDATE", "DELETE"):
            run(f"CREATE TRIGGER {n.trigger}_{event.lower()[:3]} AFTER {event} ON {table} "
                f"FOR EACH ROW {upsert}")  # fmt: skip
        conn.execute(
            sa.text(f"INSERT INTO {n.ranks} VALUES (:rank, :id, :score)"),
            [{"rank": r, "id": i, "score": s} for r, (i, s) in enumerate(ranked)],
        )
        run(f"INSERT INTO {n.runs} SELECT row_number() OVER (ORDER BY min(`rank`)) - 1, "
            f"min(`rank`), score FROM {n.ranks} GROUP BY score")  # fmt: skip
        facts = [run(MY_FACT, {"t": t}).scalar() for t in (table, n.ranks)]
        stamp = "my " + run(MY_TRIGGERS, {"t": table}).scalar()
        run("INSERT INTO topk_rank_fingerprints VALUES (%(r)s, %(m)s)",
            {"r": n.ranks, "m": mark(facts)})  # fmt: skip
        run("INSERT INTO topk_write_stamps VALUES (%(r)s, %(s)s)", {"r": n.ranks, "s": stamp})
        conn.commit()


# ----- the stores ------------------------------------------------------------------------------
@pytest.fixture(params=["sqlite", "mariadb"])
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[tuple[str, sa.Engine, str]]:
    """(store, an engine on an empty database of its own, its schema name)."""
    if request.param == "sqlite":
        engine = sa.create_engine(f"sqlite:///{tmp_path / 'layout.sqlite'}")
        yield "sqlite", engine, "main"
        engine.dispose()
        return
    url = sa.make_url(os.environ.get("TOPK_MARIADB_URL", DEFAULT_MARIADB_URL))
    server = require_reachable(sa.create_engine(url), f"MariaDB at {url!r}", "set TOPK_MARIADB_URL")
    database = f"topk_layout_{uuid.uuid4().hex[:8]}"
    with server.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {database} CHARACTER SET utf8mb4")
    engine = sa.create_engine(url.set(database=database))
    try:
        yield "mariadb", engine, database
    finally:
        engine.dispose()
        with server.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE {database}")
        server.dispose()


def create_counts(engine: sa.Engine, table: str, id_type: str, score_type: str) -> None:
    ids, scores = rows_of(table)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"CREATE TABLE {table} (id {id_type} PRIMARY KEY, score {score_type} NOT NULL)"
        )
        conn.execute(
            sa.text(f"INSERT INTO {table} (id, score) VALUES (:i, :s)"),
            [{"i": i, "s": s} for i, s in zip(ids, scores, strict=True)],
        )


@pytest.mark.parametrize("which", [0, 1], ids=["integer ids", "text ids"])
def test_copy_layout_is_pinned(store: tuple[str, sa.Engine, str], which: int) -> None:
    """prepare() makes exactly the pinned objects, its mark and stamp follow their formulas, and
    uninstall() leaves the database as it was."""
    kind, engine, schema = store
    table, id_type, score_type, copy_id = TABLES[kind][which]
    create_counts(engine, table, id_type, score_type)
    catalog = sqlite_catalog if kind == "sqlite" else mariadb_catalog
    before = catalog(engine)
    source = SQLAlchemyTable(engine, table)
    source.prepare()
    made = catalog(engine) - before
    if kind == "sqlite":
        assert made == sqlite_layout(table, id_type, score_type, copy_id)
    else:
        assert made == mariadb_layout(schema, table, id_type, score_type, copy_id)
    n = Names(schema, table, "id", "score")
    with engine.connect() as conn:
        stored = conn.execute(
            sa.text("SELECT mark FROM topk_rank_fingerprints WHERE rank_table = :r"),
            {"r": n.ranks},
        ).scalar()
        if kind == "sqlite":
            facts = sqlite_facts(conn, table, n.ranks)
        else:
            facts = [conn.exec_driver_sql(MY_FACT, {"t": t}).scalar() for t in (table, n.ranks)]
            stamp = conn.execute(
                sa.text("SELECT stamp FROM topk_write_stamps WHERE rank_table = :r"),
                {"r": n.ranks},
            ).scalar()
            assert stamp == "my " + conn.exec_driver_sql(MY_TRIGGERS, {"t": table}).scalar()
    assert stored == mark(facts)
    assert private_top_k(source, k=3, epsilon=1.0, seed=1).plan["freshness"]["copy"] == "current"
    source.uninstall()
    assert catalog(engine) == before


@pytest.mark.parametrize("which", [0, 1], ids=["integer ids", "text ids"])
def test_a_copy_written_by_hand_in_the_layout_is_read_as_current(
    store: tuple[str, sa.Engine, str], which: int
) -> None:
    """The pinned layout written without the adapters' code: read as current by a run that is
    not frozen (the same release as ArraySource's), as stale after a write, kept by prepare();
    uninstall() removes every object of it."""
    kind, engine, schema = store
    table, id_type, score_type, copy_id = TABLES[kind][which]
    create_counts(engine, table, id_type, score_type)
    catalog = sqlite_catalog if kind == "sqlite" else mariadb_catalog
    before = catalog(engine)
    if kind == "sqlite":
        sqlite_by_hand(engine, table, score_type, copy_id)
        layout = sqlite_layout(table, id_type, score_type, copy_id)
    else:
        mariadb_by_hand(engine, schema, table, score_type, copy_id)
        layout = mariadb_layout(schema, table, id_type, score_type, copy_id)
    assert catalog(engine) - before == layout
    source = SQLAlchemyTable(engine, table)
    ids, scores = rows_of(table)
    got = private_top_k(source, k=3, epsilon=1.0, seed=1, method="threshold")
    assert got.plan["freshness"]["copy"] == "current", got.plan["freshness"]
    reference = ArraySource(np.array(scores, dtype=np.int64 if which == 0 else np.float64), ids)
    assert got.items == private_top_k(reference, k=3, epsilon=1.0, seed=1, method="threshold").items
    source.prepare()  # kept: nothing to rebuild
    assert catalog(engine) - before == layout
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {table} SET score = 1000 WHERE id = :i"), {"i": ids[5]})
    got = private_top_k(source, k=1, epsilon=1e6, seed=1)
    assert got.plan["freshness"]["copy"] == "stale" and got.items == [ids[5]]
    source.uninstall()
    assert catalog(engine) == before
