"""The position keeper of a live PostgreSQL table: what `prepare()` installs on the user's table
and `uninstall()` drops, and the check that it is whole.

* a B-tree on the table's (score DESC, id) (`COLLATE "C"` for text ids: the canonical order of
  topk_middleware/access.py), and a unique B-tree on id unless the table has one, both with
  CREATE INDEX CONCURRENTLY, so writers are never blocked while they are built. PostgreSQL keeps
  them current on every write;
* a *position table* `<table>_topk_pos (position, id)` with two covering B-trees (position ->
  id, id -> position, both served by index-only scans): positions 0..m-1 are what random access
  and uniform sampling name (access.py, DESIGN invariant 11);
* row triggers on the table that keep positions dense at O(1) per changed item: an inserted item
  takes position m; a deleted item's position is given to the item at position m - 1 (swap-
  remove); a changed id is a delete and an insert; a TRUNCATE empties the position table. Item
  inserts and deletes are serialised by a transaction-level advisory lock (updates of counts take
  no lock and fire no trigger). The trigger reads the last position after taking the lock, which
  only a READ COMMITTED statement sees as it is: an item insert or delete in a REPEATABLE READ or
  SERIALIZABLE transaction is refused with a clear error rather than allowed to misplace one.
  The position table is filled and the triggers created in one transaction that holds a SHARE
  ROW EXCLUSIVE lock on the table for its duration (writers wait those seconds once; readers
  never); the triggers are enabled ALWAYS (fired under session_replication_role = replica too).
* the position table's comment holds a digest of the triggers' catalog rows (`triggers_sql`):
  a trigger disabled, enabled again or replaced since the positions were filled changes it, and
  the next run has them filled again (writes meanwhile may be missing from them).

Names: the position table `<table>_topk_pos` (cut short with a hash past PostgreSQL's 63 bytes),
the B-trees `topk_<digest>_order` and `topk_<digest>_live_id`, the trigger function
`topk_<digest>_positions` and its triggers `..._items`, `..._ids`, `..._truncate`, where the
digest is SHA-1 of (schema, table, id column, score column).
"""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from adapters.dialects.postgres import short_name

TRIGGER_SUFFIXES = ("_items", "_ids", "_truncate")


def name_objects(t: Any) -> None:
    """Set the names of table `t`'s position keeper (module docstring) on it."""
    schema, table = t.schema, t.table
    t.position_table = short_name(table, "_topk_pos")
    digest = hashlib.sha1(
        "\x00".join((schema or "", table, t.id_column, t.score_column)).encode()
    ).hexdigest()[:12]
    t.order_index = f"topk_{digest}_order"
    t.live_id_index = f"topk_{digest}_live_id"
    t.trigger_function = f"topk_{digest}_positions"
    t._lock_key = int(digest[:15], 16)  # advisory lock of item inserts and deletes
    qualify = (
        (lambda n: sql.Identifier(n)) if schema is None else (lambda n: sql.Identifier(schema, n))
    )
    t._pos = qualify(t.position_table)
    t._function = qualify(t.trigger_function)


def _outside_a_transaction(t: Any, what: str) -> psycopg.Connection[Any]:
    conn: psycopg.Connection[Any] = t._conn
    if not conn.autocommit and conn.info.transaction_status != TransactionStatus.IDLE:
        raise RuntimeError(f"{t.where}: {what}() needs a connection outside a transaction")
    return conn


