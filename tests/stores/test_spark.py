"""SparkTable (adapters/spark/) on a real local Spark session (tests/stores_spark.py).

The conformance suite's tests (tests/stores/test_conformance.py) run here against the Spark store:
for a seed, the same release and access counts as the rank-ordered ArraySource. Then what is
Spark's own: versions and refresh, a snapshot per run while another job rewrites the source,
validation before anything is written, the keyed noise through `sha2`, counts from raw votes,
staleness from the file listing, a catalog table, and Spark Connect.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest

from adapters.duckdb import DuckDBTable
from adapters.memory import ArraySource
from adapters.spark import STORE_COSTS, SparkTable, bucket_of, buckets_between
from adapters.spark.direct import id_noises
from tests.helpers import plateau_histogram, reference_for
from tests.privacy.test_guarantee import N_ITEMS, VOTES, WEIGHTS
from tests.stores import test_conformance as conformance
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


@pytest.fixture
def store_to_write(make_spark_source: Any) -> tuple[str, Any]:
    return "spark", make_spark_source  # write_spark_source drops the source it writes from


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
    """A copy of 20,000 rows has buckets 0..3 on disk. With the files of buckets 0 and 1
    overwritten in place by bytes that are no Parquet (same names and lengths, so the listing
    Spark made still holds them), reads of ranks past 8192 return exactly their rows: they never
    opened those files. A read of rank 0 fails: the damage is there for a read that looks."""
    path = str(spark_dir / "buckets")
    scores = np.arange(20_000)[::-1].astype(float)
    write_parquet(spark, path, scores, None)
    source = SparkTable(spark, path, id=ID_COLUMN, score=SCORE_COLUMN, copy=path + "-copy")
    version = source.prepare()
    data = Path(path + f"-copy/v={version}/data")
    assert sorted(p.name for p in data.glob("bucket=*")) == [f"bucket={j}" for j in range(4)]
    with source.snapshot():  # the version's file listing is made here, before the damage
        corrupted = 0
        for j in (0, 1):
            for f in (data / f"bucket={j}").glob("*.parquet"):
                f.write_bytes(b"\0" * f.stat().st_size)
                corrupted += 1
        assert corrupted >= 2
        rows = source.read_positions(np.array([9000, 12_345, 19_999]))
        assert rows.positions.tolist() == [9000, 12_345, 19_999]
        assert rows.scores.tolist() == [20_000 - 1 - 9000, 20_000 - 1 - 12_345, 0.0]
        deep = source._range(source._state(), 8192, 8200)
        assert deep.positions.tolist() == list(range(8192, 8200))
        with pytest.raises(AccessError, match="failed"):
            source.read_positions(np.array([0]))


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


# ----- freshness: fingerprints, a stale copy read around or refreshed, old versions ----------
def pa_array(values: Any) -> Any:
    import pyarrow as pa

    return pa.array(values)


def write_arrow(path: Path, scores: Any, ids: Any) -> None:
    """The histogram as one Parquet file written by pyarrow at `path` (a file, or part-0.parquet
    in a directory), in place: the same name whatever was there."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({ID_COLUMN: np.asarray(ids, np.int64), SCORE_COLUMN: np.asarray(scores)})
    target = path if path.suffix == ".parquet" else path / "part-0.parquet"
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, target)


def winners_of(scores: np.ndarray, ids: np.ndarray, k: int) -> set[int]:
    return set(ids[np.argsort(-scores, kind="stable")[:k]].tolist())


