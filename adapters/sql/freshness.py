"""How a run knows its copy current: the freshness proofs of the SQL store engine
(docs/freshness.md, DESIGN invariant 14).

A proof is asked by the copy's layout (copies.py) when a run opens; `why()` is None where the
copy is proven current, else why not ("written", or "unprovable": nothing can prove a copy of
this table current). Each proof also says how it knew (`said`, in run_freshness()).

* `WriteLog`: statement-level triggers log each writing transaction (the dialect's `writes`
  SQL). prepare() installs them in a transaction
  of its own, committed before the snapshot the copy is made in (creating a trigger waits for
  the writers in progress, so every write the copy's snapshot does not see was made with the
  trigger in place), then stamps the copy with its snapshot in the copy's transaction and
  deletes the log rows that snapshot saw; the run's first query checks the stamp against the
  log and the catalog in one scalar subquery. Without the right to create a trigger, a
  warning: runs then read the table itself. A copy of a frozen table is proven by the
  caller's promise. Beside the log, the layout may keep a change log to read a stale copy
  around (around.py): installed, stamped and dropped with it.
* `RowStamps`: row triggers count each written row (the dialect's `row_stamps` SQL), where a
  store has no statement triggers over transition tables. prepare() makes them, where
  missing, before the copy's transaction (under the store's write lock where it has one); in
  that transaction the copy is stamped with what its snapshot saw (a counter's value, or the
  triggers' names and creation times after deleting the log rows the snapshot saw and no
  writer changed since); the run's first query proves the copy current where the stamp still
  holds (the counter unchanged, or no log row left; the triggers there).
* `Unprovable`: nothing can prove a copy current (no trigger, and no catalog value an UPDATE
  in place changes): a run that is not frozen reads the table as it is now.
* `Compared`: the copy compared with the table in the run's first query (one join of the
  table and the copy on id and score, and both counts: a scan of each), where a store has no
  trigger and no catalog value that every write changes but its runs are to read a copy
  (SQLAlchemyTable's declared copy there). Nothing is installed or stamped.
* `Fingerprint`: a catalog value that changes with every write (the dialect's `fingerprint`:
  the names of a table's immutable parts, say), recorded when the copy's build starts and
  compared when a run opens: one small query, whatever the table's size. It may change
  without a write (a background merge: a rebuild for nothing), never stay put across one.
"""

from __future__ import annotations

import hashlib
import warnings
from typing import TYPE_CHECKING, Any, ClassVar

from topk_middleware.validation import first_line

if TYPE_CHECKING:
    from .around import ChangeLog


def copy_key(copy_name: str) -> int:
    """The copy's key in a write log: a signed 64-bit hash of its qualified, quoted name."""
    return int.from_bytes(hashlib.sha1(copy_name.encode("utf-8")).digest()[:8], "big", signed=True)


class Proof:
    """What every proof declares: whether it can prove a copy current (`proves`), what
    run_freshness() says of it (`said`), and the change log a stale copy is read around
    (`changes`: a WriteLog's where the layout keeps one, around.py; None elsewhere)."""

    proves = True
    said: ClassVar[dict[str, str]] = {}
    changes: ChangeLog | None = None


class Unprovable(Proof):
    """Nothing proves a copy current (a store without triggers or a catalog value that every
    write changes): a run that is not frozen reads the table as it is now."""

    proves = False
    said = {"proof": "none"}  # noqa: RUF012

    def __init__(self, t: Any) -> None:
        self.t = t

    def why(self, stored: str | None, proven: Any) -> str | None:
        return None if self.t.frozen else "unprovable"


