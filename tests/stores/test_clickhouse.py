"""ClickHouseTable (adapters/clickhouse.py: the SQL store engine over the ClickHouse dialect, on
chdb) beyond the conformance suite: its copy proven current by the table's parts after every
kind of write, a frozen copy served as promised, the in-store one-shot as the exact top-k of
its keyed noise with the key never in a statement, refusals in the project's words before
anything is released, and cleanup that finds the copy from any spelling of the table.

The release checks use epsilon = 10^4 over distinct even scores (as tests/stores/test_freshness.py):
the Gumbel scale 2k/epsilon makes a gap of 2 crossed with probability below exp(-3000), so
the released items are the exact top-k of the table the release read. Each test takes a few
seconds (chdb statements cost milliseconds; a rebuild of 300 rows a few tens of them).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

chdb = pytest.importorskip("chdb", reason="the 'clickhouse' extra (pip install chdb)")

from adapters.clickhouse import ClickHouseTable  # noqa: E402
from adapters.dialects.clickhouse import ClickHouseDialect  # noqa: E402
from adapters.sql.driver import ChdbDriver  # noqa: E402
from topk_middleware import private_top_k  # noqa: E402
from topk_middleware.access import AccessError, StoreTraits  # noqa: E402
from topk_middleware.keyed_noise import KeyedNoise  # noqa: E402

SCORES = np.arange(300, dtype=np.int64) * 2  # item i scores 2i: top-3 is 299, 298, 297
METHODS = ("auto", "threshold", "oneshot")
CURRENT = {"copy": "current", "proof": "fingerprint", "refreshes": 0}


@pytest.fixture
def table(clickhouse_connection: Any) -> Iterator[tuple[Any, str]]:
    """A MergeTree table (id Int64, score Int64) of SCORES; it and its copy dropped after."""
    name = f"counts_{uuid.uuid4().hex[:8]}"
    con = clickhouse_connection
    d = ChdbDriver(con)
    d.execute(f"CREATE TABLE {name} (id Int64, score Int64) ENGINE = MergeTree ORDER BY id")
    d.execute(
        f"INSERT INTO {name} SELECT number, 2 * number FROM numbers({len(SCORES)})",
    )
    yield con, name
    ClickHouseTable(con, name).uninstall()
    d.execute(f"DROP TABLE IF EXISTS {name} SYNC")


def top3(source: ClickHouseTable) -> dict[str, list[int]]:
    return {
        method: private_top_k(source, k=3, epsilon=1e4, seed=5, method=method).items
        for method in METHODS
    }


def test_every_write_is_seen_and_the_copy_says_how_it_knew(table: tuple[Any, str]) -> None:
    """After an ALTER UPDATE, an INSERT and a lightweight DELETE, every method releases the new
    top-3; the first run after a write reports the copy stale and rebuilt, the next one
    current by its fingerprint. Fails if a copy were served stale."""
    con, name = table
    d = ChdbDriver(con)
    source = ClickHouseTable(con, name)
    source.prepare()
    assert set(map(tuple, top3(source).values())) == {(299, 298, 297)}
    first = private_top_k(source, k=1, epsilon=1e4, seed=1)
    assert first.plan["freshness"] == CURRENT
    writes = [
        (
            f"ALTER TABLE {name} UPDATE score = 10000 WHERE id = 5 SETTINGS mutations_sync = 2",
            [5, 299, 298],
        ),
        (f"INSERT INTO {name} VALUES (1000, 20000)", [1000, 5, 299]),
        (f"DELETE FROM {name} WHERE id IN (1000, 299)", [5, 298, 297]),
    ]
    for statement, want in writes:
        d.execute(statement)
        after = private_top_k(source, k=3, epsilon=1e4, seed=2, method="threshold")
        assert after.plan["freshness"]["refreshes"] == 1, statement  # stale: rebuilt first
        assert after.items == want, statement
        assert set(map(tuple, top3(source).values())) == {tuple(want)}, statement
        again = private_top_k(source, k=1, epsilon=1e4, seed=3)
        assert again.plan["freshness"] == CURRENT


def test_a_frozen_copy_is_served_as_promised(table: tuple[Any, str]) -> None:
    """frozen=True: the caller's promise; the copy is read as built, no fingerprint read."""
    con, name = table
    frozen = ClickHouseTable(con, name, frozen=True)
    frozen.prepare()
    ChdbDriver(con).execute(f"INSERT INTO {name} VALUES (1000, 20000)")
    got = private_top_k(frozen, k=3, epsilon=1e4, seed=5, method="threshold")
    assert got.items == [299, 298, 297]
    assert got.plan["freshness"] == {"copy": "frozen", "refreshes": 0}