@pytest.mark.parametrize("single_file", [False, True])
def test_a_rewrite_in_place_is_seen(spark: Any, spark_dir: Path, single_file: bool) -> None:
    """pyarrow rewrites the source's one file under the same name (same rows, same schema,
    other scores): the fingerprint changes (the file's length or modification time), the copy
    is stale, and a release at a large epsilon names the new winners, read from the table
    itself; an oblivious release refreshes the copy instead (reads of the table depend on the
    data); a source declared frozen keeps serving its first copy."""
    path = spark_dir / ("one.parquet" if single_file else "inplace")
    ids = np.arange(400) * 5 + 2
    old = np.random.default_rng(4).permutation(400)
    write_arrow(path, old, ids)
    source = SparkTable(spark, str(path), id=ID_COLUMN, score=SCORE_COLUMN)
    frozen = SparkTable(spark, str(path), id=ID_COLUMN, score=SCORE_COLUMN, frozen=True)
    source.prepare()
    before = source.fingerprint()
    assert before and not source.is_stale()
    new = old.copy()
    new[[3, 77, 301]] = 1000
    time.sleep(0.01)  # modification times have millisecond resolution
    write_arrow(path, new, ids)
    assert source.fingerprint() != before and source.is_stale()
    if single_file:
        return  # the releases below read the table the same way
    got = private_top_k(source, 3, 1000.0, seed=0)
    assert set(got.items) == winners_of(new, ids, 3)
    assert got.diagnostics.plan["freshness"]["path"] == "table"
    assert got.diagnostics.plan["freshness"]["proof"] == "fingerprint"
    stale = private_top_k(frozen, 3, 1000.0, seed=0)
    assert set(stale.items) == winners_of(old, ids, 3)  # the caller's promise, kept
    assert stale.diagnostics.plan["freshness"] == {
        "proof": "frozen",
        "version": frozen.last_freshness["version"],
        "path": "copy",
    }
    oblivious = private_top_k(source, 3, 1000.0, seed=0, oblivious=True, deadline=0)
    assert set(oblivious.items) == winners_of(new, ids, 3)
    assert oblivious.diagnostics.plan["freshness"]["path"] == "refreshed"
    assert oblivious.diagnostics.plan["freshness"]["why"] == "oblivious"  # no data-led reads


def test_the_table_itself_computes_the_keyed_noise(spark: Any, spark_dir: Path) -> None:
    """On a stale copy the in-store one-shot reads the table: its top-k under a key is the
    top-k of score + the keyed noise of each id (direct.id_noises, hashlib here) over the
    table's current rows, with scores spread so that the cut leaves most rows unhashed and
    the best rows are not the top scores (a wrong cut, hash message or tie order fails it), and
    with a score bound below the top scores (min(score, B) + noise: an unclamped read fails)."""
    path = spark_dir / "direct-noise"
    rng = np.random.default_rng(11)
    ids = rng.permutation(3000) + 10
    write_arrow(path, rng.integers(0, 400, 3000), ids)
    source = SparkTable(spark, str(path), id=ID_COLUMN, score=SCORE_COLUMN)
    source.prepare()
    scores = rng.integers(0, 400, 3000).astype(np.int64)
    write_arrow(path, scores, ids)
    with source.snapshot():
        assert source.last_freshness["path"] == "table"
        assert source.oneshot_positions() == 0 and source.domain_size() == 3000
        top = source.read_sorted(0, 5)  # the canonical prefix, ranks as positions
        order = np.lexsort((ids, -scores))
        assert top.ids.tolist() == ids[order[:5]].tolist() and top.positions.tolist() == [
            0,
            1,
            2,
            3,
            4,
        ]
        trials = [("gumbel", 2.0, np.inf), ("laplace", 3.0, np.inf), ("gumbel", 2.0, 256.0)]
        for trial, (noise, scale, cap) in enumerate(trials):
            keyed = KeyedNoise.draw(np.random.default_rng(trial), noise, scale, score_cap=cap)
            rows = source.read_oneshot(keyed, 6)
            values = np.minimum(scores, cap) + id_noises(keyed, ids)  # the score bound clamps
            want = np.lexsort((ids, -values))[:6]
            assert rows.ids.tolist() == ids[want].tolist()
            assert rows.scores.tolist() == scores[want].astype(float).tolist()


