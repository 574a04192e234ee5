"""Checks on a histogram before anything is released (DESIGN invariant 6)."""

from __future__ import annotations

import numpy as np


def check_scores(scores: np.ndarray, where: str) -> np.ndarray:
    """A 1-D, non-empty array of finite, non-negative numbers, as float64."""
    if scores.ndim != 1:
        raise ValueError(f"{where} must be 1-D, got shape {scores.shape}")
    if len(scores) == 0:
        raise ValueError(f"{where} is empty: there is no item to select")
    if not (np.issubdtype(scores.dtype, np.number) and not np.iscomplexobj(scores)):
        raise TypeError(f"{where} must be real numbers, got dtype {scores.dtype}")
    scores = scores.astype(np.float64)
    bad = ~np.isfinite(scores)
    if bad.any():
        raise ValueError(
            f"{where} has {int(bad.sum())} NaN or infinite value(s), first at index "
            f"{int(np.flatnonzero(bad)[0])}"
        )
    negative = scores < 0
    if negative.any():
        i = int(np.flatnonzero(negative)[0])
        raise ValueError(
            f"{where} has {int(negative.sum())} negative value(s), first {scores[i]} at index {i}"
        )
    return scores


def check_unique_ids(ids: np.ndarray, where: str) -> None:
    values, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        dup = values[counts > 1]
        raise ValueError(f"{where} has {len(dup)} duplicate id(s), e.g. {dup[0].item()!r}")
