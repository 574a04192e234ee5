"""The red team benchmark's setting (benchmarks/redteam.py): a database of its own with the SQL
functions installed, its roles, and the neighbouring tables the attacks tell apart.

The tables (m = 20,000): random counts 0-3, a plateau of 20 votes over them and a head of 26
(`neighbour_scores`); the neighbour has one client more, at the head or at the oblivious depth's
boundary. A pair is two tables in schemas of their own, prepared for sublinear reads (live mode;
or copy mode, a rank-ordered copy) and vacuumed, the neighbour made in one of the ways listed in
STATIO_PAIRS. The heap holds the rows in id order, not score order, and autovacuum is off.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from adapters.postgres import PostgresTable
from frontends import sql_function
from topk_middleware.mechanisms.oblivious import oblivious_depth

M, K, EPSILON = 20_000, 10, 1.0


def neighbour_scores(m: int, where: str, ids: str = "bigint") -> tuple[np.ndarray, np.ndarray]:
    """The table and its neighbour with one client more: at the head (26 -> 27); at the
    oblivious depth d's boundary (the item of canonical rank d, a 3, becomes a 4 and rises into
    the d rows a release reads, pushing another out); or "last": the last item (whose id sorts
    last, so it is the last of the 3s, outside the top d) becomes a 4 and rises into them."""
    rng = np.random.default_rng(20)
    low = rng.integers(0, 4, size=m).astype(np.int64)
    low[:40] = 20
    low[0] = 26
    low[-1] = 3
    high = low.copy()
    if where == "head":
        high[0] += 1
    elif where == "last":
        high[-1] += 1
    else:
        named = item_ids(m, ids)
        order = sorted(range(m), key=lambda i: (-low[i], named[i]))  # the canonical order
        high[order[oblivious_depth(m, K, 1e-9)]] += 1
    return low, high


def item_ids(m: int, ids: str) -> list[Any]:
    """Ids 0..m-1 ("bigint"), 'item-<i>' ("text"), or those with the last one 'z' and then
    hexadecimal digits (which do not compress), that many characters in all ("text, last <n>
    long"): it sorts after every other id."""
    if ids == "bigint":
        return list(range(m))
    named: list[Any] = [f"item-{i}" for i in range(m)]
    if ids != "text":
        length = int(ids.rsplit(" ", 2)[-2])
        digits = "".join(
            hashlib.sha256(str(i).encode()).hexdigest() for i in range(length // 64 + 1)
        )
        named[-1] = ("z" + digits)[:length]
    return named


def create_table(conn: psycopg.Connection[Any], schema: str, scores: np.ndarray, ids: str) -> None:
    """Schema `schema` with table votes (id bigint or text, item_ids; score bigint), rows in
    id order (so the heap is not in score order), autovacuum off."""
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    table = sql.Identifier(schema, "votes")
    kind = sql.SQL("bigint" if ids == "bigint" else "text")
    conn.execute(
        sql.SQL("CREATE TABLE {} (id {} NOT NULL, score bigint NOT NULL)").format(table, kind)
    )
    with conn.cursor() as cur, cur.copy(sql.SQL("COPY {} FROM STDIN").format(table)) as copy:
        for row in zip(item_ids(len(scores), ids), scores.tolist(), strict=True):
            copy.write_row(row)
    conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(table))


def raise_count(
    conn: psycopg.Connection[Any], schema: str, low: np.ndarray, high: np.ndarray, ids: str
) -> None:
    """UPDATE the table of `low` into `high` (the one count that differs), not vacuumed."""
    (where,) = np.flatnonzero(low != high)
    conn.execute(
        sql.SQL("UPDATE {} SET score = %s WHERE id = %s").format(sql.Identifier(schema, "votes")),
        [int(high[where]), item_ids(len(low), ids)[where]],
    )


def vacuum(conn: psycopg.Connection[Any], schema: str, freeze: bool = False) -> None:
    """VACUUM (ANALYZE, INDEX_CLEANUP ON) every table of `schema` until each page is marked
    all-visible (a transaction open elsewhere on the server can hold that back for a while)."""
    tables = conn.execute(
        "SELECT format('%%I.%%I', schemaname, tablename) FROM pg_tables WHERE schemaname = %s",
        [schema],
    ).fetchall()
    options = "ANALYZE, INDEX_CLEANUP ON" + (", FREEZE" if freeze else "")
    for (table,) in tables:
        conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        deadline = time.monotonic() + 120
        while True:
            conn.execute(f"VACUUM ({options}) {table}")
            pages, visible = conn.execute(
                "SELECT relpages, relallvisible FROM pg_class WHERE oid = %s::regclass", [table]
            ).fetchone()
            if visible >= pages or time.monotonic() > deadline:
                break
            time.sleep(0.5)


# ----- the setting: a database, its roles ------------------------------------------------------
class Lab:
    """A database of its own on the server of `dsn` with the SQL functions installed, an analyst
    (EXECUTE, a large budget), an observer (no grant), and two readers of the tables (one
    granted SET on track_counts); everything dropped by `close`."""

    def __init__(self, dsn: str) -> None:
        tag = uuid.uuid4().hex[:8]
        self.server, self.name = dsn, f"topk_redteam_{tag}"
        self.roles = {r: f"topk_rt_{r}_{tag}" for r in ("analyst", "observer", "reader", "setter")}
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
            for role in self.roles.values():
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
            conn.execute(
                sql.SQL("GRANT SET ON PARAMETER track_counts TO {}").format(
                    sql.Identifier(self.roles["setter"])
                )
            )
        self.dsn = psycopg.conninfo.make_conninfo(dsn, dbname=self.name)
        self.admin = psycopg.connect(self.dsn, autocommit=True)
        sql_function.install(self.dsn)
        analyst = sql.Identifier(self.roles["analyst"])
        self.admin.execute(
            sql.SQL("GRANT EXECUTE ON FUNCTION topk.private_top_k TO {}").format(analyst)
        )
        self.admin.execute("SELECT topk.grant_budget(%s, 1e9, 0.5)", [self.roles["analyst"]])
        self.sessions: list[psycopg.Connection[Any]] = []

    def as_role(self, role: str) -> str:
        return psycopg.conninfo.make_conninfo(self.dsn, user=self.roles[role])

    def connect(self, role: str) -> psycopg.Connection[Any]:
        """A session of `role` (autocommit), closed by `close`."""
        conn = psycopg.connect(self.as_role(role), autocommit=True)
        self.sessions.append(conn)
        return conn

    def schema(self, scores: np.ndarray, ids: str = "bigint") -> str:
        """A new schema holding votes of `scores`, readable by the readers."""
        name = f"rt_{uuid.uuid4().hex[:8]}"
        create_table(self.admin, name, scores, ids)
        for role in ("reader", "setter", "analyst"):
            who = sql.Identifier(self.roles[role])
            self.admin.execute(
                sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(name), who)
            )
        return name

    def readable(self, schema: str) -> None:
        for role in ("reader", "setter"):
            self.admin.execute(
                sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(
                    sql.Identifier(schema), sql.Identifier(self.roles[role])
                )
            )

    def register(self, schema: str) -> str:
        return sql_function.register_source(
            self.dsn, "votes", "id", "score", schema=schema, grant=(self.roles["analyst"],)
        )

    def close(self) -> None:
        for conn in self.sessions:
            conn.close()
        self.admin.close()
        sql_function.uninstall(self.dsn, drop_ledger=True)
        with psycopg.connect(self.server, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                [self.name],
            )
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(self.name)))
            conn.execute(
                sql.SQL("REVOKE SET ON PARAMETER track_counts FROM {}").format(
                    sql.Identifier(self.roles["setter"])
                )
            )
            for role in self.roles.values():
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def updated_pair(lab: Lab, where: str = "head") -> tuple[str, str]:
    """Two registered copies of the table; the second then raised by an UPDATE (not vacuumed)."""
    low, high = neighbour_scores(M, where)
    schemas = (lab.schema(low), lab.schema(low))
    tables = (lab.register(schemas[0]), lab.register(schemas[1]))
    for schema in schemas:
        vacuum(lab.admin, schema)
    raise_count(lab.admin, schemas[1], low, high, "bigint")
    return tables


