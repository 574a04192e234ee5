"""SQLAlchemyTable (copy mode): proving the copy current without reading the table
(docs/freshness.md).

`prepare()` installs, before the transaction that fills the copy (and commits them first, so
that every write the copy does not see is recorded), triggers on the counts table that record
writes, and stamps the copy, in the fill's transaction, with what it saw; the run's first query
checks the stamp against what the triggers recorded since. Per dialect:

* PostgreSQL: on the SQL store engine (copy_table.py: the write log of PostgresTable, one row
  per writing transaction); its from_votes() copies are compared with their counts;
* MariaDB / MySQL: row triggers (AFTER INSERT, UPDATE, DELETE) upsert the row (copy, the
  writer's CONNECTION_ID()) of the log `topk_write_log`, adding 1 to its n: writers on other
  connections touch other rows, so none waits for another. The fill reads the copy's rows of
  the log in its consistent snapshot and deletes each only if its n is still the one read
  (DELETE reads the latest version): a write that the copy may not hold keeps its row. A run
  proves the copy current when no row of the copy is left in its snapshot, the triggers are
  the ones the copy was stamped with (information_schema.TRIGGERS, with their creation time),
  and the table is the same (the fingerprint: TRUNCATE re-creates it);
* SQLite: row triggers add 1 to the copy's counter in `topk_write_counts` (SQLite has one
  writer at a time, so a counter makes nobody wait); the copy is stamped with the counter as
  its write transaction saw it, and a run compares the two and checks that the triggers are
  there (a table dropped and re-created loses them);
* DuckDB: no triggers; the run compares the copy with the table (one join).

`WriteProof` is a mixin of SQLAlchemyTable: it uses `engine`, `dialect`, `_source`, `_ranks`,
`table_name`, `where` and `frozen`.
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from adapters.sql.freshness import copy_key

STAMPS_TABLE = "topk_write_stamps"
MY_LOG = "topk_write_log"
LITE_COUNTS = "topk_write_counts"
PROVEN = {"mysql", "mariadb", "sqlite"}  # dialects whose copies triggers prove (PostgreSQL:
# on the SQL store engine, copy_table.py)


def replace_row(conn: Connection, table: str, row: dict[str, Any]) -> None:
    """Insert `row` into `table` (SQL text, quoted), replacing the row with the same first
    column (its primary key). One upsert statement on PostgreSQL, SQLite and MariaDB / MySQL:
    a DELETE then INSERT of a key that is not there takes InnoDB gap locks, on which two
    prepares at once deadlock. Elsewhere a DELETE then an INSERT."""
    key, *rest = row
    names = ", ".join(row)
    values = ", ".join(f":{c}" for c in row)
    dialect = conn.dialect.name
    if dialect in ("mysql", "mariadb"):
        update = ", ".join(f"{c} = VALUES({c})" for c in rest)
        conn.execute(
            sa.text(
                f"INSERT INTO {table} ({names}) VALUES ({values}) ON DUPLICATE KEY UPDATE {update}"
            ),
            row,
        )
    elif dialect in ("postgresql", "sqlite"):
        update = ", ".join(f"{c} = excluded.{c}" for c in rest)
        conn.execute(
            sa.text(
                f"INSERT INTO {table} ({names}) VALUES ({values}) ON CONFLICT ({key}) DO "
                f"UPDATE SET {update}"
            ),
            row,
        )
    else:
        conn.execute(sa.text(f"DELETE FROM {table} WHERE {key} = :{key}"), row)
        conn.execute(sa.text(f"INSERT INTO {table} ({names}) VALUES ({values})"), row)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class WriteProof:
    """The triggers and stamps of one copy (module docstring)."""

    engine: Engine
    dialect: str
    _source: sa.Table | None
    _ranks: sa.Table
    table_name: str | None
    where: str
    frozen: bool

    # ----- names ------------------------------------------------------------------------------
    def _proof_names(self) -> dict[str, str]:
        preparer = self.engine.dialect.identifier_preparer
        schema = self._ranks.schema
        prefix = "" if schema is None else preparer.quote_schema(schema) + "."
        digest = hashlib.sha1(self._ranks.name.encode("utf-8")).hexdigest()[:12]
        assert self._source is not None
        return {
            "table": preparer.format_table(self._source),
            "stamps": prefix + preparer.quote(STAMPS_TABLE),
            "log": prefix + preparer.quote(MY_LOG if self.dialect != "sqlite" else LITE_COUNTS),
            "trigger": f"topk_{digest}_w",
            "prefix": prefix,
            "copy": self._ranks.name,
        }

    def _copy_key(self) -> int:
        return copy_key(self.engine.dialect.identifier_preparer.format_table(self._ranks))

    def proves_by_triggers(self) -> bool:
        """Whether this dialect's copies are proven by triggers (else: compared by a join)."""
        return self.dialect in PROVEN and self._source is not None

    # ----- install ----------------------------------------------------------------------------
    def _install_proof(self) -> None:
        """The triggers (and their log or counter), committed before the copy's transaction:
        creating a trigger waits for the writers in progress, so every write after the copy's
        snapshot is recorded. Without the right to create them, a warning: runs then read the
        table."""
        if not self.proves_by_triggers():
            return
        try:
            if self.dialect == "sqlite":
                self._install_sqlite_proof()
            else:
                self._install_mysql_proof()
        except sa.exc.DBAPIError as error:
            if "permission" not in str(error).lower() and "denied" not in str(error).lower():
                raise
            warnings.warn(
                f"{self.where}: no trigger to record writes ({type(error.orig).__name__}): "
                "runs cannot prove the copy current and read the table itself; its owner "
                "can run prepare()",
                stacklevel=4,
            )

    def _stamps_table(self, conn: Connection, text_type: str) -> None:
        n = self._proof_names()
        conn.exec_driver_sql(
            f"CREATE TABLE IF NOT EXISTS {n['stamps']} (rank_table VARCHAR(255) NOT NULL "
            f"PRIMARY KEY, stamp {text_type})"
        )

    def _mysql_triggers(self) -> dict[str, str]:
        n = self._proof_names()
        key = self._copy_key()
        upsert = (
            f"INSERT INTO {n['log']} (copy_key, conn, n) VALUES ({key}, CONNECTION_ID(), 1) "
            "ON DUPLICATE KEY UPDATE n = n + 1"
        )
        return {
            f"{n['trigger']}_{event.lower()[:3]}": (
                f"AFTER {event} ON {n['table']} FOR EACH ROW {upsert}"
            )
            for event in ("INSERT", "UPDATE", "DELETE")
        }

    def _install_mysql_proof(self) -> None:
        n = self._proof_names()
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            self._stamps_table(conn, "TEXT")
            conn.exec_driver_sql(
                f"CREATE TABLE IF NOT EXISTS {n['log']} (copy_key BIGINT NOT NULL, "
                "conn BIGINT NOT NULL, n BIGINT NOT NULL, PRIMARY KEY (copy_key, conn)) "
                "ENGINE=InnoDB"
            )
            have = set(
                conn.execute(
                    sa.text(
                        "SELECT TRIGGER_NAME FROM information_schema.TRIGGERS "
                        "WHERE TRIGGER_SCHEMA = coalesce(:schema, database()) "
                        "AND EVENT_OBJECT_TABLE = :table"
                    ),
                    {"schema": self._ranks.schema, "table": self.table_name},
                ).scalars()
            )
            for name, body in self._mysql_triggers().items():
                if name not in have:
                    quoted = self.engine.dialect.identifier_preparer.quote(name)
                    conn.exec_driver_sql(f"CREATE TRIGGER {n['prefix']}{quoted} {body}")

    def _sqlite_triggers(self) -> dict[str, str]:
        preparer = self.engine.dialect.identifier_preparer
        n = self._proof_names()
        key = self._copy_key()
        assert self._source is not None
        table = preparer.quote(self._source.name)
        counts = preparer.quote(LITE_COUNTS)  # a trigger names tables of its own schema
        bump = f"UPDATE {counts} SET n = n + 1 WHERE copy_key = {key};"
        return {
            f"{n['trigger']}_{event.lower()[:3]}": (
                f"AFTER {event} ON {table} FOR EACH ROW BEGIN {bump} END"
            )
            for event in ("INSERT", "UPDATE", "DELETE")
        }

    def _install_sqlite_proof(self) -> None:
        n = self._proof_names()
        key = self._copy_key()
        preparer = self.engine.dialect.identifier_preparer
        with self.engine.begin() as conn:
            driver = conn.connection.driver_connection
            if not getattr(driver, "in_transaction", False):
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            self._stamps_table(conn, "TEXT")
            conn.exec_driver_sql(
                f"CREATE TABLE IF NOT EXISTS {n['log']} (copy_key INTEGER PRIMARY KEY, "
                "n INTEGER NOT NULL)"
            )
            conn.exec_driver_sql(
                f"INSERT OR IGNORE INTO {n['log']} (copy_key, n) VALUES ({key}, 0)"
            )
            master = n["prefix"] + "sqlite_master"
            have = set(
                conn.execute(sa.text(f"SELECT name FROM {master} WHERE type = 'trigger'")).scalars()
            )
            made = False
            for name, body in self._sqlite_triggers().items():
                if name not in have:
                    conn.exec_driver_sql(
                        f"CREATE TRIGGER {n['prefix']}{preparer.quote(name)} {body}"
                    )
                    made = True
            if made:  # a copy stamped before these triggers proves nothing any more
                conn.exec_driver_sql(f"UPDATE {n['log']} SET n = n + 1 WHERE copy_key = {key}")

    # ----- stamp ------------------------------------------------------------------------------
    def _stamp_proof(self, conn: Connection) -> None:
        """In the fill's transaction, after the copy: record what the copy saw."""
        if not self.proves_by_triggers():
            return
        n = self._proof_names()
        key = self._copy_key()
        if self.dialect == "sqlite":
            count = conn.exec_driver_sql(
                f"SELECT n FROM {n['log']} WHERE copy_key = {key}"
            ).scalar()
            stamp = None if count is None else f"lite {count}"
        else:
            seen = conn.exec_driver_sql(
                f"SELECT conn, n FROM {n['log']} WHERE copy_key = {key}"
            ).all()
            for connection_id, count in seen:
                conn.exec_driver_sql(
                    f"DELETE FROM {n['log']} WHERE copy_key = {key} AND conn = "
                    f"{int(connection_id)} AND n = {int(count)}"
                )
            triggers = conn.execute(sa.select(self._mysql_trigger_state())).scalar()
            stamp = None if triggers is None else f"my {triggers}"
        if stamp is None:
            conn.execute(
                sa.text(f"DELETE FROM {n['stamps']} WHERE rank_table = :copy"), {"copy": n["copy"]}
            )
            return
        replace_row(conn, n["stamps"], {"rank_table": n["copy"], "stamp": stamp})

    def _mysql_trigger_state(self) -> Any:
        """The copy's three triggers with their creation times, in one text (NULL unless all
        three are there)."""
        names = sorted(self._mysql_triggers())
        listed = ", ".join(_literal(x) for x in names)
        schema = "database()" if self._ranks.schema is None else _literal(self._ranks.schema)
        return sa.literal_column(
            "(SELECT CASE WHEN count(*) = 3 THEN GROUP_CONCAT(CONCAT(TRIGGER_NAME, '@', "
            "CREATED) ORDER BY TRIGGER_NAME) END FROM information_schema.TRIGGERS "
            f"WHERE TRIGGER_SCHEMA = {schema} AND EVENT_OBJECT_TABLE = "
            f"{_literal(str(self.table_name))} AND TRIGGER_NAME IN ({listed}))"
        )

    # ----- the run's proof --------------------------------------------------------------------
    def _proof_column(self) -> Any:
        """A column of the run's first query: not NULL where the copy is proven current (or
        frozen); None where the dialect proves nothing by triggers (the run compares)."""
        if getattr(self, "frozen", False):
            return sa.literal_column("'frozen'")
        if not self.proves_by_triggers():
            return None
        n = self._proof_names()
        key = self._copy_key()
        stamp = f"(SELECT stamp FROM {n['stamps']} WHERE rank_table = {_literal(n['copy'])})"
        if self.dialect == "sqlite":
            names = ", ".join(_literal(x) for x in sorted(self._sqlite_triggers()))
            master = n["prefix"] + "sqlite_master"
            text = (
                f"(SELECT s.stamp FROM (SELECT {stamp} AS stamp) s WHERE s.stamp = 'lite ' || "
                f"(SELECT n FROM {n['log']} WHERE copy_key = {key}) AND (SELECT count(*) "
                f"FROM {master} WHERE type = 'trigger' AND name IN ({names})) = 3)"
            )
        else:
            state = self._mysql_trigger_state()
            compiled = str(state.compile(dialect=self.engine.dialect))
            text = (
                f"(SELECT s.stamp FROM (SELECT {stamp} AS stamp) s WHERE s.stamp = "
                f"CONCAT('my ', {compiled}) AND NOT EXISTS (SELECT 1 FROM {n['log']} "
                f"WHERE copy_key = {key}))"
            )
        return sa.literal_column(text)

    def _proof_tables_exist(self, conn: Connection) -> bool:
        """Whether the stamps and log tables exist (a query naming a missing one would fail)."""
        if not self.proves_by_triggers():
            return False
        inspector = sa.inspect(conn)
        schema = self._ranks.schema
        log = MY_LOG if self.dialect != "sqlite" else LITE_COUNTS
        return inspector.has_table(STAMPS_TABLE, schema=schema) and inspector.has_table(
            log, schema=schema
        )

    # ----- uninstall --------------------------------------------------------------------------
    def _uninstall_proof(self, conn: Connection) -> None:
        """The copy's triggers, log rows and stamp (the shared tables stay)."""
        if self._source is None or self.dialect not in PROVEN:
            return
        n = self._proof_names()
        key = self._copy_key()
        inspector = sa.inspect(conn)
        schema = self._ranks.schema
        preparer = self.engine.dialect.identifier_preparer
        names = self._sqlite_triggers() if self.dialect == "sqlite" else self._mysql_triggers()
        for name in names:
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {n['prefix']}{preparer.quote(name)}")
        log = LITE_COUNTS if self.dialect == "sqlite" else MY_LOG
        if inspector.has_table(log, schema=schema):
            conn.exec_driver_sql(f"DELETE FROM {n['log']} WHERE copy_key = {key}")
        left = 0
        if inspector.has_table(STAMPS_TABLE, schema=schema):
            conn.execute(
                sa.text(f"DELETE FROM {n['stamps']} WHERE rank_table = :copy"),
                {"copy": n["copy"]},
            )
            left = conn.exec_driver_sql(f"SELECT count(*) FROM {n['stamps']}").scalar_one()
        if left:
            return
        # no copy stamped any more: the shared tables go, once no trigger names the log in its
        # body (another copy may be between installing its triggers and its stamp)
        if self.dialect == "sqlite":
            master = n["prefix"] + "sqlite_master"
            users = conn.execute(
                sa.text(f"SELECT count(*) FROM {master} WHERE type = 'trigger' AND instr(sql, :t)"),
                {"t": LITE_COUNTS},
            ).scalar_one()
            if users:
                return
        else:
            users = conn.execute(
                sa.text(
                    "SELECT count(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = "
                    "coalesce(:s, database()) AND instr(ACTION_STATEMENT, :t) > 0"
                ),
                {"s": schema, "t": MY_LOG},
            ).scalar_one()
            if users:
                return
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {n['log']}")
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {n['stamps']}")
