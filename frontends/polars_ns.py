"""A private top-k as a Polars namespace: `frame.topk.private_top_k(k=, epsilon=, id=, score=)`.

Importing this module registers the namespace `topk` on DataFrame and LazyFrame (OpenDP uses
`dp`; `topk` does not collide with it). Two methods:

* `private_top_k(k=, epsilon=, id="id", score="score", ...)` over a frame of counts: the two
  columns become an ArraySource (integer ids: sorted by Polars on every core, checked by
  ArraySource.from_canonical_order; others: ArraySource.from_polars) and private_top_k runs on
  it; a LazyFrame collects those two columns only.
* `private_top_k_from_votes(k=, epsilon=, items=, client="client", item="item", ...)` over a
  frame of raw events (client, item[, weight]): each client's contribution to an item is its
  rows for the item (or the sum of their weight) clipped at `max_per_item`, and with
  `max_items_per_client` = L it keeps the L items of its own with the smallest random priority
  (one priority per (client, item) pair, drawn from the secure generator for this release), as
  DuckDBTable.from_votes does with a keyed hash (adapters/contributions.py): which items a
  client keeps depends on the priorities and its own items only, so removing a client moves
  each count by at most `max_per_item`, all in one direction, and at most L counts. `items` is
  the public domain (items without votes count 0); a vote outside it is refused.

Both return a FrameRelease: `.frame` (a DataFrame of rank and item, and count with
`with_counts=True`), `.privacy` (the guarantee) and `.guarantee_text`. Polars frames carry no
metadata, so the guarantee travels beside the frame; `to_arrow()` puts it in the Arrow schema
metadata as Release.to_arrow does. Cost: the sort of the canonical order (one multi-threaded
Polars sort of m rows, or one numpy lexsort) plus the release; from votes, two group-bys and a
join of Polars first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from adapters.contributions import FIXED_POINT, UNITS_BOUND, check_bounds
from adapters.memory import ArraySource
from topk_middleware.api import private_top_k
from topk_middleware.privacy import PrivacyGuarantee, check_sensitivity
from topk_middleware.randomness import secure_rng
from topk_middleware.release import Release, guarantee_text
from topk_middleware.validation import check_common

NAMESPACE = "topk"


@dataclass(frozen=True)
class FrameRelease:
    """A release as a Polars frame (rank from 1, item; count with noisy counts), its guarantee."""

    frame: pl.DataFrame
    release: Release

    @property
    def privacy(self) -> PrivacyGuarantee:
        return self.release.privacy

    @property
    def guarantee_text(self) -> str:
        return guarantee_text(self.release)

    def to_arrow(self) -> Any:
        """The release as a pyarrow Table with the guarantee in its schema metadata."""
        return self.release.to_arrow()

    def __repr__(self) -> str:
        return f"{self.frame}\n{self.guarantee_text}"


def _frame_of(release: Release, dtype: Any) -> pl.DataFrame:
    columns: dict[str, Any] = {
        "rank": pl.Series("rank", range(1, len(release.items) + 1), dtype=pl.Int32),
        "item": pl.Series("item", list(release.items), dtype=dtype),
    }
    if release.counts is not None:
        columns["count"] = pl.Series("count", list(release.counts), dtype=pl.Int64)
    return pl.DataFrame(columns)


def _collected(frame: pl.DataFrame | pl.LazyFrame, columns: list[str]) -> pl.DataFrame:
    names = frame.collect_schema().names()
    for name in columns:
        if name not in names:
            raise ValueError(f"the frame has no column {name!r} (columns: {names})")
    selected = frame.select(columns)
    return selected.collect() if isinstance(selected, pl.LazyFrame) else selected


def _source(frame: pl.DataFrame, id: str, score: str) -> ArraySource:
    """The ArraySource of (id, score): for integer ids and numeric scores, the canonical order
    sorted by Polars on every core (_canonical_key) and checked in O(m) by
    ArraySource.from_canonical_order; else, or when that check refuses (a null, a NaN, a
    duplicate id), ArraySource.from_polars, which sorts in numpy and says what is wrong. The same
    source either way."""
    ids, scores = frame.schema[id], frame.schema[score]
    fast = ids.is_integer() and ids != pl.UInt64 and scores.is_numeric() and scores != pl.Decimal
    if fast and frame.height:
        ordered = frame.sort(_canonical_key(frame, id, score))
        try:
            return ArraySource.from_canonical_order(
                ordered.get_column(score).to_numpy(), ordered.get_column(id).to_numpy()
            )
        except (TypeError, ValueError):
            pass  # from_polars below refuses it in words, with the row
    return ArraySource.from_polars(frame, id=id, score=score)


def _canonical_key(frame: pl.DataFrame, id: str, score: str) -> pl.Expr | list[pl.Expr]:
    """Score descending, ties by id ascending: one Int64 key (top - score) * width + (id - low)
    when the scores are integers below 2^53 (where doubles order them as integers do) and the
    key fits in 62 bits, else the two columns (the score as a double, as ArraySource orders)."""
    bounds = frame.select(
        pl.col(score).min().alias("s0"),
        pl.col(score).max().alias("s1"),
        pl.col(id).min().alias("i0"),
        pl.col(id).max().alias("i1"),
    ).row(0)
    s0, s1, i0, i1 = bounds
    if frame.schema[score].is_integer() and None not in bounds and 0 <= s0 and s1 <= 2**53:
        width = int(i1) - int(i0) + 1
        if (int(s1) - int(s0) + 1) * width < 2**62:
            top = pl.lit(int(s1), pl.Int64)
            return (top - pl.col(score).cast(pl.Int64)) * width + (pl.col(id).cast(pl.Int64) - i0)
    return [pl.col(score).cast(pl.Float64).neg(), pl.col(id)]


def _run(source: ArraySource, dtype: Any, k: int, epsilon: float, options: dict) -> FrameRelease:
    result = private_top_k(source, k, epsilon, **options)
    release = result.release()
    return FrameRelease(_frame_of(release, dtype), release)


class _TopK:
    """The `topk` namespace of one DataFrame or LazyFrame."""

    def __init__(self, frame: pl.DataFrame | pl.LazyFrame) -> None:
        self._frame = frame

    def private_top_k(
        self,
        *,
        k: int,
        epsilon: float,
        id: str = "id",
        score: str = "score",
        sensitivity: float = 1,
        **options: Any,
    ) -> FrameRelease:
        """Release the k most counted items of (id, score) under (epsilon, delta)-DP.

        `sensitivity` is the most one client changes one count (the table builder's
        declaration; 1 for counts of distinct clients). `options` go to private_top_k (delta,
        noise, budget, with_counts, seed, oblivious, ...)."""
        frame = _collected(self._frame, [id, score])
        check_common(k, epsilon, options.get("delta", 0.0))  # before anything is read
        sensitivity = check_sensitivity(sensitivity)
        source = _source(frame, id, score)
        source.sensitivity = sensitivity  # the declaration scales the noise (privacy.py)
        return _run(source, frame.schema[id], k, epsilon, options)

    def private_top_k_from_votes(
        self,
        *,
        k: int,
        epsilon: float,
        items: pl.DataFrame | pl.LazyFrame | pl.Series,
        client: str = "client",
        item: str = "item",
        item_id: str = "id",
        weight: str | None = None,
        max_per_item: float = 1,
        max_items_per_client: int | None = None,
        **options: Any,
    ) -> FrameRelease:
        """Count the votes of this frame (client, item[, weight]) with bounded contributions
        over the public domain `items` (a frame with column `item_id`, or a Series), then
        release as private_top_k does; the source's sensitivity is `max_per_item`."""
        check_common(k, epsilon, options.get("delta", 0.0))  # before anything is read
        bound, limit = check_bounds(weight, max_per_item, max_items_per_client)
        columns = [client, item] if weight is None else [client, item, weight]
        votes = _collected(self._frame, columns).lazy()
        domain = _domain(items, item_id)
        counts = clipped_counts(votes, domain, client, item, weight, bound, limit)
        scores = counts.get_column("score").to_numpy()
        ids = counts.get_column("id")
        source = ArraySource(
            scores,
            _ids_numpy(ids),
            sensitivity=bound,
            max_items_per_client=limit,
        )
        return _run(source, ids.dtype, k, epsilon, options)


