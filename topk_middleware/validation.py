"""Checks on a histogram before anything is released (DESIGN invariant 6)."""

from __future__ import annotations

import itertools
import math
import numbers
from typing import Any

import numpy as np

from .names import first_line, mask_secrets  # noqa: F401  (re-exported: callers import them here)
from .privacy import MIN_ITEM_EPSILON


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
        if ids.dtype.kind in "US" and len(ids) == m:  # already fixed-width: sort it as it is
            return _sorted_text_ids(ids, where)
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
    text = _check_text_ids(values, where)
    if text is not None:
        return text
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


# A text id array is sorted as fixed-width numpy strings when that takes at most this many bytes.
TEXT_SORT_MAX_BYTES = 1 << 28


def _check_text_ids(values: list[Any], where: str) -> tuple[np.ndarray, np.ndarray] | None:
    """check_ids for ids that are all str (or all bytes), vectorised: None if they are not, or
    if a fixed-width copy would be too large or lose a trailing NUL (then the general path).

    The type check is one pass of the C-level `map(type, ...)`; order and duplicates come from
    numpy's sort of a fixed-width copy ('U': code points, as Python compares str; 'S': bytes),
    which equals Python's order as long as no id ends in NUL (numpy strips those: checked by
    comparing lengths)."""
    kinds = set(map(type, values))
    if kinds <= {str, np.str_} and kinds:
        dtype = "U"
    elif kinds <= {bytes, np.bytes_} and kinds:
        dtype = "S"
    else:
        return None
    m = len(values)
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=m)
    widest = int(lengths.max()) if m else 0
    if m * max(widest, 1) * (4 if dtype == "U" else 1) > TEXT_SORT_MAX_BYTES:
        return None
    fixed = np.array(values, dtype=f"{dtype}{max(widest, 1)}")
    if not np.array_equal(np.char.str_len(fixed), lengths):
        return None  # an id ends in NUL, which a fixed-width string drops
    return _sorted_text_ids(fixed, where, values if kinds <= {str, bytes} else None)


def _sorted_text_ids(
    fixed: np.ndarray, where: str, values: list[Any] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(ids, key) of fixed-width text ids `fixed` (numpy 'U' or 'S'): order and duplicates from
    numpy's sort. `values`: the same ids as plain str or bytes, returned as they are (else they
    are made plain from `fixed`)."""
    m = len(fixed)
    order = np.argsort(fixed)  # equal ids are refused below: stability is not needed
    ordered = fixed[order]
    same = np.flatnonzero(ordered[1:] == ordered[:-1])
    if len(same):
        a, b = sorted((int(order[same[0]]), int(order[same[0] + 1])))
        raise ValueError(
            f"{where} has duplicate ids, e.g. {fixed[a].item()!r} at indexes {a} and {b}: each "
            "item must appear once"
        )
    key = np.empty(m, dtype=np.int64)
    key[order] = np.arange(m, dtype=np.int64)
    if values is not None:
        out = np.empty(m, dtype=object)
        out[:] = values
    else:  # numpy scalars made plain, as on the general path (no NUL was dropped: checked)
        out = fixed.astype(object)
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


def check_common(k: Any, epsilon: Any, delta: Any) -> None:
    """Refuse bad (k, epsilon, delta) before anything is read or drawn."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"k must be an integer, got {k!r}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real):
        raise TypeError(f"epsilon must be a real number, got {epsilon!r}")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon}")
    if epsilon / k < MIN_ITEM_EPSILON:
        raise ValueError(
            f"epsilon = {epsilon:g} is below the floor k * {MIN_ITEM_EPSILON:g} = "
            f"{k * MIN_ITEM_EPSILON:g}: the noise scale would not be a finite number; nothing "
            "was read or charged"
        )
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real):
        raise TypeError(f"delta must be a real number, got {delta!r}")
    if not (0.0 <= delta < 1.0):
        raise ValueError(f"delta must be in [0, 1), got {delta}")


def check_k_within(k: int, m: int) -> None:
    if m < 1:
        raise ValueError("the source is empty: there is no item to select")
    if k > m:
        raise ValueError(f"k = {k} exceeds the number of items m = {m}")