def test_a_write_without_prepare_is_released_by_the_cheaper_path(
    spark: Any, spark_dir: Path
) -> None:
    """After a write and no prepare(): releases read the table while the rent paid (measured)
    and one more read (modelled) stay below a refresh's price (this object's last prepare(),
    measured), and refresh once they do not (the ski-rental rule, read back from the plan);
    later ones read the new copy; every release names the new winners. After another write,
    a threshold run reads the table's top rows (the same release as ArraySource on the new
    data), and a read by rank refreshes the copy to the run's state first."""
    path = spark_dir / "priced"
    ids = np.arange(600) * 2 + 1
    old = (np.arange(600) % 23).astype(np.int64)
    write_arrow(path, old, ids)
    source = SparkTable(spark, str(path), id=ID_COLUMN, score=SCORE_COLUMN, grace=0)
    first = source.prepare()
    new = old.copy()
    new[[10, 20, 30]] = 500
    write_arrow(path, new, ids)
    paths, rents = [], []
    for seed in range(3):
        if paths and paths[-1] == "refreshed":
            break
        if seed == 2:  # a refresh priced below a read of the table: its last one took no time
            source._prepared = (600, 0.0)
        got = private_top_k(source, 3, 1000.0, seed=seed)
        assert set(got.items) == winners_of(new, ids, 3)
        plan = got.diagnostics.plan["freshness"]
        assert plan["refresh_basis"] == "measured"  # this object's prepare(), scaled to m
        priced = plan["rent_seconds"] + plan["table_seconds"] >= plan["refresh_seconds"]
        assert priced == (plan["path"] == "refreshed"), plan
        paths.append(plan["path"])
        rents.append(plan["rent_seconds"])
    assert paths[0] == "table" and paths[-1] == "refreshed", paths
    assert rents[0] == 0 and rents[1] > 0  # what the first read of the table took, measured
    after = private_top_k(source, 3, 1000.0, seed=0).diagnostics.plan["freshness"]
    assert after["path"] == "copy" and after["version"] != first
    assert not source.is_stale()
    newer = new.copy()
    newer[[40, 50]] = 900
    write_arrow(path, newer, ids)
    want = private_top_k(ArraySource(newer, ids), 4, 2.0, seed=5, method="threshold")
    got = private_top_k(source, 4, 2.0, seed=5, method="threshold")
    assert got.items == want.items and got.accesses.total == want.accesses.total
    assert got.diagnostics.plan["freshness"]["path"] == "table"  # its top rows: all 600
    reference = ArraySource(newer, ids)
    with source.snapshot():
        assert source.last_freshness["path"] == "table"
        ranks = np.array([0, 1, 300, 599])
        rows = source.read_positions(ranks)  # only the copy serves reads by rank
        assert rows.ids.tolist() == reference.read_positions(ranks).ids.tolist()
        assert source.last_freshness["path"] == "refreshed"
        assert source.last_freshness["why"] == "a read only the copy serves"
    assert not source.is_stale()


def test_a_stale_copy_prices_the_refresh_a_threshold_run_would_make(
    spark: Any, spark_dir: Path
) -> None:
    """On a stale copy a threshold run's reads by rank (and sorted reads past the rows it has
    read) refresh the copy, so the planner prices such a run with that refresh, then the run on
    the copy. A plateau after a write: the run would read by rank, its price includes the
    refresh the plan records, auto takes the one-shot on the table, and no version is written.
    Zipf data after a write: the run stops within the probe, reads nothing more and is priced
    without it; pinned, it runs on the table itself, the copy's version unchanged."""
    path = spark_dir / "refresh-priced"
    m, k = 4000, 5
    ids = np.arange(m) * 3 + 1
    plateau = plateau_histogram(m, k, height=50.0).astype(np.int64)
    write_arrow(path, plateau, ids)
    source = SparkTable(spark, str(path), id=ID_COLUMN, score=SCORE_COLUMN, grace=0)
    first = source.prepare()
    written = plateau.copy()
    written[:3] += 1  # a write: the copy is stale
    time.sleep(0.01)  # modification times have millisecond resolution
    write_arrow(path, written, ids)
    got = private_top_k(source, k, 1.0, seed=3)
    plan = got.diagnostics.plan
    fresh = plan["freshness"]
    refresh = fresh["refresh_seconds"] - 3 * STORE_COSTS.round_trip  # the refresh alone
    assert fresh["path"] == "table" and fresh["version"] == first, fresh
    assert plan["auto"]["steps"] > plan["auto"]["probe_rows"]  # reads past the probe
    assert plan["auto"]["threshold_seconds"] >= refresh
    assert plan["auto"]["chosen"] == "oneshot_in_store"
    assert source.is_stale() and source._latest().name == first  # nothing refreshed
    zipf = np.floor(1e5 / (1 + np.random.default_rng(8).permutation(m))).astype(np.int64)
    time.sleep(0.01)
    write_arrow(path, zipf, ids)
    # new objects: no rent paid on this version yet (the ski rental reads the table)
    got = private_top_k(SparkTable(spark, str(path), ID_COLUMN, SCORE_COLUMN), k, 1.0, seed=3)
    plan = got.diagnostics.plan
    assert plan["freshness"]["path"] == "table"
    assert plan["auto"]["steps"] <= plan["auto"]["probe_rows"]  # stops within the probe
    refresh = plan["freshness"]["refresh_seconds"] - 3 * STORE_COSTS.round_trip
    assert plan["auto"]["threshold_seconds"] < refresh
    pinned = private_top_k(
        SparkTable(spark, str(path), ID_COLUMN, SCORE_COLUMN), k, 1.0, seed=3, method="threshold"
    )
    want = private_top_k(ArraySource(zipf, ids), k, 1.0, seed=3, method="threshold")
    assert pinned.items == want.items and pinned.accesses.total == want.accesses.total
    assert pinned.diagnostics.plan["freshness"]["path"] == "table"
    assert source._latest().name == first  # read on the table itself: no refresh


