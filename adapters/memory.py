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
    sorted access is a slice and the positional index for sampling is the array index. Ids come
    back exactly as given (type and value: 1 stays 1, 'x\\x00' keeps its NUL); they may be int,
    float, str or bytes, mixed, and tie in the total order of `topk_middleware.validation`
    (numbers, then text in code point order, then bytes), where 1 and '1' are two items. It keeps
    the runs of tied scores too (`ScoreRuns`), computed on first use.
    """

    def __init__(self, scores: Any, ids: Any = None) -> None:
        scores = check_scores(np.asarray(scores), where="ArraySource scores")
        m = len(scores)
        if ids is None:
            ids, key = np.arange(m, dtype=np.int64), np.arange(m, dtype=np.int64)
        else:
            ids, key = check_ids(ids, m, where="ArraySource ids")
        order = np.lexsort((key, -scores))
        self._ids = ids[order]
        self._scores = scores[order]
        self._rank_of_id: dict[Any, int] | None = None
        self._run_starts: np.ndarray | None = None

    def domain_size(self) -> int:
        return len(self._scores)

    def snapshot(self) -> nullcontext[None]:
        return nullcontext()  # the arrays are private copies: nothing can change them

    def read_sorted(self, start: int, count: int) -> Rows:
        stop = min(start + count, len(self._scores))
        return Rows(
            np.arange(start, stop, dtype=np.int64), self._ids[start:stop], self._scores[start:stop]
        )

    def read_positions(self, ranks: np.ndarray) -> Rows:
        ranks = np.asarray(ranks, dtype=np.int64)
        return Rows(ranks, self._ids[ranks], self._scores[ranks])

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

    def score_run_count(self) -> int:
        return len(self._runs())

    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        starts = self._runs()
        return starts.copy(), self._scores[starts]
