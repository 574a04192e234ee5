"""SQLAlchemyTable(mode="live") on the real SQLite, PostgreSQL and MariaDB.

adapters/sqlalchemy/live_mode.py.

After UPDATE, INSERT and DELETE of counts, with no prepare() in between, a run releases from the new
counts: the reference is ArraySource(scores, ids, positions="input") over the rows read back from
the position table in position order, so with one seed the answer and the access counts must be
the same. Servers: see tests/stores_sqlalchemy.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from adapters.memory import ArraySource
from adapters.sqlalchemy import SQLAlchemyTable
from adapters.sqlalchemy.live_mode import SQLAlchemyLiveTable
from tests.helpers import CountingSource, plateau_histogram
from tests.stores_sqlalchemy import (
    create_counts_table,
    drop_tables,
    live_text_type,
    position_order,
    unique_name,
)
from topk_middleware import private_top_k
from topk_middleware.access import AccessError, Rows, positions_are_ranks

DIALECTS = ["sqlite", "postgres", "mariadb"]


@pytest.fixture(params=DIALECTS)
def dialect(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def engine(request: pytest.FixtureRequest, dialect: str) -> sa.Engine:
    return request.getfixturevalue(f"sqlalchemy_{dialect}_engine")


@pytest.fixture
def live(engine: sa.Engine) -> Iterator[Callable[..., SQLAlchemyLiveTable]]:
    """`live(scores, ids)`: a table holding the histogram, wrapped in mode='live' and prepared
    (positions in id order); dropped afterwards with what prepare() installed."""
    made: list[SQLAlchemyLiveTable] = []

    def make(scores: Any, ids: Any = None) -> SQLAlchemyLiveTable:
        name = unique_name("topk_live")
        create_counts_table(engine, name, scores, ids, text_type=live_text_type(engine))
        source = SQLAlchemyTable(engine, name, mode="live")
        assert isinstance(source, SQLAlchemyLiveTable)
        made.append(source)
        source.prepare()
        return source

    yield make
    for source in made:
        source.uninstall()
    drop_tables(engine, [s.table_name for s in made if s.table_name])


def counts(source: SQLAlchemyLiveTable) -> sa.Table:
    return sa.Table(source.table_name, sa.MetaData(), sa.Column("id"), sa.Column("score"))


def execute(source: SQLAlchemyLiveTable, *statements: Any) -> None:
    """Run statements in one committed transaction of a connection of its own."""
    with source.engine.begin() as conn:
        for statement in statements:
            conn.execute(statement)


def reference_of(source: SQLAlchemyLiveTable) -> ArraySource:
    """ArraySource over the table as it is now, its items named by the live table's positions:
    the ids read back from the position table in position order, their scores from the table."""
    order = position_order(source)
    table = counts(source)
    with source.engine.connect() as conn:
        found = dict(conn.execute(sa.select(table.c.id, table.c.score)).all())
    assert sorted(map(str, found)) == sorted(map(str, order)), "position table != items"
    scores = np.asarray([found[item] for item in order], dtype=np.float64)
    ids = np.empty(len(order), dtype=object)
    ids[:] = order
    if all(isinstance(i, int) for i in order):
        ids = ids.astype(np.int64)
    return ArraySource(scores, ids, positions="input")


def assert_same_as(source: SQLAlchemyLiveTable, reference: ArraySource, seeds: int = 3) -> None:
    """Same items and access counts as the reference, for threshold (default and eager
    oracles) and oneshot, Gumbel and Laplace; and the whole sorted order and position map."""
    for seed in range(seeds):
        for options in (
            {"method": "threshold"},
            {"method": "threshold", "oracle": "eager"},
            {"method": "threshold", "noise": "laplace"},
            {"method": "oneshot"},
        ):
            want = private_top_k(reference, k=3, epsilon=1.0, seed=seed, **options)
            got = private_top_k(source, k=3, epsilon=1.0, seed=seed, **options)
            assert got.items == want.items, (seed, options)
            assert got.m == want.m
            assert (got.accesses.sorted, got.accesses.random) == (
                want.accesses.sorted,
                want.accesses.random,
            ), (seed, options)
            assert got.accesses.rows_inferred == 0  # positions are not ranks: nothing inferred
    m = reference.domain_size()
    with source.snapshot():
        assert source.domain_size() == m
        rows = source.read_sorted(0, m)
        assert_rows_equal(rows, reference.read_sorted(0, m))
        by_position = source.read_positions(np.asarray(rows.positions)[::-1].copy())
    assert_rows_equal(by_position, reference.read_positions(np.asarray(rows.positions)[::-1]))


def assert_rows_equal(got: Rows, want: Rows) -> None:
    assert np.asarray(got.positions).tolist() == np.asarray(want.positions).tolist()
    assert np.asarray(got.ids).tolist() == np.asarray(want.ids).tolist()
    assert np.asarray(got.scores, dtype=np.float64).tolist() == want.scores.tolist()


def histogram(m: int, seed: int, text: bool) -> tuple[np.ndarray, Any]:
    rng = np.random.default_rng(seed)
    scores = np.floor(300.0 / (1.0 + rng.permutation(m)) ** 1.2)  # zipf-like, many zeros
    if not text:
        return scores, rng.permutation(10 * m)[:m] - 5 * m
    letters = rng.choice(list("aBzé"), m)
    ids = np.asarray([f"{letters[i]}{i}" for i in range(m)], dtype=object)
    return scores, ids


# ----- releases from the counts as they are now ---------------------------------------------
@pytest.mark.parametrize("text", [False, True], ids=["int-ids", "text-ids"])
def test_runs_release_from_the_new_counts_after_writes(live, text: bool) -> None:
    """UPDATE of scores, INSERT and DELETE of items (first, middle and last positions, a batch in
    one statement), UPDATE of ids: after each, with no prepare(), runs equal ArraySource over the
    new counts named by the read-back positions. Fails if a write is not seen, if a trigger
    leaves a hole or a stale id in the position table, or if sorted access misses a row."""
    scores, ids = histogram(300, 1, text)
    source = live(scores, ids)
    table = counts(source)
    plain = [i.item() if isinstance(i, np.generic) else i for i in ids]
    assert_same_as(source, reference_of(source))

    top = plain[int(np.argmax(scores))]
    zeros = [plain[i] for i in np.flatnonzero(scores == 0)[:5]]
    execute(  # scores only: the old winner drops to zero, zero-vote items rise
        source,
        table.update().where(table.c.id == top).values(score=0),
        table.update().where(table.c.id.in_(zeros)).values(score=table.c.score + 250),
    )
    assert_same_as(source, reference_of(source))

    order = position_order(source)
    new_ids = ["new-a", "new-b", "Zz"] if text else [10**6, 10**6 + 1, -(10**6)]
    execute(  # delete the items at the first, a middle and the last position; insert three
        source,
        table.delete().where(table.c.id.in_([order[0], order[150], order[-1]])),
        table.insert().values([{"id": new_ids[0], "score": 400}, {"id": new_ids[1], "score": 0}]),
        table.insert().values(id=new_ids[2], score=7),
    )
    assert len(position_order(source)) == 300
    assert_same_as(source, reference_of(source))

    renamed = "renamed" if text else 2 * 10**6
    execute(  # a batch of deletes, then an id changes (delete + insert), then its score
        source,
        table.delete().where(table.c.id.in_(position_order(source)[100:140])),
        table.update().where(table.c.id == new_ids[0]).values(id=renamed),
        table.update().where(table.c.id == renamed).values(score=0),
    )
    assert len(position_order(source)) == 260
    assert position_order(source)[-1] == renamed  # the renamed item took the last position
    assert not source.is_stale()
    assert_same_as(source, reference_of(source))


def test_zero_vote_items_count_and_come_last(live) -> None:
    """Rows of score 0 count in m and are reached by sorted access after every positive count,
    ties by id; a run that reads everything (oneshot) sees all of them."""
    scores = np.asarray([0, 5, 0, 0, 2, 0, 5, 0], dtype=np.float64)
    ids = np.asarray([40, 3, 10, -2, 7, 99, 1, 8])
    source = live(scores, ids)
    with source.snapshot():
        assert source.domain_size() == 8
        rows = source.read_sorted(0, 8)
    assert np.asarray(rows.ids).tolist() == [1, 3, 7, -2, 8, 10, 40, 99]
    assert np.asarray(rows.scores).tolist() == [5, 5, 2, 0, 0, 0, 0, 0]
    result = private_top_k(source, k=8, epsilon=1.0, method="oneshot", seed=0)
    assert sorted(result.items) == sorted(ids.tolist()) and result.accesses.sorted == 8


def test_plateau_reads_a_fraction_without_inference(live) -> None:
    """On the plateau lower-bound instance a live run reads fewer rows than m, answers every
    random access by a read (positions are not ranks), and equals the reference."""
    scores = plateau_histogram(3000, 5)
    source = live(scores, None)
    reference = reference_of(source)
    counting = CountingSource(source)
    got = private_top_k(counting, k=5, epsilon=1.0, method="threshold", seed=3)
    want = private_top_k(reference, k=5, epsilon=1.0, method="threshold", seed=3)
    assert got.items == want.items and got.accesses.rows_inferred == 0
    assert (got.accesses.sorted, got.accesses.random) == (
        want.accesses.sorted,
        want.accesses.random,
    )
    assert counting.rows == got.accesses.rows_fetched < len(scores)


# ----- one snapshot per run -------------------------------------------------------------------
def test_writes_mid_run_change_nothing_within_the_run(live) -> None:
    """Between the first and the later batches of a run, a writer commits a winning score, a
    delete (which moves the last position) and an insert. The run's answer and access counts are
    those of the data before the writes; the next run sees them."""
    scores = plateau_histogram(1500, 3)
    ids = np.arange(1500) + 100
    source = live(scores, ids)
    before = reference_of(source)
    want = private_top_k(before, k=3, epsilon=1.0, method="threshold", seed=21)
    table = counts(source)
    order = position_order(source)
    loser = int(ids[np.flatnonzero(scores == 0)[-1]])

    class WriteMidRun(CountingSource):
        def read_sorted(self, start: int, count: int) -> Rows:
            rows = super().read_sorted(start, count)
            if self.sorted_rows == len(rows):  # after the first batch
                execute(
                    source,
                    table.update().where(table.c.id == loser).values(score=10**9),
                    table.delete().where(table.c.id == order[0]),
                    table.insert().values(id=10**7, score=10**9),
                )
            return rows

    hooked = WriteMidRun(source)
    got = private_top_k(hooked, k=3, epsilon=1.0, method="threshold", seed=21)
    assert hooked.calls >= 3 and hooked.sorted_rows < len(scores)  # the writes fell mid-run
    assert got.items == want.items and loser not in got.items
    assert (got.accesses.sorted, got.accesses.random) == (
        want.accesses.sorted,
        want.accesses.random,
    )
    after = private_top_k(source, k=3, epsilon=1.0, method="threshold", seed=21)
    assert set(after.items[:2]) == {loser, 10**7}  # two scores of 1e9: nothing else comes close
    assert_same_as(source, reference_of(source), seeds=1)


def test_concurrent_item_writers_keep_positions_dense(live, dialect: str) -> None:
    """Four writers insert and delete items at once (PostgreSQL and MariaDB: concurrent
    transactions; SQLite: its single writer serializes them). The count row's lock serializes the
    triggers: afterwards the positions are exactly 0..m-1 over exactly the table's ids."""
    source = live(np.arange(200) % 7, None)
    table = counts(source)
    errors: list[BaseException] = []

    def writer(worker: int) -> None:
        try:
            for step in range(25):
                new = 1000 + 100 * worker + step
                statements = [table.insert().values(id=new, score=step)]
                if step % 2:
                    statements.append(table.delete().where(table.c.id == worker * 50 + step))
                for attempt in range(50):
                    try:
                        execute(source, *statements)
                        break
                    except sa.exc.OperationalError:  # SQLite busy, MariaDB deadlock: retry
                        if attempt == 49:
                            raise
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    order = position_order(source)  # asserts 0..m-1
    assert len(order) == 200 + 4 * 25 - 4 * 12
    assert len(set(order)) == len(order)
    assert_same_as(source, reference_of(source), seeds=1)