class Compared(Proof):
    """The copy is current when it holds the table's rows (module docstring). The arguments
    after `t` are those of a trigger proof (SQLAlchemyTable's copy names one): nothing here
    uses them."""

    proves = True
    said = {"proof": "compared"}  # noqa: RUF012

    def __init__(self, t: Any, key_name: str = "", trigger: str = "", **_: Any) -> None:
        self.t, self.key_name = t, key_name

    def exists_sql(self) -> str:
        return "TRUE"  # nothing to look for

    def install(self, copies: Any) -> None:
        """Nothing to install."""

    def stamp(self, copies: Any) -> list[str]:
        return []

    def users(self) -> int:
        return 0

    def uninstall(self, copies: Any, keep_shared: bool = False) -> None:
        """Nothing to drop."""

    def proof_sql(self, copies: Any, logged: bool) -> str:
        """SQL that is 'compared' where the copy holds exactly the table's (id, score) rows
        (ids matched in byte order, scores in their own type), else NULL; frozen: a constant."""
        t = self.t
        if t.frozen:
            return "'frozen'"
        key = t.dialect.byte_order(f"b.{t.id_sql}") if t.text_ids else f"b.{t.id_sql}"
        ranks = copies.ranks
        return (
            f"(SELECT 'compared' WHERE NOT EXISTS (SELECT 1 FROM {t.source_as('b')} LEFT JOIN "
            f"{ranks} AS r ON r.id = {key} AND r.score = b.{t.score_sql} WHERE r.rank IS NULL) "
            f"AND (SELECT count(*) FROM {t.source}) = (SELECT count(*) FROM {ranks}))"
        )

    def why(self, record: str | None, proven: Any) -> str | None:
        return None if proven is not None else "written"


class Fingerprint(Proof):
    """The copy is current when the table's fingerprint is the one recorded with it."""

    proves = True
    said = {"proof": "fingerprint"}  # noqa: RUF012

    def __init__(self, t: Any) -> None:
        self.t = t

    def fingerprint(self) -> str:
        t = self.t
        return str(t.dialect.fingerprint(t.driver, t.namespace, t.table))

    def why(self, stored: str | None, proven: Any) -> str | None:
        return None if stored == self.fingerprint() else "written"


