"""Pieces shared by the SQL adapters (DuckDB, PostgreSQL): validation messages, the access check,
the name of the rank table, and turning result rows into `Rows`.

Every SQL adapter serves the canonical order of topk_middleware/access.py (score descending, ties
by id ascending, text ids in byte order) from a *rank table* (rank, id, score) that `prepare()`
builds: rank is the 0-based position in that order, so sorted access at depth t and uniform item
sampling (a uniform rank) are both reads by rank.
"""

from __future__ import annotations

import functools
import hashlib
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from topk_middleware.access import AccessError, Rows

# The first word of a rank table's fingerprint: its format, and the mark of prepare() (a table of
# that name that lacks it was not built by prepare()).
FINGERPRINT_TAG = "topk-rank-v1"

# PostgreSQL truncates identifiers to 63 bytes; DuckDB has no limit, but one rule keeps both alike.
MAX_IDENTIFIER_BYTES = 63


def sql_name_spellings(
    table: str, schema: str | None, fold: Any = str.lower
) -> list[tuple[str | None, str]]:
    """The (schema, table) pairs a table name may mean, in the order a store looks them up: the
    names exactly as given, then `schema.table` (or `table`) read as SQL writes a name (parts
    split at dots outside double quotes, a quoted part taken exactly with "" for ", an unquoted
    part folded by `fold`: lower case on PostgreSQL). So `t`, `T`, `public.t` and `"public"."t"`
    all find the table t in schema public, and the adapter derives every object name from the
    one spelling the catalog holds."""
    spellings: list[tuple[str | None, str]] = [(schema, table)]
    written = table if schema is None else f"{schema}.{table}"
    parts: list[str] = []
    i, n = 0, len(written)
    while i <= n:
        if i < n and written[i] == '"':  # a quoted part up to its closing quote
            part, i = [], i + 1
            while True:
                end = written.find('"', i)
                if end < 0:
                    return spellings  # an unclosed quote: not a SQL name
                part.append(written[i:end])
                if written[end + 1 : end + 2] == '"':  # "" inside quotes: one "
                    part.append('"')
                    i = end + 2
                    continue
                i = end + 1
                break
            parts.append("".join(part))
        else:
            end = written.find(".", i)
            end = n if end < 0 else end
            word = written[i:end]
            if not word or '"' in word:
                return spellings
            parts.append(fold(word))
            i = end
        if i < n and written[i] != ".":
            return spellings  # text after a closing quote
        i += 1
    if len(parts) == 1:
        spellings.append((None, parts[0]))
    elif len(parts) == 2:
        spellings.append((parts[0], parts[1]))
    return [pair for j, pair in enumerate(spellings) if pair not in spellings[:j]]


# An oblivious run's first statement on PostgreSQL where its role may set track_counts: its
# reads then stay out of the statistics views any role reads (docs/oblivious.md).
HIDE_STATISTICS = "SET LOCAL track_counts = off"


def may_hide_statistics_sql(server_version: int) -> str:
    """The query of whether a PostgreSQL connection's role may set track_counts: a superuser, or
    (PostgreSQL 15 and later, server_version as PG_VERSION_NUM) a role granted SET on it; its
    second column is the role's name as an identifier (quote_ident: what a GRANT names)."""
    query = "SELECT current_setting('is_superuser') = 'on'"
    if server_version >= 150000:
        query += " OR has_parameter_privilege('track_counts', 'SET')"
    return query + ", quote_ident(current_user)"


def statistics_seen(where: str, role: str) -> str:
    """StoreTraits.oblivious_reads_seen of a PostgreSQL table read by `role`, which may not set
    track_counts: what another role would learn, and what closes the channel (one line)."""
    return (
        f"{where}: this connection's role {role} may not set track_counts, so the blocks an "
        "oblivious run reads would show in pg_statio_user_tables, which every role of the server "
        "reads; they follow the table's layout (a write not yet vacuumed, an index page split, "
        "which VACUUM does not undo, long text ids), so another role could tell neighbouring "
        f"tables apart by them. Close the channel with GRANT SET ON PARAMETER track_counts TO "
        f"{role} (run by a superuser; PostgreSQL 15 and later), or release through the SQL "
        "functions (install-sql); an operator who accepts the channel sets "
        "accept_statistics_channel = True on the table, and each such run then warns "
        "(docs/promise.md)"
    )


