"""DuckDB tables read as they are now: what `DuckDBTable` does unless the table is frozen.

DuckDB has no triggers and no catalog value that an UPDATE in place changes, so nothing proves
cheaply that a rank-ordered copy is current (docs/freshness.md). A run that is not frozen reads
the table itself: its checks come from aggregates DuckDB answers without a pass, and the release
from the one-shot mechanism (Wu, Ohrimenko, Wirth 2023, Algorithm 2) run inside DuckDB with keyed
noise (topk_middleware/keyed_noise.py) whose positions are the table's rowids.

The run's first query reads, in one round trip, m, the score checks of `validate()`, the largest
score, the type of the scores (from the
type of their maximum: a column altered since the last run is read as it is now), the table's
row slots (the catalog's `estimated_size`, checked by a rowid-range probe where it differs from
the figure a run last proved) and whether the name is a table or a view. The one-shot then
takes three queries (`_live_oneshot`):

1. the k-th largest score s_k (a top-N of the score alone): k rows score at least s_k and no
   noise is below `KeyedNoise.lowest`, so their sum bounds the answer's k-th noisy score;
2. the exceedances that can still reach the bound (the larger of that and one from the drawn
   noises alone): one whose noise cannot lift the largest score to it is not read; the others
   only where their score can reach it, a constant filter on the score applied in the scan
   before the rowid semi-join, so few rows are probed;
3. the rows with score >= T - bound, T the k-th largest noisy score of the exceedances read (or
   the bound), hashed by DuckDB: the best k plus as many as there are exceedances, of which the
   exceedances (keyed values that are not their noise) are dropped; the best k of both reads
   are released.

No noise is computed in Python. A view has no rowids: its one-shot is one statement over the
view materialised once, positions its row numbers there (`_view_oneshot`). A frozen copy with a
pending delta takes its one-shot from the table itself where the table holds the copy's m rows
(`_table_for_oneshot`).

Oblivious reads (`oblivious_reads()`, mechanisms/oblivious.py) on a table name items by rowid
slot (`position_slots`, access.PositionSlots): the sorted batch is a top-d by `ORDER BY score
DESC LIMIT d` (ties in DuckDB's order), the random batch the rows at d slots by a rowid
semi-join, a slot without a row coming back as a row that never wins (score -inf). Both have a
size fixed by d, and the number of slots comes from the catalog.

`LiveRead` is a mixin of DuckDBTable: it uses the table's quoted names (`_base`, `_id`,
`_score`, `_order`, `_collate`), `where`, `table`, `_home()` and `_state()`.
"""

from __future__ import annotations

import decimal
import math
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np

from topk_middleware.access import AccessError, Rows, ScoreBins, StoreCosts
from topk_middleware.keyed_noise import KeyedNoise, capped_sql, uniform_from_hex_sql
from topk_middleware.validation import first_line

from ._sql import TableFacts, raise_if_invalid
from .duckdb_delta import DeltaView

# The catalog's tables are scanned whole (and filtered in Python) up to this many: a filter in
# the query costs more than the scan of a small catalog (0.25 ms against 0.2 ms at 40 tables).
CATALOG_SCAN_MAX = 200

# A table read as it is now, without a key on its id column, has its ids counted up to this
# many rows (count(DISTINCT): ~20 ms at 10^5 rows, 0.35 s at 10^6, 2.4 s at 10^7); past it a
# run checks the ids of the rows it reads (declare a PRIMARY KEY: DuckDB then enforces them).
DISTINCT_CHECK_MAX = 100_000
# Slack on the cuts for rounding in the store: of the noise scale, and of |T|.
CUT_SLACK_SCALE = 1e-6
CUT_SLACK_RELATIVE = 1e-12


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
    live: bool = False  # the table (or view) read as it is now
    top: float | None = None  # the largest score, from the run's first query (live)
    bottom: float = 0.0  # the smallest score, from the same query (live)
    whole: bool = False  # integer scores, as the run's first query typed them (live)
    slots: bool = False  # oblivious reads name items by rowid slot (`position_slots`)
    table: _Run | None = None  # a frozen copy's table read as it is now (`_table_for_oneshot`)
    table_checked: bool = False  # whether `_table_for_oneshot` looked
    head: Rows | None = None  # the copy's first rows, from its fingerprint (frozen, no delta)


