"""The fingerprint of a DuckDB copy: what the rank table's comment records, and its check.

The fingerprint. DuckDB has no lasting table identity (catalog oids are handed out again when a
database is reopened: a re-created table can get its predecessor's), so the fingerprint
prepare() writes on the rank table (its comment: FINGERPRINT_TAG and JSON) holds what a run can
check cheaply: a new build mark, a hash of the table's definition (its CREATE statement) and,
for a table (not a view), its row count; the counts of the base and of its runs, and its first
HEAD_ROWS rows (the planner's probe, served without a read; every row where the copy has at
most WHOLE_HEAD_ROWS). Each run checks it in its first
query, one plain scan of the catalog's tables (the delta's sizes come with it, in the delta
table's comment). Once this object built or verified the copy, the table's oid in this open
database proves it is the same table: a re-created one is refused, and rows written since are
the copy's contract (not seen until a refresh). Before that, a row count other than the recorded
one is refused (a stale copy cannot be told from another table's). What a run cannot see: a
table re-created with the same definition and row count in another process or before a reopen,
and score updates since the last prepare() or refresh (the copy's contract). prepare() closes
the first gap: unless this object built or verified the copy, it compares the copy with the
table (one scan) and rebuilds it if they differ.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from adapters._sql import FINGERPRINT_TAG, RankTableMismatchError
from topk_middleware.access import Rows
from topk_middleware.planner import PROBE_ROWS

from . import rows_of

# The fingerprint holds the copy's first rows (the planner's probe: a frozen run serves them from
# its catalog scan instead of a range read of the copy, ~0.4 ms at m = 10^7), where the ids are
# integers or text of at most HEAD_TEXT_MAX characters in all.
HEAD_ROWS = PROBE_ROWS
HEAD_TEXT_MAX = 1 << 14
# A copy of at most this many rows is held whole in its fingerprint: a frozen run then has its
# rows from its one catalog scan and releases in memory (one statement, where a range read of
# the copy was a second: about 0.5 ms at 10^3 rows). The comment grows by about 20 bytes a row,
# which every catalog scan returns (32 KB at most, about 10 us more a scan, measured).
WHOLE_HEAD_ROWS = 1_500
# Why a rank table does not fit its table (the fingerprint's verdicts that callers act on).
NOT_BUILT = "prepare() did not build it"
ROWS_DIFFER = "it was built from"


@dataclass(frozen=True)
class Mark:
    """A rank table's comment, parsed: the fingerprint prepare() wrote (None: not one), the
    counts of the base and of its runs (None where it was written before it recorded them),
    and the base's first rows (None where it holds none)."""

    stored: str | None
    recorded: dict[str, Any] | None = None
    counts: tuple[int, int] | None = None
    head: Rows | None = None


def parse_mark(stored: str | None) -> Mark:
    """The fingerprint in a rank table's comment (DuckDBCopy._stamp)."""
    if stored is None or not stored.startswith(FINGERPRINT_TAG + " "):
        return Mark(stored)
    try:
        recorded = json.loads(stored[len(FINGERPRINT_TAG) + 1 :])
    except ValueError:
        return Mark(stored)
    if not isinstance(recorded, dict):
        return Mark(stored)
    try:
        counts: tuple[int, int] | None = (int(recorded["base"]), int(recorded["runs"]))
    except (KeyError, TypeError, ValueError):
        counts = None
    return Mark(stored, recorded, counts, head_rows(recorded.get("head")))


def head_rows(head: Any) -> Rows | None:
    """The base's first rows as the fingerprint holds them (DuckDBCopy._head_of), as a range
    read of the rank table would give them; None where they are missing or malformed."""
    try:
        ids, scores, dtype = head["ids"], head["scores"], head["dtype"]
        if len(ids) != len(scores):
            return None
        if dtype == "text":
            if not all(type(v) is str for v in ids):
                return None
            id_array = np.empty(len(ids), dtype=object)
            id_array[:] = ids
        else:
            kind = np.dtype(dtype)
            if kind.kind not in "iu":
                return None
            id_array = np.asarray(ids, dtype=kind)
        values = np.asarray(scores, dtype=np.float64)
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    id_array.setflags(write=False)
    values.setflags(write=False)
    return Rows(np.arange(len(ids), dtype=np.int64), id_array, values, round_trips=0)


def fingerprint_of(ddl: str | None, rows: int | None) -> dict[str, Any]:
    """The table's part of the fingerprint: a digest of its definition, its row count."""
    digest = hashlib.sha1((ddl or "").encode("utf-8")).hexdigest()[:16]
    return {"definition": digest, "rows": None if rows is None else int(rows)}


