"""PostgresTable beyond the conformance suite: identifiers, validation, prepare(), check() from
EXPLAIN, the live fallback, one REPEATABLE READ snapshot under a concurrent writer, from_votes,
and the runs table of tied scores (ScoreRuns).

Runs against the server at TOPK_PG_DSN in a schema of its own (tests/stores_postgres.py).
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql

from adapters.memory import ArraySource
from adapters.postgres import PostgresTable
from tests.helpers import (
    RUNS_CASES,
    CountingSource,
    RefreshAfterTheRun,
    RunsKept,
    assert_serves_the_runs_of,
    plateau_histogram,
    reference_like,
)
from tests.stores_postgres import ID_COLUMN, SCORE_COLUMN
from topk_middleware import private_top_k
from topk_middleware.access import AccessError, Rows

Make = Callable[..., PostgresTable]


@pytest.fixture
def conn(pg_conninfo: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        yield conn


@pytest.fixture
def table(conn: psycopg.Connection[Any], pg_schema: str) -> Iterator[Callable[..., str]]:
    """`table(columns_sql, rows)` creates a fresh table in the test schema; returns its name."""
    made: list[str] = []

    def create(columns: str, rows: list[tuple[Any, ...]], name: str | None = None) -> str:
        name = name or f"t_{uuid.uuid4().hex[:8]}"
        ident = sql.Identifier(pg_schema, name)
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(ident, sql.SQL(columns)))
        if rows:
            placeholders = sql.SQL(", ").join(sql.Placeholder() * len(rows[0]))
            insert = sql.SQL("INSERT INTO {} VALUES ({})").format(ident, placeholders)
            with conn.cursor() as cur:
                cur.executemany(insert, [list(row) for row in rows])
        made.append(name)
        return name

    yield create
    for name in made:
        conn.execute(
            sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(sql.Identifier(pg_schema, name))
        )


@pytest.fixture
def open_tables() -> Iterator[list[PostgresTable]]:
    opened: list[PostgresTable] = []
    yield opened
    for source in opened:
        for prepared in (source.runs_table, source.rank_table):
            with psycopg.connect(source._conn.info.dsn, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP TABLE IF EXISTS {}").format(
                        sql.Identifier(source.schema, prepared)
                    )
                )
        source.close()


@pytest.fixture
def make(pg_conninfo: str, pg_schema: str, open_tables: list[PostgresTable]) -> Make:
    def build(name: str, **options: Any) -> PostgresTable:
        source = PostgresTable(pg_conninfo, name, schema=pg_schema, **options)
        open_tables.append(source)
        return source

    return build


AWKWARD_NAMES = [
    "select",
    "My Table",
    'say "hi"',
    "Order",
    "from where",
    "ünïcode",
    "a.b",
    "x" * 63,
]


@pytest.mark.parametrize("name", AWKWARD_NAMES)
def test_awkward_names_work(table, make: Make, name: str) -> None:
    """Names with spaces, quotes, capitals, keywords, dots, and of the maximal length."""
    id_col, score_col = (name[:60] + " id"), name
    cols = sql.SQL("{} text, {} integer").format(sql.Identifier(id_col), sql.Identifier(score_col))
    created = table(cols.as_string(None), [("x", 3), ("y", 9), ("z", 1)], name=name)
    source = make(created, id=id_col, score=score_col)
    source.prepare()
    assert len(source.rank_table.encode()) <= 63
    # PostgreSQL would truncate a longer runs table name, down to the rank table's own name.
    assert len(source.runs_table.encode()) <= 63 and source.runs_table != source.rank_table
    assert source.score_run_count() == 3
    assert not source.check().full_scan
    assert private_top_k(source, k=1, epsilon=1e6, seed=0).items == ["y"]


@pytest.mark.parametrize(
    "rows, match",
    [
        ([(1, 5.0), (2, None)], "'score' has 1 NULL score"),
        ([(1, 5.0), (2, float("nan"))], "'score' has 1 NaN or infinite"),
        ([(1, 5.0), (2, float("inf"))], "'score' has 1 NaN or infinite"),
        ([(1, 5.0), (2, -0.5)], "'score' has 1 negative score"),
        ([(1, 5.0), (1, 2.0), (3, 1.0)], "'id' has duplicate ids .*e.g. 1"),
        ([(1, 5.0), (None, 2.0)], "'id' has 1 NULL id"),
        ([], "is empty"),
    ],
)
def test_bad_contents_are_refused_before_anything_is_released(
    table, make: Make, rows: list[tuple[Any, Any]], match: str
) -> None:
    source = make(table("id integer, score float8", rows))
    with pytest.raises(ValueError, match=match) as error:
        source.prepare()
    assert f"PostgreSQL table {source.schema!r}.{source.table!r}" in str(error.value)
    assert not source.has_rank_table()
    with pytest.warns(UserWarning, match="no rank table"), pytest.raises(ValueError, match=match):
        private_top_k(source, k=1, epsilon=1.0)  # the live fallback validates every run


def test_missing_table_column_and_non_numeric_score(table, make: Make) -> None:
    name = table("id integer, score numeric(10, 2), label text", [(1, 2.5, "a")])
    with pytest.raises(ValueError, match=r"table .*'nope' does not exist"):
        make("nope")
    with pytest.raises(ValueError, match="has no column 'Score'"):
        make(name, score="Score")  # identifiers are case-sensitive: they are always quoted
    with pytest.raises(ValueError, match="has no column 'item'"):
        make(name, id="item")
    with pytest.raises(TypeError, match="column 'label' must be numeric, it is text"):
        make(name, score="label")
    with pytest.warns(UserWarning, match="no rank table"):
        assert private_top_k(make(name), k=1, epsilon=1.0, seed=0).items == [1]  # numeric is ok


def test_a_refused_table_closes_the_connection_it_opened(
    pg_conninfo: str, pg_schema: str, table
) -> None:
    """PostgresTable(dsn, ...) and from_votes(dsn, ...) that refuse their table close the
    connection they opened (psycopg warns of one dropped open once it is garbage collected)."""
    import gc

    name = table("id integer, label text", [(1, "a")])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        with pytest.raises(ValueError, match="does not exist"):
            PostgresTable(pg_conninfo, "nope", schema=pg_schema)
        with pytest.raises(TypeError, match="must be numeric"):
            PostgresTable(pg_conninfo, name, score="label", schema=pg_schema)
        with pytest.raises(ValueError, match="'nope'"):
            PostgresTable.from_votes(pg_conninfo, "nope", name, schema=pg_schema)
        gc.collect()
    dropped = [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)]
    assert dropped == []


def test_text_ids_in_byte_order_whatever_the_column_collation(table, make: Make) -> None:
    """The column's own collation (ICU English: 'a' < 'B') is overridden by COLLATE "C"."""
    ids = ["a", "B", "b", "A", "é", "z", "ä"]
    name = table('id text COLLATE "en-US-x-icu", score integer', [(i, 1) for i in ids])
    for prepared in (False, True):
        source = make(name)
        if prepared:
            source.prepare()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            with source.snapshot():
                got = source.read_sorted(0, len(ids)).ids.tolist()
        assert got == sorted(ids, key=lambda s: s.encode())


