"""ArraySource: a histogram held in numpy arrays."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np

from topk_middleware.access import AccessError, Rows
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
    (access.py, positions apart from sorted order).
    """

    def __init__(self, scores: Any, ids: Any = None, *, positions: str = "ranks") -> None:
        if positions not in ("ranks", "input"):
            raise ValueError(f"positions must be 'ranks' or 'input', got {positions!r}")
        scores = check_scores(np.asarray(scores), where="ArraySource scores")
        m = len(scores)
        if ids is None:
            ids, key = np.arange(m, dtype=np.int64), np.arange(m, dtype=np.int64)
        else:
            ids, key = check_ids(ids, m, where="ArraySource ids")
        order = np.lexsort((key, -scores))
        self._ids = ids[order]
        self._scores = scores[order]
        self.positions_are_ranks = positions == "ranks"
        # position -> rank, and the position of each rank (None: positions are ranks)
        self._rank_at: np.ndarray | None = None
        self._position_of: np.ndarray | None = None
        if not self.positions_are_ranks:
            self._position_of = order.astype(np.int64)
            self._rank_at = np.empty(m, dtype=np.int64)
            self._rank_at[order] = np.arange(m, dtype=np.int64)
        self._rank_of_id: dict[Any, int] | None = None
        self._run_starts: np.ndarray | None = None

    def domain_size(self) -> int:
        return len(self._scores)

    def snapshot(self) -> nullcontext[None]:
        return nullcontext()  # the arrays are private copies: nothing can change them

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
        if self._rank_of_id is None:
            self._rank_of_id = {item: r for r, item in enumerate(self._ids.tolist())}
        try:
            ranks = [self._rank_of_id[item] for item in ids]
        except KeyError as missing:
            raise AccessError(f"ArraySource has no item with id {missing.args[0]!r}") from None
        return self._scores[np.asarray(ranks, dtype=np.int64)]

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
