"""PostgreSQL's change log, which a stale copy is read around (adapters/sql/around.py).

On a plain table (no partitions, no inheritance children) with an immediate unique B-tree on
exactly the id column, three statement-level triggers with transition tables (INSERT, UPDATE,
DELETE) append, per statement, every old row as (xid, 2 s, id, NULL) and every new row as
(xid, 2 s + 1, id, score), s one value of a sequence drawn by the statement's trigger, each
entry numbered n from the same sequence, and one row per statement to its tally (old rows, new
rows, new rows with a bad score, the largest new score). The table `topk_<digest>_changes`
holds the entries, with B-trees on id, on n and on the new rows' scores; the tally is
`topk_<digest>_changes_tally`. Writers need no right on them (the function is SECURITY
DEFINER, search_path pg_catalog).

Why the last entry of an id is its current row. Two writes to one id in different
transactions are ordered by the row lock or by the unique index (an insert waits for the
transaction that deleted or holds a conflicting row; the index is immediate, so the wait is at
the statement, not at commit), so the later writer's trigger draws its sequence value after
the earlier writer committed. Within a statement, new rows come after old ones. So among the
entries of transactions the copy's snapshot does not see and the run's snapshot sees, the
entry of largest order is each changed id's current row (a new row: present, with that score;
an old one: deleted), and the entry of smallest order tells whether the copy held the id. An
id's entries alternate old, new (a row leaves the table, a row enters it), so new rows minus
old rows, summed over the tally, is the change in m. The copy stamp's third line holds a
digest of what this rests on (the triggers' rows and their function, the change table, its
sequence, the tally, the unique index), checked by the run.

Everything here is SQL text, names and literals quoted by the dialect; the copy's snapshot's
fields (xmin, xmax, xip) are parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .writes import STAMP_TAG, UNPROVABLE, literal, qualified_sql

CHANGES_TAG = "topk-changes-v1"
WORK_MEM = "64MB"  # of the run's transaction, where it reads around


@dataclass(frozen=True)
class ChangeNames:
    """The change log's objects of one copy, quoted (qualified where they take a schema)."""

    base: str  # the table
    id: str  # its id column, quoted
    score: str
    id_name: str  # its id column, as the catalog spells it
    changes: str
    seq: str
    function: str
    index_prefix: str  # unqualified: the change table's indexes are <prefix>_id, _n, _score
    triggers: tuple[str, str, str]  # INSERT, UPDATE, DELETE (unquoted)
    tally: str = ""  # the statements' tally (one row per statement), qualified


def parse_snapshot(stamp: str) -> tuple[int, int, list[int]] | None:
    """The snapshot "xmin:xmax:xip,..." of a copy's stamp line, or None if malformed."""
    parts = stamp.split(" ")
    if len(parts) != 3 or parts[0] != STAMP_TAG or parts[2].endswith(UNPROVABLE):
        return None
    fields = parts[1].split(":")
    if len(fields) != 3 or not all(f.isdigit() for f in fields[:2]):
        return None
    xip = [x for x in fields[2].split(",") if x]
    if not all(x.isdigit() for x in xip):
        return None
    return int(fields[0]), int(fields[1]), [int(x) for x in xip]


def snapshot_params(snapshot: tuple[int, int, list[int]]) -> dict[str, object]:
    xmin, xmax, xip = snapshot
    return {"xmin": str(xmin), "xmax": str(xmax), "xip": [str(x) for x in xip]}


def unique_id_index_sql(n: ChangeNames) -> str:
    """Oids of the valid, immediate unique B-trees whose key is exactly the id column, no
    predicate, no expression (comma-separated; NULL where none)."""
    return (
        "(SELECT pg_catalog.string_agg(x.indexrelid::text, ',' ORDER BY x.indexrelid) "
        "FROM pg_catalog.pg_index x JOIN pg_catalog.pg_attribute a ON a.attrelid = "
        "x.indrelid AND a.attnum = x.indkey[0] "
        f"WHERE x.indrelid = pg_catalog.to_regclass({literal(n.base)}) AND x.indisunique "
        "AND x.indimmediate AND x.indisvalid AND x.indnkeyatts = 1 AND x.indpred IS NULL "
        f"AND x.indexprs IS NULL AND a.attname = {literal(n.id_name)})"
    )