def test_prepare_is_idempotent_and_check_reads_the_plans(
    table, make: Make, conn: psycopg.Connection[Any]
) -> None:
    name = table("id bigint, score integer", [(i, i % 13) for i in range(300)])
    source = make(name)
    before = source.check()
    assert before.full_scan and "no rank table" in str(before) and source.is_stale()
    source.prepare()
    source.prepare()
    assert not source.check().full_scan and not source.is_stale()
    assert "FULL SCAN" not in str(source.check())
    conn.execute(
        sql.SQL("UPDATE {} SET score = 1000 WHERE id = 0").format(
            sql.Identifier(source.schema, name)
        )
    )
    assert source.is_stale()
    source.prepare()  # kept; the write counter tells runs to read the table itself
    assert not source.serves_copy() and source.read_sorted(0, 1).ids.tolist() == [0]
    frozen = PostgresTable(source._conn, name, schema=source.schema, frozen=True)
    assert frozen.serves_copy() and frozen.read_sorted(0, 1).ids.tolist() == [12]  # as promised
    source.prepare(refresh=True)
    assert source.serves_copy() and source.read_sorted(0, 1).ids.tolist() == [0]
    assert not source.is_stale()

    # Without the index on id, random access by id falls back to a scan, and check() says so;
    # without the one on rank, sorted access and sampling do. prepare() recreates both.
    def drop(index: str) -> None:
        conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(source.schema, index)))

    drop(source.id_index)
    paths = {p.access: p for p in source.check().paths}
    assert paths["random by id"].full_scan and not paths["sorted"].full_scan
    assert not source.check().full_scan  # the threshold algorithm's accesses are still indexed
    drop(source.rank_index)
    paths = {p.access: p for p in source.check().paths}
    assert paths["sorted"].full_scan and paths["random by rank"].full_scan
    assert source.check().full_scan
    source.prepare()
    assert "FULL SCAN" not in str(source.check())
    assert source.read_sorted(0, 1).ids.tolist() == [0]  # the rank table was kept


