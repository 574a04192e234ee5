"""SQLAlchemyTable (copy mode) reading the counts table itself: a run whose copy is not proven
current and that is cheaper than a refresh of the copy (docs/freshness.md).

As on the SQL store engine (adapters/sql/table_read.py, where PostgreSQL's copies are), the
release is the one-shot mechanism (Wu, Ohrimenko, Wirth 2023, Algorithm 2) run in the database
on the table with keyed noise (topk_middleware/keyed_noise.py), each row's position a slot that
is fixed within the run's snapshot: DuckDB's rowid.
Slots without a row are positions without an item, which never win; the law is the one-shot's.
Steps:

1. the run's first query over the table: m, the largest score and the checks of `_validate`
   (NULL ids and scores, negative, NaN or infinite scores; ids counted distinct unless a
   primary key or unique constraint or index on the id guarantees them, or the table is large:
   then the rows read are checked), and the slots;
2. the exceedances' rows (by position) and the k rows of the top scores (through the index on
   (score DESC, id) that prepare() puts on the table), their noise computed here, the k-th
   largest noisy score T;
3. one range read of the rows with score >= T - bound computing the keyed noise in the
   database, best k of both.

A table without positions (a view; any other dialect) is read in full in canonical order (the
one-shot over a full read). Sorted and random reads by rank on the table (an explicit threshold
run) are ORDER BY .. LIMIT OFFSET and a row_number() window.

`TableRun` is a mixin of SQLAlchemyTable: it uses `engine`, `dialect`, `_source`, `_from`, `_id`,
`_score`, `_id_key`, `where`, `id_column`, `score_column`, `_not_finite`, `_chunks`, `_rows`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from adapters._sql import (
    TableFacts,
    id_array,
    raise_if_invalid,
)
from topk_middleware.access import AccessError, Rows, StoreCosts
from topk_middleware.keyed_noise import KeyedNoise, capped_sql, uniform_from_hex_sql

from .keyed import _EXCEEDANCES, _KEYED_DIGITS

REFRESH_TRIES = 3  # copy mode, not frozen: refreshes of a changing copy before a run gives up
# Ids are counted distinct on tables of at most this many rows without a unique key.
DISTINCT_CHECK_MAX = 100_000
SCAN_ROW = 1e-7  # a pass over the table, per row (SQLite, the slowest of the four, ~1e-7 s)
REBUILD_ROW = 4e-6  # prepare(refresh=True) at 10^5 rows: 0.14-0.6 s (benchmarks/freshness_copy)
HASH_ROW = 1e-6  # the keyed hash per row (SQLite: a Python function)


def table_costs(m: int, in_store: bool) -> StoreCosts:
    """What reads of the table cost the planner in a table run (module docstring)."""
    return StoreCosts(
        round_trip=5e-4 + SCAN_ROW * m,
        sorted_row=1e-6,
        random_batch=1e-2,
        random_row=1e-6,
        random_batch_item=1e-6,
        oneshot_row=HASH_ROW,
        full_read_row=2e-6,
        oneshot_fixed=(2e-3 + SCAN_ROW * m) if in_store else None,
        sorted_scans=True,
    )


def refresh_seconds(m: int) -> float:
    return 5e-3 + REBUILD_ROW * m


def table_seconds(m: int, in_store: bool) -> float:
    return 2e-3 + 2 * SCAN_ROW * m + (0 if in_store else 2e-6 * m)


@dataclass
class TableState:
    """What a table run knows after its first query."""

    m: int
    max_score: float
    slots: int = 0  # 0: no positions (no in-store one-shot)
    unique_ids: bool = True
    whole_scores: bool = False
    report: dict[str, Any] = field(default_factory=dict)


class TableRun:
    """The reads of a SQLAlchemyTable run on the counts table itself (module docstring)."""

    engine: Engine
    dialect: str
    _source: sa.Table | None
    _from: sa.FromClause
    _id: Any
    _score: Any
    where: str
    id_column: str
    score_column: str
    _table: TableState | None = None
    _m: int | None
    _run_count: int | None
    _oblivious: bool
    _conn: Connection | None
    last_freshness: dict[str, Any] | None
    mode_classes: dict[str, type]

    # ----- the run's first query --------------------------------------------------------------
    def _unique_ids(self, conn: Connection) -> bool:
        """Whether a primary key, unique constraint or unique index has the id column alone."""
        assert self._source is not None
        name, schema, wanted = self._source.name, self._source.schema, [self.id_column]
        if self.dialect == "duckdb":  # duckdb-engine's inspector has no constraints
            found = conn.execute(
                sa.text(
                    "SELECT constraint_column_names FROM duckdb_constraints() WHERE "
                    "database_name = current_database() AND schema_name = coalesce(:s, "
                    "current_schema()) AND table_name = :n AND constraint_type IN "
                    "('PRIMARY KEY', 'UNIQUE')"
                ),
                {"s": schema, "n": name},
            ).scalars()
            return any(list(names) == wanted for names in found)
        inspector = sa.inspect(conn)
        if inspector.get_pk_constraint(name, schema=schema).get("constrained_columns") == wanted:
            return True
        try:
            uniques = inspector.get_unique_constraints(name, schema=schema)
        except NotImplementedError:
            uniques = []
        if any(u["column_names"] == wanted for u in uniques):
            return True
        indexes = inspector.get_indexes(name, schema=schema)
        return any(ix.get("unique") and ix["column_names"] == wanted for ix in indexes)

    def _slots_sql(self, conn: Connection) -> list[Any]:
        """Columns of the first query that give the slots, per dialect; [] without positions."""
        assert self._source is not None
        preparer = self.engine.dialect.identifier_preparer
        if self.dialect == "duckdb":
            kind = conn.execute(
                sa.text(
                    "SELECT count(*) FROM duckdb_tables() WHERE database_name = "
                    "current_database() AND schema_name = coalesce(:s, current_schema()) "
                    "AND table_name = :n"
                ),
                {"s": self._source.schema, "n": self._source.name},
            ).scalar()
            if not kind:
                return []
            rowid = sa.literal_column(f"{preparer.format_table(self._source)}.rowid")
            return [sa.func.min(rowid), sa.func.max(rowid)]
        return []

    def _open_table_run(self, conn: Connection, report: dict[str, Any]) -> int:
        """The table run's first query (module docstring, step 1); returns m."""
        score, id_ = self._score, self._id
        zero_one = lambda cond: sa.func.sum(sa.case((cond, 1), else_=0))  # noqa: E731
        columns: list[Any] = [
            sa.func.count(),
            sa.func.count(id_),
            sa.func.count(score),
            sa.func.min(score),
            sa.func.max(score),
        ]
        not_finite = self._not_finite()  # type: ignore[attr-defined]
        columns.append(zero_one(not_finite) if not_finite is not None else sa.null())
        unique = self._unique_ids(conn)
        estimate = getattr(self, "_m", None) or 0
        distinct = not unique and estimate <= DISTINCT_CHECK_MAX
        key = self._id_key(id_)  # type: ignore[attr-defined]
        columns.append(sa.func.count(sa.distinct(key)) if distinct else sa.null())
        slots = self._slots_sql(conn)
        columns.extend(slots)
        row = conn.execute(sa.select(*columns).select_from(self._from)).one()
        m, ids, scores, low, high, bad, distinct_ids = row[:7]
        m = int(m)
        if m == 0:
            raise ValueError(f"{self.where} is empty: there is no item to select")
        negative = 0
        if low is not None and float(low) < 0:
            negative = conn.execute(
                sa.select(sa.func.count()).select_from(self._from).where(score < 0)
            ).scalar_one()
        facts = TableFacts(m, m - int(ids), m, m - int(scores), int(bad or 0), int(negative))
        raise_if_invalid(facts, self.where, self.id_column, self.score_column)
        if distinct and int(distinct_ids) != m:
            self._refuse_duplicate_ids(conn, m, int(distinct_ids))
        state = TableState(m, float(high), unique_ids=unique or distinct, report=report)
        state.whole_scores = isinstance(score.type, sa.Integer)
        if slots:
            state.slots = int(row[8]) + 1  # row ids from 0
        self._table = state
        return m

    def _refuse_duplicate_ids(self, conn: Connection, m: int, distinct: int) -> None:
        key = self._id_key(self._id)  # type: ignore[attr-defined]
        duplicate = conn.execute(
            sa.select(sa.func.min(self._id))
            .select_from(self._from)
            .group_by(key)
            .having(sa.func.count() > 1)
            .limit(1)
        ).scalar()
        facts = TableFacts(m, 0, distinct, 0, 0, 0)
        raise_if_invalid(facts, self.where, self.id_column, self.score_column, duplicate)

    # ----- the stale copy: read the table, or refresh ----------------------------------------
    def _current_copy(
        self, conn: Connection, transaction: sa.RootTransaction
    ) -> sa.RootTransaction:
        """Copy mode, not frozen: use the copy only where the run's first query proved it current
        (triggers, freshness.py; DuckDB: the copy compared with the table, one join). Otherwise
        the run reads the table itself in its snapshot (table_read.py), or, where that is priced
        dearer than a refresh of the copy plus a run on it, or the run is oblivious (its reads
        must not depend on the data; a refresh's shape depends on m and on whether the table
        was written, which the database's statistics show anyway), the copy is refreshed
        (prepare(refresh=True), outside the snapshot) and the run opens again, at most
        REFRESH_TRIES times."""
        frozen = getattr(self, "frozen", False)  # from_votes() builds without __init__
        if frozen or isinstance(self, tuple(self.mode_classes.values())):
            self.last_freshness = {"copy": "frozen"} if frozen else None
            return transaction
        for attempt in range(REFRESH_TRIES + 1):
            why = getattr(self, "_why", "unproven")
            if why == "unproven":
                why = "written" if self._copy_differs(conn) else None
            report: dict[str, Any] = {"refreshes": attempt}
            if why is None:
                self.last_freshness = report | {"copy": "current", "proof": "compared"}
                return transaction
            report |= {"copy": "stale", "why": why}
            m = self._m or 0
            in_store = self._in_store_dialect()
            table, rebuild = table_seconds(m, in_store), refresh_seconds(m)
            report |= {"table_seconds": table, "refresh_seconds": rebuild}
            # counts from votes have no table of their own to read: their copy is rebuilt
            votes = self._source is None
            refresh = self._oblivious or votes or (rebuild < table and attempt == 0)
            if not refresh or attempt == REFRESH_TRIES:
                if self._oblivious or votes:
                    self._end(conn, transaction)
                    raise RuntimeError(
                        f"{self.where} kept changing while its copy was refreshed "
                        f"({REFRESH_TRIES} times): try again"
                        + ("" if votes else ", or use mode='live'")
                    )
                report["read"] = "table"
                self._m = self._open_table_run(conn, report)
                self._run_count = None
                self.last_freshness = report
                return transaction
            self._end(conn, transaction)
            self._close_run()
            self.prepare(refresh=True)
            transaction = self._begin(conn)
            transaction = self._open_run(conn, transaction)
        raise AssertionError("unreachable")  # pragma: no cover

    def _in_store_dialect(self) -> bool:
        """Whether this dialect runs the in-store one-shot (not MariaDB / MySQL)."""
        return self.dialect in _EXCEEDANCES

    def run_freshness(self) -> dict[str, Any] | None:
        """How the run in progress knew its data current (access.run_freshness): operator
        diagnostics, result.diagnostics.plan["freshness"]."""
        if self._conn is None:
            return None
        report = dict(self.last_freshness or {})
        if self._table is not None:
            report |= self._table.report
        return report

    @property
    def store_costs(self) -> StoreCosts | None:  # type: ignore[override]
        """In a run that reads the table, the table's costs (every sorted read a sort or an
        index walk, each batch of reads by rank a window over the table)."""
        if self._table is None:
            return None
        return table_costs(self._table.m, self._in_store_dialect() and self._table.slots > 0)

    def oneshot_positions(self) -> int:
        """Positions of the in-store one-shot: the table's slots in a table run, else m."""
        if self._table is not None and self._table.slots:
            return self._table.slots
        return self.domain_size()

    # ----- reads by rank on the table (an explicit threshold run, a full read) ----------------
    def _order(self) -> list[Any]:
        return [self._score.desc(), self._id_key(self._id)]  # type: ignore[attr-defined]

    def _table_sorted(self, conn: Connection, start: int, count: int) -> Rows:
        query = (
            sa.select(self._id, self._score)
            .select_from(self._from)
            .order_by(*self._order())
            .limit(int(count))
            .offset(int(start))
        )
        records = conn.execute(query).all()
        ranked = [(start + i, rec[0], rec[1]) for i, rec in enumerate(records)]
        return self._rows(ranked, round_trips=1)  # type: ignore[attr-defined]

    def _table_positions(self, conn: Connection, ranks: Sequence[int]) -> Rows:
        rank = (sa.func.row_number().over(order_by=self._order()) - 1).label("rank")
        ordered = (
            sa.select(rank, self._id.label("id"), self._score.label("score"))
            .select_from(self._from)
            .subquery("ordered")
        )
        wanted = sorted(set(int(r) for r in ranks))
        records: list[Any] = []
        chunks = 0
        for chunk in self._chunks(wanted):  # type: ignore[attr-defined]
            query = sa.select(ordered.c.rank, ordered.c.id, ordered.c.score).where(
                ordered.c.rank.in_(chunk)
            )
            records.extend(conn.execute(query).all())
            chunks += 1
        by_rank = {int(rec[0]): rec for rec in records}
        try:
            rows = [by_rank[int(r)] for r in ranks]
        except KeyError as missing:
            raise AccessError(f"rank {missing.args[0]} is not in {self.where}") from None
        return self._rows(rows, round_trips=chunks)  # type: ignore[attr-defined]

    def _table_ids(self, conn: Connection, wanted: list[Any]) -> dict[Any, float]:
        query = sa.select(self._id, self._score).where(
            self._id.in_(sa.bindparam("ids", expanding=True))
        )
        found: dict[Any, float] = {}
        for chunk in self._chunks(list(dict.fromkeys(wanted))):  # type: ignore[attr-defined]
            for item, score in conn.execute(query.select_from(self._from), {"ids": chunk}):
                found[item] = float(score)
        return found

    # ----- the one-shot on the table ----------------------------------------------------------
    def _table_oneshot(self, conn: Connection, noise: KeyedNoise, k: int) -> Rows:
        """Algorithm 2 with keyed noise on the table (module docstring, steps 2-3)."""
        state = self._table
        assert state is not None and state.slots > 0
        preparer = self.engine.dialect.identifier_preparer
        assert self._source is not None
        table = preparer.format_table(self._source)
        q = preparer.quote
        ident, score = q(self.id_column), q(self.score_column)
        pos = "t.rowid"
        params: dict[str, Any] = {"k": int(k), "rowids": noise.exceed_positions.tolist()}
        condition = "t.rowid IN (SELECT unnest(CAST(:rowids AS BIGINT[])))"
        known_sql = (
            f"SELECT {pos} AS pos, t.{ident} AS id, t.{score} AS score FROM {table} t "
            f"WHERE {condition} UNION ALL SELECT * FROM (SELECT {pos} AS pos, t.{ident} AS id, "
            f"t.{score} AS score FROM {table} t ORDER BY t.{score} DESC LIMIT :k) AS top"
        )
        records = conn.execute(sa.text(known_sql), params).all()
        positions = np.array([int(r[0]) for r in records], dtype=np.int64)
        positions, first = np.unique(positions, return_index=True)
        ids = [records[i][1] for i in first]
        scores = np.array([float(records[i][2]) for i in first], dtype=np.float64)
        capped = noise.capped(scores)  # min(score, B) + noise (privacy.score_bound)
        noisy = capped + noise.noises(positions) if len(positions) else capped
        t_known = float(np.sort(noisy)[-k]) if len(noisy) >= k else -math.inf
        cut = t_known - noise.bound - 1e-12 * abs(t_known) if math.isfinite(t_known) else -math.inf
        rest = self._range_read(conn, state, noise, k, cut, table, ident, score, pos)
        all_pos = np.concatenate([positions, np.array([int(r[0]) for r in rest], np.int64)])
        all_ids = [*ids, *(r[1] for r in rest)]
        all_scores = np.concatenate([scores, [float(r[2]) for r in rest]])
        all_noisy = np.concatenate([noisy, [float(r[3]) for r in rest]])
        all_pos, first = np.unique(all_pos, return_index=True)
        all_ids = [all_ids[i] for i in first]
        all_scores, all_noisy = all_scores[first], all_noisy[first]
        if not state.unique_ids and len(set(all_ids)) != len(all_ids):
            seen: set[Any] = set()
            duplicate = next(i for i in all_ids if i in seen or seen.add(i))
            facts = TableFacts(len(all_ids), 0, len(set(all_ids)), 0, 0, 0)
            raise_if_invalid(facts, self.where, self.id_column, self.score_column, duplicate)
        best = np.lexsort((all_pos, -all_noisy))[:k]
        return Rows(
            np.arange(len(best), dtype=np.int64),
            id_array([all_ids[i] for i in best]),
            all_scores[best],
        )

    def _range_read(
        self,
        conn: Connection,
        state: TableState,
        noise: KeyedNoise,
        k: int,
        cut: float,
        table: str,
        ident: str,
        score: str,
        pos: str,
    ) -> list[Any]:
        """The k best rows by score + keyed noise among those with score >= `cut` outside the
        exceedances, computed in the database: (position, id, score, noisy score)."""
        params: dict[str, Any] = {
            "k": int(k),
            "positions": noise.exceed_positions.tolist(),
            "key": noise.key,
        }
        keyed = noise.sql(uniform_from_hex_sql(_KEYED_DIGITS["duckdb"].format(rank="r.pos")))
        where = ""
        if math.isfinite(cut):
            params["cut"] = math.ceil(cut) if state.whole_scores else float(cut)
            where = f" WHERE t.{score} >= :cut"
        query = (
            f"SELECT r.pos, r.id, r.score, {capped_sql('r.score', noise.score_cap)} + {keyed} "
            f"AS v FROM (SELECT {pos} AS pos, "
            f"t.{ident} AS id, t.{score} AS score FROM {table} t{where}) AS r "
            "WHERE r.pos NOT IN (SELECT unnest(CAST(:positions AS BIGINT[]))) "
            "ORDER BY v DESC, r.pos LIMIT :k"
        )
        return list(conn.execute(sa.text(query), params).all())