def state_sql(n: ChangeNames) -> str:
    """A scalar subquery: the digest of what reading around rests on (module docstring), NULL
    where any part is missing or not in its state."""
    base = literal(n.base)
    names = ", ".join(literal(x) for x in n.triggers)
    ours = (
        f"FROM pg_catalog.pg_trigger tg WHERE tg.tgrelid = pg_catalog.to_regclass({base}) "
        f"AND tg.tgname IN ({names}) AND tg.tgenabled = 'A' AND tg.tgfoid = p.oid)"
    )
    triggers = (
        "(SELECT pg_catalog.string_agg(pg_catalog.concat_ws('/', tg.tgname, tg.oid, tg.xmin), "
        "',' ORDER BY tg.tgname) " + ours
    )
    index = unique_id_index_sql(n)
    return (
        f"(SELECT CASE WHEN (SELECT count(*) {ours} = 3 AND {index} IS NOT NULL THEN "
        "pg_catalog.md5(pg_catalog.concat_ws(':', c.oid, c.relfilenode, q.oid, p.oid, "
        f"p.xmin, {triggers}, {index}, y.oid, y.relfilenode)) END "
        "FROM pg_catalog.pg_class c, pg_catalog.pg_class q, pg_catalog.pg_proc p, "
        "pg_catalog.pg_class y "
        f"WHERE c.oid = pg_catalog.to_regclass({literal(n.changes)}) "
        f"AND y.oid = pg_catalog.to_regclass({literal(n.tally)}) "
        f"AND q.oid = pg_catalog.to_regclass({literal(n.seq)}) "
        f"AND p.oid = pg_catalog.to_regprocedure({literal(n.function + '()')}))"
    )


def good_sql(score: str) -> str:
    """Whether `score` is a finite count >= 0 (false for NULL and NaN)."""
    value = f"{score}::float8"
    return f"coalesce({value} >= 0 AND {value} < 'Infinity'::float8, false)"


def function_body(n: ChangeNames, changes: str, seq: str, tally: str) -> str:
    """The triggers' function: old rows then new rows of the statement, one sequence value,
    and the statement's tally: old rows, new rows, new rows with a bad score, the largest new
    score."""
    entry = "pg_catalog.pg_current_xact_id()"
    return (
        f"DECLARE s bigint := pg_catalog.nextval({literal(seq)}::pg_catalog.regclass); "
        "a bigint := 0; r bigint := 0; b bigint := 0; t float8; "
        "BEGIN IF TG_OP <> 'INSERT' THEN "
        f"INSERT INTO {changes} (xid, ord, id, score) SELECT {entry}, 2 * s, "
        f"o.{n.id}, NULL FROM topk_old o; GET DIAGNOSTICS r = ROW_COUNT; END IF; "
        "IF TG_OP <> 'DELETE' THEN "
        f"INSERT INTO {changes} (xid, ord, id, score) SELECT {entry}, 2 * s + 1, "
        f"n.{n.id}, n.{n.score} FROM topk_new n; GET DIAGNOSTICS a = ROW_COUNT; "
        f"SELECT count(*) FILTER (WHERE NOT {good_sql('n.' + n.score)}), "
        f"max(n.{n.score}::float8) INTO b, t FROM topk_new n; END IF; "
        f"INSERT INTO {tally} (xid, added, removed, bad, top) VALUES ({entry}, a, r, b, t); "
        "RETURN NULL; END"
    )


def function_statement(n: ChangeNames, body: str) -> str:
    return (
        f"CREATE OR REPLACE FUNCTION {n.function}() RETURNS trigger "
        "LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp "
        f"AS {literal(body)}"
    )


def create_statements(n: ChangeNames, quote: object, drop: bool) -> list[str]:
    """The change table (made anew where `drop`: one without entry numbers) and its indexes."""
    q = quote  # the dialect's quote
    out = [f"DROP TABLE {n.changes}"] if drop else []
    out += [
        f"CREATE TABLE {n.changes} AS SELECT NULL::xid8 AS xid, 0::bigint AS "
        f"ord, {n.id} AS id, {n.score} AS score, 0::bigint AS n FROM {n.base} WITH NO DATA",
        f"ALTER TABLE {n.changes} ALTER n SET DEFAULT nextval({literal(n.seq)})",
    ]
    for suffix in ("id", "n"):
        out.append(
            f"CREATE INDEX {q(f'{n.index_prefix}_{suffix}')} ON {n.changes} ({q(suffix)})"  # type: ignore[operator]
        )
    return out