def test_live_fallback_gives_the_same_answers(table, make: Make) -> None:
    scores = plateau_histogram(600, 4)
    name = table("id integer, score float8", [(i, float(s)) for i, s in enumerate(scores)])
    source = make(name)
    reference = reference_like(source, scores)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for seed in range(3):
            for method in ("threshold", "oneshot_full_read"):
                got = private_top_k(source, k=4, epsilon=2.0, method=method, seed=seed)
                want = private_top_k(reference, k=4, epsilon=2.0, method=method, seed=seed)
                assert got.items == want.items
                # the same accesses in the same round trips (nothing is read before the run's
                # first batch: the score bound is public, no top row is fetched)
                assert got.accesses == want.accesses
        with source.snapshot(), pytest.raises(AccessError, match="no item with id 10000"):
            source.read_ids([1, 10000])


def test_live_run_sees_one_snapshot_under_a_concurrent_writer(
    table, make: Make, pg_conninfo: str
) -> None:
    """Without a rank table every read goes to the live table, so only the REPEATABLE READ
    transaction keeps the run consistent: a writer on another connection commits a winning score
    between two batches; the run must not see it."""
    scores = plateau_histogram(1000, 3)
    name = table("id integer, score float8", [(i, float(s)) for i, s in enumerate(scores)])
    source = make(name)
    loser = int(np.flatnonzero(scores == 0)[0])
    update = sql.SQL("UPDATE {} SET score = 1e9 WHERE id = %s").format(
        sql.Identifier(source.schema, name)
    )

    class Hook(CountingSource):
        def read_sorted(self, start: int, count: int) -> Rows:
            rows = super().read_sorted(start, count)
            if start == 0:
                with psycopg.connect(pg_conninfo, autocommit=True) as writer:
                    writer.execute(update, [loser])
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


def test_connections_given_by_the_caller(table, pg_conninfo: str, pg_schema: str) -> None:
    name = table("id integer, score integer", [(1, 1), (2, 50), (3, 7)])
    with psycopg.connect(pg_conninfo) as conn:  # not autocommit
        source = PostgresTable(conn, name, schema=pg_schema)
        source.prepare()
        assert private_top_k(source, k=1, epsilon=1e6, seed=0).items == [2]
        assert source.read_ids([3, 1]).tolist() == [7.0, 1.0]
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        conn.execute("SELECT 1")  # the caller opens a transaction of their own
        with pytest.raises(RuntimeError, match="inside a transaction"):
            private_top_k(source, k=1, epsilon=1.0)
        conn.rollback()
        for prepared in (source.runs_table, source.rank_table):
            conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(pg_schema, prepared)))
        conn.commit()


