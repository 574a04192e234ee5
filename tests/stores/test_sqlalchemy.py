"""SQLAlchemyTable on four real databases: SQLite, PostgreSQL, MariaDB and DuckDB.

Every test runs on each dialect (servers: see tests/stores_sqlalchemy.py). The reference is
ArraySource: same histogram, same canonical order, same answer for the same seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite

from adapters.memory import ArraySource
from adapters.sqlalchemy import SQLAlchemyTable
from tests.helpers import (
    RefreshAfterTheRun,
    RunsKept,
    assert_serves_the_runs_of,
    plateau_histogram,
    reference_like,
)
from tests.stores_sqlalchemy import create_counts_table, drop_tables, unique_name
from topk_middleware import private_top_k
from topk_middleware.access import AccessError, StoreTraits

DIALECTS = ["sqlite", "postgres", "mariadb", "duckdb"]

# Text ids whose byte order differs from case-insensitive, accent-aware or space-padding orders.
AWKWARD_IDS = ["a", "B", "é", "z", "ab", "a ", "A", "日本", "😀", "b", "Z", "É", "aa", "e"]


@pytest.fixture(params=DIALECTS)
def dialect(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def engine(request: pytest.FixtureRequest, dialect: str) -> sa.Engine:
    return request.getfixturevalue(f"sqlalchemy_{dialect}_engine")


@pytest.fixture
def make_source(request: pytest.FixtureRequest, dialect: str) -> Callable[..., SQLAlchemyTable]:
    return request.getfixturevalue(f"make_sqlalchemy_{dialect}_source")


@pytest.fixture
def tables(engine: sa.Engine) -> Iterator[list[str]]:
    """Names appended here are dropped after the test."""
    names: list[str] = []
    yield names
    drop_tables(engine, names)


def raw_table(
    engine: sa.Engine,
    names: list[str],
    rows: list[tuple[Any, Any]],
    id_type: Any = sa.BigInteger,
    score_type: Any = sa.Double,
) -> str:
    """A table (id, score) with nullable columns, holding exactly `rows`."""
    name = unique_name()
    names.append(name)
    table = sa.Table(name, sa.MetaData(), sa.Column("id", id_type), sa.Column("score", score_type))
    with engine.begin() as conn:
        table.create(conn)
        if rows:
            conn.execute(table.insert(), [{"id": i, "score": s} for i, s in rows])
    return name


def zipf_histogram(m: int, seed: int) -> tuple[np.ndarray, list[str]]:
    """Integer counts with a heavy head and long runs of ties, and text ids in random case."""
    rng = np.random.default_rng(seed)
    scores = np.floor(5000.0 / (1.0 + rng.permutation(m)) ** 1.1)
    letters = np.array(list("aAbBzZéÉ日😀 "))
    ids = sorted({"".join(rng.choice(letters, size=6)).strip() or "x" for _ in range(2 * m)})
    chosen = rng.choice(len(ids), size=m, replace=False)
    return scores, [ids[i] for i in chosen]


def assert_same_rows(source: Any, reference: ArraySource, start: int, count: int) -> None:
    got, want = source.read_sorted(start, count), reference.read_sorted(start, count)
    assert got.positions.tolist() == want.positions.tolist()
    assert got.ids.tolist() == want.ids.tolist()
    assert got.scores.tolist() == want.scores.tolist()


# ----- canonical order, sorted and random access ------------------------------------------
def test_canonical_order_ties_and_byte_order(make_source: Callable[..., Any]) -> None:
    scores = [3, 3, 3, 1, 0, 3, 5, 3, 3, 0, 3, 3, 1, 3]
    source = make_source(scores, AWKWARD_IDS)
    reference = ArraySource(scores, AWKWARD_IDS)
    assert source.domain_size() == len(scores)
    assert_same_rows(source, reference, 0, len(scores))
    # Byte order, stated without numpy: upper case before lower case, 'a' < 'a ' < 'aa',
    # non-ASCII after ASCII (code point order = UTF-8 byte order).
    tied = [i for i in source.read_sorted(0, 100).ids.tolist() if scores[AWKWARD_IDS.index(i)] == 3]
    assert tied == sorted(tied, key=lambda s: s.encode("utf-8"))
    assert tied == ["B", "Z", "a", "a ", "e", "É", "é", "日本", "😀"]
    assert_same_rows(source, reference, 4, 3)
    assert len(source.read_sorted(12, 10)) == 2  # fewer at the end


def test_integer_ids_order_numerically(make_source: Callable[..., Any]) -> None:
    ids = [10, 9, 100, 2, 1000, 11]
    scores = [1.5, 1.5, 1.5, 0.25, 1.5, 0.0]
    source = make_source(scores, ids)
    assert source.read_sorted(0, 6).ids.tolist() == [9, 10, 100, 1000, 2, 11]
    assert source.read_sorted(0, 6).scores.tolist() == [1.5, 1.5, 1.5, 1.5, 0.25, 0.0]


def test_random_access_by_rank_and_id(make_source: Callable[..., Any]) -> None:
    scores, ids = zipf_histogram(300, seed=1)
    source = make_source(scores, ids)
    reference = ArraySource(scores, ids)
    ranks = np.random.default_rng(2).choice(300, size=40, replace=False)
    got, want = source.read_positions(ranks), reference.read_positions(ranks)
    assert got.positions.tolist() == want.positions.tolist() == ranks.tolist()
    assert got.ids.tolist() == want.ids.tolist()
    assert got.scores.tolist() == want.scores.tolist()
    asked = [ids[i] for i in (5, 0, 299, 17, 5)]
    assert source.read_ids(asked).tolist() == reference.read_ids(asked).tolist()
    with pytest.raises(AccessError, match="no item with id 'no such item'"):
        source.read_ids([ids[0], "no such item"])


def test_text_ids_match_exactly(make_source: Callable[..., Any]) -> None:
    """'a', 'A' and 'a ' are three items: no case folding, no space padding on lookup."""
    source = make_source([1, 2, 3], ["a", "A", "a "])
    assert source.domain_size() == 3
    assert source.read_ids(["a ", "A", "a"]).tolist() == [3.0, 2.0, 1.0]
    with pytest.raises(AccessError):
        source.read_ids(["a  "])


def test_in_lists_are_chunked(make_source: Callable[..., Any]) -> None:
    """With max_params=3, 10 ranks take 4 queries and 7 ids are still served in order (one
    query on the dialects that bind an array as one parameter: on the SQL store engine)."""
    scores, ids = zipf_histogram(50, seed=3)
    source = make_source(scores, ids, max_params=3)
    reference = ArraySource(scores, ids)
    ranks = np.arange(40, 50)
    rows = source.read_positions(ranks)
    assert rows.round_trips == (1 if hasattr(source, "copies") else 4)
    assert rows.ids.tolist() == reference.read_positions(ranks).ids.tolist()
    asked = ids[:7]
    assert source.read_ids(asked).tolist() == reference.read_ids(asked).tolist()
    # a threshold run (pinned) reads ranks and ids through the chunked lists
    result = private_top_k(source, k=3, epsilon=1.0, seed=5, method="threshold")
    want = private_top_k(reference, k=3, epsilon=1.0, seed=5, method="threshold")
    assert result.method == want.method == "threshold"
    assert result.items == want.items and result.accesses.random > 0


@pytest.mark.parametrize(
    ("noise", "method", "seed"),
    [
        ("gumbel", "threshold", 0),
        ("gumbel", "threshold", 1),
        ("laplace", "threshold", 11),
        ("gumbel", "oneshot_full_read", 12),
    ],
)
def test_private_top_k_same_as_array_source(
    make_source: Callable[..., Any], noise: str, method: str, seed: int
) -> None:
    """One seed, one answer: items and every access count equal ArraySource's."""
    scores, ids = zipf_histogram(2000, seed=7)
    source = make_source(scores, ids)
    reference = reference_like(source, scores, ids)
    for k, epsilon in ((1, 0.5), (10, 1.0)):
        got = private_top_k(source, k=k, epsilon=epsilon, noise=noise, method=method, seed=seed)
        want = private_top_k(reference, k=k, epsilon=epsilon, noise=noise, method=method, seed=seed)
        assert got.items == want.items
        assert got.accesses == want.accesses
        assert got.m == 2000


