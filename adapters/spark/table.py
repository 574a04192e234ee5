"""SparkTable: the Source protocol (access.py) over a Spark table, Parquet path or DataFrame and
its rank-ordered copy (the package's docstring has the design).

The class holds what a run's reads share: the session, the source and its checked id type, the
copy's place, the versions read (their manifests and DataFrames), the run in progress, the facts
of the last pass over the source and the ski rental's rent. The work lies beside it, one module
per idea: the source relation and its fingerprint (source.py), the copy's versions, written and
deleted (versions.py), which state a run reads (run.py), the reads (reads.py), the in-store
one-shot on the copy (oneshot.py), reads of the table itself (direct.py), counts from votes
(votes.py), the copy's layout and costs (layout.py), file statuses and deletion (storage.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from topk_middleware.access import (
    AccessError,
    Rows,
    RunTraits,
    ScoreBins,
    StoreCosts,
    StoreTraits,
)
from topk_middleware.keyed_noise import KeyedNoise
from topk_middleware.privacy import check_sensitivity

from .._sql import rank_table_name
from . import reads
from .direct import direct_costs, direct_histogram, direct_oneshot, source_facts
from .layout import SORTED_READ_ROWS, STORE_COSTS, Run, Version
from .oneshot import read_oneshot
from .run import open_run, release, state
from .source import catalog_name, check_columns, columns, plan_hash, source_listing
from .storage import Storage
from .versions import current_version, differs, latest, write
from .votes import counts_from_votes


class SparkTable:
    """A histogram in a Spark table: one row per item of the public domain.

    `table` is a catalog table name, a Parquet path (anything with a "/" in it), or a DataFrame.
    `id` is an integer or string column, `score` a numeric one. The rank-ordered copy lives
    under `copy` (default: beside a Parquet path, else under the session's warehouse directory,
    named after the table, or for a DataFrame after a hash of its plan). Works with a classic
    SparkSession and with Spark Connect. `frozen=True` promises that the source does not change
    after prepare(): runs then read the copy without checking it. `keep` versions of the copy
    stay on storage (the current one and, by default, the one before it, which a run that began
    before the switch may still read); older ones are deleted once superseded for `grace`
    seconds (a run of another process reading them has had that long to finish)."""

    sorted_read_rows = SORTED_READ_ROWS

    def __init__(
        self,
        spark: Any,
        table: Any,
        id: str = "id",
        score: str = "score",
        *,
        copy: str | None = None,
        sensitivity: float = 1,
        frozen: bool = False,
        keep: int = 2,
        grace: float = 300.0,
    ) -> None:
        if not isinstance(frozen, bool):
            raise TypeError(f"frozen must be True or False, got {frozen!r}")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an integer >= 1 (versions kept), got {keep!r}")
        if isinstance(grace, bool) or not isinstance(grace, int | float) or not grace >= 0:
            raise ValueError(f"grace must be a number of seconds >= 0, got {grace!r}")
        self.sensitivity = check_sensitivity(sensitivity)  # the most one client moves a count
        self.frozen = frozen  # the caller's promise: the source does not change after prepare()
        self.keep, self.grace = keep, float(grace)
        self.spark = spark
        self._storage = Storage(spark)
        self.id_column, self.score_column = id, score
        self._frame = None
        if isinstance(table, str):
            self.table = table
            self.is_path = "/" in table
            kind = "Parquet path" if self.is_path else "Spark table"
            self.where = f"{kind} {table!r}"
            name = (
                os.path.basename(table.rstrip("/")) if self.is_path else catalog_name(spark, table)
            )
        else:  # a DataFrame
            self.table, self.is_path, self._frame = None, False, table
            self.where = "Spark DataFrame"
            name = "frame_" + plan_hash(table) if copy is None else "frame"
        self._schema: tuple[Any, Any] | None = None  # a Parquet path's (its files, schema)
        if copy is None:
            short = rank_table_name(name.replace(".", "_"), id, score)
            if self.is_path:
                copy = table.rstrip("/") + "__" + short.split("__", 1)[1]
            else:
                warehouse = spark.conf.get("spark.sql.warehouse.dir")
                copy = warehouse.rstrip("/") + "/_topk_rank/" + short
        self.copy = copy
        self._run: Run | None = None
        self._versions: dict[str, Version] = {}  # manifests read (immutable)
        self._frames: dict[str, Any] = {}  # DataFrames of versions read
        self._facts: tuple[str, Any] | None = None  # (fingerprint, direct.Facts) of the source
        self._rent: dict[str, float] = {}  # seconds spent reading the table, by copy version
        self._prepared: tuple[int, float] | None = None  # (m, seconds) of this object's last write
        self._oblivious = False
        self.last_freshness: dict[str, Any] | None = None  # how the last run knew its data
        # seconds of each Spark query made for runs, where the caller asks (a list: benchmarks)
        self.query_seconds: list[float] | None = None
        self._id_type = check_columns(self)

    # ----- the source ---------------------------------------------------------------------------
    def _columns(self, frame: Any = None) -> Any:
        """The source as (id, score): ids as BIGINT or STRING, scores as DOUBLE (source.py)."""
        return columns(self, frame)

    def fingerprint(self) -> str:
        """The source's identity without a scan: its schema and, for each of its files, the
        path, length and modification time (a rewrite in place, an append, a new snapshot of
        a lakehouse table change it); "" where Spark lists no files (a DataFrame built in
        memory: then each run compares contents, one pass)."""
        return source_listing(self, versions=False)[0]

    def validate(self, frame: Any = None) -> tuple[int, int]:
        """Check every row in one job: no NULL/NaN/infinite/negative score, no NULL or duplicate
        id, not empty. Returns (m, a hash of the content). Raises ValueError naming the table
        and the column at fault."""
        facts = source_facts(
            self.spark,
            self._columns(frame),
            self.where,
            self.id_column,
            self.score_column,
            distinct=True,
            top=0,
        )
        return facts.m, facts.content

    # ----- the copy's versions -------------------------------------------------------------------
    def is_stale(self) -> bool:
        """Whether the source may differ from the current version of the copy (True without
        one). From the fingerprint (no scan) where Spark lists the source's files; otherwise
        one pass comparing m and a hash of the content."""
        fingerprint, frame, listing = source_listing(self)
        version = current_version(self, listing.versions)
        if version is None:
            return True
        return differs(self, version, fingerprint, frame) is not None

    def prepare(self, refresh: bool = False) -> str:
        """Write a version of the rank-ordered copy if there is none (or, with `refresh`, if the
        source changed: `is_stale`), and make it current. Returns the current version's name.

        The source is validated first (one job; nothing is written if it is refused). Then one
        distributed sort by (score desc, id asc) into range partitions gives each row its rank
        (offsets of the partitions plus the row's place in its partition), one write puts the
        rows in rank buckets, the runs of tied scores are read back from it, and the manifest
        row is written: 4 Spark jobs up to 2^21 rows (checks, sort and write, runs, manifest),
        2 more above (the sort's sampling and the partitions' sizes). Readers of the old
        version are not disturbed (the package's docstring)."""
        if self._run is not None:
            raise RuntimeError("prepare() cannot run inside snapshot()")
        fingerprint, frame, listing = source_listing(self)
        current = current_version(self, listing.versions)
        if current is not None:
            why = differs(self, current, fingerprint, frame) if refresh else None
            if why is None:
                return current.name
        return write(self, fingerprint, frame, listing)

    def _latest(self) -> Version | None:
        """The current version as the storage lists it now, or None (versions.py)."""
        return latest(self)

    def uninstall(self) -> None:
        """Remove everything prepare() made: every version of the copy, its runs and its
        manifests, wherever the copy lives (Hadoop's FileSystem; on Spark Connect an empty
        overwrite, which leaves Spark's `_SUCCESS` marker in the copy's directory). The source
        is not touched; a release then needs prepare() again."""
        if self._run is not None:
            raise RuntimeError("uninstall() cannot run inside snapshot()")
        self._storage.delete(self.copy)
        self._versions.clear()
        self._frames.clear()
        self._facts = None
        self._rent.clear()

    # ----- construction from raw votes ----------------------------------------------------------
    @classmethod
    def from_votes(
        cls,
        spark: Any,
        votes: Any,
        items: Any,
        *,
        client: str = "client",
        item: str = "item",
        item_id: str = "id",
        weight: str | None = None,
        max_per_item: float = 1,
        max_items_per_client: int | None = None,
        copy: str | None = None,
        frozen: bool = False,
    ) -> SparkTable:
        """Counts from raw events, each client's contribution bounded (votes.py): a client adds
        to an item min(its rows for the item, or the sum of their `weight`, `max_per_item`)
        (COUNT(DISTINCT client) when that is 1 without weight), to at most
        `max_items_per_client` items chosen by a keyed hash; the source's sensitivity is
        `max_per_item`. `items` is the public domain (a LEFT JOIN keeps items without votes,
        score 0: m is its size); a vote for an item missing from it is refused, as is a
        negative, NaN or infinite weight.

        `votes` and `items` are catalog tables, Parquet paths or DataFrames. The counts are not
        stored: prepare() computes them in the job that writes the copy, whose fingerprint is
        the file listings of both inputs. The copy's default place is named after a hash of the
        counts' plan (inputs, columns, bounds and the hash's key), so two sources of other votes
        never share one; pass `copy=` to find a copy again from another process."""
        counts, bound = counts_from_votes(
            spark,
            votes,
            items,
            client=client,
            item=item,
            item_id=item_id,
            weight=weight,
            max_per_item=max_per_item,
            max_items_per_client=max_items_per_client,
        )
        source = cls(spark, counts, "id", "score", copy=copy, sensitivity=bound, frozen=frozen)
        source.where = "counts of votes"
        return source

    # ----- the Source protocol ------------------------------------------------------------------
    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Every read of the run sees one state of the data: the version of the copy current at
        its start (copies are immutable), proven to hold the source as it is unless `frozen`
        (the package's docstring); where it does not, the table itself or a new version
        (direct.py, run.py)."""
        if self._run is not None:
            yield
            return
        started = time.perf_counter()
        run = open_run(self)
        self._run = run
        try:
            yield
        finally:
            self._run = None
            release(self, run)
            if run.direct is not None and self.last_freshness is not None:
                # the rent of the ski-rental rule (direct.py): what reading the table took
                name = self.last_freshness["version"]
                paid = time.perf_counter() - started
                self._rent[name] = self._rent.get(name, 0.0) + paid

    def run_freshness(self) -> dict[str, Any] | None:
        """How the run knows its data current (access.run_freshness: the release's
        plan["freshness"]): the copy's proof, its version and the path taken."""
        return None if self.last_freshness is None else dict(self.last_freshness)

    def _state(self) -> Run:
        """The state of the run in progress, or outside a run one on the current version."""
        return state(self)

    @contextmanager
    def oblivious_reads(self) -> Iterator[None]:
        """An oblivious release (mechanisms/oblivious.py) reads the copy: a stale one is
        refreshed first, never read around through the table, whose reads depend on the data."""
        self._oblivious = True
        try:
            yield
        finally:
            self._oblivious = False

    @property
    def store_costs(self) -> StoreCosts:
        """The copy's costs (STORE_COSTS), or, in a run on the table itself, direct.py's."""
        run = self._run
        if run is not None and run.direct is not None:
            return direct_costs(run.direct.facts.m, run.direct.refresh_seconds)
        return STORE_COSTS

    def oneshot_positions(self) -> int:
        """How many positions the in-store one-shot draws its exceedances from: m on the copy
        (its ranks), none on the table itself (no split: direct.py)."""
        run = state(self)
        return 0 if run.direct is not None else run.version.m  # type: ignore[union-attr]

    def traits(self) -> StoreTraits:
        """access.StoreTraits: the declared sensitivity."""
        return StoreTraits(self.sensitivity)

    def run_traits(self) -> RunTraits:
        """access.RunTraits: the copy's ranks, read ahead, its runs in hand where few."""
        return RunTraits(
            score_runs_in_hand=self.score_runs_in_hand,
            sorted_read_rows=self.sorted_read_rows,
            costs=self.store_costs,
        )

    @property
    def score_runs_in_hand(self) -> bool:
        """The runs came with m (the manifest's row) where they are few."""
        run = state(self)
        return run.direct is None and run.version.runs_first is not None  # type: ignore[union-attr]

    def domain_size(self) -> int:
        run = state(self)
        return run.direct.facts.m if run.direct is not None else run.version.m  # type: ignore[union-attr]

    def score_run_count(self) -> int | None:
        """ScoreRuns: how many runs of tied scores the version holds (None on the table)."""
        run = state(self)
        return None if run.direct is not None else run.version.runs  # type: ignore[union-attr]

    def read_score_histogram(self, bins: ScoreBins) -> tuple[np.ndarray, np.ndarray] | None:
        """access.ScoreHistogramRead, on the table itself (direct.direct_histogram); None on
        the copy, whose runs serve the histogram."""
        run = state(self)
        return None if run.direct is None else direct_histogram(self, run.direct, bins)

    def read_oneshot(self, noise: KeyedNoise, k: int) -> Rows:
        """InStoreOneShot: the k rows of largest score + keyed noise, best first. On the copy,
        hashing in Spark only the rows that can win (oneshot.py); on the table itself, keyed by
        id without a split (direct.py), the source's listing checked unchanged afterwards."""
        run = state(self)
        if run.direct is None:
            return read_oneshot(self, run, noise, k)
        rows = direct_oneshot(self, run.direct, noise, k)
        if run.direct.fingerprint and self.fingerprint() != run.direct.fingerprint:
            raise AccessError(f"{self.where} changed while it was read: retry")
        return rows

    # ----- reads (reads.py) ---------------------------------------------------------------------
    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        """ScoreRuns: (first rank, score) of every run, in rank order: from the manifest's row,
        else one query."""
        return reads.read_score_runs(self)

    def read_sorted(self, start: int, count: int) -> Rows:
        """Rows of ranks [start, start + count): from the prefix read ahead, else one query over
        the buckets holding them, reading on to at least SORTED_READ_ROWS (or twice the prefix).
        On the table itself, the top rows of the run's pass (a top-N query where they do not
        reach), and beyond DIRECT_SORTED_MAX the copy, refreshed."""
        return reads.read_sorted(self, start, count)

    def _range(self, run: Run, start: int, stop: int) -> Rows:
        """Rows of ranks [start, stop) of the run's version in one query (reads.read_range)."""
        return reads.read_range(self, run, start, stop)

    def read_positions(self, ranks: np.ndarray) -> Rows:
        """Rows at the given ranks in one query: bucket filters (pruned when Spark plans) and
        up to MAX_RANGES rank ranges (row groups skipped by min/max), then the exact ranks."""
        return reads.read_positions(self, ranks)

    def read_ids(self, ids: Sequence[Any]) -> np.ndarray:
        """Scores of the named items: one query, a join with the ids asked for (on the table
        itself, none for the rows the run already read)."""
        return reads.read_ids(self, ids)

    # ----- queries ------------------------------------------------------------------------------
    def _query(self, action: Any, direct: bool = False) -> Any:
        """Run a query on the copy (or the source); a failure of Spark becomes an AccessError
        in our words."""
        started = time.perf_counter()
        try:
            got = action()
        except Exception as error:
            kind = type(error).__name__
            if direct:
                raise AccessError(f"{self.where}: a read of the table failed ({kind})") from None
            raise AccessError(
                f"{self.where}: a read of its rank-ordered copy at {self.copy} failed ({kind}); "
                "the copy may have been removed: call prepare(refresh=True)"
            ) from None
        if self.query_seconds is not None:
            self.query_seconds.append(time.perf_counter() - started)
        return got

    def __repr__(self) -> str:
        return f"SparkTable({self.where}, copy={self.copy!r})"