def test_from_votes_counts_distinct_clients_over_all_items(
    table, pg_conninfo: str, pg_schema: str, open_tables: list[PostgresTable]
) -> None:
    items = table("id text", [("a",), ("b",), ("c",), ("never voted",)])
    votes = table(
        '"Client" integer, "what" text',
        [(1, "a"), (1, "a"), (2, "a"), (3, "a"), (1, "b"), (2, "b"), (None, "b"), (3, "c")],
    )
    counts = f"{votes} counts"
    source = PostgresTable.from_votes(
        pg_conninfo, votes, items, client="Client", item="what", into=counts, schema=pg_schema
    )
    open_tables.append(source)
    source.prepare()
    with source.snapshot():
        assert source.domain_size() == 4  # the zero-vote item is part of the domain
        rows = source.read_sorted(0, 4)
    assert rows.ids.tolist() == ["a", "b", "c", "never voted"]
    assert rows.scores.tolist() == [3.0, 2.0, 1.0, 0.0]  # a client counts once per item
    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        ident = sql.Identifier(pg_schema, votes)
        conn.execute(sql.SQL("INSERT INTO {} VALUES (4, 'unlisted')").format(ident))
        with pytest.raises(ValueError, match="1 vote\\(s\\) for items not in the items table"):
            PostgresTable.from_votes(
                conn, votes, items, client="Client", item="what", into="x", schema=pg_schema
            )
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(pg_schema, counts)))


