"""PostgresTable (copy mode) reading a stale copy *around* the rows written since it was made
(docs/freshness.md, "Reading around the writes").

The write log (adapters/_pg_writes.py) proves a copy current or not; it names transactions, not
rows. Beside it, `prepare()` installs a change log of the copy on a plain table (no partitions,
no inheritance children) that has an immediate unique B-tree on exactly the id column: three
statement-level triggers with transition tables (INSERT, UPDATE, DELETE) append, per statement,
every old row as (xid, 2 s, id, NULL) and every new row as (xid, 2 s + 1, id, score), s one
value of a sequence drawn by the statement's trigger, each entry numbered n from the same
sequence. The table `topk_<digest>_changes` holds them, with B-trees on id and on n; writers
need no right on it (the function is SECURITY DEFINER, search_path pg_catalog).

Why the last entry of an id is its current row. Two writes to one id in different
transactions are ordered by the row lock or by the unique index (an insert waits for the
transaction that deleted or holds a conflicting row; the index is immediate, so the wait is at
the statement, not at commit), so the later writer's trigger draws its sequence value after
the earlier writer committed. Within a statement, new rows come after old ones. A transaction
the copy's snapshot sees wrote before every one it does not see that touched the same id. So,
among the entries of transactions the copy's snapshot does not see and the run's snapshot sees
(the run sees exactly the committed ones), the entry of largest order is each changed id's
current row (a new row: present, with that score; an old one: deleted), and the entry of
smallest order tells whether the copy holds the id (an old row: it did). No row of the table is
read. The copy stamp's third line holds a digest of what this rests on (the triggers' rows and
their function, the change table, its sequence, the unique index), checked by the run: a
trigger disabled, replaced or dropped, or the index dropped, ends reading around.

Positions (the one-shot's, keyed_noise.py): an unchanged item keeps its copy rank; the copy
ranks of changed items are holes; an item present among the changed ids takes m_copy + n -
n_min, n its last entry's number (superseded entries and numbers drawn by other copies or by
transactions rolled back are holes). Every item has one position, fixed before any noise is
drawn, so the in-store one-shot over these M = m_copy + n_max - n_min + 1 positions has the
one-shot law exactly as over a fresh copy (tested against the exact law and an ArraySource of
the current rows). The query (`_around_oneshot`) is the copy's one-shot with the changed rows
beside it: the exceedances and the k first unchanged ranks bound the k-th noisy score from
below (fewer than k rows: no cut); the copy's rows with score >= the cut are a prefix of ranks
(binary search), less the changed ids (a probe of the index on id per row); the changed rows
are the entries above the cut that are the last of their id (a probe each).

Cost: the run's first queries group the entries since the copy by id once (m and the counts:
about 1 us an entry); the one-shot reads the rows and entries it needs by index. A run falls
back to the table read (table_read.py) when the changes are invalid (a NULL id, a bad score:
that read refuses them in the project's words), or when reading around is priced above it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from adapters import _pg_writes as pgw
from topk_middleware.access import Rows
from topk_middleware.keyed_noise import KeyedNoise, capped_sql, uniform_from_hex_sql

from .._sql import float_array_literal, id_array, int_array_literal

CHANGES_TAG = "topk-changes-v1"
# Measured at m = 10^7 on this project's 2-core machine (benchmarks/sizes.py): grouping the
# change entries by id costs about 1 us an entry, and a run groups them twice.
ENTRY_SECONDS = 1e-6
AROUND_FIXED = 3e-3
WORK_MEM = "64MB"  # of the run's transaction, where it reads around


def around_seconds(entries: int) -> float:
    """A release read around `entries` changed ids: the facts, the one-shot, the grouping."""
    return AROUND_FIXED + 2 * ENTRY_SECONDS * entries


@dataclass
class AroundState:
    """What a run reading around the changes knows after its first queries."""

    snapshot: tuple[int, int, list[int]]  # the copy's snapshot: xmin, xmax, in-progress xids
    m_copy: int
    changed: int  # distinct ids written since the copy
    in_copy: int  # of them, held by the copy
    present: int  # of them, present now
    max_score: float
    first_entry: int = 0  # the smallest entry number n among the changes
    entries: int = 0  # the span of entry numbers: largest - smallest + 1

    @property
    def m(self) -> int:
        return self.m_copy - self.in_copy + self.present

    @property
    def positions(self) -> int:
        return self.m_copy + self.entries


def parse_snapshot(stamp: str) -> tuple[int, int, list[int]] | None:
    """The snapshot "xmin:xmax:xip,..." of a copy's stamp line, or None if malformed."""
    parts = stamp.split(" ")
    if len(parts) != 3 or parts[0] != pgw.STAMP_TAG or parts[2].endswith(pgw.UNPROVABLE):
        return None
    fields = parts[1].split(":")
    if len(fields) != 3 or not all(f.isdigit() for f in fields[:2]):
        return None
    xip = [x for x in fields[2].split(",") if x]
    if not all(x.isdigit() for x in xip):
        return None
    return int(fields[0]), int(fields[1]), [int(x) for x in xip]