class WriteLog(Proof):
    """The write log of one copy (module docstring). `key_name` is the text its key is hashed
    from (the copy's qualified name as the layout spells it), `trigger` its trigger's name."""

    proves = True
    said = {"proof": "triggers"}  # noqa: RUF012

    def __init__(
        self,
        t: Any,
        key_name: str,
        trigger: str,
        *,
        changes: Any = None,
        shared: tuple[str, ...] = (),
    ) -> None:
        """`changes`: the layout's change log (around.ChangeLog), if any; `shared`: statements
        making tables the layout's copies share, run under the log's setup lock."""
        self.t, self.sql = t, t.dialect.writes
        self.key_name, self.key, self.trigger = key_name, copy_key(key_name), trigger
        self.shared = shared
        ns = t.namespace
        self.log = t.dialect.qualified(ns, self.sql.LOG_TABLE)
        self.function = t.dialect.qualified(ns, self.sql.LOG_FUNCTION)
        self.changes = changes  # around.ChangeLog, where the layout reads around

    def exists_sql(self) -> str:
        return self.t.dialect.exists_sql(self.log)

    def state_sql(self) -> str:
        """SQL of the digest of the catalog facts the proof rests on."""
        return self.sql.state_sql(self.t.source, self.trigger, self.function)

    # ----- install, stamp, uninstall ----------------------------------------------------------
    def install(self, copies: Any) -> None:
        """The log table, its function and the copy's trigger on the table and each relation
        below it, where missing or not in their state; the change log where the layout keeps
        one. Without the right to create a trigger, a warning (runs read the table)."""
        t, w = self.t, self.sql
        driver = t.driver
        driver.execute(w.setup_lock_sql())
        for statement in self.shared:
            driver.execute(statement)
        indexed, body = driver.one(w.installed_sql(self.log, self.function))
        if not indexed:  # CREATE .. IF NOT EXISTS would lock the log (and wait for writers)
            for statement in w.setup_statements(self.log):
                driver.execute(statement)
        qualified = driver.scalar(w.qualified_sql(self.log))
        if body != w.function_body(qualified):
            driver.execute(w.function_statement(self.function, qualified))
        relations = driver.execute(w.relations_sql(t.source, self.trigger, self.function, self.key))
        for relation, kind, ready in relations:
            if ready or kind not in ("r", "p"):
                continue  # a view or foreign table below: the state digest says unprovable
            try:
                with driver.savepoint():  # without the right, prepare() goes on
                    for statement in w.trigger_statements(
                        relation, self.trigger, self.function, self.key
                    ):
                        driver.execute(statement)
            except driver.errors as error:
                if not t.dialect.insufficient_privilege(driver, error):
                    raise
                warnings.warn(
                    f"{t.where}: no trigger to log writes on {relation} "
                    f"({first_line(error)}): runs cannot prove the copy current and read the "
                    "table itself; its owner can run prepare()",
                    stacklevel=6,
                )
        if self.changes is not None:
            self.changes.install(relations)

    def stamp(self, copies: Any) -> list[str]:
        """In the copy's transaction: the stamp (and the change log's), after which the log
        rows this snapshot saw are deleted."""
        t, w = self.t, self.sql
        stamp = t.driver.scalar("SELECT " + w.stamp_sql(self.state_sql()))
        changes = self.changes.stamp() if self.changes is not None else ""
        t.driver.execute(w.cleanup_sql(self.log, self.key))
        return [stamp, changes] if changes else [stamp]

    def users(self) -> int:
        """How many triggers call the log's function (any copy's)."""
        return int(self.t.driver.scalar(self.sql.function_users_sql(self.function)) or 0)

    def uninstall(self, copies: Any, keep_shared: bool = False) -> None:
        """The copy's triggers and log rows (and its change log); the log table and its
        function too once no trigger calls the function (unless `keep_shared`)."""
        t, w, d = self.t, self.sql, self.t.dialect
        driver = t.driver
        if driver.scalar(f"SELECT {d.exists_sql(t.source)}"):
            relations = driver.execute(
                w.relations_sql(t.source, self.trigger, self.function, self.key)
            )
            for relation, kind, _ in relations:
                if kind in ("r", "p"):
                    driver.execute(f"DROP TRIGGER IF EXISTS {d.quote(self.trigger)} ON {relation}")
        if self.changes is not None:
            self.changes.uninstall()
        if driver.scalar(f"SELECT {d.exists_sql(self.log)}"):
            driver.execute(f"DELETE FROM {self.log} WHERE copy = {int(self.key)}")
        if not keep_shared and not self.users():
            driver.execute(f"DROP FUNCTION IF EXISTS {self.function}()")
            driver.execute(f"DROP TABLE IF EXISTS {self.log}")

    # ----- the run ----------------------------------------------------------------------------
    def proof_sql(self, copies: Any, logged: bool) -> str:
        """SQL that is the copy's stamp where the run's snapshot proves the copy current, else
        NULL (frozen: always the tag)."""
        t, w = self.t, self.sql
        if t.frozen:
            return w.literal(w.STAMP_TAG)
        if not logged:
            return "CAST(NULL AS TEXT)"
        stamp = copies.stamp_sql()
        return w.proof_sql(stamp, self.state_sql(), self.log, self.key)

    def why(self, record: str | None, proven: Any) -> str | None:
        """None where the copy is proven current (or frozen); else "written" (a write since the
        copy, or a change to what the proof rests on, or a copy without a stamp), or
        "unprovable" (the stamp says no trigger could prove it: no right to create one, a view,
        a logical replication target)."""
        if proven is not None:
            return None
        stamp = copies_stamp(record)
        w = self.sql
        if stamp.startswith(w.STAMP_TAG) and stamp.endswith(w.UNPROVABLE):
            return "unprovable"
        return "written"


