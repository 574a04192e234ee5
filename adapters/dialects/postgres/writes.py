"""The write log that proves a PostgreSQL copy current: the SQL of the engine's
freshness.WriteLog on PostgreSQL, whatever the driver (docs/freshness.md).

A copy (rank table) is current when no write to its table committed after the snapshot the copy
was made in. Each copy has a key (`copy_key`, from its name) and, on its table and on every
table below it (partitions, inheritance children), a statement-level trigger, created
`ENABLE ALWAYS` so that it fires under `session_replication_role = replica` too. The trigger
appends one row (copy key, `pg_current_xact_id()`) to the log table `topk_write_log` per
writing transaction: an INSERT into a table without a unique key, so writers never wait for
each other (no row is shared, no lock but the table's own). `prepare()` stamps the copy with its
snapshot (`pg_current_snapshot()`) and with a digest of the catalog facts the proof relies on
(`state_sql`), and deletes the log rows its snapshot saw. A run proves the copy current iff

* the digest is unchanged: the same relations (no partition attached, detached or added, no
  table dropped and re-created or renamed in), the same storage (`relfilenode`: a rewrite by
  ALTER TABLE .. TYPE, TRUNCATE, VACUUM FULL, CLUSTER changes it), the same trigger row on each
  (its `xmin` changes whenever it is disabled, enabled or replaced, so a write made while it
  was disabled cannot hide behind a re-enable) with the same argument (the copy key it logs
  under: a copy whose key is computed otherwise, say from another spelling of its name, finds
  no log rows of its own and must not take that for no writes), each trigger enabled ALWAYS,
  each relation a table or a partitioned table, none a logical replication target (the apply
  worker fires row triggers only; PostgreSQL documents this in its logical replication
  chapter);
* and no log row of the copy visible to the run was written by a transaction the copy's
  snapshot does not see (the rule of `pg_visible_in_snapshot`): an EXISTS over the log's
  (copy, xid) index from the snapshot's xmin up, which stops at the first such row.

Both are exact under MVCC: a write the run sees committed before the run's snapshot, and its
log row with it; a transaction that began before the copy's snapshot and committed after it is
in that snapshot's in-progress list, so it is caught too. A sequence or a counter would be
neither (a sequence is not transactional; a counter row makes writers queue on it).

The trigger function is SECURITY DEFINER (owned by whoever ran `prepare()`, with a fixed
search_path), so writers need no right on the log table. Its name and the trigger's are fixed
per schema and per copy; everything here is plain SQL text with names and literals quoted by
the caller's quoting (`literal`), executed without parameters.
"""

from __future__ import annotations

import hashlib

LOG_TABLE = "topk_write_log"
LOG_FUNCTION = "topk_log_write"
STAMP_TAG = "topk-writes-v2"
UNPROVABLE = "!"  # the last character of a digest whose facts cannot prove a copy current


def literal(text: str) -> str:
    """A PostgreSQL string literal (standard_conforming_strings: quotes doubled)."""
    return "'" + text.replace("'", "''") + "'"


def copy_key(copy_name: str) -> int:
    """The copy's key in the log: a signed 64-bit hash of its qualified name."""
    return int.from_bytes(hashlib.sha1(copy_name.encode("utf-8")).digest()[:8], "big", signed=True)


def setup_lock_sql() -> str:
    """Serialise, until the transaction ends, the prepares of one database that may create the
    objects all copies share (the log, its index, its function): two creating them at once
    would collide on the catalogs' unique indexes."""
    return f"SELECT pg_catalog.pg_advisory_xact_lock({copy_key('topk_middleware write log')})"


def setup_statements(log: str) -> list[str]:
    """The log table and its index (idempotent, but each takes a lock on the log: run them only
    where `installed_sql` says they are missing). `log` is a quoted name, qualified or found
    through the search_path."""
    return [
        f"CREATE TABLE IF NOT EXISTS {log} (copy bigint NOT NULL, xid xid8 NOT NULL)",
        f"CREATE INDEX IF NOT EXISTS topk_write_log_copy_xid ON {log} (copy, xid)",
    ]


