"""DuckDB tables read as they are now: what a DuckDBTable run does unless the table is frozen
(an engine.Reads strategy the dialect hands the run: DuckDBDialect.table_reads).

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
takes three queries (`TableReads.read_oneshot`):

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
(reads.DeltaReads.table).

Oblivious reads (the engine's `oblivious_reads()`, mechanisms/oblivious.py) on a table name
items by rowid slot (`position_slots`, access.PositionSlots): the sorted batch is a top-d by
`ORDER BY score DESC LIMIT d` (ties in DuckDB's order), the random batch the rows at d slots by
a rowid semi-join, a slot without a row coming back as a row that never wins (score -inf).
Both have a size fixed by d, and the number of slots comes from the catalog.
"""

from __future__ import annotations

import decimal
import math
from typing import Any

import numpy as np

from adapters._sql import TableFacts, raise_if_invalid, scores_in_order
from topk_middleware.access import AccessError, Rows, RunTraits, ScoreBins, StoreCosts
from topk_middleware.keyed_noise import KeyedNoise, capped_sql
from topk_middleware.validation import first_line

from . import CATALOG_SCAN_MAX, rows_of

# A table read as it is now, without a key on its id column, has its ids counted up to this
# many rows (count(DISTINCT): ~20 ms at 10^5 rows, 0.35 s at 10^6, 2.4 s at 10^7); past it a
# run checks the ids of the rows it reads (declare a PRIMARY KEY: DuckDB then enforces them).
DISTINCT_CHECK_MAX = 100_000
# Slack on the cuts for rounding in the store: of the noise scale, and of |T|.
CUT_SLACK_SCALE = 1e-6
CUT_SLACK_RELATIVE = 1e-12


def table_costs(m: int) -> StoreCosts:
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


class CatalogHints:
    """What the runs of one table keep of DuckDB's catalog between them (the dialect's, one
    per table): the table's home, looked up once; how many tables the last unfiltered scan of
    the catalog listed (past CATALOG_SCAN_MAX a scan is filtered); the row slots the last run
    of the table proved (`TableReads.open`)."""

    def __init__(self) -> None:
        self.catalog_rows = 0
        self.slots_hint: int | None = None
        self._home: tuple[str, str] | None = None

    def home(self, t: Any) -> tuple[str, str]:
        """(database, lower-case schema) of table `t`, looked up once."""
        if self._home is None:
            database, schema = t.driver.one(
                "SELECT current_database(), lower(coalesce(:schema, current_schema()))",
                {"schema": t.namespace},
            )
            self._home = (str(database), str(schema))
        return self._home


class Unreadable(ValueError):
    """The table's first query failed (a column or the table is gone): the transaction is over."""