def test_private_top_k_on_plateau_reads_a_fraction(make_source: Callable[..., Any]) -> None:
    """Many items tied at the top (the expensive case): still the same answer and accesses
    as ArraySource, and fewer rows than a full read."""
    m = 4000
    scores = np.where(np.arange(m) < 400, 30.0, 0.0)
    source = make_source(scores, None)
    got = private_top_k(source, k=5, epsilon=1.0, seed=21, method="threshold")
    want = private_top_k(
        reference_like(source, scores), k=5, epsilon=1.0, seed=21, method="threshold"
    )
    assert got.method == want.method == "threshold"
    assert got.items == want.items
    assert got.accesses == want.accesses
    assert got.accesses.rows_fetched < m


# ----- identifiers ----------------------------------------------------------------------
def test_awkward_identifiers_are_quoted(engine: sa.Engine, tables: list[str]) -> None:
    name = f'Order "Items" it\'s {unique_name("Select")}'
    id_column, score_column = "Select", 'Group "Count"'
    scores, ids = [4, 0, 4, 9], ["x", "Y", "y", "Table"]
    tables.append(name)
    create_counts_table(engine, name, scores, ids, id_column, score_column)
    source = SQLAlchemyTable(engine, name, id=id_column, score=score_column)
    tables.extend([source.rank_table_name, source.runs_table_name])
    source.prepare()
    source.prepare()  # idempotent with awkward names too
    assert source.read_sorted(0, 4).ids.tolist() == ["Table", "x", "y", "Y"]
    assert source.read_ids(["y"]).tolist() == [4.0]
    result = private_top_k(source, k=2, epsilon=1.0, method="threshold", seed=3)
    assert (
        result.items
        == private_top_k(
            ArraySource(scores, ids), k=2, epsilon=1.0, method="threshold", seed=3
        ).items
    )
    assert not source.is_stale()


