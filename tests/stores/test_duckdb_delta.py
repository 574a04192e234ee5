"""DuckDB refresh by delta (adapters/dialects/duckdb/delta.py), on real DuckDB.

After UPDATE / INSERT / DELETE of counts and a delta refresh (no rebuild), a run serves the new
counts: sorted access is their canonical order, random access by position agrees with it, and
with one seed the release is the one of ArraySource over the new counts with the SAME positions
(`positions="input"`, arrays built in position order). The refresh reads the table once; the
delta is folded into a new base past `fold_fraction` of m; an empty delta is today's rank table.
"""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np
import pytest

import adapters.dialects.duckdb.delta as duckdb_delta
from adapters.duckdb import DuckDBTable, quote_identifier
from adapters.memory import ArraySource
from tests.helpers import reference_like
from tests.stores_duckdb import ID_COLUMN, SCORE_COLUMN, create_table
from topk_middleware import private_top_k

TABLE = 'Live "Counts"'
Q_TABLE, Q_ID, Q_SCORE = (quote_identifier(x) for x in (TABLE, ID_COLUMN, SCORE_COLUMN))


def make(con: duckdb.DuckDBPyConnection, m: int, text: bool, seed: int = 0) -> DuckDBTable:
    """A prepared table of m items with many ties (counts 0..29), int or text ids."""
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 30, size=m)
    ids = np.array([f"item-{i:05d}" for i in range(m)]) if text else np.arange(m) * 7
    create_table(con, TABLE, scores, ids)
    source = DuckDBTable(con, TABLE, id=ID_COLUMN, score=SCORE_COLUMN, frozen=True)
    source.prepare()
    return source


def pending(con: duckdb.DuckDBPyConnection, m: int, seed: int, text: bool = False) -> DuckDBTable:
    """A prepared table (`make`) after mixed writes and a delta refresh, never folded."""
    source = make(con, m, text, seed=seed)
    source.fold_fraction = 1.0
    write(con, "mixed", text, m)
    assert source.refresh().kind == "delta"
    return source


def item(i: int, text: bool) -> Any:
    return f"item-{i:05d}" if text else i * 7


