"""PostgreSQL's part of SQLAlchemyTable(mode="live") (adapters/dialects/live_sql.py): indexes
built CONCURRENTLY (an invalid leftover of a failed build dropped first), statement triggers over
transition tables, a list bound as one array (`= ANY(:list)`), ANALYZE after prepare(), and
EXPLAIN with sequential scans disabled for check().

Triggers: INSERT and DELETE are statement triggers over the transition tables, so that a
statement touching d items updates the count row once and the position table in O(d log d) (a
row trigger would leave d dead versions of the count row for each later row of the transaction
to step over: quadratic). A statement's d new items take positions n..n+d-1 in the order it
inserted them; its d deleted items' holes below n - d are filled, in position order, by the items
left at or above n - d. An UPDATE of the id is a row trigger (a delete and an insert); TRUNCATE
empties both tables. All four are enabled ALWAYS (fired under session_replication_role =
replica too). Concurrent item inserts and deletes are serialized by the count row's lock, taken
first; a writer in REPEATABLE READ or SERIALIZABLE whose item write races another gets a
serialization error. The position table is filled and the triggers installed under a SHARE ROW
EXCLUSIVE lock on the table: writers wait one pass over the ids, readers go on.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection, Engine

from adapters._sql import may_hide_statistics_sql

from ..live_sql import LiveSQL
from . import MAX_ID_BYTES

EVENTS = ("ins", "del", "upd", "trunc")


class PostgresLive(LiveSQL):
    """PostgreSQL (module docstring)."""

    statistics_views = True

    def byte_order(self, t: Any, column: Any) -> Any:
        return column.collate("C")

    def not_finite(self, score: Any) -> Any:
        """PostgreSQL orders NaN above every number and treats NaN = NaN as true."""
        return sa.cast(score, sa.Double).in_([math.nan, math.inf, -math.inf])

    def id_length_limit(self, column: Any) -> tuple[Any, int, str] | None:
        """The engine's bound (MAX_ID_BYTES: a B-tree entry with room to spare)."""
        return sa.func.octet_length(column), MAX_ID_BYTES, "bytes"

    def explain(self, conn: Connection, statement: str) -> tuple[bool, str]:
        plan = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement).scalar_one()
        scans = sorted(set(seq_scans(plan if isinstance(plan, list) else json.loads(plan))))
        return bool(scans), (f"sequential scan of {', '.join(scans)}" if scans else "index scan")

    def snapshot_connection(self, conn: Connection) -> Connection:
        return conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)

    def statistics_role(self, engine: Engine) -> tuple[bool, str]:
        """One catalog query: whether the role may set track_counts, and its name."""
        with engine.connect() as conn:
            major, minor = (conn.dialect.server_version_info or (0, 0))[:2]
            allowed, role = conn.exec_driver_sql(
                may_hide_statistics_sql(major * 10000 + minor)
            ).one()
        return bool(allowed), str(role)

    def comment_query(self, engine: Engine, table: str, schema: str | None) -> Any:
        preparer = engine.dialect.identifier_preparer
        name = preparer.quote(table)
        qualified = name if schema is None else f"{preparer.quote_schema(schema)}.{name}"
        return sa.text("SELECT obj_description(to_regclass(:t), 'pg_class')").bindparams(
            t=qualified
        )

    def analyzes(self, t: Any) -> bool:
        return True

    def before_index(self, conn: Connection, t: Any, name: Any) -> None:
        """Drop an invalid index of that name (left by a failed CREATE INDEX CONCURRENTLY)."""
        preparer = t.engine.dialect.identifier_preparer
        schema = t._pos.schema
        qualified = preparer.quote(str(name))
        if schema is not None:
            qualified = f"{preparer.quote_schema(schema)}.{qualified}"
        valid = conn.execute(
            sa.text("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:name)"),
            {"name": qualified},
        ).scalar()
        if valid is False:
            conn.exec_driver_sql(f"DROP INDEX CONCURRENTLY {qualified}")

    def function(self, t: Any) -> str:
        """The trigger function's qualified, quoted name."""
        preparer = t.engine.dialect.identifier_preparer
        return t._schema_prefix() + preparer.quote(f"{t._trigger_prefix}_sync")

    def install(self, t: Any) -> None:
        n = t._names()
        function = self.function(t)
        pos, count, position, ident = n["pos"], n["count"], n["position"], n["id"]
        body = f"""
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $topk$
DECLARE
    v_hole bigint;
    v_last bigint;
    v_count bigint;
    v_gone bigint[];
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        UPDATE {count} SET n = 0;
        DELETE FROM {pos};
    ELSIF TG_LEVEL = 'STATEMENT' AND TG_OP = 'INSERT' THEN
        SELECT count(*) INTO v_count FROM new_rows;
        IF v_count > 0 THEN
            UPDATE {count} SET n = n + v_count RETURNING n - v_count INTO v_last;
            INSERT INTO {pos} ({position}, id)
                SELECT v_last + row_number() OVER () - 1, {ident} FROM new_rows;
        END IF;
    ELSIF TG_LEVEL = 'STATEMENT' AND TG_OP = 'DELETE' THEN
        SELECT n INTO v_last FROM {count} FOR UPDATE;
        WITH gone AS (
            DELETE FROM {pos} p USING old_rows o WHERE p.id = o.{ident} RETURNING p.{position}
        )
        SELECT array_agg({position}) INTO v_gone FROM gone;
        IF v_gone IS NOT NULL THEN
            v_count := v_last - cardinality(v_gone);
            -- The items left at positions >= the new count fill the holes below it, in order.
            UPDATE {pos} p SET {position} = moves.hole
            FROM (
                SELECT tail.{position} AS old, holes.hole
                FROM (
                    SELECT {position}, row_number() OVER (ORDER BY {position}) AS r
                    FROM {pos} WHERE {position} >= v_count
                ) tail
                JOIN (
                    SELECT hole, row_number() OVER (ORDER BY hole) AS r
                    FROM unnest(v_gone) AS hole WHERE hole < v_count
                ) holes USING (r)
            ) moves
            WHERE p.{position} = moves.old;
            UPDATE {count} SET n = v_count;
        END IF;
    ELSE  -- a row whose id changed: delete, then insert
        UPDATE {count} SET n = n - 1 RETURNING n INTO v_last;
        DELETE FROM {pos} WHERE id = OLD.{ident} RETURNING {position} INTO v_hole;
        IF v_hole IS NULL THEN
            UPDATE {count} SET n = n + 1;
        ELSIF v_hole <> v_last THEN
            UPDATE {pos} SET {position} = v_hole WHERE {position} = v_last;
        END IF;
        UPDATE {count} SET n = n + 1 RETURNING n - 1 INTO v_last;
        INSERT INTO {pos} ({position}, id) VALUES (v_last, NEW.{ident});
    END IF;
    RETURN NULL;
END
$topk$"""
        table = n["table"]
        triggers = {
            "ins": f"AFTER INSERT ON {table} REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT",
            "del": f"AFTER DELETE ON {table} REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT",
            "upd": f"AFTER UPDATE OF {ident} ON {table} FOR EACH ROW "
            f"WHEN (OLD.{ident} IS DISTINCT FROM NEW.{ident})",
            "trunc": f"AFTER TRUNCATE ON {table} FOR EACH STATEMENT",
        }
        with t.engine.begin() as conn:
            # Writers wait until the positions and the triggers are in place; readers go on.
            conn.exec_driver_sql(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE")
            t._create_position_tables(conn)
            t._fill_positions(conn)
            conn.exec_driver_sql(body)
            for event, when in triggers.items():
                name = t._trigger(event)
                conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {name} ON {table}")
                conn.exec_driver_sql(f"CREATE TRIGGER {name} {when} EXECUTE FUNCTION {function}()")
                # fired under session_replication_role = replica too (logical replication
                # subscribers, pg_restore): positions must follow every write
                conn.exec_driver_sql(f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {name}")

    def drop_triggers(self, conn: Connection, t: Any) -> None:
        """The four triggers (on the table, where it exists) and the trigger function."""
        if sa.inspect(conn).has_table(t.table_name, schema=t._pos.schema):
            table = t._quoted(t._source)
            for event in EVENTS:
                conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {t._trigger(event)} ON {table}")
        conn.exec_driver_sql(f"DROP FUNCTION IF EXISTS {self.function(t)}()")

    def one_of(self, column: Any, name: str, type_: sa.types.TypeEngine[Any]) -> Any:
        """`= ANY(array)`: one parameter, about half the time of an IN list of a thousand."""
        return column == sa.any_(sa.bindparam(name, type_=postgresql.ARRAY(type_)))

    def before_explain(self, conn: Connection) -> None:
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")  # for this transaction only


def seq_scans(plan: Any) -> Iterator[str]:
    """Relations read by a sequential scan anywhere in an EXPLAIN (FORMAT JSON) plan."""
    if isinstance(plan, list):
        for entry in plan:
            yield from seq_scans(entry)
    elif isinstance(plan, dict):
        if plan.get("Node Type") == "Seq Scan":
            yield str(plan.get("Relation Name"))
        for value in plan.values():
            if isinstance(value, list | dict):
                yield from seq_scans(value)
