"""IbisTable: a store over any Ibis table expression of per-item counts.

`IbisTable(table_expr, id="id", score="score")` serves the two access kinds through Ibis
expressions compiled by the expression's backend:

* sorted access: the canonical order (score descending, ties by id ascending) as
  `ORDER BY score DESC, key(id) LIMIT n`, keyset-limited (`WHERE score < s OR (score = s AND
  key(id) > key(last))`) when a read continues the previous one, else with OFFSET;
* random access by position (positions are ranks: an expression has no positional index): the
  rows whose `row_number() OVER (canonical order) - 1` is among the ranks, one query a batch
  (a window over the whole expression: about one sort of it on the backend);
* random access by id: `WHERE id IN (...)`;
* the runs of tied scores (ScoreRuns): one GROUP BY score.

Text ids compare by the bytes of their UTF-8 text (`key(id)`): `encode(id)` on DuckDB,
`convert_to(id, 'UTF8')` on PostgreSQL, the text itself on SQLite (whose default collation
compares bytes). A backend with no known byte key refuses text ids. All reads of a run happen
in one transaction of the backend's connection (`snapshot()`): BEGIN TRANSACTION on DuckDB,
BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY on PostgreSQL, BEGIN on SQLite; another backend
is refused unless the caller promises that the data do not change during a run
(`frozen=True`). A backend without window functions (Ibis's Polars backend) reads each
rank with its own ORDER BY .. LIMIT 1 OFFSET query. The in-store one-shot (a keyed hash
inside the backend) is not served: the one-shot method reads the expression once in full.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from topk_middleware.access import AccessError, Rows, StoreTraits
from topk_middleware.privacy import resolve_declared

try:
    import ibis
    import ibis.expr.operations as ops
    import ibis.expr.types as ir
except ImportError as error:  # pragma: no cover - the 'ibis' extra
    raise ImportError("adapters.ibis needs Ibis: pip install 'topk_middleware[ibis]'") from error


@ibis.udf.scalar.builtin
def convert_to(text: str, encoding: str) -> bytes:  # type: ignore[empty-body]
    """PostgreSQL's convert_to(text, encoding): the text's bytes."""


@ibis.udf.scalar.builtin
def encode(text: str) -> bytes:  # type: ignore[empty-body]
    """DuckDB's encode(text): the UTF-8 bytes of the text as a BLOB."""


# The expression whose order is the byte order of a text id's UTF-8, per backend.
BYTE_KEYS: dict[str, Callable[[Any], Any]] = {
    "duckdb": encode,
    "postgres": lambda text: convert_to(text, "UTF8"),
    "sqlite": lambda text: text,
}
# The statements that open and close one consistent read of the backend's connection.
SNAPSHOTS: dict[str, tuple[str, str]] = {
    "duckdb": ("BEGIN TRANSACTION", "COMMIT"),
    "postgres": ("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", "COMMIT"),
    "sqlite": ("BEGIN", "COMMIT"),
}


