"""The layout of a SparkTable's rank-ordered copy (rank buckets, row groups, the manifest), its
measured costs, and turning Spark's Arrow results into `Rows` (reads.py, oneshot.py, direct.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from topk_middleware.access import Rows, StoreCosts

# Rank buckets: [0, FIRST_BUCKET) is bucket 0, then buckets double up to BUCKET_CAP ranks, then
# BUCKET_CAP each (bucket_of). Small prefixes touch one or two small directories.
FIRST_BUCKET = 1 << 12
BUCKET_CAP = 1 << 22
# Parquet row groups of about 1 MB (~60k rows): a range read opens a few of them.
ROW_GROUP_BYTES = 1 << 20
# A query of 64k rows costs about what one of 64 does: sorted reads fetch at least this many.
SORTED_READ_ROWS = 1 << 16
# Runs of tied scores kept in the manifest's row (read with m) up to this many.
RUNS_IN_HAND = 1 << 16
# Rows per partition of the sort that builds the copy.
SORT_PARTITION_ROWS = 1 << 21
# A batch of random reads is one query with at most this many rank ranges (ORed).
MAX_RANGES = 48
# Measured on a 2-core machine, local[2], m = 10^7 (docs/benchmarks-spark.md): a query costs
# 0.1-0.4 s whatever its size; a sorted read adds ~0.1 us a row; a batch of random reads is a
# query with bucket and rank filters; the keyed hash (sha2) costs ~0.6 us a row on 2 cores; a
# full read into the client ~1 us a row.
STORE_COSTS = StoreCosts(
    round_trip=0.15,
    sorted_row=1e-7,
    random_batch=0.3,
    random_row=1e-6,
    oneshot_row=6e-7,
    full_read_row=1e-6,
)
# Reading the source itself (a copy that is not current; direct.py), measured at m = 10^6 on the
# same machine under load (2 cores, load average 7-9): a Spark job over the source costs about
# JOB_SECONDS besides its rows, a pass over (id, score) with the checks' aggregates about
# SCAN_ROW a row (0.45-0.8 s), the keyed hash and the inverse CDF about HASH_ROW a hashed row
# (1.9-2.5 s for 10^6 rows; Spark's own one-shot query took 0.6-0.9 s); prepare() is
# PREPARE_JOBS jobs and about PREPARE_ROW a row (3.9-5.7 s at 10^6; 64-119 s at 10^7 and
# 263-743 s at 10^8 in docs/benchmarks-spark.md).
JOB_SECONDS = 0.3
SCAN_ROW = 3e-7
HASH_ROW = 2e-6
PREPARE_JOBS = 5
PREPARE_ROW = 5e-6
# The top rows of the source one pass of the checks keeps (max_by): they bound the in-store
# one-shot's cut and serve the first sorted reads; deeper ones are a top-N query up to
# DIRECT_SORTED_MAX rows, beyond which a run needs the copy (direct.py).
TOP_ROWS = 1024
DIRECT_SORTED_MAX = 4096
# Sources up to this many rows have their ids counted (count(DISTINCT), a shuffle) when read
# directly; beyond, the rows a run reads are checked (as DuckDB's tables read as they are now).
DISTINCT_CHECK_MAX = 100_000
MANIFEST_SCHEMA = (
    "m BIGINT, runs BIGINT, runs_first ARRAY<BIGINT>, runs_score ARRAY<DOUBLE>, "
    "fingerprint STRING, content BIGINT, id_type STRING, first_bucket BIGINT, "
    "bucket_cap BIGINT, created DOUBLE"
)


def bucket_of(rank: int) -> int:
    """The rank bucket holding `rank` (module docstring)."""
    if rank < FIRST_BUCKET:
        return 0
    if rank < BUCKET_CAP:
        return int(rank).bit_length() - FIRST_BUCKET.bit_length() + 1
    return BUCKET_CAP.bit_length() - FIRST_BUCKET.bit_length() + int(rank) // BUCKET_CAP


def bucket_sql(rank: str) -> str:
    """`bucket_of` as a Spark SQL expression over the column `rank`."""
    cases, bound, j = [], FIRST_BUCKET, 0
    while bound <= BUCKET_CAP:
        cases.append(f"WHEN {rank} < {bound} THEN {j}")
        bound, j = bound * 2, j + 1
    top = BUCKET_CAP.bit_length() - FIRST_BUCKET.bit_length()
    return f"CAST(CASE {' '.join(cases)} ELSE {top} + {rank} DIV {BUCKET_CAP} END AS INT)"


def buckets_between(start: int, stop: int) -> list[int]:
    """The buckets holding ranks [start, stop)."""
    return list(range(bucket_of(start), bucket_of(max(start, stop - 1)) + 1))


@dataclass
class Version:
    """One version of the copy, as its manifest row describes it."""

    name: str
    m: int
    runs: int
    runs_first: np.ndarray | None
    runs_score: np.ndarray | None
    fingerprint: str
    content: int
    id_type: str


@dataclass
class Run:
    """The state of one snapshot: the version it reads, its data, and the prefix read ahead;
    or, where the copy is not current, the source read directly (`direct`, direct.py) until a
    read only the copy serves refreshes it (then `version` and `data` are set)."""

    version: Version | None
    data: Any  # DataFrame of the version's rows
    ahead: Rows | None = None
    direct: Any = None  # direct.Direct while the source is read directly


def functions_for(spark: Any) -> Any:
    """pyspark's functions for the session's kind: Spark Connect's for a Connect session (a
    process may hold both kinds), the classic ones otherwise."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        from pyspark.sql.connect import functions as connect_functions

        return connect_functions
    from pyspark.sql import functions as classic_functions

    return classic_functions


def listed(values: Sequence[int] | list[int]) -> str:
    """Integers as an SQL list."""
    return ", ".join(str(int(v)) for v in values)


def named_column(spark: Any, name: str) -> Any:
    """A column named literally (backticks: dots, spaces and keywords are part of the name)."""
    return functions_for(spark).col("`" + name.replace("`", "``") + "`")


def empty_rows(id_type: str) -> Rows:
    ids = np.empty(0, dtype=np.int64 if id_type == "BIGINT" else object)
    return Rows(np.empty(0, np.int64), ids, np.empty(0, np.float64))


def arrow_rows(table: Any, position: str, in_rank_order: bool = True) -> Rows:
    """Rows from an Arrow table (position, id, score), put in rank order unless told not to."""
    ranks = np.asarray(table.column(position).to_numpy(), dtype=np.int64)
    column = table.column("id")
    if str(column.type) in ("string", "large_string"):
        ids = np.empty(len(column), dtype=object)
        ids[:] = column.to_pylist()
    else:
        ids = np.asarray(column.to_numpy(), dtype=np.int64)
    scores = np.asarray(table.column("score").to_numpy(), dtype=np.float64)
    if in_rank_order and len(ranks) > 1 and not bool(np.all(ranks[1:] > ranks[:-1])):
        order = np.argsort(ranks, kind="stable")
        ranks, ids, scores = ranks[order], ids[order], scores[order]
    return Rows(ranks, ids, scores)


def concat_rows(a: Rows, b: Rows) -> Rows:
    return Rows(
        np.concatenate([a.positions, b.positions]),
        np.concatenate([a.ids, b.ids]),
        np.concatenate([a.scores, b.scores]),
    )
