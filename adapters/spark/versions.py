"""The versions of a SparkTable's rank-ordered copy: reading a version's manifest, proving a
version holds the source as it is, writing a new version and switching to it, and deleting the
versions no longer kept (the package's docstring has the layout and the switch).

Costs: a manifest's row is one Spark job, made once per version (versions are immutable); the
proof is the fingerprint (no job) or, for a source Spark lists no files for, one pass over it
(direct.source_facts); a write is 4 Spark jobs up to 2^21 rows, 2 more above (`write_version`);
a deletion is a Hadoop call per path, a Spark job on Spark Connect (storage.py).
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections import Counter
from typing import Any

import numpy as np

from topk_middleware.access import AccessError

from .direct import source_facts
from .layout import (
    BUCKET_CAP,
    DISTINCT_CHECK_MAX,
    FIRST_BUCKET,
    MANIFEST_SCHEMA,
    ROW_GROUP_BYTES,
    RUNS_IN_HAND,
    SORT_PARTITION_ROWS,
    TOP_ROWS,
    Version,
    bucket_sql,
    functions_for,
)
from .storage import Listing

# Versions read by snapshots of this process, by (copy, version): never deleted under them.
READERS: Counter[tuple[str, str]] = Counter()
READERS_LOCK = threading.Lock()


def new_version_name() -> str:
    """A new version's name: nanoseconds since the epoch, 20 digits, and 8 random hex digits,
    so that names sort by time of writing (the newest listed is the current version)."""
    return f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"


def current_version(t: Any, names: dict[str, int]) -> Version | None:
    """The current version (the newest of `names`), or None: a manifest's row is read once
    and kept (versions are immutable)."""
    if not names:
        return None
    name = max(names)
    if name not in t._versions:
        path = f"{t.copy}/manifests/version={name}"
        row = t._query(lambda: t.spark.read.schema(MANIFEST_SCHEMA).parquet(path).collect())[0]
        first = None if row["runs_first"] is None else np.asarray(row["runs_first"], np.int64)
        score = None if row["runs_score"] is None else np.asarray(row["runs_score"], float)
        t._versions[name] = Version(
            name,
            int(row["m"]),
            int(row["runs"]),
            first,
            score,
            row["fingerprint"] or "",
            int(row["content"]),
            row["id_type"],
        )
    return t._versions[name]


def latest(t: Any) -> Version | None:
    """The current version as the storage lists it now, or None."""
    return current_version(t, t._storage.versions(t.copy))


def version_data(t: Any, version: Version) -> Any:
    """The version's rows as a DataFrame (kept: its file listing is made once)."""
    if version.name not in t._frames:
        schema = f"rank BIGINT, id {version.id_type}, score DOUBLE, bucket INT"
        path = f"{t.copy}/v={version.name}/data"
        t._frames[version.name] = t.spark.read.schema(schema).parquet(path)
    return t._frames[version.name]


def differs(t: Any, version: Version, fingerprint: str, frame: Any) -> tuple[str, Any] | None:
    """None if the copy's `version` holds the source as it is; else (how that was found,
    the facts of the pass over the source where one was made)."""
    if fingerprint or version.fingerprint:
        return None if fingerprint == version.fingerprint else ("fingerprint", None)
    facts = source_facts_kept(t, frame, "", version.m)
    if (facts.m, facts.content) == (version.m, version.content):
        return None
    return "content pass", facts


def source_facts_kept(t: Any, frame: Any, fingerprint: str, m_guess: int) -> Any:
    """The pass over the source (direct.source_facts), kept for its fingerprint."""
    if fingerprint and t._facts is not None and t._facts[0] == fingerprint:
        return t._facts[1]
    started = time.perf_counter()
    facts = source_facts(
        t.spark,
        t._columns(frame),
        t.where,
        t.id_column,
        t.score_column,
        distinct=m_guess <= DISTINCT_CHECK_MAX,
        top=TOP_ROWS,
    )
    if t.query_seconds is not None:
        t.query_seconds.append(time.perf_counter() - started)
    if fingerprint:
        t._facts = (fingerprint, facts)
    return facts