def statistics_accepted(where: str, role: str) -> str:
    """The warning of an oblivious run whose store accepts the statistics channel
    (accept_statistics_channel) for a role that may not set track_counts."""
    return (
        f"{where}: accept_statistics_channel is set and this connection's role {role} may not "
        "set track_counts, so pg_statio_user_tables, which every role reads, shows the blocks "
        "oblivious runs read; they follow the table's layout, so another role can tell "
        f"neighbouring tables apart by them; GRANT SET ON PARAMETER track_counts TO {role} "
        "closes the channel (docs/promise.md)"
    )


class StatisticsChannel:
    """access.ObliviousReads of a source that writes its own statements (IbisTable, the live
    mode of SQLAlchemyTable): runs opened inside `oblivious_reads()` are oblivious
    (`_oblivious`, which the source's reads ask); where the operator accepted the statistics
    channel and it is open (`_oblivious_reads_seen`, the source's), a warning, once per source."""

    # The operator accepts that another role sees the blocks oblivious runs read where the
    # role may not set track_counts: they run and warn instead of being refused
    # (StoreTraits.oblivious_reads_seen; docs/promise.md).
    accept_statistics_channel: bool = False
    _oblivious = False  # inside oblivious_reads()
    _warned_statistics = False  # oblivious_reads() said the channel is open

    def _oblivious_reads_seen(self, accepted: bool = False) -> str | None:
        """StoreTraits.oblivious_reads_seen (the warning's words where the operator `accepted`
        the channel); None where no other role sees the blocks a run reads."""
        return None

    @contextmanager
    def oblivious_reads(self) -> Iterator[None]:
        if self.accept_statistics_channel and not self._warned_statistics:
            seen = self._oblivious_reads_seen(accepted=True)
            if seen is not None:
                self._warned_statistics = True
                warnings.warn(seen, stacklevel=3)
        saved, self._oblivious = self._oblivious, True
        try:
            yield
        finally:
            self._oblivious = saved


@functools.lru_cache(maxsize=1024)
def rank_table_name(table: str, id_column: str, score_column: str) -> str:
    """The default name of the rank table of `table` ordered by (score_column, id_column).

    A short hash of the three names keeps rank tables of different columns apart and the name
    within PostgreSQL's 63-byte limit. Kept per names (a run asks for it and the names built
    on it about ten times a run: about 1 us each, 0.1 us kept).
    """
    digest = hashlib.sha1(
        "\x00".join((table, id_column, score_column)).encode("utf-8")
    ).hexdigest()[:10]
    suffix = f"__topk_rank_{digest}"
    head = table.encode("utf-8")[: MAX_IDENTIFIER_BYTES - len(suffix)].decode("utf-8", "ignore")
    return head + suffix


class RankTableMismatchError(RuntimeError):
    """The rank table does not provably belong to the current table: prepare() did not build
    it, or it was built from an earlier table of that name (see each adapter's prepare())."""


@dataclass(frozen=True)
class TableFacts:
    """What one validation pass over a table of per-item counts found."""

    rows: int
    null_ids: int
    distinct_ids: int
    null_scores: int
    non_finite_scores: int
    negative_scores: int


