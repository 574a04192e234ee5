"""DuckDB refresh by delta: the rank-ordered copy as a *base*, the changed rows as a small *delta*.

DuckDB has no index-ordered scan, so `DuckDBTable.prepare()` (copy.py) writes a rank-ordered
copy of the table (the base) and, in the same transaction, a *shadow*: (id, score, base rank) of
every row, in the user table's row order. After writes, `DuckDBTable.refresh()` finds the
changed rows in one pass: a POSITIONAL JOIN of the user table with the shadow (both scanned
once, in lockstep; no sort, no hash join of m rows). Rows whose id and score agree with the
shadow row beside them are unchanged; the others (and shadow rows with no live row beside them)
are matched by id among themselves (a hash join of the mismatched rows only), which tells score
changes, inserts and deletes apart. UPDATE keeps a row in place and INSERT appends, so the
mismatched rows are the changed ones. A DELETE shifts every later row against the shadow: still
correct (those rows match by id and compare equal) but each costs a hash-join row, so once the
mismatched rows pass the fold fraction the refresh folds instead. Only the mismatched rows are
validated (the others were when the base was built): the errors of `validate()`, before anything
is written.

Positions (topk_middleware/access.py: what random access and sampling name) stay dense 0..m-1,
as a function of the base and the table's current rows (the delta is recomputed from the base at
every refresh, so it never drifts):

* an item of the base keeps its base rank as position (changed score or not);
* inserted items take the positions m_base, m_base + 1, ... in id order (byte order for text);
* with m = m_base + inserted - deleted, the positions >= m that are still held are given to the
  holes below m left by deleted items, lowest to lowest (a batched swap-remove: the item at the
  top position moves into the hole).

The *delta* table holds (seq, position, id, score) of every item not served by the base as it
stands (changed score, inserted, or moved), in canonical order (seq = its place there); the
*skip* table holds the base ranks the base no longer serves (changed, deleted, moved), ascending.
So m = |base| - |skip| + |delta|. Sorted access is the base minus the skipped ranks merged with
the delta (`DeltaView.read_sorted`, a merge cursor over windows of both); random access by
position is the delta's position first, then the base rank. While the delta is non-empty
positions are not ranks (`positions_are_ranks` False: the core infers nothing from tied
neighbours); the store still answers scores at positions without reading rows
(`PositionScores`): a base position's score is that of its base rank, given by the base's runs of
tied scores, and the delta's are read from the delta. Empty delta: the rank table as before.

Folding: when the delta (or the skip list, or the mismatched rows) passes `fold_fraction` of m
(default FOLD_FRACTION = 5%), `refresh()` rebuilds the base by a full sort and empties the delta.
Measured by `python -m benchmarks freshness --fold-sweep` (benchmarks/results/
freshness_fold.json, m = 10^7, zipf and plateau): a full rebuild costs about 12 s; a delta refresh
about 0.24 s at a delta of 0.5% of m, 0.46 s at 2.7%, 0.9-1.1 s at 5.5%, 1.3-2.5 s at 11%; a
plateau release reading the delta 43 ms at 0.5%, 103-126 ms at 2.7-5.5%, 181 ms at 11% (zipf:
7-30 ms). Writes arriving as batches that each add 0.5% of m to the delta make the cost per
refresh, the fold's share included, flat between 5% and 10% (within 10% of its minimum, near
7%); 5% keeps the slowest refresh near 1 s. (The sweep's release times predate DeltaCache,
which has since brought releases on a pending delta of 0.5% of m to today's run.)
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from topk_middleware.access import AccessError, Rows

# Fold the delta into a new base when it holds more than this fraction of m.
FOLD_FRACTION = 0.05
# Rows of the base and of the delta read per window of the merge cursor.
MERGE_WINDOW = 8192
# Random access scores come from the base's runs of tied scores up to this many runs.
RUNS_READ_MAX = 65536
# Up to this many positions are looked up in the delta by a list of constants; a longer batch
# reads the delta's (position, score) once per snapshot.
INDEX_LOOKUP_MAX = 64


@dataclass
class RefreshReport:
    """What the last `refresh()` did (for operators and tests)."""

    kind: str  # "delta", "fold" (rebuilt past the fraction), "build" (no base yet), "none"
    changed: int = 0  # items whose score changed
    inserted: int = 0
    deleted: int = 0
    mismatched_rows: int = 0  # rows the positional pass could not pair as unchanged
    m_base: int = 0
    delta_rows: int = 0
    skip_rows: int = 0
    m: int = 0
    table_reads: int = 0  # statements of the refresh that read the user's table
    statements: list[str] = field(default_factory=list)


@dataclass
class DeltaNames:
    """Quoted names of the tables a delta refresh uses."""

    base: str  # the rank table (rank, id, score), in rank order
    shadow: str  # (id, score, rank) of the base, in the user table's rowid order
    delta: str  # (seq, position, id, score), in canonical order
    skip: str  # (base_rank), ascending
    table: str  # the user's table
    id: str  # its id column (quoted)
    score: str  # its score column (quoted)
    collate: str  # ' COLLATE "binary"' for text ids, else ""
    runs: str = ""  # the base's runs of tied scores (first_rank, score), if it has them


def shadow_sql(names: DeltaNames) -> str:
    """The shadow from the rank table and the user's table, as of the same transaction."""
    c = names.collate
    return (
        f"CREATE OR REPLACE TABLE {names.shadow} AS SELECT r.id, t.{names.score} AS score, r.rank "
        f"FROM {names.table} AS t JOIN {names.base} AS r ON r.id{c} = t.{names.id}{c} "
        "ORDER BY t.rowid"
    )


