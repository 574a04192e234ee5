"""The SQL store engine: a rank-ordered copy of a table of counts, read through a dialect.

What every SQL store shares is written here once; what differs is the dialect's
(adapters/sql/dialect.py). The engine serves the Source protocol (topk_middleware/access.py)
and ScoreRuns, ExactScores and InStoreOneShot from a copy that prepare() builds in the store:

* the copy: a table (rank, id, score) in canonical order (score descending, ties by id in
  byte order), rank 0..m-1, so an item's position is its rank (DESIGN invariant 11), and a
  table of its runs of tied scores (first rank, score) that answers random access by rank
  without rows where scores tie (count data: few runs). Both are *versions*: prepare() builds
  version n + 1 beside version n and records it in the manifest (version, fingerprint of the
  table when its build started, m, runs); a run reads the version that was current when it
  started, so a refresh in the meantime never changes what a run sees (one snapshot,
  invariant 4), and the versions before the previous one are dropped.
* freshness (invariant 14): the dialect's fingerprint of the table (a value that changes with
  every write: docs/writing-a-store.md) is compared at the start of every run with the one the
  current version was built from. Equal: the copy is proven current. Different: the copy is
  rebuilt before the run reads anything (`run_freshness()` says so). `frozen=True` is the
  caller's promise that the table does not change: no fingerprint is read.
* names: the copy's tables are topk_<digest>_..., the digest of the table's resolved
  (namespace, name), so that any spelling of the table finds them; `uninstall()` drops them
  and never the table itself.

Costs (access.StoreCosts) are the dialect's measured record.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from topk_middleware.access import AccessError, Rows, RunTraits, StoreTraits
from topk_middleware.keyed_noise import KeyedNoise, capped_sql
from topk_middleware.privacy import resolve_declared

from .dialect import FLOAT, INTEGER, TEXT, Dialect

KEEP_VERSIONS = 2  # the current version and the one a run in progress may still read

Read = TypeVar("Read", bound=Callable[..., Any])


def in_a_run(read: Read) -> Read:
    """A read outside snapshot() runs in a snapshot of its own (one run of one read)."""

    @functools.wraps(read)
    def wrapped(self: SQLCopyTable, *args: Any) -> Any:
        if self._run is not None:
            return read(self, *args)
        with self.snapshot():
            return read(self, *args)

    return wrapped  # type: ignore[return-value]


@dataclass
class _Version:
    """One built copy, as the manifest records it."""

    number: int
    fingerprint: str
    m: int
    runs: int


@dataclass
class _Run:
    """The version a run reads, pinned at its start."""

    version: _Version
    ranks: str  # qualified rank table
    runs: str  # qualified runs table
    freshness: dict[str, Any]


class SQLCopyTable:
    """A histogram in a SQL table (one row per item: an id column and a count column), read
    through a rank-ordered copy in the same store (module docstring).

    `sensitivity` (default 1) is the most one client adds to or removes from one count, and
    `max_items_per_client` how many counts it changes, both declared by whoever built the
    table. `frozen=True` promises that the table does not change after prepare()."""

    def __init__(
        self,
        dialect: Dialect,
        table: str,
        id: str = "id",
        score: str = "score",
        *,
        namespace: str | None = None,
        frozen: bool = False,
        sensitivity: float | None = None,
        max_items_per_client: int | None = None,
    ) -> None:
        for what, value in (("table", table), ("id", id), ("score", score)):
            if not isinstance(value, str) or not value:
                raise TypeError(f"{what} must be a non-empty string, got {value!r}")
        if not isinstance(frozen, bool):
            raise TypeError(f"frozen must be True or False, got {frozen!r}")
        self.dialect = dialect
        self.namespace, self.table = dialect.resolve(table, namespace)
        self.where = f"{dialect.name} table {self.namespace!r}.{self.table!r}"
        self.id_column, self.score_column = id, score
        self.frozen = frozen
        self.sensitivity, self.max_items_per_client = resolve_declared(
            sensitivity, max_items_per_client, None, self.where
        )
        self._id_kind, self._score_kind = self._check_columns()
        digest = hashlib.sha256(f"{self.namespace}\0{self.table}".encode()).hexdigest()[:12]
        self.prefix = f"topk_{digest}"
        self.manifest_name = f"{self.prefix}_manifest"
        self._run: _Run | None = None
        self.last_freshness: dict[str, Any] | None = None

    # ----- what the store declares (access.StoreTraits, RunTraits) ---------------------------
    def traits(self) -> StoreTraits:
        """access.StoreTraits: the declared sensitivity and bound, the score column's kind,
        the driver's handling of parameters."""
        return StoreTraits(
            self.sensitivity,
            self.max_items_per_client,
            self._score_kind == INTEGER,
            parameters_in_text=self.dialect.parameters_in_text,
        )

    def run_traits(self) -> RunTraits:
        """access.RunTraits: positions are the copy's ranks; the dialect's measured costs."""
        run = self._run
        return RunTraits(
            costs=self.dialect.costs if run is None else self.dialect.costs_for(run.version.m)
        )

    # ----- checks ------------------------------------------------------------------------------
    def _check_columns(self) -> tuple[str, str]:
        """The kinds of the id and score columns, or a refusal in the project's words."""
        columns = self.dialect.columns(self.namespace, self.table)
        if columns is None:
            raise ValueError(f"{self.where} does not exist")
        for role, name in (("id", self.id_column), ("score", self.score_column)):
            if name not in columns:
                raise ValueError(
                    f"{self.where} has no {role} column {name!r} (columns: {list(columns)})"
                )
        id_kind, score_kind = columns[self.id_column], columns[self.score_column]
        if id_kind not in (INTEGER, TEXT):
            raise TypeError(
                f"{self.where} column {self.id_column!r} is {id_kind}: ids must be integers or text"
            )
        if score_kind not in (INTEGER, FLOAT):
            raise TypeError(
                f"{self.where} column {self.score_column!r} is {score_kind}: scores must be numbers"
            )
        return id_kind, score_kind

    def _check_rows(self, ranks: str) -> None:
        """After a build: no NULL, NaN, infinite or negative score, no NULL or repeated id."""
        got = self.dialect.query(
            "SELECT COUNT(*) AS m, COUNT(DISTINCT id) AS ids, "
            "SUM(CASE WHEN id IS NULL THEN 1 ELSE 0 END) AS null_ids, "
            "SUM(CASE WHEN score >= 0 AND score <= 1.7976931348623157e308 THEN 0 ELSE 1 END) "
            f"AS bad FROM {ranks}"
        )
        m, ids, null_ids, bad = (int(got[c][0]) for c in ("m", "ids", "null_ids", "bad"))
        if null_ids:
            raise ValueError(f"{self.where} column {self.id_column!r} has NULL ids")
        if ids != m:
            raise ValueError(
                f"{self.where} column {self.id_column!r} has {m - ids} duplicate ids: one "
                "row per item"
            )
        if bad:
            raise ValueError(
                f"{self.where} column {self.score_column!r} has {bad} NULL, NaN, infinite or "
                "negative score(s): counts must be finite and >= 0"
            )

    # ----- the copy's lifecycle -----------------------------------------------------------------
    def _name(self, what: str, number: int) -> str:
        return self.dialect.qualified(self.namespace, f"{self.prefix}_{what}_{number}")

    def _versions(self) -> list[_Version]:
        manifest = self.dialect.qualified(self.namespace, self.manifest_name)
        if self.manifest_name not in self.dialect.tables_like(self.namespace, self.prefix):
            return []
        got = self.dialect.query(
            f"SELECT version, fingerprint, m, runs FROM {manifest} ORDER BY version"
        )
        return [
            _Version(int(v), str(f), int(m), int(r))
            for v, f, m, r in zip(
                got["version"], got["fingerprint"], got["m"], got["runs"], strict=True
            )
        ]

    def has_rank_table(self) -> bool:
        """Whether prepare() has built a copy of this table."""
        return bool(self._versions())

    def prepare(self, refresh: bool = False) -> None:
        """Build the copy (a new version; the table's fingerprint is read before the build
        starts, so a write during it makes the copy stale, never wrongly current). Without
        `refresh`, a copy already there is kept if it is current."""
        versions = self._versions()
        if versions and not refresh and self._is_current(versions[-1]):
            return
        d = self.dialect
        number = versions[-1].number + 1 if versions else 1
        fingerprint = d.fingerprint(self.namespace, self.table)
        ranks, runs = self._name("rank", number), self._name("runs", number)
        source = d.qualified(self.namespace, self.table)
        d.create_rank_table(ranks, source, d.quote(self.id_column), d.quote(self.score_column))
        try:
            self._check_rows(ranks)
        except BaseException:
            d.drop_table(ranks)
            raise
        d.create_runs_table(runs, ranks)
        m = int(d.query(f"SELECT COUNT(*) AS m FROM {ranks}")["m"][0])
        count = int(d.query(f"SELECT COUNT(*) AS n FROM {runs}")["n"][0])
        d.create_manifest(d.qualified(self.namespace, self.manifest_name))
        d.record_version(
            d.qualified(self.namespace, self.manifest_name), number, fingerprint, m, count
        )
        for old in versions[: max(0, len(versions) + 1 - KEEP_VERSIONS)]:
            d.drop_table(self._name("rank", old.number))
            d.drop_table(self._name("runs", old.number))
            d.forget_version(d.qualified(self.namespace, self.manifest_name), old.number)

    def _is_current(self, version: _Version) -> bool:
        return self.frozen or (
            version.fingerprint == self.dialect.fingerprint(self.namespace, self.table)
        )

    def uninstall(self) -> None:
        """Drop every table prepare() made for this table (never the table itself)."""
        for name in self.dialect.tables_like(self.namespace, self.prefix):
            if name != self.table:
                self.dialect.drop_table(self.dialect.qualified(self.namespace, name))

    unprepare = uninstall

    # ----- runs --------------------------------------------------------------------------------
    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """One run: the current version, proven current by the fingerprint or rebuilt first
        (module docstring); every read of the run goes to that version."""
        if self._run is not None:
            yield  # nested: the outer run holds
            return
        started = time.perf_counter()
        versions = self._versions()
        if not versions:
            raise AccessError(
                f"{self.where} has no rank-ordered copy: call prepare() once (it builds the "
                "copy in the store)"
            )
        latest = versions[-1]
        if self.frozen:
            freshness: dict[str, Any] = {"copy": "frozen"}
        elif self._is_current(latest):
            freshness = {"copy": "current", "proof": "fingerprint"}
        else:
            self.prepare(refresh=True)
            latest = self._versions()[-1]
            freshness = {
                "copy": "stale",
                "why": "written",
                "read": "refreshed copy",
                "refresh_seconds": time.perf_counter() - started,
            }
        n = latest.number
        self._run = _Run(latest, self._name("rank", n), self._name("runs", n), freshness)
        self.last_freshness = freshness
        try:
            yield
        finally:
            self._run = None

    def _state(self) -> _Run:
        assert self._run is not None  # every read runs in a snapshot (in_a_run)
        return self._run

    def run_freshness(self) -> dict[str, Any] | None:
        """access.RunFreshness: how the run in progress knew its copy current."""
        return None if self._run is None else dict(self._run.freshness)

    # ----- the Source protocol -----------------------------------------------------------------
    @in_a_run
    def domain_size(self) -> int:
        return self._state().version.m

    @in_a_run
    def read_sorted(self, start: int, count: int) -> Rows:
        run = self._state()
        start, stop = max(0, int(start)), max(0, int(start) + int(count))
        got = self.dialect.query(
            f"SELECT rank, id, score FROM {run.ranks} WHERE rank >= {start} AND rank < {stop} "
            "ORDER BY rank"
        )
        return self._rows(got)

    @in_a_run
    def read_positions(self, positions: np.ndarray) -> Rows:
        run = self._state()
        wanted = np.asarray(positions, dtype=np.int64)
        if len(wanted) == 0:
            return Rows(np.empty(0, np.int64), np.empty(0, object), np.empty(0, np.float64))
        if wanted.min() < 0 or wanted.max() >= run.version.m:
            raise AccessError(f"positions must be in [0, {run.version.m})")
        got = self._rows(
            self.dialect.query(
                f"SELECT rank, id, score FROM {run.ranks} "
                f"WHERE rank IN {self.dialect.in_array('positions', INTEGER)}",
                {"positions": np.unique(wanted).tolist()},
            )
        )
        order = np.argsort(got.positions, kind="stable")  # rows come in the store's order
        if not np.array_equal(got.positions[order], np.unique(wanted)):
            raise AccessError(f"{self.where}: the copy lacks ranks it should hold")
        at = order[np.searchsorted(got.positions[order], wanted)]
        return Rows(wanted, got.ids[at], got.scores[at])

    def _by_id(self, ids: Sequence[Any], exact: bool) -> list[Any]:
        run = self._state()
        asked = [self._id_value(i) for i in ids]
        if not asked:
            return []
        score = "score" if exact else self.dialect.double("score")
        got = self.dialect.query(
            f"SELECT id, {score} AS score FROM {run.ranks} "
            f"WHERE id IN {self.dialect.in_array('ids', self._id_kind)}",
            {"ids": sorted(set(asked))},
        )
        found = dict(zip(got["id"].tolist(), got["score"].tolist(), strict=True))
        for item in asked:
            if item not in found:
                raise AccessError(f"{self.where} has no item with id {item!r}")
        return [found[item] for item in asked]

    @in_a_run
    def read_ids(self, ids: Sequence[Any]) -> np.ndarray:
        return np.asarray(self._by_id(ids, exact=False), dtype=np.float64)

    @in_a_run
    def read_exact_scores(self, ids: Sequence[Any]) -> list[Any]:
        """access.ExactScores: the counts as the store holds them (integers stay integers)."""
        return self._by_id(ids, exact=True)

    def _id_value(self, item: Any) -> Any:
        """An id as the column holds it; a wrong kind is refused before anything is read."""
        if isinstance(item, np.generic):
            item = item.item()
        if self._id_kind == INTEGER and not isinstance(item, bool) and isinstance(item, int):
            return item
        if self._id_kind == TEXT and isinstance(item, str):
            return item
        raise AccessError(f"{self.where} has no item with id {item!r}")

    # ----- runs of tied scores (access.ScoreRuns) --------------------------------------------
    @in_a_run
    def score_run_count(self) -> int | None:
        return self._state().version.runs

    @in_a_run
    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        run = self._state()
        got = self.dialect.query(
            f"SELECT first, {self.dialect.double('score')} AS score FROM {run.runs} ORDER BY first"
        )
        return np.asarray(got["first"], np.int64), np.asarray(got["score"], np.float64)

    # ----- the in-store one-shot (access.InStoreOneShot) -------------------------------------
    @in_a_run
    def read_oneshot(self, noise: KeyedNoise, k: int) -> Rows | None:
        """The k rows of largest min(score, cap) + keyed noise over the copy, best first, ties
        by smaller rank, in one statement (keyed_noise.py; the dialect's oneshot_sql). The key
        and the exceedances are parameters, never statement text (k, public, may be a
        literal); None where the dialect cannot keep them out of it."""
        if not self.dialect.supports_in_store_oneshot or self.dialect.parameters_in_text:
            return None
        run = self._state()
        d = self.dialect
        sql = d.oneshot_sql(
            run.ranks,
            noise.sql(d.keyed_uniform("key", "r.rank")),
            capped_sql(d.double("r.score"), noise.score_cap),
            noise.bound,
            int(k),
        )
        got = d.query(
            sql,
            {
                "key": noise.key,
                "positions": noise.exceed_positions.tolist(),
                "noises": noise.exceed_noises.tolist(),
            },
        )
        return self._rows(got)

    def _rows(self, got: dict[str, np.ndarray]) -> Rows:
        ids = np.asarray(got["id"]).astype(object) if self._id_kind == TEXT else got["id"]
        return Rows(
            np.asarray(got["rank"], np.int64),
            np.asarray(ids, dtype=object if self._id_kind == TEXT else np.int64),
            np.asarray(got["score"], np.float64),
        )

    def close(self) -> None:
        """Nothing to release: the dialect holds the connection (its owner closes it)."""