def test_snapshot_is_read_only(live) -> None:
    source = live([3, 1, 2], None)
    with source.snapshot(), pytest.raises(sa.exc.DBAPIError):
        source._conn.execute(counts(source).delete())  # type: ignore[union-attr]


# ----- prepare(), check() and refusals --------------------------------------------------------
def test_prepare_again_renumbers_and_keeps_one_set_of_triggers(live) -> None:
    """prepare() twice: positions are rebuilt in id order, and an insert afterwards takes one
    position (a second set of triggers would take two)."""
    source = live([4, 0, 9, 1], [30, 10, 20, 40])
    execute(source, counts(source).insert().values(id=5, score=2))
    assert position_order(source) == [10, 20, 30, 40, 5]
    source.prepare()
    assert position_order(source) == [5, 10, 20, 30, 40]
    execute(source, counts(source).insert().values(id=7, score=2))
    assert position_order(source) == [5, 10, 20, 30, 40, 7]
    assert_same_as(source, reference_of(source), seeds=1)


def test_check_reports_index_reads(live, engine: sa.Engine) -> None:
    """After prepare(), sorted access, random access by position and by id are index reads in
    the dialect's EXPLAIN; before it, check() says FULL SCAN and runs are refused clearly."""
    scores, ids = histogram(500, 2, text=True)
    source = live(scores, ids)
    report = source.check()
    assert not report.full_scan and not any(p.full_scan for p in report.paths), str(report)
    assert [p.access for p in report.paths] == ["sorted", "random by position", "random by id"]
    name = unique_name("topk_live")
    create_counts_table(engine, name, [1, 2], None)
    try:
        fresh = SQLAlchemyTable(engine, name, mode="live")
        assert fresh.check().full_scan
        with pytest.raises(RuntimeError, match="call prepare"):
            private_top_k(fresh, k=1, epsilon=1.0, seed=0)
    finally:
        drop_tables(engine, [name])