def empty_delta_sql(names: DeltaNames) -> list[str]:
    """Empty delta and skip tables (with the types of the base)."""
    return [
        f"CREATE OR REPLACE TABLE {names.delta} AS SELECT 0::BIGINT AS seq, rank AS position, "
        f"id, score, 0::BIGINT AS gen FROM {names.base} LIMIT 0",
        f"CREATE OR REPLACE TABLE {names.skip} AS SELECT rank AS base_rank FROM {names.base} "
        "LIMIT 0",
        delta_comment_sql(names, 0, 0, None),
    ]


# The delta table's comment: its row count, the skip table's and the generation, written in the
# transaction that writes them, so that a run reads them with the catalog lookup it makes anyway
# (DuckDBTable._lookup) instead of counting both tables (about 0.65 ms of a ~5 ms run).
DELTA_TAG = "topk-delta"


def delta_comment_sql(names: DeltaNames, delta: int, skip: int, gen: int | None) -> str:
    return (
        f"COMMENT ON TABLE {names.delta} IS "
        f"'{DELTA_TAG} {int(delta)} {int(skip)} {'-' if gen is None else int(gen)}'"
    )


def parse_delta_comment(comment: str | None) -> tuple[int, int, int | None] | None:
    """(delta rows, skip rows, generation) from the delta table's comment, or None where it
    holds none (tables written before it did: the run counts them)."""
    parts = (comment or "").split(" ")
    if len(parts) != 4 or parts[0] != DELTA_TAG:
        return None
    try:
        return int(parts[1]), int(parts[2]), None if parts[3] == "-" else int(parts[3])
    except ValueError:
        return None