@pytest.mark.parametrize("prepared", [True, False])
def test_large_sorted_reads_come_packed(
    table, make: Make, monkeypatch: pytest.MonkeyPatch, prepared: bool
) -> None:
    """Large sorted reads with integer ids come packed in one bytea per column, unpacked by numpy:
    the rows must be exactly the canonical ones (the path is forced here on a small table)."""
    import adapters.dialects.postgres

    rng = np.random.default_rng(2)
    scores = rng.integers(0, 50, 3000)
    ids = rng.permutation(10**6)[:3000] - 500_000
    name = table(
        "id integer, score smallint", list(zip(ids.tolist(), scores.tolist(), strict=True))
    )
    source = make(name)
    if prepared:
        source.prepare()
    reference = ArraySource(scores, ids)
    monkeypatch.setattr(adapters.dialects.postgres, "PACKED_MIN_ROWS", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with source.snapshot():
            for start, count in ((0, 3000), (17, 1000), (2990, 50)):
                got, want = source.read_sorted(start, count), reference.read_sorted(start, count)
                assert got.positions.tolist() == want.positions.tolist()
                assert got.ids.tolist() == want.ids.tolist()
                assert got.scores.tolist() == want.scores.tolist()
        for seed in range(2):
            got = private_top_k(source, k=3, epsilon=1.0, method="oneshot_full_read", seed=seed)
            assert (
                got.items
                == private_top_k(
                    reference, k=3, epsilon=1.0, method="oneshot_full_read", seed=seed
                ).items
            )


def test_an_unreachable_server_fails_in_ci_and_skips_with_advice_outside() -> None:
    """The PostgreSQL fixtures: with CI set an unreachable server is a failure; without it, a
    skip that says how to provide a server (or a throwaway pgserver when that is installed)."""
    env = dict(os.environ, TOPK_PG_DSN="host=127.0.0.1 port=1 dbname=test connect_timeout=2")
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-n", "0"]
    command += ["tests/stores/test_postgres.py::test_awkward_names_work", "-k", "select"]
    root = Path(__file__).resolve().parents[2]
    ci = subprocess.run(command, env={**env, "CI": "1"}, cwd=root, capture_output=True, text=True)
    assert ci.returncode != 0 and "unreachable" in ci.stdout
    env.pop("CI", None)
    local = subprocess.run(command, env=env, cwd=root, capture_output=True, text=True)
    if importlib.util.find_spec("pgserver") is None:
        assert local.returncode == 0 and "skipped" in local.stdout
        assert "set TOPK_PG_DSN" in local.stdout and "pip install pgserver" in local.stdout
    else:
        assert local.returncode == 0 and "passed" in local.stdout


def test_check_on_a_live_table_with_its_own_btrees(
    table, make: Make, conn: psycopg.Connection[Any]
) -> None:
    """Without a rank table, a B-tree on (score DESC, id COLLATE "C") serves sorted access and
    one on id serves random access by id; sampling by rank still reads the whole table."""
    name = table("id text, score integer", [(f"i{i}", i % 17) for i in range(500)])
    source = make(name)
    ident = sql.Identifier(source.schema, name)
    paths = {p.access: p.full_scan for p in source.check().paths}
    assert paths == {"sorted": True, "random by rank": True, "random by id": True}
    conn.execute(sql.SQL('CREATE INDEX ON {} (score DESC, id COLLATE "C")').format(ident))
    conn.execute(sql.SQL("CREATE INDEX ON {} (id)").format(ident))
    paths = {p.access: p.full_scan for p in source.check().paths}
    assert paths == {"sorted": False, "random by rank": True, "random by id": False}
    assert source.check().full_scan  # sampling, which the threshold algorithm needs, is a scan


# ----- runs of tied scores (ScoreRuns) --------------------------------------------------------
@pytest.mark.parametrize("case", RUNS_CASES)
def test_runs_are_those_of_array_source(
    make_postgres_source: Make, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """After prepare() the snapshot counts the runs with m and reads them in one query (plain,
    or packed in bytea when they are many): exactly ArraySource's runs of the same data."""
    import adapters.dialects.postgres

    scores, ids = RUNS_CASES[case]
    source = make_postgres_source(scores, ids)
    first, run_scores = ArraySource(scores, ids).read_score_runs()
    assert source.score_run_count() == len(first)
    with source.snapshot():
        assert source.score_run_count() == len(first)
        plain = source.read_score_runs()
        monkeypatch.setattr(adapters.dialects.postgres, "PACKED_MIN_ROWS", 1)
        packed = source.read_score_runs()
    for got_first, got_scores in (plain, packed):
        assert got_first.dtype == np.int64 and got_scores.dtype == np.float64
        assert got_first.tolist() == first.tolist()
        assert got_scores.tolist() == run_scores.tolist()
    assert "scores of tied runs from" in str(source.check())


def test_a_rank_table_prepared_before_runs_tables_existed(
    make_postgres_source: Make, conn: psycopg.Connection[Any], pg_conninfo: str
) -> None:
    """Without its runs table (dropped: as prepared by an older version) a rank table still
    serves runs, with no runs and the answers of ArraySource without them; prepare() builds
    the runs table again, from the rank table it keeps (not from the changed live table)."""
    scores = plateau_histogram(4000, 5)
    source = make_postgres_source(scores, None)
    conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(source.schema, source.runs_table)))
    fresh = PostgresTable(
        pg_conninfo,
        source.table,
        id=ID_COLUMN,
        score=SCORE_COLUMN,
        schema=source.schema,
        frozen=True,
    )
    try:
        for store in (source, fresh):
            assert store.score_run_count() is None
            with store.snapshot():
                assert store.score_run_count() is None
            assert "no runs table" in str(store.check()) and not store.check().full_scan
            reference = reference_like(store, scores)
            assert not hasattr(reference, "read_score_runs")  # runs hidden: neighbours only
            for seed in range(2):
                got = private_top_k(store, k=5, epsilon=1.0, method="threshold", seed=seed)
                want = private_top_k(reference, k=5, epsilon=1.0, method="threshold", seed=seed)
                assert got.items == want.items and got.accesses == want.accesses
    finally:
        fresh.close()
    zero = int(np.flatnonzero(scores == 0)[0])
    conn.execute(
        sql.SQL("UPDATE {} SET {} = 7 WHERE {} = %s").format(
            sql.Identifier(source.schema, source.table),
            sql.Identifier(SCORE_COLUMN),
            sql.Identifier(ID_COLUMN),
        ),
        [zero],
    )
    source.prepare()  # no refresh: the rank table is kept, its runs table is built
    assert source.is_stale()  # the update is not in the rank table, nor in its runs
    assert_serves_the_runs_of(source, scores)


