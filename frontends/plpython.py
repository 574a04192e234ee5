"""SPITable: a live PostgreSQL table read from inside the server, through PL/Python's SPI.

What `topk.private_top_k(...)` (frontends/sql/bodies.py) reads. The table was prepared in live
mode (adapters/postgres/live/: a B-tree on (score DESC, id), the position table `<table>_topk_pos`
kept dense by triggers) and registered. Its statements are the PostgreSQL dialect's reads of a
live table (adapters/dialects/postgres/live_reads.py: by position, by id, the oblivious reads,
the keyset pages, the run's facts), run by the server process itself through SPIDriver
(adapters/dialects/postgres/spi.py: plpy.prepare once per statement, no network round trip);
its costs are the dialect's measured SPI records (costs.py). Every read is counted by
CountedAccess like any store's (`round_trips` counts SPI queries).

What is SPI's own is here. Snapshot: the SQL function is STABLE, so PostgreSQL runs every SPI
query of the call in the snapshot of the calling statement (no new snapshot per query, as a
VOLATILE function would take): one snapshot for the whole run (DESIGN invariant 4), whatever the
caller's isolation level, and no transaction to open. Sorted access walks keyset pages (a SQL
function holds no server-side cursor across calls of the core); positions are not ranks (a
live table), so nothing is inferred from tied neighbours. The plans of oblivious releases are
pinned by the SQL functions' SET clauses (frontends/sql/hiding.py: generic plans, no parallel
workers, no hash or merge join, no bitmap or sequential scan, no sort), not by the run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from adapters._sql import rows_from_records
from adapters.dialects.postgres import INTEGER_TYPES
from adapters.dialects.postgres import live_reads as reads
from adapters.dialects.postgres.costs import SPI_COSTS, SPI_OBLIVIOUS_COSTS
from adapters.dialects.postgres.spi import SPIDriver
from topk_middleware.access import AccessError, Rows, RunTraits, StoreTraits

# The most rows an oblivious release reads through SPI (they are held in the server process):
# more is refused before anything is charged.
MAX_OBLIVIOUS_ROWS = 5_000_000


class SPITable:
    """A registered live table, read through SPI inside the server (module docstring).

    `relation` is the table's qualified name as regclass prints it; `id_type` / `score_type` the
    columns' types (format_type); `position_table` the qualified position table; `trigger_prefix`
    the name its three triggers start with (checked on every run, as a live run does).
    """

    positions_are_ranks = False
    store_costs = SPI_COSTS
    oblivious_costs = SPI_OBLIVIOUS_COSTS
    max_oblivious_rows = MAX_OBLIVIOUS_ROWS
    deadline: float | None = None  # the registration's padding of oblivious releases

    def __init__(
        self,
        plpy: Any,
        relation: str,
        id_column: str,
        score_column: str,
        id_type: str,
        score_type: str,
        position_table: str,
        trigger_prefix: str,
        text_ids: bool,
    ) -> None:
        self.where = f"table {relation}"
        # declared by the table's registration, set before a release (sources.spi_table)
        self.sensitivity: float | None = None
        self.max_items_per_client: int | None = None
        self.id_column, self.score_column = id_column, score_column
        self.trigger_prefix = trigger_prefix
        self._relation = relation
        self.integer_scores = score_type in INTEGER_TYPES  # the noisy counts' interval
        self.names = reads.LiveNames(
            relation,
            position_table,
            plpy.quote_ident(id_column),
            plpy.quote_ident(score_column),
            text_ids,
            id_type in INTEGER_TYPES,
        )
        # each parameter name of the dialect's statements, typed as SPI plans need
        types = {"count": "bigint", "start": "bigint", "positions": "bigint[]"}
        types |= {"score": score_type, "id": id_type, "ids": f"{id_type}[]"}
        self.driver = SPIDriver(plpy, {**types, "relation": "text", "triggers": "text"})
        self._pages = reads.pages_sql(self.names)
        self._facts = reads.facts_sql(self.names)
        self._dense = False  # ids 0..m-1: an item's position is its id
        self._oblivious = False
        self._m_value: int | None = None
        self._depth = 0  # the next depth keyset pagination serves
        self._last: tuple[Any, Any] | None = None  # (raw score, id) of the last row served

    # ----- the Source protocol ------------------------------------------------------------------
    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """The calling statement's snapshot (a STABLE function takes no other): nothing to open."""
        self._m_value, self._depth, self._last = None, 0, None
        try:
            yield None
        finally:
            self._m_value, self._depth, self._last = None, 0, None

    @contextmanager
    def oblivious_reads(self) -> Iterator[None]:
        """access.ObliviousReads: the dialect's oblivious reads of a live table."""
        saved, self._oblivious = self._oblivious, True
        try:
            yield
        finally:
            self._oblivious = saved

    def traits(self) -> StoreTraits:
        """access.StoreTraits: the sensitivity and bound of the table's registration (set by
        the SQL function before a release: never assumed), the score column's type."""
        return StoreTraits(
            self.sensitivity,  # type: ignore[arg-type]  # None: refused by the core
            self.max_items_per_client,
            self.integer_scores,
            max_oblivious_rows=self.max_oblivious_rows,
        )

    def run_traits(self) -> RunTraits:
        """access.RunTraits: positions from the position table, SPI's costs."""
        return RunTraits(
            positions_are_ranks=False, costs=self.store_costs, oblivious_costs=self.oblivious_costs
        )

    def domain_size(self) -> int:
        """m, after checking the triggers and the scores' extremes: four index probes."""
        if self._m_value is not None:
            return self._m_value
        params = {"relation": self._relation, "triggers": self.trigger_prefix + "%"}
        triggers, m, top, bottom, low, high = self.driver.execute(self._facts, params)[0]
        if triggers != 3:
            raise ValueError(
                f"{self.where} has lost the triggers of its position table: prepare it again in "
                "live mode and register it again (topk-middleware install-sql --source)"
            )
        self._m_value = reads.check_facts(self.where, self.score_column, m, top, bottom)
        # m distinct integer ids (a unique B-tree) from 0 to m - 1 are exactly 0..m-1
        self._dense = low == 0 and high == self._m_value - 1
        return self._m_value

    def read_sorted(self, start: int, count: int) -> Rows:
        """Keyset pages (live_reads.pages_sql): after the last row served, else OFFSET."""
        m = self.domain_size()
        start, stop = int(start), min(int(start) + int(count), m)
        if stop <= start:
            return rows_from_records([])
        n = stop - start
        if start == 0:
            found = self.driver.execute(self._pages["first"], {"count": n})
        elif start == self._depth and self._last is not None:
            score, id_ = self._last
            found = self.driver.execute(
                self._pages["after"], {"score": score, "id": id_, "count": n}
            )
        else:
            found = self.driver.execute(self._pages["offset"], {"count": n, "start": start})
        if found:
            self._last, self._depth = (found[-1][3], found[-1][1]), start + len(found)
        if self._oblivious and self._dense:  # an item's position is its id (domain_size)
            return rows_from_records([(i, i, s) for _, i, s, _ in found])
        return rows_from_records([(p, i, s) for p, i, s, _ in found])

    def read_sorted_ids(self, count: int) -> Rows:
        """access.SortedIds: the top `count` rows' ids and scores (positions -1), in oblivious
        reads; read_sorted's rows otherwise."""
        if not self._oblivious:
            return self.read_sorted(0, count)
        count = min(int(count), self.domain_size())
        return reads.read_top_ids(self.driver, self.names, count, self.where)

    def read_positions(self, positions: np.ndarray) -> Rows:
        if self._oblivious and len(positions):
            return reads.read_each_position(
                self.driver, self.names, self._dense, positions, self.where
            )
        return reads.read_positions(self.driver, self.names, positions)

    def read_ids(self, ids: Sequence[Any]) -> np.ndarray:
        return reads.read_ids(self.driver, self.names, ids, self.where)

    def read_exact_scores(self, ids: Sequence[Any]) -> list[Any]:
        """ExactScores: the scores in the table's own type (bigint as Python ints, numeric as
        Decimals: PL/Python's conversions)."""
        return reads.read_exact_scores(self.driver, self.names, ids, self.where)

    def score_run_count(self) -> int | None:
        return None

    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        raise AccessError("a live table keeps no runs of tied scores")


__all__ = ["MAX_OBLIVIOUS_ROWS", "SPI_COSTS", "SPI_OBLIVIOUS_COSTS", "SPITable"]