def installed_sql(log: str, function: str) -> str:
    """One row: whether the log table has its index, and the trigger function's body (NULL
    where missing)."""
    return (
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index x JOIN pg_catalog.pg_class i "
        "ON i.oid = x.indexrelid WHERE x.indrelid = pg_catalog.to_regclass("
        + literal(log)
        + ") AND i.relname = 'topk_write_log_copy_xid'), (SELECT p.prosrc FROM "
        "pg_catalog.pg_proc p WHERE p.oid = pg_catalog.to_regprocedure("
        + literal(function + "()")
        + "))"
    )


def qualified_sql(log: str) -> str:
    """The log table's schema-qualified, quoted name (the trigger function's search_path is
    pg_catalog only)."""
    return (
        "SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname) "
        "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        f"WHERE c.oid = pg_catalog.to_regclass({literal(log)})"
    )


def function_body(qualified_log: str) -> str:
    """The trigger function's body: one log row per writing transaction and copy."""
    log = qualified_log
    return (
        "BEGIN "
        f"INSERT INTO {log} (copy, xid) SELECT TG_ARGV[0]::bigint, pg_catalog.pg_current_xact_id() "
        f"WHERE NOT EXISTS (SELECT 1 FROM {log} l WHERE l.copy = TG_ARGV[0]::bigint "
        "AND l.xid = pg_catalog.pg_current_xact_id()); "
        "RETURN NULL; END"
    )


def function_statement(function: str, qualified_log: str) -> str:
    """The trigger function (SECURITY DEFINER, with a search_path of pg_catalog only: writers
    need no right on the log)."""
    return (
        f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql "
        f"SECURITY DEFINER SET search_path = pg_catalog, pg_temp "
        f"AS {literal(function_body(qualified_log))}"
    )


def _tree(base: str) -> str:
    """A recursive CTE `topk_tree(rel)`: the table and every relation below it."""
    return (
        "WITH RECURSIVE topk_tree(rel) AS (SELECT pg_catalog.to_regclass("
        + literal(base)
        + ")::oid UNION ALL SELECT i.inhrelid FROM pg_catalog.pg_inherits i "
        "JOIN topk_tree t ON i.inhparent = t.rel) "
    )


def relations_sql(base: str, trigger: str, function: str, key: int) -> str:
    """Rows (qualified name, relkind, whether the copy's trigger is in place and enabled
    ALWAYS) of the table and the relations below it. `base` and `function` are quoted names as
    text, `trigger` a bare one."""
    args = (str(int(key)).encode("ascii") + b"\x00").hex()  # tgargs: each argument NUL-ended
    return (
        _tree(base) + "SELECT pg_catalog.quote_ident(n.nspname) || '.' || "
        "pg_catalog.quote_ident(c.relname), c.relkind, "
        "coalesce(tg.tgenabled = 'A' AND tg.tgfoid = pg_catalog.to_regprocedure("
        + literal(function + "()")
        + f")::oid AND tg.tgargs = pg_catalog.decode('{args}', 'hex'), false) "
        "FROM topk_tree t JOIN pg_catalog.pg_class c ON c.oid = t.rel "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "LEFT JOIN pg_catalog.pg_trigger tg ON tg.tgrelid = c.oid AND tg.tgname = "
        + literal(trigger)
        + " ORDER BY c.oid"
    )


def state_sql(base: str, trigger: str, function: str) -> str:
    """A scalar subquery: the digest of the catalog facts the proof relies on (module
    docstring), ending in UNPROVABLE where they cannot prove a copy current; NULL where the
    table does not exist."""
    return (
        "(" + _tree(base) + "SELECT pg_catalog.md5(pg_catalog.string_agg(pg_catalog.concat_ws("
        "':', c.oid, c.relkind, c.relfilenode, tg.oid, tg.xmin, tg.tgenabled, tg.tgfoid, "
        "tg.tgargs), ',' "
        "ORDER BY c.oid)) || CASE WHEN bool_and(c.relkind IN ('r', 'p') AND tg.tgenabled "
        "IS NOT DISTINCT FROM 'A' AND tg.tgfoid IS NOT DISTINCT FROM "
        "pg_catalog.to_regprocedure(" + literal(function + "()") + ")::oid) "
        "AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_subscription_rel s "
        "WHERE s.srrelid IN (SELECT rel FROM topk_tree)) THEN '' ELSE "
        + literal(UNPROVABLE)
        + " END FROM topk_tree t JOIN pg_catalog.pg_class c ON c.oid = t.rel "
        "LEFT JOIN pg_catalog.pg_trigger tg ON tg.tgrelid = c.oid AND tg.tgname = "
        + literal(trigger)
        + ")"
    )


