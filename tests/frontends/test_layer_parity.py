"""The query layers keep one contract: DuckDB SQL (frontends/duckdb_sql.py), the Polars namespace
(frontends/polars_ns.py), IbisTable (adapters/ibis.py) and the dbt model (frontends/dbt_model.py).

On one real DuckDB database and one SQLite ledger, every layer
* charges the same ledger principal, one release per call, at the same cost;
* states the same guarantee in the same words (guarantee_text), whose claim is checked against
  a value computed here: Gumbel noise of per-item scale k * sensitivity / epsilon and pure
  epsilon-DP for add/remove-one-client neighbours (Wu et al. 2023, Fact 3.3);
* refuses bad input with the core's own sentence (validation.check_common, called here for the
  expected words), before anything is read or charged, with no engine message in it;
* hands the analyst the release only: rank and item (and the guarantee), never the counts,
  the access counts or the plan.

The dbt model is called in process with the run context dbt-duckdb hands a Python model (`this`,
and `ref` loading `select * from "db"."schema"."table"` on the run's connection, as dbt-duckdb's
loader does); tests/frontends/test_dbt.py runs `dbt run` itself. About 3 s.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import ibis
import pytest

import frontends.polars_ns  # noqa: F401 - registers the namespace
from adapters.duckdb import DuckDBTable
from adapters.ibis import IbisTable
from frontends.dbt_model import private_top_k_model
from frontends.duckdb_sql import register_private_top_k
from topk_middleware import PrivacyLedger, private_top_k
from topk_middleware.release import Release, guarantee_text
from topk_middleware.validation import check_common

M, K, EPSILON = 2_000, 5, 1.0
PRINCIPAL = "analyst"
LAYERS = ("duckdb_sql", "polars", "ibis", "dbt")
# words that only an engine's own error carries; none may reach the analyst
ENGINE_WORDS = ("Binder Error", "Conversion Error", "Catalog Error", "Traceback", "__topk_release")
ENGINE_WORDS += ("polars.exceptions", "ComputeError", "ibis.common", "sqlglot")


@dataclasses.dataclass
class Released:
    rows: list[tuple[int, str]]  # (rank, item as text), what the analyst sees
    guarantee: str
    shown: Any  # the analyst-facing object itself


class RunContext:
    """What dbt-duckdb hands a Python model as `dbt`: `this` and `ref` (its loader's query)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run_date: str) -> None:
        self.con = con
        self.this = type("This", (), {"database": "memory", "schema": "main", "identifier": "top"})
        self.run_date = run_date

    def ref(self, name: str) -> duckdb.DuckDBPyRelation:
        return self.con.query(f'select * from "memory"."main"."{name}"')


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Any]:
    con = duckdb.connect()
    # scores 10^6 / (r + 1) for ids in a fixed shuffled order: the top 5 are 33,000 or more
    # apart, against Gumbel noise of scale 5, so every layer releases the true top 5 except with
    # probability below 10^-2000
    con.execute(
        f"CREATE TABLE votes AS SELECT (range * 7919) % {M} AS id, "
        f"CAST(floor(1e6 / (range + 1)) AS BIGINT) AS score, 'x' || range AS label FROM range({M})"
    )
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = PrivacyLedger(url)
    budget = ledger.budget(PRINCIPAL, 1_000.0, 0.01)
    table = DuckDBTable(con, "votes", frozen=True)
    table.prepare()
    register_private_top_k(con, ledger=ledger, principal=PRINCIPAL, tables=[table], oblivious=False)
    frame = con.sql("SELECT id, score, label FROM votes").pl()
    expression = ibis.duckdb.from_connection(con).table("votes")
    top = [
        str(i)
        for (i,) in con.execute(f"SELECT id FROM votes ORDER BY score DESC LIMIT {K}").fetchall()
    ]
    world = {"con": con, "ledger": ledger, "budget": budget, "url": url, "frame": frame}
    world.update(expression=expression, top=top, dates=iter(range(10**6)))
    yield world
    ledger.close()
    con.close()