# ----- validation -----------------------------------------------------------------------
def test_missing_table(engine: sa.Engine) -> None:
    with pytest.raises(ValueError, match=r"table 'no_such_topk_table' does not exist"):
        SQLAlchemyTable(engine, "no_such_topk_table")


@pytest.mark.parametrize("missing", ["id", "score"])
def test_missing_column(engine: sa.Engine, tables: list[str], missing: str) -> None:
    name = raw_table(engine, tables, [(1, 1.0)])
    columns = {"id": "id", "score": "score", missing: "nope"}
    with pytest.raises(ValueError, match=rf"table '{name}' has no column 'nope'"):
        SQLAlchemyTable(engine, name, **columns)


def test_non_numeric_score_column(engine: sa.Engine, tables: list[str]) -> None:
    name = raw_table(engine, tables, [(1, "7")], score_type=sa.String(20))
    with pytest.raises(TypeError, match=rf"table '{name}' column 'score' must be numeric"):
        SQLAlchemyTable(engine, name)


INVALID = {
    "empty": ([], ValueError, "is empty"),
    "null score": ([(1, 2.0), (2, None), (3, 0.0)], ValueError, "column 'score' has 1 NULL"),
    "null id": ([(1, 2.0), (None, 1.0)], ValueError, "column 'id' has 1 NULL id"),
    "negative": ([(1, 2.0), (2, -0.5), (3, -1.0)], ValueError, "'score' has 2 negative"),
    "duplicate": ([(1, 2.0), (2, 1.0), (1, 0.0)], ValueError, r"'id' has duplicate ids.*e\.g\. 1"),
    "nan": ([(1, 2.0), (2, math.nan)], ValueError, "'score' has 1 NaN or infinite"),
    "infinite": ([(1, math.inf), (2, -math.inf)], ValueError, "'score' has 2 NaN or infinite"),
}
# Cases a dialect cannot even store are not generated: MariaDB's DOUBLE holds no NaN or
# infinity, SQLite stores NaN as NULL (covered by "null score").
CANNOT_STORE = {("mariadb", "nan"), ("mariadb", "infinite"), ("sqlite", "nan")}


@pytest.mark.parametrize(
    ("store", "case"),
    [(d, c) for d in DIALECTS for c in INVALID if (d, c) not in CANNOT_STORE],
)
def test_invalid_counts_refused_by_prepare(
    request: pytest.FixtureRequest, store: str, case: str
) -> None:
    engine = request.getfixturevalue(f"sqlalchemy_{store}_engine")
    tables = []
    request.addfinalizer(lambda: drop_tables(engine, tables))
    rows, error, message = INVALID[case]
    name = raw_table(engine, tables, rows)
    source = SQLAlchemyTable(engine, name)
    tables.extend([source.rank_table_name, source.runs_table_name])
    with pytest.raises(error, match=rf"table '{name}'.*{message}"):
        source.prepare()
    with pytest.raises(RuntimeError, match=r"call prepare\(\) first"):
        private_top_k(source, k=1, epsilon=1.0, seed=0)


