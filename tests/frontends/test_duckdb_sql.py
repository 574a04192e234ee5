"""The private top-k called from DuckDB SQL (frontends/duckdb_sql.py), on a real DuckDB database
and a real SQLite ledger: the release, its law, its charge, its refusals, and why the release
reads through a cursor (DuckDB refuses a function that queries its own connection). About 3 s.
"""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import numpy as np
import pytest
from scipy import stats

from adapters.duckdb import DuckDBTable
from frontends.duckdb_sql import register_private_top_k
from topk_middleware import PrivacyLedger, private_top_k
from topk_middleware.release import guarantee_text

M = 1_000_000


@pytest.fixture
def con() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    # zipf-like counts with wide gaps at the top: the top 5 are 0..4 whatever the noise at eps 1
    con.execute(
        f"CREATE TABLE item_votes AS SELECT range AS id, "
        f"CAST(floor(1e7 / (range + 1)) AS BIGINT) AS score FROM range({M})"
    )
    yield con
    con.close()


@pytest.fixture
def ledger(tmp_path: Path) -> PrivacyLedger:
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'ledger.db'}")
    yield ledger
    ledger.close()


def registered(con, ledger, total=(10.0, 1e-6), oblivious=True, principal="alice"):
    ledger.budget(principal, *total)
    table = DuckDBTable(con, "item_votes", frozen=True)
    table.prepare()
    return register_private_top_k(
        con, ledger=ledger, principal=principal, tables=[table], oblivious=oblivious
    )


def error_text(con: duckdb.DuckDBPyConnection, query: str) -> str:
    with pytest.raises(duckdb.Error) as caught:
        con.execute(query).fetchall()
    text = str(caught.value)
    assert "Traceback" not in text and 'File "' not in text, text
    return text


@pytest.mark.parametrize("oblivious", [True, False])
def test_sql_release_is_the_top_k_charged_once_through_the_sublinear_path(con, ledger, oblivious):
    """Rank and item of the top 5 (gaps of >= 10^5 votes against a noise scale of 5), one
    charge of the Python release's cost, and fewer rows read than m. Fails if the SQL call
    releases other items, charges twice or nothing, or reads the whole table."""
    registration = registered(con, ledger, oblivious=oblivious)
    rows = con.execute("SELECT * FROM private_top_k('item_votes', 5, 1.0)").fetchall()
    assert rows == [(1, "0"), (2, "1"), (3, "2"), (4, "3"), (5, "4")]
    described = con.execute("DESCRIBE SELECT * FROM private_top_k('item_votes', 5, 1.0)")
    assert [(r[0], r[1]) for r in described.fetchall()] == [
        ("rank", "INTEGER"),
        ("item", "VARCHAR"),
    ]
    spent = ledger.spent("alice")
    # the same release from Python, charged to a second principal: the same cost
    python_budget = ledger.budget("bob", 10.0, 1e-6)
    python = private_top_k(
        DuckDBTable(con.cursor(), "item_votes", frozen=True),
        5,
        1.0,
        budget=python_budget,
        oblivious=oblivious,
    )
    assert python.items == [0, 1, 2, 3, 4]
    assert ledger.spent("bob") == spent
    assert len(ledger.releases("alice")) == 1
    diagnostics = registration.last_diagnostics
    # sublinear: the paper bound 2(sqrt(mk) + sqrt(m/2)) = 5,886 here, read on both lists at most
    assert 0 < diagnostics.accesses.total <= 2 * 2 * (math.sqrt(M * 5) + math.sqrt(M / 2))
    assert diagnostics.method == python.method == ("oneshot" if oblivious else "threshold")
    text = con.execute("SELECT private_top_k_guarantee()").fetchall()[0][0]
    assert text == guarantee_text(registration.last) == guarantee_text(python.release())


def test_each_sql_call_draws_fresh_noise_with_the_exact_law(con, ledger):
    """Top-1 of four items with counts 3, 2, 1, 0 at epsilon 1 (scale 1): Gumbel-max picks item
    i with probability exp(h_i) / sum_j exp(h_j) (exact). 400 calls, chi-square p > 1e-3. Fails
    if DuckDB folds or caches the call (one answer 400 times) or the noise has another law."""
    con.execute(
        "CREATE TABLE four AS SELECT * FROM (VALUES (10, 3), (11, 2), (12, 1), (13, 0)) "
        "AS v(id, score)"
    )
    ledger.budget("carol", 1e4)
    table = DuckDBTable(con, "four", frozen=True)
    table.prepare()
    register_private_top_k(con, ledger=ledger, principal="carol", tables=[table], oblivious=False)
    calls = 400
    picks = [
        con.execute("SELECT item FROM private_top_k('four', 1, 1.0)").fetchall()[0][0]
        for _ in range(calls)
    ]
    h = np.array([3.0, 2.0, 1.0, 0.0])
    law = np.exp(h) / np.exp(h).sum()
    seen = np.array([picks.count(str(i)) for i in (10, 11, 12, 13)])
    expected = law * calls
    # pool the two rare items so that every expected count is >= 5
    seen = np.array([seen[0], seen[1], seen[2] + seen[3]])
    expected = np.array([expected[0], expected[1], expected[2] + expected[3]])
    assert stats.chisquare(seen, expected).pvalue > 1e-3, (seen, expected)
    assert len(ledger.releases("carol")) == calls


