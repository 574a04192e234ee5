"""SparkTable: a histogram of per-item counts in an Apache Spark table or Parquet path.

The private threshold algorithm (Wu, Ohrimenko, Wirth 2023, Algorithm 3) needs sorted access
(the next row in canonical order: score descending, ties by id ascending; Spark compares strings
by their UTF-8 bytes) and random access by rank. Spark has neither index nor ORDER BY served from
storage, so `prepare()` writes a *rank-ordered copy* of the table, in one distributed sort:

* `<copy>/v=<version>/data/bucket=<j>/*.parquet`: rows (rank, id, score) in rank order, in rank
  buckets (`bucket_of`: 4096 ranks, doubling up to 2^22, then 2^22 each), with row groups of
  about 1 MB. A filter on `bucket` prunes directories when Spark plans the query; a range on
  `rank` skips row groups by their min/max.
* `<copy>/v=<version>/runs/`: the runs of tied scores (first rank, score).
* `<copy>/manifests/version=<version>/`: one Parquet row per version (m, the runs where there
  are few, the fingerprint of the source). A version's files are written before its manifest;
  the manifest's file appearing (renamed into place when its write commits) is the atomic
  switch, and the newest manifest in a listing of `manifests/` is the current version (a file
  listing, no Spark job; a manifest's row is read once). A copy is immutable: a refresh writes
  a new version, and a run (`snapshot()`) reads the version it found at its start, whatever is
  written meanwhile.

A Spark query costs 0.05-0.4 s whatever its size (planning, scheduling), so the source reads
ahead (`sorted_read_rows`), keeps the runs in hand (read with m, in the manifest's row), and
answers most random accesses without a query; the rest are one query with bucket and rank-range
filters (an IN list of more than about ten values reaches Parquet only as one min-max range).

The in-store one-shot (keyed_noise.py) runs as one Spark SQL query with `sha2`, and `method=
"auto"` prices it and the threshold run with the costs measured here (`STORE_COSTS`).

Size: one class, SparkTable, whose methods share the session, the version a run reads and the
runs in hand; the copy's layout is layout.py and the one-shot query oneshot.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from topk_middleware.access import AccessError, Rows
from topk_middleware.keyed_noise import KeyedNoise
from topk_middleware.privacy import check_sensitivity

from .._sql import TableFacts, raise_if_invalid, rank_table_name, scores_in_order
from .layout import (
    BUCKET_CAP,
    FIRST_BUCKET,
    MANIFEST_SCHEMA,
    MAX_RANGES,
    ROW_GROUP_BYTES,
    RUNS_IN_HAND,
    SORT_PARTITION_ROWS,
    SORTED_READ_ROWS,
    STORE_COSTS,
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

__all__ = ["STORE_COSTS", "SparkTable", "bucket_of", "buckets_between"]


class SparkTable:
    """A histogram in a Spark table: one row per item of the public domain.

    `table` is a catalog table name, a Parquet path (anything with a "/" in it), or a DataFrame
    (then `copy` is required). `id` is an integer or string column, `score` a numeric one. The
    rank-ordered copy lives under `copy` (default: beside a Parquet path, else under the
    session's warehouse directory). Works with a classic SparkSession and with Spark Connect.
    """

    sorted_read_rows = SORTED_READ_ROWS
    store_costs = STORE_COSTS

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
    ) -> None:
        if not isinstance(frozen, bool):
            raise TypeError(f"frozen must be True or False, got {frozen!r}")
        self.sensitivity = check_sensitivity(sensitivity)  # the most one client moves a count
        self.frozen = frozen  # the caller's promise: the source does not change after prepare()
        self.spark = spark
        self.id_column, self.score_column = id, score
        self._frame = None
        if isinstance(table, str):
            self.table = table
            self.is_path = "/" in table
            kind = "Parquet path" if self.is_path else "Spark table"
            self.where = f"{kind} {table!r}"
            name = os.path.basename(table.rstrip("/")) if self.is_path else table
        else:  # a DataFrame
            if copy is None:
                raise ValueError("a SparkTable over a DataFrame needs copy= (where its copy goes)")
            self.table, self.is_path, self._frame = None, False, table
            self.where, name = "Spark DataFrame", "frame"
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
        self._id_type = self._check_columns()

    # ----- the source relation and its checks ---------------------------------------------------
    def _source(self) -> Any:
        """The source as a DataFrame (a clear error if it cannot be read)."""
        if self._frame is not None:
            return self._frame
        try:
            if self.is_path:
                return self.spark.read.parquet(self.table)
            return self.spark.read.table(self.table)
        except Exception:
            raise ValueError(
                f"{self.where} cannot be read: it does not exist or is not readable"
            ) from None

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

    def _columns(self) -> Any:
        """The source as (id, score): ids as BIGINT or STRING, scores as DOUBLE."""
        return self._source().select(
            named_column(self.spark, self.id_column).cast(self._id_type).alias("id"),
            named_column(self.spark, self.score_column).cast("double").alias("score"),
        )

    def fingerprint(self) -> str:
        """The source's identity without a scan: its schema and the list of its files (any
        rewrite of a Parquet / lakehouse table changes it); "" where Spark lists no files."""
        try:
            source = self._source()
            files = sorted(source.inputFiles())
            schema = source.schema.json()
        except ValueError:
            raise
        except Exception:
            raise ValueError(f"{self.where} cannot be read: it does not exist") from None
        if not files:
            return ""
        text = json.dumps({"files": files, "schema": schema})
        return hashlib.sha1(text.encode("utf-8")).hexdigest()

    def validate(self) -> tuple[int, int]:
        """Check every row in one job: no NULL/NaN/infinite/negative score, no NULL or duplicate
        id, not empty. Returns (m, a hash of the content). Raises ValueError naming the table
        and the column at fault."""
        F = functions_for(self.spark)

        rows = self._columns()
        s = F.col("score")
        bad = F.isnan(s) | (F.abs(s) == float("inf"))
        got = rows.agg(
            F.count(F.lit(1)),
            F.count("id"),
            F.count_distinct("id"),
            F.count("score"),
            F.sum(F.when(bad, 1).otherwise(0)),
            F.sum(F.when(s < 0, 1).otherwise(0)),
            F.expr("bit_xor(xxhash64(id, score))"),
        ).collect()[0]
        rows_, ids_, distinct, scores_, bad_, negative = (int(x or 0) for x in got[:6])
        facts = TableFacts(rows_, rows_ - ids_, distinct, rows_ - scores_, bad_, negative)
        duplicate = None
        if facts.null_ids == 0 and facts.distinct_ids != facts.rows:
            found = rows.groupBy("id").count().where("count > 1").limit(1).collect()
            duplicate = found[0][0] if found else None
        raise_if_invalid(facts, self.where, self.id_column, self.score_column, duplicate)
        return facts.rows, int(got[6] or 0)

    # ----- versions -------------------------------------------------------------------------------
    def _latest(self) -> Version | None:
        """The current version (the newest manifest), or None before the first prepare(): one
        file listing (no Spark job); a manifest's row is read once and kept (versions are
        immutable)."""
        try:
            listing = self.spark.read.schema("m BIGINT").parquet(self.copy + "/manifests")
            files = listing.inputFiles()
        except Exception:
            return None  # no manifests yet
        names = {f.split("/version=", 1)[1].split("/", 1)[0] for f in files if "/version=" in f}
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

    def _data(self, version: Version) -> Any:
        """The version's rows as a DataFrame (kept: its file listing is made once)."""
        if version.name not in self._frames:
            schema = f"rank BIGINT, id {version.id_type}, score DOUBLE, bucket INT"
            path = f"{self.copy}/v={version.name}/data"
            self._frames[version.name] = self.spark.read.schema(schema).parquet(path)
        return self._frames[version.name]

    def is_prepared(self) -> bool:
        """Whether a version of the copy exists."""
        return self._latest() is not None

    def is_stale(self) -> bool:
        """Whether the source may differ from the current version of the copy (True without
        one). From the fingerprint (schema and file list, no scan) where Spark lists the
        source's files; otherwise one scan comparing m and a hash of the content."""
        version = self._latest()
        if version is None:
            return True
        self._refresh_catalog()
        now = self.fingerprint()
        if now or version.fingerprint:
            return now != version.fingerprint
        m, content = self.validate()
        return (m, content) != (version.m, version.content)

    def _refresh_catalog(self) -> None:
        """Drop Spark's cached file listing of a catalog table (written by another session)."""
        if self.table is not None and not self.is_path:
            try:
                self.spark.catalog.refreshTable(self.table)
            except Exception:
                pass

    def prepare(self, refresh: bool = False) -> str:
        """Write a version of the rank-ordered copy if there is none (or, with `refresh`, if the
        source changed: `is_stale`), and make it current. Returns the current version's name.

        The source is validated first (one job; nothing is written if it is refused). Then one
        sort by (score desc, id asc) into range partitions, kept on disk, gives each row its rank
        (offsets of the partitions plus the row's place in its partition), and one write puts
        the rows in rank buckets; the runs of tied scores and the manifest row follow. Readers
        of the old version are not disturbed (module docstring)."""
        if self._run is not None:
            raise RuntimeError("prepare() cannot run inside snapshot()")
        self._refresh_catalog()
        current = self._latest()
        if current is not None and not (refresh and self.is_stale()):
            return current.name
        fingerprint = self.fingerprint()
        m, content = self.validate()
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
        self._write_version(name, m, content, fingerprint)
        return name

    def _write_version(self, name: str, m: int, content: int, fingerprint: str) -> None:
        from pyspark import StorageLevel

        F = functions_for(self.spark)

        base = f"{self.copy}/v={name}"
        parts = max(1, min(4096, math.ceil(m / SORT_PARTITION_ROWS)))
        order = [F.col("score").desc(), F.col("id").asc()]
        ordered = (
            self._columns()
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
        in_hand, got, count = m <= RUNS_IN_HAND, None, 0
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
            runs = ranked.groupBy("score").agg(F.min("rank").alias("first_rank"))
            if in_hand:  # few rows, so few runs: kept in the manifest's row only
                got = runs.orderBy("first_rank").toArrow()
            else:
                runs.orderBy("first_rank").coalesce(1).write.mode("error").parquet(base + "/runs")
        finally:
            if parts > 1:
                ordered.unpersist()
        if not in_hand:
            stored = self.spark.read.schema("score DOUBLE, first_rank BIGINT").parquet(
                base + "/runs"
            )
            count = stored.count()
            got = stored.orderBy("first_rank").toArrow() if count <= RUNS_IN_HAND else None
        first = score = None
        if got is not None:
            first = got.column("first_rank").to_pylist()
            score = got.column("score").to_pylist()
            count = len(first)
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

    def uninstall(self) -> None:
        """Remove every version of the copy (a local or file: path; elsewhere, delete
        `self.copy` with the storage's own tools)."""
        path = self.copy.removeprefix("file:")
        if "://" in path:
            raise ValueError(f"remove {self.copy} with the storage's tools: it is not local")
        shutil.rmtree(path, ignore_errors=True)

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
        copy: str | None = None,
    ) -> SparkTable:
        """Counts from raw events: COUNT(DISTINCT client) per item, over the public table of all
        items (a LEFT JOIN keeps items without votes, score 0: m is the size of `items`).

        `votes` and `items` are catalog tables, Parquet paths or DataFrames. The counts are not
        stored: `prepare()` computes them in the job that writes the copy, whose fingerprint is
        the file lists of both inputs. A vote for an item missing from `items` is refused."""
        F = functions_for(spark)

        def frame(what: Any, label: str, columns: tuple[str, ...]) -> Any:
            where = f"{label} {what!r}" if isinstance(what, str) else label
            try:
                df = what
                if isinstance(what, str):
                    read = spark.read
                    df = read.parquet(what) if "/" in what else read.table(what)
                names = set(df.columns)
            except Exception:
                raise ValueError(f"{where} cannot be read: it does not exist") from None
            for column in columns:
                if column not in names:
                    raise ValueError(f"{where} has no column {column!r} (columns: {sorted(names)})")
            return df

        v = frame(votes, "votes table", (client, item))
        i = frame(items, "items table", (item_id,))
        v_kind = dict(v.dtypes)[item]
        i_kind = dict(i.dtypes)[item_id]
        if (v_kind == "string") != (i_kind == "string"):
            raise TypeError(
                f"votes column {item!r} is {v_kind} and items column {item_id!r} is {i_kind}: "
                "item ids must be of one type"
            )
        domain = i.select(named_column(spark, item_id).alias("id"))
        counted = v.where(named_column(spark, item).isNotNull()).groupBy(
            named_column(spark, item).alias("id")
        )
        counted = counted.agg(F.count_distinct(named_column(spark, client)).alias("score"))
        stray = counted.join(domain, "id", "left_anti").limit(1).collect()
        if stray:
            raise ValueError(
                f"the votes have votes for items not in the items table (e.g. {stray[0][0]!r}): "
                "the domain must list every item"
            )
        counts = domain.join(counted, "id", "left").select(
            "id", F.coalesce(F.col("score"), F.lit(0)).alias("score")
        )
        if copy is None:
            label = "_".join(x if isinstance(x, str) else "frame" for x in (votes, items))
            warehouse = spark.conf.get("spark.sql.warehouse.dir")
            copy = (
                warehouse.rstrip("/")
                + "/_topk_rank/"
                + rank_table_name(label.replace("/", "_"), client, item)
            )
        source = cls(spark, counts, "id", "score", copy=copy)
        source.where = "counts of votes"
        return source

    # ----- the Source protocol ------------------------------------------------------------------
    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Every read of the run sees the version current at its start (copies are immutable).
        Unless `frozen`, a source that changed since the current version gets a new one first."""
        if self._run is not None:
            yield
            return
        if not self.frozen and self.is_prepared() and self.is_stale():
            # never a state older than the run's start: a new version first (is_stale: the
            # source's file listing where Spark has one, else one scan)
            self.prepare(refresh=True)
        self._run = self._state()
        try:
            yield
        finally:
            self._run = None

    def _state(self) -> Run:
        if self._run is not None:
            return self._run
        version = self._latest()
        if version is None:
            raise AccessError(f"{self.where} has no rank-ordered copy: call prepare()")
        return Run(version, self._data(version))

    @property
    def score_runs_in_hand(self) -> bool:
        """The runs came with m (the manifest's row) where they are few."""
        return self._state().version.runs_first is not None

    def domain_size(self) -> int:
        return self._state().version.m

    def score_run_count(self) -> int:
        """ScoreRuns: how many runs of tied scores the version holds."""
        return self._state().version.runs

    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        """ScoreRuns: (first rank, score) of every run, in rank order: from the manifest's row,
        else one query."""
        run = self._state()
        version = run.version
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
        the buckets holding them, reading on to at least SORTED_READ_ROWS (or twice the prefix)."""
        run = self._state()
        m = run.version.m
        start, stop = int(start), min(int(start) + int(count), m)
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
        run = self._state()
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
        """Scores of the named items: one query, a join with the ids asked for."""
        run = self._state()
        wanted = [v.item() if isinstance(v, np.generic) else v for v in ids]
        if not wanted:
            return np.empty(0, dtype=np.float64)
        schema = f"id {run.version.id_type}"
        try:
            asked = self.spark.createDataFrame([(v,) for v in wanted], schema)
        except Exception:
            raise AccessError(f"{self.where}: ids of another type than the table's") from None
        got = self._query(
            lambda: run.data.join(asked, "id", "left_semi").select("id", "score").toArrow()
        )
        found = dict(
            zip(got.column("id").to_pylist(), got.column("score").to_pylist(), strict=True)
        )
        return scores_in_order(found, wanted, self.where)

    def read_oneshot(self, noise: KeyedNoise, k: int) -> Rows:
        """InStoreOneShot: the k rows of largest score + keyed noise, best first, ties by
        smaller rank, hashing in Spark only the rows that can win (adapters/spark/oneshot.py)."""
        return read_oneshot(self, self._state(), noise, k)

    # ----- queries ------------------------------------------------------------------------------
    def _fetch(self, run: Run, where: str) -> Rows:
        got = self._query(lambda: run.data.where(where).select("rank", "id", "score").toArrow())
        return arrow_rows(got, "rank")

    def _query(self, action: Any) -> Any:
        """Run a query on the copy; a failure of Spark becomes an AccessError in our words."""
        try:
            return action()
        except Exception as error:
            kind = type(error).__name__
            raise AccessError(
                f"{self.where}: a read of its rank-ordered copy at {self.copy} failed ({kind}); "
                "the copy may have been removed: call prepare(refresh=True)"
            ) from None

    def __repr__(self) -> str:
        return f"SparkTable({self.where}, copy={self.copy!r})"