def tally_statements(n: ChangeNames, quote: object) -> list[str]:
    """The tally (one row per statement) and the change table's index on the scores (the old
    rows' are NULL), where missing. Not a partial index on the new rows: the planner would
    read all of it to test the new-row condition of a probe by n."""
    name = quote(f"{n.index_prefix}_score")  # type: ignore[operator]
    return [
        f"CREATE TABLE IF NOT EXISTS {n.tally} (xid xid8, added bigint, removed bigint, "
        "bad bigint, top float8)",
        f"CREATE INDEX IF NOT EXISTS {name} ON {n.changes} ((score::float8))",
    ]


EVENTS = (
    ("INSERT", "NEW TABLE AS topk_new"),
    ("UPDATE", "OLD TABLE AS topk_old NEW TABLE AS topk_new"),
    ("DELETE", "OLD TABLE AS topk_old"),
)


def trigger_statements(n: ChangeNames, relation: str, name: str, event: str, refs: str) -> list:
    quoted = '"' + name.replace('"', '""') + '"'
    return [
        f"DROP TRIGGER IF EXISTS {quoted} ON {relation}",
        f"CREATE TRIGGER {quoted} AFTER {event} ON {relation} REFERENCING {refs} "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {n.function}()",
        f"ALTER TABLE {relation} ENABLE ALWAYS TRIGGER {quoted}",
    ]


def unseen_sql(alias: str) -> str:
    """The entries of `alias` written by transactions the copy's snapshot does not see
    (pg_visible_in_snapshot's rule, on the snapshot's fields passed as parameters)."""
    return (
        f"{alias}.xid >= CAST(:xmin AS xid8) AND ({alias}.xid >= CAST(:xmax AS xid8) "
        f"OR {alias}.xid = ANY(CAST(:xip AS xid8[])))"
    )


def facts_sql(n: ChangeNames, proof_state: str) -> str:
    """The facts of reading around, one query: the change log's digest, the write log's
    state, the entries logged, those with a NULL id, the old rows and the new rows among them,
    new rows with a bad score, the largest new score, the span of entry numbers and unnumbered
    entries. The counts are sums over the statements' tally (one row per statement), the rest
    probes of the change table's B-trees: no entry is read. An id's entries alternate old, new
    (an old row leaves the table, a new one enters it; module docstring), so new rows minus
    old rows is the change in m: present now minus held by the copy, summed over the ids."""
    unseen = unseen_sql("c")
    return (
        f"SELECT {state_sql(n)}, {proof_state}, s.removed + s.added, "
        f"(SELECT count(*) FROM {n.changes} c WHERE c.id IS NULL AND {unseen}), "
        "s.removed, s.added, s.bad, s.top, "
        f"(SELECT min(c.n) FROM {n.changes} c WHERE {unseen}), "
        f"(SELECT max(c.n) FROM {n.changes} c WHERE {unseen}), "
        f"(SELECT count(*) FROM {n.changes} c WHERE c.n IS NULL AND {unseen}) "
        "FROM (SELECT coalesce(sum(c.removed), 0) AS removed, coalesce(sum(c.added), 0) AS "
        "added, coalesce(sum(c.bad), 0) AS bad, max(c.top) AS top "
        f"FROM {n.tally} c WHERE {unseen}) s"
    )


def settings_sql(n: ChangeNames) -> str:
    """For the run's transaction: sorts in memory, no parallel workers (on a small machine
    they cost more than they share), and no JIT: the change table's row estimates are far off
    (it fills between ANALYZEs), and a plan priced above jit_above_cost spent 1.9 s of a 4.2 s
    one-shot compiling at m = 10^7 (benchmarks/sizes.py). Its last column: whether the change
    table and the tally exist (the facts' query names them; without them it would fail)."""
    return (
        f"SELECT pg_catalog.set_config('work_mem', {literal(WORK_MEM)}, true), "
        "pg_catalog.set_config('max_parallel_workers_per_gather', '0', true), "
        "pg_catalog.set_config('jit', 'off', true), "
        f"pg_catalog.to_regclass({literal(n.changes)}) IS NOT NULL "
        f"AND pg_catalog.to_regclass({literal(n.tally)}) IS NOT NULL"
    )


def oneshot_settings_sql() -> str:
    """Before the one-shot: no sequential scan where an index serves (the change table's
    score B-tree for the changed rows above the cut; its row estimates are far off), returning
    the setting it replaces (`restore_sql`)."""
    return (
        "SELECT pg_catalog.current_setting('enable_seqscan'), "
        "pg_catalog.set_config('enable_seqscan', 'off', true)"
    )


