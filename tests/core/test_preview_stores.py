"""preview() on tables read as they are now, which keep no runs of tied scores: it reads the top
16k + 1 rows by one sorted read and the rest by one binned aggregate (access.ScoreHistogramRead,
topk_middleware/score_histogram.py read_histogram), never all m rows.

On integer counts the bins are one count wide, so the histogram is exact: the preview's figures
are those of the exact histogram (ArraySource's runs) to the last digit, with the same seed, and
the rows read are the head plus one per distinct count at or below the head's last (exact
access counts). On fractional scores every item is read at most max(bin width, d / 512) above
its score (d: its distance below the head's last), checked depth by depth. Without the aggregate
these stores were read in full (m rows; Spark refreshed its copy for it). Cost: a few seconds
(PostgreSQL and MariaDB tables), and a Spark session (2-3 minutes on a loaded machine).
"""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

from adapters.duckdb import DuckDBTable
from adapters.memory import ArraySource
from topk_middleware import preview
from topk_middleware.access import CountedAccess, ScoreBins
from topk_middleware.preview import HEAD_ROWS_PER_K, read_histogram

K, EPSILONS = 10, (0.5, 2.0)
METHODS = ("threshold", "laplace", "limited_domain")


def counts(m: int = 4000) -> np.ndarray:
    """A Zipf-like head of 2,000 integer counts over zeros, in no particular order."""
    head = np.floor(3000.0 / np.arange(1, 2001) ** 0.8)
    scores = np.concatenate([head, np.zeros(m - len(head))]).astype(np.int64)
    return np.random.default_rng(7).permutation(scores)


@pytest.fixture
def make_duckdb_live_source(tmp_path):
    """DuckDBTable on a file, not frozen and never prepared: every run reads the table itself."""
    made: list[DuckDBTable] = []

    def make(scores, ids=None):
        path = tmp_path / f"t{len(made)}.duckdb"
        with duckdb.connect(str(path)) as con:
            kind = "BIGINT" if np.issubdtype(np.asarray(scores).dtype, np.integer) else "DOUBLE"
            con.execute(
                f"CREATE TABLE votes AS SELECT unnest(?::BIGINT[]) AS item, "
                f"unnest(?::{kind}[]) AS votes",
                [list(range(len(scores))), np.asarray(scores).tolist()],
            )
        source = DuckDBTable(str(path), "votes", id="item", score="votes")
        made.append(source)
        return source

    yield make
    for source in made:
        source.close()


LIVE_STORES = [
    "make_duckdb_live_source",
    "make_postgres_live_source",
    "make_sqlalchemy_live_sqlite_source",
    "make_sqlalchemy_live_postgres_source",
    "make_sqlalchemy_live_mariadb_source",
]


@pytest.mark.parametrize("store", LIVE_STORES)
def test_preview_on_a_live_table_reads_the_head_and_one_aggregate(store, request) -> None:
    scores = counts()
    source = request.getfixturevalue(store)(scores, np.arange(len(scores)))
    found = preview(source, K, epsilons=EPSILONS, methods=METHODS, trials=100)
    exact = preview(
        ArraySource(np.sort(scores)[::-1]), K, epsilons=EPSILONS, methods=METHODS, trials=100
    )
    assert [o.as_dict() for o in found.outcomes] == [o.as_dict() for o in exact.outcomes]
    head = HEAD_ROWS_PER_K * K + 1
    top = np.sort(scores)[::-1][head - 1]
    below = len(np.unique(scores[scores <= top]))
    assert found.accesses.rows_fetched == head + below < len(scores)
    assert found.accesses.round_trips == 3  # m, the head, the aggregate
    assert found.accesses.sorted == 0 and found.accesses.random == 0
    assert found.m == len(scores) and found.histogram_runs == exact.histogram_runs


@pytest.mark.xdist_group("spark")
def test_preview_on_a_spark_table_read_as_it_is(spark, spark_dir) -> None:
    """A Parquet table written after its copy: a run reads the table itself (no runs there),
    so the preview takes its top rows and one binned aggregate, with the exact histogram's
    figures, and refreshes no copy."""
    from adapters.spark import SparkTable
    from tests.stores_spark import ID_COLUMN, SCORE_COLUMN, write_parquet

    scores = counts()
    path = str(spark_dir / "preview stale copy")
    write_parquet(spark, path, np.ones(len(scores)), np.arange(len(scores)))
    SparkTable(spark, path, id=ID_COLUMN, score=SCORE_COLUMN).prepare()
    write_parquet(spark, path, scores, np.arange(len(scores)))
    source = SparkTable(spark, path, id=ID_COLUMN, score=SCORE_COLUMN)
    found = preview(source, K, epsilons=EPSILONS, methods=METHODS, trials=100)
    assert source.last_freshness is not None and source.last_freshness["path"] == "table"
    exact = preview(
        ArraySource(np.sort(scores)[::-1]), K, epsilons=EPSILONS, methods=METHODS, trials=100
    )
    assert [o.as_dict() for o in found.outcomes] == [o.as_dict() for o in exact.outcomes]
    head = HEAD_ROWS_PER_K * K + 1
    top = np.sort(scores)[::-1][head - 1]
    assert found.accesses.rows_fetched == head + len(np.unique(scores[scores <= top]))


def test_binned_scores_are_read_at_most_a_bin_above(make_duckdb_live_source) -> None:
    """Fractional scores, 30,000 distinct: each depth's score in the binned histogram is at least
    the true one and at most max(width, d / 512) above it."""
    rng = np.random.default_rng(3)
    scores = 5000.0 * rng.random(30_000) ** 4
    source = make_duckdb_live_source(scores)
    scale = 0.8
    with source.snapshot():
        access = CountedAccess(source)
        hist = read_histogram(access, K, scale)
    truth = np.sort(scores)[::-1]
    read = hist.at_ranks(np.arange(len(truth)))
    head = HEAD_ROWS_PER_K * K + 1
    assert np.array_equal(read[:head], truth[:head])
    d = truth[head - 1] - truth
    shift = read - truth
    assert np.all(shift >= 0.0)
    assert np.all(shift <= np.maximum(scale / 16, d / 512) * (1 + 1e-9))
    assert access.stats.rows_fetched == head + len(hist.values) - len(np.unique(truth[: head - 1]))
    assert len(hist.values) < 5000 and access.stats.round_trips == 3


@pytest.mark.parametrize("engine", ["duckdb", "sqlite"])
def test_score_bins_in_sql_are_the_bins_of_numpy(engine) -> None:
    import sqlite3

    bins = ScoreBins(top=987.5, width=0.03)
    rng = np.random.default_rng(5)
    scores = np.concatenate([987.5 - 200.0 * rng.random(3000), 987.5 - 1e6 * rng.random(3000)])
    if engine == "duckdb":
        con = duckdb.connect()
        rows = con.execute(
            f"SELECT {bins.sql('s')} FROM unnest(?::DOUBLE[]) AS t(s)", [scores.tolist()]
        ).fetchall()
    else:
        con = sqlite3.connect(":memory:")
        con.execute("CREATE TABLE t (s REAL)")
        con.executemany("INSERT INTO t VALUES (?)", [(float(v),) for v in scores])
        rows = con.execute(f"SELECT {bins.sql('s')} FROM t ORDER BY rowid").fetchall()
    con.close()
    assert np.array_equal(np.array([int(r[0]) for r in rows]), bins.index(scores))