def test_old_versions_are_deleted_but_not_under_a_reader(spark: Any, spark_dir: Path) -> None:
    """keep=2, grace=0: after each refresh only the current version and the one before it stay
    on storage, except a version a snapshot of this process still reads; with a grace period,
    a superseded version stays until it has passed."""
    path = spark_dir / "versions"
    ids = np.arange(50)
    write_arrow(path, np.arange(50), ids)
    source = SparkTable(spark, str(path), id=ID_COLUMN, score=SCORE_COLUMN, keep=2, grace=0)
    patient = SparkTable(spark, str(path), id=ID_COLUMN, score=SCORE_COLUMN, grace=3600)
    copy = Path(source.copy)

    def on_disk() -> list[str]:
        return sorted(p.name.split("=", 1)[1] for p in copy.glob("v=*") if any(p.iterdir()))

    other = SparkTable(spark, str(path), id=ID_COLUMN, score=SCORE_COLUMN, copy=source.copy)
    names = [source.prepare()]
    reader = other.snapshot()
    reader.__enter__()  # reads names[0] while two versions are written
    reading = other._run.version.name
    for round_ in (1, 2):
        write_arrow(path, np.roll(np.arange(50), round_), ids)
        names.append(source.prepare(refresh=True))
    assert reading == names[0]
    assert on_disk() == sorted(names)  # names[0] is older than the newest 2, but has a reader
    reader.__exit__(None, None, None)
    write_arrow(path, np.roll(np.arange(50), 9), ids)
    names.append(patient.prepare(refresh=True))  # grace=3600: nothing deleted
    assert on_disk() == sorted(names)
    write_arrow(path, np.roll(np.arange(50), 11), ids)
    names.append(source.prepare(refresh=True))
    assert on_disk() == names[-2:]
    manifests = sorted(p.name.split("=", 1)[1] for p in (copy / "manifests").glob("version=*"))
    assert manifests == names[-2:]
    assert private_top_k(source, 2, 1000.0, seed=1).diagnostics.plan["freshness"]["path"] == "copy"


def test_prepare_is_four_spark_jobs(spark: Any, spark_dir: Path) -> None:
    """prepare() of a 20,000-row table: the checks, the sort and write, the runs, the manifest
    (the schema, the listing and the versions come without a job)."""
    path = str(spark_dir / "jobs")
    write_parquet(spark, path, np.arange(20_000) % 101, None)
    source = SparkTable(spark, path, id=ID_COLUMN, score=SCORE_COLUMN)
    tracker = spark.sparkContext.statusTracker()
    spark.sparkContext.setJobGroup("topk-prepare", "prepare")
    try:
        source.prepare()
    finally:
        spark.sparkContext.setJobGroup("topk-after", "after")
    assert len(tracker.getJobIdsForGroup("topk-prepare")) == 4
    spark.sparkContext.setJobGroup("topk-stale", "is_stale")
    assert not source.is_stale()
    assert tracker.getJobIdsForGroup("topk-stale") == []  # a file listing, no job


# ----- votes, catalog tables, Spark Connect -------------------------------------------------------
def counts_of(source: SparkTable) -> dict[Any, float]:
    """The counts of a from_votes source, read from its DataFrame (no copy needed)."""
    return {r["id"]: float(r["score"]) for r in source._columns().collect()}