def live_costs(m: int) -> StoreCosts:
    """The table read as it is now (not frozen), measured at m = 10^6 (benchmarks/freshness.py):
    a sorted read is an ORDER BY .. LIMIT (a scan of the score column, ~1-3 ms of CPU at 10^6),
    a batch of random reads by rank a window over the whole table (~0.3 s at 10^6), the in-store
    one-shot the run's first query, a top-N of the score, a filtered semi-join and a range read
    (about three scans: ~8-12 ms of CPU at 10^6, half that in wall time on two cores) plus the
    keyed hash on the rows past the cut, a full read ~0.1 s at 10^7 plus the noise in Python."""
    return StoreCosts(
        round_trip=1e-3 + 3e-9 * m,
        sorted_row=5e-8,
        random_batch=1e-2,
        random_row=1e-7,
        random_batch_item=3e-7,
        oneshot_row=4e-7,
        full_read_row=5e-8,
        oneshot_fixed=1.5e-3 + 3e-9 * m,
        sorted_scans=True,
    )


def _score_kind(value: Any) -> str | None:
    """'whole' (an integer type), 'real' (floating or decimal) or None (not numeric) for a value
    of the score column as DuckDB returns it."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return "whole"
    if isinstance(value, float | decimal.Decimal):
        return "real"
    return None


class LiveRead:
    """The reads of a DuckDBTable that is not frozen (module docstring)."""

    _base: str
    _ranks: str
    _id: str
    _score: str
    _order: str
    _collate: str
    _text_ids: bool
    where: str
    table: str
    id_column: str
    score_column: str
    _run: _Run | None
    _slots_hint: int | None  # the row slots a run last proved by its probe
    _catalog_rows: int  # tables in the last unfiltered scan of the catalog
    _oblivious: bool

    def _home(self) -> tuple[str, str]: ...  # DuckDBTable

    def _state(self, cursor: duckdb.DuckDBPyConnection | None = None) -> _Run: ...

    # ----- the run's first query -----------------------------------------------------------------
    def _live_run(self, con: duckdb.DuckDBPyConnection) -> _Run:
        """The state of a run that reads the table itself (module docstring): one query, plus a
        rowid probe where the row slots moved since the last run (an append), and on tables of
        up to DISTINCT_CHECK_MAX rows the key lookup (and, without a key, the count of distinct
        ids)."""
        s = self._score
        database, schema = self._home()
        try:
            row = con.execute(
                f"SELECT count(*), count({self._id}), count({s}), min({s}), max({s}) "
                f"FROM {self._base}"
            ).fetchone()
        except duckdb.Error as error:
            raise _Unreadable(self._unreadable(error)) from None
        # the catalog's figure (None: not a table, a view); a filter in that query costs more
        # than the scan of a small catalog, so it is filtered here while the catalog is small
        where = ""
        if self._catalog_rows > CATALOG_SCAN_MAX:
            where = " WHERE lower(table_name) = $table"
        listed = con.execute(
            f"SELECT database_name, schema_name, table_name, estimated_size FROM duckdb_tables()"
            f"{where}",
            {"table": self.table.lower()} if where else None,
        ).fetchall()
        if not where:
            self._catalog_rows = len(listed)
        wanted = (database, schema, self.table.lower())
        sizes = [n for d, sc, t, n in listed if (d, sc.lower(), t.lower()) == wanted]
        row = (*row, max(sizes) if sizes else None)
        rows, ids, scores, low, high, estimated = row
        kind = _score_kind(high if high is not None else low)
        if high is not None and kind is None:
            raise TypeError(
                f"{self.where} column {self.score_column!r} must be numeric, it holds "
                f"{type(high).__name__} values"
            )
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
        view = estimated is None
        if rows <= DISTINCT_CHECK_MAX and (view or not self._unique_ids(con)):
            self._refuse_duplicates(con, rows)
        run = _Run(con, False, rows, live=True, top=high_f, whole=kind == "whole")
        run.bottom = float(low) if low is not None else 0.0
        if view:
            self._slots_hint = None
            return run
        slots = int(estimated or 0)
        # The catalog's figure is the rows ever appended (rowids are below it); it is checked
        # by a rowid-range probe when it differs from the figure a run last proved (appends
        # only raise it; oblivious reads probe every time: the same statements in every run).
        if self._oblivious or slots != self._slots_hint:
            beyond = con.execute(
                f"SELECT count(*) FROM {self._base} WHERE rowid >= $slots", {"slots": slots}
            ).fetchone()[0]
            if beyond or slots < rows:  # not the catalog's figure: count the rowids
                slots = int(con.execute(f"SELECT max(rowid) + 1 FROM {self._base}").fetchone()[0])
            else:
                self._slots_hint = slots
        run.rowids = max(slots, 1)
        run.slots = bool(getattr(self, "_oblivious", False))
        return run

    def _unreadable(self, error: duckdb.Error) -> str:
        """Why the table cannot be read, in the project's words where the catalog tells (on a
        cursor of its own: the failed query ended the run's transaction)."""
        cursor = self._con.cursor()  # type: ignore[attr-defined]
        try:
            described = cursor.execute(f"DESCRIBE SELECT * FROM {self._base}").fetchall()
        except duckdb.Error:
            return f"{self.where} does not exist (any more): nothing to read"
        finally:
            cursor.close()
        columns = sorted(name for name, *_ in described)
        for column in (self.id_column, self.score_column):
            if column not in columns:
                return f"{self.where} has no column {column!r} (columns: {columns})"
        return f"{self.where} cannot be read: {first_line(error)}"

    def _unique_ids(self, con: duckdb.DuckDBPyConnection) -> bool:
        """Whether the table's id column alone carries a PRIMARY KEY or UNIQUE constraint: a
        catalog lookup, made by each run that needs it (a table dropped and made again without
        its key is seen)."""
        database, schema = self._home()
        found = con.execute(
            "SELECT constraint_column_names FROM duckdb_constraints() "
            "WHERE database_name = $db AND lower(schema_name) = $schema "
            "AND lower(table_name) = $table AND constraint_type IN ('PRIMARY KEY', 'UNIQUE')",
            {"db": database, "schema": schema, "table": self.table.lower()},
        ).fetchall()
        return any(list(names) == [self.id_column] for (names,) in found)

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

    # ----- what the planner and the core ask -----------------------------------------------------
    def count_at_least(self, score: float) -> int | None:
        """How many rows have a score >= `score` (the planner's count of rows the in-store
        one-shot hashes; a count the planner makes, not an access): on the table read as it is
        now, zone maps answer it in about 0.3 ms at m = 10^7 where the table is clustered; on a
        copy with a pending delta (whose one-shot reads the table), the base's count, which its
        rank order answers from zone maps; None on a copy without one."""
        run = self._state()
        if run.live:
            table, column, level = self._base, self._score, self._level(run, float(score))
        elif run.delta is not None:
            table, column, level = self._ranks, "score", float(score)
        else:
            return None
        return int(
            run.cursor.execute(
                f"SELECT count(*) FROM {table} WHERE {column} >= $s", {"s": level}
            ).fetchone()[0]
        )

    def read_score_histogram(self, bins: ScoreBins) -> tuple[np.ndarray, np.ndarray] | None:
        """access.ScoreHistogramRead: the scores of the table read as it is now at or below
        `bins.top`, binned, by one aggregate (each bin's largest score and size; one scan, no
        sort); None on a copy (its runs serve the histogram) or on rowid slots."""
        run = self._state()
        if not run.live or run.slots:
            return None
        score = f"{self._score}::DOUBLE"
        got = run.cursor.execute(
            f"SELECT max({score}) AS top, count(*) AS n FROM {self._base} "
            f"WHERE {score} <= $top GROUP BY {bins.sql(score)}",
            {"top": float(bins.top)},
        ).fetchnumpy()
        return np.asarray(got["top"], dtype=np.float64), np.asarray(got["n"], dtype=np.int64)

    def oneshot_positions(self) -> int:
        """How many positions the in-store one-shot samples its exceedances from: the rowid
        range while the table is read as it is now (rowids of deleted rows stay unused: each
        position is still an exceedance with probability q, independently), else m. On a
        frozen copy with a pending delta this also chooses where the run's one-shot reads
        (`_table_for_oneshot`): the table's slots, or the copy's m positions."""
        run = self._state()
        table = self._table_for_oneshot(run)
        if table is not None:
            return table.rowids
        return run.rowids if run.rowids else run.m

    def _table_for_oneshot(self, run: _Run) -> _Run | None:
        """For a frozen copy with a pending delta: the table itself, read as it is now in the
        run's transaction, where its first query finds it valid and of the copy's m (the frozen
        promise: the table is what the copy and its delta hold). Its in-store one-shot (three
        scans) is cheaper than one over the base and the delta (an anti-join of the skipped
        ranks over the whole base, and a union). Looked up once per run; None otherwise."""
        if run.live or run.delta is None:
            return None
        if not run.table_checked:
            run.table_checked = True
            try:
                table = self._live_run(run.cursor)
            except _Unreadable:
                raise
            except (ValueError, TypeError):
                table = None  # not as promised: the copy's own one-shot
            if table is not None and table.m == run.m and table.rowids:
                run.table = table
        return run.table

    def position_slots(self) -> int:
        """access.PositionSlots: the positions items are named by, 0 .. this - 1: the rowid
        slots in oblivious reads of a table read as it is now, else m."""
        run = self._state()
        return run.rowids if run.slots else run.m

    @staticmethod
    def _level(run: _Run, low: float) -> int | float:
        """A cut `score >= low` in the column's own type where it is whole (DuckDB then pushes
        the comparison into the scan), else as a double."""
        return math.ceil(low) if run.whole and math.isfinite(low) else float(low)

    # ----- the in-store one-shot -----------------------------------------------------------------
    def _live_oneshot(self, run: _Run, noise: KeyedNoise, k: int) -> Rows:
        """Algorithm 2 with keyed noise on the table itself, positions its rowids (fixed within
        the transaction): three queries (module docstring)."""
        if not run.rowids:
            return self._view_oneshot(run, noise, k)
        keyed = noise.sql(uniform_from_hex_sql(_DIGITS))
        table, sid, ssc = self._base, self._id, self._score
        exceed, drawn = noise.exceed_positions, noise.exceed_noises
        cap = noise.score_cap  # values are min(score, B) + noise (privacy.score_bound)
        # 1. the k-th largest score s_k, by a top-N of the score alone (LIMIT a literal: a
        # parameter there costs DuckDB its top-N plan; the rows themselves are read by 3 where
        # they can win): k rows score at least s_k and have a noise of at least its lowest
        # value, so s_k + lowest bounds the k-th largest noisy score from below
        s_k = run.cursor.execute(
            f"SELECT min(s) FROM (SELECT {ssc}::DOUBLE AS s FROM {table} "
            f"ORDER BY {ssc} DESC LIMIT {int(k)})"
        ).fetchone()[0]
        slack = CUT_SLACK_SCALE * noise.scale
        t0 = min(float(s_k), cap) + noise.lowest - slack if s_k is not None else -np.inf
        t0 -= CUT_SLACK_RELATIVE * abs(t0) if np.isfinite(t0) else 0.0
        parts = []
        floor = t0  # a lower bound of the k-th largest noisy score
        if len(exceed):
            # 2. Unread exceedances bound it too: each row scores at least the smallest score,
            # and of the k + (slots - m) largest noises at least k sit on rows (empty slots are
            # at most slots - m). An exceedance whose noise cannot lift the top score to the
            # bound is not read; the others only where their score can reach it (score >=
            # bound - their noise: filtered on the largest noise before the semi-join, a
            # constant pushed into the scan).
            enough = k + run.rowids - run.m
            if len(drawn) >= enough:
                noises = min(run.bottom, cap) + float(np.partition(drawn, -enough)[-enough])
                floor = max(floor, noises - slack - CUT_SLACK_RELATIVE * abs(noises))
            bar = floor
            wanted = drawn + min(
                float(run.top or 0.0), cap
            ) >= bar - slack - CUT_SLACK_RELATIVE * abs(bar)
            if wanted.any():
                reach = bar - float(drawn[wanted].max()) - slack - CUT_SLACK_RELATIVE * abs(bar)
                cut = f"WHERE t.{ssc} >= $reach" if np.isfinite(reach) else ""
                got = run.cursor.execute(
                    f"SELECT t.rowid AS position, t.{sid} AS id, t.{ssc}::DOUBLE AS score "
                    f"FROM {table} AS t SEMI JOIN (SELECT unnest($positions::BIGINT[]) AS p) "
                    f"AS e ON t.rowid = e.p {cut}",
                    {"positions": exceed[wanted].tolist()}
                    | ({"reach": self._level(run, reach)} if cut else {}),
                ).fetchnumpy()
                at = np.searchsorted(exceed, np.asarray(got["position"], np.int64))
                got["v"] = noise.capped(got["score"]) + drawn[at]
                parts.append(got)
        values = np.concatenate([np.asarray(p["v"], np.float64) for p in parts] or [[]])
        t = float(np.sort(values)[-k]) if len(values) >= k else -np.inf
        t = max(t, floor)
        low = t - noise.bound - CUT_SLACK_RELATIVE * abs(t) if np.isfinite(t) else -np.inf
        # 3. the rows at or above the cut, keyed noise by DuckDB. An exceedance among them gets
        # a keyed value that is not its noise: the k + (exceedances) best are read and the
        # exceedances dropped here (cheaper than excluding them in the query).
        params: dict[str, Any] = {"key": noise.key}
        cut = "true"
        if np.isfinite(low):
            cut, params["low"] = f"{ssc} >= $low", self._level(run, low)
        rest = run.cursor.execute(
            f"SELECT r.position, r.id, r.score, {capped_sql('r.score', noise.score_cap)} + {keyed} "
            "AS v FROM ("
            f"SELECT rowid AS position, {sid} AS id, {ssc}::DOUBLE AS score FROM {table} "
            f"WHERE {cut} ORDER BY rowid) AS r "  # dense chunks to hash (scattered rows: 15%)
            f"ORDER BY v DESC, r.position ASC LIMIT {int(k) + len(exceed)}",
            params,
        ).fetchnumpy()
        if len(exceed):
            at = np.asarray(rest["position"], np.int64)
            keep = ~np.isin(at, exceed, assume_unique=True)
            rest = {name: np.asarray(column)[keep] for name, column in rest.items()}
        return self._best([*parts, rest], k)

    def _view_oneshot(self, run: _Run, noise: KeyedNoise, k: int) -> Rows:
        """The one-shot on a view read as it is now: one statement over the view materialised
        once, positions its row numbers there (0 .. m-1, fixed before any noise is read; the
        keyed noise is i.i.d. whatever the order DuckDB numbers the rows in): the exceedances
        and the k top rows, the cut T - bound, the rows at or above it."""
        keyed = noise.sql(uniform_from_hex_sql(_DIGITS))
        capped = capped_sql("r.score", noise.score_cap)  # min(score, B) (privacy.score_bound)
        sid, ssc = self._id, self._score
        query = (
            "WITH vrows AS MATERIALIZED (SELECT (row_number() OVER () - 1)::BIGINT AS position, "
            f"{sid} AS id, {ssc}::DOUBLE AS score FROM {self._base}), "
            "e AS MATERIALIZED (SELECT unnest($positions::BIGINT[]) AS p, "
            "unnest($noises::DOUBLE[]) AS z), "
            f"top AS (SELECT * FROM vrows ORDER BY score DESC LIMIT {int(k)}), "
            f"known AS MATERIALIZED (SELECT r.position, r.id, r.score, "
            f"{capped} + coalesce(e.z, {keyed}) AS v FROM top AS r LEFT JOIN e ON e.p = r.position "
            f"UNION ALL SELECT r.position, r.id, r.score, {capped} + e.z FROM vrows AS r "
            "JOIN e ON e.p = r.position), "
            "cut AS (SELECT min(v) - $bound - $relative * abs(min(v)) AS low FROM "
            f"(SELECT v FROM known ORDER BY v DESC LIMIT {int(k)})) "
            "SELECT position, id, score, v FROM known UNION ALL "
            f"SELECT r.position, r.id, r.score, {capped} + {keyed} FROM vrows AS r "
            "WHERE r.score >= (SELECT low FROM cut) AND r.position NOT IN (SELECT p FROM e)"
        )
        got = run.cursor.execute(
            query,
            {
                "key": noise.key,
                "positions": noise.exceed_positions.tolist(),
                "noises": noise.exceed_noises.tolist(),
                "bound": float(noise.bound),
                "relative": CUT_SLACK_RELATIVE,
            },
        ).fetchnumpy()
        return self._best([got], k)

    def _best(self, parts: list[dict[str, Any]], k: int) -> Rows:
        """The best k of the rows read (a row read twice keeps one copy: the same noise), the
        ids of all of them checked for duplicates. Positions (rowids, or row numbers of a
        view) are not positions of the domain: the rows carry their place in the release."""
        positions = np.concatenate([np.asarray(p["position"], np.int64) for p in parts])
        ids = np.concatenate([np.asarray(p["id"], object) for p in parts])
        scores = np.concatenate([np.asarray(p["score"], np.float64) for p in parts])
        noisy = np.concatenate([np.asarray(p["v"], np.float64) for p in parts])
        positions, first = np.unique(positions, return_index=True)
        ids, scores, noisy = ids[first], scores[first], noisy[first]
        # BLOB ids come as bytearrays, which do not hash: compared as bytes
        listed = [bytes(i) if isinstance(i, bytearray) else i for i in ids.tolist()]
        if len(set(listed)) != len(listed):
            seen: set[Any] = set()
            duplicate = next(i for i in listed if i in seen or seen.add(i))
            facts = TableFacts(len(listed), 0, len(set(listed)), 0, 0, 0)
            raise_if_invalid(facts, self.where, self.id_column, self.score_column, duplicate)
        best = np.lexsort((positions, -noisy))[:k]
        return Rows(np.arange(len(best), dtype=np.int64), ids[best], scores[best])

    # ----- oblivious reads by rowid slot ----------------------------------------------------------
    def _slot_sorted(self, run: _Run, start: int, count: int) -> Rows:
        """Rows start .. start + count - 1 of the score order, each named by its rowid slot, by
        one `ORDER BY score DESC LIMIT` (literals: a parameter there costs DuckDB its top-N
        plan). Rows tied on the score come in DuckDB's order, not by id: the oblivious batch
        needs d rows none of which scores below a row outside it (mechanisms/oblivious.py),
        and a tie order by id costs a top-N of 6,445 rows at m = 10^6 as much again."""
        limit = f"LIMIT {int(count)}" + (f" OFFSET {int(start)}" if start else "")
        got = run.cursor.execute(
            f"SELECT rowid AS position, {self._id} AS id, {self._score}::DOUBLE AS score "
            f"FROM {self._base} ORDER BY {self._score} DESC {limit}"
        ).fetchnumpy()
        ids = np.asarray(got["id"])
        if ids.dtype.kind in "US":
            ids = ids.astype(object)
        return Rows(
            np.asarray(got["position"], np.int64), ids, np.asarray(got["score"], np.float64)
        )

    def _slot_rows(self, run: _Run, slots: list[int]) -> Rows:
        """The rows at the given rowid slots by one semi-join, ascending; a slot without a row
        (a deleted row's, or past the last) comes back as a row that never wins: id None,
        score -inf."""
        wanted = np.unique(np.asarray(slots, dtype=np.int64))
        if len(wanted) and (wanted[0] < 0 or wanted[-1] >= run.rowids):
            raise AccessError(f"slot out of range [0, {run.rowids})")
        got = run.cursor.execute(
            f"SELECT t.rowid AS position, t.{self._id} AS id, t.{self._score}::DOUBLE AS score "
            f"FROM {self._base} AS t SEMI JOIN (SELECT unnest($slots::BIGINT[]) AS p) AS s "
            "ON t.rowid = s.p",
            {"slots": wanted.tolist()},
        ).fetchnumpy()
        found = np.asarray(got["position"], np.int64)
        order = np.argsort(found)
        ids = np.full(len(wanted), None, dtype=object)
        scores = np.full(len(wanted), -np.inf)
        at = np.searchsorted(wanted, found[order])
        ids[at] = np.asarray(got["id"], object)[order]
        scores[at] = np.asarray(got["score"], np.float64)[order]
        return Rows(wanted, ids, scores)


class _Unreadable(ValueError):
    """The table's first query failed (a column or the table is gone): the transaction is over."""


# The first 13 hex digits of SHA-256(key ":" position), as DuckDB computes them for the row r.
_DIGITS = "('0x' || substr(sha256($key || ':' || r.position::VARCHAR), 1, 13))::UBIGINT::DOUBLE"
