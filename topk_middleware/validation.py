"""Checks on a histogram before anything is released (DESIGN invariant 6)."""

from __future__ import annotations

import itertools

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


# Item ids, and the total order the canonical tie-break uses on them: numbers first (by value),
# then text (by code point, which is UTF-8 byte order, as the SQL stores compare), then bytes (by
# byte). Ids of one kind compare as Python compares them; numbers and text never tie, so 1 and
# '1' are two items (1 and 1.0 are one: they are equal numbers).
ID_KINDS = "int, float, str or bytes"


def _id_kind(item: object) -> int | None:
    if isinstance(item, bool | np.bool_):
        return None  # True == 1 would make a flag and a number one item
    if isinstance(item, int | np.integer | float | np.floating):
        return 0
    if isinstance(item, str | np.str_):
        return 1
    if isinstance(item, bytes | np.bytes_):
        return 2
    return None


def check_ids(ids: object, m: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Item ids exactly as given (type and value), and each id's position in the id order.

    Returns (ids, key): `ids` an int64 or float64 array when the input is a numeric numpy array,
    else an object array of the given Python values (numpy scalars made plain), never a
    fixed-width string array (which would strip trailing NULs and turn 1 into '1'); `key[i]` is
    the position of `ids[i]` in the total order above. Refuses, naming the first offender, ids
    that are not 1-D of length m, None, booleans, NaN, other types, and duplicates.
    """
    if isinstance(ids, np.ndarray) and ids.ndim == 1 and ids.dtype.kind in "iuf":
        return _check_numeric_ids(ids, m, where)
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1:
            raise ValueError(f"{where} must be 1-D, got shape {ids.shape}")
        values = ids.tolist()
    elif isinstance(ids, str | bytes) or not hasattr(ids, "__iter__"):
        raise TypeError(f"{where} must be a sequence of ids, got {type(ids).__name__}")
    else:
        values = list(ids)  # type: ignore[call-overload]
    if len(values) != m:
        raise ValueError(
            f"{where} must be a 1-D array of the same length as scores ({m}), got {len(values)} "
            "id(s)"
        )
    kinds = []
    for i, item in enumerate(values):
        kind = _id_kind(item)
        if kind is None:
            raise TypeError(
                f"{where}[{i}] is {item!r} ({type(item).__name__}): ids must be {ID_KINDS}"
            )
        if kind == 0 and item != item:
            raise ValueError(f"{where}[{i}] is NaN: an id must equal itself")
        kinds.append(kind)
    plain = [v.item() if isinstance(v, np.generic) else v for v in values]
    order = sorted(range(m), key=lambda i: (kinds[i], plain[i]))
    key = np.empty(m, dtype=np.int64)
    key[np.asarray(order, dtype=np.int64)] = np.arange(m, dtype=np.int64)
    for a, b in itertools.pairwise(order):
        if kinds[a] == kinds[b] and plain[a] == plain[b]:
            raise ValueError(
                f"{where} has duplicate ids, e.g. {plain[a]!r} at indexes {min(a, b)} and "
                f"{max(a, b)}: each item must appear once"
            )
    out = np.empty(m, dtype=object)
    out[:] = plain
    return out, key


def _check_numeric_ids(ids: np.ndarray, m: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """check_ids for a numeric numpy array, vectorised."""
    if len(ids) != m:
        raise ValueError(
            f"{where} must be a 1-D array of the same length as scores ({m}), got shape {ids.shape}"
        )
    if ids.dtype.kind == "f" and np.isnan(ids).any():
        raise ValueError(
            f"{where}[{int(np.flatnonzero(np.isnan(ids))[0])}] is NaN: an id must equal itself"
        )
    order = np.argsort(ids, kind="stable")
    ordered = ids[order]
    same = np.flatnonzero(ordered[1:] == ordered[:-1])
    if len(same):
        a, b = sorted((int(order[same[0]]), int(order[same[0] + 1])))
        raise ValueError(
            f"{where} has duplicate ids, e.g. {ids[a].item()!r} at indexes {a} and {b}: each item "
            "must appear once"
        )
    key = np.empty(m, dtype=np.int64)
    key[order] = np.arange(m, dtype=np.int64)
    if ids.dtype.kind == "f":
        return ids.astype(np.float64), key
    if ids.dtype.kind == "u" and m and int(ids.max()) > np.iinfo(np.int64).max:
        out = np.empty(m, dtype=object)
        out[:] = ids.tolist()
        return out, key
    return ids.astype(np.int64), key


def first_line(error: BaseException) -> str:
    """An error's message as one line (its first), or its type's name when it has none: how
    the CLI, install-sql and the adapters quote a store's or a driver's error in their own."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