def test_sqlite_text_in_numeric_column(
    sqlalchemy_sqlite_engine: sa.Engine,
) -> None:
    engine = sqlalchemy_sqlite_engine
    names: list[str] = []
    try:
        name = raw_table(engine, names, [(1, 3), (2, "many")], score_type=sa.Integer)
        source = SQLAlchemyTable(engine, name)
        names.extend([source.rank_table_name, source.runs_table_name])
        with pytest.raises(TypeError, match=rf"table '{name}' column 'score' has 1 non-numeric"):
            source.prepare()
    finally:
        drop_tables(engine, names)


def test_unprepared_table_is_refused(engine: sa.Engine, tables: list[str]) -> None:
    name = raw_table(engine, tables, [(1, 1.0), (2, 0.0)])
    source = SQLAlchemyTable(engine, name)
    with pytest.raises(RuntimeError, match=r"does not exist: call prepare\(\) first"):
        private_top_k(source, k=1, epsilon=1.0, seed=0)


def test_foreign_rank_table_is_refused(engine: sa.Engine, tables: list[str]) -> None:
    name = raw_table(engine, tables, [(1, 1.0), (2, 0.0)])
    other = raw_table(engine, tables, [(1, 1.0)])
    source = SQLAlchemyTable(engine, name, rank_table=other)
    with pytest.raises(ValueError, match=rf"rank table '{other}' exists with columns"):
        source.prepare()


# ----- prepare, staleness, indexes ------------------------------------------------------
def test_prepare_is_idempotent_and_staleness_is_detected(
    engine: sa.Engine, tables: list[str], dialect: str
) -> None:
    name = raw_table(engine, tables, [(1, 5.0), (2, 3.0), (3, 3.0)])
    source = SQLAlchemyTable(engine, name)
    tables.extend([source.rank_table_name, source.runs_table_name])
    source.prepare()
    source.prepare()
    assert source.domain_size() == 3 and not source.is_stale()
    if dialect != "duckdb":  # DuckDB serves ORDER BY without indexes: none is created
        indexed = {tuple(ix["column_names"]) for ix in sa.inspect(engine).get_indexes(name)}
        assert ("id",) in indexed
    live = sa.Table(name, sa.MetaData(), sa.Column("id"), sa.Column("score"))
    with engine.begin() as conn:
        conn.execute(live.update().where(live.c.id == 3).values(score=9.0))
    assert source.is_stale()
    # The rank table is the snapshot of prepare(): the update is not seen until prepare() again
    # by a read outside a run; on the SQL store engine every read is a run, which proves its
    # copy current or reads the table.
    seen = [3, 1, 2] if hasattr(source, "copies") else [1, 2, 3]
    assert source.read_sorted(0, 3).ids.tolist() == seen
    source.prepare(refresh=True)
    assert not source.is_stale()
    assert source.read_sorted(0, 3).ids.tolist() == [3, 1, 2]
    with engine.begin() as conn:
        conn.execute(live.insert().values(id=4, score=0.0))
    assert source.is_stale()


# ----- from votes -----------------------------------------------------------------------
def test_two_count_definitions_over_one_votes_table_keep_copies_of_their_own(
    engine: sa.Engine, tables: list[str]
) -> None:
    """Distinct clients and weights clipped at 3, built from the same two tables, each keep
    their own copy (a shared one would serve one definition's counts to the other); a vote
    written after prepare() makes the weighted copy stale, and the next release rebuilds it
    (counts from votes have no table of their own to read instead)."""
    items_name, votes_name = unique_name("items"), unique_name("votes")
    tables.extend([votes_name, items_name])
    items = sa.Table(items_name, sa.MetaData(), sa.Column("id", sa.BigInteger))
    votes = sa.Table(
        votes_name,
        sa.MetaData(),
        sa.Column("client", sa.String(20)),
        sa.Column("item", sa.BigInteger),
        sa.Column("w", sa.Float),
    )
    rows = [("a", 0, 5.0), ("b", 1, 1.0), ("c", 1, 1.0), ("d", 2, 2.0)]
    with engine.begin() as conn:
        items.create(conn)
        votes.create(conn)
        conn.execute(items.insert(), [{"id": i} for i in range(4)])
        conn.execute(votes.insert(), [{"client": c, "item": i, "w": w} for c, i, w in rows])
    distinct = SQLAlchemyTable.from_votes(engine, votes_name, items_name, item_id="id")
    weighted = SQLAlchemyTable.from_votes(
        engine, votes_name, items_name, item_id="id", weight="w", max_per_item=3
    )
    assert distinct.rank_table_name != weighted.rank_table_name
    for source in (distinct, weighted):
        tables.extend([source.rank_table_name, source.runs_table_name])
        source.prepare()
    options = {"k": 3, "epsilon": 50.0, "method": "threshold", "seed": 2}
    for source, counts in ((distinct, [1, 2, 1, 0]), (weighted, [3, 2, 2, 0])):
        expected = private_top_k(ArraySource(counts), **options).items
        assert private_top_k(source, **options).items == expected
    with engine.begin() as conn:
        conn.execute(votes.insert().values(client="e", item=3, w=3.0))
    got = private_top_k(weighted, **options)
    assert got.items == private_top_k(ArraySource([3, 2, 2, 3]), **options).items


