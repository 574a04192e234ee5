"""PostgresTable (copy mode) reading the table itself: what a run does when its copy is not
proven current (docs/freshness.md).

The run's release is the one-shot mechanism (Wu, Ohrimenko, Wirth 2023, Algorithm 2) run in
PostgreSQL on the user's table with keyed noise (topk_middleware/keyed_noise.py), as DuckDB does
(adapters/duckdb_live.py). Each row's *position* is its slot: block * P + offset - 1 with P the
most tuples a heap page holds (291 for 8 kB pages), plus the first slot of its relation where
the table has partitions or children. Within the run's snapshot every visible row keeps its
ctid (a version the snapshot sees is not pruned, and the table's ACCESS SHARE lock, taken by the
run's first query, keeps VACUUM FULL, CLUSTER and TRUNCATE out), and the slots are known before
any noise is drawn (the relations' sizes, read after the lock). Slots without a row are
positions without an item: each position is still an exceedance with probability q,
independently, and an empty one never wins, so the release has the one-shot law.

The run's first query is one aggregate pass: m and the largest score (`max_score`: the
planner's bounds), and the checks of `validate()` that the catalog does not
guarantee. What the catalog guarantees is read, not scanned: ids are unique and present where a
unique B-tree has exactly the id column as its key; scores are present, finite and >= 0 where
the table's NOT NULL and validated CHECK constraints refute `score IS NULL OR score < 0 OR score
= 'NaN' OR ...` (PostgreSQL's own prover, `constraint_exclusion = on`, under EXPLAIN: no scan
node left). Without a unique key, ids are counted distinct on tables of up to
DISTINCT_CHECK_MAX rows (estimated), and only the rows the release reads are checked above.

The one-shot itself (`_table_oneshot`):

1. the exceedances (about 1,024 positions drawn by the client) are read by ctid (`ctid =
   ANY(...)`, a TID scan per relation), with, where a B-tree leads with the score column or the
   planner has no statistics of it, the k rows of the top scores; the client computes their
   noise (the exceedances' drawn, the others' keyed) and the k-th largest noisy score T of them;
2. one range read of the rows with score >= c computes the keyed noise of each in PostgreSQL and
   returns the k best. c = T - bound is a valid cut (a row outside the exceedances can reach T
   only from there); where the top rows were not read, c is the larger of that and a cut guessed
   from pg_stats (a score above which the statistics put at least 4k rows, less the bound and
   one scale: among 4k rows the k-th largest noise is about b ln 4 > 0), and the guess is
   checked afterwards: when the k-th best of both reads, less the bound, lies below it, the
   range read is made again from there (exactly). Statistics gone stale cost that second read,
   never an answer.

Size: one mixin, TableRead, whose parts share the run's table state; PostgresTable keeps the
copy's reads.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from topk_middleware.access import AccessError, Rows, StoreCosts
from topk_middleware.keyed_noise import KeyedNoise, capped_sql, uniform_from_hex_sql

from .._sql import (
    TableFacts,
    id_array,
    int_array_literal,
    raise_if_invalid,
    tid_array_literal,
)

# Ids are counted distinct on tables of at most this many rows without a unique key (a hash
# aggregate: about 40 ms at 10^5 rows, 0.2-0.4 s at 10^6); above, the rows read are checked.
DISTINCT_CHECK_MAX = 100_000
# The cut guessed from the statistics keeps about this many times k rows above it.
GUESS_ROWS_PER_K = 4
INTEGER_TYPES = ("smallint", "integer", "bigint")
# Measured at m = 10^6 on this project's 2-core machine (benchmarks/freshness_copy.py): an
# aggregate pass or a filtered scan about 25-40 ms (3e-8 s a row), a rebuild of the copy
# 2.3-6 s (prepare(refresh=True): 2.5e-6 s a row), a keyed hash about 0.6 us a row.
SCAN_ROW = 3.5e-8
REBUILD_ROW = 2.5e-6
HASH_ROW = 6e-7


def table_costs(m: int) -> StoreCosts:
    """What reads of the table itself cost (the planner's input in a table run): every sorted
    read is an ORDER BY .. LIMIT OFFSET over a scan, a batch of random reads by rank a window
    over the whole table, the in-store one-shot a TID scan and a range read (one scan where no
    B-tree leads with the score)."""
    return StoreCosts(
        round_trip=2e-4 + SCAN_ROW * m,
        sorted_row=1e-6,
        random_batch=1e-2,
        random_row=1e-6,
        random_batch_item=6e-7,
        oneshot_row=HASH_ROW,
        full_read_row=1e-6,
        oneshot_fixed=2e-3 + SCAN_ROW * m,
        sorted_scans=True,
    )


@dataclass
class TableState:
    """What a run reading the table itself knows after its first query."""

    leaves: list[tuple[int, str, int]]  # (oid, qualified name, first slot) of heap relations
    per_page: int  # slots per block
    slots: int  # positions the exceedances are drawn from
    max_score: float
    score_type: str
    unique_ids: bool  # a unique key guarantees distinct ids
    score_index: bool  # a B-tree leads with the score column
    m: int = 0
    stats: tuple[list[float], list[float], list[float], float] | None = None
    plan: dict[str, Any] = field(default_factory=dict)

    @property
    def partitioned(self) -> bool:
        return len(self.leaves) != 1


def slots_per_page(block_size: int) -> int:
    """MaxHeapTuplesPerPage: (block size - page header) / (aligned tuple header + line pointer)."""
    return (block_size - 24) // (24 + 4)


def refresh_seconds(m: int) -> float:
    """A rebuild of the copy (prepare(refresh=True)) and a threshold run on it."""
    return 5e-3 + REBUILD_ROW * m


def table_seconds(m: int, hashed: int) -> float:
    """The in-store one-shot on the table: the aggregate pass, the range read, the hashes."""
    return 2e-3 + 2 * SCAN_ROW * m + HASH_ROW * hashed


def _parse_array(text: Any) -> list[float]:
    """An array of numbers as pg_stats prints it ('{1,2.5}'), as floats (NaN and infinities
    dropped: a cut is only guessed from finite values)."""
    if not text:
        return []
    out = []
    for part in str(text).strip("{}").split(","):
        try:
            value = float(part.strip('"'))
        except ValueError:
            continue
        if math.isfinite(value):
            out.append(value)
    return out


def guess_cut(
    stats: tuple[list[float], list[float], list[float], float], m: int, rows: int
) -> float | None:
    """The largest score x among pg_stats' most common values and histogram bounds above which
    the statistics put at least `rows` of m rows, counting a histogram bucket only where it
    lies wholly above x (scores are skewed within the top bucket: a linear reading of it puts
    the cut far too high on Zipf counts); None where the statistics do not say."""
    values, freqs, bounds, null_frac = stats
    other = max(0.0, 1.0 - null_frac - float(sum(freqs)))
    buckets = len(bounds) - 1

    def above(x: float) -> float:
        count = sum(f for v, f in zip(values, freqs, strict=False) if v >= x)
        if buckets > 0:
            whole = buckets - bisect.bisect_left(bounds, x)  # buckets whose lower bound >= x
            count += other * max(0, whole) / buckets
        return count * m

    for x in sorted({*values, *bounds}, reverse=True):
        if above(x) >= rows:
            return x
    return None


def _stats(row: Any) -> tuple[list[float], list[float], list[float], float] | None:
    """The planner's statistics of the score column (pg_stats: most common values, their
    frequencies, histogram bounds, null fraction), if it has them."""
    values, freqs = _parse_array(row[0]), _parse_array(row[1])
    if len(values) != len(freqs):
        values, freqs = [], []
    bounds = sorted(_parse_array(row[2]))
    if not values and len(bounds) < 2:
        return None
    return values, freqs, bounds, float(row[3] or 0.0)


class TableRead:
    """The reads of a PostgresTable run on the table itself (module docstring)."""

    _base: sql.Composable
    _id: sql.Composable
    _score: sql.Composable
    _conn: psycopg.Connection[Any]
    where: str
    schema: str | None
    table: str
    id_column: str
    score_column: str

    # ----- the run's first queries ------------------------------------------------------------
    def _table_state(self, cur: psycopg.Cursor[Any]) -> tuple[int, TableState] | None:
        """m and the table state of a run that reads the table (module docstring): a catalog
        query (NOT NULL, unique keys, a B-tree on the score, the statistics), an EXPLAIN where
        CHECK constraints may vouch for the scores' range, then one aggregate pass, which takes
        the run's lock on the table and, in the same statement, reads the relations' sizes.
        None where the table is no table (a view, a foreign or materialized table: no ctid to
        name positions by)."""
        base = self._base.as_string(self._conn)
        facts = cur.execute(
            "SELECT c.oid, c.relkind, c.reltuples, format_type(sa.atttypid, sa.atttypmod), "
            "ia.attnotnull, sa.attnotnull, EXISTS (SELECT 1 FROM pg_index x "
            "WHERE x.indrelid = c.oid AND x.indisunique AND x.indisvalid AND x.indnkeyatts = 1 "
            "AND x.indexprs IS NULL AND x.indpred IS NULL AND x.indkey[0] = ia.attnum), "
            "EXISTS (SELECT 1 FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
            "JOIN pg_am am ON am.oid = i.relam WHERE x.indrelid = c.oid AND x.indisvalid "
            "AND am.amname = 'btree' AND x.indexprs IS NULL AND x.indpred IS NULL "
            "AND x.indkey[0] = sa.attnum), current_setting('block_size')::int, "
            "st.most_common_vals::text, st.most_common_freqs::text, "
            "st.histogram_bounds::text, st.null_frac "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN pg_attribute ia ON ia.attrelid = c.oid AND ia.attname = %(id)s "
            "AND NOT ia.attisdropped JOIN pg_attribute sa ON sa.attrelid = c.oid "
            "AND sa.attname = %(score)s AND NOT sa.attisdropped "
            "LEFT JOIN LATERAL (SELECT * FROM pg_stats s WHERE s.schemaname = n.nspname "
            "AND s.tablename = c.relname AND s.attname = %(score)s "
            "ORDER BY s.inherited DESC LIMIT 1) st ON true WHERE c.oid = to_regclass(%(base)s)",
            {"id": self.id_column, "score": self.score_column, "base": base},
        ).fetchone()
        if facts is None:
            raise ValueError(
                f"{self.where} does not exist, or has no column {self.id_column!r} or "
                f"{self.score_column!r} (any more)"
            )
        oid, kind, estimate, score_type, ids_present, scores_present = facts[:6]
        unique, score_index, block_size = facts[6:9]
        if kind not in ("r", "p"):
            return None
        in_range = self._constraints_vouch(cur, score_type)
        s = self._score
        columns = [sql.SQL("count(*)"), sql.SQL("max({})").format(s)]
        columns.append(sql.SQL("count({})").format(self._id) if not ids_present else sql.NULL)
        columns.append(sql.SQL("count({})").format(s) if not scores_present else sql.NULL)
        columns.append(sql.SQL("min({})").format(s) if not in_range else sql.NULL)
        count_distinct = not unique and float(estimate) <= DISTINCT_CHECK_MAX
        columns.append(
            sql.SQL("count(DISTINCT {})").format(self._id) if count_distinct else sql.NULL
        )
        per_page = slots_per_page(int(block_size))
        columns.append(
            sql.SQL(
                "(WITH RECURSIVE tree(rel) AS (SELECT {oid}::oid UNION ALL SELECT i.inhrelid "
                "FROM pg_inherits i JOIN tree t ON i.inhparent = t.rel) "
                "SELECT json_agg(json_build_array(c.oid, quote_ident(n.nspname) || '.' || "
                "quote_ident(c.relname), pg_relation_size(c.oid) / {size}) ORDER BY c.oid) "
                "FROM tree t JOIN pg_class c ON c.oid = t.rel "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'r')"
            ).format(oid=sql.Literal(oid), size=sql.Literal(int(block_size)))
        )
        row = cur.execute(
            sql.SQL("SELECT {} FROM {}").format(sql.SQL(", ").join(columns), self._base)
        ).fetchone()
        m, high, ids, scores, low, distinct, layout = row
        ids = m if ids is None else ids
        scores = m if scores is None else scores
        self._check_aggregates(cur, int(m), high, (ids, scores, low))
        if count_distinct and int(distinct) != int(m):
            self._refuse_duplicates(cur, int(m), int(distinct))
        leaves, first = [], 0
        for rel, name, blocks in layout or []:
            leaves.append((int(rel), str(name), first))
            first += int(blocks) * per_page
        stats = None if score_index else _stats(facts[9:13])
        state = TableState(
            leaves,
            per_page,
            max(first, 1),
            float(high),
            score_type,
            bool(unique) or count_distinct,
            bool(score_index),
            int(m),
            stats,
        )
        return int(m), state

    def _constraints_vouch(self, cur: psycopg.Cursor[Any], score_type: str) -> bool:
        """Whether the table's validated CHECK constraints refute every score out of range
        (negative, NaN, infinite, beyond float8): EXPLAIN of a query for them with
        constraint_exclusion on (for this run's transaction) leaves no scan."""
        s = self._score
        bad = [sql.SQL("{} < 0").format(s)]
        if score_type not in INTEGER_TYPES:
            for value in ("NaN", "Infinity", "-Infinity"):
                bad.append(sql.SQL("{} = {}::float8").format(s, sql.Literal(value)))
        if score_type.startswith("numeric"):
            bad.append(sql.SQL("abs({}) > 1.7976931348623157e308::numeric").format(s))
        cur.execute("SELECT set_config('constraint_exclusion', 'on', true)")
        plan = cur.execute(
            sql.SQL("EXPLAIN (FORMAT JSON) SELECT 1 FROM {} WHERE {}").format(
                self._base, sql.SQL(" OR ").join(bad)
            )
        ).fetchone()[0]
        plan = plan if isinstance(plan, list) else json.loads(plan)
        return not any(True for _ in _scans(plan))

    def _check_aggregates(
        self,
        cur: psycopg.Cursor[Any],
        m: int,
        high: Any,
        checks: tuple[Any, ...] | None,
    ) -> None:
        """validate()'s refusals from the aggregate pass (exact counts in a second query for
        the message, only when something is wrong)."""
        if m == 0:
            raise ValueError(f"{self.where} is empty: there is no item to select")
        if checks is None:
            return
        if isinstance(high, Decimal) and high.is_finite() and abs(high) > Decimal("1.7e308"):
            raise ValueError(
                f"{self.where} column {self.score_column!r} has score(s) beyond the float8 "
                "range (about 1.8e308): scores are compared as float8"
            )
        ids, scores, low = checks
        top = float(high) if high is not None else 0.0
        if (
            int(ids) == m
            and int(scores) == m
            and (low is None or float(low) >= 0)
            and math.isfinite(top)
        ):
            return
        non_finite, negative = cur.execute(
            sql.SQL(
                "SELECT count(*) FILTER (WHERE {score}::float8 IN ('NaN', 'Infinity', "
                "'-Infinity')), count(*) FILTER (WHERE {score} < 0) FROM {base}"
            ).format(score=self._score, base=self._base)
        ).fetchone()
        facts = TableFacts(m, m - int(ids), m, m - int(scores), int(non_finite), int(negative))
        raise_if_invalid(facts, self.where, self.id_column, self.score_column)

    def _refuse_duplicates(self, cur: psycopg.Cursor[Any], m: int, distinct: int) -> None:
        duplicate = cur.execute(
            sql.SQL("SELECT {id} FROM {base} GROUP BY {id} HAVING count(*) > 1 LIMIT 1").format(
                id=self._id, base=self._base
            )
        ).fetchone()
        facts = TableFacts(m, 0, distinct, 0, 0, 0)
        raise_if_invalid(
            facts, self.where, self.id_column, self.score_column, duplicate and duplicate[0]
        )

    # ----- the one-shot on the table ----------------------------------------------------------
    def _position_sql(self, state: TableState, alias: str = "") -> sql.Composable:
        """SQL of a row's slot (module docstring) from its ctid (and tableoid)."""
        a = f"{alias}." if alias else ""
        point = f"({a}ctid::text::point)"
        local = f"(({point}[0])::bigint * {state.per_page} + ({point}[1])::bigint - 1)"
        if not state.partitioned:
            return sql.SQL(local)
        cases = " ".join(f"WHEN {rel} THEN {first}" for rel, _, first in state.leaves)
        return sql.SQL(f"((CASE {a}tableoid {cases} END) + {local})")

    def _cut_param(self, state: TableState, cut: float) -> tuple[sql.Composable, Any]:
        """`score >= c` as SQL and its parameter, in the column's own type where that keeps
        an index usable (integers: the ceiling; numeric: the exact decimal)."""
        if state.score_type in INTEGER_TYPES:
            return sql.SQL("{} >= %(cut)s::bigint").format(self._score), math.ceil(cut)
        if state.score_type.startswith("numeric"):
            return sql.SQL("{} >= %(cut)s::numeric").format(self._score), Decimal(cut)
        return sql.SQL("{} >= %(cut)s::float8").format(self._score), float(cut)

    def _known_rows(
        self, cur: psycopg.Cursor[Any], state: TableState, noise: KeyedNoise, k: int, top: bool
    ) -> tuple[np.ndarray, list[Any], np.ndarray]:
        """The rows at the exceedances' positions (by ctid), and the k rows of the top scores
        where `top`: positions, ids, scores."""
        parts: list[sql.Composable] = []
        params: dict[str, Any] = {}
        firsts = np.array([first for _, _, first in state.leaves], dtype=np.int64)
        exceed = np.asarray(noise.exceed_positions, dtype=np.int64)
        leaf_of = np.searchsorted(firsts, exceed, side="right") - 1
        score = sql.SQL("{}::float8").format(self._score)
        for leaf in np.unique(leaf_of).tolist():
            name = f"tids{leaf}"
            params[name] = tid_array_literal(exceed[leaf_of == leaf] - firsts[leaf], state.per_page)
            parts.append(
                sql.SQL(
                    "(SELECT {pos}, {id}, {score} FROM ONLY {rel} WHERE ctid = ANY({param}::tid[]))"
                ).format(
                    pos=self._position_sql(state),
                    id=self._id,
                    score=score,
                    rel=sql.SQL(state.leaves[leaf][1]),
                    param=sql.Placeholder(name),
                )
            )
        if top:
            params["k"] = int(k)
            parts.append(
                sql.SQL(
                    "(SELECT {pos}, {id}, {score} FROM {base} ORDER BY {raw} DESC LIMIT %(k)s)"
                ).format(
                    pos=self._position_sql(state),
                    id=self._id,
                    score=score,
                    base=self._base,
                    raw=self._score,
                )
            )
        if not parts:
            return np.empty(0, np.int64), [], np.empty(0, np.float64)
        records = cur.execute(sql.SQL(" UNION ALL ").join(parts), params).fetchall()
        positions = np.array([r[0] for r in records], dtype=np.int64)
        positions, first = np.unique(positions, return_index=True)
        ids = [records[i][1] for i in first]
        scores = np.array([records[i][2] for i in first], dtype=np.float64)
        return positions, ids, scores

    def _range_read(
        self,
        cur: psycopg.Cursor[Any],
        state: TableState,
        noise: KeyedNoise,
        k: int,
        cut: float,
    ) -> list[tuple[Any, ...]]:
        """The k best rows by score + keyed noise among those with score >= `cut` outside the
        exceedances, computed in PostgreSQL: (position, id, score, noisy score)."""
        digits = (
            "(('x' || encode(substring(sha256((%(key)s || ':' || r.pos)::bytea) FROM 1 FOR 7), "
            "'hex'))::bit(56)::bigint >> 4)::float8"
        )
        keyed = noise.sql(uniform_from_hex_sql(digits))
        params: dict[str, Any] = {
            "key": noise.key,
            "k": int(k),
            "positions": int_array_literal(noise.exceed_positions),
        }
        where: sql.Composable = sql.SQL("")
        if math.isfinite(cut):
            condition, params["cut"] = self._cut_param(state, cut)
            where = sql.SQL(" WHERE ") + condition
        query = sql.SQL(
            "SELECT r.pos, r.id, r.score, "
            + capped_sql("r.score", noise.score_cap)
            + " + "
            + keyed.replace("%", "%%").replace("%%(key)s", "%(key)s")
            + " AS v FROM (SELECT {pos} AS pos, {id} AS id, {score}::float8 AS score "
            "FROM {base}{where}) AS r WHERE r.pos NOT IN (SELECT unnest(%(positions)s::bigint[])) "
            "ORDER BY v DESC NULLS FIRST, r.pos LIMIT %(k)s"
        ).format(
            pos=self._position_sql(state),
            id=self._id,
            score=self._score,
            base=self._base,
            where=where,
        )
        records = cur.execute(query, params).fetchall()
        if records and records[0][0] is None:
            raise AccessError(
                f"{self.where}: a row of a relation the run did not know (a partition attached "
                "during the run) was read: try again"
            )
        return records

    def _table_oneshot(self, state: TableState, noise: KeyedNoise, k: int) -> Rows:
        """Algorithm 2 with keyed noise on the table itself (module docstring, steps 1-2)."""
        with self._conn.cursor() as cur:
            top = state.score_index or state.stats is None
            positions, ids, scores = self._known_rows(cur, state, noise, k, top)
            # min(score, B) + noise (privacy.score_bound), as every path reads scores
            capped = noise.capped(scores)
            noisy = capped + noise.noises(positions) if len(positions) else capped
            known_t = float(np.sort(noisy)[-k]) if len(noisy) >= k else -math.inf
            exact = _below(known_t, noise.bound)
            cut, guessed = exact, False
            if not top and state.stats is not None:
                guess = guess_cut(state.stats, state.m, GUESS_ROWS_PER_K * k)
                if guess is not None and guess - noise.bound - noise.scale > exact:
                    cut, guessed = guess - noise.bound - noise.scale, True
            rest = self._range_read(cur, state, noise, k, cut)
            values = np.concatenate([noisy, [float(r[3]) for r in rest]])
            t = float(np.sort(values)[-k]) if len(values) >= k else -math.inf
            low = _below(t, noise.bound)
            state.plan.update({"cut_guessed": guessed, "cut_missed": guessed and low < cut})
            if guessed and low < cut:  # the statistics put the cut too high: read from low
                rest = self._range_read(cur, state, noise, k, low)
        all_positions = np.concatenate(
            [positions, np.array([r[0] for r in rest], dtype=np.int64)]
        ).astype(np.int64)
        all_ids = [*ids, *(r[1] for r in rest)]
        all_scores = np.concatenate([scores, [float(r[2]) for r in rest]])
        all_noisy = np.concatenate([noisy, [float(r[3]) for r in rest]])
        all_positions, first = np.unique(all_positions, return_index=True)
        all_ids = [all_ids[i] for i in first]
        all_scores, all_noisy = all_scores[first], all_noisy[first]
        if not state.unique_ids and len(set(all_ids)) != len(all_ids):
            seen: set[Any] = set()
            duplicate = next(i for i in all_ids if i in seen or seen.add(i))
            facts = TableFacts(len(all_ids), 0, len(set(all_ids)), 0, 0, 0)
            raise_if_invalid(facts, self.where, self.id_column, self.score_column, duplicate)
        best = np.lexsort((all_positions, -all_noisy))[:k]
        chosen = id_array([all_ids[i] for i in best])
        return Rows(np.arange(len(best), dtype=np.int64), chosen, all_scores[best])


def _below(t: float, bound: float) -> float:
    """The cut under a k-th best noisy score t: rows below it cannot reach t."""
    return t - bound - 1e-12 * abs(t) if math.isfinite(t) else -math.inf


INDEX_SCANS = ("Index Scan", "Index Only Scan", "Bitmap Index Scan", "Bitmap Heap Scan")


def _scans(plan: Any) -> Any:
    """Every scan node of an EXPLAIN (FORMAT JSON) plan."""
    if isinstance(plan, list):
        for entry in plan:
            yield from _scans(entry)
    elif isinstance(plan, dict):
        node = str(plan.get("Node Type", ""))
        if node.endswith("Scan"):
            yield node
        for value in plan.values():
            if isinstance(value, list | dict):
                yield from _scans(value)