def test_counts_from_votes(spark: Any) -> None:
    """COUNT(DISTINCT client) per item over the public items (zero-vote items included); a vote
    for an unknown item is refused; two sources over other votes get other copies."""
    votes = spark.createDataFrame(
        [("u1", "a"), ("u2", "a"), ("u1", "a"), ("u3", "b"), ("u1", "c"), ("u2", "c")],
        "client STRING, item STRING",
    )
    items = spark.createDataFrame([("a",), ("b",), ("c",), ("d",)], "id STRING")
    source = SparkTable.from_votes(spark, votes, items)
    source.prepare()
    with source.snapshot():
        assert source.domain_size() == 4
        rows = source.read_sorted(0, 4)
    # DataFrames built in memory: Spark lists no files, so each run compares contents (a pass)
    assert source.fingerprint() == "" and source.last_freshness["proof"] == "content pass"
    assert source.last_freshness["path"] == "copy"
    assert rows.ids.tolist() == ["a", "c", "b", "d"]
    assert rows.scores.tolist() == [2.0, 2.0, 1.0, 0.0]
    assert source.sensitivity == 1
    other = SparkTable.from_votes(spark, votes.where("client != 'u1'"), items)
    assert other.copy != source.copy  # their own copies: neither looks stale by the other
    assert SparkTable.from_votes(spark, votes, items).copy == source.copy  # the same plan
    assert counts_of(other) == {"a": 1.0, "b": 1.0, "c": 1.0, "d": 0.0}
    assert not source.is_stale()
    stray = votes.union(spark.createDataFrame([("u9", "zz")], "client STRING, item STRING"))
    with pytest.raises(ValueError, match=r"1 vote\(s\) for items not in the items table .*'zz'"):
        SparkTable.from_votes(spark, stray, items)


@pytest.fixture(scope="module")
def raw_votes(spark: Any) -> tuple[Any, Any, duckdb.DuckDBPyConnection]:
    """tests/privacy/test_guarantee.py's vote log, as Spark DataFrames and DuckDB tables."""
    log = zip(VOTES.tolist(), WEIGHTS.tolist(), strict=True)
    rows = [(int(c), int(i), float(w)) for (c, i), w in log]
    votes = spark.createDataFrame(rows, "client BIGINT, item BIGINT, w DOUBLE")
    items = spark.createDataFrame([(i,) for i in range(N_ITEMS)], "id BIGINT")
    duck = duckdb.connect()
    duck.execute("CREATE TABLE items AS SELECT range AS id FROM range(?)", [N_ITEMS])
    duck.execute("CREATE TABLE votes (client BIGINT, item BIGINT, w DOUBLE)")
    duck.executemany("INSERT INTO votes VALUES (?, ?, ?)", rows)
    return votes, items, duck


def test_from_votes_bounds_each_client_as_the_other_stores(
    raw_votes: Any, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per (client, item) clipping (with and without weights) and a keyed choice of each
    client's items give DuckDB's counts on the same events, the hash's key fixed for both (the
    other stores share adapters/contributions.py; DuckDB's counts are checked against an
    independent count in tests/privacy/test_guarantee.py); the bound is the source's sensitivity."""
    import adapters.contributions as contributions
    import adapters.spark.votes as spark_votes

    votes, items, duck = raw_votes
    fresh = [SparkTable.from_votes(spark, votes, items, max_items_per_client=2) for _ in "ab"]
    assert fresh[0].copy != fresh[1].copy  # a fresh key each time: other counts, other copies
    key = "ab" * 32
    monkeypatch.setattr(spark_votes, "fresh_key", lambda: key)
    monkeypatch.setattr(contributions, "fresh_key", lambda: key)  # adapters/sql/votes.py's
    cases = [  # COUNT(DISTINCT client), the default, is test_counts_from_votes'
        {"max_per_item": 3},
        {"weight": "w", "max_per_item": 2.5},
        {"max_per_item": 3, "max_items_per_client": 2},
        {"weight": "w", "max_per_item": 4.0, "max_items_per_client": 1},
    ]
    for n, bounds in enumerate(cases):
        spark_source = SparkTable.from_votes(spark, votes, items, **bounds)
        duck_source = DuckDBTable.from_votes(duck, "votes", "items", into=f"c{n}", **bounds)
        want = dict(duck.execute(f"SELECT id, score FROM c{n}").fetchall())
        got = counts_of(spark_source)
        assert got.keys() == want.keys()
        np.testing.assert_allclose(
            [got[i] for i in sorted(want)], [want[i] for i in sorted(want)], rtol=1e-12
        )
        assert spark_source.sensitivity == duck_source.sensitivity == bounds.get("max_per_item", 1)
    with pytest.raises(ValueError, match="max_per_item must be finite and > 0"):
        SparkTable.from_votes(spark, votes, items, max_per_item=0)
    with pytest.raises(ValueError, match="whole number"):
        SparkTable.from_votes(spark, votes, items, max_per_item=1.5)
    bad = votes.union(spark.createDataFrame([(1, 1, -2.0)], "client BIGINT, item BIGINT, w DOUBLE"))
    with pytest.raises(ValueError, match="1 negative, NaN or infinite weight"):
        SparkTable.from_votes(spark, bad, items, weight="w", max_per_item=2)