def prepare(t: Any) -> None:
    """Install the B-trees (CONCURRENTLY), then the position table and its triggers if they are
    missing or out of step (one transaction), then VACUUM (ANALYZE) a position table just filled
    (its visibility map set: its B-trees answer alone)."""
    conn = _outside_a_transaction(t, "prepare")
    saved = conn.autocommit
    conn.autocommit = True  # CREATE INDEX CONCURRENTLY cannot run inside a transaction
    try:
        id_key = sql.SQL('{} COLLATE "C"').format(t._id) if t.text_ids else t._id
        conn.execute(
            sql.SQL("CREATE INDEX CONCURRENTLY IF NOT EXISTS {} ON {} ({} DESC, {})").format(
                sql.Identifier(t.order_index), t._base, t._score, id_key
            )
        )
        if not has_unique_id_index(t):
            conn.execute(
                sql.SQL("CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {} ON {} ({})").format(
                    sql.Identifier(t.live_id_index), t._base, t._id
                )
            )
    except psycopg.errors.UniqueViolation:
        raise ValueError(f"{t.where} column {t.id_column!r} has duplicate ids") from None
    finally:
        conn.autocommit = saved
    with conn.transaction():
        installed = positions_installed(t, conn)
        if not installed:
            install(t, conn)
    if not installed:  # set the visibility map: the position B-trees answer alone
        conn.autocommit = True
        try:
            conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(t._pos))
        finally:
            conn.autocommit = saved


def uninstall(t: Any) -> None:
    """Drop the three triggers, their function and the position table (one transaction), then
    the B-tree on (score DESC, id) and the unique B-tree on id if prepare() made it (DROP INDEX
    CONCURRENTLY: writers are not blocked)."""
    conn = _outside_a_transaction(t, "uninstall")
    with conn.transaction():
        base = t._base.as_string(conn)
        if conn.execute("SELECT to_regclass(%s) IS NOT NULL", [base]).fetchone()[0]:
            for suffix in TRIGGER_SUFFIXES:
                name = sql.Identifier(t.trigger_function + suffix)
                conn.execute(sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(name, t._base))
        conn.execute(sql.SQL("DROP FUNCTION IF EXISTS {}()").format(t._function))
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(t._pos))
    saved = conn.autocommit
    conn.autocommit = True  # DROP INDEX CONCURRENTLY cannot run inside a transaction
    try:
        for index in (t.order_index, t.live_id_index):
            name = sql.Identifier(index) if t.schema is None else sql.Identifier(t.schema, index)
            conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(name))
    finally:
        conn.autocommit = saved


def has_unique_id_index(t: Any) -> bool:
    """Whether a valid unique B-tree has exactly the id column as its key."""
    query = (
        "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = "
        "i.indrelid AND a.attnum = i.indkey[0] WHERE i.indrelid = %s::regclass AND "
        "i.indisunique AND i.indisvalid AND i.indnatts = 1 AND i.indexprs IS NULL AND "
        "i.indpred IS NULL AND a.attname = %s)"
    )
    with t._reading() as cur:
        base = t._base.as_string(t._conn)
        return bool(cur.execute(query, [base, t.id_column]).fetchone()[0])


def positions_installed(t: Any, reader: Any) -> bool:
    """The position table and its three triggers are there, as they were when the positions
    were filled (`triggers_sql`)."""
    query = sql.SQL(
        "SELECT to_regclass({pos_name}) IS NOT NULL AND (SELECT count(*) = 3 FROM pg_trigger "
        "WHERE tgrelid = {base_name}::regclass AND tgname LIKE {triggers} "
        "AND NOT tgisinternal) AND {state} IS NOT DISTINCT FROM "
        "obj_description(to_regclass({pos_name}), 'pg_class')"
    ).format(
        pos_name=sql.Literal(t._pos.as_string(t._conn)),
        base_name=sql.Literal(t._base.as_string(t._conn)),
        triggers=sql.Literal(t.trigger_function + "%"),
        state=triggers_sql(t),
    )
    return bool(reader.execute(query).fetchone()[0])


def triggers_sql(t: Any) -> sql.Composable:
    """A digest of the position triggers' catalog rows (each row's xmin changes whenever the
    trigger is disabled, enabled or replaced: a write made meanwhile fired nothing, and the
    positions may have missed it)."""
    return sql.SQL(
        "(SELECT md5(string_agg(concat_ws(':', tgname, xmin, tgenabled), ',' "
        "ORDER BY tgname)) FROM pg_trigger WHERE tgrelid = to_regclass({base_name}) "
        "AND tgname LIKE {triggers} AND NOT tgisinternal)"
    ).format(
        base_name=sql.Literal(t._base.as_string(t._conn)),
        triggers=sql.Literal(t.trigger_function + "%"),
    )


