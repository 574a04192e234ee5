"""SQLAlchemyTable(..., mode="live"): a run reads the counts table as it is now, no copy.

On dialects whose B-tree indexes serve ORDER BY (PostgreSQL, MariaDB >= 10.8 / MySQL >= 8,
SQLite), the canonical order (score descending, ties by id ascending, text ids in byte order) is
read straight from the user's table through an index on (score DESC, id), so writes to the counts
are seen by the next run without any rebuild. What uniform item sampling needs (Algorithm 3 of
Wu, Ohrimenko, Wirth, ICML 2023, samples a uniformly random unseen item) is a dense *position*
0..m-1 per item (topk_middleware/access.py): a *position table* keeps it.

`prepare()` (once, never again after writes) validates the table and creates:

* on the user's table, a B-tree on (score DESC, id) with the id in byte order (PostgreSQL
  `COLLATE "C"`, SQLite `COLLATE BINARY`; on MariaDB the id column must already be in a binary
  NO PAD collation), built `CONCURRENTLY` on PostgreSQL (writers are never blocked), and a unique
  index on id unless one exists;
* the position table `<table>_topk_pos` (position BIGINT PRIMARY KEY, id UNIQUE), filled with
  positions 0..m-1 in id order, and a one-row count table `<table>_topk_pos_n` (n = m);
* triggers on the user's table that keep both current: AFTER INSERT the new id takes position n;
  AFTER DELETE the item at the last position n - 1 takes the deleted item's position (swap-remove);
  an UPDATE that changes the id is a delete and an insert; an UPDATE of the score needs nothing
  (PostgreSQL: statement triggers over the transition tables, and TRUNCATE empties both tables).

Cost of the scheme: O(1) index operations per inserted or deleted item (O(d log d) per statement
of d items on PostgreSQL), nothing per changed score. Concurrent item inserts and deletes are
serialized by the row lock on the count row, taken first by every trigger (`UPDATE` or `SELECT
... FOR UPDATE`; SQLite has one writer at a time). A PostgreSQL writer in REPEATABLE READ or
SERIALIZABLE whose insert or delete of items races another gets a serialization error (retry it);
positions never go wrong. The triggers run with the writer's privileges: writers of the table need
INSERT, UPDATE and DELETE on the position and count tables too. Filling the position table and
installing the triggers happen while writers wait (PostgreSQL SHARE ROW EXCLUSIVE lock; MariaDB LOCK
TABLES ... WRITE, which CREATE TRIGGER needs, so readers wait too; SQLite one write transaction):
one pass over the ids.

Each run reads in one snapshot (PostgreSQL REPEATABLE READ READ ONLY; MariaDB START TRANSACTION
WITH CONSISTENT SNAPSHOT, READ ONLY; SQLite one read transaction): m = max(position) + 1, one probe
of the position primary key, checked against the count row. Sorted access from depth 0, and from
where the previous read of the snapshot stopped, is keyset pagination on the index: the rows tied
with the last (score, id) after its id, then the rows of lower score, each branch an index range
with a LIMIT; any other start falls back to OFFSET. Each row of a page finds its position by one
probe of the position table's id index. Random access by position goes position table -> user
table by id (one probe of the id index per row), one query per batch; random access by id is
`id IN (...)` on the unique index. (A batch of more than m / PROBE_FRACTION rows, i.e. a full
read, joins the two tables instead: planners hash-join large batches, and probes would lose.)
Zero-vote items are rows with score 0: they count in m and come last in sorted access.

Positions are not ranks (`positions_are_ranks = False`), so the core infers no scores from the
sorted order and no runs of tied scores are kept. Scores are validated by `prepare()` once; a run
then checks every score it reads and raises AccessError on a NULL, NaN or negative one. Writes
that bypass row triggers leave the position table behind: on MariaDB / MySQL a TRUNCATE
(which re-creates the table: its identity, kept in the count row, changes) or a write the
triggers found an id already placed for is seen by the next run, which rebuilds the positions
first (under the tables' WRITE locks); elsewhere (SQLite REPLACE without recursive_triggers)
runs fail with AccessError until `prepare()` runs again.

Each dialect's part (the position id's type and collation, the triggers, how a list is bound, how
a plan is read) is adapters/dialects/live.py's LiveSQL of the engine's dialect; this class keeps
what they share.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from adapters._sql import AccessCheck, AccessPath, plain_values
from adapters.dialects.live import LIVE_DIALECTS
from topk_middleware.access import AccessError, Rows, RunTraits, ScoreBins

from .live_base import LiveBase
from .table import MAX_NAME_BYTES, SQLAlchemyTable, _digest, _fit, engine_of

__all__ = ["LIVE_DIALECTS", "SQLAlchemyLiveTable"]

# A batch of up to m / PROBE_FRACTION rows finds positions (sorted access) or scores (random
# access) by one index probe per row; a larger one (a full read) by a join.
PROBE_FRACTION = 16


def _named(table: str, suffix: str) -> str:
    """`<table><suffix>`, or, past MAX_NAME_BYTES, the table name cut short with a hash."""
    name = table + suffix
    if len(name.encode("utf-8")) <= MAX_NAME_BYTES:
        return name
    return _fit(table, f"_{_digest(table)}{suffix}")


class SQLAlchemyLiveTable(LiveBase):
    """A histogram in a live table: `SQLAlchemyTable(engine, table, id=..., score=...,
    mode="live")` builds one. Call `prepare()` once; runs then see every committed write."""

    positions_are_ranks = False
    # No in-store one-shot: its keyed noise names items by rank, which a live table does not
    # keep (None takes the method away, so it is not an InStoreOneShot and the planner knows).
    read_oneshot = None  # type: ignore[assignment]

    def run_traits(self) -> RunTraits:
        """access.RunTraits: positions from the position table, not ranks."""
        return RunTraits(positions_are_ranks=False, costs=self.store_costs)

    def __init__(
        self,
        engine: Engine,
        table: str | sa.Table,
        id: str = "id",
        score: str = "score",
        *,
        mode: str = "live",
        **options: Any,
    ) -> None:
        if mode != "live":
            raise ValueError(f"SQLAlchemyLiveTable serves mode='live' only, got mode={mode!r}")
        super().__init__(engine_of(engine), table, id, score, **options)  # refuses a dialect
        self._live.check_server(self)
        assert self._source is not None and self.table_name is not None
        source = self._source
        self._id_column = source.c[id]
        self._score_column = source.c[score]
        id_type = self._live.position_id_type(self, source.c[id].type)
        digest = _digest(source.schema, self.table_name, id)
        self.position_table_name = _named(self.table_name, "_topk_pos")
        self.count_table_name = _named(self.table_name, "_topk_pos_n")
        metadata = sa.MetaData()
        self._pos = sa.Table(
            self.position_table_name,
            metadata,
            sa.Column("position", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("id", id_type, nullable=False, unique=True),
            schema=source.schema,
        )
        # n: the number of positions; hole: scratch for SQLite's triggers, which have no variables.
        self._count = sa.Table(
            self.count_table_name,
            metadata,
            sa.Column("n", sa.BigInteger, nullable=False),
            sa.Column("hole", sa.BigInteger, nullable=True),
            schema=source.schema,
        )
        self._order_index_name = _fit("ix", f"_topk_{digest}_live_order")
        self._id_index_name = _fit("ux", f"_topk_{digest}_live_id")
        self._trigger_prefix = _fit("topk", f"_{digest}_pos")
        # Within a snapshot: (next depth, last score, last id) of the previous sorted read.
        self._cursor: tuple[int, Any, Any] | None = None

    # ----- keys: how ids are compared and ordered ------------------------------------------
    def _index_key(self) -> Any:
        """The id in byte order, as indexed and ordered (a binary collation on MariaDB)."""
        return self._live.order_key(self, self._id_column)

    def _match_key(self, column: Any) -> Any:
        """The id as matched for equality, so that the unique index on id serves the lookup:
        PostgreSQL's deterministic collations and MariaDB's binary one compare bytes already."""
        return self._live.match_key(self, column)

    # ----- prepare --------------------------------------------------------------------------
    def prepare(self, *, index_source: bool = True) -> None:
        """Validate the table, create the indexes on it, and (re)build the position table and the
        triggers that keep it current (module docstring). Needed once; writes afterwards need
        nothing. Raises ValueError naming the table and column for invalid counts."""
        if self._conn is not None:
            raise RuntimeError("prepare() cannot run inside snapshot() of the same table")
        if not index_source:
            raise ValueError("mode='live' reads through indexes on the table: index_source=False")
        inspector = sa.inspect(self.engine)
        if self.table_name in inspector.get_view_names(schema=self._pos.schema):
            raise ValueError(f"mode='live' needs a table, and {self.where} is a view")
        with self.engine.begin() as conn:
            self._validate(conn)
        self._create_indexes()
        self._live.install(self)
        if self._live.analyzes(self):
            with self.engine.begin() as conn:
                for table in (self._source, self._pos):
                    assert table is not None
                    conn.exec_driver_sql(f"ANALYZE {self._quoted(table)}")

    def _schema_prefix(self) -> str:
        """`<schema>.` (quoted) for the objects prepare() names, "" without a schema."""
        schema = self._pos.schema
        preparer = self.engine.dialect.identifier_preparer
        return "" if schema is None else f"{preparer.quote_schema(schema)}."

    def _quoted(self, table: sa.Table, qualified: bool = True) -> str:
        preparer = self.engine.dialect.identifier_preparer
        return preparer.format_table(table) if qualified else preparer.quote(table.name)

    def _has_unique_id(self) -> bool:
        """Whether a primary key, unique constraint or unique index on the id alone exists (for
        SQLite text ids only ours counts: it must compare in BINARY collation)."""
        inspector = sa.inspect(self.engine)
        name, schema, wanted = self.table_name, self._pos.schema, [self.id_column]
        indexes = inspector.get_indexes(name, schema=schema)
        if any(ix["name"] == self._id_index_name for ix in indexes):
            return True
        if self._live.unique_id_is_ours(self):
            return False
        if inspector.get_pk_constraint(name, schema=schema).get("constrained_columns") == wanted:
            return True
        if any(u["column_names"] == wanted for u in inspector.get_unique_constraints(name, schema)):
            return True
        return any(ix.get("unique") and ix["column_names"] == wanted for ix in indexes)

    def _create_indexes(self) -> None:
        """The B-tree on (score DESC, id in byte order), and a unique index on id if none; on
        PostgreSQL built CONCURRENTLY (an invalid leftover of a failed build is dropped first)."""
        concurrently = {"postgresql_concurrently": True}
        order = sa.Index(
            self._order_index_name, self._score_column.desc(), self._index_key(), **concurrently
        )
        wanted = [order]
        if not self._has_unique_id():
            key = self._live.id_index_key(self)
            wanted.append(sa.Index(self._id_index_name, key, unique=True, **concurrently))
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            for index in wanted:
                self._live.before_index(conn, self, index.name)
                index.create(conn, checkfirst=True)

    def _create_position_tables(self, conn: Connection) -> None:
        """Create the position and count tables where missing (an existing table of the same name
        must have their columns)."""
        inspector = sa.inspect(conn)
        for table in (self._pos, self._count):
            if not inspector.has_table(table.name, schema=table.schema):
                table.create(conn)
                continue
            have = {c["name"] for c in inspector.get_columns(table.name, schema=table.schema)}
            if have != set(table.c.keys()):
                raise ValueError(
                    f"table {table.name!r} exists with columns {sorted(have)}, not "
                    f"({', '.join(table.c.keys())}): drop it to let prepare() build it"
                )

    def _fill_positions(self, conn: Connection) -> None:
        """Positions 0..m-1 in id order, and the count row."""
        conn.execute(sa.delete(self._pos))
        conn.execute(sa.delete(self._count))
        position = sa.func.row_number().over(order_by=self._index_key()) - 1
        conn.execute(
            sa.insert(self._pos).from_select(
                ["position", "id"],
                sa.select(position, self._id_column).select_from(self._source),
            )
        )
        mark = self._live.count_mark(self)
        conn.execute(
            sa.insert(self._count).from_select(
                ["n", "hole"], sa.select(sa.func.count(), mark).select_from(self._pos)
            )
        )

    def _names(self, qualified: bool = True) -> dict[str, str]:
        """Quoted names for the trigger bodies."""
        preparer = self.engine.dialect.identifier_preparer
        assert self._source is not None
        return {
            "table": self._quoted(self._source, qualified),
            "pos": self._quoted(self._pos, qualified),
            "count": self._quoted(self._count, qualified),
            "id": preparer.quote(self.id_column),
            "position": preparer.quote("position"),
        }

    def _trigger(self, event: str) -> str:
        preparer = self.engine.dialect.identifier_preparer
        return preparer.quote(f"{self._trigger_prefix}_{event}")

    def uninstall(self) -> None:
        """Drop everything prepare() installed: the triggers (and PostgreSQL's trigger
        function), the position table and the count table in one transaction, then the index
        on (score DESC, id) and the unique index on id if prepare() made it (PostgreSQL: DROP
        INDEX CONCURRENTLY). The table and its rows are not touched; an index it had before is
        kept. Idempotent; runs fail afterwards until prepare() runs again."""
        with self.engine.begin() as conn:
            self._live.drop_triggers(conn, self)
            for table in (self._pos, self._count):
                table.drop(conn, checkfirst=True)
        self._drop_indexes()

    def _drop_indexes(self) -> None:
        """The indexes _create_indexes() made on the table, where they exist."""
        if self._source is None or not sa.inspect(self.engine).has_table(
            self.table_name, schema=self._pos.schema
        ):
            return
        concurrently = {"postgresql_concurrently": True}
        made = [
            sa.Index(self._order_index_name, self._score_column, **concurrently),
            sa.Index(self._id_index_name, self._id_column, **concurrently),
        ]
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            existing = {
                i["name"]
                for i in sa.inspect(conn).get_indexes(self.table_name, schema=self._pos.schema)
            }
            for index in made:
                if index.name in existing:
                    index.drop(conn)

    # ----- what a run reads -----------------------------------------------------------------
    def is_stale(self) -> bool:
        """Never: a live run reads the table as it is."""
        return False

    def score_run_count(self) -> int | None:
        """None: positions are not ranks, so runs of tied scores are not kept."""
        return None

    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        raise AccessError("mode='live' keeps no runs of tied scores (positions are not ranks)")

    def read_score_histogram(self, bins: ScoreBins) -> tuple[np.ndarray, np.ndarray] | None:
        """access.ScoreHistogramRead: the scores of the table at or below `bins.top`, binned,
        by one aggregate in the run's snapshot (each bin's largest score and size; one scan)."""
        scores = sa.select(sa.cast(self._score_column, sa.Double()).label("s")).subquery("t")
        bin_of = sa.literal_column(bins.sql("t.s"))
        query = (
            sa.select(sa.func.max(scores.c.s), sa.func.count())
            .where(scores.c.s <= float(bins.top))
            .group_by(bin_of)
        )
        with self._connection() as conn:
            got = conn.execute(query).all()
        tops = np.array([row[0] for row in got], dtype=np.float64)
        return tops, np.array([row[1] for row in got], dtype=np.int64)

    def _open_run(self, conn: Connection, transaction: sa.RootTransaction) -> sa.RootTransaction:
        """The run's first query (SQLAlchemyTable.snapshot(), as in mode='copy'): m, read from
        the position table. On MariaDB / MySQL, positions left behind by a write that bypassed
        the triggers (TRUNCATE re-creates the table) are rebuilt first, outside the run's
        transaction, and the run starts again."""
        if not self._live.positions_current(self, conn):
            self._end(conn, transaction)
            self._live.refill(self)
            transaction = self._begin(conn)
        self._m = self._live_count(conn)
        self._cursor = None
        self.last_freshness = {"copy": "none", "read": "table"}
        return transaction

    def _close_run(self) -> None:
        self._m = None
        self._cursor = None

    def _live_count(self, conn: Connection) -> int:
        """m = max(position) + 1 (one probe of the primary key), checked against the count row."""
        p, c = self._pos.c, self._count.c
        query = sa.select(
            sa.select(sa.func.max(p.position)).scalar_subquery(),
            sa.select(sa.func.max(c.n)).scalar_subquery(),
        )
        try:
            last, count = conn.execute(query).one()
        except sa.exc.DBAPIError as error:
            inspector = sa.inspect(self.engine)  # a fresh connection: this one may be aborted
            if not inspector.has_table(self._pos.name, schema=self._pos.schema):
                raise RuntimeError(
                    f"position table {self._pos.name!r} of {self.where} does not exist: call "
                    "prepare() first"
                ) from error
            raise
        if last is None and count is None:
            raise RuntimeError(
                f"position table {self._pos.name!r} of {self.where} is empty: call prepare() "
                "first (or the table has no item to select)"
            )
        m = 0 if last is None else int(last) + 1
        if count is None or int(count) != m:
            raise AccessError(
                f"position table {self._pos.name!r} of {self.where} is inconsistent (positions "
                f"end at {m}, count {count}): call prepare() again"
            )
        if m == 0:
            raise ValueError(f"{self.where} is empty: there is no item to select")
        return m

    def domain_size(self) -> int:
        if self._m is not None:
            return self._m
        with self._connection() as conn:
            return self._live_count(conn)

    def _page(self, start: int, count: int, cursor: tuple[int, Any, Any] | None) -> Any:
        """Rows at depths start.. of the canonical order, at most `count`: keyset after `cursor`
        (next depth, last score, last id) when it stops at `start`, from the top at depth 0, else
        OFFSET. The keyset is two index ranges: the rows tied with the last score after its id,
        and the rows of lower score (a row comparison cannot mix DESC and ASC)."""
        score, ident = self._score_column, self._id_column
        order = (score.desc(), self._index_key())
        top = sa.select(ident.label("id"), score.label("score")).order_by(*order).limit(count)
        if start == 0:
            return top
        if cursor is None or cursor[0] != start:
            return top.offset(start)
        _, last_score, last_id = cursor
        tied = (
            sa.select(ident.label("id"), score.label("score"))
            .where(score == last_score, self._index_key() > last_id)
            .order_by(self._index_key())
            .limit(count)
        )
        below = (
            sa.select(ident.label("id"), score.label("score"))
            .where(score < last_score)
            .order_by(*order)
            .limit(count)
        )
        return sa.union_all(sa.select(tied.subquery("tied")), sa.select(below.subquery("below")))

    def _probes(self, rows: int) -> bool:
        """Whether to find the other side of `rows` rows by one index probe each (a correlated
        subquery) rather than by a join, which planners serve with a hash join over a whole
        table once the batch looks large to them: probes up to 1/PROBE_FRACTION of m."""
        return self._m is None or rows * PROBE_FRACTION < self._m

    def _sorted_query(
        self, start: int, count: int, cursor: tuple[int, Any, Any] | None, probes: bool
    ) -> Any:
        """(position, id, score) of depths start.., at most `count`, in canonical order."""
        page = self._page(start, count, cursor).subquery("page")
        p = self._pos.c
        if probes:
            position = sa.select(p.position).where(p.id == page.c.id).scalar_subquery()
            query = sa.select(position, page.c.id, page.c.score)
        else:
            query = sa.select(p.position, page.c.id, page.c.score).select_from(
                page.join(self._pos, p.id == page.c.id)
            )
        return query.order_by(page.c.score.desc(), self._live.order_key(self, page.c.id)).limit(
            count
        )

    def _positions_query(self, probes: bool) -> Any:
        """(position, id, score) at the positions of the expanding parameter `positions`."""
        p = self._pos.c
        at = self._live.one_of(p.position, "positions", sa.BigInteger())
        if probes:
            score = (
                sa.select(self._score_column)
                .where(self._match_key(self._id_column) == p.id)
                .scalar_subquery()
            )
            return sa.select(p.position, p.id, score).where(at)
        return (
            sa.select(p.position, self._id_column, self._score_column)
            .select_from(
                self._pos.join(self._source, self._match_key(self._id_column) == p.id)  # type: ignore[arg-type]
            )
            .where(at)
        )

    def read_sorted(self, start: int, count: int) -> Rows:
        """Depths start .. start+count-1 with their positions: one query (module docstring)."""
        start, count = int(start), int(count)
        if count <= 0:
            return self._rows([], round_trips=0)
        # An oblivious run pages by OFFSET: a keyset would send the last score read, a fact of
        # the data, as a parameter (in the text, where the driver interpolates).
        cursor = self._cursor if self._conn is not None and not self._oblivious else None
        query = self._sorted_query(start, count, cursor, self._probes(count))
        with self._connection() as conn:
            records = conn.execute(query).all()
            if self._conn is not None and records:
                self._cursor = (start + len(records), records[-1][2], records[-1][1])
        for record in records:
            if record[0] is None:
                raise AccessError(
                    f"item {record[1]!r} of {self.where} has no position in "
                    f"{self._pos.name!r}: call prepare() again"
                )
        return self._rows(records, round_trips=1)

    def read_positions(self, positions: np.ndarray) -> Rows:
        """Rows at the given positions: position table -> user table by id, in chunks."""
        wanted = plain_values(np.asarray(positions, dtype=np.int64))
        distinct = sorted(set(wanted))
        query = self._positions_query(self._probes(len(distinct)))
        records: list[Any] = []
        chunks = 0
        with self._connection() as conn:
            for chunk in self._chunks(distinct):
                records.extend(conn.execute(query, {"positions": chunk}).all())
                chunks += 1
            by_position = {int(rec[0]): rec for rec in records}
            for rec in records:
                if rec[2] is None:
                    self._raise_if_gone(conn, rec[1])
        try:
            ordered = [by_position[position] for position in wanted]
        except KeyError as missing:
            raise AccessError(
                f"position {missing.args[0]} has no row in {self.where} (position table "
                f"{self._pos.name!r}): call prepare() again"
            ) from None
        return self._rows(ordered, round_trips=chunks)

    def _raise_if_gone(self, conn: Connection, item: Any) -> None:
        """A NULL score read by position: the item is gone from the table (the position table is
        behind it), or its score is NULL (refused by _checked)."""
        key = self._match_key(self._id_column)
        there = conn.execute(sa.select(sa.func.count()).where(key == item)).scalar_one()
        if not there:
            raise AccessError(
                f"the position table {self._pos.name!r} names item {item!r}, which is not in "
                f"{self.where}: call prepare() again"
            )

    def read_ids(self, ids: Sequence[Any]) -> np.ndarray:
        """Scores of the named items, in the order given (read_exact_scores), as doubles."""
        return self._checked(np.asarray(self.read_exact_scores(ids), dtype=np.float64))

    def read_exact_scores(self, ids: Sequence[Any]) -> list[Any]:
        """ExactScores: the scores of the named items as the driver returns them, from the
        table itself: `id IN (...)` on the unique index, in chunks of max_params."""
        wanted = plain_values(ids)
        key = self._match_key(self._id_column)
        query = sa.select(self._id_column, self._score_column).where(
            self._live.one_of(key, "ids", self._id_column.type)
        )
        found: dict[Any, Any] = {}
        with self._connection() as conn:
            for chunk in self._chunks(list(dict.fromkeys(wanted))):
                found.update((item, score) for item, score in conn.execute(query, {"ids": chunk}))
        try:
            return [found[item] for item in wanted]
        except KeyError as missing:
            raise AccessError(f"{self.where} has no item with id {missing.args[0]!r}") from None

    @property
    def integer_scores(self) -> bool:
        """Whether the counts are of an integer type (never on SQLite: see the copy mode)."""
        return self._live.typed_scores and isinstance(self._score_column.type, sa.Integer)

    def _checked(self, scores: np.ndarray) -> np.ndarray:
        """Every score a run reads is checked: the table was validated once, then written to."""
        if not np.isfinite(scores).all() or (scores < 0).any():
            raise AccessError(
                f"{self.where} column {self.score_column!r} holds a NULL, NaN, infinite or "
                "negative score: fix the row (live runs read the table as it is)"
            )
        return scores

    def check(self) -> AccessCheck:
        """How each access kind will be served, from the dialect's EXPLAIN (as in mode='copy'):
        sorted access by keyset on the (score DESC, id) index, random access by position through
        the position table's primary key and the id index, random access by id on the id index."""
        inspector = sa.inspect(self.engine)
        names = ("sorted", "random by position", "random by id")
        if not inspector.has_table(self._pos.name, schema=self._pos.schema):
            why = f"no position table {self._pos.name!r}: call prepare()"
            return AccessCheck(self.where, [AccessPath(a, True, why) for a in names])
        with self.engine.connect() as conn:
            first = conn.execute(
                sa.select(self._id_column, self._score_column)
                .order_by(self._score_column.desc(), self._index_key())
                .limit(1)
            ).first()
            last_id, last_score = first if first is not None else (None, 0)
            probes = [
                self._sorted_query(1, 100, (1, last_score, last_id), probes=True),
                self._positions_query(probes=True).params(positions=[0, 1, 2]),  # a batch
                sa.select(self._id_column, self._score_column).where(
                    self._match_key(self._id_column).in_([last_id])
                ),
            ]
            self._live.before_explain(conn)
            paths = [
                AccessPath(access, *self._live.explain_live(self, conn, query))
                for access, query in zip(names, probes, strict=True)
            ]
            conn.rollback()
        return AccessCheck(self.where, paths)


SQLAlchemyTable.mode_classes["live"] = SQLAlchemyLiveTable