def test_sensitivity_and_noisy_counts_on_spark(raw_votes: Any, spark: Any) -> None:
    """A table built with max_per_item=5 prints a guarantee that names 5 with 5 times the
    noise scale of the same counts declared with sensitivity 1 (privacy.calibrate: D k /
    epsilon for Gumbel); with_counts releases each winner's count beside it, with its 95%
    half-width, the count read from the copy."""
    votes, items, _ = raw_votes
    five = SparkTable.from_votes(spark, votes, items, max_per_item=5)
    five.prepare()
    unit = SparkTable(spark, five._frame, "id", "score", copy=five.copy, sensitivity=1)
    r5, r1 = (private_top_k(s, 3, 1.0, seed=1) for s in (five, unit))
    assert r5.privacy.sensitivity == 5 and "each client changes each count by at most 5" in (
        r5.privacy.derivation
    )
    assert r1.privacy.sensitivity == 1 and "at most 1" in r1.privacy.derivation
    assert r1.privacy.scale == pytest.approx(3.0, rel=1e-12)
    assert r5.privacy.scale == pytest.approx(5 * r1.privacy.scale, rel=1e-12)
    with_counts = private_top_k(five, 3, 1.0, seed=1, with_counts=True)
    counts = counts_of(five)
    assert len(with_counts.counts) == 3 and with_counts.count_error > 0
    for item, count in zip(with_counts.items, with_counts.counts, strict=True):
        assert isinstance(count, int) and abs(count - counts[item]) <= 20 * with_counts.count_error


def test_catalog_table(spark: Any) -> None:
    """A table of the session's catalog, with a dotted-free name; its copy under the warehouse;
    an overwrite of the table makes the copy stale."""
    scores, ids = conformance.dataset("int-ties")
    rows = [(int(i), float(s)) for i, s in zip(ids, scores, strict=True)]
    spark.createDataFrame(rows, "id BIGINT, score DOUBLE").write.saveAsTable("topk_counts")
    source = SparkTable(spark, "topk_counts")
    source.prepare()
    assert "_topk_rank" in source.copy and not source.is_stale()
    want = private_top_k(ArraySource(scores, ids), k=4, epsilon=1.0, seed=3, method="threshold")
    assert private_top_k(source, k=4, epsilon=1.0, seed=3, method="threshold").items == want.items
    rows[0] = (rows[0][0], 99.0)
    spark.createDataFrame(rows, "id BIGINT, score DOUBLE").write.insertInto(
        "topk_counts", overwrite=True
    )
    assert source.is_stale()
    assert private_top_k(source, 1, 1000.0, seed=0).items == [rows[0][0]]


# What a Spark Connect server logs when a request fails (at INFO, whatever the level of the
# server's other logs) and the warning (with a stack trace) of a read of a missing directory.
SERVER_ERROR_LOGGERS = (
    "org.apache.spark.sql.connect.utils.ErrorUtils",
    "org.apache.spark.sql.execution.streaming.sinks.FileStreamSink",
)


@pytest.fixture
def server_log(spark: Any) -> Iterator[Any]:
    """What the Connect server (on the test session's JVM) logs about failed requests during
    the test: its error loggers at INFO into a StringWriter (log4j 2), not to the console."""
    jvm = spark._jvm
    log4j = jvm.org.apache.logging.log4j
    context = log4j.LogManager.getContext(False)
    config = context.getConfiguration()
    writer = jvm.java.io.StringWriter()
    layout = log4j.core.layout.PatternLayout.newBuilder().withPattern("%c %p %m%n").build()
    appender = log4j.core.appender.WriterAppender.createAppender(
        layout, None, writer, "topk-test-log", False, True
    )
    appender.start()
    for name in SERVER_ERROR_LOGGERS:
        logger = log4j.core.config.LoggerConfig(name, log4j.Level.INFO, False)
        logger.addAppender(appender, None, None)
        config.addLogger(name, logger)
    context.updateLoggers()
    try:
        yield writer
    finally:
        for name in SERVER_ERROR_LOGGERS:
            config.removeLogger(name)
        context.updateLoggers()
        appender.stop()


