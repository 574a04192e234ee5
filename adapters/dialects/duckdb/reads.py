"""DuckDB's reads of its copy (engine.Reads strategies the copy layout hands a run): row id
ranges for sorted reads, ART index lookups for short batches by rank, the first rows from the
fingerprint, the in-store one-shot in one statement; and the same over the copy with a pending
delta (delta.py), whose in-store one-shot reads the table itself where that is cheaper.

The copy is written in rank order, so its row ids are ranks: a sorted read is a row id range
(a range scan the zone maps serve; a predicate on rank from 0 would go through the ART index,
row by row, at about 4 us a row). The ranks that come back prove it; if they ever did not, the
read falls back to the rank predicate. A batch of up to INDEX_LOOKUP_MAX ranks is an IN list of
constants the ART index serves key by key (about 25 us a key at m = 10^7); a longer one is one
scan of the rank column (a semi-join).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from adapters._sql import scores_in_order
from adapters.sql.whole import MEMORY_COSTS
from topk_middleware.access import Rows, RunTraits, StoreCosts
from topk_middleware.keyed_noise import KeyedNoise, oneshot_query

from . import STORE_COSTS, rows_of
from .table import TableReads, Unreadable, table_costs

# Random access by rank: up to this many ranks are looked up in the rank index, key by key.
INDEX_LOOKUP_MAX = 1000
# A range read of the rank table costs about 0.7 ms up to this many rows (then 0.1 ms more per
# 2,000 or so; measured at m = 10^7): sorted reads fetch at least this many.
SORTED_READ_ROWS = 8192


def empty_rows() -> Rows:
    return Rows(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0))


class CopyReads:
    """A run of a frozen copy without a pending delta (module docstring)."""

    positions_are_ranks = True

    def __init__(self, t: Any, copy: Any, m: int, indexed: bool, head: Rows | None) -> None:
        self.t, self.copy, self.driver = t, copy, t.driver
        self.m, self.indexed, self.head = m, indexed, head
        self.reads: str | None = None  # what the last in-store one-shot read

    def costs(self) -> StoreCosts:
        """The store's costs; a run whose fingerprint held every row of the copy (a small one,
        fingerprint.WHOLE_HEAD_ROWS) has them in memory and is priced as rows read whole
        (whole.MEMORY_COSTS: the one-shot over the rows in hand, no statement)."""
        return MEMORY_COSTS if self._whole_in_hand() else STORE_COSTS

    def _whole_in_hand(self) -> bool:
        return self.head is not None and len(self.head) >= self.m

    def traits(self) -> RunTraits:
        return RunTraits(
            positions_are_ranks=self.positions_are_ranks,
            sorted_read_rows=self.m if self._whole_in_hand() else SORTED_READ_ROWS,
            sorted_rows_in_hand=0 if self.head is None else len(self.head),
            costs=self.costs(),
            oblivious_costs=self.t.oblivious_costs,
        )

    def read_sorted(self, start: int, stop: int) -> Rows:
        head = self.head  # the first rows, from the fingerprint the run's first query read
        if head is not None and stop <= len(head):
            return Rows(
                head.positions[start:stop], head.ids[start:stop], head.scores[start:stop],
                round_trips=0,
            )  # fmt: skip
        ranks, bounds = self.copy.ranks, {"start": start, "stop": stop}
        rows = rows_of(
            self.driver.arrays(
                f"SELECT rank, id, score FROM {ranks} WHERE rowid >= :start AND rowid < :stop",
                bounds,
            )
        )
        if (
            len(rows) == stop - start
            and rows.positions[0] == start
            and rows.positions[-1] == stop - 1
        ):
            return rows  # stop - start distinct ranks from start to stop - 1: all of them
        return rows_of(
            self.driver.arrays(
                f"SELECT rank, id, score FROM {ranks} WHERE rank >= :start AND rank < :stop", bounds
            )
        )

    def read_positions(self, positions: np.ndarray) -> Rows:
        wanted = np.unique(positions)
        ranks = self.copy.ranks
        if self.indexed and len(wanted) <= INDEX_LOOKUP_MAX:
            keys = ", ".join(str(int(r)) for r in wanted)
            return rows_of(
                self.driver.arrays(f"SELECT rank, id, score FROM {ranks} WHERE rank IN ({keys})")
            )
        return rows_of(
            self.driver.arrays(
                f"SELECT r.rank, r.id, r.score FROM {ranks} AS r "
                "WHERE r.rank IN (SELECT unnest(:ranks::BIGINT[]))",
                {"ranks": wanted.tolist()},
            )
        )

    def read_ids(self, ids: list[Any]) -> np.ndarray:
        if not ids:
            return np.empty(0, dtype=np.float64)
        c = self.copy.names.collate
        found = dict(
            self.driver.execute(
                f"SELECT id, score FROM {self.copy.ranks} WHERE id{c} IN (SELECT unnest(:ids){c})",
                {"ids": ids},
            )
        )
        return scores_in_order(found, ids, self.t.where)

    def read_oneshot(self, noise: KeyedNoise, k: int) -> Rows:
        """InStoreOneShot: the k rows of largest min(score, cap) + keyed noise over the copy
        (keyed_noise.py), best first, ties by smaller position, in one statement."""
        self.reads = "the copy"
        return copy_oneshot(self.t, self.copy.ranks, "rank", noise, k)

    def oneshot_positions(self) -> int:
        return self.m

    def read_exact_scores(self, ids: list[Any]) -> list[Any] | None:
        """None: the copy holds doubles, so exact scores are asked of the table by id."""
        return None

    def count_at_least(self, score: float) -> int | None:
        return None

    def read_position_scores(self, positions: np.ndarray) -> Any:
        return None

    def read_score_histogram(self, bins: Any) -> Any:
        return None

    def position_slots(self) -> int:
        return self.m


class DeltaReads(CopyReads):
    """A run of a frozen copy with a pending delta: positions are base ranks moved and
    appended (delta.py), reads merge the base with the delta; the in-store one-shot reads the
    table itself where its first query finds it valid and of the copy's m (the frozen promise:
    the table is what the copy and its delta hold): three scans, against an anti-join of the
    skipped ranks over the whole base and a union."""

    positions_are_ranks = False

    def __init__(self, t: Any, copy: Any, delta: Any, indexed: bool) -> None:
        super().__init__(t, copy, delta.m, indexed, None)
        self.delta = delta
        self._table: Any = None
        self._table_checked = False

    def costs(self) -> StoreCosts:
        """The copy's, but its in-store one-shot reads the table (table.py's costs)."""
        return replace(STORE_COSTS, oneshot_fixed=table_costs(self.m).oneshot_fixed)

    def read_sorted(self, start: int, stop: int) -> Rows:
        return self.delta.read_sorted(start, stop - start)

    def read_positions(self, positions: np.ndarray) -> Rows:
        wanted = np.unique(positions).tolist()
        return self.delta.read_positions(wanted, INDEX_LOOKUP_MAX if self.indexed else 0)

    def read_ids(self, ids: list[Any]) -> np.ndarray:
        if not ids:
            return np.empty(0, dtype=np.float64)
        found = dict(self.driver.execute(self.delta.read_ids_query(), {"ids": ids}))
        return scores_in_order(found, ids, self.t.where)

    def table(self) -> Any:
        """The table read as it is now, in the run's transaction, where it is as promised;
        looked up once per run (None otherwise)."""
        if not self._table_checked:
            self._table_checked = True
            try:
                table = TableReads.open(self.t, slots=False)
            except Unreadable:
                raise
            except (ValueError, TypeError):
                table = None  # not as promised: the copy's own one-shot
            if table is not None and table.m == self.m and table.rowids:
                self._table = table
        return self._table

    def read_oneshot(self, noise: KeyedNoise, k: int) -> Rows:
        table = self._table  # where oneshot_positions chose it (its positions are row ids)
        if table is not None:
            self.reads = "the table"
            return table.read_oneshot(noise, k)
        self.reads = "the copy and its delta"
        return copy_oneshot(self.t, self.delta.relation(), "position", noise, k)

    def oneshot_positions(self) -> int:
        """The table's row id slots where its one-shot reads the table, else m (this also
        chooses where it reads)."""
        table = self.table()
        return table.rowids if table is not None else self.m

    def count_at_least(self, score: float) -> int | None:
        """The base's count (the table's one-shot's rows, near enough), from its zone maps."""
        return int(
            self.driver.scalar(
                f"SELECT count(*) FROM {self.copy.ranks} WHERE score >= :s", {"s": float(score)}
            )
        )

    def read_position_scores(self, positions: np.ndarray) -> Any:
        return self.delta.read_position_scores(np.asarray(positions, dtype=np.int64))


def copy_oneshot(t: Any, relation: str, position: str, noise: KeyedNoise, k: int) -> Rows:
    """The in-store one-shot over `relation` (position, id, score) in one statement; the key
    and the exceedances are parameters, never statement text."""
    d = t.dialect
    query = oneshot_query(
        relation,
        position,
        noise.sql(d.keyed_uniform("key", f"r.{position}")),
        "SELECT unnest(:positions::BIGINT[]), unnest(:noises::DOUBLE[])",
        noise.bound,
        ":k",
        materialized="MATERIALIZED ",
        score_cap=noise.score_cap,
    )
    got = t.driver.arrays(
        query,
        {
            "key": noise.key,
            "k": int(k),
            "positions": noise.exceed_positions.tolist(),
            "noises": noise.exceed_noises.tolist(),
        },
    )
    ids = np.asarray(got["id"])
    if ids.dtype.kind in "US":
        ids = ids.astype(object)
    return Rows(np.asarray(got["position"], dtype=np.int64), ids, np.asarray(got["score"], float))


__all__ = ["INDEX_LOOKUP_MAX", "SORTED_READ_ROWS", "CopyReads", "DeltaReads"]
