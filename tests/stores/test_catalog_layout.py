"""The catalog a PostgreSQL copy leaves, pinned: a table prepared by any version of the code
works under any other with no migration (the names, comments and shared tables are a contract).

For PostgresTable (copy mode) and SQLAlchemyTable on PostgreSQL (copy mode) the tests spell out
every object prepare() makes in the table's schema: relations and their columns, constraints,
indexes, triggers (name, table, state, function, argument), functions, sequences and the copy's
record (its comment's lines, or its rows in the shared fingerprint and stamp tables), with the
names derived as the code derives them (digests of the table's and copy's names). Then a run
reads the copy as current (the write log proves it), and uninstall() leaves the schema as it
was. Digits and digests in recorded text are masked (oids, snapshots, md5s change per run).
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from adapters.postgres import PostgresTable
from tests.stores_postgres import DEFAULT_PG_DSN
from topk_middleware import private_top_k

PG_DSN = os.environ.get("TOPK_PG_DSN", DEFAULT_PG_DSN)


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def copy_key(name: str) -> str:
    """The write log's key of a copy: a signed 64-bit hash of its qualified, quoted name."""
    return str(int.from_bytes(hashlib.sha1(name.encode()).digest()[:8], "big", signed=True))


def masked(text: str | None) -> str | None:
    if text is None:
        return None
    text = re.sub(r"\b[0-9a-f]{32}\b", "<md5>", text)
    text = re.sub(r"(topk-writes-v2 )\d+:\d+:[\d,]*", r"\1<snapshot>", text)
    return re.sub(r"\b\d+\b", "<n>", text)


def catalog(conn: psycopg.Connection[Any], schema: str) -> set[tuple[Any, ...]]:
    """Every object of `schema` but the user's table `votes` and its primary key."""
    rows: set[tuple[Any, ...]] = set()
    where = "n.nspname = %s AND c.relname NOT IN ('votes', 'votes_pkey')"
    for name, kind, comment in conn.execute(
        "SELECT c.relname, c.relkind, obj_description(c.oid, 'pg_class') FROM pg_class c "
        f"JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {where}",
        [schema],
    ):
        rows.add(("relation", name, kind))
        if comment is not None:
            rows.add(("comment", name, masked(comment)))
    for table, column, type_, notnull, collation in conn.execute(
        "SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
        "co.collname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace LEFT JOIN pg_collation co "
        f"ON co.oid = a.attcollation AND a.attcollation <> 100 WHERE {where} "
        "AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped",
        [schema],
    ):
        rows.add(("column", table, column, type_, notnull, collation))
    for index, table, definition in conn.execute(
        "SELECT i.relname, c.relname, pg_get_indexdef(i.oid) FROM pg_index x "
        "JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class c ON c.oid = x.indrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
        "AND i.relname <> 'votes_pkey'",
        [schema],
    ):
        rows.add(
            (
                "index",
                index,
                table,
                definition.replace(f'"{schema}".', "").replace(schema + ".", ""),
            )
        )
    for name, table, kind, definition in conn.execute(
        "SELECT co.conname, c.relname, co.contype, pg_get_constraintdef(co.oid) "
        "FROM pg_constraint co JOIN pg_class c ON c.oid = co.conrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
        "AND co.conname <> 'votes_pkey'",
        [schema],
    ):
        rows.add(("constraint", name, table, kind, definition))
    for name, table, enabled, function, args in conn.execute(
        "SELECT t.tgname, c.relname, t.tgenabled, p.proname, encode(t.tgargs, 'escape') "
        "FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_proc p "
        "ON p.oid = t.tgfoid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND NOT t.tgisinternal",
        [schema],
    ):
        rows.add(("trigger", name, table, enabled, function, args))
    for name, definer in conn.execute(
        "SELECT p.proname, p.prosecdef FROM pg_proc p JOIN pg_namespace n "
        "ON n.oid = p.pronamespace WHERE n.nspname = %s",
        [schema],
    ):
        rows.add(("function", name, definer))
    return rows


