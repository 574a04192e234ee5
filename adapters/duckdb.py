"""DuckDBTable: wrap an existing DuckDB table of per-item counts.

    import duckdb
    from adapters.duckdb import DuckDBTable

    source = DuckDBTable("shop.duckdb", "item_votes", id="item", score="votes", frozen=True)
    source.prepare()  # once: the rank-ordered copy, in DuckDB

The store is the SQL store engine (adapters/sql/engine.py) over the DuckDB driver
(adapters/sql/driver.py) and the DuckDB dialect (adapters/dialects/duckdb/): its copy laid out in
rank order with its fingerprint (copy.py), the reads of that copy (reads.py), a refresh by delta
after writes (delta.py), and the reads of a table that is not frozen as it is now (table.py).

Canonical order (topk_middleware/access.py): score descending, ties by id ascending; text ids
compare by `COLLATE "binary"`, i.e. byte order of their UTF-8 text, whatever
`default_collation` the connection has set.

Freshness (docs/freshness.md): DuckDB has no triggers and no cheap proof that a copy is current,
so unless the table is `frozen=True` (the caller's promise that it does not change after
`prepare()`/`refresh()`) a run reads the table as it is now: its checks from aggregates DuckDB
answers without a pass, and the in-store one-shot on the table itself, keyed noise on row ids.
Frozen runs read the copy. After writes, `refresh()` (what `prepare(refresh=True)` does once a
copy exists) costs about one scan, not a sort: one pass finds the changed rows and keeps them in
a small delta merged with the copy on read, folded into a new copy past `fold_fraction` of m.

Every read of a run happens in one DuckDB transaction on a cursor of its own (the driver):
writers on other connections, including a concurrent `prepare(refresh=True)`, do not change what
the run sees.
"""

from __future__ import annotations

import os
from typing import Any

import duckdb
import numpy as np

from topk_middleware.access import RunTraits, ScoreBins
from topk_middleware.mechanisms.oblivious import ObliviousCosts

from ._sql import RankTableMismatchError, rank_table_name
from .dialects.duckdb import (
    NUMERIC_TYPES,
    OBLIVIOUS_COSTS_COPY,
    OBLIVIOUS_COSTS_LIVE,
    STORE_COSTS,
    DuckDBDialect,
    quote_identifier,
)
from .dialects.duckdb.delta import FOLD_FRACTION, RefreshReport
from .sql.driver import DuckDBDriver
from .sql.engine import SQLTable
from .sql.votes import count_votes, write_counts

__all__ = [
    "NUMERIC_TYPES",
    "OBLIVIOUS_COSTS_COPY",
    "OBLIVIOUS_COSTS_LIVE",
    "STORE_COSTS",
    "DuckDBTable",
    "RankTableMismatchError",
    "RefreshReport",
    "quote_identifier",
]