class Fingerprints:
    """The fingerprint checks of one copy (module docstring), the last comment parsed kept."""

    def __init__(self, t: Any) -> None:
        self.t = t
        self._mark = Mark(None)

    def mark_of(self, stored: str | None) -> Mark:
        """The rank table's comment parsed, kept while the comment stays the same."""
        if self._mark.stored != stored or stored is None:
            self._mark = parse_mark(stored)
        return self._mark

    def mismatch(self, stored: str | None, ddl: str | None, rows: int | None) -> str | None:
        """Why the stored fingerprint does not fit the table (None when it fits): not built by
        prepare(), another definition, or (checked by the caller where it matters) another row
        count."""
        recorded = self.mark_of(stored).recorded
        if recorded is None:
            return NOT_BUILT
        current = fingerprint_of(ddl, rows)
        if recorded.get("definition") != current["definition"]:
            return "the table's definition changed, or it is an earlier table of this name"
        if current["rows"] is not None and recorded.get("rows") != current["rows"]:
            return (
                f"{ROWS_DIFFER} {recorded.get('rows')} rows and the table has {current['rows']}: "
                "rows were added or removed since, or the table was re-created"
            )
        return None

    def check(
        self,
        stored: str | None,
        oid: int | None,
        ddl: str | None,
        rows: int | None,
        proven_oid: int | None,
    ) -> None:
        """Raise RankTableMismatchError unless the rank table fits the table (module
        docstring): once proven (`proven_oid`), the mark and the oid; before, the record."""
        if proven_oid is not None:
            why = NOT_BUILT if self.mark_of(stored).recorded is None else None
            if why is None and oid != proven_oid:
                why = "the table was dropped and re-created since this object's prepare()"
        else:
            why = self.mismatch(stored, ddl, rows)
            if why is not None and why.startswith(ROWS_DIFFER):
                why += "; call prepare() to compare the copy with the table"
        if why is not None:
            raise RankTableMismatchError(
                f"{self.t.where}: the rank table {self.t.rank_table!r} does not belong to this "
                f"table ({why}): call prepare(refresh=True)"
            )

    def text(self, ddl: str | None, rows: int | None, base: int, runs: int, head: Any) -> str:
        """The comment prepare() writes: the tag, then the record as JSON with a new build
        mark, the counts of the base and of its runs, and its first rows where they fit."""
        mark = {**fingerprint_of(ddl, rows), "build": uuid.uuid4().hex, "base": base, "runs": runs}
        if head is not None:
            mark["head"] = head
        return FINGERPRINT_TAG + " " + json.dumps(mark, sort_keys=True)


def head_of(driver: Any, ranks: str, base: int = 0) -> dict[str, Any] | None:
    """The base's first rows for the fingerprint: all of its `base` rows where they are at most
    WHOLE_HEAD_ROWS, else the first HEAD_ROWS (also where the whole base's text ids are too
    long); {"dtype", "ids", "scores"} (ranks 0, 1, ...), or None where the ids are neither
    integers nor text, or too long."""
    if HEAD_ROWS < base <= WHOLE_HEAD_ROWS:
        whole = _first_rows(driver, ranks, base)
        if whole is not None:
            return whole
    return _first_rows(driver, ranks, HEAD_ROWS)


def _first_rows(driver: Any, ranks: str, limit: int) -> dict[str, Any] | None:
    """The copy's rows of rank below `limit` as head_of() keeps them (None: not kept)."""
    got = rows_of(
        driver.arrays(
            f"SELECT rank, id, score FROM {ranks} WHERE rank < {int(limit)} ORDER BY rank"
        )
    )
    if not np.array_equal(got.positions, np.arange(len(got))):
        return None
    ids = got.ids
    if ids.dtype.kind in "iu":
        dtype = ids.dtype.str
    elif ids.dtype == object and all(type(v) is str for v in ids.tolist()):
        if sum(len(v) for v in ids.tolist()) > HEAD_TEXT_MAX:
            return None
        dtype = "text"
    else:
        return None
    return {"dtype": dtype, "ids": ids.tolist(), "scores": got.scores.tolist()}


__all__ = [
    "HEAD_ROWS",
    "NOT_BUILT",
    "ROWS_DIFFER",
    "WHOLE_HEAD_ROWS",
    "Fingerprints",
    "Mark",
    "head_of",
    "parse_mark",
]
