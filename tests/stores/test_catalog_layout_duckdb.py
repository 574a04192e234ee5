"""The catalog a DuckDB copy leaves, pinned: tables prepared by one version of the code keep
working under the next with no migration.

For DuckDBTable on a table and on a view the tests spell out every object prepare() and a
refresh by delta make: tables with their columns, the unique index on rank, and the record each
keeps in its comment (the rank table's fingerprint: its tag and JSON; the delta table's sizes),
with the names derived as the code derives them (a digest of the table's, id's and score's
names). A copy written by hand in exactly that layout is then read as current by a frozen run,
kept by prepare(), refreshed by delta, and uninstall() leaves the catalog as it was. Random
parts of recorded text (the build mark, the delta's generation) are masked.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import duckdb
import numpy as np
import pytest

from adapters.dialects.duckdb.fingerprint import WHOLE_HEAD_ROWS
from adapters.duckdb import DuckDBTable
from adapters.memory import ArraySource
from topk_middleware import private_top_k

M = 100
SCORES = [i % 7 for i in range(M)]


def digest(*parts: str) -> str:
    return hashlib.sha1("\x00".join(parts).encode("utf-8")).hexdigest()[:10]


def catalog(con: duckdb.DuckDBPyConnection) -> set[tuple[Any, ...]]:
    """Every table, view and index of the database, comments with their random parts masked."""
    rows: set[tuple[Any, ...]] = set()
    for schema, name, comment, sql in con.execute(
        "SELECT schema_name, table_name, comment, sql FROM duckdb_tables()"
    ).fetchall():
        if comment is not None and comment.startswith("topk-rank-v1 "):
            record = json.loads(comment[len("topk-rank-v1 ") :])
            record["build"] = "<uuid>" if re.fullmatch(r"[0-9a-f]{32}", record["build"]) else "?"
            comment = "topk-rank-v1 " + json.dumps(record, sort_keys=True)
        elif comment is not None:
            comment = re.sub(r" -?\d{6,}$", " <gen>", comment)
        rows.add(("table", schema, name, comment, sql))
    for schema, name in con.execute(
        "SELECT schema_name, view_name FROM duckdb_views() WHERE NOT internal"
    ).fetchall():
        rows.add(("view", schema, name))
    for schema, name, table, unique, sql in con.execute(
        "SELECT schema_name, index_name, table_name, is_unique, sql FROM duckdb_indexes()"
    ).fetchall():
        rows.add(("index", schema, name, table, unique, sql))
    return rows


def fingerprint(definition: str, rows: int | None, runs: int, head: Any) -> str:
    """The rank table's comment as prepare() writes it (the build mark masked)."""
    record = {
        "base": M,
        "build": "<uuid>",
        "definition": hashlib.sha1(definition.encode("utf-8")).hexdigest()[:16],
        "head": head,
        "rows": rows,
        "runs": runs,
    }
    return "topk-rank-v1 " + json.dumps(record, sort_keys=True)


def head_of(ids: list[Any], text: bool) -> dict[str, Any]:
    """The rows of the canonical order the fingerprint holds: every row of a copy this small
    (at most WHOLE_HEAD_ROWS), else the first 64."""
    order = sorted(range(M), key=lambda i: (-SCORES[i], ids[i]))[
        : M if M <= WHOLE_HEAD_ROWS else 64
    ]
    return {
        "dtype": "text" if text else "<i8",
        "ids": [ids[i] for i in order],
        "scores": [float(SCORES[i]) for i in order],
    }


@pytest.fixture(params=["integer", "text"])
def table(request: pytest.FixtureRequest) -> Any:
    con = duckdb.connect()
    text = request.param == "text"
    ids = [f"item {i:03d}" for i in range(M)] if text else list(range(M))
    kind = "VARCHAR" if text else "BIGINT"
    con.execute(f'CREATE TABLE "Votes" ("Item" {kind}, n BIGINT)')
    con.execute('INSERT INTO "Votes" SELECT unnest(?), unnest(?)', [ids, SCORES])
    yield con, ids, text, kind
    con.close()


