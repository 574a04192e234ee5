"""SQLAlchemyTable(..., mode="live"): a run reads the counts table as it is now, no copy.

On dialects whose B-tree indexes serve ORDER BY (PostgreSQL, MariaDB >= 10.8 / MySQL >= 8,
SQLite), the canonical order (score descending, ties by id ascending, text ids in byte order) is
read straight from the user's table through an index on (score DESC, id), so writes to the counts
are seen by the next run without any rebuild. What uniform item sampling needs (Algorithm 3 of
Wu, Ohrimenko, Wirth, ICML 2023, samples a uniformly random unseen item) is a dense *position*
0..m-1 per item (topk_middleware/access.py): a *position table* keeps it.

`prepare()` (once, never again after writes) validates the table and creates:

* on the user's table, a B-tree on (score DESC, id) with the id in byte order (PostgreSQL
  `COLLATE "C"`, SQLite `COLLATE BINARY`; on MariaDB the id column must already be in a binary
  NO PAD collation), built `CONCURRENTLY` on PostgreSQL (writers are never blocked), and a unique
  index on id unless one exists;
* the position table `<table>_topk_pos` (position BIGINT PRIMARY KEY, id UNIQUE), filled with
  positions 0..m-1 in id order, and a one-row count table `<table>_topk_pos_n` (n = m);
* triggers on the user's table that keep both current: AFTER INSERT the new id takes position n;
  AFTER DELETE the item at the last position n - 1 takes the deleted item's position (swap-remove);
  an UPDATE that changes the id is a delete and an insert; an UPDATE of the score needs nothing.
  On PostgreSQL the INSERT and DELETE triggers are statement triggers over the transition tables:
  a statement's d new items take positions n..n+d-1 in the order it inserted them, and its d
  deleted items' holes below n - d are filled, in position order, by the items left at or above
  n - d; the count row is updated once per statement (a row trigger would leave one dead version
  of it per row, which every later row of the transaction steps over: quadratic). PostgreSQL also
  empties both tables on TRUNCATE.

Cost of the scheme: O(1) index operations per inserted or deleted item (O(d log d) per statement
of d items on PostgreSQL), nothing per changed score. Concurrent item inserts and deletes are
serialized by the row lock on the count row, taken first by every trigger (`UPDATE` or `SELECT
... FOR UPDATE`; SQLite has one writer at a time). A PostgreSQL writer in REPEATABLE READ or
SERIALIZABLE whose insert or delete of items races another gets a serialization error (retry it);
positions never go wrong. The triggers run with the writer's privileges: writers of the table need
INSERT, UPDATE and DELETE on the position and count tables too. Filling the position table and
installing the triggers happen while writers wait (PostgreSQL SHARE ROW EXCLUSIVE lock; MariaDB LOCK
TABLES ... WRITE, which CREATE TRIGGER needs, so readers wait too; SQLite one write transaction):
one pass over the ids.

Each run reads in one snapshot (PostgreSQL REPEATABLE READ READ ONLY; MariaDB START TRANSACTION
WITH CONSISTENT SNAPSHOT, READ ONLY; SQLite one read transaction): m = max(position) + 1, one probe
of the position primary key, checked against the count row. Sorted access from depth 0, and from
where the previous read of the snapshot stopped, is keyset pagination on the index: the rows tied
with the last (score, id) after its id, then the rows of lower score, each branch an index range
with a LIMIT; any other start falls back to OFFSET. Each row of a page finds its position by one
probe of the position table's id index. Random access by position goes position table -> user
table by id (one probe of the id index per row), one query per batch; random access by id is
`id IN (...)` on the unique index. (A batch of more than m / PROBE_FRACTION rows, i.e. a full
read, joins the two tables instead: planners hash-join large batches, and probes would lose.)
Zero-vote items are rows with score 0: they count in m and come last in sorted access.

Positions are not ranks (`positions_are_ranks = False`), so the core infers no scores from the
sorted order and no runs of tied scores are kept. Scores are validated by `prepare()` once; a run
then checks every score it reads and raises AccessError on a NULL, NaN or negative one. Writes
that bypass row triggers leave the position table behind: on MariaDB / MySQL a TRUNCATE
(which re-creates the table: its identity, kept in the count row, changes) or a write the
triggers found an id already placed for is seen by the next run, which rebuilds the positions
first (under the tables' WRITE locks); elsewhere (SQLite REPLACE without recursive_triggers)
runs fail with AccessError until `prepare()` runs again.

Size: one class, SQLAlchemyLiveTable, with each dialect's triggers and index reads
next to the statement they serve.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.engine import Connection, Engine

from adapters._sql import AccessCheck, AccessPath, plain_values
from topk_middleware.access import AccessError, Rows, RunTraits, ScoreBins

from .live_base import LiveBase, _keeps_stat1
from .table import MAX_NAME_BYTES, SQLAlchemyTable, _digest, _fit, engine_of

__all__ = ["LIVE_DIALECTS", "SQLAlchemyLiveTable"]

# Dialects whose B-tree indexes can be declared (score DESC, id ASC) and read in that order.
LIVE_DIALECTS = ("postgresql", "sqlite", "mysql", "mariadb")
# MariaDB / MySQL collations that order (and compare) UTF-8 text by its bytes, without padding.
MYSQL_BYTE_ORDER_COLLATIONS = ("utf8mb4_nopad_bin", "utf8mb3_nopad_bin", "utf8mb4_0900_bin")
# A batch of up to m / PROBE_FRACTION rows finds positions (sorted access) or scores (random
# access) by one index probe per row; a larger one (a full read) by a join.
PROBE_FRACTION = 16


def _named(table: str, suffix: str) -> str:
    """`<table><suffix>`, or, past MAX_NAME_BYTES, the table name cut short with a hash."""
    name = table + suffix
    if len(name.encode("utf-8")) <= MAX_NAME_BYTES:
        return name
    return _fit(table, f"_{_digest(table)}{suffix}")


class SQLAlchemyLiveTable(LiveBase):
    """A histogram in a live table: `SQLAlchemyTable(engine, table, id=..., score=...,
    mode="live")` builds one. Call `prepare()` once; runs then see every committed write."""

    positions_are_ranks = False
    # No in-store one-shot: its keyed noise names items by rank, which a live table does not
    # keep (None takes the method away, so it is not an InStoreOneShot and the planner knows).
    read_oneshot = None  # type: ignore[assignment]

    def run_traits(self) -> RunTraits:
        """access.RunTraits: positions from the position table, not ranks."""
        return RunTraits(positions_are_ranks=False, costs=self.store_costs)

    def __init__(
        self,
        engine: Engine,
        table: str | sa.Table,
        id: str = "id",
        score: str = "score",
        *,
        mode: str = "live",
        **options: Any,
    ) -> None:
        if mode != "live":
            raise ValueError(f"SQLAlchemyLiveTable serves mode='live' only, got mode={mode!r}")
        engine = engine_of(engine)
        if engine.dialect.name not in LIVE_DIALECTS:  # before anything is read
            raise ValueError(
                f"mode='live' reads sorted access through a B-tree index on the table, which "
                f"dialect {engine.dialect.name!r} cannot serve in order (PostgreSQL, MariaDB / "
                "MySQL and SQLite can): use mode='copy' (DuckDB)"
            )
        super().__init__(engine, table, id, score, **options)
        if self.dialect in ("mysql", "mariadb"):
            self._require_descending_indexes()
        assert self._source is not None and self.table_name is not None
        source = self._source
        self._id_column = source.c[id]
        self._score_column = source.c[score]
        id_type = source.c[id].type
        if self.dialect in ("mysql", "mariadb"):
            id_type = self._mysql_id_type(id_type)
        elif self.dialect == "sqlite" and self._text_ids:
            id_type = sa.Text(collation="BINARY")
        else:
            id_type = id_type.copy()
        digest = _digest(source.schema, self.table_name, id)
        self.position_table_name = _named(self.table_name, "_topk_pos")
        self.count_table_name = _named(self.table_name, "_topk_pos_n")
        metadata = sa.MetaData()
        self._pos = sa.Table(
            self.position_table_name,
            metadata,
            sa.Column("position", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("id", id_type, nullable=False, unique=True),
            schema=source.schema,
        )
        # n: the number of positions; hole: scratch for SQLite's triggers, which have no variables.
        self._count = sa.Table(
            self.count_table_name,
            metadata,
            sa.Column("n", sa.BigInteger, nullable=False),
            sa.Column("hole", sa.BigInteger, nullable=True),
            schema=source.schema,
        )
        self._order_index_name = _fit("ix", f"_topk_{digest}_live_order")
        self._id_index_name = _fit("ux", f"_topk_{digest}_live_id")
        self._trigger_prefix = _fit("topk", f"_{digest}_pos")
        # Within a snapshot: (next depth, last score, last id) of the previous sorted read.
        self._cursor: tuple[int, Any, Any] | None = None

    def _require_descending_indexes(self) -> None:
        """MariaDB < 10.8 and MySQL < 8 parse DESC in an index and ignore it: ORDER BY score
        DESC, id would then sort the table on every read."""
        with self.engine.connect():
            version = tuple(self.engine.dialect.server_version_info or ())
        mariadb = getattr(self.engine.dialect, "is_mariadb", False)
        needed = (10, 8) if mariadb else (8, 0)
        if version < needed:
            server = "MariaDB" if mariadb else "MySQL"
            raise ValueError(
                f"mode='live' needs descending indexes ({server} >= "
                f"{'.'.join(map(str, needed))}); this server is "
                f"{'.'.join(map(str, version))}: use mode='copy'"
            )

    def _mysql_id_type(self, id_type: sa.types.TypeEngine[Any]) -> sa.types.TypeEngine[Any]:
        """The id column of the position table on MariaDB / MySQL: the user's type, and for text
        its exact collation, which must order by bytes (checked here, before anything is read)."""
        if not self._text_ids:
            return id_type.copy()
        length = getattr(id_type, "length", None)
        columns = sa.table(
            "columns",
            sa.column("table_schema"),
            sa.column("table_name"),
            sa.column("column_name"),
            sa.column("character_set_name"),
            sa.column("collation_name"),
            schema="information_schema",
        )
        c = columns.c
        schema = self._source.schema if self._source is not None else None
        with self.engine.connect() as conn:
            found = conn.execute(
                sa.select(c.character_set_name, c.collation_name).where(
                    c.table_schema == (schema if schema is not None else sa.func.database()),
                    c.table_name == self.table_name,
                    c.column_name == self.id_column,
                )
            ).first()
        charset, collation = found if found is not None else (None, None)
        if not length or collation not in MYSQL_BYTE_ORDER_COLLATIONS:
            raise ValueError(
                f"mode='live' on MariaDB / MySQL reads ids in byte order through an index, so "
                f"{self.where} column {self.id_column!r} must be a VARCHAR in a binary NO PAD "
                f"collation ({', '.join(MYSQL_BYTE_ORDER_COLLATIONS)}); it is {id_type} with "
                f"collation {collation}: change the column (ALTER TABLE ... MODIFY "
                f"{self.id_column} VARCHAR(n) COLLATE utf8mb4_nopad_bin) or use mode='copy'"
            )
        return mysql.VARCHAR(length, charset=charset, collation=collation)

    # ----- keys: how ids are compared and ordered ------------------------------------------
    def _index_key(self) -> Any:
        """The id in byte order, as indexed and ordered (a binary collation on MariaDB)."""
        if self.dialect in ("mysql", "mariadb"):
            return self._id_column  # its collation was checked to be binary
        return self._id_key(self._id_column)

    def _order_key(self, column: Any) -> Any:
        return column if self.dialect in ("mysql", "mariadb") else self._id_key(column)

    def _match_key(self, column: Any) -> Any:
        """The id as matched for equality, so that the unique index on id serves the lookup:
        PostgreSQL's deterministic collations and MariaDB's binary one compare bytes already."""
        if self.dialect == "sqlite" and self._text_ids:
            return column.collate("BINARY")
        return column

    # ----- prepare --------------------------------------------------------------------------
    def prepare(self, *, index_source: bool = True) -> None:
        """Validate the table, create the indexes on it, and (re)build the position table and the
        triggers that keep it current (module docstring). Needed once; writes afterwards need
        nothing. Raises ValueError naming the table and column for invalid counts."""
        if self._conn is not None:
            raise RuntimeError("prepare() cannot run inside snapshot() of the same table")
        if not index_source:
            raise ValueError("mode='live' reads through indexes on the table: index_source=False")
        inspector = sa.inspect(self.engine)
        if self.table_name in inspector.get_view_names(schema=self._pos.schema):
            raise ValueError(f"mode='live' needs a table, and {self.where} is a view")
        with self.engine.begin() as conn:
            self._validate(conn)
        self._create_indexes()
        if self.dialect == "postgresql":
            self._install_postgresql()
        elif self.dialect == "sqlite":
            self._install_sqlite()
        else:
            self._install_mysql()
        if self.dialect == "postgresql" or (self.dialect == "sqlite" and _keeps_stat1(self.engine)):
            with self.engine.begin() as conn:
                for table in (self._source, self._pos):
                    assert table is not None
                    conn.exec_driver_sql(f"ANALYZE {self._quoted(table)}")

    def _quoted(self, table: sa.Table, qualified: bool = True) -> str:
        preparer = self.engine.dialect.identifier_preparer
        return preparer.format_table(table) if qualified else preparer.quote(table.name)

    def _has_unique_id(self) -> bool:
        """Whether a primary key, unique constraint or unique index on the id alone exists (for
        SQLite text ids only ours counts: it must compare in BINARY collation)."""
        inspector = sa.inspect(self.engine)
        name, schema, wanted = self.table_name, self._pos.schema, [self.id_column]
        indexes = inspector.get_indexes(name, schema=schema)
        if any(ix["name"] == self._id_index_name for ix in indexes):
            return True
        if self.dialect == "sqlite" and self._text_ids:
            return False
        if inspector.get_pk_constraint(name, schema=schema).get("constrained_columns") == wanted:
            return True
        if any(u["column_names"] == wanted for u in inspector.get_unique_constraints(name, schema)):
            return True
        return any(ix.get("unique") and ix["column_names"] == wanted for ix in indexes)

    def _create_indexes(self) -> None:
        """The B-tree on (score DESC, id in byte order), and a unique index on id if none; on
        PostgreSQL built CONCURRENTLY (an invalid leftover of a failed build is dropped first)."""
        concurrently = {"postgresql_concurrently": True}
        order = sa.Index(
            self._order_index_name, self._score_column.desc(), self._index_key(), **concurrently
        )
        wanted = [order]
        if not self._has_unique_id():
            key = self._index_key() if self.dialect == "sqlite" else self._id_column
            wanted.append(sa.Index(self._id_index_name, key, unique=True, **concurrently))
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            for index in wanted:
                if self.dialect == "postgresql":
                    self._drop_if_invalid(conn, index.name)
                index.create(conn, checkfirst=True)

    def _drop_if_invalid(self, conn: Connection, name: Any) -> None:
        preparer = self.engine.dialect.identifier_preparer
        schema = self._pos.schema
        qualified = preparer.quote(str(name))
        if schema is not None:
            qualified = f"{preparer.quote_schema(schema)}.{qualified}"
        valid = conn.execute(
            sa.text("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:name)"),
            {"name": qualified},
        ).scalar()
        if valid is False:
            conn.exec_driver_sql(f"DROP INDEX CONCURRENTLY {qualified}")

    def _create_position_tables(self, conn: Connection) -> None:
        """Create the position and count tables where missing (an existing table of the same name
        must have their columns)."""
        inspector = sa.inspect(conn)
        for table in (self._pos, self._count):
            if not inspector.has_table(table.name, schema=table.schema):
                table.create(conn)
                continue
            have = {c["name"] for c in inspector.get_columns(table.name, schema=table.schema)}
            if have != set(table.c.keys()):
                raise ValueError(
                    f"table {table.name!r} exists with columns {sorted(have)}, not "
                    f"({', '.join(table.c.keys())}): drop it to let prepare() build it"
                )

    def _fill_positions(self, conn: Connection) -> None:
        """Positions 0..m-1 in id order, and the count row."""
        conn.execute(sa.delete(self._pos))
        conn.execute(sa.delete(self._count))
        position = sa.func.row_number().over(order_by=self._index_key()) - 1
        conn.execute(
            sa.insert(self._pos).from_select(
                ["position", "id"],
                sa.select(position, self._id_column).select_from(self._source),
            )
        )
        mark = (
            sa.literal_column(self._identity_sql())
            if self.dialect in ("mysql", "mariadb")
            else sa.null()
        )
        conn.execute(
            sa.insert(self._count).from_select(
                ["n", "hole"], sa.select(sa.func.count(), mark).select_from(self._pos)
            )
        )

    def _names(self, qualified: bool = True) -> dict[str, str]:
        """Quoted names for the trigger bodies."""
        preparer = self.engine.dialect.identifier_preparer
        assert self._source is not None
        return {
            "table": self._quoted(self._source, qualified),
            "pos": self._quoted(self._pos, qualified),
            "count": self._quoted(self._count, qualified),
            "id": preparer.quote(self.id_column),
            "position": preparer.quote("position"),
        }

    def _trigger(self, event: str) -> str:
        preparer = self.engine.dialect.identifier_preparer
        return preparer.quote(f"{self._trigger_prefix}_{event}")

    def _install_postgresql(self) -> None:
        n = self._names()
        preparer = self.engine.dialect.identifier_preparer
        function = preparer.quote(f"{self._trigger_prefix}_sync")
        if self._pos.schema is not None:
            function = f"{preparer.quote_schema(self._pos.schema)}.{function}"
        pos, count, position, ident = n["pos"], n["count"], n["position"], n["id"]
        # INSERT and DELETE: statement triggers over the transition tables, so that a statement
        # touching d items updates the count row once and the position table in O(d log d) (a
        # row trigger would leave d versions of the count row for each later one to step over).
        # UPDATE of the id: a row trigger (rare). TRUNCATE: both tables emptied.
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
        with self.engine.begin() as conn:
            # Writers wait until the positions and the triggers are in place; readers go on.
            conn.exec_driver_sql(f"LOCK TABLE {n['table']} IN SHARE ROW EXCLUSIVE MODE")
            self._create_position_tables(conn)
            self._fill_positions(conn)
            conn.exec_driver_sql(body)
            for event, when in triggers.items():
                name = self._trigger(event)
                conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {name} ON {n['table']}")
                conn.exec_driver_sql(f"CREATE TRIGGER {name} {when} EXECUTE FUNCTION {function}()")
                # fired under session_replication_role = replica too (logical replication
                # subscribers, pg_restore): positions must follow every write
                conn.exec_driver_sql(f"ALTER TABLE {n['table']} ENABLE ALWAYS TRIGGER {name}")

    def _install_mysql(self) -> None:
        n = self._names()
        remove = f"""
    SELECT n - 1 INTO v_last FROM {n["count"]} FOR UPDATE;
    SET v_hole = NULL;
    SELECT {n["position"]} INTO v_hole FROM {n["pos"]} WHERE id = OLD.{n["id"]} FOR UPDATE;
    IF v_hole IS NOT NULL THEN
        DELETE FROM {n["pos"]} WHERE id = OLD.{n["id"]};
        UPDATE {n["pos"]} SET {n["position"]} = v_hole WHERE {n["position"]} = v_last;
        UPDATE {n["count"]} SET n = v_last;
    END IF;"""
        # An id that already has a position was left there by a write that bypassed the
        # triggers (TRUNCATE): the positions no longer describe the table. The count row says so
        # (hole = -1) and the writer's own statement goes on; the next run rebuilds them.
        add = f"""
    SELECT n INTO v_last FROM {n["count"]} FOR UPDATE;
    SET v_hole = NULL;
    SELECT {n["position"]} INTO v_hole FROM {n["pos"]} WHERE id = NEW.{n["id"]};
    IF v_hole IS NULL THEN
        UPDATE {n["count"]} SET n = n + 1;
        INSERT INTO {n["pos"]} ({n["position"]}, id) VALUES (v_last, NEW.{n["id"]});
    ELSE
        UPDATE {n["count"]} SET hole = -1;
    END IF;"""
        declare = "DECLARE v_last BIGINT; DECLARE v_hole BIGINT DEFAULT NULL;"
        schema = self._pos.schema
        preparer = self.engine.dialect.identifier_preparer
        prefix = "" if schema is None else f"{preparer.quote_schema(schema)}."
        bodies = {
            "ins": f"AFTER INSERT ON {n['table']} FOR EACH ROW BEGIN {declare} {add} END",
            "del": f"AFTER DELETE ON {n['table']} FOR EACH ROW BEGIN {declare} {remove} END",
            "upd": f"AFTER UPDATE ON {n['table']} FOR EACH ROW BEGIN {declare} "
            f"IF NOT (OLD.{n['id']} <=> NEW.{n['id']}) THEN {remove} {add} END IF; END",
        }
        with self.engine.begin() as conn:
            self._create_position_tables(conn)
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            # CREATE TRIGGER needs the table's WRITE lock: readers wait too, for one pass over ids.
            conn.exec_driver_sql(
                f"LOCK TABLES {n['table']} WRITE, {n['pos']} WRITE, {n['count']} WRITE"
            )
            try:
                for event in bodies:
                    conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {prefix}{self._trigger(event)}")
                self._fill_positions(conn)
                for event, body in bodies.items():
                    conn.exec_driver_sql(f"CREATE TRIGGER {prefix}{self._trigger(event)} {body}")
            finally:
                conn.exec_driver_sql("UNLOCK TABLES")

    def _identity_sql(self) -> str:
        """MariaDB / MySQL: a number that changes when the table is re-created, as TRUNCATE
        does (a CRC of its InnoDB table id and creation time), kept in the count row's `hole`
        (the triggers there need no scratch column); -1 there means the triggers saw a write
        that bypassed them."""
        schema = self._pos.schema
        where = "database()" if schema is None else "'" + schema.replace("'", "''") + "'"
        name = str(self.table_name).replace("'", "''")
        table_id = (
            "(SELECT TABLE_ID FROM information_schema.INNODB_SYS_TABLES "
            f"WHERE NAME = concat({where}, '/', '{name}'))"
            if getattr(self.engine.dialect, "is_mariadb", False)
            else "NULL"
        )
        return (
            f"CAST(CRC32(concat_ws(' ', {table_id}, (SELECT CREATE_TIME FROM "
            f"information_schema.TABLES WHERE TABLE_SCHEMA = {where} "
            f"AND TABLE_NAME = '{name}'))) AS SIGNED)"
        )

    def _refill_positions(self) -> None:
        """MariaDB / MySQL, after a write that bypassed the triggers (TRUNCATE): positions
        0..m-1 again, under the tables' WRITE locks (writers and readers wait one pass over
        the ids), and the table's identity in the count row."""
        n = self._names()
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.exec_driver_sql(
                f"LOCK TABLES {n['table']} WRITE, {n['pos']} WRITE, {n['count']} WRITE"
            )
            try:
                self._fill_positions(conn)
            finally:
                conn.exec_driver_sql("UNLOCK TABLES")

    def _install_sqlite(self) -> None:
        n = self._names(qualified=False)  # trigger bodies name tables of their own schema
        schema = self._pos.schema
        preparer = self.engine.dialect.identifier_preparer
        prefix = "" if schema is None else f"{preparer.quote_schema(schema)}."
        binary = " COLLATE BINARY" if self._text_ids else ""
        remove = f"""
    UPDATE {n["count"]} SET n = n - 1,
        hole = (SELECT {n["position"]} FROM {n["pos"]} WHERE id = OLD.{n["id"]}{binary});
    DELETE FROM {n["pos"]} WHERE id = OLD.{n["id"]}{binary};
    UPDATE {n["pos"]} SET {n["position"]} = (SELECT hole FROM {n["count"]})
        WHERE {n["position"]} = (SELECT n FROM {n["count"]});"""
        add = f"""
    INSERT INTO {n["pos"]} ({n["position"]}, id) SELECT n, NEW.{n["id"]} FROM {n["count"]};
    UPDATE {n["count"]} SET n = n + 1;"""
        known = f"EXISTS (SELECT 1 FROM {n['pos']} WHERE id = OLD.{n['id']}{binary})"
        bodies = {
            "ins": f"AFTER INSERT ON {n['table']} BEGIN {add} END",
            "del": f"AFTER DELETE ON {n['table']} WHEN {known} BEGIN {remove} END",
            "upd": f"AFTER UPDATE OF {n['id']} ON {n['table']} "
            f"WHEN OLD.{n['id']}{binary} IS NOT NEW.{n['id']} AND {known} "
            f"BEGIN {remove} {add} END",
        }
        with self.engine.begin() as conn:
            if not conn.connection.driver_connection.in_transaction:  # type: ignore[union-attr]
                conn.exec_driver_sql("BEGIN IMMEDIATE")  # DDL and fill in one write transaction
            self._create_position_tables(conn)
            for event in bodies:
                conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {prefix}{self._trigger(event)}")
            self._fill_positions(conn)
            for event, body in bodies.items():
                conn.exec_driver_sql(f"CREATE TRIGGER {prefix}{self._trigger(event)} {body}")

    def uninstall(self) -> None:
        """Drop everything prepare() installed: the triggers (and PostgreSQL's trigger
        function), the position table and the count table in one transaction, then the index
        on (score DESC, id) and the unique index on id if prepare() made it (PostgreSQL: DROP
        INDEX CONCURRENTLY). The table and its rows are not touched; an index it had before is
        kept. Idempotent; runs fail afterwards until prepare() runs again."""
        preparer = self.engine.dialect.identifier_preparer
        schema = self._pos.schema
        prefix = "" if schema is None else f"{preparer.quote_schema(schema)}."
        with self.engine.begin() as conn:
            exists = sa.inspect(conn).has_table(self.table_name, schema=schema)
            for event in ("ins", "del", "upd", "trunc"):
                if self.dialect == "postgresql":
                    if exists:
                        table = self._quoted(self._source)  # type: ignore[arg-type]
                        conn.exec_driver_sql(
                            f"DROP TRIGGER IF EXISTS {self._trigger(event)} ON {table}"
                        )
                elif event != "trunc":
                    conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {prefix}{self._trigger(event)}")
            if self.dialect == "postgresql":
                function = preparer.quote(f"{self._trigger_prefix}_sync")
                conn.exec_driver_sql(f"DROP FUNCTION IF EXISTS {prefix}{function}()")
            for table in (self._pos, self._count):
                table.drop(conn, checkfirst=True)
        self._drop_indexes()

    def _drop_indexes(self) -> None:
        """The indexes _create_indexes() made on the table, where they exist."""
        if self._source is None or not sa.inspect(self.engine).has_table(
            self.table_name, schema=self._pos.schema
        ):
            return
        concurrently = {"postgresql_concurrently": True}
        made = [
            sa.Index(self._order_index_name, self._score_column, **concurrently),
            sa.Index(self._id_index_name, self._id_column, **concurrently),
        ]
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            existing = {
                i["name"]
                for i in sa.inspect(conn).get_indexes(self.table_name, schema=self._pos.schema)
            }
            for index in made:
                if index.name in existing:
                    index.drop(conn)

    # ----- what a run reads -----------------------------------------------------------------
    def is_stale(self) -> bool:
        """Never: a live run reads the table as it is."""
        return False

    def score_run_count(self) -> int | None:
        """None: positions are not ranks, so runs of tied scores are not kept."""
        return None

    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        raise AccessError("mode='live' keeps no runs of tied scores (positions are not ranks)")

    def read_score_histogram(self, bins: ScoreBins) -> tuple[np.ndarray, np.ndarray] | None:
        """access.ScoreHistogramRead: the scores of the table at or below `bins.top`, binned,
        by one aggregate in the run's snapshot (each bin's largest score and size; one scan)."""
        scores = sa.select(sa.cast(self._score_column, sa.Double()).label("s")).subquery("t")
        bin_of = sa.literal_column(bins.sql("t.s"))
        query = (
            sa.select(sa.func.max(scores.c.s), sa.func.count())
            .where(scores.c.s <= float(bins.top))
            .group_by(bin_of)
        )
        with self._connection() as conn:
            got = conn.execute(query).all()
        tops = np.array([row[0] for row in got], dtype=np.float64)
        return tops, np.array([row[1] for row in got], dtype=np.int64)

    def _open_run(self, conn: Connection, transaction: sa.RootTransaction) -> sa.RootTransaction:
        """The run's first query (SQLAlchemyTable.snapshot(), as in mode='copy'): m, read from
        the position table. On MariaDB / MySQL, positions left behind by a write that bypassed
        the triggers (TRUNCATE re-creates the table) are rebuilt first, outside the run's
        transaction, and the run starts again."""
        if self.dialect in ("mysql", "mariadb") and not self._positions_current(conn):
            self._end(conn, transaction)
            self._refill_positions()
            transaction = self._begin(conn)
        self._m = self._live_count(conn)
        self._cursor = None
        self.last_freshness = {"copy": "none", "read": "table"}
        return transaction

    def _positions_current(self, conn: Connection) -> bool:
        """MariaDB / MySQL: whether the count row names the table as it is (not re-created
        since, no write that bypassed the triggers)."""
        try:
            mark, now = conn.execute(
                sa.select(
                    sa.select(sa.func.max(self._count.c.hole)).scalar_subquery(),
                    sa.literal_column(self._identity_sql()),
                )
            ).one()
        except sa.exc.ProgrammingError:
            return True  # no count table: _live_count says to call prepare()
        return mark is not None and now is not None and int(mark) == int(now)

    def _close_run(self) -> None:
        self._m = None
        self._cursor = None

    def _live_count(self, conn: Connection) -> int:
        """m = max(position) + 1 (one probe of the primary key), checked against the count row."""
        p, c = self._pos.c, self._count.c
        query = sa.select(
            sa.select(sa.func.max(p.position)).scalar_subquery(),
            sa.select(sa.func.max(c.n)).scalar_subquery(),
        )
        try:
            last, count = conn.execute(query).one()
        except sa.exc.DBAPIError as error:
            inspector = sa.inspect(self.engine)  # a fresh connection: this one may be aborted
            if not inspector.has_table(self._pos.name, schema=self._pos.schema):
                raise RuntimeError(
                    f"position table {self._pos.name!r} of {self.where} does not exist: call "
                    "prepare() first"
                ) from error
            raise
        if last is None and count is None:
            raise RuntimeError(
                f"position table {self._pos.name!r} of {self.where} is empty: call prepare() "
                "first (or the table has no item to select)"
            )
        m = 0 if last is None else int(last) + 1
        if count is None or int(count) != m:
            raise AccessError(
                f"position table {self._pos.name!r} of {self.where} is inconsistent (positions "
                f"end at {m}, count {count}): call prepare() again"
            )
        if m == 0:
            raise ValueError(f"{self.where} is empty: there is no item to select")
        return m

    def domain_size(self) -> int:
        if self._m is not None:
            return self._m
        with self._connection() as conn:
            return self._live_count(conn)

    def _page(self, start: int, count: int, cursor: tuple[int, Any, Any] | None) -> Any:
        """Rows at depths start.. of the canonical order, at most `count`: keyset after `cursor`
        (next depth, last score, last id) when it stops at `start`, from the top at depth 0, else
        OFFSET. The keyset is two index ranges: the rows tied with the last score after its id,
        and the rows of lower score (a row comparison cannot mix DESC and ASC)."""
        score, ident = self._score_column, self._id_column
        order = (score.desc(), self._index_key())
        top = sa.select(ident.label("id"), score.label("score")).order_by(*order).limit(count)
        if start == 0:
            return top
        if cursor is None or cursor[0] != start:
            return top.offset(start)
        _, last_score, last_id = cursor
        tied = (
            sa.select(ident.label("id"), score.label("score"))
            .where(score == last_score, self._index_key() > last_id)
            .order_by(self._index_key())
            .limit(count)
        )
        below = (
            sa.select(ident.label("id"), score.label("score"))
            .where(score < last_score)
            .order_by(*order)
            .limit(count)
        )
        return sa.union_all(sa.select(tied.subquery("tied")), sa.select(below.subquery("below")))

    def _probes(self, rows: int) -> bool:
        """Whether to find the other side of `rows` rows by one index probe each (a correlated
        subquery) rather than by a join, which planners serve with a hash join over a whole
        table once the batch looks large to them: probes up to 1/PROBE_FRACTION of m."""
        return self._m is None or rows * PROBE_FRACTION < self._m

    def _one_of(self, column: Any, name: str, type_: sa.types.TypeEngine[Any]) -> Any:
        """`column` is one of the values of parameter `name` (a list): `= ANY(array)` on
        PostgreSQL (one parameter, about half the time of an IN list of a thousand), else an
        expanding IN list."""
        if self.dialect == "postgresql":
            return column == sa.any_(sa.bindparam(name, type_=postgresql.ARRAY(type_)))
        return column.in_(sa.bindparam(name, expanding=True))

    def _sorted_query(
        self, start: int, count: int, cursor: tuple[int, Any, Any] | None, probes: bool
    ) -> Any:
        """(position, id, score) of depths start.., at most `count`, in canonical order."""
        page = self._page(start, count, cursor).subquery("page")
        p = self._pos.c
        if probes:
            position = sa.select(p.position).where(p.id == page.c.id).scalar_subquery()
            query = sa.select(position, page.c.id, page.c.score)
        else:
            query = sa.select(p.position, page.c.id, page.c.score).select_from(
                page.join(self._pos, p.id == page.c.id)
            )
        return query.order_by(page.c.score.desc(), self._order_key(page.c.id)).limit(count)

    def _positions_query(self, probes: bool) -> Any:
        """(position, id, score) at the positions of the expanding parameter `positions`."""
        p = self._pos.c
        at = self._one_of(p.position, "positions", sa.BigInteger())
        if probes:
            score = (
                sa.select(self._score_column)
                .where(self._match_key(self._id_column) == p.id)
                .scalar_subquery()
            )
            return sa.select(p.position, p.id, score).where(at)
        return (
            sa.select(p.position, self._id_column, self._score_column)
            .select_from(
                self._pos.join(self._source, self._match_key(self._id_column) == p.id)  # type: ignore[arg-type]
            )
            .where(at)
        )

    def read_sorted(self, start: int, count: int) -> Rows:
        """Depths start .. start+count-1 with their positions: one query (module docstring)."""
        start, count = int(start), int(count)
        if count <= 0:
            return self._rows([], round_trips=0)
        # An oblivious run pages by OFFSET: a keyset would send the last score read, a fact of
        # the data, as a parameter (in the text, where the driver interpolates).
        cursor = self._cursor if self._conn is not None and not self._oblivious else None
        query = self._sorted_query(start, count, cursor, self._probes(count))
        with self._connection() as conn:
            records = conn.execute(query).all()
            if self._conn is not None and records:
                self._cursor = (start + len(records), records[-1][2], records[-1][1])
        for record in records:
            if record[0] is None:
                raise AccessError(
                    f"item {record[1]!r} of {self.where} has no position in "
                    f"{self._pos.name!r}: call prepare() again"
                )
        return self._rows(records, round_trips=1)

    def read_positions(self, positions: np.ndarray) -> Rows:
        """Rows at the given positions: position table -> user table by id, in chunks."""
        wanted = plain_values(np.asarray(positions, dtype=np.int64))
        distinct = sorted(set(wanted))
        query = self._positions_query(self._probes(len(distinct)))
        records: list[Any] = []
        chunks = 0
        with self._connection() as conn:
            for chunk in self._chunks(distinct):
                records.extend(conn.execute(query, {"positions": chunk}).all())
                chunks += 1
            by_position = {int(rec[0]): rec for rec in records}
            for rec in records:
                if rec[2] is None:
                    self._raise_if_gone(conn, rec[1])
        try:
            ordered = [by_position[position] for position in wanted]
        except KeyError as missing:
            raise AccessError(
                f"position {missing.args[0]} has no row in {self.where} (position table "
                f"{self._pos.name!r}): call prepare() again"
            ) from None
        return self._rows(ordered, round_trips=chunks)

    def _raise_if_gone(self, conn: Connection, item: Any) -> None:
        """A NULL score read by position: the item is gone from the table (the position table is
        behind it), or its score is NULL (refused by _checked)."""
        key = self._match_key(self._id_column)
        there = conn.execute(sa.select(sa.func.count()).where(key == item)).scalar_one()
        if not there:
            raise AccessError(
                f"the position table {self._pos.name!r} names item {item!r}, which is not in "
                f"{self.where}: call prepare() again"
            )

    def read_ids(self, ids: Sequence[Any]) -> np.ndarray:
        """Scores of the named items, in the order given: `id IN (...)` on the unique index."""
        wanted = plain_values(ids)
        key = self._match_key(self._id_column)
        query = sa.select(self._id_column, self._score_column).where(
            self._one_of(key, "ids", self._id_column.type)
        )
        found: dict[Any, Any] = {}
        with self._connection() as conn:
            for chunk in self._chunks(list(dict.fromkeys(wanted))):
                for item, score in conn.execute(query, {"ids": chunk}):
                    found[item] = score
        try:
            scores = [found[item] for item in wanted]
        except KeyError as missing:
            raise AccessError(f"{self.where} has no item with id {missing.args[0]!r}") from None
        return self._checked(np.asarray(scores, dtype=np.float64))

    def read_exact_scores(self, ids: Sequence[Any]) -> list[Any]:
        """ExactScores: the scores of the named items as the driver returns them, from the
        table itself."""
        wanted = plain_values(ids)
        key = self._match_key(self._id_column)
        query = sa.select(self._id_column, self._score_column).where(
            self._one_of(key, "ids", self._id_column.type)
        )
        found: dict[Any, Any] = {}
        with self._connection() as conn:
            for chunk in self._chunks(list(dict.fromkeys(wanted))):
                found.update((item, score) for item, score in conn.execute(query, {"ids": chunk}))
        try:
            return [found[item] for item in wanted]
        except KeyError as missing:
            raise AccessError(f"{self.where} has no item with id {missing.args[0]!r}") from None

    @property
    def integer_scores(self) -> bool:
        """Whether the counts are of an integer type (never on SQLite: see the copy mode)."""
        return self.dialect != "sqlite" and isinstance(self._score_column.type, sa.Integer)

    def _checked(self, scores: np.ndarray) -> np.ndarray:
        """Every score a run reads is checked: the table was validated once, then written to."""
        if not np.isfinite(scores).all() or (scores < 0).any():
            raise AccessError(
                f"{self.where} column {self.score_column!r} holds a NULL, NaN, infinite or "
                "negative score: fix the row (live runs read the table as it is)"
            )
        return scores

    def check(self) -> AccessCheck:
        """How each access kind will be served, from the dialect's EXPLAIN (as in mode='copy'):
        sorted access by keyset on the (score DESC, id) index, random access by position through
        the position table's primary key and the id index, random access by id on the id index."""
        inspector = sa.inspect(self.engine)
        names = ("sorted", "random by position", "random by id")
        if not inspector.has_table(self._pos.name, schema=self._pos.schema):
            why = f"no position table {self._pos.name!r}: call prepare()"
            return AccessCheck(self.where, [AccessPath(a, True, why) for a in names])
        with self.engine.connect() as conn:
            first = conn.execute(
                sa.select(self._id_column, self._score_column)
                .order_by(self._score_column.desc(), self._index_key())
                .limit(1)
            ).first()
            last_id, last_score = first if first is not None else (None, 0)
            probes = [
                self._sorted_query(1, 100, (1, last_score, last_id), probes=True),
                self._positions_query(probes=True).params(positions=[0, 1, 2]),  # a batch
                sa.select(self._id_column, self._score_column).where(
                    self._match_key(self._id_column).in_([last_id])
                ),
            ]
            if self.dialect == "postgresql":  # for this transaction only
                conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
            paths = [
                AccessPath(access, *self._explain_live(conn, query))
                for access, query in zip(names, probes, strict=True)
            ]
            conn.rollback()
        return AccessCheck(self.where, paths)

    def _explain_live(self, conn: Connection, query: Any) -> tuple[bool, str]:
        """(full scan?, how) for one probe. A scan of a LIMITed page (SQLite's materialized
        subquery, MariaDB's derived table) reads only that page: only a scan of the user's table or
        of the position table is a full scan."""
        if self.dialect == "postgresql":
            return self._explain(conn, query)  # a Seq Scan with enable_seqscan off
        statement = str(query.compile(conn, compile_kwargs={"literal_binds": True}))
        tables = {self.table_name, self._pos.name}
        if self.dialect == "sqlite":
            nonce = f" -- {uuid.uuid4().hex}"  # a cached EXPLAIN keeps an old schema's plan
            details = [
                row[-1] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement + nonce)
            ]
            full = any(
                d.split(" ")[0] == "SCAN" and d.split(" ")[1] in tables and "USING" not in d
                for d in details
            )
            return full, "; ".join(details)
        rows = conn.exec_driver_sql("EXPLAIN " + statement).mappings().all()
        full = any(row["type"] == "ALL" and row["table"] in tables for row in rows)
        kinds = ", ".join(f"{row['table']}: {row['type']} via {row['key']}" for row in rows)
        return full, f"access type {kinds}"


SQLAlchemyTable.mode_classes["live"] = SQLAlchemyLiveTable