class DeltaRefresh:
    """One delta refresh inside the caller's transaction on `con` (see the module docstring)."""

    def __init__(self, driver: Any, names: DeltaNames, where: str) -> None:
        self.driver, self.n, self.where = driver, names, where
        self.report = RefreshReport("delta")

    def _run(self, sql: str) -> Any:
        """The first row of the statement's result (None without one)."""
        self.report.statements.append(sql)
        if self.n.table in sql:
            self.report.table_reads += 1
        return self.driver.one(sql)

    def find_changes(self, fold_fraction: float) -> bool:
        """The one pass over the user's table, then the changes among the mismatched rows.
        Leaves the temp table __topk_changes (id, score, base_rank, present) of every item whose
        state differs from the base, and fills the report's counts. False when the mismatched
        rows or the delta would pass `fold_fraction` of m (the caller folds instead)."""
        n, c = self.n, self.n.collate
        self._run(
            "CREATE OR REPLACE TEMP TABLE __topk_mismatch AS SELECT l.rowid IS NOT NULL AS l_live, "
            f"l.{n.id} AS l_id, l.{n.score}::DOUBLE AS l_score, s.rank IS NOT NULL AS s_live, "
            "s.id AS s_id, s.score::DOUBLE AS s_score, s.rank AS s_rank "
            f"FROM {n.table} AS l POSITIONAL JOIN {n.shadow} AS s "
            f"WHERE l.{n.id}{c} IS DISTINCT FROM s.id{c} OR l.{n.score} IS DISTINCT FROM s.score"
        )
        row = self._run(
            f"SELECT (SELECT count(*) FROM {n.base}), count(*), count_if(l_live AND l_id IS NULL), "
            "count_if(l_live AND l_score IS NULL), count_if(isnan(l_score) OR isinf(l_score)), "
            f"count_if(l_score < 0), count_if(l_live) - count(DISTINCT l_id{c}) "
            "FROM __topk_mismatch"
        )
        m_base, mismatched, null_ids, null_scores, non_finite, negative, repeated = (
            int(x or 0) for x in row
        )
        self.report.m_base, self.report.mismatched_rows = m_base, mismatched
        if mismatched > fold_fraction * m_base:
            return False
        self._refuse(null_ids, null_scores, non_finite, negative, repeated)
        self._run(
            "CREATE OR REPLACE TEMP TABLE __topk_changes AS "
            "WITH lv AS (SELECT l_id AS id, l_score AS score FROM __topk_mismatch WHERE l_live), "
            "bs AS (SELECT s_id AS id, s_score AS score, s_rank AS rank FROM __topk_mismatch "
            "WHERE s_live) "
            "SELECT coalesce(lv.id, bs.id) AS id, lv.score AS score, bs.rank AS base_rank, "
            "lv.id IS NOT NULL AS present "
            f"FROM lv FULL JOIN bs ON lv.id{c} = bs.id{c} "
            "WHERE lv.id IS NULL OR bs.id IS NULL OR lv.score <> bs.score"
        )
        row = self._run(
            "SELECT count_if(base_rank IS NULL), count_if(NOT present), "
            "count_if(present AND base_rank IS NOT NULL) FROM __topk_changes"
        )
        inserted, deleted, changed = (int(x or 0) for x in row)
        if inserted:
            # An inserted id that the base holds unchanged (its row paired as unchanged) is a
            # duplicate: one probe of the base by the inserted ids (a scan of the base's ids,
            # so only where something was inserted).
            duplicate = self._run(
                f"SELECT any_value(c.id) FROM __topk_changes AS c JOIN {n.base} AS b "
                f"ON b.id{c} = c.id{c} WHERE c.base_rank IS NULL"
            )[0]
            if duplicate is not None:
                raise ValueError(
                    f"{self.where} has duplicate ids (e.g. {duplicate!r}): each item must appear "
                    "once"
                )
        m = m_base + inserted - deleted
        if m <= 0:
            raise ValueError(f"{self.where} is empty: there is no item to select")
        self.report.inserted, self.report.deleted, self.report.changed = inserted, deleted, changed
        self.report.m = m
        # The delta: every present changed item, and every unchanged base item at rank >= m
        # (it moves into a hole); the skip list: the base ranks of changed items and all ranks
        # >= m. Counted before they are written, to fold instead of writing a large delta.
        top, changed_top, present, changed_below = self._run(
            f"SELECT greatest({m_base} - {m}, 0), count_if(base_rank >= {m}), "
            f"count_if(present), count_if(base_rank < {m}) FROM __topk_changes"
        )
        self.report.delta_rows = int(present or 0) + int(top) - int(changed_top or 0)
        self.report.skip_rows = int(changed_below or 0) + int(top)
        return max(self.report.delta_rows, self.report.skip_rows) <= fold_fraction * m

    def _refuse(
        self, null_ids: int, null_scores: int, non_finite: int, negative: int, repeated: int
    ) -> None:
        """The checks of `validate()` on the rows that differ from the base (the others were
        checked when the base was built)."""
        if null_ids:
            raise ValueError(f"{self.where} has {null_ids} NULL id(s)")
        if repeated:
            duplicate = self._run(
                f"SELECT l_id{self.n.collate} FROM __topk_mismatch WHERE l_live "
                f"GROUP BY l_id{self.n.collate} HAVING count(*) > 1 LIMIT 1"
            )[0]
            raise ValueError(
                f"{self.where} has duplicate ids (e.g. {duplicate!r}): each item must appear once"
            )
        if null_scores:
            raise ValueError(f"{self.where} has {null_scores} NULL score(s)")
        if non_finite:
            raise ValueError(f"{self.where} has {non_finite} NaN or infinite score(s)")
        if negative:
            raise ValueError(f"{self.where} has {negative} negative score(s)")

    def write_delta(self) -> None:
        """Positions (module docstring), then the delta and skip tables."""
        n, c, m, m_base = self.n, self.n.collate, self.report.m, self.report.m_base
        gen = secrets.randbits(62)  # names this delta for caches (DeltaCache)
        self._run(
            f"CREATE OR REPLACE TABLE {n.delta} AS "
            "WITH placed AS (SELECT id, score, base_rank, coalesce(base_rank, "
            f"{m_base} + row_number() OVER (PARTITION BY base_rank IS NULL ORDER BY id{c}) "
            "- 1) AS prov FROM __topk_changes WHERE present "
            f"UNION ALL SELECT b.id, b.score, b.rank, b.rank FROM {n.base} AS b "
            f"WHERE b.rank >= {m} "
            "AND b.rank NOT IN (SELECT base_rank FROM __topk_changes WHERE base_rank >= "
            f"{m})), "
            "movers AS (SELECT prov, row_number() OVER (ORDER BY prov) AS k "
            f"FROM placed WHERE prov >= {m}), "
            "holes AS (SELECT base_rank AS hole, row_number() OVER (ORDER BY base_rank) AS k "
            f"FROM __topk_changes WHERE NOT present AND base_rank < {m}), "
            "moved AS (SELECT movers.prov, holes.hole FROM movers JOIN holes USING (k)) "
            f"SELECT (row_number() OVER (ORDER BY p.score DESC, p.id{c} ASC) - 1)::BIGINT AS seq, "
            "coalesce(moved.hole, p.prov)::BIGINT AS position, p.id, p.score, "
            f"{gen}::BIGINT AS gen "
            "FROM placed AS p LEFT JOIN moved USING (prov) ORDER BY seq"
        )
        self._run(
            f"CREATE OR REPLACE TABLE {n.skip} AS SELECT base_rank FROM ("
            f"SELECT base_rank FROM __topk_changes WHERE base_rank < {m} "
            f"UNION ALL SELECT range AS base_rank FROM range({m}, greatest({m_base}, {m}))) "
            "ORDER BY base_rank"
        )
        delta, skip = self._run(
            f"SELECT (SELECT count(*) FROM {n.delta}), (SELECT count(*) FROM {n.skip})"
        )
        self._run(delta_comment_sql(n, delta, skip, gen if delta else None))