class TableReads:
    """One run's reads of the table (or view) as it is now (module docstring), on the run's
    driver in its transaction."""

    def __init__(self, t: Any, m: int, top: float, bottom: float, whole: bool) -> None:
        self.t, self.driver = t, t.driver
        self.m, self.top, self.bottom, self.whole = m, top, bottom, whole
        self.rowids = 0  # 1 + the largest row id (0: a view, which has none)
        self.slots = False  # oblivious reads name items by row id slot (`position_slots`)
        self.reads: str | None = None  # what the last in-store one-shot read

    # ----- the run's first query -----------------------------------------------------------------
    @classmethod
    def open(cls, t: Any, slots: bool | None = None) -> TableReads:
        """The state of a run that reads the table itself (module docstring): one query, plus a
        row id probe where the row slots moved since the last run (an append), and on tables of
        up to DISTINCT_CHECK_MAX rows the key lookup (and, without a key, the count of distinct
        ids). `slots`: name items by row id slot (default: inside t's oblivious_reads())."""
        hints, driver, s = t.dialect.hints, t.driver, t.score_sql
        database, schema = hints.home(t)
        try:
            row = driver.one(
                f"SELECT count(*), count({t.id_sql}), count({s}), min({s}), max({s}) "
                f"FROM {t.source}"
            )
        except driver.errors as error:
            raise Unreadable(_unreadable(t, error)) from None
        # the catalog's figure (None: not a table, a view); a filter in that query costs more
        # than the scan of a small catalog, so it is filtered here while the catalog is small
        where = ""
        if hints.catalog_rows > CATALOG_SCAN_MAX:
            where = " WHERE lower(table_name) = :table"
        listed = driver.execute(
            f"SELECT database_name, schema_name, table_name, estimated_size FROM duckdb_tables()"
            f"{where}",
            {"table": t.table.lower()} if where else None,
        )
        if not where:
            hints.catalog_rows = len(listed)
        wanted = (database, schema, t.table.lower())
        sizes = [n for d, sc, name, n in listed if (d, sc.lower(), name.lower()) == wanted]
        rows, ids, scores, low, high = row
        estimated = max(sizes) if sizes else None
        kind = _score_kind(high if high is not None else low)
        if high is not None and kind is None:
            raise TypeError(
                f"{t.where} column {t.score_column!r} must be numeric, it holds "
                f"{type(high).__name__} values"
            )
        rows, high_f = int(rows), float(high) if high is not None else 0.0
        bad = (low is not None and float(low) < 0) or math.isnan(high_f) or math.isinf(high_f)
        negative = non_finite = 0
        if bad:  # count them exactly for the message
            non_finite, negative = driver.one(
                f"SELECT count_if(isnan({s}::DOUBLE) OR isinf({s}::DOUBLE)), "
                f"count_if({s} < 0) FROM {t.source}"
            )
        facts = TableFacts(
            rows, rows - int(ids), rows, rows - int(scores), int(non_finite), int(negative)
        )
        raise_if_invalid(facts, t.where, t.id_column, t.score_column, None)
        view = estimated is None
        if rows <= DISTINCT_CHECK_MAX and (view or not _unique_ids(t)):
            _refuse_duplicates(t, rows)
        run = cls(t, rows, high_f, float(low) if low is not None else 0.0, kind == "whole")
        if view:
            hints.slots_hint = None
            return run
        slots_read = int(estimated or 0)
        oblivious = t._oblivious if slots is None else slots
        # The catalog's figure is the rows ever appended (row ids are below it); it is checked
        # by a row id range probe when it differs from the figure a run last proved (appends
        # only raise it; oblivious reads probe every time: the same statements in every run).
        if oblivious or slots_read != hints.slots_hint:
            beyond = driver.scalar(
                f"SELECT count(*) FROM {t.source} WHERE rowid >= :slots", {"slots": slots_read}
            )
            if beyond or slots_read < rows:  # not the catalog's figure: count the row ids
                slots_read = int(driver.scalar(f"SELECT max(rowid) + 1 FROM {t.source}"))
            else:
                hints.slots_hint = slots_read
        run.rowids = max(slots_read, 1)
        run.slots = bool(oblivious)
        return run

    # ----- what the planner and the core ask -----------------------------------------------------
    def traits(self) -> RunTraits:
        """Positions are ranks but in oblivious reads (row id slots); every sorted read is a
        top-N over a scan, so no read-ahead."""
        return RunTraits(
            positions_are_ranks=not self.slots,
            sorted_read_rows=1,
            costs=table_costs(self.m),
            oblivious_costs=self.t.oblivious_costs,
        )

    def count_at_least(self, score: float) -> int | None:
        """How many rows have a score >= `score` (the planner's count of rows the in-store
        one-shot hashes; a count the planner makes, not an access): zone maps answer it in
        about 0.3 ms at m = 10^7 where the table is clustered."""
        return int(
            self.driver.scalar(
                f"SELECT count(*) FROM {self.t.source} WHERE {self.t.score_sql} >= :s",
                {"s": self._level(float(score))},
            )
        )

    def read_score_histogram(self, bins: ScoreBins) -> tuple[np.ndarray, np.ndarray] | None:
        """access.ScoreHistogramRead: the scores at or below `bins.top`, binned, by one
        aggregate (each bin's largest score and size; one scan, no sort); None on row id
        slots."""
        if self.slots:
            return None
        score = f"{self.t.score_sql}::DOUBLE"
        got = self.driver.arrays(
            f"SELECT max({score}) AS top, count(*) AS n FROM {self.t.source} "
            f"WHERE {score} <= :top GROUP BY {bins.sql(score)}",
            {"top": float(bins.top)},
        )
        return np.asarray(got["top"], dtype=np.float64), np.asarray(got["n"], dtype=np.int64)

    def read_position_scores(self, positions: np.ndarray) -> Any:
        return None

    def read_exact_scores(self, ids: list[Any]) -> list[Any] | None:
        """None: exact scores are asked of the table by id (the engine's scores_by_id)."""
        return None

    def oneshot_positions(self) -> int:
        """The row id range (row ids of deleted rows stay unused: each position is still an
        exceedance with probability q, independently), or m on a view."""
        return self.rowids if self.rowids else self.m

    def position_slots(self) -> int:
        """access.PositionSlots: the row id slots in oblivious reads, else m."""
        return self.rowids if self.slots else self.m

    def _level(self, low: float) -> int | float:
        """A cut `score >= low` in the column's own type where it is whole (DuckDB then pushes
        the comparison into the scan), else as a double."""
        return math.ceil(low) if self.whole and math.isfinite(low) else float(low)

    # ----- reads by rank, by id ------------------------------------------------------------------
    def read_sorted(self, start: int, stop: int) -> Rows:
        """Depths start .. stop - 1: the score at depth stop - 1 first (a top-N on the score
        alone), then the canonical order among the rows at or above it only (ties on a plateau
        are not all sorted by id); on row id slots, _slot_sorted."""
        if self.slots:
            return self._slot_sorted(start, stop - start)
        t = self.t
        got = self.driver.arrays(
            f"WITH cut AS (SELECT {t.score_sql} AS s FROM {t.source} "
            f"ORDER BY {t.score_sql} DESC LIMIT 1 OFFSET :last) "
            f"SELECT {t.id_sql} AS id, {t.score_sql}::DOUBLE AS score FROM {t.source} "
            f"WHERE {t.score_sql} >= (SELECT s FROM cut) ORDER BY {t.order_sql()} "
            "LIMIT :count OFFSET :start",
            {"last": stop - 1, "count": stop - start, "start": start},
        )
        got["rank"] = np.arange(start, start + len(got["score"]), dtype=np.int64)
        return rows_of(got)

    def read_positions(self, positions: np.ndarray) -> Rows:
        """The rows at canonical ranks: a row_number() window over the whole table; on row id
        slots, _slot_rows."""
        wanted = np.unique(positions)
        if self.slots:
            return self._slot_rows(wanted)
        return rows_of(
            self.driver.arrays(
                f"SELECT r.rank, r.id, r.score FROM ({self.t.canonical_rows()}) AS r "
                "WHERE r.rank IN (SELECT unnest(:ranks::BIGINT[]))",
                {"ranks": wanted.tolist()},
            )
        )

    def read_ids(self, ids: list[Any]) -> np.ndarray:
        if not ids:
            return np.empty(0, dtype=np.float64)
        t = self.t
        c = ' COLLATE "binary"' if t.text_ids else ""
        found = dict(
            self.driver.execute(
                f"SELECT {t.id_sql}, {t.score_sql}::DOUBLE FROM {t.source} "
                f"WHERE {t.id_sql}{c} IN (SELECT unnest(:ids){c})",
                {"ids": ids},
            )
        )
        return scores_in_order(found, ids, t.where)

    # ----- the in-store one-shot -----------------------------------------------------------------
    def read_oneshot(self, noise: KeyedNoise, k: int) -> Rows:
        """Algorithm 2 with keyed noise on the table itself, positions its row ids (fixed within
        the transaction): three queries (module docstring)."""
        if not self.rowids:
            self.reads = "the view"
            return self._view_oneshot(noise, k)
        self.reads = "the table"
        run, driver = self, self.driver
        keyed = noise.sql(self.t.dialect.keyed_uniform("key", "r.position"))
        table, sid, ssc = self.t.source, self.t.id_sql, self.t.score_sql
        exceed, drawn = noise.exceed_positions, noise.exceed_noises
        cap = noise.score_cap  # values are min(score, B) + noise (privacy.score_bound)
        # 1. the k-th largest score s_k, by a top-N of the score alone (LIMIT a literal: a
        # parameter there costs DuckDB its top-N plan; the rows themselves are read by 3 where
        # they can win): k rows score at least s_k and have a noise of at least its lowest
        # value, so s_k + lowest bounds the k-th largest noisy score from below
        s_k = driver.scalar(
            f"SELECT min(s) FROM (SELECT {ssc}::DOUBLE AS s FROM {table} "
            f"ORDER BY {ssc} DESC LIMIT {int(k)})"
        )
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
                cut = f"WHERE t.{ssc} >= :reach" if np.isfinite(reach) else ""
                got = driver.arrays(
                    f"SELECT t.rowid AS position, t.{sid} AS id, t.{ssc}::DOUBLE AS score "
                    f"FROM {table} AS t SEMI JOIN (SELECT unnest(:positions::BIGINT[]) AS p) "
                    f"AS e ON t.rowid = e.p {cut}",
                    {"positions": exceed[wanted].tolist()}
                    | ({"reach": self._level(reach)} if cut else {}),
                )
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
            cut, params["low"] = f"{ssc} >= :low", self._level(low)
        rest = driver.arrays(
            f"SELECT r.position, r.id, r.score, {capped_sql('r.score', noise.score_cap)} + {keyed} "
            "AS v FROM ("
            f"SELECT rowid AS position, {sid} AS id, {ssc}::DOUBLE AS score FROM {table} "
            f"WHERE {cut} ORDER BY rowid) AS r "  # dense chunks to hash (scattered rows: 15%)
            f"ORDER BY v DESC, r.position ASC LIMIT {int(k) + len(exceed)}",
            params,
        )
        if len(exceed):
            at = np.asarray(rest["position"], np.int64)
            keep = ~np.isin(at, exceed, assume_unique=True)
            rest = {name: np.asarray(column)[keep] for name, column in rest.items()}
        return self._best([*parts, rest], k)

    def _view_oneshot(self, noise: KeyedNoise, k: int) -> Rows:
        """The one-shot on a view read as it is now: one statement over the view materialised
        once, positions its row numbers there (0 .. m-1, fixed before any noise is read; the
        keyed noise is i.i.d. whatever the order DuckDB numbers the rows in): the exceedances
        and the k top rows, the cut T - bound, the rows at or above it."""
        keyed = noise.sql(self.t.dialect.keyed_uniform("key", "r.position"))
        capped = capped_sql("r.score", noise.score_cap)  # min(score, B) (privacy.score_bound)
        sid, ssc = self.t.id_sql, self.t.score_sql
        query = (
            "WITH vrows AS MATERIALIZED (SELECT (row_number() OVER () - 1)::BIGINT AS position, "
            f"{sid} AS id, {ssc}::DOUBLE AS score FROM {self.t.source}), "
            "e AS MATERIALIZED (SELECT unnest(:positions::BIGINT[]) AS p, "
            "unnest(:noises::DOUBLE[]) AS z), "
            f"top AS (SELECT * FROM vrows ORDER BY score DESC LIMIT {int(k)}), "
            f"known AS MATERIALIZED (SELECT r.position, r.id, r.score, "
            f"{capped} + coalesce(e.z, {keyed}) AS v FROM top AS r LEFT JOIN e ON e.p = r.position "
            f"UNION ALL SELECT r.position, r.id, r.score, {capped} + e.z FROM vrows AS r "
            "JOIN e ON e.p = r.position), "
            "cut AS (SELECT min(v) - :bound - :relative * abs(min(v)) AS low FROM "
            f"(SELECT v FROM known ORDER BY v DESC LIMIT {int(k)})) "
            "SELECT position, id, score, v FROM known UNION ALL "
            f"SELECT r.position, r.id, r.score, {capped} + {keyed} FROM vrows AS r "
            "WHERE r.score >= (SELECT low FROM cut) AND r.position NOT IN (SELECT p FROM e)"
        )
        got = self.driver.arrays(
            query,
            {
                "key": noise.key,
                "positions": noise.exceed_positions.tolist(),
                "noises": noise.exceed_noises.tolist(),
                "bound": float(noise.bound),
                "relative": CUT_SLACK_RELATIVE,
            },
        )
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
            t = self.t
            raise_if_invalid(facts, t.where, t.id_column, t.score_column, duplicate)
        best = np.lexsort((positions, -noisy))[:k]
        return Rows(np.arange(len(best), dtype=np.int64), ids[best], scores[best])

    # ----- oblivious reads by rowid slot ----------------------------------------------------------
    def _slot_sorted(self, start: int, count: int) -> Rows:
        """Rows start .. start + count - 1 of the score order, each named by its rowid slot, by
        one `ORDER BY score DESC LIMIT` (literals: a parameter there costs DuckDB its top-N
        plan). Rows tied on the score come in DuckDB's order, not by id: the oblivious batch
        needs d rows none of which scores below a row outside it (mechanisms/oblivious.py),
        and a tie order by id costs a top-N of 6,445 rows at m = 10^6 as much again."""
        limit = f"LIMIT {int(count)}" + (f" OFFSET {int(start)}" if start else "")
        t = self.t
        got = self.driver.arrays(
            f"SELECT rowid AS position, {t.id_sql} AS id, {t.score_sql}::DOUBLE AS score "
            f"FROM {t.source} ORDER BY {t.score_sql} DESC {limit}"
        )
        ids = np.asarray(got["id"])
        if ids.dtype.kind in "US":
            ids = ids.astype(object)
        return Rows(
            np.asarray(got["position"], np.int64), ids, np.asarray(got["score"], np.float64)
        )

    def _slot_rows(self, slots: np.ndarray) -> Rows:
        """The rows at the given rowid slots by one semi-join, ascending; a slot without a row
        (a deleted row's, or past the last) comes back as a row that never wins: id None,
        score -inf."""
        wanted = np.unique(np.asarray(slots, dtype=np.int64))
        if len(wanted) and (wanted[0] < 0 or wanted[-1] >= self.rowids):
            raise AccessError(f"slot out of range [0, {self.rowids})")
        t = self.t
        got = self.driver.arrays(
            f"SELECT t.rowid AS position, t.{t.id_sql} AS id, t.{t.score_sql}::DOUBLE AS score "
            f"FROM {t.source} AS t SEMI JOIN (SELECT unnest(:slots::BIGINT[]) AS p) AS s "
            "ON t.rowid = s.p",
            {"slots": wanted.tolist()},
        )
        found = np.asarray(got["position"], np.int64)
        order = np.argsort(found)
        ids = np.full(len(wanted), None, dtype=object)
        scores = np.full(len(wanted), -np.inf)
        at = np.searchsorted(wanted, found[order])
        ids[at] = np.asarray(got["id"], object)[order]
        scores[at] = np.asarray(got["score"], np.float64)[order]
        return Rows(wanted, ids, scores)