# The trigger function (module docstring): one body for item inserts, deletes, id changes and
# TRUNCATE, serialised by the table's advisory lock.
TRIGGER_BODY = """
DECLARE
  freed bigint;
  last bigint;
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'topk_middleware: items of {where} are inserted and deleted under '
      'READ COMMITTED only (a snapshot older than the lock would misplace positions); '
      'count updates may use any level';
  END IF;
  PERFORM pg_advisory_xact_lock({lock});
  IF TG_OP = 'TRUNCATE' THEN
    DELETE FROM {pos};
    RETURN NULL;
  END IF;
  IF TG_OP IN ('DELETE', 'UPDATE') THEN
    DELETE FROM {pos} WHERE id = OLD.{id} RETURNING position INTO freed;
    SELECT position INTO last FROM {pos} ORDER BY position DESC LIMIT 1;
    IF freed IS NOT NULL AND last IS NOT NULL AND last > freed THEN
      UPDATE {pos} SET position = freed WHERE position = last;
    END IF;
  END IF;
  IF TG_OP IN ('INSERT', 'UPDATE') THEN
    IF NEW.{id} IS NULL THEN
      RAISE EXCEPTION 'topk_middleware: {where} takes no NULL id (a live table names items by id)';
    END IF;
    INSERT INTO {pos} (position, id)
      VALUES (coalesce((SELECT position + 1 FROM {pos} ORDER BY position DESC LIMIT 1), 0),
              NEW.{id});
  END IF;
  RETURN NULL;
END
"""

# (suffix, event, level and condition) of each trigger.
TRIGGERS = (
    ("_items", "AFTER INSERT OR DELETE", "FOR EACH ROW"),
    ("_ids", "AFTER UPDATE OF {id}", "FOR EACH ROW WHEN (OLD.{id} IS DISTINCT FROM NEW.{id})"),
    ("_truncate", "AFTER TRUNCATE", "FOR EACH STATEMENT"),
)


def install(t: Any, conn: psycopg.Connection[Any]) -> None:
    """Position table, filled in id order, and its triggers: one transaction (the caller's)
    holding a SHARE ROW EXCLUSIVE lock on the table, so no write falls in between."""
    conn.execute(sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(t._base))
    id_type = conn.execute(
        "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
        "WHERE a.attrelid = %s::regclass AND a.attname = %s",
        [t._base.as_string(conn), t.id_column],
    ).fetchone()[0]
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(t._pos))
    conn.execute(
        sql.SQL(
            "CREATE TABLE {pos} (position bigint NOT NULL, id {type} NOT NULL, "
            "PRIMARY KEY (position) INCLUDE (id), UNIQUE (id) INCLUDE (position))"
        ).format(pos=t._pos, type=sql.SQL(id_type))
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {pos} (position, id) SELECT row_number() OVER (ORDER BY {id}) - 1, "
            "{id} FROM {base}"
        ).format(pos=t._pos, id=t._id, base=t._base)
    )
    where = t.where.replace("'", "''")
    body = sql.SQL(TRIGGER_BODY).format(
        lock=sql.Literal(t._lock_key), pos=t._pos, id=t._id, where=sql.SQL(where)
    )
    conn.execute(
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS {body}"
        ).format(fn=t._function, body=sql.Literal(body.as_string(conn)))
    )
    for suffix, event, each in TRIGGERS:
        name = sql.Identifier(t.trigger_function + suffix)
        conn.execute(sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(name, t._base))
        conn.execute(
            sql.SQL(
                "CREATE TRIGGER {name} " + event + " ON {base} " + each + " EXECUTE FUNCTION {fn}()"
            ).format(name=name, base=t._base, id=t._id, fn=t._function)
        )
        # fired under session_replication_role = replica too (logical replication
        # subscribers, pg_restore): positions must follow every write
        conn.execute(sql.SQL("ALTER TABLE {} ENABLE ALWAYS TRIGGER {}").format(t._base, name))
    state = conn.execute(sql.SQL("SELECT ") + triggers_sql(t)).fetchone()[0]
    conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(t._pos, sql.Literal(state)))