def test_spark_connect(spark: Any, spark_connect: Any, spark_dir: Path, server_log: Any) -> None:
    """Through a Spark Connect session: prepare() writes the copy without a server-side error
    (no PATH_NOT_FOUND logged while looking for a copy not yet made), a release is
    ArraySource's, keyed noise runs in the store, a classic session reads the same copy; a
    rewrite in place makes it stale (a binaryFile listing of lengths and times) and a release
    reads the table; a catalog table, counts from votes and validation work as on a classic
    session; uninstall() leaves neither data nor manifest."""
    path = str(spark_dir / "connect")
    scores, ids = conformance.dataset("text-ties")
    write_parquet(spark, path, scores, ids)
    source = SparkTable(spark_connect, path, id=ID_COLUMN, score=SCORE_COLUMN)
    version = source.prepare()
    logged = server_log.toString()
    assert "PATH_NOT_FOUND" not in logged and "metadata directory" not in logged, logged
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
    # staleness: one file rewritten in place by pyarrow (the text ids of the test data)
    import pyarrow.parquet as pq

    (part,) = Path(path).glob("part-*.parquet")
    table = pq.read_table(part)
    new = table.column(SCORE_COLUMN).to_numpy().copy()
    new[7] = 1000
    time.sleep(0.01)
    pq.write_table(table.set_column(1, SCORE_COLUMN, pa_array(new)), part)
    part.with_name(f".{part.name}.crc").unlink()  # Spark's checksum of the file it wrote
    assert source.is_stale()
    got = private_top_k(source, 1, 1000.0, seed=0)
    assert got.items == [table.column(ID_COLUMN)[7].as_py()]
    assert got.diagnostics.plan["freshness"]["path"] == "table"
    # a catalog table
    spark.createDataFrame(
        [(i, float(i % 7)) for i in range(300)], "id BIGINT, score DOUBLE"
    ).write.saveAsTable("topk_connect_counts")
    table_source = SparkTable(spark_connect, "topk_connect_counts")
    table_source.prepare()
    assert not table_source.is_stale()
    spark.createDataFrame([(5, 50.0)], "id BIGINT, score DOUBLE").write.insertInto(
        "topk_connect_counts"
    )
    assert table_source.is_stale()
    with pytest.raises(ValueError, match="duplicate ids"):
        private_top_k(table_source, 1, 1.0, seed=0)  # the insert duplicated id 5: refused
    # counts from votes
    votes = spark_connect.createDataFrame(
        [("u1", "a"), ("u1", "a"), ("u1", "a"), ("u2", "a"), ("u3", "b")],
        "client STRING, item STRING",
    )
    items = spark_connect.createDataFrame([("a",), ("b",), ("c",)], "id STRING")
    counted = SparkTable.from_votes(spark_connect, votes, items, max_per_item=2)
    assert counts_of(counted) == {"a": 3.0, "b": 1.0, "c": 0.0} and counted.sensitivity == 2
    # validation
    bad = str(spark_dir / "connect bad")
    write_parquet(spark, bad, [1.0, None, 3.0], None)
    refused = SparkTable(spark_connect, bad, id=ID_COLUMN, score=SCORE_COLUMN)
    with pytest.raises(ValueError, match="1 NULL score"):
        refused.prepare()
    with pytest.raises(ValueError, match="has no column 'count'"):
        SparkTable(spark_connect, bad, id=ID_COLUMN, score="count")
    # uninstall: no version's data, runs or manifest is left (Spark's _SUCCESS marker is)
    source.uninstall()
    left = [p for p in Path(source.copy).rglob("*") if p.is_file()]
    assert all(p.name in ("_SUCCESS", "._SUCCESS.crc") for p in left), left
    with pytest.raises(AccessError, match="call prepare"):
        private_top_k(source, 1, 1.0, seed=0)
