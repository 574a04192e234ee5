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

The package, one module per idea:

table.py     SparkTable: the Source protocol over what follows, and the state a run shares
source.py    the source relation: its name, its columns checked, its files listed (fingerprint)
versions.py  the copy's versions: a manifest read, a version proven current, written, deleted
run.py       which state a run reads: the copy, the table itself or a refreshed copy
reads.py     sorted access, random access by rank and by id, the runs of tied scores
oneshot.py   the in-store one-shot on the copy
direct.py    reads of the table itself, and the ski rental's prices
votes.py     counts from votes, each client's contribution bounded
layout.py    the copy's layout (rank buckets, manifest), its measured costs, Arrow to Rows
storage.py   file statuses, the versions' listing, deletion
"""

from __future__ import annotations

from .layout import STORE_COSTS, bucket_of, buckets_between
from .table import SparkTable

__all__ = ["STORE_COSTS", "SparkTable", "bucket_of", "buckets_between"]