@pytest.fixture
def schema() -> Iterator[tuple[psycopg.Connection[Any], str]]:
    """A fresh schema with votes (id bigint PRIMARY KEY, score bigint NOT NULL) of 300 rows."""
    name = f"topk_layout_{uuid.uuid4().hex[:8]}"
    conn = psycopg.connect(PG_DSN, autocommit=True)
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    conn.execute(
        sql.SQL("CREATE TABLE {}.votes (id bigint PRIMARY KEY, score bigint NOT NULL)").format(
            sql.Identifier(name)
        )
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.votes SELECT g, (g * 7) % 101 FROM generate_series(0, 299) g"
        ).format(sql.Identifier(name))
    )
    yield conn, name
    conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))
    conn.close()


def _change_log(prefix: str) -> set[tuple[Any, ...]]:
    """The PostgreSQL change log of a copy of votes(id bigint, score bigint), its objects
    named `prefix`_... (adapters/dialects/postgres/changes.py), spelled out."""
    changes = f"{prefix}_changes"
    return {
        ("relation", changes, "r"),
        ("relation", changes + "_seq", "S"),
        ("relation", changes + "_id", "i"),
        ("relation", changes + "_n", "i"),
        ("relation", changes + "_score", "i"),
        ("relation", changes + "_tally", "r"),
        ("column", changes, "xid", "xid8", False, None),
        ("column", changes, "ord", "bigint", False, None),
        ("column", changes, "id", "bigint", False, None),
        ("column", changes, "score", "bigint", False, None),
        ("column", changes, "n", "bigint", False, None),
        ("column", changes + "_tally", "xid", "xid8", False, None),
        ("column", changes + "_tally", "added", "bigint", False, None),
        ("column", changes + "_tally", "removed", "bigint", False, None),
        ("column", changes + "_tally", "bad", "bigint", False, None),
        ("column", changes + "_tally", "top", "double precision", False, None),
        (
            "index",
            changes + "_id",
            changes,
            f"CREATE INDEX {changes}_id ON {changes} USING btree (id)",
        ),
        (
            "index",
            changes + "_n",
            changes,
            f"CREATE INDEX {changes}_n ON {changes} USING btree (n)",
        ),
        (
            "index",
            changes + "_score",
            changes,
            f"CREATE INDEX {changes}_score ON {changes} USING btree (((score)::double precision))",
        ),
        ("trigger", f"{prefix}_ins", "votes", "A", changes, ""),
        ("trigger", f"{prefix}_upd", "votes", "A", changes, ""),
        ("trigger", f"{prefix}_del", "votes", "A", changes, ""),
        ("function", changes, True),
    }


def _postgres_layout(schema: str) -> set[tuple[Any, ...]]:
    """PostgresTable's copy of votes(id, score), spelled out."""
    ranks = "votes__topk_rank_" + sha1("votes\0id\0score")[:10]
    runs, d = ranks + "_runs", sha1(ranks)[:12]
    key = copy_key(f'"{schema}"."{ranks}"')
    record = (
        "topk-rank-v1 <n> <n> <n>:<n>:-<n>,<n>:<n>:-<n>\n"
        "topk-writes-v2 <snapshot> <md5>\ntopk-changes-v1 <md5>"
    )
    return _change_log(f"topk_{d}") | {
        ("relation", ranks, "r"),
        ("relation", runs, "r"),
        ("relation", f"topk_{d}_rank", "i"),
        ("relation", f"topk_{d}_id", "i"),
        ("relation", runs + "_pkey", "i"),
        ("relation", "topk_write_log", "r"),
        ("relation", "topk_write_log_copy_xid", "i"),
        ("comment", ranks, record),
        ("column", ranks, "rank", "bigint", True, None),
        ("column", ranks, "id", "bigint", True, None),
        ("column", ranks, "score", "double precision", True, None),
        ("column", runs, "run", "bigint", True, None),
        ("column", runs, "first_rank", "bigint", True, None),
        ("column", runs, "score", "double precision", True, None),
        ("column", "topk_write_log", "copy", "bigint", True, None),
        ("column", "topk_write_log", "xid", "xid8", True, None),
        (
            "index",
            f"topk_{d}_rank",
            ranks,
            f"CREATE UNIQUE INDEX topk_{d}_rank ON {ranks} USING btree (rank)",
        ),
        (
            "index",
            f"topk_{d}_id",
            ranks,
            f"CREATE UNIQUE INDEX topk_{d}_id ON {ranks} USING btree (id)",
        ),
        (
            "index",
            runs + "_pkey",
            runs,
            f"CREATE UNIQUE INDEX {runs}_pkey ON {runs} USING btree (first_rank)",
        ),
        (
            "index",
            "topk_write_log_copy_xid",
            "topk_write_log",
            "CREATE INDEX topk_write_log_copy_xid ON topk_write_log USING btree (copy, xid)",
        ),
        (
            "constraint",
            ranks + "_score_check",
            ranks,
            "c",
            "CHECK (((score >= (0)::double precision) AND (score < 'Infinity'::double precision)))",
        ),
        ("constraint", runs + "_pkey", runs, "p", "PRIMARY KEY (first_rank)"),
        ("trigger", f"topk_{d}_writes", "votes", "A", "topk_log_write", key + "\\000"),
        ("function", "topk_log_write", True),
    }