def _sql_literal(value: Any) -> str:
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, float) and math.isnan(value):
        return "'nan'::DOUBLE"
    return repr(value)


def release_on(world: dict[str, Any], layer: str, **given: Any) -> Released:
    """One release through `layer` with k, epsilon (and id, score for the layers that take
    columns from the analyst), adaptive, charged to PRINCIPAL."""
    k, epsilon = given.pop("k", K), given.pop("epsilon", EPSILON)
    if layer == "duckdb_sql":
        con = world["con"]
        query = f"SELECT * FROM private_top_k('votes', {_sql_literal(k)}, {_sql_literal(epsilon)})"
        result = con.execute(query)
        columns = [d[0] for d in result.description]
        rows = result.fetchall()
        (text,) = con.execute("SELECT private_top_k_guarantee()").fetchone()
        return Released([(r, str(i)) for r, i in rows], text, columns)
    if layer == "polars":
        got = world["frame"].topk.private_top_k(
            k=k,
            epsilon=epsilon,
            id=given.get("id", "id"),
            score=given.get("score", "score"),
            budget=world["budget"],
            oblivious=False,
        )
        rows = [(r, str(i)) for r, i in got.frame.iter_rows()]
        return Released(rows, got.guarantee_text, got)
    if layer == "ibis":
        source = IbisTable(world["expression"], frozen=True, **given)
        result = private_top_k(source, k, epsilon, budget=world["budget"], oblivious=False)
        release = result.release()
        rows = [(r, str(i)) for r, i in enumerate(release.items, 1)]
        return Released(rows, guarantee_text(release), release)
    dbt = RunContext(world["con"], f"day-{next(world['dates'])}")
    table = private_top_k_model(
        dbt,
        world["con"],
        dbt.ref("votes"),
        k=k,
        epsilon=epsilon,
        ledger=world["url"],
        principal=PRINCIPAL,
        run_date=dbt.run_date,
        oblivious=False,
        **given,
    )
    rows = [(row["rank"], str(row["item"])) for row in table.to_pylist()]
    (text,) = set(table.column("guarantee").to_pylist())
    return Released(rows, text, table)


def test_every_layer_charges_the_one_ledger_and_states_one_guarantee(world) -> None:
    ledger: PrivacyLedger = world["ledger"]
    claims = set()
    for count, layer in enumerate(LAYERS, 1):
        got = release_on(world, layer)
        assert [rank for rank, _ in got.rows] == list(range(1, K + 1)), layer
        assert [item for _, item in got.rows] == world["top"], layer
        costs = ledger.releases(PRINCIPAL)
        assert len(costs) == count, layer  # one charge per call, in the one ledger
        assert costs[-1].epsilon == pytest.approx(EPSILON, rel=1e-9), layer
        assert costs[-1].delta == 0.0, layer
        claim, derivation = got.guarantee.split("\n", 1)
        claims.add(claim)
        assert "derived from Wu et al. 2023" in derivation, (layer, derivation)
    scale = K * 1 / EPSILON  # Fact 3.3: per-item Gumbel scale k * sensitivity / epsilon
    assert claims == {
        f"Guarantee: ({EPSILON:g}, 0)-DP for add/remove-one-client neighbours, gumbel noise of "
        f"per-item scale {scale:g}; assumes each client changes each count by at most 1"
    }


def _core_words(k: Any, epsilon: Any) -> str:
    with pytest.raises((TypeError, ValueError)) as caught:
        check_common(k, epsilon, 0.0)
    return str(caught.value)


@pytest.mark.parametrize(
    ("k", "epsilon"), [(0, 1.0), (2.5, 1.0), (3, float("nan")), (3, "abc"), (3, -1.0)]
)
def test_every_layer_refuses_bad_input_in_the_core_words_and_charges_nothing(
    world, k: Any, epsilon: Any
) -> None:
    expected = _core_words(k, epsilon)
    for layer in LAYERS:
        with pytest.raises(Exception) as caught:
            release_on(world, layer, k=k, epsilon=epsilon)
        text = str(caught.value)
        assert expected in text, (layer, text)
        assert not [w for w in ENGINE_WORDS if w in text], (layer, text)
        if layer == "duckdb_sql":  # DuckDB's prefix, then the project's refusal
            assert "PrivateTopKRefused: " + expected in text, text
    assert world["ledger"].releases(PRINCIPAL) == []