def test_invalid_scores_written_after_prepare_are_refused_when_read(live) -> None:
    """Counts are validated by prepare(); a negative score written later is refused by the run
    that reads it (AccessError naming the column), not released."""
    source = live([5, 3, 1], [1, 2, 3])
    table = counts(source)
    execute(source, table.update().where(table.c.id == 2).values(score=-4))
    with pytest.raises(AccessError, match="'score' holds a NULL, NaN, infinite or negative"):
        private_top_k(source, k=1, epsilon=1.0, method="oneshot", seed=0)


def test_bad_mode_and_dialects_without_ordered_indexes_are_refused(
    sqlalchemy_duckdb_engine: sa.Engine, sqlalchemy_sqlite_engine: sa.Engine
) -> None:
    name = unique_name("topk_live")
    create_counts_table(sqlalchemy_duckdb_engine, name, [1, 2], None)
    create_counts_table(sqlalchemy_sqlite_engine, name, [1, 2], None)
    try:
        with pytest.raises(ValueError, match="'duckdb' cannot serve in order"):
            SQLAlchemyTable(sqlalchemy_duckdb_engine, name, mode="live")
        with pytest.raises(ValueError, match="mode must be 'copy' or 'live'"):
            SQLAlchemyTable(sqlalchemy_sqlite_engine, name, mode="fresh")
        copy = SQLAlchemyTable(sqlalchemy_sqlite_engine, name)  # the default: a rank table
        assert not isinstance(copy, SQLAlchemyLiveTable) and positions_are_ranks(copy)
    finally:
        drop_tables(sqlalchemy_duckdb_engine, [name])
        drop_tables(sqlalchemy_sqlite_engine, [name])