def test_from_votes_counts_distinct_clients_over_the_public_domain(
    engine: sa.Engine, tables: list[str]
) -> None:
    items_name, votes_name = unique_name("items"), unique_name("votes")
    tables.extend([votes_name, items_name])
    domain = ["apple", "Apple", "banana", "cherry", "durian", "é", "fig"]
    votes = [
        ("c1", "apple"), ("c1", "apple"), ("c2", "apple"), ("c3", "apple"),
        ("c1", "Apple"), ("c2", "banana"), ("c2", "banana"), ("c3", "cherry"),
        ("c4", "cherry"), (None, "cherry"), ("c5", "é"), ("c5", None),
    ]  # fmt: skip
    items = sa.Table(items_name, sa.MetaData(), sa.Column("item id", sa.String(50)))
    vote_table = sa.Table(
        votes_name,
        sa.MetaData(),
        sa.Column("Client", sa.String(50)),
        sa.Column("item", sa.String(50)),
    )
    with engine.begin() as conn:
        items.create(conn)
        vote_table.create(conn)
        conn.execute(items.insert(), [{"item id": i} for i in domain])
        conn.execute(vote_table.insert(), [{"Client": c, "item": i} for c, i in votes])
    source = SQLAlchemyTable.from_votes(
        engine, votes_name, items_name, client="Client", item="item", item_id="item id"
    )
    tables.extend([source.rank_table_name, source.runs_table_name])
    source.prepare()
    expected = [len({c for c, i in votes if i == item and c is not None}) for item in domain]
    assert expected == [3, 1, 1, 2, 0, 1, 0]
    reference = ArraySource(expected, domain)
    assert source.domain_size() == len(domain)  # zero-vote items are in the domain
    assert_same_rows(source, reference, 0, len(domain))
    got = private_top_k(source, k=2, epsilon=2.0, method="threshold", seed=4)
    assert got.items == private_top_k(reference, k=2, epsilon=2.0, method="threshold", seed=4).items
    with pytest.raises(ValueError, match=rf"table '{votes_name}' has no column 'client'"):
        SQLAlchemyTable.from_votes(engine, votes_name, items_name, item_id="item id")
    # A vote for an item outside the public domain is refused, naming table and column; so is
    # 'APPLE', which only a case-insensitive comparison would match to 'apple'.
    for stray in ("not in the domain", "APPLE"):
        with engine.begin() as conn:
            conn.execute(vote_table.insert().values({"Client": "c7", "item": stray}))
        with pytest.raises(
            ValueError,
            match=rf"table '{votes_name}' column 'item' has 1 vote\(s\) for items not in "
            rf"the items table \(\w+ table '{items_name}'\), e.g. '{stray}'",
        ):
            source.prepare(refresh=True)
        with engine.begin() as conn:
            conn.execute(vote_table.delete().where(vote_table.c.item == stray))


# ----- snapshot isolation ---------------------------------------------------------------
TOP = 50.0  # the writer turns every count h into TOP - h


PENDING: list[RefreshAfterTheRun] = []  # refreshes waiting for a run to end (PostgreSQL)


def rewrite_and_prepare(engine: sa.Engine, name: str, m: int) -> None:
    """A concurrent writer on its own connections: counts h -> TOP - h (the order reversed),
    a new item m with count 1000, and prepare(). On PostgreSQL the refresh swaps in new tables
    once no run reads the old ones, so inside a run it waits, on a thread of its own: `settle()`
    after the run waits for it to commit."""
    live = sa.Table(name, sa.MetaData(), sa.Column("id"), sa.Column("score"))
    with engine.begin() as conn:
        conn.execute(live.update().values(score=TOP - live.c.score))
        conn.execute(live.insert().values(id=m, score=1000.0))
    writer = SQLAlchemyTable(engine, name)
    if engine.dialect.name == "postgresql":
        PENDING.append(RefreshAfterTheRun(lambda: writer.prepare(refresh=True, swap_timeout=60)))
    else:
        writer.prepare(refresh=True)