class DuckDBTable(SQLTable):
    """A histogram held in a DuckDB table: one row per item of the public domain.

    `table` (in `schema`, default the connection's) has an id column and a numeric score column.
    Names are quoted, never pasted: spaces, quotes, capitals and keywords are fine.
    `connection_or_path` is a DuckDB connection (or cursor) or a database file to open.
    `sensitivity` and `max_items_per_client` are declared by whoever built the table (else what
    from_votes recorded); `frozen=True` promises that the table does not change after
    prepare(); `rank_table` names the copy (default: derived from the table's and columns'
    names).
    """

    def __init__(
        self,
        connection_or_path: duckdb.DuckDBPyConnection | str | os.PathLike[str],
        table: str,
        id: str = "id",
        score: str = "score",
        *,
        schema: str | None = None,
        rank_table: str | None = None,
        sensitivity: float | None = None,
        max_items_per_client: int | None = None,
        frozen: bool = False,
    ) -> None:
        if not isinstance(frozen, bool):
            raise TypeError(f"frozen must be True or False, got {frozen!r}")
        if isinstance(connection_or_path, duckdb.DuckDBPyConnection):
            con, self._owns_connection = connection_or_path, False
        else:
            con, self._owns_connection = duckdb.connect(os.fspath(connection_or_path)), True
        where = "DuckDB table " + (repr(table) if schema is None else f"{schema!r}.{table!r}")
        self._rank_table = rank_table
        self.fold_fraction = FOLD_FRACTION  # a refresh by delta folds past this share of m
        self.last_refresh: RefreshReport | None = None
        super().__init__(
            DuckDBDriver(con),
            DuckDBDialect(),
            table,
            id,
            score,
            namespace=schema,
            frozen=frozen,
            sensitivity=sensitivity,
            max_items_per_client=max_items_per_client,
            where=where,
        )

    # The copy's names derive from the table's name as the catalog spells it (set by the engine's
    # constructor before it makes the layout): every spelling of one table finds one copy.
    @property
    def schema(self) -> str | None:
        return self.namespace

    @property
    def rank_table(self) -> str:
        return self._rank_table or rank_table_name(self.table, self.id_column, self.score_column)

    @property
    def runs_table(self) -> str:  # (first_rank, score) of each tied run
        return self.rank_table + "_runs"

    @property
    def shadow_table(self) -> str:  # refresh by delta (dialects/duckdb/delta.py)
        return self.rank_table + "_shadow"

    @property
    def delta_table(self) -> str:
        return self.rank_table + "_delta"

    @property
    def skip_table(self) -> str:
        return self.rank_table + "_skip"

    @property
    def reads_copy(self) -> bool:
        """Whether runs read the rank-ordered copy: only a frozen table's (module docstring);
        the others read the table as it is now and need no copy."""
        return self.frozen

    @property
    def oblivious_costs(self) -> ObliviousCosts:
        """The oblivious release's model: the copy's when the caller promised it current
        (`frozen`, a public choice), else the table's read by row id slot."""
        return OBLIVIOUS_COSTS_COPY if self.frozen else OBLIVIOUS_COSTS_LIVE

    # ----- the copy's lifecycle (dialects/duckdb/copy.py) -------------------------------------
    def prepare(self, refresh: bool = False, *, full: bool = False) -> None:
        """Create the rank-ordered copy (rank, id, score) if it is missing (or bring it up to date).

        Idempotent: without `refresh`, an existing copy that belongs to this table is kept. It
        must carry the fingerprint prepare() writes (else: RankTableMismatchError, a table of
        that name that prepare() did not build); one whose fingerprint does not fit the table
        (definition or row count changed) is rebuilt; and unless this object built or verified
        it in this open database, the copy is compared with the table (one scan) and rebuilt if
        they differ. With `refresh`, an existing copy is brought up to date by `refresh()`;
        `full=True` rebuilds the copy by a full sort instead. The table is validated first, in
        the transaction that writes the copy (one snapshot), so a run reading the old copy is
        not disturbed.
        """
        super().prepare(refresh, full=full)

    def refresh(self) -> RefreshReport:
        """Bring the copy up to date after writes to the table, at about the cost of one scan.

        One pass over the table finds the changed rows (score changed, inserted, deleted) and
        writes them into a small delta, merged with the base on read; past `fold_fraction` of m
        (default 5%) the delta is folded into a new base by a full rebuild instead. Without a
        base (or with one built before deltas existed) this is a full build. One transaction:
        runs in progress keep their snapshot. Returns what was done (also `last_refresh`).
        """
        if self._run is not None:
            raise RuntimeError("refresh() cannot run inside snapshot()")
        return self.copies.refresh()  # also self.last_refresh

    def is_stale(self) -> bool:
        """Whether the table's counts differ from the copy (True without one, or with one that
        does not belong to this table): one full scan of the table, joined on (id, score)."""
        return bool(self.copies.is_stale())

    def has_rank_index(self) -> bool:
        """Whether the ART index on the rank table's rank column exists."""
        return bool(self.copies.catalog()[1])

    # ----- what the run's own reads add (dialects/duckdb/reads.py, table.py) ------------------
    def run_traits(self) -> RunTraits:
        """access.RunTraits of the run in progress (the copy, with a pending delta or not, or
        the table); outside one, of a run opened for the question."""
        with self._in_run():
            return super().run_traits()

    @property
    def positions_are_ranks(self) -> bool:
        """False while a delta is pending (positions are then base ranks, moved and appended)
        and in oblivious reads of a table read as it is now (row id slots)."""
        with self._in_run():
            return bool(self._reads().traits().positions_are_ranks)

    def _reads(self) -> Any:
        reads = self._state().reads
        assert reads is not None  # every DuckDB run has the dialect's reads
        return reads

    def count_at_least(self, score: float) -> int | None:
        """access.CountAtLeast: how many rows score at least `score`, where zone maps count them
        (the table read as it is now, the base of a pending delta); None on a copy."""
        with self._in_run():
            return self._reads().count_at_least(score)  # type: ignore[no-any-return]

    def read_score_histogram(self, bins: ScoreBins) -> tuple[np.ndarray, np.ndarray] | None:
        """access.ScoreHistogramRead: on the table read as it is now, its scores at or below
        bins.top binned by one aggregate; None on a copy (its runs serve the histogram)."""
        with self._in_run():
            return self._reads().read_score_histogram(bins)  # type: ignore[no-any-return]

    def read_position_scores(self, positions: np.ndarray) -> tuple[np.ndarray, int, int] | None:
        """access.PositionScores: while a delta is pending, scores at positions without their
        rows; None otherwise (read the rows)."""
        with self._in_run():
            return self._reads().read_position_scores(positions)  # type: ignore[no-any-return]

    def position_slots(self) -> int:
        """access.PositionSlots: the row id slots in oblivious reads of a table read as it is
        now, else m."""
        with self._in_run():
            return int(self._reads().position_slots())

    def oneshot_reads(self) -> str | None:
        """access.OneShotReads: what the last in-store one-shot read."""
        return self.last_oneshot_reads

    def read_oneshot(self, noise: Any, k: int) -> Any:
        """access.InStoreOneShot: the engine's, noting what it read (oneshot_reads)."""
        with self._in_run():
            rows = super().read_oneshot(noise, k)
            self.last_oneshot_reads = self._reads().reads
            return rows

    last_oneshot_reads: str | None = None

    def close(self) -> None:
        """Close the connection if this object opened it."""
        if self._owns_connection:
            self.driver.conn.close()

    # ----- construction from raw votes ----------------------------------------------------------
    @classmethod
    def from_votes(
        cls,
        connection_or_path: duckdb.DuckDBPyConnection | str | os.PathLike[str],
        votes: str,
        items: str,
        *,
        client: str = "client",
        item: str = "item",
        item_id: str = "id",
        into: str | None = None,
        schema: str | None = None,
        replace: bool = False,
        weight: str | None = None,
        max_per_item: float = 1,
        max_items_per_client: int | None = None,
    ) -> DuckDBTable:
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
        dialect, con = (
            DuckDBDialect(caller_connection=True),
            (
                connection_or_path
                if isinstance(connection_or_path, duckdb.DuckDBPyConnection)
                else duckdb.connect(os.fspath(connection_or_path))
            ),
        )
        into = into or f"{votes}_counts"
        try:
            driver = DuckDBDriver(con, cursors=False)  # sees the caller's registered frames
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
                con,
                into,
                id="id",
                score="score",
                schema=schema,
                sensitivity=counts.sensitivity,
                max_items_per_client=counts.max_items,
            )
        except BaseException:  # refused: a connection opened here is closed, not left open
            if con is not connection_or_path:
                con.close()
            raise
        source._owns_connection = con is not connection_or_path
        return source
