"""SparkTable: a histogram of per-item counts in an Apache Spark table or Parquet path.

The private threshold algorithm (Wu, Ohrimenko, Wirth 2023, Algorithm 3) needs sorted access
(the next row in canonical order: score descending, ties by id ascending; Spark compares strings
by their UTF-8 bytes) and random access by rank. Spark has neither index nor ORDER BY served from
storage, so `prepare()` writes a *rank-ordered copy* of the table, in one distributed sort:

* `<copy>/v=<version>/data/bucket=<j>/*.parquet`: rows (rank, id, score) in rank order, in rank
  buckets (`bucket_of`: 4096 ranks, doubling up to 2^22, then 2^22 each), with row groups of
  about 1 MB. A filter on `bucket` prunes directories when Spark plans the query; a range on
  `rank` skips row groups by their min/max.
* `<copy>/v=<version>/runs/`: the runs of tied scores (first rank, score), where they are many.
* `<copy>/manifests/version=<version>/`: one Parquet row per version (m, the runs where there
  are few, the fingerprint of the source). A version's files are written before its manifest;
  the manifest's file appearing (renamed into place when its write commits) is the atomic
  switch, and the newest manifest in a listing of `manifests/` is the current version (a file
  listing, no Spark job on a classic session; storage.py). A copy is immutable: a refresh
  writes a new version, and a run (`snapshot()`) reads the version it found at its start,
  whatever is written meanwhile. Versions older than the newest `keep` are deleted (after a
  switch, and by the next run) once superseded for `grace` seconds and read by no snapshot of
  this process.

Freshness (docs/freshness.md). The fingerprint of the source is its schema and, for every file
Spark reads it from, the path, length and modification time (Hadoop's FileSystem on a classic
session, one `binaryFile` listing on Spark Connect; storage.py): a rewrite in place changes it.
A source Spark lists no files for (a DataFrame built in memory) has fingerprint "", and each
run proves its copy current with one pass comparing m and a hash of the contents. Unless
`frozen`, a run whose copy is not current reads the table itself or refreshes the copy,
whichever is priced cheaper (direct.py), and records which in `last_freshness` (the release's
`diagnostics.plan["freshness"]`).

A Spark query costs 0.05-0.4 s whatever its size (planning, scheduling), so the source reads
ahead (`sorted_read_rows`), keeps the runs in hand (read with m, in the manifest's row), and
answers most random accesses without a query; the rest are one query with bucket and rank-range
filters (an IN list of more than about ten values reaches Parquet only as one min-max range).

The in-store one-shot (keyed_noise.py) runs as one Spark SQL query with `sha2`, and `method=
"auto"` prices it and the threshold run with the costs measured here (`STORE_COSTS`).

Size: one class, SparkTable, whose methods share the session, the version a run reads, the runs
in hand and the state of a run on the table itself; the copy's layout is layout.py, the one-shot
query on the copy oneshot.py, reads of the table itself direct.py, counts from votes votes.py,
file statuses and deletion storage.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import time
import uuid
from collections import Counter
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

from .._sql import rank_table_name, scores_in_order
from .direct import (
    Direct,
    direct_costs,
    direct_histogram,
    direct_oneshot,
    prepare_seconds,
    price,
    read_top,
    source_facts,
)
from .layout import (
    BUCKET_CAP,
    DIRECT_SORTED_MAX,
    DISTINCT_CHECK_MAX,
    FIRST_BUCKET,
    MANIFEST_SCHEMA,
    MAX_RANGES,
    ROW_GROUP_BYTES,
    RUNS_IN_HAND,
    SORT_PARTITION_ROWS,
    SORTED_READ_ROWS,
    STORE_COSTS,
    TOP_ROWS,
    Run,
    Version,
    arrow_rows,
    bucket_of,
    bucket_sql,
    buckets_between,
    concat_rows,
    empty_rows,
    functions_for,
    named_column,
)
from .oneshot import read_oneshot
from .storage import Listing, Storage
from .votes import counts_from_votes

__all__ = ["STORE_COSTS", "SparkTable", "bucket_of", "buckets_between"]

# Versions read by snapshots of this process, by (copy, version): never deleted under them.
_READERS: Counter[tuple[str, str]] = Counter()
_READERS_LOCK = threading.Lock()


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
            name = os.path.basename(table.rstrip("/")) if self.is_path else self._named(table)
        else:  # a DataFrame
            self.table, self.is_path, self._frame = None, False, table
            self.where = "Spark DataFrame"
            name = "frame_" + self._plan_hash(table) if copy is None else "frame"
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
        self._id_type = self._check_columns()

    def _named(self, table: str) -> str:
        """A catalog table's name as the catalog spells it, `database.table` (Spark folds and
        unquotes: `T`, `default.t` and `` `default`.`t` `` are one table, with one copy), or the
        name as given where the catalog finds nothing (reading it says so)."""
        try:
            found = self.spark.catalog.getTable(table)
        except Exception:  # no such table (the read says so), or a catalog that cannot tell
            return table
        named = ".".join([*(found.namespace or []), found.name])  # as written but unquoted
        sensitive = str(self.spark.conf.get("spark.sql.caseSensitive", "false")).lower()
        return named if sensitive == "true" else named.lower()

    def _plan_hash(self, frame: Any) -> str:
        """A short hash of a DataFrame's plan (Spark's semantic hash: equal for equal plans)."""
        try:
            semantic = frame.semanticHash()
        except Exception:
            raise ValueError(
                "the DataFrame cannot be analysed: pass copy= (where its copy goes)"
            ) from None
        return hashlib.sha1(str(semantic).encode()).hexdigest()[:12]

    # ----- the source relation and its checks ---------------------------------------------------
    def _source(self, *, infer: bool = False) -> Any:
        """The source as a DataFrame (a clear error if it cannot be read). A Parquet path is
        read with the schema Spark found in its files (schema inference is a Spark job: made
        once, and again when the files change, `_listing`), or found again if `infer`."""
        if self._frame is not None:
            return self._frame
        try:
            if not self.is_path:
                return self.spark.read.table(self.table)
            if self._schema is not None and not infer:
                return self.spark.read.schema(self._schema[1]).parquet(self.table)
            frame = self.spark.read.parquet(self.table)
        except Exception:
            raise ValueError(
                f"{self.where} cannot be read: it does not exist or is not readable"
            ) from None
        self._schema = (None, frame.schema)  # the files it holds for: set by _listing
        return frame

    def _check_columns(self) -> str:
        """The table and its columns exist, ids are integers or text, the score is numeric;
        returns the id column's Spark type (DDL)."""
        from pyspark.sql.types import IntegralType, NumericType, StringType

        try:
            fields = {f.name: f.dataType for f in self._source().schema.fields}
        except ValueError:
            raise
        except Exception:
            raise ValueError(
                f"{self.where} cannot be read: it does not exist or is not readable"
            ) from None
        for column in (self.id_column, self.score_column):
            if column not in fields:
                raise ValueError(
                    f"{self.where} has no column {column!r} (columns: {sorted(fields)})"
                )
        id_type, score_type = fields[self.id_column], fields[self.score_column]
        if not isinstance(score_type, NumericType):
            raise TypeError(
                f"{self.where} column {self.score_column!r} must be numeric, it is "
                f"{score_type.simpleString()}"
            )
        if not isinstance(id_type, IntegralType | StringType):
            raise TypeError(
                f"{self.where} column {self.id_column!r} must hold integers or text, it is "
                f"{id_type.simpleString()}"
            )
        return "BIGINT" if isinstance(id_type, IntegralType) else "STRING"

    def _columns(self, frame: Any = None) -> Any:
        """The source as (id, score): ids as BIGINT or STRING, scores as DOUBLE."""
        return (self._source() if frame is None else frame).select(
            named_column(self.spark, self.id_column).cast(self._id_type).alias("id"),
            named_column(self.spark, self.score_column).cast("double").alias("score"),
        )

    def _listing(self, versions: bool = True) -> tuple[str, Any, Listing]:
        """(the source's fingerprint, its DataFrame as listed now, the storage listing with the
        copy's versions): Hadoop calls on a classic session, one job on Spark Connect. A Parquet
        path whose files changed has its schema read again (one job)."""
        if self.table is not None and not self.is_path:
            try:
                self.spark.catalog.refreshTable(self.table)  # drop a cached file listing
            except Exception:
                pass
        try:
            frame = self._source()
            files = sorted(frame.inputFiles())
            listing = self._storage.look(files, self.copy if versions else None)
            statuses = tuple((f.path, f.size, f.modified) for f in listing.files)
            if self.is_path and self._schema is not None and self._schema[0] != statuses:
                if self._schema[0] is not None:  # the files changed: so may have their schema
                    frame = self._source(infer=True)
                self._schema = (statuses, frame.schema)
            schema = frame.schema.json()
        except ValueError:
            raise
        except Exception:
            raise ValueError(f"{self.where} cannot be read: it does not exist") from None
        if not statuses:
            return "", frame, listing
        text = json.dumps({"files": statuses, "schema": schema})
        return hashlib.sha1(text.encode("utf-8")).hexdigest(), frame, listing

    def fingerprint(self) -> str:
        """The source's identity without a scan: its schema and, for each of its files, the
        path, length and modification time (a rewrite in place, an append, a new snapshot of
        a lakehouse table change it); "" where Spark lists no files (a DataFrame built in
        memory: then each run compares contents, one pass)."""
        return self._listing(versions=False)[0]

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

    # ----- versions -------------------------------------------------------------------------------
    def _version(self, names: dict[str, int]) -> Version | None:
        """The current version (the newest of `names`), or None: a manifest's row is read once
        and kept (versions are immutable)."""
        if not names:
            return None
        name = max(names)
        if name not in self._versions:
            path = f"{self.copy}/manifests/version={name}"
            row = self._query(
                lambda: self.spark.read.schema(MANIFEST_SCHEMA).parquet(path).collect()
            )[0]
            first = None if row["runs_first"] is None else np.asarray(row["runs_first"], np.int64)
            score = None if row["runs_score"] is None else np.asarray(row["runs_score"], float)
            self._versions[name] = Version(
                name,
                int(row["m"]),
                int(row["runs"]),
                first,
                score,
                row["fingerprint"] or "",
                int(row["content"]),
                row["id_type"],
            )
        return self._versions[name]

    def _latest(self) -> Version | None:
        return self._version(self._storage.versions(self.copy))

    def _data(self, version: Version) -> Any:
        """The version's rows as a DataFrame (kept: its file listing is made once)."""
        if version.name not in self._frames:
            schema = f"rank BIGINT, id {version.id_type}, score DOUBLE, bucket INT"
            path = f"{self.copy}/v={version.name}/data"
            self._frames[version.name] = self.spark.read.schema(schema).parquet(path)
        return self._frames[version.name]

    def is_stale(self) -> bool:
        """Whether the source may differ from the current version of the copy (True without
        one). From the fingerprint (no scan) where Spark lists the source's files; otherwise
        one pass comparing m and a hash of the content."""
        fingerprint, frame, listing = self._listing()
        version = self._version(listing.versions)
        if version is None:
            return True
        return self._differs(version, fingerprint, frame) is not None

    def _differs(self, version: Version, fingerprint: str, frame: Any) -> tuple[str, Any] | None:
        """None if the copy's `version` holds the source as it is; else (how that was found,
        the facts of the pass over the source where one was made)."""
        if fingerprint or version.fingerprint:
            return None if fingerprint == version.fingerprint else ("fingerprint", None)
        facts = self._source_facts(frame, "", version.m)
        if (facts.m, facts.content) == (version.m, version.content):
            return None
        return "content pass", facts

    def _source_facts(self, frame: Any, fingerprint: str, m_guess: int) -> Any:
        """The pass over the source (direct.source_facts), kept for its fingerprint."""
        if fingerprint and self._facts is not None and self._facts[0] == fingerprint:
            return self._facts[1]
        started = time.perf_counter()
        facts = source_facts(
            self.spark,
            self._columns(frame),
            self.where,
            self.id_column,
            self.score_column,
            distinct=m_guess <= DISTINCT_CHECK_MAX,
            top=TOP_ROWS,
        )
        if self.query_seconds is not None:
            self.query_seconds.append(time.perf_counter() - started)
        if fingerprint:
            self._facts = (fingerprint, facts)
        return facts

    def prepare(self, refresh: bool = False) -> str:
        """Write a version of the rank-ordered copy if there is none (or, with `refresh`, if the
        source changed: `is_stale`), and make it current. Returns the current version's name.

        The source is validated first (one job; nothing is written if it is refused). Then one
        distributed sort by (score desc, id asc) into range partitions gives each row its rank
        (offsets of the partitions plus the row's place in its partition), one write puts the
        rows in rank buckets, the runs of tied scores are read back from it, and the manifest
        row is written: 4 Spark jobs up to 2^21 rows (checks, sort and write, runs, manifest),
        2 more above (the sort's sampling and the partitions' sizes). Readers of the old
        version are not disturbed (module docstring)."""
        if self._run is not None:
            raise RuntimeError("prepare() cannot run inside snapshot()")
        fingerprint, frame, listing = self._listing()
        current = self._version(listing.versions)
        if current is not None:
            why = self._differs(current, fingerprint, frame) if refresh else None
            if why is None:
                return current.name
        return self._write(fingerprint, frame, listing)

    def _write(self, fingerprint: str, frame: Any, listing: Listing) -> str:
        """Validate, write a new version, switch to it, delete versions no longer kept."""
        started = time.perf_counter()
        m, content = self.validate(frame)
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
        self._write_version(name, m, content, fingerprint, frame)
        self._prepared = (m, time.perf_counter() - started)
        if fingerprint and self.fingerprint() != fingerprint:  # written while the source changed
            self._storage.delete(f"{self.copy}/manifests/version={name}")
            self._storage.delete(f"{self.copy}/v={name}")
            self._versions.pop(name, None)
            raise AccessError(f"{self.where} changed while its copy was written: retry")
        versions = dict(listing.versions)
        versions[name] = int(time.time() * 1000)
        self._collect(versions)
        return name

    def _write_version(self, name: str, m: int, content: int, fingerprint: str, frame: Any) -> None:
        from pyspark import StorageLevel

        F = functions_for(self.spark)

        base = f"{self.copy}/v={name}"
        parts = max(1, min(4096, math.ceil(m / SORT_PARTITION_ROWS)))
        order = [F.col("score").desc(), F.col("id").asc()]
        ordered = (
            self._columns(frame)
            .repartitionByRange(parts, *order)
            .sortWithinPartitions(*order)
            .select(
                "id",
                "score",
                F.spark_partition_id().alias("p"),
                F.monotonically_increasing_id().alias("i"),
            )
        )
        if parts > 1:  # the partitions' sizes give their offsets: keep the sort on disk
            ordered = ordered.persist(StorageLevel.DISK_ONLY)
        try:
            offsets = [0]
            if parts > 1:
                sizes = dict(ordered.groupBy("p").count().collect())
                offsets, total = [], 0
                for p in range(max(sizes, default=0) + 1):
                    offsets.append(total)
                    total += int(sizes.get(p, 0))
                if total != m:
                    raise AccessError(f"{self.where} changed while its copy was written: retry")
            offset = f"element_at(array({', '.join(map(str, offsets))}), p + 1)"
            rank = f"{offset} + i - shiftleft(CAST(p AS BIGINT), 33)"  # i: p << 33 + row
            ranked = ordered.select(F.expr(rank).alias("rank"), "id", "score")
            (
                ranked.withColumn("bucket", F.expr(bucket_sql("rank")))
                .sortWithinPartitions("bucket", "rank")
                .write.partitionBy("bucket")
                .option("parquet.block.size", ROW_GROUP_BYTES)
                .mode("error")
                .parquet(base + "/data")
            )
        finally:
            if parts > 1:
                ordered.unpersist()
        # the runs of tied scores, from the copy just written (immutable, unlike the source)
        schema = f"rank BIGINT, id {self._id_type}, score DOUBLE, bucket INT"
        written = self.spark.read.schema(schema).parquet(base + "/data")
        runs = written.groupBy("score").agg(F.min("rank").alias("first_rank"))
        if m <= RUNS_IN_HAND:  # few rows, so few runs: kept in the manifest's row only
            got = runs.toArrow().sort_by("first_rank")
            count = got.num_rows
        else:  # one file in rank order (one job: no sampling for a global sort)
            runs.repartition(1).sortWithinPartitions("first_rank").write.mode("error").parquet(
                base + "/runs"
            )
            stored = self.spark.read.schema("score DOUBLE, first_rank BIGINT").parquet(
                base + "/runs"
            )
            got = stored.orderBy("first_rank").limit(RUNS_IN_HAND + 1).toArrow()
            count = got.num_rows if got.num_rows <= RUNS_IN_HAND else stored.count()
            got = got if got.num_rows <= RUNS_IN_HAND else None
        first = score = None
        if got is not None:
            first = got.column("first_rank").to_pylist()
            score = got.column("score").to_pylist()
        row = (
            m,
            count,
            first,
            score,
            fingerprint,
            content,
            self._id_type,
            FIRST_BUCKET,
            BUCKET_CAP,
            time.time(),
        )
        manifest = self.spark.createDataFrame([row], MANIFEST_SCHEMA)
        # The switch: the manifest's file appears in the listing when its write commits.
        manifest.coalesce(1).write.mode("error").parquet(f"{self.copy}/manifests/version={name}")
        self._versions[name] = Version(
            name,
            m,
            count,
            None if first is None else np.asarray(first, np.int64),
            None if score is None else np.asarray(score, float),
            fingerprint,
            content,
            self._id_type,
        )

    def _collect(self, versions: dict[str, int]) -> None:
        """Delete the versions older than the newest `keep` that were superseded (their
        successor's manifest written) at least `grace` seconds ago and that no snapshot of this
        process reads: the manifest first (the version is then no longer listed), then its
        files."""
        names = sorted(versions)
        now = time.time() * 1000
        for i, name in enumerate(names[: max(0, len(names) - self.keep)]):
            superseded = versions[names[i + 1]]
            with _READERS_LOCK:
                if _READERS[(self.copy, name)] or now - superseded < self.grace * 1000:
                    continue
            self._storage.delete(f"{self.copy}/manifests/version={name}")
            self._storage.delete(f"{self.copy}/v={name}")
            self._versions.pop(name, None)
            self._frames.pop(name, None)
            self._rent.pop(name, None)

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
        (module docstring); where it does not, the table itself or a new version (direct.py)."""
        if self._run is not None:
            yield
            return
        started = time.perf_counter()
        run = self._open()
        self._run = run
        try:
            yield
        finally:
            self._run = None
            self._release(run)
            if run.direct is not None and self.last_freshness is not None:
                # the rent of the ski-rental rule (direct.py): what reading the table took
                name = self.last_freshness["version"]
                paid = time.perf_counter() - started
                self._rent[name] = self._rent.get(name, 0.0) + paid

    def run_freshness(self) -> dict[str, Any] | None:
        """How the run knows its data current (access.run_freshness: the release's
        plan["freshness"]): the copy's proof, its version and the path taken."""
        return None if self.last_freshness is None else dict(self.last_freshness)

    def _open(self) -> Run:
        """The state of a new run, and `last_freshness`: how it knows its data current."""
        fingerprint, frame, listing = self._listing()
        version = self._version(listing.versions)
        if version is None:
            raise AccessError(f"{self.where} has no rank-ordered copy: call prepare()")
        if len(listing.versions) > self.keep:  # superseded versions whose grace has passed
            self._collect(listing.versions)
        proof = "frozen" if self.frozen else ("fingerprint" if fingerprint else "content pass")
        freshness: dict[str, Any] = {"proof": proof, "version": version.name}
        self.last_freshness = freshness
        why = None if self.frozen else self._differs(version, fingerprint, frame)
        if why is None:
            freshness["path"] = "copy"
            return self._copy_run(version)
        freshness["current"] = False
        facts = why[1]
        known = facts is not None or (
            fingerprint and self._facts is not None and self._facts[0] == fingerprint
        )
        table_seconds, refresh_seconds = price(version.m, bool(known))
        basis = "modelled"
        if self._prepared is not None:  # this object's last write, measured, scaled to m
            m_then, seconds = self._prepared
            refresh_seconds += seconds * version.m / max(m_then, 1) - prepare_seconds(m_then)
            basis = "measured"
        rent = self._rent.get(version.name, 0.0)
        freshness.update(
            table_seconds=table_seconds,
            refresh_seconds=refresh_seconds,
            refresh_basis=basis,
            rent_seconds=rent,
        )
        if self._oblivious or rent + table_seconds >= refresh_seconds:
            freshness["path"] = "refreshed"
            freshness["why"] = "oblivious" if self._oblivious else "ski rental"
            name = self._write(fingerprint, frame, listing)
            freshness["version"] = name
            return self._copy_run(self._versions[name])
        freshness["path"] = "table"
        if facts is None:
            facts = self._source_facts(frame, fingerprint, version.m)
        # the refresh a read only the copy serves would make, as the ski rental prices it,
        # without the threshold run on the new copy (the planner prices that on the copy)
        refresh_only = max(0.0, refresh_seconds - 3 * STORE_COSTS.round_trip)
        return Run(
            None, None, direct=Direct(frame, fingerprint, facts, table_seconds, refresh_only)
        )

    def _copy_run(self, version: Version) -> Run:
        with _READERS_LOCK:
            _READERS[(self.copy, version.name)] += 1
        return Run(version, self._data(version))

    def _release(self, run: Run) -> None:
        if run.version is not None:
            with _READERS_LOCK:
                _READERS[(self.copy, run.version.name)] -= 1

    def _to_copy(self, run: Run) -> None:
        """A read only the copy serves, in a run on the table itself: refresh the copy to the
        state the run started from (checked: fingerprint, or m and the content's hash), and go
        on on the new version."""
        direct = run.direct
        fingerprint, frame, listing = self._listing()
        if fingerprint != direct.fingerprint:
            raise AccessError(f"{self.where} changed during the run: retry")
        m, content = self.validate(frame)
        if (m, content) != (direct.facts.m, direct.facts.content):
            raise AccessError(f"{self.where} changed during the run: retry")
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
        self._write_version(name, m, content, fingerprint, frame)
        versions = dict(listing.versions)
        versions[name] = int(time.time() * 1000)
        self._collect(versions)
        version = self._versions[name]
        with _READERS_LOCK:
            _READERS[(self.copy, name)] += 1
        run.version, run.data, run.direct = version, self._data(version), None
        if self.last_freshness is not None:
            self.last_freshness.update(path="refreshed", why="a read only the copy serves")
            self.last_freshness["version"] = name

    def _state(self) -> Run:
        if self._run is not None:
            return self._run
        version = self._latest()
        if version is None:
            raise AccessError(f"{self.where} has no rank-ordered copy: call prepare()")
        return Run(version, self._data(version))

    def _copy_state(self) -> Run:
        """The run's state on the copy (a run on the table itself refreshes it first)."""
        run = self._state()
        if run.direct is not None:
            self._to_copy(run)
        return run

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
        run = self._state()
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
        run = self._state()
        return run.direct is None and run.version.runs_first is not None  # type: ignore[union-attr]

    def domain_size(self) -> int:
        run = self._state()
        return run.direct.facts.m if run.direct is not None else run.version.m  # type: ignore[union-attr]

    def score_run_count(self) -> int | None:
        """ScoreRuns: how many runs of tied scores the version holds (None on the table)."""
        run = self._state()
        return None if run.direct is not None else run.version.runs  # type: ignore[union-attr]

    def read_score_histogram(self, bins: ScoreBins) -> tuple[np.ndarray, np.ndarray] | None:
        """access.ScoreHistogramRead, on the table itself (direct.direct_histogram); None on
        the copy, whose runs serve the histogram."""
        run = self._state()
        return None if run.direct is None else direct_histogram(self, run.direct, bins)

    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        """ScoreRuns: (first rank, score) of every run, in rank order: from the manifest's row,
        else one query."""
        run = self._copy_state()
        version = run.version
        assert version is not None
        if version.runs_first is not None and version.runs_score is not None:
            return version.runs_first, version.runs_score
        path = f"{self.copy}/v={version.name}/runs"
        got = self._query(
            lambda: (
                self.spark.read.schema("score DOUBLE, first_rank BIGINT")
                .parquet(path)
                .orderBy("first_rank")
                .toArrow()
            )
        )
        return got.column("first_rank").to_numpy(), got.column("score").to_numpy()

    def read_sorted(self, start: int, count: int) -> Rows:
        """Rows of ranks [start, start + count): from the prefix read ahead, else one query over
        the buckets holding them, reading on to at least SORTED_READ_ROWS (or twice the prefix).
        On the table itself, the top rows of the run's pass (a top-N query where they do not
        reach), and beyond DIRECT_SORTED_MAX the copy, refreshed."""
        run = self._state()
        start = int(start)
        if run.direct is not None:
            facts = run.direct.facts
            stop = min(start + int(count), facts.m)
            if stop <= start:
                return empty_rows(self._id_type)
            if stop > facts.canonical and stop <= DIRECT_SORTED_MAX:
                read_top(self, run.direct, max(stop, min(facts.m, 2 * facts.canonical)))
            if stop <= facts.canonical:
                ranks = np.arange(start, max(start, stop), dtype=np.int64)
                return Rows(ranks, facts.ids[start:stop], facts.scores[start:stop])
            self._to_copy(run)
        assert run.version is not None
        m = run.version.m
        stop = min(start + int(count), m)
        if stop <= start:
            return empty_rows(run.version.id_type)
        have = 0 if run.ahead is None else len(run.ahead)
        if start > have:
            return self._range(run, start, stop)
        if stop > have:
            end = min(m, max(stop, 2 * have, SORTED_READ_ROWS))
            more = self._range(run, have, end)
            run.ahead = more if run.ahead is None else concat_rows(run.ahead, more)
        a = run.ahead
        assert a is not None
        return Rows(a.positions[start:stop], a.ids[start:stop], a.scores[start:stop])

    def _range(self, run: Run, start: int, stop: int) -> Rows:
        buckets = ", ".join(map(str, buckets_between(start, stop)))
        where = f"bucket IN ({buckets}) AND rank >= {start} AND rank < {stop}"
        rows = self._fetch(run, where)
        if len(rows) != stop - start:
            raise AccessError(
                f"{self.where}: the copy returned {len(rows)} rows for ranks "
                f"[{start}, {stop}); it is damaged: call prepare(refresh=True)"
            )
        return rows

    def read_positions(self, ranks: np.ndarray) -> Rows:
        """Rows at the given ranks in one query: bucket filters (pruned when Spark plans) and
        up to MAX_RANGES rank ranges (row groups skipped by min/max), then the exact ranks."""
        run = self._copy_state()
        assert run.version is not None
        wanted = np.unique(np.asarray(ranks, dtype=np.int64))
        if not len(wanted):
            return empty_rows(run.version.id_type)
        if wanted[0] < 0 or wanted[-1] >= run.version.m:
            raise AccessError(f"rank out of range [0, {run.version.m})")
        buckets = sorted({bucket_of(int(r)) for r in wanted})
        gaps = np.diff(wanted)
        cuts = np.sort(np.argsort(gaps)[::-1][: MAX_RANGES - 1]) if len(gaps) else []
        lows = [int(wanted[0])] + [int(wanted[c + 1]) for c in cuts]
        highs = [int(wanted[c]) for c in cuts] + [int(wanted[-1])]
        ranges = " OR ".join(
            f"(rank >= {a} AND rank <= {b})" for a, b in zip(lows, highs, strict=True)
        )
        where = f"bucket IN ({', '.join(map(str, buckets))}) AND ({ranges})"
        if len(wanted) <= 10 * MAX_RANGES:
            where += f" AND rank IN ({', '.join(map(str, wanted.tolist()))})"
        rows = self._fetch(run, where)
        keep = np.isin(rows.positions, wanted)
        rows = Rows(rows.positions[keep], rows.ids[keep], rows.scores[keep])
        if len(rows) != len(wanted):
            raise AccessError(f"{self.where}: the copy lacks some of the ranks asked for")
        return rows

    def read_ids(self, ids: Sequence[Any]) -> np.ndarray:
        """Scores of the named items: one query, a join with the ids asked for (on the table
        itself, none for the rows the run already read)."""
        run = self._state()
        wanted = [v.item() if isinstance(v, np.generic) else v for v in ids]
        if not wanted:
            return np.empty(0, dtype=np.float64)
        if run.direct is not None:
            known = run.direct.known
            facts = run.direct.facts
            known.update(zip(facts.ids.tolist(), facts.scores.tolist(), strict=True))
            if all(v in known for v in wanted):
                return scores_in_order(known, wanted, self.where)
        id_type = self._id_type if run.version is None else run.version.id_type
        try:
            asked = self.spark.createDataFrame([(v,) for v in wanted], f"id {id_type}")
        except Exception:
            raise AccessError(f"{self.where}: ids of another type than the table's") from None
        rows = self._columns(run.direct.frame) if run.direct is not None else run.data
        got = self._query(
            lambda: rows.join(asked, "id", "left_semi").select("id", "score").toArrow(),
            direct=run.direct is not None,
        )
        found = dict(
            zip(got.column("id").to_pylist(), got.column("score").to_pylist(), strict=True)
        )
        return scores_in_order(found, wanted, self.where)

    def read_oneshot(self, noise: KeyedNoise, k: int) -> Rows:
        """InStoreOneShot: the k rows of largest score + keyed noise, best first. On the copy,
        hashing in Spark only the rows that can win (oneshot.py); on the table itself, keyed by
        id without a split (direct.py), the source's listing checked unchanged afterwards."""
        run = self._state()
        if run.direct is None:
            return read_oneshot(self, run, noise, k)
        rows = direct_oneshot(self, run.direct, noise, k)
        if run.direct.fingerprint and self.fingerprint() != run.direct.fingerprint:
            raise AccessError(f"{self.where} changed while it was read: retry")
        return rows

    # ----- queries ------------------------------------------------------------------------------
    def _fetch(self, run: Run, where: str) -> Rows:
        got = self._query(lambda: run.data.where(where).select("rank", "id", "score").toArrow())
        return arrow_rows(got, "rank")

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