class ReadAround:
    """The change log of one copy and the reads around it (module docstring); a mixin of
    PostgresTable, using its quoted names `_base`, `_ranks`, `_id`, `_score`, `schema`,
    `rank_table` and its `_text`, `_state_text` (freshness.py)."""

    _base: sql.Composable
    _ranks: sql.Composable
    _id: sql.Composable
    _score: sql.Composable
    schema: str | None
    rank_table: str
    id_column: str

    def _change_names(self) -> None:
        digest = hashlib.sha1(self.rank_table.encode("utf-8")).hexdigest()[:12]
        qualify = (
            (lambda n: sql.Identifier(n))
            if self.schema is None
            else (lambda n: sql.Identifier(self.schema, n))
        )
        self._changes = qualify(f"topk_{digest}_changes")
        self._changes_seq = qualify(f"topk_{digest}_changes_seq")
        self._changes_index = f"topk_{digest}_changes"
        self._changes_function = qualify(f"topk_{digest}_changes")
        self.change_triggers = tuple(f"topk_{digest}_{op}" for op in ("ins", "upd", "del"))

    def _unique_id_index_sql(self) -> str:
        """Oids of the valid, immediate unique B-trees whose key is exactly the id column, no
        predicate, no expression (comma-separated; NULL where none)."""
        base = pgw.literal(self._text(self._base))
        return (
            "(SELECT pg_catalog.string_agg(x.indexrelid::text, ',' ORDER BY x.indexrelid) "
            "FROM pg_catalog.pg_index x JOIN pg_catalog.pg_attribute a ON a.attrelid = "
            "x.indrelid AND a.attnum = x.indkey[0] "
            f"WHERE x.indrelid = pg_catalog.to_regclass({base}) AND x.indisunique "
            "AND x.indimmediate AND x.indisvalid AND x.indnkeyatts = 1 AND x.indpred IS NULL "
            f"AND x.indexprs IS NULL AND a.attname = {pgw.literal(self.id_column)})"
        )

    def _changes_state_sql(self) -> str:
        """A scalar subquery: the digest of what reading around rests on (module docstring),
        NULL where any part is missing or not in its state."""
        base = pgw.literal(self._text(self._base))
        function = pgw.literal(self._text(self._changes_function) + "()")
        names = ", ".join(pgw.literal(n) for n in self.change_triggers)
        triggers = (
            "(SELECT pg_catalog.string_agg(pg_catalog.concat_ws('/', tg.tgname, tg.oid, tg.xmin), "
            "',' ORDER BY tg.tgname) FROM pg_catalog.pg_trigger tg WHERE tg.tgrelid = "
            f"pg_catalog.to_regclass({base}) AND tg.tgname IN ({names}) AND tg.tgenabled = 'A' "
            "AND tg.tgfoid = p.oid)"
        )
        count = (
            "(SELECT count(*) FROM pg_catalog.pg_trigger tg WHERE tg.tgrelid = "
            f"pg_catalog.to_regclass({base}) AND tg.tgname IN ({names}) AND tg.tgenabled = 'A' "
            "AND tg.tgfoid = p.oid)"
        )
        index = self._unique_id_index_sql()
        return (
            "(SELECT CASE WHEN " + count + " = 3 AND " + index + " IS NOT NULL THEN "
            "pg_catalog.md5(pg_catalog.concat_ws(':', c.oid, c.relfilenode, q.oid, p.oid, "
            f"p.xmin, {triggers}, {index})) END "
            "FROM pg_catalog.pg_class c, pg_catalog.pg_class q, pg_catalog.pg_proc p "
            f"WHERE c.oid = pg_catalog.to_regclass({pgw.literal(self._text(self._changes))}) "
            f"AND q.oid = pg_catalog.to_regclass({pgw.literal(self._text(self._changes_seq))}) "
            f"AND p.oid = pg_catalog.to_regprocedure({function}))"
        )

    def _function_body(self, changes: str, seq: str) -> str:
        entry = "pg_catalog.pg_current_xact_id()"
        return (
            f"DECLARE s bigint := pg_catalog.nextval({pgw.literal(seq)}::pg_catalog.regclass); "
            "BEGIN IF TG_OP <> 'INSERT' THEN "
            f"INSERT INTO {changes} (xid, ord, id, score) SELECT {entry}, 2 * s, "
            f"o.{self._text(self._id)}, NULL FROM topk_old o; END IF; "
            "IF TG_OP <> 'DELETE' THEN "
            f"INSERT INTO {changes} (xid, ord, id, score) SELECT {entry}, 2 * s + 1, "
            f"n.{self._text(self._id)}, n.{self._text(self._score)} FROM topk_new n; END IF; "
            "RETURN NULL; END"
        )

    def _install_changes(self, conn: psycopg.Connection[Any], relations: list[Any]) -> None:
        """In prepare()'s first transaction (before the copy's snapshot, as the write log's
        trigger): the change table, its sequence, the function and the three triggers, where
        the table is one plain relation with an immediate unique B-tree on the id. Without the
        right to create them, nothing: runs read the table instead."""
        if len(relations) != 1 or relations[0][1] != "r":
            return
        if conn.execute("SELECT " + self._unique_id_index_sql()).fetchone()[0] is None:
            return
        base, relation = self._text(self._base), relations[0][0]
        try:
            with conn.transaction():  # a savepoint: without the right, prepare() goes on
                conn.execute(sql.SQL("CREATE SEQUENCE IF NOT EXISTS {}").format(self._changes_seq))
                exists, numbered = conn.execute(
                    "SELECT pg_catalog.to_regclass(%s) IS NOT NULL, EXISTS (SELECT 1 FROM "
                    "pg_catalog.pg_attribute WHERE attrelid = pg_catalog.to_regclass(%s) "
                    "AND attname = 'n' AND NOT attisdropped)",
                    [self._text(self._changes)] * 2,
                ).fetchone()
                # DDL on the change table only where it is missing (or has no entry numbers):
                # its locks would wait for every writer in progress, whose triggers write to it
                if not (exists and numbered):
                    self._create_changes(conn, drop=exists)
                changes = conn.execute(pgw.qualified_sql(self._text(self._changes))).fetchone()[0]
                seq = conn.execute(pgw.qualified_sql(self._text(self._changes_seq))).fetchone()[0]
                function = self._text(self._changes_function)
                body = self._function_body(changes, seq)
                current = conn.execute(
                    "SELECT prosrc FROM pg_catalog.pg_proc WHERE oid = "
                    "pg_catalog.to_regprocedure(%s)",
                    [function + "()"],
                ).fetchone()
                if current is None or current[0] != body:
                    conn.execute(
                        f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger "
                        "LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp "
                        f"AS {pgw.literal(body)}"
                    )
                present = {
                    name
                    for (name,) in conn.execute(
                        "SELECT tgname FROM pg_catalog.pg_trigger WHERE tgrelid = "
                        "pg_catalog.to_regclass(%s) AND tgenabled = 'A' AND tgfoid = "
                        "pg_catalog.to_regprocedure(%s)",
                        [base, function + "()"],
                    ).fetchall()
                }
                events = (
                    ("INSERT", "NEW TABLE AS topk_new"),
                    ("UPDATE", "OLD TABLE AS topk_old NEW TABLE AS topk_new"),
                    ("DELETE", "OLD TABLE AS topk_old"),
                )
                for name, (event, referencing) in zip(self.change_triggers, events, strict=True):
                    if name in present:
                        continue
                    quoted = '"' + name.replace('"', '""') + '"'
                    conn.execute(f"DROP TRIGGER IF EXISTS {quoted} ON {relation}")
                    conn.execute(
                        f"CREATE TRIGGER {quoted} AFTER {event} ON {relation} REFERENCING "
                        f"{referencing} FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
                    )
                    conn.execute(f"ALTER TABLE {relation} ENABLE ALWAYS TRIGGER {quoted}")
        except psycopg.errors.InsufficientPrivilege:
            return  # the write log's trigger says so in its own warning

    def _create_changes(self, conn: psycopg.Connection[Any], *, drop: bool) -> None:
        """The change table (made anew where `drop`: one without entry numbers) and its two
        indexes, in the caller's savepoint."""
        if drop:
            conn.execute(sql.SQL("DROP TABLE {}").format(self._changes))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} AS SELECT NULL::xid8 AS xid, 0::bigint AS "
                "ord, {} AS id, {} AS score, 0::bigint AS n FROM {} WITH NO DATA"
            ).format(self._changes, self._id, self._score, self._base)
        )
        conn.execute(
            sql.SQL("ALTER TABLE {} ALTER n SET DEFAULT nextval({})").format(
                self._changes, sql.Literal(self._text(self._changes_seq))
            )
        )
        for suffix, column in (("id", "id"), ("n", "n")):
            conn.execute(
                sql.SQL("CREATE INDEX {} ON {} ({})").format(
                    sql.Identifier(f"{self._changes_index}_{suffix}"),
                    self._changes,
                    sql.Identifier(column),
                )
            )

    def _stamp_changes(self, conn: psycopg.Connection[Any]) -> str:
        """In the copy's transaction: the stamp's third line (the change log's digest, empty
        where there is no change log), after deleting the entries this snapshot sees."""
        digest = conn.execute("SELECT " + self._changes_state_sql()).fetchone()[0]
        if digest is None:
            return ""
        conn.execute(
            sql.SQL(
                "DELETE FROM {} WHERE pg_catalog.pg_visible_in_snapshot(xid, "
                "pg_catalog.pg_current_snapshot())"
            ).format(self._changes)
        )
        return f"{CHANGES_TAG} {digest}"

    def _uninstall_changes(self, conn: psycopg.Connection[Any]) -> None:
        """The change log's triggers, function, table and sequence."""
        base = self._text(self._base)
        if conn.execute("SELECT to_regclass(%s) IS NOT NULL", [base]).fetchone()[0]:
            for name in self.change_triggers:
                conn.execute(
                    sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(
                        sql.Identifier(name), self._base
                    )
                )
        conn.execute(sql.SQL("DROP FUNCTION IF EXISTS {}()").format(self._changes_function))
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._changes))
        conn.execute(sql.SQL("DROP SEQUENCE IF EXISTS {}").format(self._changes_seq))

    # ----- the run ---------------------------------------------------------------------------
    def _unseen_sql(self, alias: str) -> str:
        """The entries of `alias` written by transactions the copy's snapshot does not see
        (pg_visible_in_snapshot's rule, on the snapshot's fields passed as parameters)."""
        return (
            f"{alias}.xid >= %(xmin)s::xid8 AND ({alias}.xid >= %(xmax)s::xid8 "
            f"OR {alias}.xid = ANY(%(xip)s::xid8[]))"
        )

    def _grouped_sql(self) -> str:
        """The changed ids since the copy (NULL ids left out): (id, ord of the last entry, its
        score, ord of the first), by a hash aggregate and a hash join back to the last entry
        ((id, ord) names one entry)."""
        changes = self._text(self._changes)
        return (
            "SELECT g.id, g.last AS ord, c.score, g.first FROM (SELECT c.id, max(c.ord) AS last, "
            f"min(c.ord) AS first FROM {changes} c WHERE {self._unseen_sql('c')} "
            f"GROUP BY c.id) g JOIN {changes} c ON c.id = g.id AND c.ord = g.last"
        )

    @staticmethod
    def _snapshot_params(snapshot: tuple[int, int, list[int]]) -> dict[str, Any]:
        xmin, xmax, xip = snapshot
        return {"xmin": str(xmin), "xmax": str(xmax), "xip": [str(x) for x in xip]}

    def _around_state(
        self, cur: psycopg.Cursor[Any], stored: str | None, m_copy: int
    ) -> AroundState | None:
        """The facts of reading around (one query), or None where the copy cannot be read
        around: no change log stamped with it, the catalog facts changed since, a NULL id or a
        score that is not a finite count >= 0 among the changes."""
        lines = (stored or "").split("\n")
        if len(lines) < 3 or not lines[2].startswith(CHANGES_TAG + " "):
            return None
        snapshot = parse_snapshot(lines[1])
        if snapshot is None:
            return None
        # for this transaction: the grouping in memory (4 MB spills 10^5 ids to disk), and
        # no parallel workers (on a small machine they cost more than they share)
        cur.execute(
            "SELECT pg_catalog.set_config('work_mem', %s, true), "
            "pg_catalog.set_config('max_parallel_workers_per_gather', '0', true)",
            [WORK_MEM],
        )
        changes, unseen = self._text(self._changes), self._unseen_sql("c")
        score = "g.score::float8"
        good = f"coalesce({score} >= 0 AND {score} < 'Infinity'::float8, false)"
        query = (
            f"WITH g AS MATERIALIZED ({self._grouped_sql()}) "
            f"SELECT {self._changes_state_sql()}, {self._state_text()}, "
            f"(SELECT count(*) FROM g), (SELECT count(*) FROM {self._text(self._changes)} c "
            f"WHERE c.id IS NULL AND {self._unseen_sql('c')}), "
            "(SELECT count(*) FROM g WHERE mod(g.first, 2) = 0), "
            "(SELECT count(*) FROM g WHERE mod(g.ord, 2) = 1), "
            f"(SELECT count(*) FROM g WHERE mod(g.ord, 2) = 1 AND NOT {good}), "
            f"(SELECT max({score}) FROM g WHERE mod(g.ord, 2) = 1), "
            f"(SELECT min(c.n) FROM {changes} c WHERE {unseen}), "
            f"(SELECT max(c.n) FROM {changes} c WHERE {unseen}), "
            f"(SELECT count(*) FROM {changes} c WHERE c.n IS NULL AND {unseen})"
        )
        row = cur.execute(query, self._snapshot_params(snapshot)).fetchone()
        digest, state, changed, null_ids, in_copy, present, bad, top, low, high, unnumbered = row
        if digest is None or lines[2] != f"{CHANGES_TAG} {digest}":
            return None
        if state is None or lines[1].split(" ")[2] != state or null_ids or bad or unnumbered:
            return None
        span = 0 if low is None else int(high) - int(low) + 1
        return AroundState(
            snapshot,
            m_copy,
            int(changed),
            int(in_copy),
            int(present),
            float(top or 0.0),
            int(low or 0),
            span,
        )

    def _around_oneshot(self, state: AroundState, noise: KeyedNoise, k: int) -> Rows:
        """The in-store one-shot over the copy with the changed rows beside it (module
        docstring), best first, ties by smaller position, in one query. A changed item's row is
        the last entry of its id, a new row (`current`); its position m_copy + n - n_min."""
        ranks, changes = self._text(self._ranks), self._text(self._changes)
        digits = (
            "(('x' || encode(substring(sha256((%(key)s || ':' || {p}.position)::bytea) "
            "FROM 1 FOR 7), 'hex'))::bit(56)::bigint >> 4)::float8"
        )

        def value(alias: str) -> str:
            keyed = noise.sql(uniform_from_hex_sql(digits.format(p=alias)))
            return f"{capped_sql(alias + '.score', noise.score_cap)} + coalesce(e.z, {keyed})"

        # probes of the change table's indexes on id: one per candidate row
        unchanged = (
            f"NOT EXISTS (SELECT 1 FROM {changes} c WHERE c.id = r.id AND {self._unseen_sql('c')})"
        )
        current = (
            f"mod(c.ord, 2) = 1 AND {self._unseen_sql('c')} AND NOT EXISTS (SELECT 1 FROM "
            f"{changes} d WHERE d.id = c.id AND d.ord > c.ord AND {self._unseen_sql('d')})"
        )
        entry = "%(m)s + c.n - %(first)s"
        bound = float(noise.bound)
        mid = "(b.lo + b.hi) / 2"
        above = f"(SELECT s.score FROM {ranks} s WHERE s.rank = {mid}) >= (SELECT low FROM cut)"
        query = (
            "WITH RECURSIVE e(position, z) AS MATERIALIZED (SELECT * FROM unnest("
            "%(positions)s::bigint[], %(noises)s::float8[])), "
            "known AS MATERIALIZED ("
            f"SELECT r.rank AS position, r.id AS id, r.score AS score FROM {ranks} r "
            f"JOIN e ON r.rank = e.position WHERE {unchanged} "
            f"UNION (SELECT r.rank, r.id, r.score FROM {ranks} r WHERE {unchanged} "
            "ORDER BY r.rank LIMIT %(k)s) "
            f"UNION SELECT {entry}, c.id, c.score::float8 FROM e JOIN {changes} c "
            f"ON c.n = e.position - %(m)s + %(first)s WHERE e.position >= %(m)s AND {current}), "
            "cut AS (SELECT CASE WHEN count(*) < %(k)s THEN '-Infinity'::float8 ELSE "
            f"min(b.v) - {bound!r} - 1e-12 * abs(min(b.v)) END AS low FROM "
            f"(SELECT {value('n')} AS v FROM known n LEFT JOIN e ON e.position = n.position "
            "ORDER BY 1 DESC LIMIT %(k)s) b), "
            "prefix(lo, hi) AS (SELECT CAST(0 AS BIGINT), CAST(%(m)s AS BIGINT) "
            f"UNION ALL SELECT CASE WHEN {above} THEN {mid} + 1 ELSE b.lo END, "
            f"CASE WHEN {above} THEN b.hi ELSE {mid} END FROM prefix b WHERE b.lo < b.hi), "
            "cand AS (SELECT position, id, score FROM known "
            f"UNION SELECT r.rank, r.id, r.score FROM {ranks} r WHERE r.rank < "
            "(SELECT min(hi) FROM prefix) AND r.score >= (SELECT low FROM cut) "
            f"AND {unchanged} "
            f"UNION SELECT {entry}, c.id, c.score::float8 FROM {changes} c "
            f"WHERE c.score::float8 >= (SELECT low FROM cut) AND {current}) "
            f"SELECT c.position, c.id, c.score FROM cand c LEFT JOIN e ON e.position = "
            f"c.position ORDER BY {value('c')} DESC, c.position ASC LIMIT %(k)s"
        )
        params = self._snapshot_params(state.snapshot) | {
            "key": noise.key,
            "k": int(k),
            "m": int(state.m_copy),
            "first": int(state.first_entry),
            "positions": int_array_literal(noise.exceed_positions),
            "noises": float_array_literal(noise.exceed_noises),
        }
        with self._reading() as cur:  # type: ignore[attr-defined]
            records = cur.execute(query, params).fetchall()
        # positions 0..k-1, as the table's one-shot returns (the run's positions go past m)
        return Rows(
            np.arange(len(records), dtype=np.int64),
            id_array([r[1] for r in records]),
            np.array([r[2] for r in records], dtype=np.float64),
        )