def settle() -> None:
    """Wait for the refreshes rewrite_and_prepare() left waiting for a run (their errors)."""
    while PENDING:
        assert PENDING.pop()


def test_snapshot_holds_while_a_writer_commits(make_source: Callable[..., Any]) -> None:
    m = 60
    old = [float((7 * i) % 13) for i in range(m)]
    new = [TOP - h for h in old]
    source = make_source(old, None)
    name = source.table_name
    with source.snapshot():
        before = source.read_sorted(0, m)
        rewrite_and_prepare(source.engine, name, m)
        assert source.domain_size() == m
        after = source.read_sorted(0, m + 1)
        assert after.ids.tolist() == before.ids.tolist()
        assert after.scores.tolist() == before.scores.tolist()
        assert source.read_ids([0, 1]).tolist() == [old[0], old[1]]
    settle()
    # Outside the snapshot the writer's commit is visible: the check above could fail.
    reference = ArraySource([*new, 1000.0], None)
    assert source.domain_size() == m + 1
    assert_same_rows(source, reference, 0, m + 1)


class WriterMidRun:
    """A Source that lets a writer commit right after the run's first sorted read."""

    def __init__(self, source: SQLAlchemyTable, write: Callable[[], None]) -> None:
        self.source, self.write, self.written = source, write, False

    def traits(self) -> StoreTraits:
        return self.source.traits()

    def domain_size(self) -> int:
        return self.source.domain_size()

    def snapshot(self) -> Any:
        return self.source.snapshot()

    def read_sorted(self, start: int, count: int) -> Any:
        rows = self.source.read_sorted(start, count)
        if not self.written:
            self.write()
            self.written = True
        return rows

    def read_positions(self, ranks: np.ndarray) -> Any:
        return self.source.read_positions(ranks)

    def read_ids(self, ids: Any) -> np.ndarray:
        return self.source.read_ids(ids)


def test_a_run_sees_one_snapshot(make_source: Callable[..., Any]) -> None:
    """A writer commits new counts and re-runs prepare() during the run: the answer and the
    accesses are those of the counts at the start. Would fail if later reads saw the write
    (the rewritten histogram moves every item)."""
    m = 3000
    old = np.floor(np.linspace(40.0, 0.0, m) + (np.arange(m) % 3))  # a plateau-ish profile
    new = TOP - old
    source = make_source(old, None)
    name = source.table_name
    writer = WriterMidRun(source, lambda: rewrite_and_prepare(source.engine, name, m))
    got = private_top_k(writer, k=10, epsilon=0.5, method="threshold", seed=8)
    want = private_top_k(reference_like(writer, old), k=10, epsilon=0.5, method="threshold", seed=8)
    assert writer.written and got.accesses.round_trips > 3  # the write came between reads
    assert got.items == want.items
    assert got.accesses == want.accesses
    settle()
    after = private_top_k(source, k=10, epsilon=0.5, method="threshold", seed=8)
    assert (
        after.items
        == private_top_k(
            ArraySource([*new, 1000.0]), k=10, epsilon=0.5, method="threshold", seed=8
        ).items
    )


@pytest.mark.parametrize("store", ["sqlite", "postgres", "mariadb"])  # DuckDB has no read-only mode
def test_snapshot_is_read_only(request: pytest.FixtureRequest, store: str) -> None:
    """A write through the snapshot's connection is refused by the database itself."""
    source = request.getfixturevalue(f"make_sqlalchemy_{store}_source")([1.0, 2.0], None)
    with source.snapshot():  # the engine's driver holds the snapshot's connection
        with pytest.raises(sa.exc.DBAPIError, match=r"(?i)read.?only"):
            source.driver.execute(f"DELETE FROM {source.copies.ranks}")
    assert source.domain_size() == 2
    assert source.read_sorted(0, 2).ids.tolist() == [1, 0]


