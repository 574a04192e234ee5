"""The SQL store engine: a table of counts read through a rank-ordered copy in the same store.

What every SQL store shares is written here once; how a statement reaches the store is the
driver's (driver.py), what its SQL looks like the dialect's (dialect.py). `SQLTable` serves the
Source protocol (topk_middleware/access.py) with ScoreRuns, ExactScores and InStoreOneShot:

* the copy: a table (rank, id, score) in canonical order (score descending, ties by id in byte
  order), rank 0..m-1, so an item's position is its rank (DESIGN invariant 11), and a table of
  its runs of tied scores that answers random access by rank without rows where scores tie
  (count data: few runs). Where the copy lives, how a refresh replaces it while runs in
  progress keep reading the old one (one snapshot, invariant 4) and where its record is kept is
  the copy's layout (copies.py): tables under fixed names swapped at the end of a refresh,
  or numbered versions listed in a manifest.
* freshness (invariant 14): unless `frozen=True` (the caller's promise that the table does not
  change), a run serves the copy only where it is proven current when the run opens
  (freshness.py: a write log kept by triggers, or a catalog fingerprint compared); otherwise it
  reads the table itself (table_read.py, where the dialect can), reads the copy around the
  changes (around.py), or has the copy rebuilt first, whichever is priced cheaper
  (`_stale_run`); `run_freshness()` says which and why.
* the in-store one-shot (keyed_noise.py) over the copy in one statement, the key and the
  exceedances bound by the driver, never statement text (off where the driver writes
  parameters into the text: StoreTraits.parameters_in_text).
* refusals in the project's words, before anything is read (`_refuse_columns`, `validate`).
* a store's own reads: where a dialect has a better way to serve a run (row id ranges of its
  copy, a delta beside it, its table read by row id), the copy's layout or the dialect's
  `table_reads` hands the run a `Reads` strategy, which the engine asks before its own reads.

Costs (access.StoreCosts) are the dialect's measured record.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from adapters._sql import RankTableMismatchError, plain_values, rows_from_records
from adapters.contributions import parse_record
from topk_middleware.access import AccessError, Rows, RunTraits, StoreCosts, StoreTraits
from topk_middleware.keyed_noise import KeyedNoise
from topk_middleware.privacy import resolve_declared

from .checks import check_copy, is_stale, refuse_columns, validate
from .dialect import FLOAT, INTEGER, TEXT, Dialect
from .driver import Driver
from .whole import WholeReads, alone_run

REFRESH_TRIES = 3  # a run that has its copy rebuilt first tries this often


class Reads(Protocol):
    """A run's reads served the store's own way (module docstring); `m`, its domain size."""

    m: int

    def traits(self) -> RunTraits: ...
    def read_sorted(self, start: int, stop: int) -> Rows: ...
    def read_positions(self, positions: np.ndarray) -> Rows: ...
    def read_ids(self, ids: list[Any]) -> np.ndarray: ...
    def read_oneshot(self, noise: KeyedNoise, k: int) -> Rows: ...
    def oneshot_positions(self) -> int: ...
    def read_exact_scores(self, ids: list[Any]) -> list[Any] | None: ...  # None: not in hand


class Refresh(Exception):
    """Raised while a run opens: rebuild the copy outside its transaction, then open it again."""


@dataclass
class Run:
    """What a run reads, fixed when it opens (the run's snapshot)."""

    read: str  # "copy", "table", "table by rank", "around"
    m: int
    ranks: str | None = None  # the copy's rank table (qualified)
    runs: str | None = None  # its runs table (None: none, or not asked)
    run_count: int | None = None  # runs of tied scores
    freshness: dict[str, Any] = field(default_factory=dict)
    table: Any = None  # table_read.TableState of a run that reads the table
    around: Any = None  # around.AroundState of a run that reads the copy around changes
    record: str | None = None  # the copy's stored record, as the run's first query read it
    why: str | None = None  # why the copy is not proven current (None: it is, or is frozen)
    reads: Reads | None = None  # the store's own reads of this run, asked first
    probed: bool = False  # an oblivious read probed the copy's layout (oblivious.py)
    rows_per_page: int | None = None  # what it found: rows a heap page, where ranks are fixed


class SQLTable:
    """A histogram in a SQL table (one row per item: an id column and a count column), read
    through a rank-ordered copy in the same store (module docstring).

    `driver` and `dialect` are the store's (driver.py, dialect.py); `layout` makes the copy's
    layout (copies.py) and `proof` the freshness proof (freshness.py) for this table, the
    dialect's defaults where None. `sensitivity` and `max_items_per_client` are declared by
    whoever built the table (else what from_votes recorded with it, else (1, None));
    `frozen=True` promises that the table does not change after prepare()."""

    reads_copy = True  # runs read the rank-ordered copy where it is current
    accept_statistics_channel = False  # oblivious reads another role sees: run, warn (promise.md)
    counts_query = False  # counts of a query: never read by a run (a stale copy is rebuilt)

    def __init__(
        self,
        driver: Driver,
        dialect: Dialect,
        table: str,
        id: str = "id",
        score: str = "score",
        *,
        namespace: str | None = None,
        frozen: bool = False,
        sensitivity: float | None = None,
        max_items_per_client: int | None = None,
        where: str | None = None,
        layout: Any = None,
        proof: Any = None,
    ) -> None:
        for what, value in (("table", table), ("id", id), ("score", score)):
            if not isinstance(value, str) or not value:
                raise TypeError(f"{what} must be a non-empty string, got {value!r}")
        if not isinstance(frozen, bool):
            raise TypeError(f"frozen must be True or False, got {frozen!r}")
        resolve_declared(sensitivity, max_items_per_client, None, f"{dialect.name} table")
        self.driver, self.dialect, self.frozen = driver, dialect, frozen
        self.id_column, self.score_column = id, score
        self.id_sql, self.score_sql = dialect.quote(id), dialect.quote(score)
        self.describe(table, namespace, where, sensitivity, max_items_per_client)
        self.text_ids = self.id_info.kind == TEXT
        self.integer_ids = self.id_info.kind == INTEGER
        self.integer_scores = self.score_info.integer
        if not dialect.supports_in_store_oneshot or not driver.binds_on_server:
            self.read_oneshot = None  # type: ignore[assignment,method-assign]  # not offered
        self.copies = (layout or dialect.layout)(self)
        self.proof = (proof or dialect.proof)(self)
        self._run: Run | None = None
        self._oblivious = False  # inside oblivious_reads()
        self.last_m: int | None = None  # the size a run last saw (whole.py)
        self.last_freshness: dict[str, Any] | None = None

    def describe(self, table: str, namespace: Any, where: Any, *declared: Any) -> None:
        """The counts: where (namespace, table; `source`: a FROM item), their columns (refused
        where wrong), their bounds: declared, else from_votes' record there, else (1, None)."""
        d = self.dialect
        self.namespace, self.table = d.resolve(self.driver, table, namespace)
        self.where = w = where or f"{d.name} table {self.namespace!r}.{self.table!r}"
        self.source = d.qualified(self.namespace, self.table)
        self.id_info, self.score_info = refuse_columns(self)
        record = parse_record(d.comment(self.driver, self.namespace, self.table))
        self.sensitivity, self.max_items_per_client = resolve_declared(*declared, record, w)

    def source_as(self, alias: str) -> str:
        """The counts as a FROM item named `alias`."""
        return f"{self.source} AS {alias}"

    # ----- what the store declares (access.StoreTraits, RunTraits) ---------------------------
    def traits(self) -> StoreTraits:
        """access.StoreTraits, asked first by a release (a lost connection reopened here)."""
        self.driver.ensure()
        return StoreTraits(
            self.sensitivity,
            self.max_items_per_client,
            self.integer_scores,
            parameters_in_text=not self.driver.binds_on_server,
            oblivious_reads_seen=self.dialect.oblivious_reads_seen(
                self.driver, self.where, self.accept_statistics_channel
            ),
        )

    def run_traits(self) -> RunTraits:
        """access.RunTraits: positions are ranks; the costs of what the run reads (its own)."""
        run = self._run
        if run is not None and run.reads is not None:
            return run.reads.traits()
        return RunTraits(costs=self.store_costs, oblivious_costs=self.oblivious_costs)

    @property
    def store_costs(self) -> StoreCosts:
        """The copy's costs, or those of what the run reads instead (table_read.py, around.py)."""
        run = self._run
        if run is None:
            return self.dialect.costs
        if run.read == "copy":
            return self.dialect.costs_for(run.m)
        return self.dialect.stale_costs(run)

    @property
    def oblivious_costs(self) -> Any:
        """The oblivious release's model of the run in progress (the dialect's)."""
        run = self._run
        return self.dialect.oblivious_costs(run is not None and run.read != "copy")

    # ----- checks (checks.py) ----------------------------------------------------------------
    def validate(self) -> int:
        """Check every row (checks.validate); returns m."""
        return validate(self)

    def check_copy(self, ranks: str) -> None:
        """A copy just built is a valid histogram (checks.check_copy)."""
        check_copy(self, ranks)

    def order_sql(self) -> str:
        """The canonical order: score descending, ties by id ascending in byte order."""
        key = self.dialect.byte_order(self.id_sql) if self.text_ids else self.id_sql
        return f"{self.score_sql} DESC, {key} ASC"

    def canonical_rows(self, raw_scores: bool = False) -> str:
        """SELECT (rank, id, score) of the table in canonical order, scores as doubles (or raw)."""
        score = self.score_sql if raw_scores else self.dialect.double(self.score_sql)
        return (
            f"SELECT row_number() OVER (ORDER BY {self.order_sql()}) - 1 AS rank, "
            f"{self.id_sql} AS id, {score} AS score FROM {self.source}"
        )

    # ----- the copy's lifecycle (copies.py, freshness.py) -------------------------------------
    def has_rank_table(self) -> bool:
        """Whether prepare() has built a copy of this table."""
        return self.copies.exists()

    def prepare(self, refresh: bool = False, **options: Any) -> None:
        """Build the copy if it is missing, or not current, or with `refresh=True` (copies.py);
        install the freshness proof first (freshness.py). Options are the layout's (a
        statement_timeout, a swap_timeout)."""
        if self._run is not None:
            raise RuntimeError("prepare() cannot run inside snapshot()")
        self.driver.ensure()
        self.copies.prepare(refresh, **options)
        self.last_freshness = None  # the copy may be current now: a run proves it (whole.py)

    def uninstall(self) -> None:
        """Drop everything prepare() made for this table (never the table itself)."""
        if self._run is not None:
            raise RuntimeError("uninstall() cannot run inside snapshot()")
        self.driver.ensure()
        self.copies.uninstall()

    unprepare = uninstall

    def verify_rank_table(self) -> None:
        """Raise RankTableMismatchError unless the copy provably belongs to this table."""
        with self.driver.transaction():
            opened = self.copies.open(strict=True)
        if opened is None:
            raise RankTableMismatchError(f"{self.where} has no copy: call prepare()")

    # ----- runs --------------------------------------------------------------------------------
    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """One run: one transaction in the dialect's snapshot isolation (read-only), whose first
        query opens the run (`_open_run`). A copy that is to be rebuilt first is rebuilt outside
        it and the run opens again; a copy swapped in while the snapshot was taken is looked
        for once more; a connection it owns, lost before the run read anything, reopens once."""
        if self._run is not None:  # nested: the outer run holds
            yield
            return
        self.driver.ensure()
        if self.driver.in_transaction:
            raise RuntimeError(
                f"{self.where}: the connection is inside a transaction; snapshot() needs to open "
                "its own read-only transaction"
            )
        alone = alone_run(self)
        if alone is not None:  # one statement, its own snapshot: no transaction (whole.py)
            self._run = Run("table", alone.m, freshness=alone.report, reads=alone)
            try:
                yield
            finally:
                self.last_freshness, self._run = dict(alone.report), None
            return
        refreshes, attempt, opened = 0, 1, False
        while True:
            try:
                with self.dialect.run_transaction(self.driver, self._oblivious):
                    self._run = self._open_run(refreshes)
                    self.last_m = self._run.m
                    opened = True
                    try:
                        yield
                    finally:
                        self.last_freshness = dict(self._run.freshness)
                        self._run = None
                return
            except Refresh:
                refreshes += 1
                self.prepare(refresh=True)
                continue
            except RankTableMismatchError:
                if attempt == 2 or opened:
                    raise
            except self.driver.errors as error:
                lost = self.driver.lost(error)
                if attempt == 2 or opened or not lost:
                    if lost:
                        raise self.driver.lost_error(self.where, error) from None
                    raise
                self.driver.ensure()
            attempt += 1

    def _open_run(self, refreshes: int) -> Run:
        """What a run reads, learnt in its transaction's first queries (copies.open): the copy
        where it is proven current (or frozen), else `_stale_run`; without a copy, the table
        where the dialect reads tables, else a refusal. Where nothing can prove a copy current
        (the proof says so) a run that is not frozen reads the table without looking."""
        report: dict[str, Any] = {"refreshes": refreshes}
        if not self.frozen and not self.proof.proves:
            return self._table_run(report | {"copy": "unprovable"})
        opened = self.copies.open(strict=self.frozen, runs=not self._oblivious)
        if opened is None:
            if self.counts_query or not self.dialect.reads_tables:
                raise AccessError(
                    f"{self.where} has no rank-ordered copy: call prepare() once (it builds the "
                    "copy in the store)"
                )
            warnings.warn(
                f"{self.where} has no rank table: runs read the table itself; call prepare()",
                stacklevel=6,
            )
            return self._table_run(report | {"copy": "none"})
        if opened.why is None:
            copy = "frozen" if self.frozen else "current"
            opened.freshness = {"copy": copy, **({} if self.frozen else self.proof.said)} | report
            return opened
        return self._stale_run(opened, report | {"copy": "stale", "why": opened.why})

    def _stale_run(self, copy: Run, report: dict[str, Any]) -> Run:
        """A run whose copy is not proven current: it reads the table itself, reads the copy
        around the changes, or has the copy rebuilt first (raises Refresh), the cheapest as the
        dialect prices them from m (up to whole_read_rows: read whole, unpriced, whole.py). An
        oblivious run, or one on a store that reads no table, always rebuilds (what the server
        observer sees then depends on m and on whether the table was written, which its
        statistics show anyway), unless no copy can be proven current (`why` "unprovable")."""
        why, refreshes = report["why"], report["refreshes"]
        unprovable = why == "unprovable"
        if self._oblivious or self.counts_query or not self.dialect.reads_tables:
            if not unprovable:
                if refreshes >= REFRESH_TRIES:
                    raise RuntimeError(
                        f"{self.where} kept changing while its copy was refreshed "
                        f"({REFRESH_TRIES} times): try again, or use mode='live'"
                    )
                raise Refresh
            return self._by_rank_run(report)
        if copy.m <= self.dialect.whole_read_rows:  # read whole (whole.py): nothing to price
            self.last_m = copy.m  # the copy's m: no count(*) first
            return self._table_run(report)
        table, rebuild = self.dialect.table_seconds(copy.m), self.dialect.refresh_seconds(copy.m)
        report |= {"table_seconds": table, "refresh_seconds": rebuild}
        if why == "written" and self.copies.reads_around:
            around = self.copies.around_state(copy)
            if around is not None:
                seconds = self.dialect.around_seconds(around.logged)
                report |= {"around_seconds": seconds, "logged": around.logged}
                if seconds <= min(table, rebuild):
                    copy.read, copy.m, copy.around = "around", around.m, around
                    copy.freshness = report | {"read": "around"}
                    return copy
        if rebuild < table and not unprovable and refreshes == 0:
            raise Refresh
        return self._table_run(report)

    def _table_run(self, report: dict[str, Any]) -> Run:
        """A run that reads the table itself: the dialect's own reads of it where it has them
        (`table_reads`); else the in-store one-shot on its slots (table_read.py), or, where the
        relation has none (a view), by rank. A small table is read whole (whole.py)."""
        whole = WholeReads.open(self)
        reads = whole or self.dialect.table_reads(self)
        if reads is not None:
            report["read"] = "table" if whole is None else "table whole"
            return Run("table", reads.m, freshness=report, reads=reads)
        from .table_read import open_table

        found = open_table(self)
        if found is None:
            return self._by_rank_run(report)
        report["read"] = "table"
        found.plan = report
        return Run("table", found.m, freshness=report, table=found)

    def _by_rank_run(self, report: dict[str, Any]) -> Run:
        report["read"] = "table by rank"
        return Run("table by rank", self.validate(), freshness=report)

    def _state(self) -> Run:
        """The run in progress (every read runs in one: `in_a_run`)."""
        if self._run is not None:
            return self._run
        raise AccessError(f"{self.where}: a read outside snapshot()")

    def run_freshness(self) -> dict[str, Any] | None:
        """access.RunFreshness: how the run knew its data current, or why not; what it read."""
        return None if self._run is None else dict(self._run.freshness)

    def serves_copy(self) -> bool:
        """Whether a run started now reads the copy (proven current, or frozen)."""
        if self._run is not None:
            return self._run.read == "copy"
        self.driver.ensure()
        with self.dialect.run_transaction(self.driver, self._oblivious):
            opened = self.copies.open(strict=self.frozen, runs=False)
        return opened is not None and opened.why is None

    @contextmanager
    def oblivious_reads(self) -> Iterator[None]:
        """access.ObliviousReads: runs opened inside take no data-dependent shortcut (no probe
        of the runs of tied scores) and read with oblivious.py's fixed-size reads."""
        if self.accept_statistics_channel:
            self.dialect.warn_statistics(self.driver, self.where)  # once per table
        saved, self._oblivious = self._oblivious, True
        try:
            yield
        finally:
            self._oblivious = saved

    def hides_statistics(self) -> bool:
        """Whether oblivious runs keep their reads out of statistics views (docs/oblivious.md)."""
        return self.dialect.hides_statistics(self.driver)

    # ----- the Source protocol -----------------------------------------------------------------
    def _in_run(self) -> Any:
        return nullcontext() if self._run is not None else self.snapshot()

    def domain_size(self) -> int:
        with self._in_run():
            return self._state().m

    def read_sorted(self, start: int, count: int) -> Rows:
        with self._in_run():
            run = self._state()
            start, stop = max(0, int(start)), min(max(0, int(start) + int(count)), run.m)
            if stop <= start:
                return Rows(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0))
            if run.reads is not None:
                return run.reads.read_sorted(start, stop)
            if run.read != "copy":
                from .table_read import sorted_by_rank

                return sorted_by_rank(self, start, stop)
            if self._oblivious:
                from .oblivious import oblivious_sorted

                got = oblivious_sorted(self, run, start, stop)
                if got is not None:
                    return got
            return self.dialect.read_ranks(self.driver, run.ranks, start, stop, self.integer_ids)

    def read_positions(self, positions: np.ndarray) -> Rows:
        with self._in_run():
            run = self._state()
            wanted = np.asarray(positions, dtype=np.int64)
            if len(wanted) == 0:
                return Rows(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0))
            if run.reads is not None:  # its positions, its range
                return run.reads.read_positions(wanted)
            if wanted.min() < 0 or wanted.max() >= run.m:
                raise AccessError(f"positions must be in [0, {run.m})")
            if run.read != "copy":
                from .table_read import positions_by_rank

                return positions_by_rank(self, wanted)
            if self._oblivious:
                from .oblivious import oblivious_positions

                got = oblivious_positions(self, run, wanted)
                if got is not None:
                    return got
            return self._rows_at(run.ranks, wanted)

    def _rows_at(self, relation: str | None, wanted: np.ndarray) -> Rows:
        """The rows of `relation` (rank, id, score) at the ranks `wanted`, in that order."""
        d = self.dialect
        unique = np.unique(wanted)
        rows = self.driver.execute(
            f"SELECT r.rank, r.id, r.score FROM {relation} AS r "
            f"WHERE {d.member('r.rank', 'ranks', INTEGER)} ORDER BY r.rank",
            {"ranks": d.array_value(unique, INTEGER, self.driver)},
        )
        got = rows_from_records(rows)
        order = np.argsort(got.positions, kind="stable")  # rows come in the store's order
        if not np.array_equal(got.positions[order], unique):
            raise AccessError(f"{self.where}: the copy lacks ranks it should hold")
        at = order[np.searchsorted(got.positions[order], wanted)]
        return Rows(wanted, got.ids[at], got.scores[at])

    def scores_by_id(self, ids: Sequence[Any], exact: bool = True) -> list[Any]:
        """The scores of `ids` in the run's snapshot, one statement to the store (its own reads
        bypassed): `exact`, as the table holds them (query counts: the copy's); else doubles,
        from the copy where the run reads it. AccessError for an id the table lacks."""
        run = self._state()
        asked = plain_values(ids)
        if not asked:
            return []
        d = self.dialect
        if (exact and not self.counts_query) or run.read != "copy":  # the table's own type
            relation, id_sql, score = self.source, self.id_sql, self.score_sql
            score = score if exact else d.double(score)
        else:
            relation, id_sql, score = run.ranks, "id", "score"
        kind = TEXT if self.text_ids else INTEGER if self.integer_ids else None
        found = dict(
            self.driver.execute(
                f"SELECT {id_sql}, {score} FROM {relation} WHERE {d.member(id_sql, 'ids', kind)}",
                {"ids": d.array_value(list(dict.fromkeys(asked)), kind, self.driver)},
            )
        )
        try:
            return [found[item] for item in asked]
        except KeyError as missing:
            raise AccessError(f"{self.where} has no item with id {missing.args[0]!r}") from None

    def read_ids(self, ids: Sequence[Any]) -> np.ndarray:
        with self._in_run():
            reads = self._state().reads
            if reads is not None:
                return reads.read_ids(plain_values(ids))
            return np.asarray(self.scores_by_id(ids, exact=False), dtype=np.float64)

    def read_exact_scores(self, ids: Sequence[Any]) -> list[Any]:
        """access.ExactScores: the counts as the table holds them (integers as Python ints,
        numerics as Decimals), from the table in the run's snapshot (query counts: the copy)."""
        with self._in_run():
            reads = self._state().reads  # the rows in hand, where it holds them
            got = None if reads is None else reads.read_exact_scores(plain_values(ids))
            return self.scores_by_id(ids) if got is None else got

    # ----- runs of tied scores (access.ScoreRuns) --------------------------------------------
    def score_run_count(self) -> int | None:
        """Runs of tied scores in the copy's runs table (None without one, or reading the table)."""
        with self._in_run():
            return self._state().run_count

    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        """(first rank, score) of every run of tied scores, in rank order, in one query."""
        with self._in_run():
            return self.copies.read_runs(self._state())

    # ----- the in-store one-shot (access.InStoreOneShot) -------------------------------------
    def read_oneshot(self, noise: KeyedNoise, k: int) -> Rows | None:
        """The k rows of largest min(score, cap) + keyed noise, best first, ties by smaller
        position, in one statement (keyed_noise.py) over the copy, the table's slots
        (table_read.py) or the copy around the changes (around.py). The key and the
        exceedances are parameters, never statement text: where the driver would write them
        into it, or the dialect has no keyed hash, the table offers no in-store one-shot (the
        constructor sets read_oneshot to None)."""
        with self._in_run():
            run = self._state()
            if run.reads is not None:
                return run.reads.read_oneshot(noise, k)
            if run.read == "table":
                from .table_read import table_oneshot

                return table_oneshot(self, run.table, noise, k)
            if run.read == "around":
                return self.copies.around_oneshot(run, noise, k)
            if run.read != "copy":
                return None
            d = self.dialect
            uniform = noise.sql(d.keyed_uniform("key", "r.rank"))
            sql = d.oneshot_sql(run.ranks, uniform, noise.bound, int(k), noise.score_cap)
            params = {
                "key": noise.key,
                "m": int(run.m),
                "k": int(k),
                "positions": d.array_value(noise.exceed_positions, INTEGER, self.driver),
                "noises": d.array_value(noise.exceed_noises, FLOAT, self.driver),
            }
            return rows_from_records(self.driver.execute(sql, params))

    def oneshot_positions(self) -> int:
        """How many positions the in-store one-shot draws its exceedances from: the table's
        slots in a run that reads the table, the copy's and the changes' around them, else m."""
        with self._in_run():
            run = self._state()
            if run.reads is not None:
                return run.reads.oneshot_positions()
            if run.table is not None:
                return int(run.table.slots)
            if run.around is not None:
                return int(run.around.positions)
            return run.m

    # ----- what a run will read (EXPLAIN) -------------------------------------------------------
    def check(self) -> Any:
        """How each access kind will be served (the dialect's EXPLAIN), before a run."""
        return self.copies.check()

    def is_stale(self) -> bool:
        """Whether the table's counts differ from the copy (checks.is_stale)."""
        return is_stale(self)

    def close(self) -> None:
        """Close the connection if the driver opened it."""
        self.driver.close()


__all__ = ["REFRESH_TRIES", "Reads", "Refresh", "Run", "SQLTable"]