def _ids_numpy(ids: pl.Series) -> np.ndarray:
    if ids.dtype in (pl.Categorical, pl.Enum):
        ids = ids.cast(pl.Utf8)
    return ids.to_numpy()


def _domain(items: Any, item_id: str) -> pl.DataFrame:
    if isinstance(items, pl.Series):
        domain = items.rename("id").to_frame()
    elif isinstance(items, pl.DataFrame | pl.LazyFrame):
        domain = _collected(items, [item_id]).rename({item_id: "id"})
    else:
        raise TypeError(
            f"items must be a Polars DataFrame, LazyFrame or Series of the public domain, got "
            f"{type(items).__name__}"
        )
    if domain.get_column("id").null_count():
        raise ValueError("the domain of items has a null id")
    if domain.get_column("id").is_duplicated().any():
        raise ValueError("the domain of items has duplicate ids")
    return domain


def clipped_counts(
    votes: pl.LazyFrame,
    domain: pl.DataFrame,
    client: str,
    item: str,
    weight: str | None,
    bound: float,
    limit: int | None,
) -> pl.DataFrame:
    """(id, score) over the whole domain: each client's contribution per item clipped at
    `bound`, at most `limit` items a client (smallest random priority), rows with a null client
    or item dropped, missing items 0. Refuses a vote outside the domain, a negative or
    non-finite weight."""
    votes = votes.filter(pl.col(client).is_not_null() & pl.col(item).is_not_null())
    if weight is not None:
        bad = votes.filter(
            pl.col(weight).is_not_null() & ~(pl.col(weight).is_finite() & (pl.col(weight) >= 0))
        )
        if bad.select(pl.len()).collect().item():
            raise ValueError(f"weight column {weight!r} has a negative, NaN or infinite value")
    dom = domain.lazy()
    outside = votes.join(dom, left_on=item, right_on="id", how="anti").select(pl.len())
    if outside.collect().item():
        raise ValueError(
            f"a vote names an item missing from the domain: the domain must be public and "
            f"complete (column {item!r})"
        )
    amount = pl.len() if weight is None else pl.col(weight).fill_null(0).sum()
    clipped = pl.min_horizontal(amount.cast(pl.Float64), pl.lit(float(bound)))
    if weight is not None:  # exact fixed-point units (adapters/contributions.py)
        clipped = (clipped * FIXED_POINT).floor()
    pairs = votes.group_by([client, item]).agg(clipped.cast(pl.Int64).alias("contrib"))
    if limit is not None:  # one random priority per (client, item) pair
        pairs = pairs.collect()
        pairs = (
            pairs.with_columns(pl.Series("priority", secure_rng().random(pairs.height)))
            .with_columns(pl.col("priority").rank("ordinal").over(client).alias("r"))
            .filter(pl.col("r") <= limit)
            .select(client, item, "contrib")
            .lazy()
        )
    total = pl.col("contrib").sum()
    if weight is not None:
        total = pl.min_horizontal(total, pl.lit(UNITS_BOUND)).cast(pl.Float64) / FIXED_POINT
    counts = pairs.group_by(item).agg(total.alias("score"))
    joined = dom.join(counts, left_on="id", right_on=item, how="left").with_columns(
        pl.col("score").fill_null(0)
    )
    if weight is None:
        joined = joined.with_columns(pl.col("score").cast(pl.Int64))
    return joined.select("id", "score").collect()


pl.api.register_dataframe_namespace(NAMESPACE)(_TopK)
pl.api.register_lazyframe_namespace(NAMESPACE)(_TopK)

__all__ = ["NAMESPACE", "FrameRelease", "clipped_counts"]