def definition(con: duckdb.DuckDBPyConnection, name: str) -> str:
    """The table's or view's CREATE statement as the catalog holds it (the fingerprint hashes
    it)."""
    return con.execute(
        "SELECT sql FROM duckdb_tables() WHERE table_name = $n UNION ALL "
        "SELECT sql FROM duckdb_views() WHERE view_name = $n",
        {"n": name},
    ).fetchone()[0]


def expected(
    con: duckdb.DuckDBPyConnection, name: str, kind: str, ids: list[Any], text: bool, view: bool
) -> set[Any]:
    """The objects prepare() makes for `name` (id column "Item", score column n)."""
    rank = f"{name}__topk_rank_{digest(name, 'Item', 'n')}"
    objects = {
        (
            "table",
            "main",
            rank,
            fingerprint(definition(con, name), None if view else M, 7, head_of(ids, text)),
            f"CREATE TABLE {rank}(rank BIGINT, id {kind}, score DOUBLE);",
        ),
        ("table", "main", f"{rank}_runs", None,
         f"CREATE TABLE {rank}_runs(first_rank BIGINT, score DOUBLE);"),
        (
            "index",
            "main",
            f"{rank}_rank",
            rank,
            True,
            f"CREATE UNIQUE INDEX {rank}_rank ON {rank}(rank);",
        ),
    }  # fmt: skip
    if not view:  # the refresh by delta's tables
        objects |= {
            ("table", "main", f"{rank}_shadow", None,
             f"CREATE TABLE {rank}_shadow(id {kind}, score BIGINT, rank BIGINT);"),
            ("table", "main", f"{rank}_delta", "topk-delta 0 0 -",
             f'CREATE TABLE {rank}_delta(seq BIGINT, "position" BIGINT, id {kind}, '
             "score DOUBLE, gen BIGINT);"),
            ("table", "main", f"{rank}_skip", None, f"CREATE TABLE {rank}_skip(base_rank BIGINT);"),
        }  # fmt: skip
    return objects


@pytest.mark.parametrize("frozen", [True, False])
def test_prepare_makes_exactly_these_objects_and_uninstall_removes_them(
    table: Any, frozen: bool
) -> None:
    con, ids, text, kind = table
    con.execute('CREATE VIEW v AS SELECT * FROM "Votes"')
    before = catalog(con)
    source = DuckDBTable(con, "votes", id="Item", score="n", frozen=frozen)  # any spelling
    view = DuckDBTable(con, "V", id="Item", score="n", frozen=frozen)
    source.prepare()
    view.prepare()
    made = catalog(con) - before
    assert made == expected(con, "Votes", kind, ids, text, False) | expected(
        con, "v", kind, ids, text, True
    )
    assert catalog(con) >= before
    source.uninstall()
    view.uninstall()
    assert catalog(con) == before


def test_a_refresh_by_delta_records_its_sizes_in_the_delta_table(table: Any) -> None:
    con, ids, text, kind = table
    source = DuckDBTable(con, "Votes", id="Item", score="n", frozen=True)
    source.prepare()
    con.execute('UPDATE "Votes" SET n = 50 WHERE "Item" = ?', [ids[3]])
    report = source.refresh()
    assert report.kind == "delta" and (report.delta_rows, report.skip_rows) == (1, 1)
    rank = f"Votes__topk_rank_{digest('Votes', 'Item', 'n')}"
    comment = con.execute(
        "SELECT comment FROM duckdb_tables() WHERE table_name = ?", [f"{rank}_delta"]
    ).fetchone()[0]
    assert re.fullmatch(r"topk-delta 1 1 -?\d+", comment)
    stored = {row[2]: row[3] for row in catalog(con) if row[0] == "table"}
    want = {
        row[2]: row[3]
        for row in expected(con, "Votes", kind, ids, text, False)
        if row[0] == "table"
    }
    assert stored[rank] == want[rank]  # the same record, a new build mark
    assert stored[f"{rank}_delta"] == "topk-delta 1 1 <gen>"