def prepared(lab: Lab, scores: np.ndarray, ids: str, mode: str = "live") -> str:
    """A new schema with votes of `scores`, prepared in `mode`, readable, vacuumed."""
    schema = lab.schema(scores, ids)
    prepare(lab, schema, mode)
    return schema


def prepare(lab: Lab, schema: str, mode: str, refresh: bool = False) -> None:
    """Prepare (or refresh: a copy made again after writes) the schema's votes for sublinear
    reads in `mode`, as the owner; then readable by the readers, and vacuumed."""
    owner = PostgresTable(lab.dsn, "votes", "id", "score", schema=schema, mode=mode)
    owner.prepare(refresh=refresh)
    owner.close()
    lab.readable(schema)
    vacuum(lab.admin, schema)


def score_index_pages(lab: Lab, schema: str) -> int:
    """Pages of the B-tree whose first column is the score (live mode's (score DESC, id))."""
    return lab.admin.execute(
        "SELECT pg_relation_size(i.indexrelid) / current_setting('block_size')::int "
        "FROM pg_index AS i JOIN pg_attribute AS a ON a.attrelid = i.indrelid "
        "AND a.attnum = i.indkey[0] WHERE i.indrelid = %s::regclass AND a.attname = 'score'",
        [f"{schema}.votes"],
    ).fetchone()[0]