def test_unreachable_server_skips_or_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    """No server: a skip that says how to provide one; with CI set, a failure."""
    from tests.stores_sqlalchemy import require_reachable

    url = "postgresql+psycopg://root@127.0.0.1:1/test"  # nothing listens on port 1
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="set TOPK_PG_DSN"):
        require_reachable(sa.create_engine(url), "PostgreSQL", "set TOPK_PG_DSN to a server")
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="unreachable"):
        require_reachable(sa.create_engine(url), "PostgreSQL", "set TOPK_PG_DSN to a server")


def test_check_reports_full_scans(engine: sa.Engine, tables: list[str], dialect: str) -> None:
    """Before prepare() every access is a full scan; after it sorted access and sampling by rank
    are index reads (DuckDB: pruned scans of the rank-ordered table). Dropping the index on the
    rank table's id turns random access by id into a full scan, and check() says so."""
    name = raw_table(engine, tables, [(i, float(i % 7)) for i in range(500)])
    source = SQLAlchemyTable(engine, name)
    tables.extend([source.rank_table_name, source.runs_table_name])
    before = source.check()
    assert before.full_scan and all("call prepare()" in p.how for p in before.paths)
    source.prepare()
    after = {p.access: p for p in source.check().paths}
    assert not source.check().full_scan
    assert not after["sorted"].full_scan and not after["random by rank"].full_scan
    assert after["random by id"].full_scan == (dialect == "duckdb")
    if dialect != "duckdb":
        indexes = sa.inspect(engine).get_indexes(source.rank_table_name)
        index = next(ix["name"] for ix in indexes if ix["column_names"] == ["id"])
        on = f" ON {source.rank_table_name}" if dialect == "mariadb" else ""
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"DROP INDEX {engine.dialect.identifier_preparer.quote(index)}{on}"
            )
        assert {p.access: p for p in source.check().paths}["random by id"].full_scan


@pytest.mark.parametrize("store", ["postgres", "mariadb"])
def test_snapshot_is_repeatable_read_on_a_read_committed_engine(
    request: pytest.FixtureRequest, store: str
) -> None:
    """The snapshot sets its own isolation: an engine configured for READ COMMITTED (where each
    statement sees the latest commit) still gives a run one snapshot."""
    made = request.getfixturevalue(f"make_sqlalchemy_{store}_source")([3.0, 2.0, 1.0], None)
    weak = made.engine.execution_options(isolation_level="READ COMMITTED")
    source = SQLAlchemyTable(weak, made.table_name)
    with source.snapshot():
        before = source.read_sorted(0, 3).ids.tolist()
        rewrite_and_prepare(made.engine, made.table_name, 3)
        assert source.read_sorted(0, 4).ids.tolist() == before == [0, 1, 2]
        assert source.domain_size() == 3
    settle()
    assert source.read_sorted(0, 4).ids.tolist() == [3, 2, 1, 0]


# ----- runs of tied scores (ScoreRuns) --------------------------------------------------------
def test_a_rank_table_prepared_before_runs_tables_existed(make_source: Callable[..., Any]) -> None:
    """Without its runs table (dropped: as prepared by an older version) a rank table still
    serves runs, with no runs and the answers of ArraySource without them, both to the object
    that saw the runs table before (it starts its snapshot again without it) and to a new one;
    prepare() creates and fills the runs table again, and both see it."""
    scores = plateau_histogram(4000, 5)
    source = make_source(scores, None)
    assert source.score_run_count() == 2
    with source.engine.begin() as conn:
        sa.Table(source.runs_table_name, sa.MetaData()).drop(conn)
    fresh = SQLAlchemyTable(source.engine, source.table_name)
    for store in (source, fresh):
        assert store.score_run_count() is None
        with store.snapshot():
            assert store.score_run_count() is None and store.domain_size() == 4000
        assert "no runs table" in str(store.check()) and not store.check().full_scan
        reference = reference_like(store, scores)
        assert not hasattr(reference, "read_score_runs")  # runs hidden: neighbours only
        for seed in range(2):  # the threshold run: auto may take the store's in-store one-shot
            got = private_top_k(store, k=5, epsilon=1.0, seed=seed, method="threshold")
            want = private_top_k(reference, k=5, epsilon=1.0, seed=seed, method="threshold")
            assert got.items == want.items and got.accesses == want.accesses
    source.prepare()
    assert fresh.score_run_count() == 2  # it looks again while it has not seen one
    assert_serves_the_runs_of(source, scores)