def stamp_sql(state: str) -> str:
    """The copy's stamp, as its snapshot sees it: the tag, the snapshot, the digest."""
    return (
        f"{literal(STAMP_TAG + ' ')} || pg_catalog.pg_current_snapshot()::text || ' ' || "
        f"coalesce({state}, {literal(UNPROVABLE)})"
    )


def proof_sql(stamp: str, state: str, log: str, key: int) -> str:
    """A scalar subquery, the stamp where it proves the copy current in the run's snapshot,
    else NULL. `stamp` is SQL text of the stored stamp (the copy's comment line). The copy's
    snapshot "xmin:xmax:xip,..." is read field by field: a log row is invisible to it iff its
    xid >= xmin and (xid >= xmax or xid is in xip), pg_visible_in_snapshot's rule. Every cast
    is guarded (the planner evaluates stable expressions while it estimates, whatever a CASE
    around them says): a stamp of another format proves nothing and breaks no query."""
    field = "pg_catalog.split_part(s.line, ' ', 2)"
    well_formed = f"{field} ~ '^[0-9]{{1,19}}:[0-9]{{1,19}}:([0-9]{{1,19}}(,[0-9]{{1,19}})*)?$'"

    def part(n: int, default: str) -> str:
        value = f"pg_catalog.split_part({field}, ':', {n})"
        return f"(CASE WHEN {well_formed} THEN {value} ELSE '{default}' END)"

    xmin, xmax = f"{part(1, '0')}::xid8", f"{part(2, '0')}::xid8"
    xip = f"pg_catalog.string_to_array(NULLIF({part(3, '')}, ''), ',')::xid8[]"
    return (
        f"(SELECT s.line FROM (SELECT {stamp} AS line) s WHERE CASE "
        f"WHEN pg_catalog.split_part(s.line, ' ', 1) = {literal(STAMP_TAG)} AND {well_formed} "
        f"AND pg_catalog.right(s.line, 1) <> {literal(UNPROVABLE)} "
        f"AND pg_catalog.split_part(s.line, ' ', 3) = {state} "
        f"THEN NOT EXISTS (SELECT 1 FROM {log} l WHERE l.copy = {int(key)} AND l.xid >= {xmin} "
        f"AND (l.xid >= {xmax} OR l.xid = ANY(coalesce({xip}, '{{}}'::xid8[])))) "
        "ELSE false END)"
    )


def cleanup_sql(log: str, key: int) -> str:
    """Delete the copy's log rows that the current snapshot sees (run in the transaction that
    made the copy: those writes are in it)."""
    return (
        f"DELETE FROM {log} WHERE copy = {int(key)} "
        "AND pg_catalog.pg_visible_in_snapshot(xid, pg_catalog.pg_current_snapshot())"
    )


def trigger_statements(relation: str, trigger: str, function: str, key: int) -> list[str]:
    """(Re)create the statement-level trigger of copy `key` on `relation`, ENABLE ALWAYS."""
    name = '"' + trigger.replace('"', '""') + '"'
    return [
        f"DROP TRIGGER IF EXISTS {name} ON {relation}",
        f"CREATE TRIGGER {name} AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {relation} "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {function}({literal(str(int(key)))})",
        f"ALTER TABLE {relation} ENABLE ALWAYS TRIGGER {name}",
    ]


def function_users_sql(function: str) -> str:
    """How many triggers still call the log function."""
    return (
        "SELECT count(*) FROM pg_catalog.pg_trigger WHERE tgfoid = "
        f"pg_catalog.to_regprocedure({literal(function + '()')})"
    )
