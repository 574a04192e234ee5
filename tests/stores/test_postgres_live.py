"""PostgresTable(mode="live") on the real server: releases from the table as it is now.

The reference for a live table is ArraySource over the same counts with the same positions
(`positions="input"`, arrays in position order): with one seed both must give the same answer
and the same sequential access counts, whatever was written since `prepare()`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql
from scipy import stats

from adapters.memory import ArraySource
from adapters.postgres import PostgresTable
from adapters.postgres.live import draws as postgres_live
from tests.helpers import CountingSource, plateau_histogram
from tests.stores_postgres import ID_COLUMN, SCORE_COLUMN, TABLE, _connect, create_table
from topk_middleware import private_top_k
from topk_middleware.access import AccessError, Rows, RunTraits, StoreCosts

Made = Callable[..., PostgresTable]


@pytest.fixture
def make_live(pg_conninfo: str, pg_schema: str) -> Iterator[Made]:
    made: list[PostgresTable] = []

    def make(scores: Any, ids: Any = None, **options: Any) -> PostgresTable:
        name = TABLE.format(uuid.uuid4().hex[:8])
        with _connect(pg_conninfo) as conn:
            create_table(conn, pg_schema, name, scores, ids)
        source = PostgresTable(
            pg_conninfo,
            name,
            id=ID_COLUMN,
            score=SCORE_COLUMN,
            schema=pg_schema,
            mode="live",
            **options,
        )
        made.append(source)
        source.prepare()
        return source

    yield make
    for source in made:
        source.close()


def execute(conninfo: str, source: PostgresTable, statement: str, *params: Any) -> None:
    """Run a write on a connection of its own, committed: {t}, {id}, {score} name the table."""
    with _connect(conninfo) as conn:
        conn.execute(
            sql.SQL(statement).format(
                t=sql.Identifier(source.schema, source.table),
                id=sql.Identifier(ID_COLUMN),
                score=sql.Identifier(SCORE_COLUMN),
            ),
            list(params),
        )


def reference(conninfo: str, source: PostgresTable, positions: str | None = None) -> ArraySource:
    """ArraySource over the table's current counts, its arrays in the position table's order
    (read with the server, independently of the adapter's reads); with positions="ranks", the
    rank-ordered reference a run serving canonical ranks must match (None: whichever the
    store serves now). It prices reads as the store does (`store_costs`), so that method="auto"
    chooses alike on both."""
    if positions is None:
        positions = "ranks" if source.positions_are_ranks else "input"
    query = sql.SQL(
        "SELECT p.position, b.{id}, b.{score}::float8 FROM {pos} AS p JOIN {t} AS b "
        "ON b.{id} = p.id ORDER BY p.position"
    ).format(
        id=sql.Identifier(ID_COLUMN),
        score=sql.Identifier(SCORE_COLUMN),
        pos=sql.Identifier(source.schema, source.position_table),
        t=sql.Identifier(source.schema, source.table),
    )
    with _connect(conninfo) as conn:
        records = conn.execute(query).fetchall()
        (count,) = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(source.schema, source.table))
        ).fetchone()
    assert [r[0] for r in records] == list(range(count))  # positions are dense 0..m-1
    return _Costed(
        source.store_costs, [r[2] for r in records], [r[1] for r in records], positions=positions
    )


class _Costed(ArraySource):
    """An ArraySource priced as a store is (RunTraits.costs), so that `auto` plans alike."""

    def __init__(self, costs: StoreCosts, *args: Any, **options: Any) -> None:
        super().__init__(*args, **options)
        self.costs = costs

    def run_traits(self) -> RunTraits:
        return replace(super().run_traits(), costs=self.costs)


def assert_same_releases(source: PostgresTable, want: ArraySource, k: int) -> None:
    for seed in range(4):
        for options in (
            {},  # the default planner, priced with the store's costs on both sides
            {"method": "threshold"},
            {"method": "threshold", "oracle": "eager"},
            {"method": "oneshot"},
            {"method": "threshold", "noise": "laplace"},
        ):
            got = private_top_k(source, k, 1.0, seed=seed, **options)
            ref = private_top_k(want, k, 1.0, seed=seed, **options)
            assert got.items == ref.items, (seed, options)
            assert got.method == ref.method == options.get("method", ref.method), options
            assert (got.accesses.sorted, got.accesses.random) == (
                ref.accesses.sorted,
                ref.accesses.random,
            )
            assert got.m == ref.m


def test_live_runs_release_from_the_counts_after_writes(pg_conninfo: str, make_live: Made) -> None:
    """UPDATE, INSERT and DELETE of counts, no prepare() in between: each run releases from the
    new counts, exactly as ArraySource over them with the same positions. Fails if a run read a
    stale copy, if positions were not kept dense (an item reachable twice or never, a wrong m),
    or if sorted access and random access disagreed on an item."""
    rng = np.random.default_rng(7)
    scores = rng.integers(0, 40, 3000)
    source = make_live(scores, np.arange(3000) * 3)  # the default: the position table
    assert not source.positions_are_ranks and source.score_run_count() is None
    assert_same_releases(source, reference(pg_conninfo, source), 5)

    execute(
        pg_conninfo, source, "UPDATE {t} SET {score} = {score} + 500 WHERE {id} = ANY(%s)", [9, 300]
    )
    released = private_top_k(source, 2, 1.0).items
    assert set(released) == {9, 300}  # 500 votes ahead: the new counts are read
    assert_same_releases(source, reference(pg_conninfo, source), 5)

    execute(pg_conninfo, source, "DELETE FROM {t} WHERE {id} = ANY(%s)", [0, 9, 4500, 8997])
    execute(pg_conninfo, source, "INSERT INTO {t} VALUES (%s, %s), (%s, %s)", -1, 900, 10**6, 0)
    want = reference(pg_conninfo, source)
    assert want.domain_size() == 3000 - 4 + 2
    assert_same_releases(source, want, 5)
    assert private_top_k(source, 1, 1.0).items == [-1]

    execute(pg_conninfo, source, "UPDATE {t} SET {id} = %s WHERE {id} = %s", 77777, -1)
    assert private_top_k(source, 1, 1.0).items == [77777]  # a changed id is a new item
    assert_same_releases(source, reference(pg_conninfo, source), 3)


def test_sorted_and_positional_reads_agree(pg_conninfo: str, make_live: Made) -> None:
    """Sorted access over the whole domain, in uneven reads, is the canonical order (score
    descending, ties by id), and reading the same positions by random access gives the same rows;
    text ids compare in byte order."""
    ids = ["b", "B", "a", "é", "a ", "Z", "ab", "c"] * 1
    scores = [3, 3, 3, 1, 3, 0, 1, 3]
    source = make_live(scores, ids)
    execute(pg_conninfo, source, "INSERT INTO {t} VALUES ('A', 3), ('zz', 1)")
    execute(pg_conninfo, source, "DELETE FROM {t} WHERE {id} = 'a'")
    canonical = sorted(
        zip(
            [3, 3, 3, 1, 3, 0, 1, 3, 3, 1],
            ["b", "B", "a", "é", "a ", "Z", "ab", "c", "A", "zz"],
            strict=True,
        ),
        key=lambda r: (-r[0], r[1].encode()),
    )
    canonical = [r for r in canonical if r[1] != "a"]
    with source.snapshot():
        m = source.domain_size()
        parts = [source.read_sorted(0, 2), source.read_sorted(2, 3), source.read_sorted(5, 10)]
        again = source.read_sorted(1, 3)  # not where the cursor stands: read afresh
        positions = np.concatenate([p.positions for p in parts])
        by_position = source.read_positions(positions)
    assert m == len(canonical)
    got = [(s, i) for p in parts for s, i in zip(p.scores.tolist(), p.ids.tolist(), strict=True)]
    assert got == [(float(s), i) for s, i in canonical]
    assert again.ids.tolist() == [i for _, i in canonical[1:4]]
    assert sorted(positions.tolist()) == list(range(m))
    found = dict(zip(by_position.positions.tolist(), by_position.ids.tolist(), strict=True))
    assert [found[p] for p in positions.tolist()] == [i for _, i in canonical]


def test_a_concurrent_writer_changes_nothing_within_a_run(
    pg_conninfo: str, make_live: Made
) -> None:
    """Writes committed between two reads of a run (a count that would win, a delete, an
    insert) are not seen by that run: same answer and access counts as before the writes; the
    next run sees them."""
    scores = plateau_histogram(1500, 3)
    source = make_live(scores)
    before = reference(pg_conninfo, source)
    loser = int(np.flatnonzero(scores == 0)[-1])
    expected = private_top_k(before, 3, 1.0, method="threshold", seed=21)

    class WriteBetweenReads(CountingSource):
        def read_sorted(self, start: int, count: int) -> Rows:
            rows = super().read_sorted(start, count)
            if self.sorted_rows == len(rows):  # after the first read
                execute(pg_conninfo, source, "UPDATE {t} SET {score} = 10^9 WHERE {id} = %s", loser)
                execute(pg_conninfo, source, "DELETE FROM {t} WHERE {id} = %s", int(rows.ids[0]))
                execute(pg_conninfo, source, "INSERT INTO {t} VALUES (%s, 10^9)", 10**7)
            return rows

    hooked = WriteBetweenReads(source)
    result = private_top_k(hooked, 3, 1.0, method="threshold", seed=21)
    assert hooked.calls >= 3 and hooked.sorted_rows < len(scores)
    assert result.items == expected.items
    assert (result.accesses.sorted, result.accesses.random) == (
        expected.accesses.sorted,
        expected.accesses.random,
    )
    assert set(private_top_k(source, 2, 1.0).items) == {loser, 10**7}


def test_live_runs_refuse_bad_scores_written_after_prepare(
    pg_conninfo: str, make_live: Made
) -> None:
    """A live run checks the scores' extremes in its first query (index probes, no scan): a
    NULL, NaN, infinite or negative score written since prepare() is refused with a message
    naming the table and column, before anything is released."""
    source = make_live(np.arange(50, dtype=float) + 0.5)
    for value, message in (
        (None, "NULL score"),
        ("NaN", "non-finite"),
        ("Infinity", "non-finite"),
        (-2.0, "negative"),
    ):
        execute(pg_conninfo, source, "UPDATE {t} SET {score} = %s WHERE {id} = 3", value)
        with pytest.raises(ValueError, match=message) as error:
            private_top_k(source, 2, 1.0)
        assert SCORE_COLUMN in str(error.value)
    execute(pg_conninfo, source, "UPDATE {t} SET {score} = 1 WHERE {id} = 3")
    assert len(private_top_k(source, 2, 1.0).items) == 2
    with pytest.raises(psycopg.errors.RaiseException, match="no NULL id"):
        execute(pg_conninfo, source, "INSERT INTO {t} VALUES (NULL, 1)")
    # Item inserts and deletes under a snapshot isolation level are refused (a snapshot older
    # than the trigger's lock would misplace a position); count updates are not.
    table = sql.Identifier(source.schema, source.table)
    with _connect(pg_conninfo) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with pytest.raises(psycopg.errors.RaiseException, match="READ COMMITTED only"):
            with conn.transaction():
                conn.execute(sql.SQL("INSERT INTO {} VALUES (999, 1)").format(table))
        with conn.transaction():
            conn.execute(
                sql.SQL("UPDATE {} SET {} = 2 WHERE {} = 4").format(
                    table, sql.Identifier(SCORE_COLUMN), sql.Identifier(ID_COLUMN)
                )
            )


def test_prepare_is_idempotent_and_needed(pg_conninfo: str, pg_schema: str) -> None:
    """Without prepare() a live run says what to do; prepare() twice installs one set of
    triggers and indexes, check() reports index scans (on a table large enough for the planner
    to prefer them), and a duplicate id is refused."""
    name = TABLE.format(uuid.uuid4().hex[:8])
    with _connect(pg_conninfo) as conn:
        create_table(conn, pg_schema, name, np.arange(20_000) % 97, np.arange(20_000))
        conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(pg_schema, name)))
    source = PostgresTable(
        pg_conninfo, name, id=ID_COLUMN, score=SCORE_COLUMN, schema=pg_schema, mode="live"
    )
    with pytest.raises(ValueError, match="call prepare"):
        private_top_k(source, 1, 1.0)
    source.prepare()
    source.prepare(refresh=True)
    with _connect(pg_conninfo) as conn:
        table = sql.Identifier(pg_schema, name).as_string(conn)
        triggers = conn.execute(
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal",
            [table],
        ).fetchone()[0]
        indexes = conn.execute(
            "SELECT count(*) FROM pg_index WHERE indrelid = %s::regclass", [table]
        ).fetchone()[0]
    assert (triggers, indexes) == (3, 2)
    assert not any(path.full_scan for path in source.check().paths)
    assert source.is_stale() is False
    with pytest.raises(ValueError, match="mode must be one of"):
        PostgresTable(pg_conninfo, name, mode="frozen")

    dup = TABLE.format(uuid.uuid4().hex[:8])
    with _connect(pg_conninfo) as conn:
        create_table(conn, pg_schema, dup, [5, 4, 3], [1, 1, 3])
    duplicated = PostgresTable(
        pg_conninfo, dup, id=ID_COLUMN, score=SCORE_COLUMN, schema=pg_schema, mode="live"
    )
    with pytest.raises(ValueError, match="duplicate"):
        duplicated.prepare()
    source.close()
    duplicated.close()


def test_from_votes_live_counts_zero_vote_items(pg_conninfo: str, pg_schema: str) -> None:
    """from_votes(..., mode='live'): items without votes count in m and come last."""
    votes, items = f"votes_{uuid.uuid4().hex[:6]}", f"items_{uuid.uuid4().hex[:6]}"
    with _connect(pg_conninfo) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(pg_schema)))
        conn.execute(
            sql.SQL("CREATE TABLE {} (client int, item int)").format(sql.Identifier(votes))
        )
        conn.execute(sql.SQL("CREATE TABLE {} (id int)").format(sql.Identifier(items)))
        conn.execute(
            sql.SQL("INSERT INTO {} SELECT generate_series(0, 99)").format(sql.Identifier(items))
        )
        conn.execute(
            sql.SQL("INSERT INTO {} VALUES (1, 5), (2, 5), (3, 5), (1, 7)").format(
                sql.Identifier(votes)
            )
        )
    source = PostgresTable.from_votes(
        pg_conninfo, votes, items, schema=pg_schema, mode="live", into=f"{votes}_live"
    )
    source.prepare()
    with source.snapshot():
        assert source.domain_size() == 100
        rows = source.read_sorted(0, 100)
    assert rows.ids.tolist()[:2] == [5, 7] and rows.scores.tolist()[2:] == [0.0] * 98
    source.close()


def test_few_runs_serve_canonical_ranks_after_writes(pg_conninfo: str, make_live: Made) -> None:
    """With max_score_runs, a run over few distinct scores learns them in its snapshot and names
    items by canonical rank: with one seed it releases exactly what the rank-ordered ArraySource
    over the current counts releases, with the same access counts, before and after UPDATE,
    INSERT and DELETE with no prepare() in between. Fails if the runs were stale or miscounted
    (a wrong score inferred, a wrong m), or if an id read by (score, offset in its run) were not
    the canonical row of that rank."""
    rng = np.random.default_rng(11)
    scores = rng.integers(0, 40, 3000)
    source = make_live(scores, np.arange(3000) * 3, max_score_runs=64)
    assert source.positions_are_ranks and source.score_run_count() == len(np.unique(scores))
    assert_same_releases(source, reference(pg_conninfo, source, "ranks"), 5)
    with source.snapshot():
        first, run_scores = source.read_score_runs()
    distinct, counts = np.unique(scores, return_counts=True)
    np.testing.assert_array_equal(run_scores, distinct[::-1].astype(np.float64))
    np.testing.assert_array_equal(first, np.concatenate(([0], np.cumsum(counts[::-1])[:-1])))

    execute(
        pg_conninfo, source, "UPDATE {t} SET {score} = {score} + 500 WHERE {id} = ANY(%s)", [9, 300]
    )
    assert set(private_top_k(source, 2, 1.0).items) == {9, 300}
    assert_same_releases(source, reference(pg_conninfo, source, "ranks"), 5)
    execute(pg_conninfo, source, "DELETE FROM {t} WHERE {id} = ANY(%s)", [0, 9, 4500, 8997])
    execute(pg_conninfo, source, "INSERT INTO {t} VALUES (%s, %s), (%s, %s)", -1, 900, 10**6, 0)
    want = reference(pg_conninfo, source, "ranks")
    assert want.domain_size() == 3000 - 4 + 2
    assert source.positions_are_ranks
    assert_same_releases(source, want, 5)


def test_ranks_are_read_from_either_end_of_a_run(pg_conninfo: str, make_live: Made) -> None:
    """Random access by rank reads each row at (its run's score, its offset in the run), from
    the nearer end: every rank of every run, text ids in byte order, equals the canonical row.
    The largest run is sized from m (run_count_rows stops its count): fails if that size or an
    offset were wrong by one."""
    ids = np.asarray([f"i{n:04d}" if n % 3 else f"I{n}" for n in range(600)], dtype=object)
    scores = np.where(np.arange(600) % 7 == 0, 5, np.where(np.arange(600) % 5 == 0, 2, 0))
    source = make_live(scores, ids, max_score_runs=8, run_count_rows=390)
    want = ArraySource(scores, ids, positions="ranks")
    with source.snapshot():
        assert source.positions_are_ranks and source.score_run_count() == 3
        ranks = np.random.default_rng(2).permutation(600)
        got = source.read_positions(ranks)
        sorted_rows = source.read_sorted(0, 600)
    expected = want.read_positions(np.sort(ranks))
    by_rank = dict(zip(got.positions.tolist(), got.ids.tolist(), strict=True))
    assert [by_rank[r] for r in range(600)] == expected.ids.tolist()
    assert sorted_rows.positions.tolist() == list(range(600))
    assert sorted_rows.ids.tolist() == expected.ids.tolist()


@pytest.mark.parametrize(
    ("scores", "options", "why"),
    [
        (np.arange(300) % 50, {"max_score_runs": 20}, "more distinct scores than max_score_runs"),
        (np.arange(300) % 2, {"max_score_runs": 20, "run_count_rows": 200}, "two large runs"),
        (np.zeros(300), {"max_score_runs": 0}, "max_score_runs = 0 (runs off)"),
    ],
)
def test_many_or_costly_runs_keep_the_position_table(
    pg_conninfo: str, make_live: Made, scores: np.ndarray, options: dict, why: str
) -> None:
    """Where the runs are many or costly to count, a run names items by the position table, and
    releases as ArraySource in position order does. Fails if it served ranks anyway."""
    source = make_live(scores, np.arange(len(scores)) * 2 + 1, **options)
    assert not source.positions_are_ranks, why
    assert source.score_run_count() is None
    assert_same_releases(source, reference(pg_conninfo, source), 3)


def test_max_score_runs_is_checked(pg_conninfo: str, pg_schema: str) -> None:
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(ValueError, match="max_score_runs must be an integer"):
            PostgresTable(pg_conninfo, "t", schema=pg_schema, mode="live", max_score_runs=bad)


def test_ranked_runs_take_the_runs_before_any_row_by_rank(
    pg_conninfo: str, make_live: Made
) -> None:
    """A row by rank walks its run (its offset on the B-tree), so a run serving ranks must take
    its runs of tied scores before it reads any row by rank: on a plateau (few runs, a long run
    of zeros), the rows read by rank are at most the k released ids. Fails if the core read the
    first small batch of random accesses as rows (the ski rental of copies that keep runs)."""
    scores = plateau_histogram(4000, 5, height=1000.0)
    low = np.flatnonzero(scores == 0)[:40]
    scores[low] = np.arange(1, 41)  # 40 more runs: more than a first batch of random accesses
    source = make_live(scores, np.arange(4000) * 5 + 2, max_score_runs=64)
    by_rank: list[int] = []
    read_positions = source.read_positions

    def counted(positions: np.ndarray) -> Rows:
        by_rank.append(len(positions))
        return read_positions(positions)

    source.read_positions = counted  # type: ignore[method-assign]
    want = reference(pg_conninfo, source, "ranks")
    for seed in range(6):
        by_rank.clear()
        got = private_top_k(source, 5, 1.0, method="threshold", seed=seed)
        ref = private_top_k(want, 5, 1.0, method="threshold", seed=seed)
        assert got.items == ref.items
        assert got.accesses.random > 0  # answered from the runs (exact) or their bounds
        assert got.accesses.rows_inferred + got.accesses.rows_bounded > 0
        assert sum(by_rank) <= 5, by_rank


def canonical_ranks(scores: np.ndarray, ids: np.ndarray) -> dict[Any, int]:
    """Each id's rank in the canonical order (score descending, ties by id), computed here."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], ids[i]))
    return {ids[i]: rank for rank, i in enumerate(order)}


def test_deep_tied_ranks_are_named_by_uniform_draws(
    pg_conninfo: str, make_live: Made, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank deep in a long run of tied scores is named by a uniformly random unread item of
    the run's middle (adapters/postgres/live/draws.py). In one snapshot the named rows have
    the run's score and distinct ids of the middle; ranks near either end keep their canonical
    rows; asking again gives the same rows; sorted access into the middle is then refused.
    Across snapshots the canonical rank of the item named for one deep rank is uniform over the
    middle (chi-square, 8 bins, 640 draws, 0.1% level). Fails if the draw were the canonical row
    (every draw in the first bin), biased, repeated an item, or left the middle."""
    monkeypatch.setattr(postgres_live, "RUN_WALK_ROWS", 8)
    scores = np.zeros(400, dtype=np.int64)
    scores[:10] = 5
    ids = np.random.default_rng(3).permutation(400) * 7
    source = make_live(scores, ids)
    rank_of = canonical_ranks(scores, ids)
    by_rank = {r: i for i, r in rank_of.items()}
    # The cursor stops at depth 20, inside the zero run [10, 400): the middle is the ranks more
    # than 8 rows from rank 19 and from rank 399, [29, 391).
    deep, near = [30, 100, 250, 390], [21, 27, 395, 399]
    with source.snapshot():
        assert source.positions_are_ranks
        source.read_sorted(0, 20)
        rows = source.read_ranks_exchangeable(np.asarray(deep + near), np.random.default_rng(0))
        assert rows.positions.tolist() == deep + near
        assert rows.scores.tolist() == [0.0] * 8
        named = rows.ids.tolist()
        assert named[4:] == [by_rank[r] for r in near]
        assert len(set(named[:4])) == 4 and all(29 <= rank_of[i] < 391 for i in named[:4])
        again = source.read_ranks_exchangeable(np.asarray(deep), np.random.default_rng(1))
        assert again.ids.tolist() == named[:4]
        with pytest.raises(AccessError, match="sorted access after a release"):
            source.read_sorted(20, 20)
    drawn = []
    for seed in range(640):
        with source.snapshot():
            source.read_sorted(0, 20)
            rows = source.read_ranks_exchangeable(np.asarray([30]), np.random.default_rng(seed))
        drawn.append(rank_of[rows.ids[0]])
    counts = np.bincount((np.asarray(drawn) - 29) * 8 // (391 - 29), minlength=8)
    assert stats.chisquare(counts).pvalue > 1e-3, counts


def test_releases_deep_in_a_tied_run_keep_the_one_shot_law(
    pg_conninfo: str, make_live: Made, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every count tied (120 items, k = 2): the one-shot law releases each ordered pair of
    distinct items with one probability, so the first item's canonical rank is uniform. Most
    releases fall deep in the run and are named by draws (counted here). Chi-square over 12
    bins of 10 ranks, 1,200 seeded releases, 0.1% level; fails if the drawn names were biased
    towards the middle's start or end, or if a pair repeated an item."""
    monkeypatch.setattr(postgres_live, "RUN_WALK_ROWS", 4)
    ids = np.random.default_rng(5).permutation(120) * 3 + 1
    scores = np.zeros(120, dtype=np.int64)
    source = make_live(scores, ids)
    rank_of = canonical_ranks(scores, ids)
    draws = 0
    draw = source._draw

    def counted(*args: Any) -> dict[int, tuple[Any, float]]:
        nonlocal draws
        draws += 1
        return draw(*args)

    source._draw = counted  # type: ignore[method-assign]
    first = []
    for seed in range(1200):
        items = private_top_k(source, 2, 1.0, method="threshold", seed=seed).items
        assert len(set(items)) == 2
        first.append(rank_of[items[0]])
    assert draws > 600
    counts = np.bincount(np.asarray(first) // 10, minlength=12)
    assert stats.chisquare(counts).pvalue > 1e-3, counts


def test_statistics_of_many_scores_skip_the_runs_probe(pg_conninfo: str, make_live: Made) -> None:
    """Where pg_stats puts the distinct scores above 2 x max_score_runs, a run does not probe for
    runs: after ANALYZE of 200 distinct scores it uses the position table, and still does after
    an UPDATE leaves 3 (stale statistics); the next ANALYZE, read at prepare() (or after
    STATISTICS_TTL seconds), lets runs serve ranks. Releases are those of the matching
    reference throughout. Fails if the estimate were ignored (ranks at once after the UPDATE)
    or misread (never ranks)."""
    source = make_live(np.arange(300) % 200, np.arange(300) * 2)
    execute(pg_conninfo, source, "ANALYZE {t}")
    assert not source.positions_are_ranks
    execute(pg_conninfo, source, "UPDATE {t} SET {score} = mod({score}, 3)")
    assert not source.positions_are_ranks
    assert_same_releases(source, reference(pg_conninfo, source, "input"), 3)
    execute(pg_conninfo, source, "ANALYZE {t}")
    assert not source.positions_are_ranks  # the estimate is kept STATISTICS_TTL seconds ...
    source.prepare()  # ... or until prepare()
    assert source.positions_are_ranks and source.score_run_count() == 3
    assert_same_releases(source, reference(pg_conninfo, source, "ranks"), 3)


def test_the_one_large_run_may_be_any_run(pg_conninfo: str, make_live: Made) -> None:
    """The last run (lowest score) is sized as m minus the others without being counted; where
    another run is the large one (most counts 1, a few 0), the last is counted too and the large
    run sized from m. Either way the runs equal numpy's and releases are the rank reference's.
    Fails if an uncounted run were sized wrong by one, or if the second count were skipped."""
    rng = np.random.default_rng(4)
    for low, middle in ((500, 40), (40, 500)):
        scores = np.concatenate([np.full(30, 9), np.full(middle, 1), np.full(low, 0)])
        ids = rng.permutation(len(scores)) * 2 + 1
        source = make_live(scores, ids, run_count_rows=300)  # bound: 100 rows a run
        with source.snapshot():
            assert source.positions_are_ranks
            first, run_scores = source.read_score_runs()
        assert run_scores.tolist() == [9.0, 1.0, 0.0]
        assert first.tolist() == [0, 30, 30 + middle]
        assert_same_releases(source, reference(pg_conninfo, source, "ranks"), 3)


def test_runs_below_a_gap_are_counted_only_when_read(pg_conninfo: str, make_live: Made) -> None:
    """A plateau above a tail of small counts (1 to 3, then zeros): a run counts the runs above
    the gap in the scores only, and the core settles the tail by bounds, so threshold releases
    never count the tail, and equal the rank reference's (items and sequential access counts).
    A rank read in the tail has the rest counted then, in the run's snapshot: the full runs
    and every row by rank equal numpy's. Where two runs below the gap are too large for
    run_count_rows, they are counted in full. Fails if a head were served as full runs (ranks
    in the tail misplaced), if the tail were counted where bounds settle it, or if the
    completion sized a run wrong."""
    rng = np.random.default_rng(8)
    scores = np.zeros(3000, dtype=np.int64)
    scores[:30] = 1000
    scores[30:40] = 999
    scores[40:400] = rng.integers(1, 4, 360)
    ids = rng.permutation(3000) * 3 + 2
    want = ArraySource(scores, ids, positions="ranks")
    distinct, counts = np.unique(scores, return_counts=True)
    full_first = np.concatenate(([0], np.cumsum(counts[::-1])[:-1])).tolist()
    for options in ({}, {"run_count_rows": 400}):  # 66 rows a run: the tail's are larger
        source = make_live(scores, ids, **options)
        completions = 0
        full_runs = source._full_runs

        def counted(run: Any, full_runs: Any = full_runs) -> Any:
            nonlocal completions
            completions += 0 if run.runs.complete else 1
            return full_runs(run)

        source._full_runs = counted  # type: ignore[method-assign]
        with source.snapshot():
            assert source.positions_are_ranks and source.score_run_count() == 6
            first, run_scores = source.read_score_runs_head()
            assert first.tolist() == [0, 30, 40]  # 1000 and 999, then the rest from rank 40
            assert run_scores.tolist() == distinct[::-1].astype(float).tolist()
        for seed in range(4):
            got = private_top_k(source, 5, 1.0, method="threshold", seed=seed)
            ref = private_top_k(want, 5, 1.0, method="threshold", seed=seed)
            assert got.items == ref.items
            assert (got.accesses.sorted, got.accesses.random) == (
                ref.accesses.sorted,
                ref.accesses.random,
            )
        assert completions == 0
        with source.snapshot():
            rows = source.read_positions(np.arange(2999, -1, -7))
            assert completions == 1
            first, run_scores = source.read_score_runs()
        assert first.tolist() == full_first
        assert run_scores.tolist() == distinct[::-1].astype(float).tolist()
        expected = want.read_positions(np.arange(2999, -1, -7))
        by_rank = dict(zip(rows.positions.tolist(), rows.ids.tolist(), strict=True))
        assert [by_rank[r] for r in expected.positions.tolist()] == expected.ids.tolist()
        assert_same_releases(source, reference(pg_conninfo, source, "ranks"), 5)
