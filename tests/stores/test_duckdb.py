"""DuckDBTable beyond the conformance suite: quoting, validation, prepare(), check(), the live
fallback, snapshots under a concurrent writer, from_votes."""

from __future__ import annotations

import warnings
from pathlib import Path

import duckdb
import numpy as np
import pytest

from adapters.duckdb import DuckDBTable, quote_identifier
from adapters.memory import ArraySource
from tests.helpers import CountingSource, plateau_histogram, reference_like
from topk_middleware import private_top_k
from topk_middleware.access import AccessError, Rows

AWKWARD_NAMES = ["select", "My Table", 'say "hi"', "Order", "from where", "ünïcode näme", "a.b"]


def test_quote_identifier() -> None:
    assert quote_identifier("plain") == '"plain"'
    assert quote_identifier('a"b') == '"a""b"'
    assert quote_identifier("Mixed Case") == '"Mixed Case"'
    for bad in ("", "a\x00b"):
        with pytest.raises(ValueError, match="identifier"):
            quote_identifier(bad)


@pytest.mark.parametrize("name", AWKWARD_NAMES)
def test_awkward_names_work(name: str) -> None:
    """Table and column names with spaces, quotes, capitals and keywords are taken literally."""
    con = duckdb.connect()
    q = quote_identifier
    con.execute(f"CREATE SCHEMA {q(name + ' schema')}")
    table = f"{q(name + ' schema')}.{q(name)}"
    con.execute(f"CREATE TABLE {table} ({q(name + ' id')} VARCHAR, {q(name)} INTEGER)")
    con.execute(f"INSERT INTO {table} VALUES ('x', 3), ('y', 9), ('z', 1)")
    source = DuckDBTable(
        con, name, id=name + " id", score=name, schema=name + " schema", frozen=True
    )
    source.prepare()
    assert not source.check().full_scan and source.has_rank_index() and not source.is_stale()
    result = private_top_k(source, k=1, epsilon=1e6, seed=0)  # almost no noise
    assert result.items == ["y"]


@pytest.fixture
def con() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("CREATE TABLE votes (id INTEGER, score DOUBLE, label VARCHAR)")
    con.execute("INSERT INTO votes VALUES (1, 5, 'a'), (2, 7, 'b'), (3, 0, 'c')")
    return con


@pytest.mark.parametrize(
    "statement, match",
    [
        ("UPDATE votes SET score = NULL WHERE id = 2", "'score' has 1 NULL score"),
        ("UPDATE votes SET score = 'nan' WHERE id = 2", "'score' has 1 NaN or infinite"),
        ("UPDATE votes SET score = 'inf' WHERE id = 2", "'score' has 1 NaN or infinite"),
        ("UPDATE votes SET score = -1 WHERE id = 2", "'score' has 1 negative score"),
        ("UPDATE votes SET id = 1 WHERE id = 2", "'id' has duplicate ids .*e.g. 1"),
        ("UPDATE votes SET id = NULL WHERE id = 2", "'id' has 1 NULL id"),
        ("DELETE FROM votes", "'votes' is empty"),
    ],
)
def test_bad_contents_are_refused_before_anything_is_released(
    con: duckdb.DuckDBPyConnection, statement: str, match: str
) -> None:
    con.execute(statement)
    source = DuckDBTable(con, "votes")
    with pytest.raises(ValueError, match=match) as error:
        source.prepare()
    assert "DuckDB table 'votes'" in str(error.value)
    assert not source.has_rank_table()
    with pytest.raises(ValueError, match=match):
        private_top_k(source, k=1, epsilon=1.0)  # a run on the table as it is now checks it
    frozen = DuckDBTable(con, "votes", frozen=True)
    with pytest.warns(UserWarning, match="no rank table"), pytest.raises(ValueError, match=match):
        private_top_k(frozen, k=1, epsilon=1.0)  # the live fallback validates every run