def test_refusals_are_in_the_projects_words_and_charge_nothing(con, ledger):
    registered(con, ledger, total=(1.5, 1e-6))
    cases = {
        "SELECT * FROM private_top_k('item_votes', 0, 1.0)": "k must be >= 1, got 0",
        "SELECT * FROM private_top_k('item_votes', 5, -1.0)": "epsilon must be finite and > 0",
        "SELECT * FROM private_top_k('item_votes', 5, NULL)": "epsilon must not be NULL",
        "SELECT * FROM private_top_k('item_votes', 5, 1.0, noise := 'cauchy')": "noise must be",
        "SELECT * FROM private_top_k('item_votes', 5, 1.0, delta := 1.0)": "delta must be in",
        "SELECT * FROM private_top_k('other', 5, 1.0)": "'other' is not a table registered",
        "SELECT * FROM private_top_k('item_votes', 20000, 1.0)": "more than the 10,000 items",
    }
    for query, words in cases.items():
        text = error_text(con, query)
        assert words in text and "nothing was read, charged or released" in text, text
    assert ledger.releases("alice") == []
    con.execute("SELECT * FROM private_top_k('item_votes', 5, 1.0)").fetchall()
    text = error_text(con, "SELECT * FROM private_top_k('item_votes', 5, 1.0)")
    assert "principal 'alice'" in text and "nothing was read or released" in text, text
    assert len(ledger.releases("alice")) == 1


def test_a_refusal_for_the_data_names_no_fact_of_it(con, ledger):
    """k above m is a fact of the table: the analyst sees a reference, the owner the reason."""
    con.execute("CREATE TABLE small AS SELECT range AS id, range AS score FROM range(7)")
    ledger.budget("dave", 10.0, 1e-6)
    table = DuckDBTable(con, "small", frozen=True)
    table.prepare()
    registration = register_private_top_k(con, ledger=ledger, principal="dave", tables=[table])
    text = error_text(con, "SELECT * FROM private_top_k('small', 9, 1.0)")
    assert "reason in the table's data" in text and "7" not in text.split("reference")[0]
    (reference,) = registration.refusals
    assert reference in text and "7" in registration.refusals[reference]


def test_registration_refuses_a_principal_without_budget_and_foreign_tables(con, ledger):
    table = DuckDBTable(con, "item_votes", frozen=True)
    with pytest.raises(KeyError, match="has no budget"):
        register_private_top_k(con, ledger=ledger, principal="nobody", tables=[table])
    ledger.budget("erin", 1.0)
    with pytest.raises(TypeError, match="DuckDBTable"):
        register_private_top_k(con, ledger=ledger, principal="erin", tables=["item_votes"])
    with pytest.raises(ValueError, match="at least one table"):
        register_private_top_k(con, ledger=ledger, principal="erin", tables=[])


def test_a_function_cannot_query_its_own_connection_but_a_cursor_can(con):
    """Why the release reads through a cursor: DuckDB refuses a Python function that runs a
    query on the connection running it, and serves one on a cursor of it."""

    def same(_: str) -> int:
        return con.execute("SELECT count(*) FROM item_votes").fetchall()[0][0]

    def cursor(_: str) -> int:
        reader = con.cursor()
        try:
            return reader.execute("SELECT count(*) FROM item_votes").fetchall()[0][0]
        finally:
            reader.close()

    con.create_function("same_con", same, ["VARCHAR"], "BIGINT", side_effects=True)
    con.create_function("via_cursor", cursor, ["VARCHAR"], "BIGINT", side_effects=True)
    with pytest.raises(duckdb.Error, match="cannot use that query's connection"):
        con.execute("SELECT same_con('x')").fetchall()
    assert con.execute("SELECT via_cursor('x')").fetchall() == [(M,)]


def test_registering_again_replaces_the_registration(con, ledger):
    first = registered(con, ledger, principal="frank")
    ledger.budget("grace", 10.0, 1e-6)
    second = register_private_top_k(
        con, ledger=ledger, principal="grace", tables=list(first.tables.values())
    )
    con.execute("SELECT * FROM private_top_k('item_votes', 5, 1.0)").fetchall()
    assert len(ledger.releases("grace")) == 1 and ledger.releases("frank") == []
    second.unregister()
    with pytest.raises(duckdb.Error):
        con.execute("SELECT * FROM private_top_k('item_votes', 5, 1.0)").fetchall()


def test_the_benchmark_runs_as_the_docs_show(tmp_path: Path):
    """`python -m benchmarks.duckdb_sql --quick --out DIR` (docs/layers.md): m = 10^5, 3 reps,
    about 3 s; the JSON holds both families and modes with their ratios."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.duckdb_sql", "--quick", "--out", str(tmp_path)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    payload = json.loads((tmp_path / "duckdb_sql.json").read_text())
    assert [f["family"] for f in payload["families"]] == ["zipf", "distinct"]
    for family in payload["families"]:
        assert set(family["modes"]) == {"oblivious", "adaptive"}
        for found in family["modes"].values():
            assert found["ratio_sql_to_python"] > 0