def raise_if_invalid(
    facts: TableFacts, where: str, id_column: str, score_column: str, duplicate: Any = None
) -> None:
    """Refuse a table that is not a valid histogram, naming the table and the column at fault."""
    if facts.rows == 0:
        raise ValueError(f"{where} is empty: there is no item to select")
    if facts.null_ids:
        raise ValueError(f"{where} column {id_column!r} has {facts.null_ids} NULL id(s)")
    if facts.distinct_ids != facts.rows:
        example = "" if duplicate is None else f", e.g. {duplicate!r}"
        raise ValueError(
            f"{where} column {id_column!r} has duplicate ids ({facts.rows - facts.distinct_ids} "
            f"extra row(s){example}): each item must appear once"
        )
    if facts.null_scores:
        raise ValueError(f"{where} column {score_column!r} has {facts.null_scores} NULL score(s)")
    if facts.non_finite_scores:
        raise ValueError(
            f"{where} column {score_column!r} has {facts.non_finite_scores} NaN or infinite "
            "score(s)"
        )
    if facts.negative_scores:
        raise ValueError(
            f"{where} column {score_column!r} has {facts.negative_scores} negative score(s)"
        )


@dataclass(frozen=True)
class AccessPath:
    """How one kind of access will be served: by an index / ordered range, or by a full scan."""

    access: str  # "sorted", "random by rank", "random by id"
    full_scan: bool
    how: str


@dataclass(frozen=True)
class AccessCheck:
    """The answer of `check()`: how each access kind will be served, before a run."""

    store: str
    paths: list[AccessPath] = field(default_factory=list)

    @property
    def full_scan(self) -> bool:
        """True when sorted access or random access by rank (what the threshold algorithm uses)
        would read the whole table."""
        return any(p.full_scan for p in self.paths if p.access != "random by id")

    def __str__(self) -> str:
        lines = [f"access plan for {self.store}:"]
        for p in self.paths:
            verdict = "FULL SCAN" if p.full_scan else "ok"
            lines.append(f"  {p.access:<15} {verdict:<9} {p.how}")
        return "\n".join(lines)


def plain_values(values: Sequence[Any] | np.ndarray) -> list[Any]:
    """Python scalars (numpy scalars converted) for use as query parameters."""
    if isinstance(values, np.ndarray):
        return values.tolist()
    return [v.item() if isinstance(v, np.generic) else v for v in values]


def tid_array_literal(slots: np.ndarray, per_page: int) -> str:
    """PostgreSQL's text form of the tid[] naming heap slots (slot = block * per_page + offset
    - 1), one query parameter: built in one join, where the driver's list adapter would quote
    each element on its own (a third of a one-shot release's time on the table)."""
    blocks, offsets = np.divmod(np.asarray(slots, dtype=np.int64), int(per_page))
    pairs = zip(blocks.tolist(), (offsets + 1).tolist(), strict=True)
    return "{" + ",".join(f'"({b},{o})"' for b, o in pairs) + "}"


def int_array_literal(values: np.ndarray | Sequence[int]) -> str:
    """PostgreSQL's text form of a bigint[], one query parameter (as tid_array_literal)."""
    return "{" + ",".join(map(str, np.asarray(values, dtype=np.int64).tolist())) + "}"


def float_array_literal(values: np.ndarray | Sequence[float]) -> str:
    """PostgreSQL's text form of a float8[]: each value's shortest repr, which float8 input
    reads back to the same double."""
    return "{" + ",".join(map(repr, np.asarray(values, dtype=np.float64).tolist())) + "}"


def id_array(values: Sequence[Any]) -> np.ndarray:
    """Item ids as a numpy array: int64 for integer ids, object for anything else (text)."""
    values = list(values)
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        try:
            return np.asarray(values, dtype=np.int64)
        except OverflowError:
            pass
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def rows_from_records(records: Sequence[tuple[Any, Any, Any]]) -> Rows:
    """(rank, id, score) records as parallel arrays."""
    if not records:
        return Rows(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64))
    ranks, ids, scores = zip(*records, strict=True)
    return Rows(
        np.asarray(ranks, dtype=np.int64), id_array(ids), np.asarray(scores, dtype=np.float64)
    )


def scores_in_order(found: dict[Any, float], ids: Sequence[Any], where: str) -> np.ndarray:
    """The scores of `ids` in the order given; an id the store did not return is an error."""
    try:
        return np.asarray([found[item] for item in ids], dtype=np.float64)
    except KeyError as missing:
        raise AccessError(f"{where} has no item with id {missing.args[0]!r}") from None
