"""PostgresTable: wrap an existing PostgreSQL table of per-item counts (psycopg 3).

Copy mode (the default) is the SQL store engine (adapters/sql/) over the psycopg driver
(adapters/sql/driver.py PsycopgDriver) and the PostgreSQL dialect (adapters/dialects/postgres/):

* the copy (copies.NamedCopy): a rank table (rank, id, score) in canonical order (score
  descending, ties by id ascending; text ids in byte order, COLLATE "C"), with unique B-trees on
  rank and id, and its runs of tied scores `<rank_table>_runs` (run, first_rank, score). Sorted
  access at depth t..t+n is a range of the rank B-tree, uniform item sampling a uniform rank
  (`rank = ANY(...)`), random access by id the id B-tree; each batch one query. Reading both
  from the copy keeps sorted access and sampling consistent by construction (a position is
  only meaningful in the order it was computed in). prepare() creates no index on the table
  itself: runs never read it for those, and indexes there would only slow its writers.
* refreshes build new tables beside the old ones and swap them in at the end of their
  transaction, so runs in progress keep their snapshot; the swap waits for them at most
  `swap_timeout` seconds, then gives up with a clear error and changes nothing.
* freshness (docs/freshness.md): unless `frozen=True`, a run serves the copy only where its
  first query proves it current by the write log (statement triggers: freshness.WriteLog and
  adapters/dialects/postgres/writes.py). Otherwise it reads the table itself in its snapshot
  (the in-store one-shot on its rows by ctid: adapters/sql/table_read.py), reads the copy
  around the changes (around.py), or has the copy rebuilt first: the cheapest, or the rebuild
  for an oblivious run.

Every read of a run happens in one REPEATABLE READ READ ONLY transaction opened by snapshot().
Live mode (`mode="live"`) reads the table itself through its B-trees and a position table kept
current by triggers, with no rebuild after writes (adapters/postgres/live/).
"""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg

from adapters._sql import RankTableMismatchError, rank_table_name
from adapters.dialects.postgres import PostgresDialect, short_name
from adapters.dialects.postgres.costs import STORE_COSTS
from adapters.sql.around import ChangeLog
from adapters.sql.copies import CopyNames, NamedCopy
from adapters.sql.driver import PsycopgDriver
from adapters.sql.engine import SQLTable
from adapters.sql.freshness import WriteLog

from ..sql.votes import count_votes, write_counts

MODES = ("copy", "live")
__all__ = ["MODES", "STORE_COSTS", "PostgresTable", "RankTableMismatchError", "runs_table_name"]


def runs_table_name(rank_table: str) -> str:
    """The runs table of `rank_table`: `<rank_table>_runs`, or, when that passes PostgreSQL's
    63-byte limit, the rank table's name cut short, a hash of the whole of it and `_runs`
    (short_name)."""
    return short_name(rank_table, "_runs")


def copy_names(schema: str | None, rank_table: str) -> CopyNames:
    """The copy's objects: the rank table, its runs table, their B-trees, and the names a
    refresh builds beside them (topk_<digest>_new...)."""
    digest = hashlib.sha1(rank_table.encode("utf-8")).hexdigest()[:12]
    return CopyNames(
        schema,
        rank_table,
        runs_table_name(rank_table),
        f"topk_{digest}_rank",
        f"topk_{digest}_id",
        (
            f"topk_{digest}_new",
            f"topk_{digest}_new_runs",
            f"topk_{digest}_new_rank",
            f"topk_{digest}_new_id",
        ),
    )