def restore_sql() -> str:
    return "SELECT pg_catalog.set_config('enable_seqscan', :value, true)"


def oneshot_sql(n: ChangeNames, ranks: str, noise_sql: str, bound: float, cap_sql: object) -> str:
    """The in-store one-shot over the copy with the changed rows beside it, best first, ties by
    smaller position, in one query. `noise_sql` is a format string of the keyed noise over
    `{p}.position`; `cap_sql(expr)` the capped score. A changed item's row is the last entry
    of its id, a new row (`current`); its position m_copy + n - n_min.

    Every lookup of the change table is a scalar subquery or a LATERAL one with LIMIT 1, which
    the planner keeps as a probe of the id (or n) B-tree per outer row: its estimates of the
    change table are far off (it fills between ANALYZEs), and as anti joins it hashed or sorted
    every entry (10^6 at m = 10^7) to test the few rows a run looks at. The change table is
    scanned only where the cut is at most :top, the largest new score logged (else no changed
    row can be a candidate). Cost: O(k + exceedances + rows above the cut) probes, plus one
    pass over the entries where the cut is at most :top."""

    def value(alias: str) -> str:
        return f"{cap_sql(alias + '.score')} + coalesce(e.z, {noise_sql.format(p=alias)})"  # type: ignore[operator]

    def probe(alias: str, where: str) -> str:
        return f"(SELECT 1 FROM {n.changes} {alias} WHERE {where} LIMIT 1) IS NULL"

    unchanged = probe("c", f"c.id = r.id AND {unseen_sql('c')}")
    current = f"mod(c.ord, 2) = 1 AND {unseen_sql('c')} AND " + probe(
        "d", f"d.id = c.id AND d.ord > c.ord AND {unseen_sql('d')}"
    )
    entry = ":m + c.n - :first"
    mid = "(b.lo + b.hi) / 2"
    above = f"(SELECT s.score FROM {ranks} s WHERE s.rank = {mid}) >= (SELECT low FROM cut)"
    return (
        "WITH RECURSIVE e(position, z) AS MATERIALIZED (SELECT * FROM unnest("
        "CAST(:positions AS bigint[]), CAST(:noises AS float8[]))), "
        "known AS MATERIALIZED ("
        f"SELECT r.rank AS position, r.id AS id, r.score AS score FROM {ranks} r "
        f"JOIN e ON r.rank = e.position WHERE {unchanged} "
        f"UNION (SELECT r.rank, r.id, r.score FROM {ranks} r WHERE {unchanged} "
        "ORDER BY r.rank LIMIT :k) "
        "UNION SELECT x.position, x.id, x.score FROM e CROSS JOIN LATERAL "
        f"(SELECT {entry} AS position, c.id, c.score::float8 AS score FROM {n.changes} c "
        f"WHERE c.n = e.position - :m + :first AND {current} LIMIT 1) x "
        "WHERE e.position >= :m), "
        "cut AS (SELECT CASE WHEN count(*) < :k THEN '-Infinity'::float8 ELSE "
        f"min(b.v) - {float(bound)!r} - 1e-12 * abs(min(b.v)) END AS low FROM "
        f"(SELECT {value('n')} AS v FROM known n LEFT JOIN e ON e.position = n.position "
        "ORDER BY 1 DESC LIMIT :k) b), "
        "prefix(lo, hi) AS (SELECT CAST(0 AS BIGINT), CAST(:m AS BIGINT) "
        f"UNION ALL SELECT CASE WHEN {above} THEN {mid} + 1 ELSE b.lo END, "
        f"CASE WHEN {above} THEN b.hi ELSE {mid} END FROM prefix b WHERE b.lo < b.hi), "
        "cand AS (SELECT position, id, score FROM known "
        f"UNION SELECT r.rank, r.id, r.score FROM {ranks} r WHERE r.rank < "
        "(SELECT min(hi) FROM prefix) AND r.score >= (SELECT low FROM cut) "
        f"AND {unchanged} "
        f"UNION SELECT {entry}, c.id, c.score::float8 FROM {n.changes} c "
        "WHERE (SELECT low FROM cut) <= CAST(:top AS float8) "
        f"AND c.score::float8 >= (SELECT low FROM cut) AND {current}) "
        f"SELECT c.position, c.id, c.score FROM cand c LEFT JOIN e ON e.position = "
        f"c.position ORDER BY {value('c')} DESC, c.position ASC LIMIT :k"
    )


