"""SparkTable (adapters/spark/) on a real local Spark session (tests/stores_spark.py).

The conformance suite's tests (tests/test_conformance.py) run here against the Spark store:
for a seed, the same release and access counts as the rank-ordered ArraySource. Then what is
Spark's own: versions and refresh, a snapshot per run while another job rewrites the source,
validation before anything is written, the keyed noise through `sha2`, counts from raw votes,
staleness from the file listing, a catalog table, and Spark Connect.
"""

from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from adapters.memory import ArraySource
from adapters.spark import SparkTable, bucket_of, buckets_between
from tests import test_conformance as conformance
from tests.helpers import plateau_histogram, reference_for
from tests.stores_spark import ID_COLUMN, SCORE_COLUMN, write_parquet
from topk_middleware import private_top_k
from topk_middleware.access import AccessError
from topk_middleware.keyed_noise import KeyedNoise

# One local Spark session (a JVM) for the whole run: every Spark test on one worker.
pytestmark = pytest.mark.xdist_group("spark")


@pytest.fixture
def store(make_spark_source: Any) -> tuple[str, Any]:
    return "spark", make_spark_source


@pytest.fixture
def ranked_store(make_spark_source: Any) -> tuple[str, Any]:
    return "spark", make_spark_source


# The conformance suite, on the Spark store (the fixtures above stand in for its store lists).
test_sorted_access_serves_the_canonical_order = (
    conformance.test_sorted_access_serves_the_canonical_order
)
test_text_ids_are_in_byte_order = conformance.test_text_ids_are_in_byte_order
test_rank_map_is_canonical = conformance.test_rank_map_is_canonical
test_random_access_by_id = conformance.test_random_access_by_id
test_access_counts_match_what_the_store_served = (
    conformance.test_access_counts_match_what_the_store_served
)
test_a_run_sees_one_snapshot = conformance.test_a_run_sees_one_snapshot
test_runs_of_tied_scores_are_those_of_array_source = (
    conformance.test_runs_of_tied_scores_are_those_of_array_source
)
test_plateau_random_access_is_answered_by_the_runs = (
    conformance.test_plateau_random_access_is_answered_by_the_runs
)


@pytest.mark.parametrize("data", ["plateau", "zipf", "text-ties", "int-ties"])
def test_same_seed_same_answer_as_array_source(make_spark_source: Any, data: str) -> None:
    """For each seed, k and noise, the threshold run gives ArraySource's items and access
    counts (the conformance test with fewer combinations: a Spark query is ~0.1 s), and the
    full-read one-shot too for one of them."""
    scores, ids = conformance.dataset(data)
    source = make_spark_source(scores, ids)
    reference = reference_for(source, scores, ids)
    combos = itertools.product(range(2), (1, 4), ("gumbel", "laplace"))
    for seed, k, noise in combos:
        methods = ("threshold", "oneshot_full_read") if seed == 0 and k == 4 else ("threshold",)
        for method in methods:
            options: dict[str, Any] = dict(k=k, epsilon=2.0, noise=noise, method=method, seed=seed)
            want = private_top_k(reference, **options)
            got = private_top_k(source, **options)
            assert got.items == want.items, options
            assert got.m == want.m
            assert (got.accesses.sorted, got.accesses.random) == (
                want.accesses.sorted,
                want.accesses.random,
            ), options