# A delta of at most this many rows is kept in memory between runs (DeltaCache).
CACHE_MAX_ROWS = 1_000_000


@dataclass(frozen=True)
class DeltaCache:
    """One delta generation in memory: a refresh writes new delta and skip tables under a new
    generation number and never changes them in place, so runs whose snapshot reads the same
    generation can share what it holds (numeric ids only: merged by numpy)."""

    gen: int
    rows: tuple[np.ndarray, np.ndarray, np.ndarray]  # the delta's (position, id, score) by seq
    by_position: tuple[np.ndarray, np.ndarray]  # the delta's (position, score) by position
    skip: np.ndarray  # the skipped base ranks, ascending
    runs: tuple[np.ndarray, np.ndarray] | None  # the base's runs (first rank, score)


def load_cache(driver: Any, names: DeltaNames, gen: int, with_runs: bool) -> DeltaCache:
    """Read one delta generation (in the caller's snapshot): three queries."""
    got = driver.arrays(f"SELECT seq, position, id, score FROM {names.delta}")
    order = np.argsort(np.asarray(got["seq"], dtype=np.int64), kind="stable")
    positions = np.asarray(got["position"], dtype=np.int64)[order]
    ids = np.asarray(got["id"])[order]
    scores = np.asarray(got["score"], dtype=np.float64)[order]
    by_position = np.argsort(positions)
    skip = np.sort(
        np.asarray(driver.arrays(f"SELECT base_rank FROM {names.skip}")["base_rank"])
    ).astype(np.int64)
    runs = None
    if with_runs and names.runs:
        r = driver.arrays(f"SELECT first_rank, score FROM {names.runs}")
        first = np.asarray(r["first_rank"], dtype=np.int64)
        run_order = np.argsort(first)
        runs = (first[run_order], np.asarray(r["score"], dtype=np.float64)[run_order])
    return DeltaCache(
        gen, (positions, ids, scores), (positions[by_position], scores[by_position]), skip, runs
    )