def test_mariadb_text_ids_need_a_byte_order_collation(sqlalchemy_mariadb_engine: sa.Engine) -> None:
    """A case-insensitive collation ('a' = 'A') cannot serve the byte order: refused by the
    constructor, before anything is read or created, naming the column and the fix."""
    name = unique_name("topk_live")
    create_counts_table(sqlalchemy_mariadb_engine, name, [1, 2], np.asarray(["a", "A"], object))
    try:
        with pytest.raises(ValueError, match=r"binary NO PAD collation.*utf8mb4_general_ci"):
            SQLAlchemyTable(sqlalchemy_mariadb_engine, name, mode="live")
        assert not sa.inspect(sqlalchemy_mariadb_engine).has_table(f"{name}_topk_pos")
    finally:
        drop_tables(sqlalchemy_mariadb_engine, [name])


def test_postgres_truncate_empties_the_positions(
    sqlalchemy_postgres_engine: sa.Engine,
) -> None:
    """TRUNCATE fires no row trigger; the statement trigger empties the position table, so that
    rows inserted afterwards take positions from 0."""
    name = unique_name("topk_live")
    create_counts_table(sqlalchemy_postgres_engine, name, [1, 2, 3], None)
    source = SQLAlchemyTable(sqlalchemy_postgres_engine, name, mode="live")
    try:
        source.prepare()
        with sqlalchemy_postgres_engine.begin() as conn:
            conn.exec_driver_sql(f'TRUNCATE "{name}"')
        execute(source, counts(source).insert().values([{"id": 9, "score": 1}]))  # type: ignore[arg-type]
        assert position_order(source) == [9]
        assert source.domain_size() == 1
    finally:
        source.uninstall()  # type: ignore[attr-defined]
        drop_tables(sqlalchemy_postgres_engine, [name])