# ----- layout ---------------------------------------------------------------------------------
def test_rank_buckets_cover_the_ranks_once() -> None:
    """Buckets are contiguous, the first holds 4096 ranks, sizes double up to 2^22 and then stay
    there; buckets_between names exactly the buckets of a range."""
    ranks = np.array([0, 4095, 4096, 8191, 8192, 2**22 - 1, 2**22, 2**23 - 1, 2**23, 10**8])
    got = [bucket_of(int(r)) for r in ranks]
    assert got == [0, 0, 1, 1, 2, 10, 11, 11, 12, 10 + 10**8 // 2**22]
    assert buckets_between(0, 4096) == [0] and buckets_between(4000, 9000) == [0, 1, 2]


def test_sorted_reads_touch_only_their_buckets(spark: Any, spark_dir: Path) -> None:
    """A copy of 20,000 rows has buckets 0..3 on disk; a read of ranks past 8192 still returns
    exactly those rows when the lower buckets' files are gone (so it never opened them)."""
    path = str(spark_dir / "buckets")
    scores = np.arange(20_000)[::-1].astype(float)
    write_parquet(spark, path, scores, None)
    source = SparkTable(spark, path, id=ID_COLUMN, score=SCORE_COLUMN, copy=path + "-copy")
    version = source.prepare()
    data = Path(path + f"-copy/v={version}/data")
    assert sorted(p.name for p in data.glob("bucket=*")) == [f"bucket={j}" for j in range(4)]
    for j in (0, 1):
        for f in (data / f"bucket={j}").glob("*.parquet"):
            f.unlink()
    with source.snapshot():
        rows = source.read_positions(np.array([9000, 12_345, 19_999]))
        assert rows.positions.tolist() == [9000, 12_345, 19_999]
        assert rows.scores.tolist() == [20_000 - 1 - 9000, 20_000 - 1 - 12_345, 0.0]
        deep = source._range(source._state(), 8192, 8200)
        assert deep.positions.tolist() == list(range(8192, 8200))


# ----- versions, refresh, snapshots -----------------------------------------------------------
def test_refresh_writes_a_new_version_and_runs_see_it(spark: Any, spark_dir: Path) -> None:
    """After the source is rewritten: is_stale() says so (from the file listing), prepare()
    without refresh keeps the copy, prepare(refresh=True) writes a new version, and a release
    is then ArraySource's on the new data; a snapshot opened before the refresh still reads the
    old version to its end."""
    path = str(spark_dir / "refresh")
    old = plateau_histogram(3000, 4)
    ids = np.arange(3000) * 3 + 1
    write_parquet(spark, path, old, ids)
    source = SparkTable(spark, path, id=ID_COLUMN, score=SCORE_COLUMN)
    first = source.prepare()
    assert not source.is_stale() and source.prepare() == first
    new = old.copy()
    new[np.flatnonzero(old == 0)[:7]] = 5000.0  # seven new winners
    write_parquet(spark, path, new, ids)
    assert source.is_stale()
    assert source.prepare() == first  # without refresh: the copy is kept
    with source.snapshot():
        before = source.read_sorted(0, 10)
        with pytest.raises(RuntimeError):  # prepare() is refused inside a snapshot
            source.prepare(refresh=True)
    snap = source.snapshot()
    snap.__enter__()
    try:
        other = SparkTable(spark, path, id=ID_COLUMN, score=SCORE_COLUMN)
        version = other.prepare(refresh=True)
        assert version != first and not other.is_stale()
        assert source.read_sorted(0, 10).ids.tolist() == before.ids.tolist()  # the old version
    finally:
        snap.__exit__(None, None, None)
    for seed in range(3):
        want = private_top_k(ArraySource(new, ids), k=4, epsilon=1.0, seed=seed, method="threshold")
        got = private_top_k(source, k=4, epsilon=1.0, seed=seed, method="threshold")
        assert got.items == want.items and got.accesses.total == want.accesses.total
    assert set(private_top_k(source, k=4, epsilon=10.0, seed=0).items) <= set(
        ids[np.flatnonzero(new == 5000.0)].tolist()
    )


def test_one_snapshot_while_another_job_rewrites_the_source(spark: Any, spark_dir: Path) -> None:
    """A thread rewrites the source and refreshes the copy (Spark jobs running concurrently with
    the run's queries); every read of a run that began before sees the old version: the same
    rows at every rank, m, and the old winners."""
    path = str(spark_dir / "concurrent")
    scores = np.floor(1e5 / np.arange(1, 2001) ** 1.1)
    ids = np.random.default_rng(2).permutation(2000)
    write_parquet(spark, path, scores, ids)
    source = SparkTable(spark, path, id=ID_COLUMN, score=SCORE_COLUMN)
    source.prepare()
    reference = ArraySource(scores, ids)
    flipped = scores[::-1].copy()
    done = threading.Event()
    failure: list[BaseException] = []

    def rewrite() -> None:
        try:
            write_parquet(spark, path, flipped, ids)
            SparkTable(spark, path, id=ID_COLUMN, score=SCORE_COLUMN).prepare(refresh=True)
        except BaseException as error:  # reported by the main thread
            failure.append(error)
        finally:
            done.set()

    rng = np.random.default_rng(0)
    with source.snapshot():
        writer = threading.Thread(target=rewrite)
        writer.start()
        reads = 0
        while not done.is_set() or reads < 3:
            ranks = np.sort(rng.choice(2000, 5, replace=False))
            got = source.read_positions(ranks)
            want = reference.read_positions(ranks)
            assert got.ids.tolist() == want.ids.tolist()
            assert got.scores.tolist() == want.scores.tolist()
            assert source.domain_size() == 2000
            reads += 1
        writer.join()
        result = private_top_k(source, k=3, epsilon=1.0, seed=5, method="threshold")
    assert not failure, failure
    want = private_top_k(reference, k=3, epsilon=1.0, seed=5, method="threshold")
    assert result.items == want.items
    fresh = private_top_k(source, k=3, epsilon=1.0, seed=5, method="threshold")
    assert (
        fresh.items
        == private_top_k(
            ArraySource(flipped, ids), k=3, epsilon=1.0, seed=5, method="threshold"
        ).items
    )


# ----- validation -------------------------------------------------------------------------------
BAD_TABLES: dict[str, tuple[list[Any], list[Any] | None, str]] = {
    "NULL score": ([1.0, None, 3.0], None, "1 NULL score"),
    "NaN score": ([1.0, float("nan"), 3.0], None, "NaN or infinite"),
    "infinite score": ([1.0, float("inf"), 3.0], None, "NaN or infinite"),
    "negative score": ([1.0, -2.0, 3.0], None, "1 negative score"),
    "duplicate id": ([1.0, 2.0, 3.0], [7, 8, 7], "duplicate ids (1 extra row(s), e.g. 7)"),
    "NULL id": ([1.0, 2.0, 3.0], [7, None, 9], "1 NULL id"),
    "empty": ([], None, "is empty"),
}


@pytest.mark.parametrize("case", list(BAD_TABLES))
def test_bad_input_is_refused_before_anything_is_written(
    spark: Any, spark_dir: Path, case: str
) -> None:
    scores, ids, message = BAD_TABLES[case]
    path = str(spark_dir / f"bad {case}")
    if scores:
        write_parquet(spark, path, scores, ids)
    else:
        spark.createDataFrame([], f"`{ID_COLUMN}` BIGINT, `{SCORE_COLUMN}` DOUBLE").write.parquet(
            path
        )
    source = SparkTable(spark, path, id=ID_COLUMN, score=SCORE_COLUMN)
    with pytest.raises(ValueError, match=r"Parquet path .*") as error:
        source.prepare()
    assert message in str(error.value)
    assert not os.path.exists(source.copy)  # nothing written
    with pytest.raises(AccessError, match="call prepare"):
        private_top_k(source, k=1, epsilon=1.0, seed=0)


def test_missing_table_column_or_wrong_type_is_refused(spark: Any, spark_dir: Path) -> None:
    """In the project's words, naming what is missing; no Spark or Java text."""
    with pytest.raises(ValueError, match=r"^Spark table 'no_such_table' cannot be read") as error:
        SparkTable(spark, "no_such_table")
    assert "Exception" not in str(error.value) and "at org." not in str(error.value)
    with pytest.raises(ValueError, match=r"cannot be read"):
        SparkTable(spark, str(spark_dir / "no such path"))
    path = str(spark_dir / "columns")
    write_parquet(spark, path, [1.0, 2.0], ["a", "b"])
    with pytest.raises(
        ValueError, match=r"has no column 'count' \(columns: \['Item ID', 'select'\]\)"
    ):
        SparkTable(spark, path, id=ID_COLUMN, score="count")
    with pytest.raises(TypeError, match="column 'Item ID' must be numeric, it is string"):
        SparkTable(spark, path, id=SCORE_COLUMN, score=ID_COLUMN)


# ----- the in-store one-shot and auto -------------------------------------------------------------
def test_spark_computes_the_keyed_noise(make_spark_source: Any) -> None:
    """Spark's top-k under a key is the top-k of score + KeyedNoise.noises computed here with
    hashlib: Gumbel without a split and with a high level (a few exceedances), Laplace with a
    split at level 0 (most items exceed it): a wrong message, digit extraction, inverse CDF or
    exceedance join in Spark SQL fails it."""
    rng = np.random.default_rng(7)
    scores = rng.integers(0, 40, 400).astype(float)
    source = make_spark_source(scores, None)
    ranked = np.sort(scores)[::-1]
    m = len(ranked)
    with source.snapshot():
        for trial, (noise, split) in enumerate(
            [("gumbel", None), ("gumbel", 8), ("laplace", 1024)]
        ):
            draw = np.random.default_rng(trial)
            if split is None:
                keyed = KeyedNoise.draw(draw, noise, 3.0)
            else:
                keyed = KeyedNoise.draw(draw, noise, 3.0, m, 1, exceedances=split)
                assert 0 < len(keyed.exceed_positions) < m
            rows = source.read_oneshot(keyed, 7)
            values = ranked + keyed.noises(np.arange(m))
            want = np.lexsort((np.arange(m), -values))[:7]
            assert rows.positions.tolist() == want.tolist()
            assert np.array_equal(rows.scores, ranked[want])


def test_oneshot_in_store_and_auto_through_private_top_k(make_spark_source: Any) -> None:
    """method="oneshot_in_store" is one query on Spark (m sorted accesses counted) and returns
    k items; "auto" records its plan, priced with Spark's costs."""
    scores, ids = conformance.dataset("zipf")
    source = make_spark_source(scores, ids)
    got = private_top_k(source, 3, 1.0, method="oneshot_in_store", seed=4)
    assert len(got.items) == 3 and got.accesses.sorted == len(scores)
    assert got.accesses.round_trips == 2  # m, the query
    auto = private_top_k(source, 3, 1.0, seed=4)
    assert auto.diagnostics.plan["auto"]["chosen"] in ("threshold", "oneshot_in_store")
    assert got.diagnostics.plan["in_store"] is True
    # scores beyond the score bound (2^42 at scale 3) are clamped in Spark's SQL too: the
    # release on 2^60 + 256 j is the one on the all-2^42 table (same ranks, same key)
    m = 400
    huge = make_spark_source(2.0**60 + 256.0 * np.arange(m - 1, -1, -1), np.arange(m))
    flat = make_spark_source(np.full(m, 2.0**42), np.arange(m))
    for seed in (1, 2):
        clamped = private_top_k(huge, 3, 1.0, method="oneshot_in_store", seed=seed)
        assert (
            clamped.items == private_top_k(flat, 3, 1.0, method="oneshot_in_store", seed=seed).items
        )
        assert clamped.privacy.score_bound == 2.0**42


# ----- votes, catalog tables, Spark Connect -------------------------------------------------------
def test_counts_from_votes(spark: Any) -> None:
    """COUNT(DISTINCT client) per item over the public items (zero-vote items included); a vote
    for an unknown item is refused."""
    votes = spark.createDataFrame(
        [("u1", "a"), ("u2", "a"), ("u1", "a"), ("u3", "b"), ("u1", "c"), ("u2", "c")],
        "client STRING, item STRING",
    )
    items = spark.createDataFrame([("a",), ("b",), ("c",), ("d",)], "id STRING")
    copy = str(Path(spark.conf.get("spark.sql.warehouse.dir").removeprefix("file:")) / "votes")
    source = SparkTable.from_votes(spark, votes, items, copy=copy)
    source.prepare()
    with source.snapshot():
        assert source.domain_size() == 4
        rows = source.read_sorted(0, 4)
    assert rows.ids.tolist() == ["a", "c", "b", "d"]
    assert rows.scores.tolist() == [2.0, 2.0, 1.0, 0.0]
    stray = votes.union(spark.createDataFrame([("u9", "zz")], "client STRING, item STRING"))
    with pytest.raises(ValueError, match=r"not in the items table .*'zz'"):
        SparkTable.from_votes(spark, stray, items, copy=copy + "2")


def test_catalog_table(spark: Any) -> None:
    """A table of the session's catalog, with a dotted-free name; its copy under the warehouse."""
    scores, ids = conformance.dataset("int-ties")
    spark.createDataFrame(
        [(int(i), float(s)) for i, s in zip(ids, scores, strict=True)], "id BIGINT, score DOUBLE"
    ).write.saveAsTable("topk_counts")
    source = SparkTable(spark, "topk_counts")
    source.prepare()
    assert "_topk_rank" in source.copy and not source.is_stale()
    want = private_top_k(ArraySource(scores, ids), k=4, epsilon=1.0, seed=3, method="threshold")
    assert private_top_k(source, k=4, epsilon=1.0, seed=3, method="threshold").items == want.items


def test_spark_connect(spark: Any, spark_connect: Any, spark_dir: Path) -> None:
    """Through a Spark Connect session: prepare() writes the copy, a release is ArraySource's,
    keyed noise runs in the store, and a classic session reads the same copy."""
    path = str(spark_dir / "connect")
    scores, ids = conformance.dataset("text-ties")
    write_parquet(spark, path, scores, ids)
    source = SparkTable(spark_connect, path, id=ID_COLUMN, score=SCORE_COLUMN)
    version = source.prepare()
    assert not source.is_stale()
    reference = ArraySource(scores, ids)
    for seed in range(2):
        want = private_top_k(reference, k=4, epsilon=2.0, seed=seed, method="threshold")
        got = private_top_k(source, k=4, epsilon=2.0, seed=seed, method="threshold")
        assert got.items == want.items and got.accesses.total == want.accesses.total
    assert len(private_top_k(source, 2, 1.0, method="oneshot_in_store", seed=1).items) == 2
    classic = SparkTable(spark, path, id=ID_COLUMN, score=SCORE_COLUMN)
    assert classic.prepare() == version
    with classic.snapshot(), source.snapshot():
        assert classic.read_sorted(0, 50).ids.tolist() == source.read_sorted(0, 50).ids.tolist()
