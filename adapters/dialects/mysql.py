"""MariaDB / MySQL as a dialect of the SQL store engine (adapters/sql/): what differs, and only
that. Tested on MariaDB 10.11 through PyMySQL.

* names: identifiers backquoted; a name found as the catalog spells it in the schema given or
  the connection's database (information_schema), the schema made explicit;
* catalog: information_schema's column types read as kinds; text compared byte for byte under
  a binary NO PAD utf8mb4 collation (utf8mb4_nopad_bin on MariaDB, utf8mb4_0900_bin on MySQL:
  a case-insensitive or space-padding default would make 'a', 'A' and 'a ' one item); text ids
  copied as VARCHAR of at most MAX_ID_LENGTH characters in that collation (the longest utf8mb4
  key InnoDB indexes, 3,072 bytes), longer ones refused; a table's lasting identity is its
  InnoDB table id (MariaDB) and creation time, which TRUNCATE and a table made again change;
* the driver writes every parameter into the statement text (PyMySQL and the other MySQL
  drivers: driver.CLIENT_SIDE_BINDING), which the server's process list and logs show: no
  in-store one-shot (its key would be statement text), the store declares
  `parameters_in_text`; arrays are bound as one list, written as `(1, 2, 3)`;
* freshness (freshness.RowStamps): row triggers upsert the row (copy, the writer's
  CONNECTION_ID()) of topk_write_log, adding 1 to its n, so writers on other connections touch
  other rows and none waits for another. The copy's build reads the copy's rows of the log in
  its consistent snapshot and deletes each only if its n is still the one read (DELETE reads
  the latest version): a write the copy may not hold keeps its row. The stamp is the triggers'
  names and creation times; a run proves the copy current where no row of the copy is left in
  its snapshot and the triggers are the stamped ones;
* runs read in START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY (REPEATABLE READ);
* a stale copy's run reads the table in full in canonical order (no positions: no in-store
  one-shot), after one aggregate pass of checks (table_read.scan_table);
* EXPLAIN for check() (access type ALL: a full scan).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from adapters._sql import sql_name_spellings
from adapters.sql.dialect import FLOAT, INTEGER, TEXT, Column, Dialect
from adapters.sql.driver import Driver
from adapters.sql.freshness import RowStamps
from adapters.sql.table_read import TableState, scan_table
from topk_middleware.access import StoreCosts

# The longest text id the copy indexes: a utf8mb4 VARCHAR of 768 characters is InnoDB's longest
# key (3,072 bytes).
MAX_ID_LENGTH = 768
INTEGERS = ("tinyint", "smallint", "mediumint", "int", "integer", "bigint")
FLOATS = ("float", "double", "decimal", "numeric", "real")
TEXTS = ("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set")
EVENTS = ("INSERT", "UPDATE", "DELETE")
# MySQL / MariaDB error numbers of a missing privilege (TRIGGER command denied; SUPER needed
# with binary logging; access denied).
NO_PRIVILEGE = (1142, 1419, 1227, 1044)

# Measured (benchmarks/sizes.py, MariaDB 10.11, 2 shared cores): a full read into the client
# about 2e-6 s a row, a rebuild of the copy 4e-6 s a row.
SCAN_ROW, REBUILD_ROW = 1e-7, 4e-6


def table_costs(m: int) -> StoreCosts:
    """What reads of the table cost in a run that reads it (a scan or an index walk each)."""
    return StoreCosts(
        round_trip=5e-4 + SCAN_ROW * m,
        sorted_row=1e-6,
        random_batch=1e-2,
        random_row=1e-6,
        random_batch_item=1e-6,
        full_read_row=2e-6,
        sorted_scans=True,
    )


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


class RowStampSQL:
    """The SQL of MariaDB's row stamps (freshness.RowStamps; module docstring)."""

    LOG_TABLE = "topk_write_log"
    EVENTS = EVENTS

    def __init__(self, dialect: MySQLDialect) -> None:
        self.d = dialect

    def setup_statements(self, log: str, key: int) -> list[str]:
        return [
            f"CREATE TABLE IF NOT EXISTS {log} (copy_key BIGINT NOT NULL, conn BIGINT NOT NULL, "
            "n BIGINT NOT NULL, PRIMARY KEY (copy_key, conn)) ENGINE=InnoDB"
        ]

    def trigger_names(self, driver: Driver, t: Any) -> set[str]:
        rows = driver.execute(
            "SELECT TRIGGER_NAME FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = :s "
            "AND EVENT_OBJECT_TABLE = :t",
            {"s": t.namespace, "t": t.table},
        )
        return {str(r[0]) for r in rows}

    def trigger_sql(self, name: str, event: str, t: Any, log: str, key: int) -> str:
        return (
            f"CREATE TRIGGER {self.d.qualified(t.namespace, name)} AFTER {event} ON {t.source} "
            f"FOR EACH ROW INSERT INTO {log} (copy_key, conn, n) VALUES ({int(key)}, "
            "CONNECTION_ID(), 1) ON DUPLICATE KEY UPDATE n = n + 1"
        )

    def after_new_triggers(self, log: str, key: int) -> list[str]:
        return []  # the stamp holds the triggers' creation times

    def cleanup(self, driver: Driver, log: str, key: int) -> None:
        """Delete the log rows the copy's snapshot saw, each only if no writer changed it
        since (module docstring)."""
        seen = driver.execute(f"SELECT conn, n FROM {log} WHERE copy_key = {int(key)}")
        for connection, count in seen:
            driver.execute(
                f"DELETE FROM {log} WHERE copy_key = {int(key)} AND conn = {int(connection)} "
                f"AND n = {int(count)}"
            )

    def _triggers_sql(self, t: Any, triggers: list[str]) -> str:
        """The copy's triggers with their creation times, in one text (NULL unless all are
        there)."""
        listed = ", ".join(_literal(name) for name in sorted(triggers))
        return (
            f"(SELECT CASE WHEN count(*) = {len(triggers)} THEN GROUP_CONCAT(CONCAT("
            "TRIGGER_NAME, '@', CREATED) ORDER BY TRIGGER_NAME) END FROM "
            f"information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = {_literal(t.namespace)} AND "
            f"EVENT_OBJECT_TABLE = {_literal(t.table)} AND TRIGGER_NAME IN ({listed}))"
        )

    def stamp_sql(self, t: Any, log: str, key: int, triggers: list[str]) -> str:
        return f"CONCAT('my ', {self._triggers_sql(t, triggers)})"

    def proof_sql(self, stamp: str, t: Any, log: str, key: int, triggers: list[str]) -> str:
        """The stamp where the triggers are the stamped ones and no row of the copy is left in
        the log (in the run's snapshot)."""
        return (
            f"(SELECT s.stamp FROM (SELECT {stamp} AS stamp) s WHERE s.stamp = CONCAT('my ', "
            f"{self._triggers_sql(t, triggers)}) AND NOT EXISTS (SELECT 1 FROM {log} "
            f"WHERE copy_key = {int(key)}))"
        )

    def delete_key_sql(self, log: str, key: int) -> str:
        return f"DELETE FROM {log} WHERE copy_key = {int(key)}"

    def users_sql(self, t: Any) -> str:
        """How many triggers name the log in their statement (any copy's)."""
        return (
            "SELECT count(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = "
            f"{_literal(t.namespace)} AND instr(ACTION_STATEMENT, {_literal(self.LOG_TABLE)}) > 0"
        )


