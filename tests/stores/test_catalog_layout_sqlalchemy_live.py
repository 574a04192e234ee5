"""The catalog SQLAlchemyTable(mode="live") leaves on SQLite, PostgreSQL and MariaDB, pinned: a
table prepared by any version of the code works under any other with no migration (the names,
columns, indexes, triggers and the rows of the position and count tables are a contract).

For a table with integer ids and one with text ids (no key of their own, so prepare() makes the
unique index on id too), the test spells out every object prepare() makes, with names derived as
the code derives them (a digest of the schema's, table's and id column's names): the position
table `<table>_topk_pos` (position BIGINT key, id unique), the count table `<table>_topk_pos_n`
(n, hole), the index on (score DESC, id in byte order) and the unique index on id, the triggers
(and PostgreSQL's trigger function). The triggers' statements are pinned by a digest of their text
(identifier quotes dropped, white space made single). The rows: positions 0..m-1 in id order
(text in byte order), the count row n = m (hole NULL, on MariaDB the table's identity). Then
uninstall() leaves the catalog as it was before.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pytest
import sqlalchemy as sa

from adapters.sqlalchemy import SQLAlchemyTable

M = 20
DIALECTS = ["sqlite", "postgres", "mariadb"]
SCHEMA = {"sqlite": "main", "postgres": "public", "mariadb": "test"}
ID_TYPES = {
    "votes": {"sqlite": "BIGINT", "postgres": "BIGINT", "mariadb": "BIGINT"},
    "words": {
        "sqlite": "VARCHAR(100)",
        "postgres": "VARCHAR(100)",
        "mariadb": "VARCHAR(100) COLLATE utf8mb4_nopad_bin",
    },
}
# sha1 of each trigger's (PostgreSQL: the trigger function's) flattened text, first 16 digits.
BODIES = {
    ("sqlite", "votes"): {"del": "5c6de139302184aa", "ins": "e0554388bd855305",
                          "upd": "dba7643aaf374655"},
    ("sqlite", "words"): {"del": "9b00657874e69678", "ins": "03a10aa6401edd73",
                          "upd": "808f83759830b3a0"},
    ("postgres", "votes"): {"sync": "8142cb19d762ab5a"},
    ("postgres", "words"): {"sync": "7d119ab54c1f4fdc"},
    ("mariadb", "votes"): {"del": "b57c4e1d61d8e994", "ins": "142a8a9dd62a0299",
                           "upd": "142fc1cf13d6a0d9"},
    ("mariadb", "words"): {"del": "3bfa85b74dd9a9f4", "ins": "e304d9c434f79028",
                           "upd": "5ef878d7806253a0"},
}  # fmt: skip


def flat(sql: str) -> str:
    """A statement with its identifier quotes dropped and its white space made single."""
    return re.sub(r"\s+", " ", sql.replace('"', "").replace("`", "")).strip()


def pinned(sql: str) -> str:
    return hashlib.sha1(flat(sql).encode("utf-8")).hexdigest()[:16]


def digest(*parts: str) -> str:
    return hashlib.sha1("\x00".join(parts).encode("utf-8")).hexdigest()[:10]


def in_list(names: list[str]) -> str:
    return ", ".join(f"'{n}'" for n in names)


def catalog(engine: sa.Engine, dialect: str, names: list[str]) -> list[tuple[Any, ...]]:
    """The tables (columns), indexes and triggers on the tables `names`, in a fixed order."""
    listed = in_list(names)
    with engine.connect() as conn:
        run = conn.exec_driver_sql
        if dialect == "sqlite":
            return [
                (kind, name, table, pinned(sql) if kind == "trigger" else sql and flat(sql))
                for kind, name, table, sql in run(
                    "SELECT type, name, tbl_name, sql FROM sqlite_master "
                    f"WHERE tbl_name IN ({listed}) ORDER BY type, name"
                )
            ]
        if dialect == "postgres":
            found = [tuple(r) for r in run(
                "SELECT table_name, column_name, data_type, collation_name, is_nullable "
                f"FROM information_schema.columns WHERE table_schema = 'public' "
                f"AND table_name IN ({listed}) ORDER BY table_name, ordinal_position"
            )]  # fmt: skip
            found += [tuple(r) for r in run(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' "
                f"AND tablename IN ({listed}) ORDER BY indexname"
            )]  # fmt: skip
            found += [tuple(r) for r in run(
                "SELECT t.tgname, t.tgenabled::text, pg_get_triggerdef(t.oid) FROM pg_trigger t "
                "JOIN pg_class c ON c.oid = t.tgrelid "
                "JOIN pg_namespace s ON s.oid = c.relnamespace "
                f"WHERE s.nspname = 'public' AND c.relname IN ({listed}) AND NOT t.tgisinternal "
                "ORDER BY t.tgname"
            )]  # fmt: skip
            return found
        found = [tuple(r) for r in run(
            "SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, COLLATION_NAME, IS_NULLABLE, COLUMN_KEY "
            "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = database() "
            f"AND TABLE_NAME IN ({listed}) ORDER BY TABLE_NAME, ORDINAL_POSITION"
        )]  # fmt: skip
        found += [tuple(r) for r in run(
            "SELECT TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX, COLUMN_NAME, COLLATION, NON_UNIQUE "
            "FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = database() "
            f"AND TABLE_NAME IN ({listed}) ORDER BY TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX"
        )]  # fmt: skip
        found += [(*facts, pinned(body)) for *facts, body in run(
            "SELECT TRIGGER_NAME, EVENT_MANIPULATION, ACTION_TIMING, EVENT_OBJECT_TABLE, "
            "ACTION_STATEMENT FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = database() "
            f"AND EVENT_OBJECT_TABLE IN ({listed}) ORDER BY TRIGGER_NAME"
        )]  # fmt: skip
        return found


def functions(engine: sa.Engine, prefix: str) -> list[tuple[str, str]]:
    """PostgreSQL: the trigger functions named `<prefix>...` and their text, pinned."""
    with engine.connect() as conn:
        return [
            (name, pinned(text))
            for name, text in conn.exec_driver_sql(
                "SELECT proname, prosrc FROM pg_proc WHERE proname LIKE %(p)s ORDER BY proname",
                {"p": prefix + "%"},
            )
        ]


def layout(dialect: str, table: str, kind: str) -> list[tuple[Any, ...]]:
    """What prepare() makes for `table` of ids `kind` (module docstring), as the catalog lists
    it."""
    d = digest(SCHEMA[dialect], table, "id")
    pos, count = f"{table}_topk_pos", f"{table}_topk_pos_n"
    order, unique, trig = f"ix_topk_{d}_live_order", f"ux_topk_{d}_live_id", f"topk_{d}_pos"
    text = kind == "words"
    body = BODIES[(dialect, kind)]
    c_key = ' COLLATE "C"' if text else ""
    if dialect == "sqlite":
        key = "id COLLATE BINARY" if text else "id"
        return [
            ("index", order, table, f"CREATE INDEX {order} ON {table} (score DESC, {key})"),
            ("index", f"sqlite_autoindex_{pos}_1", pos, None),
            ("index", f"sqlite_autoindex_{pos}_2", pos, None),
            ("index", unique, table, f"CREATE UNIQUE INDEX {unique} ON {table} ({key})"),
            ("table", table, table, f"CREATE TABLE {table} (id {ID_TYPES[kind][dialect]} "
                                    "NOT NULL, score BIGINT NOT NULL)"),
            ("table", pos, pos,
             f"CREATE TABLE {pos} ( position BIGINT NOT NULL, id "
             f"{'TEXT COLLATE BINARY' if text else 'BIGINT'} NOT NULL, PRIMARY KEY (position), "
             "UNIQUE (id) )"),
            ("table", count, count, f"CREATE TABLE {count} ( n BIGINT NOT NULL, hole BIGINT )"),
            *(("trigger", f"{trig}_{e}", table, body[e]) for e in ("del", "ins", "upd")),
        ]  # fmt: skip
    if dialect == "postgres":
        id_type = "character varying" if text else "bigint"
        sync = f"EXECUTE FUNCTION {trig}_sync()"
        changed = (
            "(old.id)::text IS DISTINCT FROM (new.id)::text"
            if text
            else ("old.id IS DISTINCT FROM new.id")
        )
        on = f"public.{table}"
        return [
            (table, "id", id_type, None, "NO"), (table, "score", "bigint", None, "NO"),
            (pos, "position", "bigint", None, "NO"), (pos, "id", id_type, None, "NO"),
            (count, "n", "bigint", None, "NO"), (count, "hole", "bigint", None, "YES"),
            (order, f"CREATE INDEX {order} ON {on} USING btree "
                    f"(score DESC, id{c_key})"),
            (f"{pos}_id_key", f"CREATE UNIQUE INDEX {pos}_id_key ON public.{pos} USING btree (id)"),
            (f"{pos}_pkey",
             f"CREATE UNIQUE INDEX {pos}_pkey ON public.{pos} USING btree (\"position\")"),
            (unique, f"CREATE UNIQUE INDEX {unique} ON {on} USING btree (id)"),
            (f"{trig}_del", "A", f"CREATE TRIGGER {trig}_del AFTER DELETE ON {on} REFERENCING OLD "
                                 f"TABLE AS old_rows FOR EACH STATEMENT {sync}"),
            (f"{trig}_ins", "A", f"CREATE TRIGGER {trig}_ins AFTER INSERT ON {on} REFERENCING NEW "
                                 f"TABLE AS new_rows FOR EACH STATEMENT {sync}"),
            (f"{trig}_trunc", "A",
             f"CREATE TRIGGER {trig}_trunc AFTER TRUNCATE ON {on} FOR EACH STATEMENT {sync}"),
            (f"{trig}_upd", "A", f"CREATE TRIGGER {trig}_upd AFTER UPDATE OF id ON {on} FOR EACH "
                                 f"ROW WHEN (({changed})) {sync}"),
        ]  # fmt: skip
    id_type, collation = ("varchar(100)", "utf8mb4_nopad_bin") if text else ("bigint(20)", None)
    return [
        (table, "id", id_type, collation, "NO", "PRI"),
        (table, "score", "bigint(20)", None, "NO", "MUL"),
        (pos, "position", "bigint(20)", None, "NO", "PRI"),
        (pos, "id", id_type, collation, "NO", "UNI"),
        (count, "n", "bigint(20)", None, "NO", ""),
        (count, "hole", "bigint(20)", None, "YES", ""),
        (table, order, 1, "score", "D", 1), (table, order, 2, "id", "A", 1),
        (table, unique, 1, "id", "A", 0),
        (pos, "id", 1, "id", "A", 0), (pos, "PRIMARY", 1, "position", "A", 0),
        (f"{trig}_del", "DELETE", "AFTER", table, body["del"]),
        (f"{trig}_ins", "INSERT", "AFTER", table, body["ins"]),
        (f"{trig}_upd", "UPDATE", "AFTER", table, body["upd"]),
    ]  # fmt: skip


@pytest.mark.parametrize("table", ["votes", "words"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_live_mode_makes_the_pinned_catalog(
    request: pytest.FixtureRequest, dialect: str, table: str
) -> None:
    engine: sa.Engine = request.getfixturevalue(f"sqlalchemy_{dialect}_engine")
    table = f"pinlive_{table}"
    kind = table.removeprefix("pinlive_")
    names = [table, f"{table}_topk_pos", f"{table}_topk_pos_n"]
    ids: list[Any] = list(range(M)) if kind == "votes" else [f"w{i}" for i in range(M)]
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
        conn.exec_driver_sql(
            f"CREATE TABLE {table} (id {ID_TYPES[kind][dialect]} NOT NULL, score BIGINT NOT NULL)"
        )
        conn.execute(
            sa.text(f"INSERT INTO {table} VALUES (:id, :score)"),
            [{"id": i, "score": (n * 7) % 5} for n, i in enumerate(ids)],
        )
    before = catalog(engine, dialect, names)
    prefix = f"topk_{digest(SCHEMA[dialect], table, 'id')}_pos"
    source = SQLAlchemyTable(engine, table, mode="live")
    try:
        source.prepare()
        assert catalog(engine, dialect, names) == layout(dialect, table, kind)
        if dialect == "postgres":
            sync = BODIES[(dialect, kind)]["sync"]
            assert functions(engine, prefix) == [(f"{prefix}_sync", sync)]
        in_order = sorted(ids, key=lambda i: i.encode() if isinstance(i, str) else i)
        with engine.connect() as conn:
            positions = conn.exec_driver_sql(
                f"SELECT position, id FROM {table}_topk_pos ORDER BY position"
            ).all()
            n, hole = conn.exec_driver_sql(f"SELECT n, hole FROM {table}_topk_pos_n").one()
        assert [tuple(p) for p in positions] == list(enumerate(in_order))
        assert n == M
        assert (hole is not None) == (dialect == "mariadb")
    finally:
        source.uninstall()
    assert catalog(engine, dialect, names) == before
    if dialect == "postgres":
        assert functions(engine, prefix) == []
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {table}")