def test_postgres_copy_layout_is_pinned(schema: tuple[psycopg.Connection[Any], str]) -> None:
    """PostgresTable (copy mode): the objects prepare() makes, a run that proves the copy
    current by the write log, and an uninstall() that leaves the schema as it was."""
    conn, name = schema
    before = catalog(conn, name)
    source = PostgresTable(PG_DSN, "votes", schema=name)
    try:
        source.prepare()
        assert catalog(conn, name) - before == _postgres_layout(name)
        got = private_top_k(source, k=3, epsilon=1.0, seed=1)
        assert got.plan["freshness"]["copy"] == "current"
        source.uninstall()
        assert catalog(conn, name) == before
    finally:
        source.close()


def _sqlalchemy_layout(schema: str, engine: Any) -> set[tuple[Any, ...]]:
    """SQLAlchemyTable's copy of votes(id, score) on PostgreSQL, spelled out."""
    import sqlalchemy as sa

    digest = sha1(f"{schema}\0votes\0id\0score")[:10]
    ranks = f"votes__topk_rank_{digest}"
    runs, index = ranks + "_runs", "ix_topk_" + sha1(schema + "\0" + ranks)[:10] + "_id"
    trigger = f"topk_{sha1(ranks)[:12]}_w"
    key = copy_key(engine.dialect.identifier_preparer.format_table(sa.table(ranks, schema=schema)))
    score_id, by_id = f"ix_topk_{digest}_score_id", f"ix_topk_{digest}_id"
    prints, stamps = "topk_rank_fingerprints", "topk_write_stamps"
    return _change_log(f"topk_{sha1(ranks)[:12]}_c") | {
        ("relation", ranks, "r"),
        ("relation", runs, "r"),
        ("relation", ranks + "_pkey", "i"),
        ("relation", runs + "_pkey", "i"),
        ("relation", index, "i"),
        ("relation", score_id, "i"),
        ("relation", by_id, "i"),
        ("relation", prints, "r"),
        ("relation", prints + "_pkey", "i"),
        ("relation", stamps, "r"),
        ("relation", stamps + "_pkey", "i"),
        ("relation", "topk_write_log", "r"),
        ("relation", "topk_write_log_copy_xid", "i"),
        ("column", ranks, "rank", "bigint", True, None),
        ("column", ranks, "id", "bigint", True, None),
        ("column", ranks, "score", "bigint", True, None),
        ("column", runs, "run", "bigint", True, None),
        ("column", runs, "first_rank", "bigint", True, None),
        ("column", runs, "score", "bigint", True, None),
        ("column", prints, "rank_table", "character varying(255)", True, None),
        ("column", prints, "mark", "bigint", True, None),
        ("column", stamps, "rank_table", "character varying(255)", True, None),
        ("column", stamps, "stamp", "text", False, None),
        ("column", "topk_write_log", "copy", "bigint", True, None),
        ("column", "topk_write_log", "xid", "xid8", True, None),
        (
            "index",
            ranks + "_pkey",
            ranks,
            f"CREATE UNIQUE INDEX {ranks}_pkey ON {ranks} USING btree (rank)",
        ),
        (
            "index",
            runs + "_pkey",
            runs,
            f"CREATE UNIQUE INDEX {runs}_pkey ON {runs} USING btree (first_rank)",
        ),
        ("index", index, ranks, f"CREATE INDEX {index} ON {ranks} USING btree (id)"),
        (
            "index",
            score_id,
            "votes",
            f"CREATE INDEX {score_id} ON votes USING btree (score DESC, id)",
        ),
        ("index", by_id, "votes", f"CREATE INDEX {by_id} ON votes USING btree (id)"),
        (
            "index",
            prints + "_pkey",
            prints,
            f"CREATE UNIQUE INDEX {prints}_pkey ON {prints} USING btree (rank_table)",
        ),
        (
            "index",
            stamps + "_pkey",
            stamps,
            f"CREATE UNIQUE INDEX {stamps}_pkey ON {stamps} USING btree (rank_table)",
        ),
        (
            "index",
            "topk_write_log_copy_xid",
            "topk_write_log",
            "CREATE INDEX topk_write_log_copy_xid ON topk_write_log USING btree (copy, xid)",
        ),
        ("constraint", ranks + "_pkey", ranks, "p", "PRIMARY KEY (rank)"),
        ("constraint", runs + "_pkey", runs, "p", "PRIMARY KEY (first_rank)"),
        ("constraint", prints + "_pkey", prints, "p", "PRIMARY KEY (rank_table)"),
        ("constraint", stamps + "_pkey", stamps, "p", "PRIMARY KEY (rank_table)"),
        ("trigger", trigger, "votes", "A", "topk_log_write", key + "\\000"),
        ("function", "topk_log_write", True),
        ("row", prints, ranks, "<mark>"),
        ("row", stamps, ranks, "topk-writes-v2 <snapshot> <md5>\ntopk-changes-v1 <md5>"),
    }