def test_runs_are_read_in_the_runs_snapshot(make_source: Callable[..., Any]) -> None:
    """Right before the run reads the runs, a writer rewrites every count (h -> TOP - h, and a
    new item: three runs instead of two) and re-runs prepare(), committed: the run still reads
    the runs of its snapshot (with the count it took at the start), so items and AccessStats
    are those of the data before. Would fail if the runs were read outside the snapshot."""
    m = 3000
    scores = plateau_histogram(m, 4, height=30.0)
    source = make_source(scores, None)
    hooked = RunsKept(
        source, before_runs=lambda: rewrite_and_prepare(source.engine, source.table_name, m)
    )
    got = private_top_k(hooked, k=4, epsilon=1.0, seed=3, method="threshold")
    want = private_top_k(ArraySource(scores), k=4, epsilon=1.0, seed=3, method="threshold")
    assert got.method == want.method == "threshold"
    assert hooked.runs_read == 1 and hooked.before_runs is None  # the write came mid-run
    assert got.items == want.items and got.accesses == want.accesses
    assert got.accesses.rows_inferred > 0
    settle()
    assert source.score_run_count() == 3  # committed: a new snapshot sees the new runs
    new = ArraySource([*(TOP - scores), 1000.0])
    after = private_top_k(source, k=4, epsilon=1.0, seed=3, method="threshold")
    reference = private_top_k(new, k=4, epsilon=1.0, seed=3, method="threshold")
    assert after.method == reference.method == "threshold"
    assert after.items == reference.items and after.accesses == reference.accesses


@pytest.mark.parametrize("dialect", ["mariadb", "postgres"])
def test_prepares_of_new_tables_at_once_never_deadlock(engine: sa.Engine, tables: list[str]):
    """Six threads each prepare six new tables, all at once: every prepare succeeds. Each
    records rows in tables the copies share (topk_rank_fingerprints, topk_write_stamps), which
    the first prepares of a database also create. With a DELETE then an INSERT of a key that is
    not there yet, InnoDB's gap locks deadlocked 1-2 of these 36 prepares in each of four runs
    on MariaDB; two prepares creating the shared tables at once collided on PostgreSQL's
    catalogs."""
    from concurrent.futures import ThreadPoolExecutor

    sources: list[SQLAlchemyTable] = []

    def prepare_six(worker: int) -> int:
        done = 0
        for _ in range(6):
            name = unique_name()
            tables.append(name)
            create_counts_table(engine, name, np.arange(50) % 7)
            source = SQLAlchemyTable(engine, name, "id", "score")
            sources.append(source)
            source.prepare()
            done += 1
        return done

    try:
        with ThreadPoolExecutor(6) as pool:
            assert list(pool.map(prepare_six, range(6))) == [6] * 6
        assert all(s.read_sorted(0, 1).scores.tolist() == [6.0] for s in sources)
    finally:
        for source in sources:
            source.uninstall()


class UnknownDialect(SQLiteDialect_pysqlite):
    """SQLite's own dialect under a name no adapter knows: a real database whose SQLAlchemy
    dialect the adapters do not speak."""

    name = "topk_unknown"
    supports_statement_cache = True


def test_an_engine_of_an_unknown_dialect_is_refused_before_anything_is_read(
    tmp_path: Any,
) -> None:
    """Copy mode, live mode and from_votes on an engine whose dialect has no adapter dialect:
    each refuses in one line, naming the dialect, and sends the database no statement."""
    registry.register("topk_unknown", __name__, "UnknownDialect")
    engine = sa.create_engine(f"topk_unknown:///{tmp_path / 'unknown.sqlite'}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (id INTEGER PRIMARY KEY, score INTEGER NOT NULL)")
        conn.exec_driver_sql("INSERT INTO t VALUES (1, 5), (2, 3)")
    statements: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda c, cur, sql, *a: statements.append(sql))
    with pytest.raises(ValueError, match="this engine's dialect is 'topk_unknown'"):
        SQLAlchemyTable(engine, "t")
    with pytest.raises(ValueError, match="this engine's dialect is 'topk_unknown'"):
        SQLAlchemyTable(engine=engine, table="t", frozen=True)
    with pytest.raises(ValueError, match="dialect 'topk_unknown' cannot serve in order"):
        SQLAlchemyTable(engine, "t", mode="live")
    with pytest.raises(ValueError, match="this engine's dialect is 'topk_unknown'"):
        SQLAlchemyTable.from_votes(engine, "votes", "t")
    assert statements == []
    engine.dispose()