def write(t: Any, fingerprint: str, frame: Any, listing: Listing) -> str:
    """Validate, write a new version, switch to it, delete versions no longer kept."""
    started = time.perf_counter()
    m, content = t.validate(frame)
    name = new_version_name()
    write_version(t, name, m, content, fingerprint, frame)
    t._prepared = (m, time.perf_counter() - started)
    if fingerprint and t.fingerprint() != fingerprint:  # written while the source changed
        t._storage.delete(f"{t.copy}/manifests/version={name}")
        t._storage.delete(f"{t.copy}/v={name}")
        t._versions.pop(name, None)
        raise AccessError(f"{t.where} changed while its copy was written: retry")
    versions = dict(listing.versions)
    versions[name] = int(time.time() * 1000)
    collect(t, versions)
    return name


def write_version(t: Any, name: str, m: int, content: int, fingerprint: str, frame: Any) -> None:
    """Write version `name` of the copy: one distributed sort by (score desc, id asc) into
    range partitions gives each row its rank (the partitions' offsets plus the row's place in
    its partition), one write puts the rows in rank buckets, the runs of tied scores are read
    back from it, and the manifest's row is written last (the switch)."""
    from pyspark import StorageLevel

    F = functions_for(t.spark)

    base = f"{t.copy}/v={name}"
    parts = max(1, min(4096, math.ceil(m / SORT_PARTITION_ROWS)))
    order = [F.col("score").desc(), F.col("id").asc()]
    ordered = (
        t._columns(frame)
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
                raise AccessError(f"{t.where} changed while its copy was written: retry")
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
    schema = f"rank BIGINT, id {t._id_type}, score DOUBLE, bucket INT"
    written = t.spark.read.schema(schema).parquet(base + "/data")
    runs = written.groupBy("score").agg(F.min("rank").alias("first_rank"))
    if m <= RUNS_IN_HAND:  # few rows, so few runs: kept in the manifest's row only
        got = runs.toArrow().sort_by("first_rank")
        count = got.num_rows
    else:  # one file in rank order (one job: no sampling for a global sort)
        runs.repartition(1).sortWithinPartitions("first_rank").write.mode("error").parquet(
            base + "/runs"
        )
        stored = t.spark.read.schema("score DOUBLE, first_rank BIGINT").parquet(base + "/runs")
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
        t._id_type,
        FIRST_BUCKET,
        BUCKET_CAP,
        time.time(),
    )
    manifest = t.spark.createDataFrame([row], MANIFEST_SCHEMA)
    # The switch: the manifest's file appears in the listing when its write commits.
    manifest.coalesce(1).write.mode("error").parquet(f"{t.copy}/manifests/version={name}")
    t._versions[name] = Version(
        name,
        m,
        count,
        None if first is None else np.asarray(first, np.int64),
        None if score is None else np.asarray(score, float),
        fingerprint,
        content,
        t._id_type,
    )


def collect(t: Any, versions: dict[str, int]) -> None:
    """Delete the versions older than the newest `keep` that were superseded (their
    successor's manifest written) at least `grace` seconds ago and that no snapshot of this
    process reads: the manifest first (the version is then no longer listed), then its
    files."""
    names = sorted(versions)
    now = time.time() * 1000
    for i, name in enumerate(names[: max(0, len(names) - t.keep)]):
        superseded = versions[names[i + 1]]
        with READERS_LOCK:
            if READERS[(t.copy, name)] or now - superseded < t.grace * 1000:
                continue
        t._storage.delete(f"{t.copy}/manifests/version={name}")
        t._storage.delete(f"{t.copy}/v={name}")
        t._versions.pop(name, None)
        t._frames.pop(name, None)
        t._rent.pop(name, None)
