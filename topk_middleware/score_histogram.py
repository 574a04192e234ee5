"""The score histogram a preview simulates from (topk_middleware/preview.py), read at the least
cost the store offers.

`read_histogram` reads each distinct score and how many items hold it: from the store's runs of
tied scores in one round trip where the store keeps them (every prepared store does: as many
rows as distinct scores). Elsewhere (a live table), the top 16k + 1 rows of the canonical order
by one sorted read, and the rest by one aggregate query (access.ScoreHistogramRead): the items
at or below the head's last score, binned by their distance below it (access.ScoreBins), each
bin read as its largest score and its size. Bins are 1/16 of the smallest noise scale simulated
wide (at least 1 on integer counts: bins one count wide are exact), and a share 1/512 of the
distance past 2,048 widths; no item is read more than that above its score, and the head
(limited domain's k_bar + 1 counts) is exact. A store that offers neither is read in full once.
Nothing is read per item beyond the head. Cost, after m: one round trip (runs), or two (the
head, and the aggregate: one scan of the scores in the store).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .access import (
    AccessError,
    CountedAccess,
    ScoreBins,
    ScoreHistogramRead,
    implements,
    store_traits,
)

# A store without runs of tied scores: the head read row by row (limited domain's largest k_bar,
# 16k, plus one), and the rest binned at this share of the smallest noise scale simulated.
HEAD_ROWS_PER_K = 16
BIN_SHARE = 1.0 / 16.0


@dataclass(frozen=True)
class ScoreHistogram:
    """The distinct scores of a table, descending, and how many items hold each (sizes)."""

    values: np.ndarray
    sizes: np.ndarray

    @property
    def m(self) -> int:
        return int(self.sizes.sum())

    def top(self, count: int) -> np.ndarray:
        """The `count` largest scores, in descending order (the canonical order's scores)."""
        cut = int(np.searchsorted(np.cumsum(self.sizes), count)) + 1
        return np.repeat(self.values[:cut], self.sizes[:cut])[:count]

    def at_ranks(self, ranks: np.ndarray) -> np.ndarray:
        """The scores at these depths (0-based) of the canonical order."""
        return self.values[np.searchsorted(np.cumsum(self.sizes), ranks, side="right")]

    def kth(self, k: int) -> float:
        """h_(k): the k-th largest score."""
        return float(self.values[int(np.searchsorted(np.cumsum(self.sizes), k))])


def read_histogram(access: CountedAccess, k: int, scale: float) -> ScoreHistogram:
    """The score histogram the simulations draw from (module docstring: What it reads): the
    store's runs; else the head row by row and the rest by one binned aggregate, bins
    BIN_SHARE x `scale` wide (at least 1 on integer counts); else a full read."""
    head_rows = min(access.m, HEAD_ROWS_PER_K * k + 1)
    offers = implements(access.source, ScoreHistogramRead)
    if offers and not access.run_count and head_rows < access.m:
        access.fetch_sorted_until(head_rows)
        head = np.array(access.prefix_scores()[:head_rows])
        top = float(head[-1])
        width = BIN_SHARE * scale
        if store_traits(access.source).integer_scores:
            width = max(width, 1.0)
        binned = access.binned_scores(ScoreBins(top, width))
        if binned is not None:
            above = head[head > top]
            values = np.concatenate([above, binned[0]])
            sizes = np.concatenate([np.ones(len(above), np.int64), binned[1]])
            if int(sizes.sum()) != access.m:
                raise AccessError(
                    f"the store's head and histogram hold {int(sizes.sum())} items, not m = "
                    f"{access.m}: they were not read in one snapshot"
                )
            distinct, inverse = np.unique(values, return_inverse=True)
            totals = np.bincount(inverse, weights=sizes).astype(np.int64)
            return ScoreHistogram(distinct[::-1], totals[::-1])
    values, sizes = access.score_histogram()
    return ScoreHistogram(np.asarray(values, dtype=np.float64), np.asarray(sizes, dtype=np.int64))
