"""DuckDB tables read as they are now: what `DuckDBTable` does unless the table is frozen.

DuckDB has no triggers and no catalog value that an UPDATE in place changes, so nothing proves
cheaply that a rank-ordered copy is current (docs/freshness.md). A run that is not frozen reads
the table itself: its checks come from aggregates DuckDB answers without a pass, and the release
from the one-shot mechanism (Wu, Ohrimenko, Wirth 2023, Algorithm 2) run inside DuckDB with keyed
noise (topk_middleware/keyed_noise.py) whose positions are the table's rowids.

`LiveRead` is a mixin of DuckDBTable: it uses the table's quoted names (`_base`, `_id`,
`_score`, `_order`, `_collate`), `where`, `table`, `_home()`, `_state()` and `_whole_scores`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np

from topk_middleware.access import Rows, StoreCosts
from topk_middleware.keyed_noise import KeyedNoise, capped_sql, uniform_from_hex_sql

from ._sql import TableFacts, raise_if_invalid
from .duckdb_delta import DeltaView

# A table read as it is now, without a key on its id column, has its ids counted up to this
# many rows (count(DISTINCT): ~20 ms at 10^5 rows, 0.35 s at 10^6, 2.4 s at 10^7); past it a
# run checks the ids of the rows it reads (declare a PRIMARY KEY: DuckDB then enforces them).
DISTINCT_CHECK_MAX = 100_000


@dataclass
class _Run:
    """The state of one snapshot: its own connection in one transaction, and what it counted."""

    cursor: duckdb.DuckDBPyConnection
    ranked: bool
    m: int
    indexed: bool = False
    runs: int | None = None  # runs of tied scores in the runs table, if there is one
    delta: DeltaView | None = None  # a non-empty delta over the base (adapters/duckdb_delta.py)
    rowids: int = 0  # the table read as it is now (not frozen): 1 + its largest rowid


def live_costs(m: int) -> StoreCosts:
    """The table read as it is now (not frozen), measured at m = 10^5 to 10^7 (benchmarks/
    freshness.py --rounds): a sorted read is an ORDER BY .. LIMIT (a scan of the score column,
    ~10-40 ms at 10^7), a batch of random reads by rank a window over the whole table (~1 s),
    the in-store one-shot a semi-join on rowid, a top-k and a range read (~30-60 ms at 10^7)
    plus the keyed hash on the rows past the cut, a full read ~0.1 s plus the noise in Python."""
    return StoreCosts(
        round_trip=1e-3 + 3e-9 * m,
        sorted_row=5e-8,
        random_batch=1e-2,
        random_row=1e-7,
        random_batch_item=1e-7,
        oneshot_row=4e-7,
        full_read_row=5e-8,
        oneshot_fixed=3e-3 + 5e-9 * m,
    )


class LiveRead:
    """The reads of a DuckDBTable that is not frozen (module docstring)."""

    _base: str
    _id: str
    _score: str
    _order: str
    _collate: str
    _whole_scores: bool
    where: str
    table: str
    id_column: str
    score_column: str

    # ----- reading the table as it is now (not frozen) -------------------------------------------
    def _live_run(self, con: duckdb.DuckDBPyConnection) -> _Run:
        """The state of a run that reads the table itself: m, the rowid range and the checks of
        `validate()` on the scores, from aggregates DuckDB answers without a full pass (count,
        min, max; about 0.4 ms at m = 10^7) and the table's row slots from the catalog
        (`estimated_size`, rows ever appended, deleted ones included: an upper bound of the
        rowids, checked by one rowid-range probe). Ids are unique by the table's PRIMARY KEY or
        UNIQUE constraint where it has one; otherwise the rows a run reads are checked
        (`read_oneshot`): counting distinct ids costs seconds at 10^7 rows."""
        s = self._score
        database, schema = self._home()
        rows, ids, scores, low, high, slots = con.execute(
            f"SELECT count(*), count({self._id}), count({s}), min({s}), max({s}), "
            "(SELECT max(estimated_size) FROM duckdb_tables() WHERE database_name = $db "
            f"AND lower(schema_name) = $schema AND lower(table_name) = $table) FROM {self._base}",
            {"db": database, "schema": schema, "table": self.table.lower()},
        ).fetchone()
        rows, high_f = int(rows), float(high) if high is not None else 0.0
        bad = (low is not None and float(low) < 0) or math.isnan(high_f) or math.isinf(high_f)
        negative = non_finite = 0
        if bad:  # count them exactly for the message
            non_finite, negative = con.execute(
                f"SELECT count_if(isnan({s}::DOUBLE) OR isinf({s}::DOUBLE)), "
                f"count_if({s} < 0) FROM {self._base}"
            ).fetchone()
        facts = TableFacts(
            rows, rows - int(ids), rows, rows - int(scores), int(non_finite), int(negative)
        )
        raise_if_invalid(facts, self.where, self.id_column, self.score_column, None)
        if rows <= DISTINCT_CHECK_MAX and not self._unique_ids(con):
            self._refuse_duplicates(con, rows)
        slots = int(slots or 0)
        beyond = con.execute(
            f"SELECT count(*) FROM {self._base} WHERE rowid >= $slots", {"slots": slots}
        ).fetchone()[0]
        if beyond or slots < rows:  # not the catalog's figure: count the rowids
            slots = int(con.execute(f"SELECT max(rowid) + 1 FROM {self._base}").fetchone()[0])
        return _Run(con, False, rows, rowids=max(slots, 1))

    def _unique_ids(self, con: duckdb.DuckDBPyConnection) -> bool:
        """Whether the table's id column alone carries a PRIMARY KEY or UNIQUE constraint (a
        catalog lookup, made once per object: DuckDB cannot drop such a constraint)."""
        if not getattr(self, "_keyed", False):
            database, schema = self._home()
            found = con.execute(
                "SELECT constraint_column_names FROM duckdb_constraints() "
                "WHERE database_name = $db AND lower(schema_name) = $schema "
                "AND lower(table_name) = $table AND constraint_type IN ('PRIMARY KEY', 'UNIQUE')",
                {"db": database, "schema": schema, "table": self.table.lower()},
            ).fetchall()
            self._keyed = any(list(names) == [self.id_column] for (names,) in found)
        return self._keyed

    def _refuse_duplicates(self, con: duckdb.DuckDBPyConnection, rows: int) -> None:
        """validate()'s duplicate check (a hash aggregate: ~20 ms at 10^5 rows, 0.3 s at 10^6)."""
        c = self._collate
        distinct, nulls = con.execute(
            f"SELECT count(DISTINCT {self._id}{c}), count(*) - count({self._id}) FROM {self._base}"
        ).fetchone()
        if int(distinct) + int(nulls) == rows:
            return
        duplicate = con.execute(
            f"SELECT {self._id}{c} FROM {self._base} GROUP BY {self._id}{c} "
            "HAVING count(*) > 1 LIMIT 1"
        ).fetchone()[0]
        facts = TableFacts(rows, 0, int(distinct) + int(nulls), 0, 0, 0)
        raise_if_invalid(facts, self.where, self.id_column, self.score_column, duplicate)

    def count_at_least(self, score: float) -> int | None:
        """How many rows have a score >= `score`, while the table is read as it is now (the
        planner's count of rows the in-store one-shot hashes: zone maps answer it in about
        0.3 ms at m = 10^7); None on the copy. A count the planner makes, not an access."""
        run = self._state()
        if not run.rowids:
            return None
        level = math.ceil(score) if self._whole_scores else float(score)
        return int(
            run.cursor.execute(
                f"SELECT count(*) FROM {self._base} WHERE {self._score} >= $s", {"s": level}
            ).fetchone()[0]
        )

    def oneshot_positions(self) -> int:
        """How many positions the in-store one-shot samples its exceedances from: the rowid
        range while the table is read as it is now (rowids of deleted rows stay unused: each
        position is still an exceedance with probability q, independently), else m."""
        run = self._state()
        return run.rowids if run.rowids else run.m

    def _live_oneshot(self, run: _Run, noise: KeyedNoise, k: int) -> Rows:
        """Algorithm 2 with keyed noise on the table itself, positions its rowids (fixed within
        the transaction): first the exceedances and the k top rows with their noisy scores,
        whose k-th largest T bounds the answer's; then the rows with score >= T - bound (the
        only ones that can reach T; the zone maps skip the rest), best k of both."""
        r = "r.position"
        digits = f"('0x' || substr(sha256($key || ':' || {r}::VARCHAR), 1, 13))::UBIGINT"
        keyed = noise.sql(uniform_from_hex_sql(digits + "::DOUBLE"))
        table, sid, ssc = self._base, self._id, self._score
        exceed = noise.exceed_positions.tolist()
        known = run.cursor.execute(
            f"SELECT t.rowid AS position, t.{sid} AS id, t.{ssc}::DOUBLE AS score FROM {table} "
            "AS t SEMI JOIN (SELECT unnest($positions::BIGINT[]) AS p) AS e ON t.rowid = e.p "
            f"UNION ALL (SELECT rowid, {sid}, {ssc}::DOUBLE FROM {table} "
            f"ORDER BY {ssc} DESC LIMIT $k)",  # any k rows of the top scores: no tie order
            {"k": int(k), "positions": exceed},
        ).fetchnumpy()
        # their noise here (KeyedNoise.noises: the exceedance's, else the keyed one)
        known_positions = np.asarray(known["position"], dtype=np.int64)
        known["v"] = noise.capped(known["score"]) + noise.noises(known_positions)
        values = np.asarray(known["v"], dtype=np.float64)
        t = float(np.sort(values)[-k]) if len(values) >= k else -np.inf
        low = t - noise.bound - 1e-12 * abs(t) if np.isfinite(t) else -np.inf
        cut = f"{ssc} >= $low" if np.isfinite(low) else "true"
        level = int(np.ceil(low)) if self._whole_scores and np.isfinite(low) else float(low)
        rest = run.cursor.execute(
            f"SELECT r.position, r.id, r.score, {capped_sql('r.score', noise.score_cap)} + {keyed} "
            "AS v FROM ("
            f"SELECT rowid AS position, {sid} AS id, {ssc}::DOUBLE AS score FROM {table} "
            f"WHERE {cut}) AS r WHERE r.position NOT IN (SELECT unnest($positions::BIGINT[])) "
            "ORDER BY v DESC, r.position ASC LIMIT $k",
            {"key": noise.key, "k": int(k), "positions": exceed}
            | ({"low": level} if np.isfinite(low) else {}),
        ).fetchnumpy()
        # the store's rows first: a top row read twice keeps the noise the store computed
        rowids = np.concatenate([rest["position"], known_positions]).astype(np.int64)
        ids = np.concatenate([np.asarray(rest["id"], object), np.asarray(known["id"], object)])
        scores = np.concatenate([rest["score"], known["score"]]).astype(np.float64)
        noisy = np.concatenate([np.asarray(rest["v"], dtype=np.float64), values])
        rowids, first = np.unique(rowids, return_index=True)
        ids, scores, noisy = ids[first], scores[first], noisy[first]
        if len(set(ids.tolist())) != len(ids):
            seen: set[Any] = set()
            duplicate = next(i for i in ids.tolist() if i in seen or seen.add(i))
            facts = TableFacts(len(ids), 0, len(set(ids.tolist())), 0, 0, 0)
            raise_if_invalid(facts, self.where, self.id_column, self.score_column, duplicate)
        best = np.lexsort((rowids, -noisy))[:k]
        # rowids are not positions of the domain once rows were deleted: the release names ids,
        # so the rows carry their place in it as position
        return Rows(np.arange(len(best), dtype=np.int64), ids[best], scores[best])
