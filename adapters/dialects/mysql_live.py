"""MariaDB / MySQL's part of SQLAlchemyTable(mode="live") (adapters/dialects/live_sql.py):
descending indexes required (MariaDB >= 10.8, MySQL >= 8: older servers parse DESC and ignore
it), text ids in a binary NO PAD collation (checked, and copied to the position table), row
triggers with variables, the table's identity kept in the count row, and EXPLAIN's access types
for check().

Triggers (row triggers; each takes the count row's lock first, `SELECT ... FOR UPDATE`, so item
inserts and deletes are serialized): AFTER INSERT the new id takes position n; AFTER DELETE the
item at position n - 1 takes the deleted one's (swap-remove); an UPDATE that changes the id is
both. CREATE TRIGGER needs the table's WRITE lock, so installing them and filling the positions
happen under LOCK TABLES ... WRITE (readers wait too, one pass over the ids).

A write that bypasses the triggers (TRUNCATE re-creates the table; an insert of an id that
already has a position) is seen by the next run: the count row's `hole` holds the table's
identity (a CRC of its InnoDB table id and creation time), -1 once a trigger found an id already
placed; a run whose identity differs fills the positions again first (`refill`).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Connection, Engine

from .live_sql import LiveSQL
from .mysql import MAX_ID_LENGTH, is_mariadb

# MariaDB / MySQL collations that order (and compare) UTF-8 text by its bytes, without padding.
MYSQL_BYTE_ORDER_COLLATIONS = ("utf8mb4_nopad_bin", "utf8mb3_nopad_bin", "utf8mb4_0900_bin")


class MySQLLive(LiveSQL):
    """MariaDB and MySQL (module docstring)."""

    parameters_in_text = True  # pymysql and the other drivers interpolate on the client

    def fold(self, word: str) -> str:
        """MariaDB keeps names as written."""
        return word

    def byte_order(self, t: Any, column: Any) -> Any:
        """The text as utf8mb4 in a binary NO PAD collation: code point order = UTF-8 byte
        order, and 'a' != 'a ' (the PAD SPACE utf8mb4_bin would ignore trailing spaces)."""
        as_utf8 = sa.cast(column, mysql.CHAR(charset="utf8mb4"))
        binary = "utf8mb4_nopad_bin" if is_mariadb(t.engine) else "utf8mb4_0900_bin"
        return as_utf8.collate(binary)

    def id_length_limit(self, column: Any) -> tuple[Any, int, str] | None:
        """The engine's bound (MAX_ID_LENGTH: InnoDB's longest indexed utf8mb4 VARCHAR)."""
        return sa.func.char_length(column), MAX_ID_LENGTH, "characters"

    def explain(self, conn: Connection, statement: str) -> tuple[bool, str]:
        rows = conn.exec_driver_sql("EXPLAIN " + statement).mappings().all()
        full = any(row["type"] == "ALL" for row in rows)
        kinds = ", ".join(f"{row['type']} via {row['key']}" for row in rows)
        return full, f"access type {kinds}"

    def snapshot_connection(self, conn: Connection) -> Connection:
        return conn.execution_options(isolation_level="REPEATABLE READ")

    def begin_snapshot(self, conn: Connection) -> None:
        conn.exec_driver_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")

    def reflected(self, table: sa.Table) -> sa.Table:
        """The MySQL dialect reflects a backtick in a column name doubled, as SHOW CREATE TABLE
        writes it: undone, so the name is quoted once, correctly."""
        if not any("``" in c.name for c in table.c):
            return table
        columns = [sa.Column(c.name.replace("``", "`"), c.type) for c in table.c]
        return sa.Table(table.name, sa.MetaData(), *columns, schema=table.schema)

    def comment_query(self, engine: Engine, table: str, schema: str | None) -> Any:
        return sa.text(
            "SELECT TABLE_COMMENT FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = coalesce(:s, database()) AND TABLE_NAME = :t"
        ).bindparams(s=schema, t=table)

    def check_server(self, t: Any) -> None:
        """MariaDB < 10.8 and MySQL < 8 parse DESC in an index and ignore it: ORDER BY score
        DESC, id would then sort the table on every read."""
        with t.engine.connect():
            version = tuple(t.engine.dialect.server_version_info or ())
        mariadb = is_mariadb(t.engine)
        needed = (10, 8) if mariadb else (8, 0)
        if version < needed:
            server = "MariaDB" if mariadb else "MySQL"
            raise ValueError(
                f"mode='live' needs descending indexes ({server} >= "
                f"{'.'.join(map(str, needed))}); this server is "
                f"{'.'.join(map(str, version))}: use mode='copy'"
            )

    def position_id_type(self, t: Any, id_type: sa.types.TypeEngine[Any]) -> Any:
        """The user's type, and for text its exact collation, which must order by bytes
        (checked here, before anything is read)."""
        if not t._text_ids:
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
        schema = t._source.schema if t._source is not None else None
        with t.engine.connect() as conn:
            found = conn.execute(
                sa.select(c.character_set_name, c.collation_name).where(
                    c.table_schema == (schema if schema is not None else sa.func.database()),
                    c.table_name == t.table_name,
                    c.column_name == t.id_column,
                )
            ).first()
        charset, collation = found if found is not None else (None, None)
        if not length or collation not in MYSQL_BYTE_ORDER_COLLATIONS:
            raise ValueError(
                f"mode='live' on MariaDB / MySQL reads ids in byte order through an index, so "
                f"{t.where} column {t.id_column!r} must be a VARCHAR in a binary NO PAD "
                f"collation ({', '.join(MYSQL_BYTE_ORDER_COLLATIONS)}); it is {id_type} with "
                f"collation {collation}: change the column (ALTER TABLE ... MODIFY "
                f"{t.id_column} VARCHAR(n) COLLATE utf8mb4_nopad_bin) or use mode='copy'"
            )
        return mysql.VARCHAR(length, charset=charset, collation=collation)

    def order_key(self, t: Any, column: Any) -> Any:
        """The column itself: its collation was checked to be binary."""
        return column

    def count_mark(self, t: Any) -> Any:
        return sa.literal_column(self.identity_sql(t))

    def install(self, t: Any) -> None:
        n = t._names()
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
        prefix = t._schema_prefix()
        bodies = {
            "ins": f"AFTER INSERT ON {n['table']} FOR EACH ROW BEGIN {declare} {add} END",
            "del": f"AFTER DELETE ON {n['table']} FOR EACH ROW BEGIN {declare} {remove} END",
            "upd": f"AFTER UPDATE ON {n['table']} FOR EACH ROW BEGIN {declare} "
            f"IF NOT (OLD.{n['id']} <=> NEW.{n['id']}) THEN {remove} {add} END IF; END",
        }
        with t.engine.begin() as conn:
            t._create_position_tables(conn)
        with t.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            # CREATE TRIGGER needs the table's WRITE lock: readers wait too, for one pass over ids.
            conn.exec_driver_sql(
                f"LOCK TABLES {n['table']} WRITE, {n['pos']} WRITE, {n['count']} WRITE"
            )
            try:
                for event in bodies:
                    conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {prefix}{t._trigger(event)}")
                t._fill_positions(conn)
                for event, body in bodies.items():
                    conn.exec_driver_sql(f"CREATE TRIGGER {prefix}{t._trigger(event)} {body}")
            finally:
                conn.exec_driver_sql("UNLOCK TABLES")

    def identity_sql(self, t: Any) -> str:
        """A number that changes when the table is re-created, as TRUNCATE does (a CRC of its
        InnoDB table id and creation time), kept in the count row's `hole` (the triggers here
        need no scratch column); -1 there means the triggers saw a write that bypassed them."""
        schema = t._pos.schema
        where = "database()" if schema is None else "'" + schema.replace("'", "''") + "'"
        name = str(t.table_name).replace("'", "''")
        table_id = (
            "(SELECT TABLE_ID FROM information_schema.INNODB_SYS_TABLES "
            f"WHERE NAME = concat({where}, '/', '{name}'))"
            if is_mariadb(t.engine)
            else "NULL"
        )
        return (
            f"CAST(CRC32(concat_ws(' ', {table_id}, (SELECT CREATE_TIME FROM "
            f"information_schema.TABLES WHERE TABLE_SCHEMA = {where} "
            f"AND TABLE_NAME = '{name}'))) AS SIGNED)"
        )

    def positions_current(self, t: Any, conn: Connection) -> bool:
        """Whether the count row names the table as it is (not re-created since, no write that
        bypassed the triggers)."""
        try:
            mark, now = conn.execute(
                sa.select(
                    sa.select(sa.func.max(t._count.c.hole)).scalar_subquery(),
                    sa.literal_column(self.identity_sql(t)),
                )
            ).one()
        except sa.exc.ProgrammingError:
            return True  # no count table: the run's count says to call prepare()
        return mark is not None and now is not None and int(mark) == int(now)

    def refill(self, t: Any) -> None:
        """Positions 0..m-1 again, under the tables' WRITE locks (writers and readers wait one
        pass over the ids), and the table's identity in the count row."""
        n = t._names()
        with t.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.exec_driver_sql(
                f"LOCK TABLES {n['table']} WRITE, {n['pos']} WRITE, {n['count']} WRITE"
            )
            try:
                t._fill_positions(conn)
            finally:
                conn.exec_driver_sql("UNLOCK TABLES")

    def explain_live(self, t: Any, conn: Connection, query: Any) -> tuple[bool, str]:
        """Access type ALL on the user's table or the position table is a full scan (a derived
        table, a LIMITed page, reads only that page)."""
        statement = str(query.compile(conn, compile_kwargs={"literal_binds": True}))
        tables = {t.table_name, t._pos.name}
        rows = conn.exec_driver_sql("EXPLAIN " + statement).mappings().all()
        full = any(row["type"] == "ALL" and row["table"] in tables for row in rows)
        kinds = ", ".join(f"{row['table']}: {row['type']} via {row['key']}" for row in rows)
        return full, f"access type {kinds}"