class RowStamps(Proof):
    """The row triggers and stamp of one copy (module docstring). `key_name` is the text its
    key is hashed from (the copy's qualified name), `trigger` its triggers' name (one per
    event: `<trigger>_ins`, `_upd`, `_del`), `shared` statements making tables the layout's
    copies share."""

    proves = True
    said = {"proof": "triggers"}  # noqa: RUF012

    def __init__(self, t: Any, key_name: str, trigger: str, *, shared: tuple[str, ...] = ()):
        self.t, self.sql, self.shared = t, t.dialect.row_stamps, shared
        self.key_name, self.key = key_name, copy_key(key_name)
        self.triggers = [f"{trigger}_{event.lower()[:3]}" for event in self.sql.EVENTS]
        self.log = t.dialect.qualified(t.namespace, self.sql.LOG_TABLE)

    def exists_sql(self) -> str:
        return self.t.dialect.exists_sql(self.log)

    def install(self, copies: Any) -> None:
        """The shared tables, the log (or counter) and the copy's triggers where missing.
        Without the right to create a trigger, a warning (runs read the table)."""
        t, w, driver = self.t, self.sql, self.t.driver
        for statement in (*self.shared, *w.setup_statements(self.log, self.key)):
            driver.execute(statement)
        have = w.trigger_names(driver, t)
        made = False
        for name, event in zip(self.triggers, w.EVENTS, strict=True):
            if name in have:
                continue
            try:
                driver.execute(w.trigger_sql(name, event, t, self.log, self.key))
            except driver.errors as error:
                if not t.dialect.insufficient_privilege(driver, error):
                    raise
                warnings.warn(
                    f"{t.where}: no trigger to record writes ({first_line(error)}): runs "
                    "cannot prove the copy current and read the table itself; its owner can "
                    "run prepare()",
                    stacklevel=6,
                )
                return
            made = True
        if made:
            for statement in w.after_new_triggers(self.log, self.key):
                driver.execute(statement)

    def stamp(self, copies: Any) -> list[str]:
        """In the copy's transaction: the stamp of what its snapshot saw ([] without one)."""
        t, w = self.t, self.sql
        w.cleanup(t.driver, self.log, self.key)
        stamp = t.driver.scalar("SELECT " + w.stamp_sql(t, self.log, self.key, self.triggers))
        return [] if stamp is None else [str(stamp)]

    def users(self) -> int:
        """How many triggers write to the log (any copy's)."""
        return int(self.t.driver.scalar(self.sql.users_sql(self.t)) or 0)

    def uninstall(self, copies: Any, keep_shared: bool = False) -> None:
        """The copy's triggers and log rows; the log too once no trigger writes to it (unless
        `keep_shared`)."""
        t, d, driver = self.t, self.t.dialect, self.t.driver
        for name in self.triggers:
            driver.execute(f"DROP TRIGGER IF EXISTS {d.qualified(t.namespace, name)}")
        if driver.scalar(f"SELECT {self.exists_sql()}"):
            driver.execute(self.sql.delete_key_sql(self.log, self.key))
            if not keep_shared and not self.users():
                driver.execute(d.drop_table(self.log))

    def proof_sql(self, copies: Any, logged: bool) -> str:
        """SQL that is the copy's stamp where the run's snapshot proves the copy current, else
        NULL (frozen: a constant)."""
        if self.t.frozen:
            return "'frozen'"
        if not logged:
            return "NULL"
        return self.sql.proof_sql(copies.stamp_sql(), self.t, self.log, self.key, self.triggers)

    def why(self, record: str | None, proven: Any) -> str | None:
        return None if proven is not None else "written"


def copies_stamp(record: str | None) -> str:
    """The stamp line of a copy's record (its second line), '' where none."""
    lines = (record or "").split("\n")
    return lines[1] if len(lines) > 1 else ""


__all__ = [
    "Compared",
    "Fingerprint",
    "RowStamps",
    "Unprovable",
    "WriteLog",
    "copies_stamp",
    "copy_key",
]