class Recording:
    """A chdb connection that keeps the text of every statement (not its parameters)."""

    def __init__(self, con: Any) -> None:
        self.con, self.statements = con, []

    def query(self, sql: str, fmt: str = "CSV", params: Any = None) -> Any:
        self.statements.append(sql)
        return self.con.query(sql, fmt, params=params)


@pytest.mark.parametrize("noise", ["gumbel", "laplace"])
def test_the_in_store_one_shot_is_the_top_k_of_its_keyed_noise(
    table: tuple[Any, str], noise: str
) -> None:
    """read_oneshot returns the exact top-k of min(score, cap) + the keyed noise KeyedNoise
    computes in Python (SHA-256 of "key:rank"), with and without a split into exceedances; the
    key and the exceedances' noises appear in no statement text. Fails on a wrong uniform
    (byte order, bits), a lost exceedance or a cut that drops a winner."""
    con, name = table
    recording = Recording(con)
    source = ClickHouseTable(recording, name)
    source.prepare()
    m, k = len(SCORES), 5
    ranked = np.sort(SCORES)[::-1].astype(np.float64)  # score at rank r
    rng = np.random.default_rng(9)
    for exceedances, scale in ((None, 40.0), (60, 40.0), (60, 2.0)):
        keyed = KeyedNoise.draw(rng, noise, scale, m, k, exceedances=exceedances, score_cap=590.0)
        assert (exceedances is None) == (len(keyed.exceed_positions) == 0)
        with source.snapshot():
            rows = source.read_oneshot(keyed, k)
        values = keyed.capped(ranked) + keyed.noises(np.arange(m))
        want = np.lexsort((np.arange(m), -values))[:k]
        assert rows is not None and rows.positions.tolist() == want.tolist()
        assert rows.ids.tolist() == [int(299 - r) for r in want.tolist()]
        secrets = [keyed.key, *(repr(float(z)) for z in keyed.exceed_noises[:5])]
        assert not any(s in text for s in secrets for text in recording.statements)


def test_refusals_come_before_anything_is_released(clickhouse_connection: Any) -> None:
    """A missing table or column, a text score, NULL, negative or repeated values: one clear
    sentence each, and a release before prepare() says to prepare; no raw ClickHouse text."""
    con = clickhouse_connection
    d = ChdbDriver(con)
    name = f"bad_{uuid.uuid4().hex[:8]}"
    try:
        with pytest.raises(ValueError, match=f"ClickHouse table 'default'.'{name}' does not"):
            ClickHouseTable(con, name)
        d.execute(
            f"CREATE TABLE {name} (id Int64, score Nullable(Int64), label String) "
            "ENGINE = MergeTree ORDER BY id"
        )
        with pytest.raises(ValueError, match=r"has no column 'votes' \(columns: \['id'"):
            ClickHouseTable(con, name, score="votes")
        with pytest.raises(TypeError, match="column 'label' must be numeric, it is String"):
            ClickHouseTable(con, name, score="label")
        source = ClickHouseTable(con, name)
        with pytest.raises(AccessError, match="has no rank-ordered copy: call prepare"):
            private_top_k(source, k=1, epsilon=1.0)
        for rows, message in (
            ("(1, 3, 'a'), (1, 4, 'b')", "duplicate ids .* each item must appear once"),
            ("(1, NULL, 'a'), (2, 4, 'b')", "has 1 NULL score"),
            ("(1, -3, 'a'), (2, 4, 'b')", "has 1 negative score"),
        ):
            d.execute(f"TRUNCATE TABLE {name}")
            d.execute(f"INSERT INTO {name} VALUES {rows}")
            with pytest.raises(ValueError, match=message):
                source.prepare()
            assert not source.has_rank_table()
    finally:
        dialect = ClickHouseDialect()
        ClickHouseTable(con, name).uninstall() if dialect.columns(d, "default", name) else None
        d.execute(f"DROP TABLE IF EXISTS {name} SYNC")


