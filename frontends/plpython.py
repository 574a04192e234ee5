"""SPITable: a live PostgreSQL table read from inside the server, through PL/Python's SPI.

What `topk.private_top_k(...)` (frontends/sql_function.py) reads. The table was prepared in
live mode (adapters/postgres/live/: a B-tree on (score DESC, id), the position table
`<table>_topk_pos` kept dense by triggers) and registered; this adapter reads those same
structures with SQL run by the server process itself (`plpy.execute`, no network round trip).
Every read is counted by CountedAccess like any store's (`round_trips` counts SPI queries).

Snapshot: the SQL function is STABLE, so PostgreSQL runs every SPI query of the call in the
snapshot of the calling statement (no new snapshot per query, as a VOLATILE function would take):
one snapshot for the whole run (DESIGN invariant 4), whatever the caller's isolation level.

Sorted access is keyset pagination on the (score DESC, id) B-tree: the first batch is
`ORDER BY score DESC, id LIMIT n`; each next one starts after the last row served, as the union
of the rest of its tie (`score = s AND id > i`) and the lower scores (`score < s`), both index
ranges, compared in the columns' own types (a float8 parameter would hide the index). A request
at any other depth falls back to OFFSET. Random access by position goes through the position
table's primary key, by id through the id B-tree (`= ANY($1)`), one query per batch. Positions
are not ranks (a live table), so nothing is inferred from tied neighbours.

Oblivious releases (inside `oblivious_reads()`, mechanisms/oblivious.py) read as the live mode of
adapters/postgres/live/ does: the top rows from the (score DESC, id) B-tree alone, without
positions (access.SortedIds), and the rows at the drawn positions one lookup each, in a nested
loop over the sorted positions (where the ids are exactly 0..m-1, checked with m by two probes
of the id B-tree, an item's position is its id and the position table is not read); integer ids
come back packed in three bytea values, which numpy reads without a Python object per row.
The plans are pinned by the SQL functions' SET clauses (sql_function.pinned_settings(): generic
plans, no parallel workers, no hash or merge join, no bitmap or sequential scan, no sort).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from adapters._sql import plain_values, rows_from_records, scores_in_order
from topk_middleware.access import AccessError, Rows, RunTraits, StoreCosts, StoreTraits
from topk_middleware.interrupts import check as check_interrupts
from topk_middleware.mechanisms.oblivious import ObliviousCosts

INTEGER_TYPES = ("smallint", "integer", "bigint")

# What SPI reads cost inside the server (rows come back as Python dicts, a few microseconds
# each): the oblivious deadline's model (mechanisms/oblivious.py), generous on a busy server.
SPI_COSTS = StoreCosts(
    round_trip=5e-4,
    sorted_row=1e-5,
    random_batch=2e-3,
    random_row=2e-5,
    full_read_row=1e-5,
)


# What an oblivious release costs through SPI (mechanisms/oblivious.py: its deadline's model),
# measured on the test server at m = 10^5 to 10^6 under load (90th percentiles of the work).
SPI_OBLIVIOUS_COSTS = ObliviousCosts(
    fixed=5e-3,
    sorted_row=2e-6,
    random_row=6e-6,
    random_miss=1.2e-5,
    cached_rows=8e5,
    full_row=5e-6,
)
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
        self.plpy = plpy
        self.where = f"table {relation}"
        # declared by the table's registration, set before a release (sql_function.py)
        self.sensitivity: float | None = None
        self.max_items_per_client: int | None = None
        self.id_column, self.score_column = id_column, score_column
        self.trigger_prefix = trigger_prefix
        self._relation = relation
        i, s = plpy.quote_ident(id_column), plpy.quote_ident(score_column)
        collate = ' COLLATE "C"' if text_ids else ""
        key = f"b.{i}{collate}"
        select = f"SELECT p.position, b.{i} AS id, b.{s} AS raw, b.{s}::float8 AS score"
        base = f"{relation} AS b JOIN {position_table} AS p ON p.id = b.{i}"
        order = f"ORDER BY b.{s} DESC, {key}"
        self._first = select + f" FROM {base} {order} LIMIT $1"
        self._offset = select + f" FROM {base} {order} LIMIT $1 OFFSET $2"
        self._after = (
            f"SELECT * FROM (({select} FROM {base} WHERE b.{s} = $1 AND {key} > $2 "
            f"{order} LIMIT $3) UNION ALL ({select} FROM {base} WHERE b.{s} < $1 {order} "
            f"LIMIT $3)) AS page ORDER BY raw DESC, id{collate} LIMIT $3"
        )
        self._positions = (
            f"SELECT p.position, b.{i} AS id, b.{s}::float8 AS score FROM {position_table} AS p "
            f"JOIN {relation} AS b ON b.{i} = p.id WHERE p.position = ANY($1)"
        )
        self._ids = (
            f"SELECT b.{i} AS id, b.{s}::float8 AS score FROM {relation} AS b WHERE b.{i} = ANY($1)"
        )
        self._exact = (
            f"SELECT b.{i} AS id, b.{s} AS score FROM {relation} AS b WHERE b.{i} = ANY($1)"
        )
        # the noisy counts' interval (noisy_counts.py): counts of an integer type
        self.integer_scores = score_type in ("smallint", "integer", "bigint")
        self._m = (
            "SELECT (SELECT count(*) FROM pg_catalog.pg_trigger WHERE tgrelid = $1::regclass "
            "AND tgname LIKE $2 AND NOT tgisinternal) AS triggers, "
            f"(SELECT position + 1 FROM {position_table} ORDER BY position DESC LIMIT 1) AS m, "
            f"(SELECT b.{s}::float8 FROM {relation} AS b ORDER BY b.{s} DESC LIMIT 1) AS top, "
            f"(SELECT b.{s}::float8 FROM {relation} AS b ORDER BY b.{s} ASC NULLS LAST LIMIT 1) "
            "AS bottom, "
            + (
                f"(SELECT b.{i}::int8 FROM {relation} AS b ORDER BY b.{i} ASC LIMIT 1) AS low, "
                f"(SELECT b.{i}::int8 FROM {relation} AS b ORDER BY b.{i} DESC LIMIT 1) AS high"
                if id_type in INTEGER_TYPES
                else "NULL::int8 AS low, NULL::int8 AS high"
            )
        )
        # oblivious reads (module docstring): packed for integer ids
        self._integer_ids = id_type in INTEGER_TYPES
        packed = (
            "string_agg(int8send(r.rank::int8), ''::bytea) AS ranks, "
            "string_agg(int8send(r.id::int8), ''::bytea) AS ids, "
            "string_agg(float8send(r.score::float8), ''::bytea) AS scores"
        )
        columns = packed if self._integer_ids else "r.rank, r.id, r.score::float8 AS score"
        self._top_ids = (
            f"SELECT {columns} FROM (SELECT -1::int8 AS rank, b.{i} AS id, b.{s} AS score "
            f"FROM {relation} AS b {order} LIMIT $1) AS r"
        )
        self._each_position = (
            f"SELECT {columns} FROM pg_catalog.unnest($1::int8[]) AS q(p) CROSS JOIN LATERAL "
            f"(SELECT q.p AS rank, b.{i} AS id, b.{s} AS score FROM {position_table} AS p "
            f"JOIN {relation} AS b ON b.{i} = p.id WHERE p.position = q.p OFFSET 0) AS r"
        )
        # dense ids (0..m-1: an item's position is its id): the id B-tree alone
        self._each_id = (
            f"SELECT {columns} FROM pg_catalog.unnest($1::int8[]) AS q(p) CROSS JOIN LATERAL "
            f"(SELECT q.p AS rank, b.{i} AS id, b.{s} AS score FROM {relation} AS b "
            f"WHERE b.{i} = q.p OFFSET 0) AS r"
        )
        self._dense = False
        self._oblivious = False
        self._types = {"id": id_type, "score": score_type}
        self._plans: dict[str, Any] = {}
        self._m_value: int | None = None
        self._depth = 0  # the next depth keyset pagination serves
        self._last: tuple[Any, Any] | None = None  # (raw score, id) of the last row served

    def _plan(self, name: str, query: str, types: list[str]) -> Any:
        plan = self._plans.get(name)
        if plan is None:
            plan = self._plans[name] = self.plpy.prepare(query, types)
        return plan

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
        """access.ObliviousReads: the reads of the module docstring's last paragraph."""
        saved, self._oblivious = self._oblivious, True
        try:
            yield
        finally:
            self._oblivious = saved

    def _rows(self, result: Any) -> Rows:
        """Rows of an oblivious read: unpacked (integer ids) or one record per row."""
        if self._integer_ids:
            row = result[0] if len(result) else None
            if row is None or row["ranks"] is None:
                return rows_from_records([])
            return Rows(
                np.frombuffer(row["ranks"], ">i8").astype(np.int64),
                np.frombuffer(row["ids"], ">i8").astype(np.int64),
                np.frombuffer(row["scores"], ">f8").astype(np.float64),
            )
        records = []
        for number, r in enumerate(result):
            if number % 4096 == 0:
                check_interrupts()
            records.append((r["rank"], r["id"], r["score"]))
        return rows_from_records(records)

    def read_sorted_ids(self, count: int) -> Rows:
        """access.SortedIds: the top `count` rows' ids and scores (positions -1), in oblivious
        reads; read_sorted's rows otherwise."""
        if not self._oblivious:
            return self.read_sorted(0, count)
        count = min(int(count), self.domain_size())
        return self._rows(
            self.plpy.execute(self._plan("top_ids", self._top_ids, ["bigint"]), [count])
        )

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
        plan = self._plan("m", self._m, ["text", "text"])
        row = self.plpy.execute(plan, [self._relation, self.trigger_prefix + "%"])[0]
        if row["triggers"] != 3:
            raise ValueError(
                f"{self.where} has lost the triggers of its position table: prepare it again in "
                "live mode and register it again (topk-middleware install-sql --source)"
            )
        if row["m"] is None:
            raise ValueError(f"{self.where} is empty: there is no item to select")
        column = f"{self.where} column {self.score_column!r}"
        if row["top"] is None:
            raise ValueError(f"{column} has NULL score(s)")
        if not np.isfinite(row["top"]):
            raise ValueError(f"{column} has non-finite score(s) (NaN or infinite)")
        if row["bottom"] < 0:
            raise ValueError(f"{column} has negative score(s), e.g. {row['bottom']!r}")
        self._m_value = int(row["m"])
        # m distinct integer ids (a unique B-tree) from 0 to m - 1 are exactly 0..m-1
        self._dense = row["low"] == 0 and row["high"] == self._m_value - 1
        return self._m_value

    def read_sorted(self, start: int, count: int) -> Rows:
        m = self.domain_size()
        start, stop = int(start), min(int(start) + int(count), m)
        if stop <= start:
            return rows_from_records([])
        n = stop - start
        if start == 0:
            result = self.plpy.execute(self._plan("first", self._first, ["bigint"]), [n])
        elif start == self._depth and self._last is not None:
            types = [self._types["score"], self._types["id"], "bigint"]
            result = self.plpy.execute(self._plan("after", self._after, types), [*self._last, n])
        else:
            plan = self._plan("offset", self._offset, ["bigint", "bigint"])
            result = self.plpy.execute(plan, [n, start])
        if len(result):
            last = result[len(result) - 1]
            self._last, self._depth = (last["raw"], last["id"]), start + len(result)
        return self._records(result, by_id=self._oblivious and self._dense)

    def _records(self, result: Any, by_id: bool = False) -> Rows:
        """(position, id, score) rows of a result, checking interrupts every 4,096 rows;
        `by_id`: an oblivious run over dense ids, whose positions are the ids."""
        records = []
        key = "id" if by_id else "position"
        for number, r in enumerate(result):
            if number % 4096 == 0:
                check_interrupts()
            records.append((r[key], r["id"], r["score"]))
        return rows_from_records(records)

    def read_positions(self, positions: np.ndarray) -> Rows:
        if self._oblivious and len(positions):
            wanted = np.unique(np.asarray(positions, dtype=np.int64))
            if self._dense:  # an item's position is its id (domain_size)
                plan = self._plan("each_id", self._each_id, ["bigint[]"])
            else:
                plan = self._plan("each_position", self._each_position, ["bigint[]"])
            rows = self._rows(self.plpy.execute(plan, [wanted.tolist()]))
            if len(rows) != len(wanted) or not np.array_equal(rows.positions, wanted):
                raise AccessError(f"{self.where}: a position has no row (prepare it again)")
            return rows
        wanted = plain_values(np.asarray(positions, dtype=np.int64))
        if not wanted:
            return rows_from_records([])
        plan = self._plan("positions", self._positions, ["bigint[]"])
        return self._records(self.plpy.execute(plan, [wanted]))

    def read_ids(self, ids: Sequence[Any]) -> np.ndarray:
        wanted = plain_values(ids)
        if not wanted:
            return np.empty(0, dtype=np.float64)
        plan = self._plan("ids", self._ids, [self._types["id"] + "[]"])
        found = {r["id"]: r["score"] for r in self.plpy.execute(plan, [wanted])}
        return scores_in_order(found, wanted, self.where)

    def read_exact_scores(self, ids: Sequence[Any]) -> list[Any]:
        """ExactScores: the scores in the table's own type (bigint as Python ints, numeric as
        Decimals: PL/Python's conversions)."""
        wanted = plain_values(ids)
        if not wanted:
            return []
        plan = self._plan("exact", self._exact, [self._types["id"] + "[]"])
        found = {r["id"]: r["score"] for r in self.plpy.execute(plan, [wanted])}
        try:
            return [found[item] for item in wanted]
        except KeyError as missing:
            raise AccessError(f"{self.where} has no item with id {missing.args[0]!r}") from None

    def score_run_count(self) -> int | None:
        return None

    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        raise AccessError("a live table keeps no runs of tied scores")