@pytest.mark.parametrize(
    ("column", "words"),
    [({"id": "nope"}, "no column 'nope'"), ({"score": "label"}, "must be")],
    ids=["missing-column", "text-score"],
)
def test_the_layers_that_take_columns_refuse_a_wrong_one_in_words(
    world, column: dict[str, str], words: str
) -> None:
    """DuckDB SQL takes no column from the analyst (the owner registers the table)."""
    for layer in ("polars", "ibis", "dbt"):
        with pytest.raises((TypeError, ValueError)) as caught:
            release_on(world, layer, **column)
        text = str(caught.value)
        assert words in text and "'" + next(iter(column.values())) + "'" in text, (layer, text)
        assert not [w for w in ENGINE_WORDS if w in text], (layer, text)
    assert world["ledger"].releases(PRINCIPAL) == []


ANALYST_NEVER = {"accesses", "diagnostics", "plan", "scores", "counts_true", "rows_fetched"}


def _no_operator_fields(release: Release) -> None:
    fields = {f.name for f in dataclasses.fields(release)}
    assert not fields & ANALYST_NEVER, fields
    assert release.counts is None  # no counts unless asked for, and then noised


def test_no_layer_hands_the_analyst_counts_or_diagnostics(world) -> None:
    shown: dict[str, Any] = {layer: release_on(world, layer).shown for layer in LAYERS}
    assert shown["duckdb_sql"] == ["rank", "item"]  # the columns of the SQL function
    listing = "SELECT DISTINCT function_name FROM duckdb_functions()"
    fresh = duckdb.connect()
    builtin = {name for (name,) in fresh.execute(listing).fetchall()}
    fresh.close()
    names = {name for (name,) in world["con"].execute(listing).fetchall()} - builtin
    # what SQL reaches: the release, its guarantee, and the scalar the macro unnests
    assert names == {"private_top_k", "private_top_k_guarantee", "__topk_release"}, names
    polars_release = shown["polars"]
    assert polars_release.frame.columns == ["rank", "item"]
    assert {f.name for f in dataclasses.fields(polars_release)} == {"frame", "release"}
    _no_operator_fields(polars_release.release)
    _no_operator_fields(shown["ibis"])
    dbt_table = shown["dbt"]
    assert dbt_table.column_names == ["rank", "item", "guarantee"]
    assert not dbt_table.schema.metadata
    texts: list[Callable[[], str]] = [
        lambda: release_on(world, "duckdb_sql").guarantee,
        lambda: polars_release.guarantee_text,
    ]
    for text in texts:
        assert not [w for w in ("accesses", "rows fetched", "round trip", "plan") if w in text()]


def test_sql_arguments_of_any_type_reach_the_project_checks(world) -> None:
    """A number given as text, a decimal or a NULL: DuckDB's binder never answers for the
    function, whose argument types are the project's to check."""
    con = world["con"]
    cases = {
        "'3'": "k must be an integer, got '3'",
        "NULL": "k must not be NULL",
        "3.0": "k must be an integer, got 3.0",
        "[1, 2]": "k must be an integer, got '[1, 2]'",
    }
    for k, words in cases.items():
        with pytest.raises(duckdb.InvalidInputException, match="PrivateTopKRefused") as caught:
            con.execute(f"SELECT * FROM private_top_k('votes', {k}, 1.0)").fetchall()
        assert words in str(caught.value), str(caught.value)
    uint = con.execute("SELECT * FROM private_top_k('votes', 3::UTINYINT, 1::INTEGER)").fetchall()
    assert [rank for rank, _ in uint] == [1, 2, 3]
    assert len(world["ledger"].releases(PRINCIPAL)) == 1