def write_old_layout(con: duckdb.DuckDBPyConnection, ids: list[Any], kind: str, text: bool) -> str:
    """The copy of "Votes" in the pinned layout, written by hand: rank table in rank
    order with its fingerprint, unique index on rank, runs table, shadow (rows in the table's
    order), empty delta and skip tables."""
    rank = f"Votes__topk_rank_{digest('Votes', 'Item', 'n')}"
    order = sorted(range(M), key=lambda i: (-SCORES[i], ids[i]))
    con.execute(
        f'CREATE TABLE "{rank}" AS SELECT unnest(?::BIGINT[]) AS rank, unnest(?::{kind}[]) AS id, '
        "unnest(?::DOUBLE[]) AS score",
        [list(range(M)), [ids[i] for i in order], [float(SCORES[i]) for i in order]],
    )
    con.execute(f'CREATE UNIQUE INDEX "{rank}_rank" ON "{rank}" (rank)')
    con.execute(
        f'CREATE TABLE "{rank}_runs" AS SELECT min(rank) AS first_rank, score FROM "{rank}" '
        "GROUP BY score ORDER BY first_rank"
    )
    con.execute(
        f'CREATE TABLE "{rank}_shadow" AS SELECT r.id, t.n AS score, r.rank FROM "Votes" AS t '
        f'JOIN "{rank}" AS r ON r.id = t."Item" ORDER BY t.rowid'
    )
    con.execute(
        f'CREATE TABLE "{rank}_delta" (seq BIGINT, "position" BIGINT, id {kind}, score DOUBLE, '
        "gen BIGINT)"
    )
    con.execute(f'CREATE TABLE "{rank}_skip" (base_rank BIGINT)')
    con.execute(f"COMMENT ON TABLE \"{rank}_delta\" IS 'topk-delta 0 0 -'")
    record = json.loads(
        fingerprint(definition(con, "Votes"), M, 7, head_of(ids, text))[len("topk-rank-v1 ") :]
    )
    record["build"] = "0123456789abcdef0123456789abcdef"
    text_record = "topk-rank-v1 " + json.dumps(record, sort_keys=True)
    con.execute(f"COMMENT ON TABLE \"{rank}\" IS '{text_record}'")
    return rank


def test_a_copy_in_the_pinned_layout_is_read_kept_refreshed_and_uninstalled(table: Any) -> None:
    con, ids, text, kind = table
    before = catalog(con)
    rank = write_old_layout(con, ids, kind, text)
    source = DuckDBTable(con, "Votes", id="Item", score="n", frozen=True)
    reference = ArraySource(np.asarray(SCORES, dtype=float), ids=np.asarray(ids, dtype=object))
    for seed in range(3):
        got = private_top_k(source, k=3, epsilon=1.0, method="threshold", seed=seed)
        want = private_top_k(reference, k=3, epsilon=1.0, method="threshold", seed=seed)
        assert got.items == want.items
        assert (got.accesses.sorted, got.accesses.random) == (
            want.accesses.sorted,
            want.accesses.random,
        )
    source.prepare()  # the copy belongs to the table: kept, not rebuilt
    mark = con.execute(
        "SELECT comment FROM duckdb_tables() WHERE table_name = ?", [rank]
    ).fetchone()[0]
    assert '"build": "0123456789abcdef0123456789abcdef"' in mark
    con.execute('UPDATE "Votes" SET n = 50 WHERE "Item" = ?', [ids[3]])
    assert source.refresh().kind == "delta"  # its shadow serves the refresh by delta
    with source.snapshot():
        top = source.read_sorted(0, 1)
    assert top.ids.tolist() == [ids[3]] and top.scores.tolist() == [50.0]
    source.uninstall()
    assert catalog(con) == before