def _side_rows(conn: psycopg.Connection[Any], schema: str) -> set[tuple[Any, ...]]:
    """The rows of the shared fingerprint and stamp tables (masked)."""
    rows: set[tuple[Any, ...]] = set()
    for table in ("topk_rank_fingerprints", "topk_write_stamps"):
        name = sql.Identifier(schema, table)
        if conn.execute("SELECT to_regclass(%s)", [name.as_string(conn)]).fetchone()[0]:
            for key, value in conn.execute(sql.SQL("SELECT * FROM {}").format(name)):
                mark = isinstance(value, int)  # a signed 64-bit hash
                rows.add(("row", table, key, "<mark>" if mark else masked(str(value))))
    return rows


def test_sqlalchemy_postgres_copy_layout_is_pinned(
    schema: tuple[psycopg.Connection[Any], str],
) -> None:
    """SQLAlchemyTable on PostgreSQL (copy mode): its own names, the shared fingerprint and
    stamp tables, the write log (shared with PostgresTable), a run that proves the copy current,
    and an uninstall() that leaves the schema as it was."""
    import sqlalchemy as sa

    from adapters.sqlalchemy import SQLAlchemyTable
    from tests.stores_sqlalchemy import postgres_url_and_args

    conn, name = schema
    url, args = postgres_url_and_args()
    engine = sa.create_engine(url, connect_args=args)
    try:
        before = catalog(conn, name) | _side_rows(conn, name)
        source = SQLAlchemyTable(engine, "votes", schema=name)
        source.prepare()
        made = catalog(conn, name) | _side_rows(conn, name)
        assert made - before == _sqlalchemy_layout(name, engine)
        got = private_top_k(source, k=3, epsilon=1.0, seed=1)
        assert got.plan["freshness"]["copy"] == "current"
        source.uninstall()
        assert catalog(conn, name) | _side_rows(conn, name) == before
    finally:
        engine.dispose()