class PostgresTable(SQLTable):
    """A histogram held in a PostgreSQL table: one row per item of the public domain.

    `conninfo_or_connection` is a libpq connection string (the adapter opens and owns an
    autocommit connection, and reconnects it when lost) or a psycopg Connection that is not
    inside a transaction. `rank_table` names the copy (default: from the table's and columns'
    names). `mode="copy"` (the default) serves runs from the rank table prepare() writes
    (module docstring); `mode="live"` reads the table itself (live/). `sensitivity` and
    `max_items_per_client` are declared by whoever built the table (else what from_votes
    recorded with it, else (1, None)); `frozen=True` promises that it does not change after
    prepare()."""

    # The class serving each mode other than "copy" (live/ registers itself).
    mode_classes: dict[str, type] = {}  # noqa: RUF012

    def __new__(cls, *args: Any, mode: str = "copy", **kwargs: Any) -> Any:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if cls is PostgresTable and mode in cls.mode_classes:
            return cls.mode_classes[mode](*args, mode=mode, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        conninfo_or_connection: str | psycopg.Connection[Any],
        table: str,
        id: str = "id",
        score: str = "score",
        *,
        schema: str | None = None,
        rank_table: str | None = None,
        mode: str = "copy",
        sensitivity: float | None = None,
        max_items_per_client: int | None = None,
        frozen: bool = False,
    ) -> None:
        where = "PostgreSQL table " + (repr(table) if schema is None else f"{schema!r}.{table!r}")
        driver = PsycopgDriver(conninfo_or_connection, where)
        self.mode = mode
        try:
            super().__init__(
                driver,
                PostgresDialect(),
                table,
                id,
                score,
                namespace=schema,
                frozen=frozen,
                sensitivity=sensitivity,
                max_items_per_client=max_items_per_client,
                where=where,
                layout=lambda t: NamedCopy(
                    t, copy_names(t.namespace, rank_table or rank_table_name(t.table, id, score))
                ),
                proof=self._write_log,
            )
            self.dialect.hides_statistics(driver)  # asked once per connection: traits() reads it
        except BaseException:  # refused: a connection opened here is closed, not left open
            driver.close()
            raise

    @staticmethod
    def _write_log(t: SQLTable) -> WriteLog:
        """The write log of the copy, its trigger topk_<digest>_writes, and its change log (the
        change table, sequence, function and triggers topk_<digest>_...)."""
        digest = hashlib.sha1(t.copies.names.ranks.encode("utf-8")).hexdigest()[:12]
        changes = t.dialect.change_names(t, f"topk_{digest}")
        return WriteLog(t, t.copies.ranks, f"topk_{digest}_writes", changes=ChangeLog(t, changes))

    # ----- the catalog names (public: tests, the CLI and operators read them) -------------------
    @property
    def schema(self) -> str | None:
        return self.namespace

    @property
    def rank_table(self) -> str:
        return self.copies.names.ranks

    @property
    def runs_table(self) -> str:
        return self.copies.names.runs

    @property
    def rank_index(self) -> str:
        return self.copies.names.rank_index

    @property
    def id_index(self) -> str:
        return self.copies.names.id_index

    @property
    def writes_trigger(self) -> str:
        return self.proof.trigger

    @property
    def change_triggers(self) -> tuple[str, ...]:
        return self.proof.changes.names.triggers

    @property
    def changes_table(self) -> str:
        """The change table, qualified and quoted."""
        return self.proof.changes.names.changes

    @property
    def _conn(self) -> psycopg.Connection[Any]:
        """The connection (the driver's: after a reconnect, the new one)."""
        return self.driver.conn  # type: ignore[attr-defined,no-any-return]

    @property
    def _owns_connection(self) -> bool:
        return bool(self.driver.owns)  # type: ignore[attr-defined]

    @_owns_connection.setter
    def _owns_connection(self, owned: bool) -> None:
        self.driver.owns = owned  # type: ignore[attr-defined]

    def prepare(
        self,
        refresh: bool = False,
        *,
        statement_timeout: float | None = PostgresDialect.prepare_statement_timeout,
        swap_timeout: float = PostgresDialect.swap_timeout,
    ) -> None:
        """Create the rank table (rank, id, score) if it is missing, or with `refresh=True`
        rebuild it from the table's current state, with its unique B-trees on rank and id and
        the runs table of its tied scores (copies.NamedCopy); install the write log first.

        Idempotent: without `refresh`, a rank table that belongs to this table (its
        fingerprint) is kept; one built from an earlier table of the same name is rebuilt; a
        table of that name that prepare() did not build is refused (RankTableMismatchError).
        Validation and copy read one REPEATABLE READ snapshot. A rebuild waits up to
        `swap_timeout` seconds for runs still reading the old tables, then raises TimeoutError
        and changes nothing. Concurrent prepare() calls on one rank table wait for each other
        (a session advisory lock). Each statement has `statement_timeout` seconds (None: the
        server's setting), and the server stops the work of a client that went away
        (client_connection_check_interval, PostgreSQL >= 14)."""
        super().prepare(refresh, statement_timeout=statement_timeout, swap_timeout=swap_timeout)

    # ----- construction from raw votes ----------------------------------------------------------
    @classmethod
    def from_votes(
        cls,
        conninfo_or_connection: str | psycopg.Connection[Any],
        votes: str,
        items: str,
        *,
        client: str = "client",
        item: str = "item",
        item_id: str = "id",
        into: str | None = None,
        schema: str | None = None,
        replace: bool = False,
        mode: str = "copy",
        weight: str | None = None,
        max_per_item: float = 1,
        max_items_per_client: int | None = None,
    ) -> PostgresTable:
        """Count votes per item over the public table of all items, each client's contribution
        bounded (adapters/sql/votes.py: the checks, the count and its record, in one
        transaction; the law: adapters/contributions.py).

        `votes` holds (client, item[, weight]) rows; `items` is the public domain (column
        `item_id`). A client adds to an item min(its rows for the item, or the sum of their
        `weight`, `max_per_item`) (COUNT(DISTINCT client) when that is 1 without weight), to at
        most `max_items_per_client` items chosen by a keyed hash; the source's sensitivity is
        `max_per_item`. The counts go into the table `into` (default `<votes>_counts`) with
        columns (id, score); a LEFT JOIN keeps items without votes (score 0), so m is the size of
        `items`. A vote for an item missing from `items` is an error: the domain must be public
        and complete; so is a negative, NaN or infinite weight.
        """
        dialect, driver = PostgresDialect(), PsycopgDriver(conninfo_or_connection)
        conn, owned = driver.conn, driver.owns
        into = into or f"{votes}_counts"
        try:
            counts = count_votes(
                dialect,
                driver,
                votes=votes,
                items=items,
                schema=schema,
                client=client,
                item=item,
                item_id=item_id,
                weight=weight,
                max_per_item=max_per_item,
                max_items_per_client=max_items_per_client,
            )
            write_counts(dialect, driver, counts, into=into, schema=schema, replace=replace)
            source = cls(
                conn,
                into,
                id="id",
                score="score",
                schema=schema,
                mode=mode,
                sensitivity=counts.sensitivity,
                max_items_per_client=counts.max_items,
            )
        except BaseException:  # refused: a connection opened here is closed, not left open
            if owned:
                conn.close()
            raise
        source._owns_connection = owned
        return source