def test_runs_are_read_in_the_runs_snapshot(make_postgres_source: Make, pg_conninfo: str) -> None:
    """Right before the run reads the runs, a writer rewrites every count (seven runs instead
    of two) and refreshes the rank and runs tables, committed: the run still reads the runs of
    its snapshot (with the count it took at the start), so items and AccessStats are those of
    the data before. Would fail if the runs were read outside the snapshot (seven runs where two
    were announced: an AccessError; or the wrong scores)."""
    scores = plateau_histogram(3000, 4)
    source = make_postgres_source(scores, None)
    live = sql.Identifier(source.schema, source.table)

    refreshes: list[RefreshAfterTheRun] = []

    def refresh() -> None:
        writer = PostgresTable(
            pg_conninfo, source.table, id=ID_COLUMN, score=SCORE_COLUMN, schema=source.schema
        )
        writer.prepare(refresh=True, swap_timeout=60)
        writer.close()

    def rewrite() -> None:
        with psycopg.connect(pg_conninfo, autocommit=True) as writer:
            writer.execute(
                sql.SQL("UPDATE {} SET {} = {} % 7").format(
                    live, sql.Identifier(SCORE_COLUMN), sql.Identifier(ID_COLUMN)
                )
            )
        # The refresh waits for this run (it swaps the tables the run reads), so: a thread.
        refreshes.append(RefreshAfterTheRun(refresh))

    hooked = RunsKept(source, before_runs=rewrite)
    got = private_top_k(hooked, k=4, epsilon=1.0, method="threshold", seed=3)
    want = private_top_k(ArraySource(scores), k=4, epsilon=1.0, method="threshold", seed=3)
    assert hooked.runs_read == 1 and hooked.before_runs is None  # the write came mid-run
    assert got.items == want.items and got.accesses == want.accesses
    assert got.accesses.rows_inferred > 0
    assert all(refreshes) and len(refreshes) == 1  # the refresh committed after the run
    assert source.score_run_count() == 7  # committed: a new snapshot sees the new runs
    after = private_top_k(source, k=4, epsilon=1.0, method="threshold", seed=3)
    new = np.arange(3000) % 7
    assert (
        after.items
        == private_top_k(ArraySource(new), k=4, epsilon=1.0, method="threshold", seed=3).items
    )


def test_array_literal_parameters_read_back_exactly(conn: psycopg.Connection[Any]) -> None:
    """The exceedances go to PostgreSQL as array literals (adapters/_sql.py): every double
    reads back bit for bit (shortest repr; subnormal, negative zero, 2^53 + 2, the largest
    double), every bigint, and tids (block, offset) from slots block * per_page + offset - 1."""
    from adapters._sql import float_array_literal, int_array_literal, tid_array_literal

    rng = np.random.default_rng(5)
    doubles = np.concatenate(
        [
            [0.1, -0.0, 5e-324, 2.0**53 + 2, 1.7976931348623157e308, -math.pi],
            rng.gumbel(0.0, 3.7, 500),
            rng.laplace(0.0, 1e-9, 100),
        ]
    )
    (back,) = conn.execute("SELECT %s::float8[]", [float_array_literal(doubles)]).fetchone()
    assert np.array_equal(np.array(back).view(np.int64), doubles.view(np.int64))
    ints = np.array([0, -1, 2**63 - 1, -(2**63), *rng.integers(0, 10**12, 50)], dtype=np.int64)
    (back,) = conn.execute("SELECT %s::bigint[]", [int_array_literal(ints)]).fetchone()
    assert back == ints.tolist()
    (tids,) = conn.execute(
        "SELECT array_agg(t::text ORDER BY n) FROM unnest(%s::tid[]) WITH ORDINALITY AS u(t, n)",
        [tid_array_literal(np.array([0, 290, 291, 10**6]), 291)],
    ).fetchone()
    assert tids == ["(0,1)", "(0,291)", "(1,1)", f"({10**6 // 291},{10**6 % 291 + 1})"]