class DeltaView:
    """Reads of one snapshot through base + delta (module docstring), on the run's cursor.

    CountedAccess reads the sorted prefix in order, so the view keeps a merge cursor (depth, next
    base rank, next delta seq); a read starting anywhere else is served by one ordered query over
    the whole merged relation (correct, slower).
    """

    def __init__(
        self,
        driver: Any,
        names: DeltaNames,
        m_base: int,
        delta_rows: int,
        skip_rows: int,
        base_runs: int | None = None,
        cache: DeltaCache | None = None,
    ) -> None:
        self.driver, self.n = driver, names
        self.cache = cache
        self.m_base, self.delta_rows, self.skip_rows = m_base, delta_rows, skip_rows
        self.base_runs = base_runs  # runs of tied scores of the base (None: no runs table)
        self.numeric_ids = not names.collate  # text ids compare in byte order: sorted by DuckDB
        self._runs = cache.runs if cache else None
        self._delta_scores = cache.by_position if cache else None  # (position, score) by position
        self.m = m_base - skip_rows + delta_rows
        self._depth = 0  # the merge cursor: next depth, next base rank, next delta seq
        self._base_next = 0
        self._delta_next = 0

    def relation(self) -> str:
        """(position, id, score) of every item: the base minus skipped ranks, and the delta."""
        n = self.n
        return (
            f"(SELECT rank AS position, id, score FROM {n.base} "
            f"WHERE rank NOT IN (SELECT base_rank FROM {n.skip}) "
            f"UNION ALL SELECT position, id, score FROM {n.delta})"
        )

    def read_sorted(self, start: int, count: int) -> Rows:
        start, stop = int(start), min(int(start) + int(count), self.m)
        if stop <= start:
            return _rows([], [], [])
        if start != self._depth:
            got = self.driver.arrays(
                f"SELECT position, id, score FROM {self.relation()} "
                f"ORDER BY score DESC, id{self.n.collate} ASC LIMIT :count OFFSET :start",
                {"count": stop - start, "start": start},
            )
            return _rows(got["position"], got["id"], got["score"])
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        need, trips = stop - start, 0
        while need > 0:
            positions, ids, scores = self._merge_window(need)
            trips += 1
            parts.append((positions, ids, scores))
            need -= len(positions)
        self._depth = stop
        rows = _rows(*(np.concatenate([p[i] for p in parts]) for i in range(3)))
        return Rows(rows.positions, rows.ids, rows.scores, round_trips=trips)

    def _merge_window(self, need: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Up to `need` rows of the merged order from the cursor, in one query: a window of the
        base (skipped ranks flagged), of the delta, merged by DuckDB in canonical order; the rows
        up to the earlier of the two windows' last rows are final (neither stream can put an
        unread row before them)."""
        first = self._base_next == 0 and self._delta_next == 0  # the first read: often short
        width = 2 * need + 16 if first else max(need, MERGE_WINDOW)
        # a margin on the base side: its window also holds skipped ranks
        b0, b1 = self._base_next, min(self._base_next + width + width // 8 + 16, self.m_base)
        d0, d1 = self._delta_next, min(self._delta_next + width, self.delta_rows)
        if self.cache is not None:
            got = self._cached_window(b0, b1, d0, d1)
        else:
            got = self._window_query(b0, b1, d0, d1)
        if self.numeric_ids:  # canonical order, the base's row before the delta's on a tie
            order = np.lexsort((got["src"], got["id"], -np.asarray(got["score"], np.float64)))
            got = {name: np.asarray(column)[order] for name, column in got.items()}
        return self._final_rows(got, need, b1, d1)

    def _cached_window(self, b0: int, b1: int, d0: int, d1: int) -> dict[str, np.ndarray]:
        """The base window from the store (a row id range), the delta's and the skipped ranks
        from the cache."""
        bounds = {"b0": b0, "b1": b1}
        base = self.driver.arrays(
            f"SELECT rank, id, score FROM {self.n.base} WHERE rowid >= :b0 AND rowid < :b1", bounds
        )
        ranks = np.asarray(base["rank"], dtype=np.int64)
        if len(ranks) != b1 - b0 or (len(ranks) and (ranks.min() != b0 or ranks.max() != b1 - 1)):
            base = self.driver.arrays(
                f"SELECT rank, id, score FROM {self.n.base} WHERE rank >= :b0 AND rank < :b1",
                bounds,
            )
            ranks = np.asarray(base["rank"], dtype=np.int64)
        skip = self.cache.skip  # type: ignore[union-attr]
        lo, hi = np.searchsorted(skip, [b0, b1])
        positions, ids, scores = self.cache.rows  # type: ignore[union-attr]
        return {
            "src": np.concatenate([np.zeros(len(ranks), np.int64), np.ones(d1 - d0, np.int64)]),
            "position": np.concatenate([ranks, positions[d0:d1]]),
            "id": np.concatenate([np.asarray(base["id"]), ids[d0:d1]]),
            "score": np.concatenate([np.asarray(base["score"], np.float64), scores[d0:d1]]),
            "skipped": np.concatenate([np.isin(ranks, skip[lo:hi]), np.zeros(d1 - d0, bool)]),
        }

    def _window_query(self, b0: int, b1: int, d0: int, d1: int) -> dict[str, np.ndarray]:
        """The base window (skipped ranks flagged) and the delta's, in one query."""
        n, c = self.n, self.n.collate
        return self.driver.arrays(
            "SELECT src, position, id, score, skipped FROM ("
            f"SELECT 0 AS src, b.rank AS position, b.id, b.score, "
            f"b.rank IN (SELECT base_rank FROM {n.skip} WHERE base_rank >= :b0 "
            "AND base_rank < :b1) AS skipped "
            f"FROM {n.base} AS b WHERE b.rowid >= :b0 AND b.rowid < :b1 "
            f"UNION ALL SELECT 1, position, id, score, false FROM {n.delta} "
            "WHERE seq >= :d0 AND seq < :d1) "
            # numeric ids are merged by numpy below (cheaper than a sort in the query)
            + ("" if self.numeric_ids else f"ORDER BY score DESC, id{c} ASC, src"),
            {"b0": b0, "b1": b1, "d0": d0, "d1": d1},
        )

    def _final_rows(
        self, got: dict[str, np.ndarray], need: int, b1: int, d1: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The merged window's rows that are final (see _merge_window), up to `need`, and the
        cursor moved past what they consumed."""
        src = np.asarray(got["src"], dtype=np.int64)
        skipped = np.asarray(got["skipped"], dtype=bool)
        final = len(src)
        if b1 < self.m_base:  # rows after the base window's last row may still come
            final = min(final, int(np.flatnonzero(src == 0)[-1]) + 1)
        if d1 < self.delta_rows:
            final = min(final, int(np.flatnonzero(src == 1)[-1]) + 1)
        served = np.flatnonzero(~skipped[:final])[:need]
        cut = int(served[-1]) + 1 if len(served) else final  # merged rows consumed
        self._base_next += int(np.count_nonzero(src[:cut] == 0))
        self._delta_next += int(np.count_nonzero(src[:cut] == 1))
        positions = np.asarray(got["position"], dtype=np.int64)[served]
        ids = np.asarray(got["id"])[served]
        scores = np.asarray(got["score"], dtype=np.float64)[served]
        return positions, ids, scores

    def read_positions(self, wanted: list[int], index_max: int) -> Rows:
        """Rows at the given positions: the delta's first, then the base by rank."""
        n = self.n
        keys = ", ".join(str(p) for p in wanted)
        if len(wanted) <= index_max:
            # two queries: inside a UNION the IN list would not be served by the rank index
            base = self.driver.arrays(
                f"SELECT 0 AS src, rank, id, score FROM {n.base} WHERE rank IN ({keys})"
            )
            delta = self.driver.arrays(
                f"SELECT 1 AS src, position AS rank, id, score FROM {n.delta} "
                f"WHERE position IN ({keys})"
            )
            got = {name: np.concatenate([base[name], delta[name]]) for name in base}
        else:
            got = self.driver.arrays(
                "WITH w AS (SELECT unnest(:wanted::BIGINT[]) AS p) "
                f"SELECT 0 AS src, rank, id, score FROM {n.base} WHERE rank IN (SELECT p FROM w) "
                f"UNION ALL SELECT 1, position, id, score FROM {n.delta} "
                "WHERE position IN (SELECT p FROM w)",
                {"wanted": wanted},
            )
        src = np.asarray(got["src"], dtype=np.int64)
        positions = np.asarray(got["rank"], dtype=np.int64)
        from_delta = set(positions[src == 1].tolist())
        keep = (src == 1) | ~np.isin(positions, list(from_delta))
        positions = positions[keep]
        ids = np.asarray(got["id"])[keep]
        scores = np.asarray(got["score"], dtype=np.float64)[keep]
        order = np.argsort(positions, kind="stable")
        return _rows(positions[order], ids[order], scores[order])

    def read_position_scores(self, positions: np.ndarray) -> tuple[np.ndarray, int, int] | None:
        """PositionScores (topk_middleware/access.py): the scores at positions without their
        rows. A position held by the delta is read from it (one query over the small delta);
        any other is a base rank, whose score the base's runs of tied scores give (read once per
        snapshot). None (read the rows) when the base keeps no runs or has more runs than
        RUNS_READ_MAX: count data has few distinct counts."""
        if not self.n.runs or self.base_runs is None or self.base_runs > RUNS_READ_MAX:
            return None
        # one round trip: the delta's scores at a short list of positions (else the whole
        # delta's, once per snapshot), with the base's runs the first time
        short = len(positions) <= INDEX_LOOKUP_MAX and self._delta_scores is None
        parts = []
        if short:
            keys = ", ".join(str(int(p)) for p in positions)
            parts.append(
                f"SELECT 1 AS src, position, score FROM {self.n.delta} WHERE position IN ({keys})"
            )
        elif self._delta_scores is None:
            parts.append(f"SELECT 1 AS src, position, score FROM {self.n.delta}")
        if self._runs is None:
            parts.append(f"SELECT 0, first_rank, score FROM {self.n.runs}")
        read = 0
        if parts:
            got = self.driver.arrays(" UNION ALL ".join(parts))
            src = np.asarray(got["src"], dtype=np.int64)
            where = np.asarray(got["position"], dtype=np.int64)
            values = np.asarray(got["score"], dtype=np.float64)
            read = len(src)
            if self._runs is None:
                runs = src == 0
                order = np.argsort(where[runs])
                self._runs = (where[runs][order], values[runs][order])
            held_here = src == 1
            if not short:
                order = np.argsort(where[held_here])
                self._delta_scores = (where[held_here][order], values[held_here][order])
        if short:
            got = {"position": where[held_here], "score": values[held_here]}
        else:  # the whole delta is known: numpy
            held_positions, held_scores = self._delta_scores  # type: ignore[misc]
            at = np.searchsorted(held_positions, positions)
            hit = at < len(held_positions)
            hit[hit] = held_positions[at[hit]] == positions[hit]
            got = {"position": positions[hit], "score": held_scores[at[hit]]}
        first, run_scores = self._runs
        in_delta = np.asarray(got["position"], dtype=np.int64)
        held = np.isin(positions, in_delta)
        scores = np.empty(len(positions), dtype=np.float64)
        base = positions[~held]
        if len(base) and (base.max() >= self.m_base or base.min() < 0):
            raise AccessError(f"position {int(base.max())} is neither in the delta nor the base")
        scores[~held] = run_scores[np.searchsorted(first, base, side="right") - 1]
        order = np.argsort(in_delta)
        where = np.searchsorted(in_delta[order], positions[held])
        scores[held] = np.asarray(got["score"], dtype=np.float64)[order][where]
        return scores, read, int(np.count_nonzero(~held))

    def read_ids_query(self) -> str:
        """(id, score) of the current items whose ids are in the list parameter."""
        n, c = self.n, self.n.collate
        return (
            f"SELECT id, score FROM {n.delta} WHERE id{c} IN (SELECT unnest(:ids){c}) "
            f"UNION ALL SELECT id, score FROM {n.base} WHERE id{c} IN (SELECT unnest(:ids){c}) "
            f"AND rank NOT IN (SELECT base_rank FROM {n.skip})"
        )


def _rows(positions: Any, ids: Any, scores: Any) -> Rows:
    ids = np.asarray(ids)
    if ids.dtype.kind in "US":
        ids = ids.astype(object)
    return Rows(np.asarray(positions, dtype=np.int64), ids, np.asarray(scores, dtype=np.float64))
