"""ArraySource: a histogram held in numpy arrays, or read from a pyarrow Table or a Polars
DataFrame (`from_arrow`, `from_polars`: the columns are viewed as numpy arrays without a copy where
Arrow's layout allows it; the canonical order is one copy, as for arrays)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np

from topk_middleware.access import AccessError, Rows, RunTraits, StoreTraits
from topk_middleware.privacy import check_max_items, check_sensitivity
from topk_middleware.validation import check_ids, check_scores


class ArraySource:
    """A histogram in memory: `scores[i]` is the count of item `ids[i]` (ids default to 0..m-1).

    The arrays are copied and put in canonical order (score descending, ties by id ascending), so
    sorted access is a slice. Ids come back exactly as given (type and value: 1 stays 1, 'x\x00'
    keeps its NUL); they may be int, float, str or bytes, mixed, and tie in the total order of
    `topk_middleware.validation` (numbers, then text in code point order, then bytes), where 1 and
    '1' are two items. With `positions="ranks"` (the default) an item's position is its rank, as
    in a rank-ordered copy, and the source keeps the runs of tied scores too (`ScoreRuns`,
    computed on first use). With `positions="input"` an item's position is its index in the
    arrays given, as in a live table: sorted access returns each row with that position
    (access.py, positions apart from sorted order). `sensitivity` is the most one client adds
    to or removes from one count (default 1), declared by whoever built the histogram; the noise
    is scaled by it (topk_middleware/privacy.py). `max_items_per_client` (default None: no
    bound) is how many counts one client can change at most, which lowers the noisy counts'
    noise (noisy_counts.py). Integer scores (an integer dtype) are kept exactly for the noisy
    counts, whatever their size.
    """

    def __init__(
        self,
        scores: Any,
        ids: Any = None,
        *,
        positions: str = "ranks",
        sensitivity: float = 1,
        max_items_per_client: int | None = None,
    ) -> None:
        self.sensitivity = check_sensitivity(sensitivity)  # the most one client moves a count
        self.max_items_per_client = check_max_items(max_items_per_client)  # counts it moves
        if positions not in ("ranks", "input"):
            raise ValueError(f"positions must be 'ranks' or 'input', got {positions!r}")
        given = np.asarray(scores)
        # integer scores are counts held exactly (ExactScores: the noisy counts read them)
        self.integer_scores = given.dtype.kind in "iu"
        scores = check_scores(given, where="ArraySource scores")
        m = len(scores)
        if ids is None:
            ids, key = np.arange(m, dtype=np.int64), np.arange(m, dtype=np.int64)
        else:
            ids, key = check_ids(ids, m, where="ArraySource ids")
        order = np.lexsort((key, -scores))
        self._keep(ids[order], scores[order], given[order] if self.integer_scores else None)
        self.positions_are_ranks = positions == "ranks"
        # position -> rank, and the position of each rank (None: positions are ranks)
        self._rank_at: np.ndarray | None = None
        self._position_of: np.ndarray | None = None
        if not self.positions_are_ranks:
            self._position_of = order.astype(np.int64)
            self._rank_at = np.empty(m, dtype=np.int64)
            self._rank_at[order] = np.arange(m, dtype=np.int64)

    def _keep(self, ids: np.ndarray, scores: np.ndarray, exact: np.ndarray | None) -> None:
        """Hold the histogram in canonical order (the lazily built lookups empty)."""
        self._ids, self._scores, self._exact = ids, scores, exact
        self._rank_of_id: dict[Any, int] | None = None
        self._run_starts: np.ndarray | None = None

    @classmethod
    def from_canonical_order(
        cls,
        scores: Any,
        ids: Any,
        *,
        sensitivity: float = 1,
        max_items_per_client: int | None = None,
    ) -> ArraySource:
        """A source over integer ids and scores already in canonical order (score descending,
        ties by id ascending), as a multi-threaded sort elsewhere (Polars) leaves them: the
        order is checked in one vectorised pass instead of sorted again, and distinct ids with a
        bitmap over their range when it is at most 4m wide (else one sort). Positions are ranks.
        Cost O(m), against the O(m log m) lexsort of the constructor."""
        self = cls.__new__(cls)
        self.sensitivity = check_sensitivity(sensitivity)
        self.max_items_per_client = check_max_items(max_items_per_client)
        given, ids = np.asarray(scores), np.asarray(ids)
        if ids.dtype.kind not in "iu" or (ids.dtype.kind == "u" and ids.dtype.itemsize == 8):
            raise TypeError(
                f"from_canonical_order takes integer ids (int64 range), got {ids.dtype}"
            )
        self.integer_scores = given.dtype.kind in "iu"
        values = check_scores(given, where="ArraySource scores")
        m = len(values)
        if len(ids) != m:
            raise ValueError(f"ids must have the length of scores ({m}), got {len(ids)}")
        ids = ids.astype(np.int64)
        falls, tied = values[1:] <= values[:-1], values[1:] == values[:-1]
        if not (falls.all() and ((ids[1:] > ids[:-1]) | ~tied).all()):
            raise ValueError(
                "scores and ids are not in canonical order (score descending, ties by id "
                "ascending, each id once)"
            )
        low, high = int(ids.min()), int(ids.max())
        if high - low < 4 * m:
            seen = np.zeros(high - low + 1, dtype=bool)
            seen[ids - low] = True
            distinct = int(seen.sum()) == m
        else:
            ordered = np.sort(ids)
            distinct = not (ordered[1:] == ordered[:-1]).any()
        if not distinct:
            raise ValueError("ArraySource ids has duplicate ids: each item must appear once")
        self._keep(ids, values, given if self.integer_scores else None)
        self.positions_are_ranks = True
        self._rank_at = self._position_of = None
        return self

    @classmethod
    def from_arrow(
        cls, table: Any, id: str = "id", score: str = "score", *, positions: str = "ranks"
    ) -> ArraySource:
        """A source over two columns of a pyarrow Table (or RecordBatch): `id` (integer,
        floating point, string or binary; dictionary-encoded too) and `score` (integer or
        floating point). A column without nulls in one chunk is read without a copy."""
        try:
            import pyarrow as pa
        except ImportError as error:  # pragma: no cover - the 'arrow' extra
            raise ImportError(
                "ArraySource.from_arrow needs pyarrow: pip install 'topk_middleware[arrow]'"
            ) from error
        if not isinstance(table, pa.Table | pa.RecordBatch):
            raise TypeError(
                f"ArraySource.from_arrow takes a pyarrow Table or RecordBatch, got "
                f"{type(table).__name__}"
            )
        columns = [
            _arrow_column(table, name, role, pa) for name, role in ((score, "score"), (id, "id"))
        ]
        return cls(columns[0], columns[1], positions=positions)

    @classmethod
    def from_polars(
        cls, frame: Any, id: str = "id", score: str = "score", *, positions: str = "ranks"
    ) -> ArraySource:
        """A source over two columns of a Polars DataFrame: `id` (integer, floating point,
        string or binary) and `score` (integer or floating point). Numeric columns without
        nulls are read without a copy."""
        try:
            import polars as pl
        except ImportError as error:  # pragma: no cover - the 'polars' extra
            raise ImportError(
                "ArraySource.from_polars needs Polars: pip install 'topk_middleware[polars]'"
            ) from error
        if isinstance(frame, pl.LazyFrame):
            raise TypeError("ArraySource.from_polars takes a DataFrame: collect() the LazyFrame")
        if not isinstance(frame, pl.DataFrame):
            raise TypeError(
                f"ArraySource.from_polars takes a Polars DataFrame, got {type(frame).__name__}"
            )
        arrays = []
        for name, role in ((score, "score"), (id, "id")):
            if name not in frame.columns:
                raise ValueError(
                    f"the DataFrame has no {role} column {name!r} (columns: {frame.columns})"
                )
            series = frame.get_column(name)
            if series.null_count():
                first = int(series.is_null().arg_max())  # type: ignore[arg-type]
                raise ValueError(f"{role} column {name!r} has a null at row {first}")
            dtype = series.dtype
            numeric = dtype.is_numeric() and dtype != pl.Decimal
            text = dtype in (pl.Utf8, pl.Binary) or (
                role == "id" and dtype in (pl.Categorical, pl.Enum)
            )
            if not (numeric or (role == "id" and text)):
                kinds = "integer or floating point" + (", string or binary" if role == "id" else "")
                raise TypeError(f"{role} column {name!r} is of type {dtype}: it must be {kinds}")
            if dtype in (pl.Categorical, pl.Enum):
                series = series.cast(pl.Utf8)
            arrays.append(series.to_numpy())
        return cls(arrays[0], arrays[1], positions=positions)

    def domain_size(self) -> int:
        return len(self._scores)

    def snapshot(self) -> nullcontext[None]:
        return nullcontext()  # the arrays are private copies: nothing can change them

    def traits(self) -> StoreTraits:
        """access.StoreTraits: the declared sensitivity and bound, integer counts by dtype."""
        return StoreTraits(self.sensitivity, self.max_items_per_client, self.integer_scores)

    def run_traits(self) -> RunTraits:
        """access.RunTraits: positions are ranks unless built with positions="input"."""
        return RunTraits(positions_are_ranks=self.positions_are_ranks)

    def read_sorted(self, start: int, count: int) -> Rows:
        stop = min(start + count, len(self._scores))
        if self._position_of is None:
            positions = np.arange(start, stop, dtype=np.int64)
        else:
            positions = self._position_of[start:stop]
        return Rows(positions, self._ids[start:stop], self._scores[start:stop])

    def read_positions(self, positions: np.ndarray) -> Rows:
        positions = np.asarray(positions, dtype=np.int64)
        ranks = positions if self._rank_at is None else self._rank_at[positions]
        return Rows(positions, self._ids[ranks], self._scores[ranks])

    def read_ids(self, ids: Sequence[Any]) -> np.ndarray:
        return self._scores[self._ranks_of(ids)]

    def read_exact_scores(self, ids: Sequence[Any]) -> list[Any]:
        """ExactScores: the scores as given (integers as Python ints, never via a double)."""
        held = self._scores if self._exact is None else self._exact
        return held[self._ranks_of(ids)].tolist()

    def _ranks_of(self, ids: Sequence[Any]) -> np.ndarray:
        if self._rank_of_id is None:
            self._rank_of_id = {item: r for r, item in enumerate(self._ids.tolist())}
        try:
            ranks = [self._rank_of_id[item] for item in ids]
        except KeyError as missing:
            raise AccessError(f"ArraySource has no item with id {missing.args[0]!r}") from None
        return np.asarray(ranks, dtype=np.int64)

    # ----- ScoreRuns ----------------------------------------------------------------------------
    def _runs(self) -> np.ndarray:
        if self._run_starts is None:
            changes = np.flatnonzero(self._scores[1:] != self._scores[:-1]) + 1
            self._run_starts = np.concatenate([[0], changes]).astype(np.int64)
        return self._run_starts

    def score_run_count(self) -> int | None:
        return len(self._runs()) if self.positions_are_ranks else None

    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        starts = self._runs()
        return starts.copy(), self._scores[starts]


def _arrow_column(table: Any, name: str, role: str, pa: Any) -> np.ndarray:
    """One column of an Arrow table as a numpy array (no copy for one chunk without nulls of a
    numeric type), refused in words when missing, null or of another type."""
    if name not in table.column_names:
        raise ValueError(
            f"the Arrow table has no {role} column {name!r} (columns: {table.column_names})"
        )
    column = table.column(name)
    if column.null_count:
        import pyarrow.compute as pc

        first = pc.index(pc.is_null(column), True).as_py()
        raise ValueError(f"{role} column {name!r} has a null at row {first}")
    kind = column.type
    if pa.types.is_dictionary(kind):
        column, kind = column.cast(kind.value_type), kind.value_type
    numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind)
    text = (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    )
    if not (numeric or (role == "id" and text)):
        kinds = "integer or floating point" + (", string or binary" if role == "id" else "")
        raise TypeError(f"{role} column {name!r} is of Arrow type {kind}: it must be {kinds}")
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return column.to_numpy(zero_copy_only=False)