def vote_on_head(lab: Lab, schema: str, times: int) -> None:
    """`times` clients vote for the head, one UPDATE each."""
    for _ in range(times):
        lab.admin.execute(
            sql.SQL("UPDATE {} SET score = score + 1 WHERE id = 0").format(
                sql.Identifier(schema, "votes")
            )
        )


def split_pair(lab: Lab, mode: str) -> tuple[str, str]:
    """Two tables whose heads took n and n + 1 votes by UPDATE, the (n + 1)-th splitting a leaf
    page of the score index (n found on a probe table), both then vacuumed with FREEZE and
    INDEX_CLEANUP ON: the split page stays. In copy mode the copies are made after the votes."""
    low, _ = neighbour_scores(M, "head")
    probe = prepared(lab, low, "bigint")
    pages, votes = score_index_pages(lab, probe), 0
    while score_index_pages(lab, probe) == pages:
        assert votes < 5000, "no page split after 5,000 votes"
        vote_on_head(lab, probe, 1)
        votes += 1
    schemas = (lab.schema(low), lab.schema(low))
    for schema, times in zip(schemas, (votes - 1, votes), strict=True):
        prepare(lab, schema, "live")  # the score index the votes split
        vote_on_head(lab, schema, times)
        vacuum(lab.admin, schema, freeze=True)
        if mode == "copy":
            prepare(lab, schema, "copy")
    return schemas


def statio_pair(lab: Lab, where: str, ids: str, state: str, mode: str) -> tuple[str, str]:
    """Two schemas of STATIO_PAIRS' kind, prepared in `mode`, readable, vacuumed."""
    if state == "split":
        return split_pair(lab, mode)
    low, high = neighbour_scores(M, where, ids)
    schemas = (
        prepared(lab, low, ids, mode),
        prepared(lab, high if state == "fresh" else low, ids, mode),
    )
    if state != "fresh":
        raise_count(lab.admin, schemas[1], low, high, ids)
    if state == "vacuumed":
        vacuum(lab.admin, schemas[1], freeze=True)
    if mode == "copy" and state != "fresh":  # the written table's copy made again
        prepare(lab, schemas[1], mode, refresh=True)
    return schemas


# (name, where the neighbours differ, ids (item_ids), state of the neighbour): "updated" made by
# an UPDATE of a copy and not vacuumed, "vacuumed" the same then VACUUM (FREEZE, INDEX_CLEANUP
# ON), "split" (split_pair) both written and vacuumed, the neighbour's last vote having split a
# page of the score index, "fresh" both tables built afresh from their counts.
STATIO_PAIRS = (
    ("head, updated", "head", "bigint", "updated"),
    ("head, updated and vacuumed", "head", "bigint", "vacuumed"),
    ("head, a vote that split an index page, vacuumed", "head", "bigint", "split"),
    ("head, fresh", "head", "bigint", "fresh"),
    ("head, fresh, text ids", "head", "text", "fresh"),
    ("boundary, fresh", "boundary", "bigint", "fresh"),
    ("boundary, fresh, text ids", "boundary", "text", "fresh"),
    ("a 1,000-character id rises into the top d, fresh", "last", "text, last 1000 long", "fresh"),
    (
        "a 2,000-character id (TOAST) rises into the top d, fresh",
        "last",
        "text, last 2000 long",
        "fresh",
    ),
)