def is_mariadb(engine: Any) -> bool:
    """Whether an SQLAlchemy engine of the MariaDB / MySQL dialect reaches MariaDB: that
    dialect's own `is_mariadb` (a mariadb:// URL says so at once, a mysql:// one once the
    engine has met the server). TypeError for an engine of another dialect."""
    from sqlalchemy.dialects.mysql.base import MySQLDialect as SQLAlchemyMySQL

    dialect = engine.dialect
    if not isinstance(dialect, SQLAlchemyMySQL):
        raise TypeError(f"not a MariaDB / MySQL engine: its dialect is {dialect.name!r}")
    return bool(dialect.is_mariadb)


class MySQLDialect(Dialect):
    """MariaDB's and MySQL's SQL (module docstring); `mariadb` tells the two apart."""

    supports_in_store_oneshot = False  # parameters are statement text (module docstring)
    reads_tables = True
    trigger_proof = RowStamps
    snapshot_isolation = "REPEATABLE READ"
    max_id_bytes = MAX_ID_LENGTH
    id_length_unit = "characters"
    score_types = "integers, floating point or decimal numbers"
    id_types = "integers or text"
    costs = StoreCosts()  # a copy's reads: the generic record (measured alike)
    # A table read as it is now is read whole (adapters/sql/whole.py) up to whole_read_rows rows:
    # one read of every row and a release in memory. MariaDB through SQLAlchemy (pymysql),
    # distinct counts, median of 7 releases at a load average of 5: 1,000 rows 4.2 ms whole
    # against 10.2 ms for a current copy's run and 16 ms for the table's after writes; 10,000
    # rows 31 against 17 ms current. After writes at 10,000 rows (benchmarks/sizes.py, load 4-5)
    # the whole read took 34-96 ms (pymysql turns each row into Python objects) against the
    # table's 13-25 ms on zipf and sparse counts and 51-258 ms on the others: no larger read
    # alone (whole_read_alone_rows 0).
    whole_read_rows = 3_000
    whole_read_alone = True

    def __init__(self, mariadb: bool = True) -> None:
        self.name = "MariaDB" if mariadb else "MySQL"
        self.mariadb = mariadb
        self.binary = "utf8mb4_nopad_bin" if mariadb else "utf8mb4_0900_bin"
        self.row_stamps = RowStampSQL(self)

    # ----- names and catalog --------------------------------------------------------------------
    def quote(self, name: str) -> str:
        return "`" + name.replace("`", "``") + "`"

    def literal(self, text: str) -> str:
        return _literal(text)

    def resolve(self, driver: Driver, table: str, namespace: str | None) -> tuple[Any, str]:
        """(schema, table) as the catalog spells the relation the name finds, the schema made
        explicit; a name that finds nothing is kept as given (the columns refuse it)."""
        default = driver.scalar("SELECT DATABASE()")
        for spelled_schema, spelled in sql_name_spellings(table, namespace, lambda w: w):
            home = default if spelled_schema is None else spelled_schema
            names = driver.execute(
                "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = :s",
                {"s": home},
            )
            if spelled in {str(r[0]) for r in names}:
                return home, spelled
        return namespace, table

    def _catalog(self, driver: Driver, namespace: Any, table: str) -> list[tuple[Any, ...]]:
        """The rows of the table the name means (information_schema may ignore case)."""
        found = driver.execute(
            "SELECT t.TABLE_NAME, t.TABLE_TYPE, c.COLUMN_NAME, c.DATA_TYPE, c.COLUMN_TYPE "
            "FROM information_schema.TABLES t LEFT JOIN information_schema.COLUMNS c "
            "ON c.TABLE_SCHEMA = t.TABLE_SCHEMA AND c.TABLE_NAME = t.TABLE_NAME "
            "WHERE t.TABLE_SCHEMA = coalesce(:schema, DATABASE()) AND t.TABLE_NAME = :name "
            "ORDER BY c.ORDINAL_POSITION",
            {"schema": namespace, "name": table},
        )
        names = {row[0] for row in found}
        exact = table if table in names else min(names, default=None)
        return [row for row in found if row[0] == exact]

    def columns(self, driver: Driver, namespace: Any, table: str) -> dict[str, Column] | None:
        rows = self._catalog(driver, namespace, table)
        if not rows:
            return None
        columns = {}
        for _, _, column, data_type, column_type in rows:
            if column is None:
                continue
            base = str(data_type).lower()
            if base in INTEGERS:
                kind = INTEGER
            elif base in FLOATS:
                kind = FLOAT
            else:
                kind = TEXT if base in TEXTS else base
            columns[column] = Column(kind, str(column_type))
        return columns

    def is_table(self, driver: Driver, namespace: Any, table: str) -> bool:
        rows = self._catalog(driver, namespace, table)
        return bool(rows) and rows[0][1] == "BASE TABLE"

    def comment(self, driver: Driver, namespace: Any, table: str) -> str | None:
        return driver.scalar(
            "SELECT TABLE_COMMENT FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = coalesce(:s, DATABASE()) AND TABLE_NAME = :t",
            {"s": namespace, "t": table},
        )

    def exists_sql(self, qualified: str) -> str:
        namespace, name = self.split(qualified)
        schema = "DATABASE()" if namespace is None else _literal(namespace)
        return (
            "EXISTS (SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = "
            f"{schema} AND TABLE_NAME = {_literal(name)})"
        )

    def identity_fact_sql(self, qualified: str) -> str:
        """The InnoDB table id (MariaDB) and creation time of a table (module docstring)."""
        namespace, name = self.split(qualified)
        schema, table = _literal(str(namespace)), _literal(name)
        table_id = (
            "(SELECT TABLE_ID FROM information_schema.INNODB_SYS_TABLES "
            f"WHERE NAME = concat({schema}, '/', {table}))"
            if self.mariadb
            else "NULL"
        )
        return (
            f"(SELECT concat_ws(' ', {table_id}, (SELECT CREATE_TIME FROM "
            f"information_schema.TABLES WHERE TABLE_SCHEMA = {schema} AND TABLE_NAME = {table})))"
        )

    def indexes_ids(self, column: Column) -> bool:
        """Whether an index on the table's id column can hold it whole (not TEXT, not longer
        than MAX_ID_LENGTH characters)."""
        if column.kind != TEXT:
            return True
        length = re.search(r"\((\d+)\)", column.type)
        return length is not None and int(length.group(1)) <= MAX_ID_LENGTH

    # ----- fragments ------------------------------------------------------------------------------
    def double(self, expr: str) -> str:
        return f"CAST({expr} AS DOUBLE)"

    def byte_order(self, expr: str) -> str:
        return f"CAST({expr} AS CHAR CHARACTER SET utf8mb4) COLLATE {self.binary}"

    def id_index_key(self, expr: str) -> str:
        return expr  # an index holds the column in its own collation

    def id_length(self, expr: str) -> str:
        return f"CHAR_LENGTH({expr})"

    def member(self, expr: str, param: str, kind: str | None) -> str:
        return f"{expr} IN :{param}"  # the list written as (a, b, c) by the driver

    def text(self, expr: str) -> str:
        return f"CAST({expr} AS CHAR)"

    def text_length(self, expr: str) -> str:
        return f"CHAR_LENGTH({expr})"

    def concat(self, *parts: str) -> str:
        return f"CONCAT({', '.join(parts)})"

    def keyed_hash(self, key: str, message: str) -> str | None:
        return f"SHA2(CONCAT({key}, {message}), 256)"

    def integer(self, expr: str) -> str:
        return f"CAST({expr} AS SIGNED)"

    def comment_statement(self, qualified: str, text: str) -> str:
        return f"ALTER TABLE {qualified} COMMENT = {_literal(text)}"

    # ----- DDL ------------------------------------------------------------------------------------
    def id_copy_type(self, column: Column) -> str:
        if column.kind != TEXT:
            return column.type
        length = re.search(r"\((\d+)\)", column.type)
        chars = min(int(length.group(1)) if length else MAX_ID_LENGTH, MAX_ID_LENGTH)
        return f"VARCHAR({chars}) CHARACTER SET utf8mb4 COLLATE {self.binary}"

    def create_runs_table(self, target: str, ranks: str) -> list[str]:
        return [
            f"CREATE TABLE {target} (run BIGINT NOT NULL, first_rank BIGINT NOT NULL, "
            "score DOUBLE NOT NULL, PRIMARY KEY (first_rank))",
            f"INSERT INTO {target} (run, first_rank, score) "
            "SELECT row_number() OVER (ORDER BY min(rank)) - 1, min(rank), score "
            f"FROM {ranks} GROUP BY score ORDER BY 2",
        ]

    def plain_index_sql(self, index: str, table: str, columns: str) -> str:
        return f"CREATE INDEX IF NOT EXISTS {self.quote(index)} ON {table} ({columns})"

    def drop_index_sql(self, qualified: str, table: str) -> str:
        return f"DROP INDEX IF EXISTS {self.quote(self.split(qualified)[1])} ON {table}"

    def upsert_sql(self, table: str, columns: list[str]) -> str:
        update = ", ".join(f"{c} = VALUES({c})" for c in columns[1:])
        return (
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
            f"({', '.join(':' + c for c in columns)}) ON DUPLICATE KEY UPDATE {update}"
        )

    def analyze(self, driver: Driver, qualified: str) -> None:
        """Nothing: InnoDB keeps its statistics by itself."""

    def insufficient_privilege(self, driver: Driver, error: BaseException) -> bool:
        code = getattr(getattr(error, "orig", error), "args", (None,))
        return bool(code) and code[0] in NO_PRIVILEGE

    # ----- runs ---------------------------------------------------------------------------------
    @contextmanager
    def run_transaction(self, driver: Driver, oblivious: bool) -> Iterator[None]:
        """A run's transaction: REPEATABLE READ, its snapshot taken at once, read-only."""
        with driver.transaction(isolation=self.snapshot_isolation):
            driver.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            yield

    # ----- reads of the table itself (table_read.py) ----------------------------------------------
    def open_table(self, t: Any) -> TableState:
        """One aggregate pass (table_read.scan_table); no positions (no in-store one-shot)."""
        unique, score_index, estimate = t.driver.one(
            "SELECT (SELECT count(*) FROM (SELECT INDEX_NAME FROM information_schema.STATISTICS "
            "WHERE TABLE_SCHEMA = :s AND TABLE_NAME = :t AND NON_UNIQUE = 0 GROUP BY INDEX_NAME "
            "HAVING count(*) = 1 AND max(COLUMN_NAME) = :id) u), (SELECT count(*) FROM "
            "information_schema.STATISTICS WHERE TABLE_SCHEMA = :s AND TABLE_NAME = :t AND "
            "SEQ_IN_INDEX = 1 AND COLUMN_NAME = :score), (SELECT TABLE_ROWS FROM "
            "information_schema.TABLES WHERE TABLE_SCHEMA = :s AND TABLE_NAME = :t)",
            {"s": t.namespace, "t": t.table, "id": t.id_column, "score": t.score_column},
        )
        state, _ = scan_table(t, unique=bool(unique), estimate=int(estimate or 0))
        state.score_index = bool(score_index)
        return state

    # ----- EXPLAIN --------------------------------------------------------------------------------
    def full_scans(self, driver: Driver, sql: str, params: dict[str, Any]) -> list[str]:
        """The tables EXPLAIN reads with access type ALL."""
        rows = driver.execute(f"EXPLAIN {sql}", params)
        return [str(row[2]) for row in rows if row[3] == "ALL"]

    # ----- costs ----------------------------------------------------------------------------------
    def stale_costs(self, run: Any) -> StoreCosts:
        return table_costs(run.m)

    def table_seconds(self, m: int) -> float:
        return 2e-3 + 2 * SCAN_ROW * m + 2e-6 * m

    def refresh_seconds(self, m: int) -> float:
        return 5e-3 + REBUILD_ROW * m


__all__ = ["MAX_ID_LENGTH", "MySQLDialect", "RowStampSQL", "is_mariadb", "table_costs"]