def write(con: duckdb.DuckDBPyConnection, kind: str, text: bool, m: int) -> None:
    """Writes of one kind (or all kinds) to the table, in one transaction."""
    con.execute("BEGIN TRANSACTION")
    if kind in ("update", "mixed"):
        for i, step in ((3, 40), (17, -5), (m - 1, 100), (m // 2, 1), (m // 3, -100)):
            con.execute(
                f"UPDATE {Q_TABLE} SET {Q_SCORE} = greatest({Q_SCORE} + ?, 0) WHERE {Q_ID} = ?",
                [step, item(i, text)],
            )
    if kind in ("insert", "mixed"):
        for j, score in enumerate((55, 0, 12, 12)):
            new = f"new-{j}" if text else 10**6 + j
            con.execute(f"INSERT INTO {Q_TABLE} VALUES (?, ?)", [new, score])
    if kind in ("delete", "mixed"):
        for i in (0, 5, m // 4, m - 2):
            con.execute(f"DELETE FROM {Q_TABLE} WHERE {Q_ID} = ?", [item(i, text)])
    con.execute("COMMIT")


def live_counts(con: duckdb.DuckDBPyConnection) -> dict[Any, float]:
    return {
        k: float(v) for k, v in con.execute(f"SELECT {Q_ID}, {Q_SCORE} FROM {Q_TABLE}").fetchall()
    }


def read_everything(source: DuckDBTable, chunks: list[int]) -> tuple[Any, Any]:
    """In one snapshot: sorted access over the whole domain in the given chunk sizes (the merge
    cursor), then random access by position of every position."""
    with source.snapshot():
        m = source.domain_size()
        parts, start = [], 0
        sizes = iter(chunks)
        while start < m:
            size = next(sizes, m)
            parts.append(source.read_sorted(start, size))
            start += len(parts[-1])
        by_position = source.read_positions(np.arange(m))
    sorted_rows = tuple(
        np.concatenate([getattr(p, f) for p in parts]) for f in ("positions", "ids", "scores")
    )
    return sorted_rows, by_position


def same_positions_reference(source: DuckDBTable) -> ArraySource:
    """ArraySource over the source's current counts, its arrays in position order."""
    (positions, ids, scores), _ = read_everything(source, [])
    order = np.argsort(positions)
    return ArraySource(scores[order], ids[order], positions="input")


@pytest.mark.parametrize("text", [False, True], ids=["int-ids", "text-ids"])
@pytest.mark.parametrize("kind", ["update", "insert", "delete", "mixed"])
def test_delta_serves_the_new_counts(kind: str, text: bool, monkeypatch) -> None:
    """Sorted access is the canonical order of the live counts (ties by id, text in byte order),
    positions are dense 0..m-1 and random access by position agrees with sorted access."""
    monkeypatch.setattr(duckdb_delta, "MERGE_WINDOW", 7)  # many merge windows on a small table
    con = duckdb.connect()
    m = 400
    source = make(con, m, text)
    source.fold_fraction = 1.0  # never fold here
    write(con, kind, text, m)
    report = source.refresh()
    assert report.kind == "delta" and report.delta_rows > 0
    counts = live_counts(con)
    want = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    for chunks in ([1, 2, 3, 50, 9], [1000]):
        (positions, ids, scores), by_position = read_everything(source, chunks)
        assert list(zip(ids.tolist(), scores.tolist(), strict=True)) == want
        assert sorted(positions.tolist()) == list(range(len(counts)))
        assert by_position.positions.tolist() == list(range(len(counts)))
        rows = list(zip(ids.tolist(), scores.tolist(), strict=True))
        at = dict(zip(positions.tolist(), rows, strict=True))
        got = zip(by_position.ids.tolist(), by_position.scores.tolist(), strict=True)
        assert [at[p] for p in range(len(counts))] == list(got)
    with source.snapshot():
        assert source.positions_are_ranks is False
        assert source.score_run_count() is None
        assert source.domain_size() == len(counts)
        wanted = [want[5][0], want[-1][0]]
        assert source.read_ids(wanted).tolist() == [want[5][1], want[-1][1]]
        assert source.read_sorted(7, 4).ids.tolist() == [w[0] for w in want[7:11]]  # off-cursor
    assert not source.is_stale()


def test_positions_follow_the_documented_scheme() -> None:
    """Base items keep their base rank; inserted items are appended in id order; the positions
    at or above the new m fill the holes of deleted items, lowest to lowest."""
    con = duckdb.connect()
    m = 50
    source = make(con, m, text=False)
    source.fold_fraction = 1.0
    with source.snapshot():
        base = source.read_sorted(0, m)
    rank_of = dict(zip(base.ids.tolist(), base.positions.tolist(), strict=True))
    deleted = [base.ids[2], base.ids[10]]  # ranks 2 and 10
    con.execute(f"DELETE FROM {Q_TABLE} WHERE {Q_ID} IN (?, ?)", [int(x) for x in deleted])
    con.execute(f"INSERT INTO {Q_TABLE} VALUES (9999, 3), (8888, 100), (7777, 0)")
    assert source.refresh().kind == "delta"
    (positions, ids, _), _ = read_everything(source, [])
    position_of = dict(zip(ids.tolist(), positions.tolist(), strict=True))
    # m = 50 - 2 + 3 = 51: inserted 7777, 8888, 9999 take 50, 51, 52; 51 and 52 fill holes 2, 10
    assert position_of[7777] == 50 and position_of[8888] == 2 and position_of[9999] == 10
    for key, rank in rank_of.items():
        if key not in deleted:
            assert position_of[key] == rank


@pytest.mark.parametrize("text", [False, True], ids=["int-ids", "text-ids"])
def test_same_seed_same_release_as_array_source_with_the_same_positions(text: bool) -> None:
    """With one seed the release and its access counts are those of ArraySource over the new
    counts with the same positions: threshold (lazy and eager oracles) and oneshot."""
    con = duckdb.connect()
    source = pending(con, 600, seed=3, text=text)
    reference = same_positions_reference(source)
    for seed in range(6):
        for method, oracle in (
            ("threshold", "lazy"),
            ("threshold", "eager"),
            ("oneshot_full_read", "lazy"),
        ):
            for noise in ("gumbel", "laplace"):
                args = dict(k=4, epsilon=1.0, seed=seed, method=method, noise=noise)
                if method == "threshold":
                    args["oracle"] = oracle
                got, want = private_top_k(source, **args), private_top_k(reference, **args)
                assert got.items == want.items, (seed, method, oracle, noise)
                assert got.accesses.sorted == want.accesses.sorted
                assert got.accesses.random == want.accesses.random


@pytest.mark.parametrize("noise", ["gumbel", "laplace"])
def test_in_store_oneshot_over_a_pending_delta(noise: str) -> None:
    """The in-store one-shot over base + delta names items by their delta positions: its top-k
    is the top-k of (score at position) + KeyedNoise.noises(position) computed here, with and
    without a split (the exceedances joined by position, the cut over the merged rows)."""
    from topk_middleware.keyed_noise import KeyedNoise

    con = duckdb.connect()
    source = pending(con, 500, seed=4)
    with source.snapshot():
        m = source.domain_size()
        scores = source.read_positions(np.arange(m)).scores
        for trial, split in ((0, False), (1, True), (2, True)):
            draw = np.random.default_rng(trial)
            keyed = KeyedNoise.draw(draw, noise, 2.0, m if split else 0, 5, exceedances=40)
            values = scores + keyed.noises(np.arange(m))
            want = np.lexsort((np.arange(m), -values))[:5]
            got = source.read_oneshot(keyed, 5)
            assert got.positions.tolist() == want.tolist()
            assert np.array_equal(got.scores, scores[want])


@pytest.mark.parametrize("comment", ["kept", "dropped"])
def test_a_run_takes_the_delta_sizes_from_its_comment_or_counts_them(comment: str) -> None:
    """A refresh writes the delta's and skip table's row counts and generation as the delta
    table's comment, which a run reads with its catalog lookup; without it (tables written
    before the comment existed) the run counts them. Either way m and the release are those of
    the reference. Fails if a comment disagreed with the tables it describes, or if a missing
    comment were read as an empty delta."""
    con = duckdb.connect()
    m = 600
    source = pending(con, m, seed=5)
    delta = quote_identifier(source.delta_table)
    skip = quote_identifier(source.skip_table)
    counted = con.execute(
        f"SELECT (SELECT count(*) FROM {delta}), (SELECT count(*) FROM {skip}), "
        f"(SELECT any_value(gen) FROM {delta})"
    ).fetchone()
    stored = con.execute(
        "SELECT comment FROM duckdb_tables() WHERE table_name = ?", [source.delta_table]
    ).fetchone()[0]
    assert duckdb_delta.parse_delta_comment(stored) == counted and counted[0] > 0
    if comment == "dropped":
        con.execute(f"COMMENT ON TABLE {delta} IS NULL")
    reference = same_positions_reference(source)
    private_top_k(source, 3, 1.0, seed=0)  # the first run finds the delta tables
    for seed in range(4):
        got, want = (
            private_top_k(source, 3, 1.0, seed=seed),
            private_top_k(reference, 3, 1.0, seed=seed),
        )
        assert got.items == want.items and got.m == want.m == m + 4 - 4


def test_a_refresh_reads_the_table_once() -> None:
    """One statement of a delta refresh reads the user's table: the positional pass."""
    con = duckdb.connect()
    source = make(con, 300, text=True)
    write(con, "update", True, 300)
    report = source.refresh()
    assert report.kind == "delta"
    reading = [s for s in report.statements if Q_TABLE in s]
    assert report.table_reads == 1 and len(reading) == 1 and "POSITIONAL JOIN" in reading[0]
    assert report.changed == 5 and report.inserted == report.deleted == 0


def test_fold_past_the_fraction_and_an_empty_delta_is_the_rank_table() -> None:
    """Few changes stay in the delta; past fold_fraction of m the refresh rebuilds the base, and
    then (as with no write at all) positions are ranks: runs, answers and access counts are
    ArraySource's with positions as ranks."""
    con = duckdb.connect()
    m = 1000
    source = make(con, m, text=False)
    assert source.fold_fraction == duckdb_delta.FOLD_FRACTION == 0.05
    assert source.refresh().kind == "delta" and source.last_refresh.delta_rows == 0
    con.execute(f"UPDATE {Q_TABLE} SET {Q_SCORE} = {Q_SCORE} + 1 WHERE {Q_ID} < 7 * 40")
    report = source.refresh()  # 40 items: 4% of m
    assert report.kind == "delta" and report.delta_rows == 40
    with source.snapshot():
        assert source.positions_are_ranks is False
    con.execute(f"UPDATE {Q_TABLE} SET {Q_SCORE} = {Q_SCORE} + 1 WHERE {Q_ID} < 7 * 60")
    report = source.refresh()  # 60 items: 6% of m
    assert report.kind == "fold" and report.mismatched_rows == 60
    delta = quote_identifier(source.delta_table)
    assert con.execute(f"SELECT count(*) FROM {delta}").fetchone()[0] == 0
    counts = live_counts(con)
    reference = reference_like(source, list(counts.values()), list(counts.keys()))
    with source.snapshot():
        assert source.positions_are_ranks is True
        runs = ArraySource(list(counts.values()), list(counts.keys())).score_run_count()
        assert source.score_run_count() == runs
    for seed in range(4):
        got = private_top_k(source, k=5, epsilon=1.0, seed=seed)
        want = private_top_k(reference, k=5, epsilon=1.0, seed=seed)
        assert got.items == want.items and got.accesses == want.accesses


def test_prepare_refresh_is_the_delta_refresh_and_full_rebuilds() -> None:
    con = duckdb.connect()
    source = make(con, 200, text=False)
    write(con, "update", False, 200)
    source.prepare(refresh=True)
    assert source.last_refresh is not None and source.last_refresh.kind == "delta"
    source.prepare(refresh=True, full=True)
    with source.snapshot():
        assert source.positions_are_ranks is True
    assert not source.is_stale()


@pytest.mark.parametrize(
    ("statement", "message"),
    [
        (f"INSERT INTO {Q_TABLE} VALUES (7, 3)", "duplicate ids"),  # id 7 is item 1
        (f"INSERT INTO {Q_TABLE} VALUES (99999, 3), (99999, 4)", "duplicate ids"),
        (f"UPDATE {Q_TABLE} SET {Q_SCORE} = -1 WHERE {Q_ID} = 14", "negative"),
        (f"INSERT INTO {Q_TABLE} VALUES (NULL, 3)", "NULL id"),
        (f"UPDATE {Q_TABLE} SET {Q_SCORE} = NULL WHERE {Q_ID} = 14", "NULL score"),
    ],
)
def test_a_refresh_refuses_bad_rows_and_keeps_the_last_state(statement: str, message: str) -> None:
    con = duckdb.connect()
    source = make(con, 100, text=False)
    with source.snapshot():
        before = source.read_sorted(0, 100)
    con.execute(statement)
    with pytest.raises(ValueError, match=message):
        source.refresh()
    with source.snapshot():
        after = source.read_sorted(0, 100)
        assert source.positions_are_ranks is True
    assert after.ids.tolist() == before.ids.tolist()


def test_a_run_keeps_its_snapshot_while_a_writer_refreshes() -> None:
    """Base and delta are read in the run's transaction: a concurrent write and delta refresh
    on another connection change nothing within the run; the next run sees them."""
    con = duckdb.connect()
    source = make(con, 300, text=False)
    source.fold_fraction = 1.0
    write(con, "mixed", False, 300)
    source.refresh()
    old = live_counts(con)
    want_old = sorted(old.items(), key=lambda kv: (-kv[1], kv[0]))
    writer = con.cursor()
    with source.snapshot():
        head = source.read_sorted(0, 5)
        writer.execute(f"UPDATE {Q_TABLE} SET {Q_SCORE} = 1000 WHERE {Q_ID} = 70")
        writer.execute(f"INSERT INTO {Q_TABLE} VALUES (123456, 999)")
        DuckDBTable(writer, TABLE, id=ID_COLUMN, score=SCORE_COLUMN, frozen=True).refresh()
        rest = source.read_sorted(5, len(old) - 5)
        assert source.domain_size() == len(old)
    got = np.concatenate([head.ids, rest.ids]).tolist()
    assert got == [w[0] for w in want_old]
    with source.snapshot():
        assert source.read_sorted(0, 2).ids.tolist() == [70, 123456]


def test_a_view_refreshes_by_a_full_rebuild() -> None:
    """A view has no row order to keep a shadow in: prepare() works and refresh() rebuilds."""
    con = duckdb.connect()
    make(con, 50, text=False)
    con.execute(f'CREATE VIEW "counts view" AS SELECT * FROM {Q_TABLE}')
    source = DuckDBTable(con, "counts view", id=ID_COLUMN, score=SCORE_COLUMN, frozen=True)
    source.prepare()
    con.execute(f"UPDATE {Q_TABLE} SET {Q_SCORE} = 500 WHERE {Q_ID} = 21")
    assert source.refresh().kind == "build"
    with source.snapshot():
        assert source.read_sorted(0, 1).ids.tolist() == [21]


def test_a_table_in_a_schema_refreshes_by_delta() -> None:
    con = duckdb.connect()
    con.execute('CREATE SCHEMA "My Schema"')
    con.execute(
        'CREATE TABLE "My Schema"."t" AS SELECT range AS id, range % 7 AS score FROM range(300)'
    )
    source = DuckDBTable(con, "t", schema="My Schema", frozen=True)
    source.prepare()
    con.execute('UPDATE "My Schema"."t" SET score = 99 WHERE id = 5')
    con.execute('INSERT INTO "My Schema"."t" VALUES (1000, 50)')
    assert source.refresh().kind == "delta"
    with source.snapshot():
        assert source.read_sorted(0, 2).ids.tolist() == [5, 1000]
        assert source.domain_size() == 301