def _unreadable(t: Any, error: BaseException) -> str:
    """Why the table cannot be read, in the project's words where the catalog tells (on a
    cursor of its own: the failed query ended the run's transaction)."""
    try:
        with t.driver.apart() as driver:
            described = driver.execute(f"DESCRIBE SELECT * FROM {t.source}")
    except t.driver.errors:
        return f"{t.where} does not exist (any more): nothing to read"
    columns = sorted(name for name, *_ in described)
    for column in (t.id_column, t.score_column):
        if column not in columns:
            return f"{t.where} has no column {column!r} (columns: {columns})"
    return f"{t.where} cannot be read: {first_line(error)}"


def _unique_ids(t: Any) -> bool:
    """Whether the table's id column alone carries a PRIMARY KEY or UNIQUE constraint: a
    catalog lookup, made by each run that needs it (a table dropped and made again without
    its key is seen)."""
    database, schema = t.dialect.hints.home(t)
    found = t.driver.execute(
        "SELECT constraint_column_names FROM duckdb_constraints() "
        "WHERE database_name = :db AND lower(schema_name) = :schema "
        "AND lower(table_name) = :table AND constraint_type IN ('PRIMARY KEY', 'UNIQUE')",
        {"db": database, "schema": schema, "table": t.table.lower()},
    )
    return any(list(names) == [t.id_column] for (names,) in found)


def _refuse_duplicates(t: Any, rows: int) -> None:
    """validate()'s duplicate check (a hash aggregate: ~20 ms at 10^5 rows, 0.3 s at 10^6)."""
    c = ' COLLATE "binary"' if t.text_ids else ""
    distinct, nulls = t.driver.one(
        f"SELECT count(DISTINCT {t.id_sql}{c}), count(*) - count({t.id_sql}) FROM {t.source}"
    )
    if int(distinct) + int(nulls) == rows:
        return
    duplicate = t.driver.scalar(
        f"SELECT {t.id_sql}{c} FROM {t.source} GROUP BY {t.id_sql}{c} HAVING count(*) > 1 LIMIT 1"
    )
    facts = TableFacts(rows, 0, int(distinct) + int(nulls), 0, 0, 0)
    raise_if_invalid(facts, t.where, t.id_column, t.score_column, duplicate)


__all__ = ["DISTINCT_CHECK_MAX", "CatalogHints", "TableReads", "Unreadable", "table_costs"]