__all__ = [
    "CHANGES_TAG",
    "ChangeNames",
    "facts_sql",
    "oneshot_sql",
    "parse_snapshot",
    "snapshot_params",
    "state_sql",
]


def install(driver: Any, n: ChangeNames, relations: list[Any], quote: Any) -> None:
    """In prepare()'s first transaction (before the copy's snapshot, as the write log's
    trigger): the change table, its sequence, the function and the three triggers, where the
    table is one plain relation with an immediate unique B-tree on the id. Without the right
    to create them, nothing: runs read the table instead (the write log's warning says so).
    DDL on the change table only where it is missing (or has no entry numbers): its locks
    would wait for every writer in progress, whose triggers write to it."""
    if len(relations) != 1 or relations[0][1] != "r":
        return
    if driver.scalar("SELECT " + unique_id_index_sql(n)) is None:
        return
    relation = relations[0][0]
    try:
        with driver.savepoint():
            driver.execute(f"CREATE SEQUENCE IF NOT EXISTS {n.seq}")
            exists, numbered = driver.one(
                "SELECT pg_catalog.to_regclass(:t) IS NOT NULL, EXISTS (SELECT 1 FROM "
                "pg_catalog.pg_attribute WHERE attrelid = pg_catalog.to_regclass(:t) "
                "AND attname = 'n' AND NOT attisdropped)",
                {"t": n.changes},
            )
            if not (exists and numbered):
                for statement in create_statements(n, quote, drop=exists):
                    driver.execute(statement)
            tally, index = tally_statements(n, quote)
            driver.execute(tally)
            changes, seq, tally_name = (
                driver.scalar(qualified_sql(x)) for x in (n.changes, n.seq, n.tally)
            )
            body = function_body(n, changes, seq, tally_name)
            current = driver.one(
                "SELECT prosrc FROM pg_catalog.pg_proc WHERE oid = pg_catalog.to_regprocedure(:f)",
                {"f": n.function + "()"},
            )
            if current is None or current[0] != body:
                # Writers in progress may have fired the function being replaced (entries
                # without a tally row): wait for them, so that every statement a later
                # snapshot does not see fires this body. No writer then holds the change table.
                driver.execute(f"LOCK TABLE {relation} IN SHARE ROW EXCLUSIVE MODE")
                driver.execute(index)
                driver.execute(function_statement(n, body))
            present = {
                name
                for (name,) in driver.execute(
                    "SELECT tgname FROM pg_catalog.pg_trigger WHERE tgrelid = "
                    "pg_catalog.to_regclass(:b) AND tgenabled = 'A' AND tgfoid = "
                    "pg_catalog.to_regprocedure(:f)",
                    {"b": n.base, "f": n.function + "()"},
                )
            }
            for name, (event, refs) in zip(n.triggers, EVENTS, strict=True):
                if name not in present:
                    for statement in trigger_statements(n, relation, name, event, refs):
                        driver.execute(statement)
    except driver.errors as error:
        if driver.sqlstate(error) != "42501":  # insufficient_privilege
            raise


def stamp(driver: Any, n: ChangeNames) -> str:
    """In the copy's transaction: the stamp's third line (the change log's digest, empty where
    there is no change log), after deleting the entries and tally rows this snapshot sees."""
    digest = driver.scalar("SELECT " + state_sql(n))
    if digest is None:
        return ""
    for table in (n.changes, n.tally):
        driver.execute(
            f"DELETE FROM {table} WHERE pg_catalog.pg_visible_in_snapshot(xid, "
            "pg_catalog.pg_current_snapshot())"
        )
    return f"{CHANGES_TAG} {digest}"


def uninstall(driver: Any, n: ChangeNames, quote: Any) -> None:
    """The change log's triggers, function, tables and sequence."""
    if driver.scalar(f"SELECT pg_catalog.to_regclass({literal(n.base)}) IS NOT NULL"):
        for name in n.triggers:
            driver.execute(f"DROP TRIGGER IF EXISTS {quote(name)} ON {n.base}")
    driver.execute(f"DROP FUNCTION IF EXISTS {n.function}()")
    driver.execute(f"DROP TABLE IF EXISTS {n.changes}")
    driver.execute(f"DROP TABLE IF EXISTS {n.tally}")
    driver.execute(f"DROP SEQUENCE IF EXISTS {n.seq}")
