"""PostgresTable (copy mode): proving the copy current with the write log (docs/freshness.md).

The log, its trigger and the proof are described in adapters/_pg_writes.py. `WriteLog` is a
mixin of PostgresTable: it uses the quoted names `_base`, `_ranks`, `schema`, `rank_table`,
`where`, `frozen` and the connection `_conn`.

`prepare()` calls `_install_log` in a transaction of its own, committed before the snapshot the
copy is made in: creating a trigger waits for the writers in progress on the table, so every
write the copy's snapshot does not see was made with the trigger in place. It then writes the
stamp (`_stamp_writes`) and deletes the log rows its snapshot saw (`_clean_log`) in the copy's
transaction. A run checks `_proof_sql` in its first query.
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Any

import psycopg
from psycopg import sql

from adapters import _pg_writes as pgw
from topk_middleware.validation import first_line


class WriteLog:
    """The write log of one copy (module docstring)."""

    _base: sql.Composable
    _ranks: sql.Composable
    _conn: psycopg.Connection[Any]
    schema: str | None
    rank_table: str
    where: str
    frozen: bool
    _has_log: bool = False  # whether the log table exists (seen in the run's catalog lookup)
    _install_changes: Any  # around.py (ReadAround)
    _stamp_changes: Any
    _uninstall_changes: Any

    def _log_names(self) -> None:
        qualify = (
            (lambda n: sql.Identifier(n))
            if self.schema is None
            else (lambda n: sql.Identifier(self.schema, n))
        )
        self._log = qualify(pgw.LOG_TABLE)
        self._log_function = qualify(pgw.LOG_FUNCTION)
        digest = hashlib.sha1(self.rank_table.encode("utf-8")).hexdigest()[:12]
        self.writes_trigger = f"topk_{digest}_writes"
        self._copy_key = pgw.copy_key(self._ranks.as_string(self._conn))

    def _text(self, name: sql.Composable) -> str:
        return name.as_string(self._conn)

    def _state_text(self) -> str:
        return pgw.state_sql(
            self._text(self._base), self.writes_trigger, self._text(self._log_function)
        )

    def _install_log(self, conn: psycopg.Connection[Any]) -> None:
        """In a transaction of its own, before the copy's snapshot: the log table, its function
        and the copy's trigger, ENABLE ALWAYS, on the table and each relation below it, where
        missing or not in that state. Without the right to create triggers (the table's owner
        has it), a warning: runs then read the table itself."""
        log, function = self._text(self._log), self._text(self._log_function)
        conn.execute(pgw.setup_lock_sql())
        indexed, body = conn.execute(pgw.installed_sql(log, function)).fetchone()
        if not indexed:  # CREATE .. IF NOT EXISTS would lock the log (and wait for writers)
            for statement in pgw.setup_statements(log):
                conn.execute(statement)
        qualified = conn.execute(pgw.qualified_sql(log)).fetchone()[0]
        if body != pgw.function_body(qualified):
            conn.execute(pgw.function_statement(function, qualified))
        relations = conn.execute(
            pgw.relations_sql(
                self._text(self._base),
                self.writes_trigger,
                self._text(self._log_function),
                self._copy_key,
            )
        ).fetchall()
        for relation, kind, ready in relations:
            if ready or kind not in ("r", "p"):
                continue  # a view or foreign table below: the state digest says unprovable
            try:
                with conn.transaction():  # a savepoint: without the right, prepare() goes on
                    for statement in pgw.trigger_statements(
                        relation,
                        self.writes_trigger,
                        self._text(self._log_function),
                        self._copy_key,
                    ):
                        conn.execute(statement)
            except psycopg.errors.InsufficientPrivilege as error:
                warnings.warn(
                    f"{self.where}: no trigger to log writes on {relation} "
                    f"({first_line(error)}): runs cannot prove the copy current and read the "
                    "table itself; its owner can run prepare()",
                    stacklevel=5,
                )
        self._install_changes(conn, relations)  # around.py: the changed rows, where it can

    def _stamp_sql(self) -> sql.Composable:
        return sql.SQL(pgw.stamp_sql(self._state_text()))

    def _proof_sql(self) -> sql.Composable:
        """SQL that is the copy's stamp where the run's snapshot proves the copy current, else
        NULL (frozen: always the tag)."""
        if self.frozen:
            return sql.Literal(pgw.STAMP_TAG)
        if not self._has_log:
            return sql.SQL("NULL::text")
        ranks = pgw.literal(self._text(self._ranks))
        stamp = (
            "pg_catalog.split_part(pg_catalog.obj_description(pg_catalog.to_regclass("
            f"{ranks}), 'pg_class'), E'\\n', 2)"
        )
        return sql.SQL(
            pgw.proof_sql(stamp, self._state_text(), self._text(self._log), self._copy_key)
        )

    def _stamp_writes(self, conn: psycopg.Connection[Any], fingerprint: str) -> None:
        """In the copy's transaction: the comment of the rank table, its fingerprint and, on a
        second line, the stamp; then the log rows this snapshot saw are deleted."""
        stamp = conn.execute(sql.SQL("SELECT ") + self._stamp_sql()).fetchone()[0]
        changes = self._stamp_changes(conn)  # around.py: empty without a change log
        comment = fingerprint + "\n" + stamp + ("\n" + changes if changes else "")
        conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(self._ranks, sql.Literal(comment)))
        conn.execute(pgw.cleanup_sql(self._text(self._log), self._copy_key))

    def _uninstall_log(self, conn: psycopg.Connection[Any]) -> None:
        """The copy's triggers and log rows; the log table and its function too once no
        trigger calls the function."""
        base = self._text(self._base)
        if conn.execute("SELECT to_regclass(%s) IS NOT NULL", [base]).fetchone()[0]:
            relations = conn.execute(
                pgw.relations_sql(
                    base, self.writes_trigger, self._text(self._log_function), self._copy_key
                )
            ).fetchall()
            trigger = sql.Identifier(self.writes_trigger)
            for relation, kind, _ in relations:
                if kind in ("r", "p"):
                    conn.execute(
                        sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(
                            trigger, sql.SQL(relation)
                        )
                    )
        self._uninstall_changes(conn)
        log = self._text(self._log)
        if conn.execute("SELECT to_regclass(%s) IS NOT NULL", [log]).fetchone()[0]:
            conn.execute(
                sql.SQL("DELETE FROM {} WHERE copy = %s").format(self._log), [self._copy_key]
            )
        if conn.execute(pgw.function_users_sql(self._text(self._log_function))).fetchone()[0] == 0:
            conn.execute(sql.SQL("DROP FUNCTION IF EXISTS {}()").format(self._log_function))
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._log))