class IbisTable:
    """A histogram behind an Ibis table expression: `id` and `score` columns (module docstring).

    `sensitivity` (default 1) is the most one client adds to or removes from one count and
    `max_items_per_client` how many counts it moves, both declared by whoever built the table.
    `frozen=True` is the caller's promise that the data do not change during a run, needed on
    a backend whose transactions this adapter does not know.
    """

    positions_are_ranks = True

    def __init__(
        self,
        table: Any,
        id: str = "id",
        score: str = "score",
        *,
        sensitivity: float | None = None,
        max_items_per_client: int | None = None,
        frozen: bool = False,
    ) -> None:
        if not isinstance(table, ir.Table):
            raise TypeError(f"IbisTable takes an Ibis table expression, got {type(table).__name__}")
        if not isinstance(frozen, bool):
            raise TypeError(f"frozen must be True or False, got {frozen!r}")
        self.backend = table._find_backend()
        self.backend_name = self.backend.name
        self.where = f"Ibis table on {self.backend_name}"
        schema = table.schema()
        for column in (id, score):
            if column not in schema:
                raise ValueError(f"{self.where} has no column {column!r} (columns: {schema.names})")
        if not schema[score].is_numeric():
            raise TypeError(f"{self.where} column {score!r} must be numeric, it is {schema[score]}")
        kind = schema[id]
        if not (kind.is_integer() or kind.is_floating() or kind.is_string()):
            raise TypeError(
                f"{self.where} column {id!r} is {kind}: ids must be integer, floating point or "
                "string"
            )
        self.text_ids = kind.is_string()
        if self.text_ids and self.backend_name not in BYTE_KEYS:
            raise ValueError(
                f"{self.where}: text ids need the byte order of their UTF-8 text, which this "
                f"adapter knows how to ask of {', '.join(sorted(BYTE_KEYS))} only"
            )
        if self.backend_name not in SNAPSHOTS and not frozen:
            raise ValueError(
                f"{self.where}: this adapter cannot open a consistent read on "
                f"{self.backend_name}; pass frozen=True if the data do not change during a run"
            )
        self.frozen = frozen
        self.sensitivity, self.max_items_per_client = resolve_declared(
            sensitivity, max_items_per_client, None, self.where
        )
        self.id_column, self.score_column = id, score
        self._table = table.select(id=table[id], score=table[score])
        self._key: Callable[[Any], Any] = (
            BYTE_KEYS[self.backend_name] if self.text_ids else (lambda value: value)
        )
        t = self._table
        self._order = [ibis.desc(t.score), self._key(t.id).asc()]
        # row numbers in the canonical order (a window); without them, one query a rank
        self.numbers_rows = self.backend.has_operation(
            ops.RowNumber
        ) and self.backend.has_operation(ops.WindowFunction)
        self._depth = 0  # nested snapshot() calls
        self._m: int | None = None
        self._runs: int | None = None
        self._next: tuple[int, float, Any] | None = None  # (start, score, id) of a keyset read

    # ----- the snapshot -------------------------------------------------------------------------
    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """One transaction of the backend's connection around every read of a run."""
        statements = SNAPSHOTS.get(self.backend_name)
        if self._depth or statements is None:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if not self._depth:
                    self._forget()
            return
        begin, end = statements
        self._raw(begin)
        self._depth += 1
        try:
            yield
        except BaseException:
            self._depth -= 1
            self._forget()
            self._raw("ROLLBACK")
            raise
        self._depth -= 1
        self._forget()
        self._raw(end)

    def _raw(self, statement: str) -> None:
        result = self.backend.raw_sql(statement)
        # a cursor to close (PostgreSQL, SQLite); DuckDB's execute returns the connection itself
        if result is not None and result is not getattr(self.backend, "con", None):
            close = getattr(result, "close", None)
            if callable(close):
                close()

    def _forget(self) -> None:
        self._m = self._runs = None
        self._next = None

    # ----- the Source protocol ------------------------------------------------------------------
    def traits(self) -> StoreTraits:
        """access.StoreTraits: the declared sensitivity and bound."""
        return StoreTraits(self.sensitivity, self.max_items_per_client)

    def domain_size(self) -> int:
        if self._m is None or not self._depth:
            self._m = int(self._table.count().execute())
        return self._m

    def read_sorted(self, start: int, count: int) -> Rows:
        start, count = int(start), int(count)
        if count <= 0:
            return _rows([], [], start)
        t = self._table
        query = t.order_by(self._order)
        if self._next is not None and self._next[0] == start and start > 0:
            _, score, last = self._next
            query = (
                t.filter(
                    (t.score < score)
                    | ((t.score == score) & (self._key(t.id) > self._key(ibis.literal(last))))
                )
                .order_by(self._order)
                .limit(count)
            )
        else:
            query = query.limit(count, offset=start)
        frame = query.execute()
        ids, scores = frame["id"].tolist(), frame["score"].to_numpy(dtype=np.float64)
        if len(ids):
            self._next = (start + len(ids), float(frame["score"].iloc[-1]), ids[-1])
        return _rows(ids, scores, start)

    def read_positions(self, positions: np.ndarray) -> Rows:
        wanted = np.asarray(positions, dtype=np.int64)
        if len(wanted) == 0:
            return Rows(wanted, np.asarray([], dtype=object), np.asarray([], dtype=np.float64))
        t = self._table
        if not self.numbers_rows:
            return self._read_ranks_one_by_one(np.unique(wanted))
        ranked = t.mutate(rank=ibis.row_number().over(order_by=self._order))
        frame = (
            ranked.filter(ranked.rank.isin([int(r) for r in np.unique(wanted)]))
            .order_by(ranked.rank)
            .execute()
        )
        got = frame["rank"].to_numpy(dtype=np.int64)
        ids = _id_array(frame["id"].tolist())
        return Rows(got, ids, frame["score"].to_numpy(dtype=np.float64))

    def _read_ranks_one_by_one(self, ranks: np.ndarray) -> Rows:
        """A backend without window functions: the row at each rank by ORDER BY .. LIMIT 1
        OFFSET rank, one query a rank (round_trips says how many)."""
        ordered = self._table.order_by(self._order)
        ids, scores = [], []
        for rank in ranks.tolist():
            frame = ordered.limit(1, offset=int(rank)).execute()
            ids.append(frame["id"].tolist()[0])
            scores.append(float(frame["score"].iloc[0]))
        return Rows(
            ranks.astype(np.int64),
            _id_array(ids),
            np.asarray(scores, dtype=np.float64),
            round_trips=len(ranks),
        )

    def read_ids(self, ids: Sequence[Any]) -> np.ndarray:
        wanted = [value.item() if isinstance(value, np.generic) else value for value in ids]
        if not wanted:
            return np.asarray([], dtype=np.float64)
        t = self._table
        try:
            frame = t.filter(t.id.isin(list(dict.fromkeys(wanted)))).execute()
        except Exception as error:  # a value the id column cannot hold: no such item
            raise AccessError(f"{self.where} cannot look up these ids: {error}") from None
        found = dict(zip(frame["id"].tolist(), frame["score"].tolist(), strict=True))
        missing = [value for value in wanted if value not in found]
        if missing:
            raise AccessError(f"{self.where} has no item with id {missing[0]!r}")
        return np.asarray([found[value] for value in wanted], dtype=np.float64)

    # ----- ScoreRuns ----------------------------------------------------------------------------
    def score_run_count(self) -> int | None:
        if self._runs is None or not self._depth:
            self._runs = int(self._table.score.nunique().execute())
        return self._runs

    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        t = self._table
        frame = t.group_by("score").aggregate(n=t.count()).order_by(ibis.desc("score")).execute()
        sizes = frame["n"].to_numpy(dtype=np.int64)
        first = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        return first, frame["score"].to_numpy(dtype=np.float64)


def _id_array(values: list[Any]) -> np.ndarray:
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return np.asarray(values, dtype=np.int64)
    if values and all(isinstance(v, float) for v in values):
        return np.asarray(values, dtype=np.float64)
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _rows(ids: list[Any], scores: Any, start: int) -> Rows:
    positions = np.arange(start, start + len(ids), dtype=np.int64)
    return Rows(positions, _id_array(ids), np.asarray(scores, dtype=np.float64))


__all__ = ["BYTE_KEYS", "SNAPSHOTS", "IbisTable"]
