"""IbisTable's own behaviour (the conformance suite runs it on DuckDB, SQLite and PostgreSQL:
tests/stores_ibis.py): refusals in the project's words before anything is read, and a backend
whose transactions the adapter does not know (Ibis's Polars backend) served only on the
caller's promise that the data do not change; on DuckDB, SQLite and PostgreSQL each kind of
read compiled once and its values bound. About 5 s."""

from __future__ import annotations

import ibis
import numpy as np
import polars as pl
import pytest

from adapters.ibis import IbisTable
from adapters.memory import ArraySource
from topk_middleware import private_top_k
from topk_middleware.access import AccessError


@pytest.fixture
def duck() -> ibis.BaseBackend:
    backend = ibis.duckdb.connect()
    yield backend
    backend.disconnect()


def test_refusals_name_the_problem(duck: ibis.BaseBackend) -> None:
    t = duck.create_table("votes", schema=ibis.schema({"id": "int64", "score": "float64"}))
    with pytest.raises(TypeError, match="Ibis table expression"):
        IbisTable("votes")
    with pytest.raises(ValueError, match="no column 'votes'"):
        IbisTable(t, score="votes")
    labels = duck.create_table("labels", schema=ibis.schema({"id": "int64", "score": "string"}))
    with pytest.raises(TypeError, match="must be numeric"):
        IbisTable(labels)
    with pytest.raises(ValueError, match="sensitivity"):
        IbisTable(t, sensitivity=-1)


def test_an_unknown_backend_needs_the_frozen_promise_and_byte_order_for_text() -> None:
    backend = ibis.polars.connect()
    rng = np.random.default_rng(2)
    scores = rng.integers(0, 30, 400)
    backend.create_table("votes", pl.DataFrame({"id": rng.permutation(400), "score": scores}))
    table = backend.table("votes")
    with pytest.raises(ValueError, match="cannot open a consistent read on polars"):
        IbisTable(table)
    source = IbisTable(table, frozen=True)
    frame = table.execute()
    want = private_top_k(
        ArraySource(frame["score"].to_numpy(), frame["id"].to_numpy()),
        5,
        1.0,
        method="threshold",
        seed=4,
    )
    got = private_top_k(source, 5, 1.0, method="threshold", seed=4)
    assert got.items == want.items
    assert (got.accesses.sorted, got.accesses.random) == (
        want.accesses.sorted,
        want.accesses.random,
    )
    # no window functions on this backend: one query a rank read by position
    assert not source.numbers_rows and got.accesses.round_trips > want.accesses.round_trips
    backend.create_table("named", pl.DataFrame({"id": ["a", "b"], "score": [1, 2]}))
    with pytest.raises(ValueError, match="byte order of their UTF-8 text"):
        IbisTable(backend.table("named"), frozen=True)


def test_a_release_reads_an_expression_not_only_a_table(duck: ibis.BaseBackend) -> None:
    """Any table expression: a filter and a renamed column, the canonical order of what it
    selects (the same release as ArraySource over those rows)."""
    rng = np.random.default_rng(8)
    m = 3000
    data = {
        "item": rng.permutation(m),
        "n": rng.integers(0, 100, m),
        "region": rng.integers(0, 3, m),
    }
    t = duck.create_table("events", ibis.memtable(data))
    expression = t.filter(t.region == 1).rename(votes="n")
    source = IbisTable(expression, id="item", score="votes")
    kept = data["region"] == 1
    reference = ArraySource(data["n"][kept], data["item"][kept])
    for seed in range(3):
        want = private_top_k(reference, 4, 1.0, method="threshold", seed=seed)
        got = private_top_k(source, 4, 1.0, method="threshold", seed=seed)
        assert got.items == want.items and got.m == int(kept.sum())


def test_the_benchmark_runs_as_the_docs_show(tmp_path) -> None:
    """`python -m benchmarks.ibis_overhead --quick --backends duckdb sqlite --out DIR`
    (docs/layers.md): m = 10^4, about 3 s."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.ibis_overhead", "--quick", "--backends", "duckdb",
         "sqlite", "--out", str(tmp_path)],
        cwd=root, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    payload = json.loads((tmp_path / "ibis_overhead.json").read_text())
    assert {(r["backend"], r["family"], r["method"]) for r in payload["results"]} == {
        (b, f, m)
        for b in ("duckdb", "sqlite")
        for f in ("zipf", "distinct")
        for m in ("threshold", "oneshot_in_store")
    }
    in_store = {
        (r["backend"], r["ibis_in_store"], r["native_in_store"])
        for r in payload["results"]
        if r["method"] == "oneshot_in_store"
    }
    assert in_store == {("duckdb", True, True), ("sqlite", False, True)}


@pytest.mark.parametrize("store", ["duckdb", "sqlite", "postgres"])
@pytest.mark.parametrize("text_ids", [False, True])
def test_each_kind_of_read_is_compiled_once_and_binds_its_values(
    request: pytest.FixtureRequest, store: str, text_ids: bool
) -> None:
    """On the backends whose driver binds values, a read's statement is compiled at its first
    use and reused by every later read of that kind: the same rows as the canonical order of
    the data, the asked values absent from the statement text, and an id the column cannot
    hold is no item (not sent: a PostgreSQL transaction goes on)."""
    rng = np.random.default_rng(5)
    scores = rng.integers(0, 6, 300)  # many ties: keyset reads cross runs of equal scores
    ids = np.asarray([f"é{i}" for i in range(300)]) if text_ids else rng.permutation(10**6)[:300]
    source = request.getfixturevalue(f"make_ibis_{store}_source")(scores, ids)
    reference = ArraySource(scores, ids)
    want = reference.read_sorted(0, 300)
    asked = want.ids[[4, 150, 299]].tolist()
    texts: dict[str, str] = {}
    for _ in range(2):
        with source.snapshot():
            got = [
                source.read_sorted(0, 7),
                source.read_sorted(7, 100),
                source.read_sorted(107, 193),
            ]
            assert np.concatenate([r.ids for r in got]).tolist() == want.ids.tolist()
            assert np.concatenate([r.scores for r in got]).tolist() == want.scores.tolist()
            by_rank = source.read_positions(np.asarray([299, 3, 150]))
            assert by_rank.positions.tolist() == [3, 150, 299]
            assert by_rank.ids.tolist() == want.ids[[3, 150, 299]].tolist()
            assert source.read_ids(asked).tolist() == want.scores[[4, 150, 299]].tolist()
            with pytest.raises(AccessError, match="no item with id"):
                source.read_ids([3.5 if text_ids else "x"])
            assert source.domain_size() == 300
        if texts:
            assert source._statements._sql == texts  # nothing compiled the second time
        texts = dict(source._statements._sql)
    assert {"sorted", "keyset", "ranks", "ids", "count"} <= set(texts)
    for value in [*asked, "150"]:
        assert all(repr(value) not in text and f"'{value}'" not in text for text in texts.values())