def test_missing_table_column_and_non_numeric_score(con: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(ValueError, match="DuckDB table 'nope' does not exist"):
        DuckDBTable(con, "nope")
    with pytest.raises(ValueError, match="DuckDB table 'votes' has no column 'count'"):
        DuckDBTable(con, "votes", score="count")
    with pytest.raises(ValueError, match="has no column 'item'"):
        DuckDBTable(con, "votes", id="item")
    with pytest.raises(TypeError, match="column 'label' must be numeric, it is VARCHAR"):
        DuckDBTable(con, "votes", score="label")


def test_prepare_is_idempotent_and_refresh_rebuilds(con: duckdb.DuckDBPyConnection) -> None:
    source = DuckDBTable(con, "votes", frozen=True)
    assert source.check().full_scan and source.is_stale()
    source.prepare()
    assert not source.check().full_scan and not source.is_stale()
    con.execute("UPDATE votes SET score = 100 WHERE id = 3")
    assert source.is_stale()
    source.prepare()  # kept: runs still read the data as of the first prepare()
    with source.snapshot():
        assert source.read_sorted(0, 1).ids.tolist() == [2]
    source.prepare(refresh=True)
    assert not source.is_stale()
    with source.snapshot():
        assert source.read_sorted(0, 3).ids.tolist() == [3, 2, 1]
    con.execute("INSERT INTO votes VALUES (4, 0, 'd')")  # a new item: m changed
    assert source.is_stale()
    # The copy is physically in rank order (what makes rank ranges cheap).
    stored = con.execute(f"SELECT rank FROM {quote_identifier(source.rank_table)}").fetchnumpy()
    assert stored["rank"].tolist() == [0, 1, 2]
    assert "FULL SCAN" in str(source.check())  # random access by id is a hash join, and says so


def test_live_fallback_gives_the_same_answers() -> None:
    """Without prepare() every read is a full scan, but the answers are the canonical ones."""
    con = duckdb.connect()
    scores = plateau_histogram(800, 4)
    ids = [f"item {i:04d}" for i in range(800)]
    con.execute(
        "CREATE TABLE t AS SELECT unnest(?) AS id, unnest(?) AS score", [ids, scores.tolist()]
    )
    source = DuckDBTable(con, "t", frozen=True)
    reference = reference_like(source, scores, np.asarray(ids, dtype=object))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for seed in range(3):
            for method in ("threshold", "oneshot_full_read"):
                got = private_top_k(source, k=4, epsilon=2.0, method=method, seed=seed)
                want = private_top_k(reference, k=4, epsilon=2.0, method=method, seed=seed)
                assert got.items == want.items
                assert got.accesses == want.accesses
        with source.snapshot():
            with pytest.raises(AccessError, match="no item with id 'nope'"):
                source.read_ids(["nope"])


def test_live_run_sees_one_snapshot_under_a_concurrent_writer() -> None:
    """Without a rank table every read goes to the live table, so only the run's transaction
    keeps it consistent: a writer commits a winning score between two batches; the run must not
    see it (it would release the item, or read a domain whose order changed)."""
    con = duckdb.connect()
    scores = plateau_histogram(1000, 3)
    con.execute(
        "CREATE TABLE t AS SELECT unnest(?) AS id, unnest(?) AS score",
        [list(range(1000)), scores.tolist()],
    )
    loser = int(np.flatnonzero(scores == 0)[0])
    source = DuckDBTable(con, "t", frozen=True)
    writer = con.cursor()

    class Hook(CountingSource):
        def read_sorted(self, start: int, count: int) -> Rows:
            rows = super().read_sorted(start, count)
            if start == 0:
                writer.execute("UPDATE t SET score = 1e9 WHERE id = ?", [loser])
            return rows

    hooked = Hook(source)
    want = private_top_k(
        reference_like(hooked, scores), k=3, epsilon=1.0, method="threshold", seed=4
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        got = private_top_k(hooked, k=3, epsilon=1.0, method="threshold", seed=4)
        assert got.items == want.items and got.accesses == want.accesses
        assert hooked.sorted_rows < 1000
        assert private_top_k(source, k=3, epsilon=1.0, method="threshold", seed=4).items[0] == loser


def test_from_votes_counts_distinct_clients_over_all_items() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE items (id VARCHAR)")
    con.execute("INSERT INTO items VALUES ('a'), ('b'), ('c'), ('never voted')")
    con.execute('CREATE TABLE "Raw Votes" ("Client" INTEGER, "what" VARCHAR)')
    con.execute(
        """INSERT INTO "Raw Votes" VALUES (1, 'a'), (1, 'a'), (2, 'a'), (3, 'a'),
        (1, 'b'), (2, 'b'), (NULL, 'b'), (3, 'c')"""
    )
    source = DuckDBTable.from_votes(con, "Raw Votes", "items", client="Client", item="what")
    source.prepare()
    with source.snapshot():
        assert source.domain_size() == 4  # the zero-vote item is part of the domain
        rows = source.read_sorted(0, 4)
    assert rows.ids.tolist() == ["a", "b", "c", "never voted"]
    assert rows.scores.tolist() == [3.0, 2.0, 1.0, 0.0]  # a client counts once per item
    con.execute("""INSERT INTO "Raw Votes" VALUES (4, 'unlisted')""")
    with pytest.raises(ValueError, match="1 vote\\(s\\) for items not in the items table"):
        DuckDBTable.from_votes(con, "Raw Votes", "items", client="Client", item="what", into="x")


def test_from_votes_reads_a_frame_registered_on_the_connection() -> None:
    """Votes in an Arrow table registered on the caller's connection (a view only that
    connection sees) are counted: from_votes runs on the connection, not a cursor of its own."""
    import pyarrow as pa

    con = duckdb.connect()
    con.execute("CREATE TABLE items AS SELECT range AS id FROM range(4)")
    con.register("votes", pa.table({"client": [1, 2, 3, 1], "item": [1, 1, 2, 3]}))
    source = DuckDBTable.from_votes(con, "votes", "items")
    with source.snapshot():
        rows = source.read_sorted(0, 4)
    assert rows.ids.tolist() == [1, 2, 3, 0] and rows.scores.tolist() == [2.0, 1.0, 1.0, 0.0]


def test_a_database_file_path(tmp_path: Path) -> None:
    path = tmp_path / "counts.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute(
            "CREATE TABLE c AS SELECT range AS id, (range * 37) % 101 AS score FROM range(100)"
        )
    source = DuckDBTable(path, "c", frozen=True)
    source.prepare()
    assert private_top_k(source, k=2, epsilon=1e6, seed=1).items == [30, 60]
    source.close()
    reopened = DuckDBTable(str(path), "c", frozen=True)
    assert reopened.has_rank_table()  # prepare() persisted the rank-ordered copy
    reopened.close()


def test_rank_index_is_optional_and_prepare_restores_it() -> None:
    """Without the ART index on rank, random access by rank scans the rank column (still right);
    check() says so, and prepare() recreates the index without rebuilding the copy."""
    con = duckdb.connect()
    scores = np.arange(5000) % 97
    con.execute("CREATE TABLE t AS SELECT range AS id, range % 97 AS score FROM range(5000)")
    source = DuckDBTable(con, "t", frozen=True)
    source.prepare()
    reference = ArraySource(scores)
    ranks = np.sort(np.random.default_rng(0).choice(5000, 300, replace=False))
    assert source.has_rank_index() and "ART index" in str(source.check())
    with source.snapshot():
        assert (
            source.read_positions(ranks).ids.tolist()
            == reference.read_positions(ranks).ids.tolist()
        )
    con.execute(f"DROP INDEX {quote_identifier(source.rank_table + '_rank')}")
    assert not source.has_rank_index() and "no index on rank" in str(source.check())
    with source.snapshot():
        assert (
            source.read_positions(ranks).ids.tolist()
            == reference.read_positions(ranks).ids.tolist()
        )
    con.execute("UPDATE t SET score = 1000 WHERE id = 1")  # not picked up: the copy is kept
    source.prepare()
    assert source.has_rank_index()
    with source.snapshot():
        assert source.read_sorted(0, 1).ids.tolist() == [96]


def test_an_error_inside_a_run_leaves_the_source_usable(con: duckdb.DuckDBPyConnection) -> None:
    source = DuckDBTable(con, "votes", frozen=True)
    source.prepare()
    with pytest.raises(duckdb.Error), source.snapshot():
        source.read_ids(["not an integer"])  # a conversion error aborts the run's transaction
    with pytest.raises(KeyError), source.snapshot():
        raise KeyError("the caller's own error")
    assert private_top_k(source, k=1, epsilon=1e6, seed=0).items == [2]


def test_byte_order_whatever_the_default_collation() -> None:
    """A connection collating case-insensitively still gets byte order ('B' < 'a') and byte-wise
    equality ('a' != 'A'): in the ranks, validation, random access by id, staleness, from_votes."""
    con = duckdb.connect()
    con.execute("SET default_collation = 'nocase'")
    ids = ["a", "B", "b", "A", "é", "z", "ä", "Z"]
    con.execute("CREATE TABLE t AS SELECT unnest(?) AS id, 1 AS score", [ids])
    source = DuckDBTable(con, "t", frozen=True)
    for prepared in (False, True):
        if prepared:
            source.prepare()
            assert not source.is_stale()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            with source.snapshot():
                got = source.read_sorted(0, len(ids)).ids.tolist()
                assert source.read_ids(["a", "A", "Z"]).tolist() == [1.0, 1.0, 1.0]
        assert got == sorted(ids, key=lambda s: s.encode())
    con.execute("UPDATE t SET score = 5 WHERE id COLLATE \"binary\" = 'A'")
    assert source.is_stale()
    source.prepare(refresh=True)
    with source.snapshot():
        assert source.read_ids(["a", "A"]).tolist() == [1.0, 5.0]
    con.execute("CREATE TABLE votes (client INTEGER, item VARCHAR)")
    con.execute("INSERT INTO votes VALUES (1, 'a'), (2, 'a'), (1, 'A')")
    counts = DuckDBTable.from_votes(con, "votes", "t")
    counts.prepare()
    with counts.snapshot():
        assert counts.read_ids(["a", "A", "B"]).tolist() == [2.0, 1.0, 0.0]


def test_sorted_reads_need_no_row_id_order_and_runs_match_array_source() -> None:
    """prepare() writes the rank table in rank order and builds the runs table; sorted reads go
    by row id, proven by the ranks that come back. A rank table stored in another order (here
    reversed by hand) must still serve the canonical order, through the rank predicate; and the
    runs must be those of ArraySource, so answers and every count match it."""
    con = duckdb.connect()
    scores = np.floor(1000.0 / (1 + np.random.default_rng(3).permutation(5000)))
    con.execute(
        "CREATE TABLE t AS SELECT unnest(?) AS id, unnest(?) AS score",
        [list(range(5000)), scores.tolist()],
    )
    source = DuckDBTable(con, "t", frozen=True)
    source.prepare()
    reference = ArraySource(scores)
    with source.snapshot():
        runs, want = source.read_score_runs(), reference.read_score_runs()
        assert source.score_run_count() == len(want[0]) == len(runs[0])
        for got_column, want_column in zip(runs, want, strict=True):
            np.testing.assert_array_equal(got_column, want_column)
    ranks = quote_identifier(source.rank_table)
    mark = con.execute(
        "SELECT comment FROM duckdb_tables() WHERE table_name = ?", [source.rank_table]
    ).fetchone()[0]
    con.execute(f"CREATE OR REPLACE TABLE {ranks} AS SELECT * FROM {ranks} ORDER BY rank DESC")
    # prepare() refuses a rank table without its fingerprint: carry it over to the reordered copy
    con.execute(f"COMMENT ON TABLE {ranks} IS '{mark}'")
    source.prepare()  # restores the index on rank; keeps the (reversed) copy
    with source.snapshot():
        for start, count in ((0, 20), (0, 4000), (1234, 100), (4990, 50)):
            got = source.read_sorted(start, count)
            want_rows = reference.read_sorted(start, count)
            np.testing.assert_array_equal(got.positions, want_rows.positions)
            np.testing.assert_array_equal(got.scores, want_rows.scores)
    for seed in range(5):
        got = private_top_k(source, k=5, epsilon=1.0, method="threshold", seed=seed)
        want = private_top_k(
            reference_like(source, scores), k=5, epsilon=1.0, method="threshold", seed=seed
        )
        assert got.items == want.items and got.accesses == want.accesses


def test_a_prepared_source_skips_the_catalog_until_a_table_is_gone() -> None:
    """After one snapshot has found the rank and runs tables, later snapshots of the same object
    count m and the runs directly. If the runs table or the rank table is dropped behind its
    back, the next run notices (the count fails, the transaction restarts), looks the catalog up
    again and answers correctly without them: no runs, then a full-scan fallback with a warning."""
    con = duckdb.connect()
    scores = plateau_histogram(3000, 4)
    con.execute(
        "CREATE TABLE t AS SELECT unnest(?) AS id, unnest(?) AS score",
        [list(range(3000)), scores.tolist()],
    )
    source = DuckDBTable(con, "t", frozen=True)
    source.prepare()
    want = private_top_k(
        reference_like(source, scores), k=4, epsilon=1.0, method="threshold", seed=2
    )
    for _ in range(2):  # the second snapshot takes the short path
        got = private_top_k(source, k=4, epsilon=1.0, method="threshold", seed=2)
        assert got.items == want.items and got.accesses == want.accesses
    assert source.copies.seen_prepared
    con.execute(f"DROP TABLE {quote_identifier(source.runs_table)}")
    got = private_top_k(source, k=4, epsilon=1.0, method="threshold", seed=2)
    assert source.score_run_count() is None and not source.copies.seen_prepared
    without_runs = private_top_k(
        reference_like(source, scores), k=4, epsilon=1.0, method="threshold", seed=2
    )
    assert got.items == want.items and got.accesses == without_runs.accesses
    source.prepare()  # the runs table again
    assert (
        private_top_k(source, k=4, epsilon=1.0, method="threshold", seed=2).accesses
        == want.accesses
    )
    con.execute(f"DROP TABLE {quote_identifier(source.rank_table)}")
    with pytest.warns(UserWarning, match="no rank table"):
        got = private_top_k(source, k=4, epsilon=1.0, method="threshold", seed=2)
    assert got.items == want.items