def test_cleanup_finds_the_copy_from_any_spelling(table: tuple[Any, str]) -> None:
    """Prepared as `name`, uninstalled as `default.name` and as database='default': every
    table prepare() made is gone, the user's table and its rows stay."""
    con, name = table
    d = ChdbDriver(con)
    ClickHouseTable(con, name).prepare()
    other = ClickHouseTable(con, f"default.{name}")
    prefix = other.copies.prefix
    assert prefix == ClickHouseTable(con, name, database="default").copies.prefix
    assert ClickHouseDialect().tables_like(d, "default", prefix)
    other.uninstall()
    assert ClickHouseDialect().tables_like(d, "default", prefix) == []
    assert d.scalar(f"SELECT count() FROM {name}") == len(SCORES)


def test_traits_are_declared(table: tuple[Any, str]) -> None:
    """The store declares its sensitivity (none assumed), integer counts and that its driver
    keeps parameters out of the statement text."""
    con, name = table
    assert ClickHouseTable(con, name, sensitivity=3).traits() == StoreTraits(
        3.0, None, True, parameters_in_text=False
    )


def test_the_writing_a_store_page_runs_as_written(
    clickhouse_connection: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every Python block of docs/writing-a-store.md runs as written: the source without traits
    is refused in one sentence, the declared one releases, and the ClickHouse example releases
    five items (it opens its own in-memory database on the worker's engine)."""
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[2] / "docs" / "writing-a-store.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    assert len(blocks) == 2
    for block in blocks:
        exec(compile(block, str(page), "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("Bare declares no traits: a store defines traits()")
    assert printed[1] == "(0,)"  # 497 counts ahead: no noise at epsilon 1 moves it
    assert len(eval(printed[2])) == 5


def test_reads_by_rank_come_back_in_the_order_asked(clickhouse_connection: Any) -> None:
    """ClickHouse reads a copy written in several parts on several threads and gives the rows
    back in the order they finish: reads by rank are put back in the order asked,
    duplicates kept, each row the one sorted access serves at that rank. Fails if the rows were
    matched to the ranks as they came (an IndexError or wrong ids)."""
    con = clickhouse_connection
    d = ChdbDriver(con)
    name = f"threads_{uuid.uuid4().hex[:8]}"
    d.execute(f"CREATE TABLE {name} (id Int64, score Int64) ENGINE = MergeTree ORDER BY id")
    try:
        d.execute(f"INSERT INTO {name} SELECT number, number % 997 FROM numbers(300000)")
        source = ClickHouseTable(con, name)
        # the copy written in parts of 10^4 rows, as a copy of 10^7 rows is by default
        d.execute("SET max_insert_block_size = 10000, min_insert_block_size_rows = 10000")
        try:
            source.prepare()
        finally:
            d.execute("SET max_insert_block_size = DEFAULT, min_insert_block_size_rows = DEFAULT")
        rng = np.random.default_rng(4)
        with source.snapshot():
            wanted = np.concatenate([rng.choice(300_000, 3000, replace=False), [7, 7]])
            rows = source.read_positions(wanted)
            head = source.read_sorted(0, 300_000)
        assert rows.positions.tolist() == wanted.tolist()
        assert rows.ids.tolist() == head.ids[wanted].tolist()
        assert rows.scores.tolist() == head.scores[wanted].tolist()
    finally:
        ClickHouseTable(con, name).uninstall()
        d.execute(f"DROP TABLE IF EXISTS {name} SYNC")
