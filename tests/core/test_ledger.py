"""PrivacyLedger: durable per-principal budgets on PostgreSQL, SQLite and DuckDB (real stores).

What would fail: a charge that is not one locked transaction lets concurrent threads or processes
overspend (more successful releases than a sequential PrivacyBudget allows); a charge committed
after the release (or not at all) is lost when the process is killed."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from adapters.ledger import CHARGES, PRINCIPALS
from adapters.memory import ArraySource
from frontends.cli import main as cli_main
from tests.stores_sqlalchemy import postgres_url_and_args
from topk_middleware import (
    BudgetExceeded,
    PrivacyBudget,
    PrivacyLedger,
    exponential_mechanism,
    joint_top_k,
    private_top_k,
    stable_top_k,
)
from topk_middleware.accounting import PrivacyCost, oneshot_cost, rdp_to_dp_epsilon
from topk_middleware.ledger import UnknownRecipe, cost_from_json, cost_to_json
from topk_middleware.mechanisms.stable import stable_cost
from topk_middleware.release_keys import ReleaseKeyConflict

SCORES = np.array([50, 40, 30, 20, 10, 5, 3, 2, 1, 0], dtype=float)
COST = oneshot_cost("gumbel", 1, len(SCORES), 0.1, 0.0)  # what exponential_mechanism(0.1) costs


@pytest.fixture(scope="session")
def postgres_url(pg_schema: str) -> str:
    """The server at TOPK_PG_DSN, its ledger tables in the test run's schema (search_path):
    parallel workers and other runs never share them, and they go with the schema."""
    _, params = postgres_url_and_args()
    url = sa.URL.create(
        "postgresql+psycopg",
        username=params.get("user", os.environ.get("USER", "root")),
        host=params.get("host"),
        port=int(params.get("port", 5432)),
        database=params.get("dbname"),
        query={"options": f"-csearch_path={pg_schema}"},
    )
    return url.render_as_string(hide_password=False)


@pytest.fixture(params=["sqlite", "duckdb", "postgres"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
    elif request.param == "duckdb":
        yield f"duckdb:///{tmp_path / 'ledger.duckdb'}"
    else:
        yield request.getfixturevalue("postgres_url")


def fresh_principal() -> str:
    return f"analyst-{uuid.uuid4().hex[:12]}"


def sequential_allowance(epsilon: float, delta: float, cost: PrivacyCost) -> int:
    """How many releases of `cost` an in-memory PrivacyBudget admits one after another."""
    budget, n = PrivacyBudget(epsilon, delta), 0
    while True:
        try:
            budget.charge(cost)
        except BudgetExceeded:
            return n
        n += 1


def test_schema_is_the_documented_one(ledger_url: str) -> None:
    ledger = PrivacyLedger(ledger_url)
    with ledger.store.engine.connect() as conn:
        columns = set(conn.exec_driver_sql(f"SELECT * FROM {CHARGES} WHERE 1 = 0").keys())
        principals = set(conn.exec_driver_sql(f"SELECT * FROM {PRINCIPALS} WHERE 1 = 0").keys())
    assert principals == {"principal", "epsilon", "delta", "charges"}
    assert columns == {
        "principal", "seq", "charged_at", "mechanism", "cost", "epsilon_after", "delta_after",
        "rule", "released_at", "guarantee", "source", "diagnostics",
    }  # fmt: skip


@pytest.mark.parametrize("delta", [0.0, 1e-6])
def test_sixteen_threads_never_exceed_the_total(ledger_url: str, delta: float) -> None:
    """16 threads, each trying 4 releases on one principal: exactly as many succeed as a
    sequential budget admits, and the composed spend stays within the total."""
    ledger = PrivacyLedger(ledger_url)
    principal = fresh_principal()
    budget = ledger.budget(principal, 1.0, delta)
    expected = sequential_allowance(1.0, delta, COST)
    source = ArraySource(SCORES)
    done: list[int] = []

    def analyst() -> None:
        for _ in range(4):
            try:
                exponential_mechanism(source, 0.1, budget=budget)
                done.append(1)
            except BudgetExceeded:
                pass

    threads = [threading.Thread(target=analyst) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(done) == expected < 64
    assert len(budget.releases) == expected
    assert ledger.spent(principal).epsilon <= 1.0 * (1 + 1e-12)
    log = ledger.log(principal)
    assert [r["seq"] for r in log] == list(range(1, expected + 1))
    assert all(r["released_at"] is not None and '"accesses"' in r["diagnostics"] for r in log)


def test_a_ledger_closes_the_connections_of_its_engine(ledger_url: str) -> None:
    """A ledger made from a URL owns its engine: its pooled connections are closed by close()
    and when the ledger is garbage collected (psycopg and sqlite3 warn of a connection dropped
    open; a test that ran after it would see that warning, e.g. in the CLI's stderr)."""
    import gc
    import warnings

    for close in (True, False):
        gc.collect()  # what earlier tests on this worker dropped is collected outside the record
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always", ResourceWarning)
            ledger = PrivacyLedger(ledger_url)
            exponential_mechanism(
                ArraySource(SCORES), 0.1, budget=ledger.budget(fresh_principal(), 1.0, 0.0)
            )
            if close:
                ledger.close()
            del ledger
            gc.collect()
        dropped = [w for w in seen if issubclass(w.category, ResourceWarning)]
        assert dropped == [], [str(w.message) for w in dropped]


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from topk_middleware import BudgetExceeded, PrivacyLedger
    from topk_middleware.accounting import oneshot_cost
    url, principal, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    budget = PrivacyLedger(url).budget(principal, 1.0, 1e-6)
    cost = oneshot_cost("gumbel", 1, 10, 0.1, 0.0)
    if mode == "kill":
        budget.charge(cost)
        print("charged", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    ok = 0
    for _ in range(20):
        try:
            budget.charge(cost)
            ok += 1
        except BudgetExceeded:
            pass
    print(ok, flush=True)
    """
)


def run_child(url: str, principal: str, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, url, principal, mode],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_four_processes_never_exceed_the_total(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """4 processes charging one principal concurrently: the exact sequential allowance in all.
    (DuckDB admits one writing process per file; its ledger is shared by threads.)"""
    if backend == "postgres":
        url = request.getfixturevalue("postgres_url")
    else:
        url = f"sqlite:///{tmp_path / 'l.db'}"
    principal = fresh_principal()
    PrivacyLedger(url).budget(principal, 1.0, 1e-6)
    children = [run_child(url, principal, "race") for _ in range(4)]
    counts = [int(c.communicate(timeout=120)[0].split()[-1]) for c in children]
    assert sum(counts) == sequential_allowance(1.0, 1e-6, COST)
    assert PrivacyLedger(url).spent(principal).epsilon <= 1.0 * (1 + 1e-12)


@pytest.mark.parametrize("backend", ["sqlite", "duckdb", "postgres"])
def test_kill_after_charge_leaves_it_charged(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """kill -9 right after a charge: a restarted ledger sees the spend."""
    if backend == "postgres":
        url = request.getfixturevalue("postgres_url")
    else:
        url = {
            "sqlite": f"sqlite:///{tmp_path / 'l.db'}",
            "duckdb": f"duckdb:///{tmp_path / 'l.duckdb'}",
        }[backend]
    principal = fresh_principal()
    child = run_child(url, principal, "kill")
    out, _ = child.communicate(timeout=120)
    assert out.strip() == "charged" and child.returncode == -signal.SIGKILL
    restarted = PrivacyLedger(url)
    assert restarted.spent(principal).epsilon == pytest.approx(0.1)
    (row,) = restarted.log(principal)
    assert row["released_at"] is None  # charged, never released


def test_every_mechanism_charges_the_ledger(tmp_path: Path) -> None:
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    principal = fresh_principal()
    budget = ledger.budget(principal, 10.0, 1e-5)
    source = ArraySource(SCORES)
    private_top_k(source, 2, 1.0, budget=budget)
    joint_top_k(source, 2, 1.0, budget=budget)
    stable_top_k(source, 0.05, 1e-6, k=2, budget=budget)  # an RDP cost: stored by its recipe
    spent = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}").spent(principal)
    memory = PrivacyBudget(10.0, 1e-5)
    for cost in budget.releases:
        memory.charge(cost)
    assert spent == memory.spent()
    assert [r["mechanism"] for r in ledger.log(principal)] == [
        "gumbel top-2",
        "joint",
        "stable_top_k_target",
    ]


def test_totals_are_fixed_and_refusals_charge_nothing(tmp_path: Path) -> None:
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    principal = fresh_principal()
    budget = ledger.budget(principal, 0.5)
    with pytest.raises(ValueError, match="has the total"):
        ledger.budget(principal, 5.0)  # an analyst cannot raise their own total
    with pytest.raises(BudgetExceeded):
        private_top_k(ArraySource(SCORES), 1, 1.0, budget=budget)
    with pytest.raises(ValueError, match="floor"):
        private_top_k(ArraySource(SCORES), 1, 1e-310, budget=budget)
    assert ledger.log(principal) == []


def test_releases_export_as_dp_events(tmp_path: Path) -> None:
    """Gumbel releases export as zCDP events (rho = eps^2/8 each); dp_accounting's RDP accountant
    composes them to what our zCDP conversion gives, never below the ledger's best rule."""
    from dp_accounting.rdp import RdpAccountant

    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    principal = fresh_principal()
    budget = ledger.budget(principal, 5.0, 1e-6)
    for _ in range(5):
        exponential_mechanism(ArraySource(SCORES), 0.5, budget=budget)
    event = ledger.dp_events(principal)
    accountant = RdpAccountant()
    accountant.compose(event)
    theirs = accountant.get_epsilon(1e-6)
    ours, _ = rdp_to_dp_epsilon(lambda alpha: alpha * 5 * 0.5**2 / 8, 1e-6)
    assert theirs == pytest.approx(ours, rel=1e-3)
    assert ledger.spent(principal).epsilon <= theirs


def plant(ledger: PrivacyLedger, principal: str, recipe: Any) -> None:
    """Write a charge row as someone with write access to the ledger would: a recipe of theirs."""
    row = {"mechanism": "planted", "recipe": recipe}
    with ledger.store.engine.begin() as conn:
        conn.execute(
            ledger.store.charges.insert().values(
                principal=principal,
                seq=99,
                charged_at=dt.datetime(2026, 1, 1),
                mechanism="planted",
                cost=json.dumps(row),
                epsilon_after=0.0,
                delta_after=0.0,
                rule="basic",
            )
        )


@pytest.mark.parametrize(
    "recipe",
    [
        ["os:system", [["command", "touch {marker}"]]],
        ["subprocess:getoutput", [["cmd", "touch {marker}"]]],
        ["topk_middleware.mechanisms.stable:stable_cost", [["rho", "__import__('os')"]]],
        ["topk_middleware.mechanisms.stable:stable_cost", [["command", "touch {marker}"]]],
        "not a pair",
    ],
)
def test_a_planted_recipe_is_refused_and_never_run(
    ledger_url: str, tmp_path: Path, recipe: Any
) -> None:
    """A charge naming a function outside the project's registry (ledger.RECIPES) is refused on
    the next charge and on `spent`, and nothing it names runs (the marker file never appears)."""
    marker = tmp_path / f"ran-{uuid.uuid4().hex}"
    planted = json.loads(json.dumps(recipe).replace("{marker}", str(marker)))
    ledger = PrivacyLedger(ledger_url)
    principal = fresh_principal()
    budget = ledger.budget(principal, 10.0)
    plant(ledger, principal, planted)
    with pytest.raises(UnknownRecipe, match="not run"):
        exponential_mechanism(ArraySource(SCORES), 0.1, budget=budget)
    with pytest.raises(UnknownRecipe, match="not run"):
        ledger.spent(principal)
    assert not marker.exists()
    assert [r["mechanism"] for r in ledger.log(principal)] == ["planted"]  # nothing charged


def test_the_registry_rebuilds_the_project_recipe(tmp_path: Path) -> None:
    cost = stable_cost(0.05, 1e-7, "gaussian", True)
    again = cost_from_json(cost_to_json(cost))
    assert (again.mechanism, again.delta, again.rho) == (cost.mechanism, cost.delta, cost.rho)
    assert again.rdp is not None and cost.rdp is not None
    assert again.rdp(4.0) == cost.rdp(4.0)


@pytest.mark.parametrize("kind", ["sqlite", "duckdb"])
def test_ledger_files_are_created_owner_only(kind: str, tmp_path: Path) -> None:
    """A new SQLite / DuckDB ledger file (and a DuckDB write-ahead log) is mode 0600 whatever the
    umask; the CLI's `budget --grant` creates its ledger the same way."""
    name = tmp_path / f"ledger.{kind}"
    old = os.umask(0o022)
    try:
        ledger = PrivacyLedger(f"{kind}:///{name}")
        budget = ledger.budget(fresh_principal(), 5.0)
        exponential_mechanism(ArraySource(SCORES), 0.1, budget=budget)
        cli_file = tmp_path / f"cli.{kind}"
        url = str(cli_file) if kind == "duckdb" else f"sqlite:///{cli_file}"
        code = cli_main(["budget", "--ledger", url, "--principal", "a", "--grant", "1"])
    finally:
        os.umask(old)
    assert code == 0
    made = [p for p in tmp_path.iterdir() if p.is_file()]
    assert {name, cli_file} <= set(made)
    for path in made:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    if kind == "sqlite":  # write-ahead-log mode: its log is among the files checked
        assert any(p.name == "ledger.sqlite-wal" for p in made)


def test_a_used_up_ledger_budget_refuses_the_smallest_release(ledger_url: str) -> None:
    """Spent to its total, a principal's next release at epsilon 1e-17 (which would not move the
    float sum) is refused and not recorded, on every ledger."""
    ledger = PrivacyLedger(ledger_url)
    principal = fresh_principal()
    budget = ledger.budget(principal, 0.5)
    exponential_mechanism(ArraySource(SCORES), 0.5, budget=budget)
    for _ in range(2):
        with pytest.raises(BudgetExceeded, match="used up"):
            exponential_mechanism(ArraySource(SCORES), 1e-17, budget=budget)
    assert len(ledger.log(principal)) == 1


def test_a_charge_and_a_read_send_few_statements(ledger_url: str) -> None:
    """What a charge costs in statements, counted as the driver receives them: on PostgreSQL
    the lock, one read of the keys and costs and one write (count, keys, charges), inside BEGIN
    and COMMIT; SQLite and DuckDB one read of the row and keys, one of the costs and the writes
    one by one. A read of the keys is one statement (on SQLite without BEGIN IMMEDIATE)."""
    ledger = PrivacyLedger(ledger_url)
    principal = fresh_principal()
    ledger.budget(principal, 1.0)
    engine = ledger.store.engine
    sent: list[str] = []

    def counted(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    cost = PrivacyCost(mechanism="test", epsilon=0.1)
    sa.event.listen(engine, "before_cursor_execute", counted)
    try:
        ledger.charge_keyed(
            principal, [("a", "f", cost), ("b", "f", cost)], claims=[("s", "f", "n", "{}")]
        )
        charged = [s for s in sent if not s.startswith("BEGIN")]
        sent.clear()
        assert ledger.lookup_releases(principal, ["a", "s"]).keys() == {"a", "s"}
    finally:
        sa.event.remove(engine, "before_cursor_execute", counted)
    assert len(charged) == (3 if ledger.store.dialect == "postgresql" else 5), charged
    assert len(sent) == 1 and sent[0].lstrip().startswith("SELECT"), sent
    assert ledger.spent(principal).epsilon == pytest.approx(0.2)
    assert [r["seq"] for r in ledger.log(principal)] == [1, 2]
    # claimed keys numbered in one update: a reclaim takes the charge's fingerprint and noise
    # key, a key charged under its own fingerprint keeps the noise key it was claimed with
    ledger.store.claim_key(principal, "c", "old", "n-old")
    ledger.store.claim_key(principal, "d", "f", "n-d")
    assert ledger.charge_keyed(principal, [("c", "new", cost)]).seqs == [3]
    assert ledger.charge(principal, cost, "d", "f")[0] == 4
    found = ledger.lookup_releases(principal, ["c", "d"])
    assert (found["c"].fingerprint, found["c"].charged, found["c"].noise_key) == ("new", True, "")
    assert (found["d"].fingerprint, found["d"].charged, found["d"].noise_key) == ("f", True, "n-d")
    ledger.close()


def test_costs_charged_together_are_all_or_nothing(ledger_url: str) -> None:
    """PrivacyLedger.charge_keyed (a trending stream's selection and its gate): both charged in
    one transaction with their keys claimed (and a claim made with them: the stream's secret,
    kept by the first), nothing more for keys already charged, neither (nor their keys) past
    the total, another fingerprint refused; `unless_stored` and store_keyed's
    `unless_charged` make a charge and an answer exclude each other."""
    ledger = PrivacyLedger(ledger_url)
    principal = fresh_principal()
    ledger.budget(principal, 1.0)

    def cost(epsilon: float) -> PrivacyCost:
        return PrivacyCost(mechanism="test", epsilon=epsilon)

    pair = [("a", "f", cost(0.4)), ("b", "f", cost(0.4))]
    first = ledger.charge_keyed(principal, pair, claims=[("s", "f", "secret", "{}")])
    assert first.seqs == [1, 2] and first.after.epsilon == pytest.approx(0.8)
    assert first.noise_keys == {"s": "secret"}
    again = ledger.charge_keyed(principal, pair, claims=[("s", "f", "other", "{}")])
    assert (again.seqs, again.after, again.noise_keys) == ([1, 2], None, {"s": "secret"})
    with pytest.raises(BudgetExceeded):
        ledger.charge_keyed(principal, [("c", "f", cost(0.1)), ("d", "f", cost(0.15))])
    assert len(ledger.log(principal)) == 2
    assert ledger.lookup_releases(principal, ["c", "d"]) == {}
    with pytest.raises(ReleaseKeyConflict):
        ledger.charge_keyed(principal, [("a", "g", cost(0.1))])
    assert ledger.store_keyed(principal, "t", "f", "{}") == "{}"
    answered = ledger.charge_keyed(principal, [("e", "f", cost(0.1))], unless_stored="t")
    assert (answered.seqs, answered.stored) == ([], "{}")
    assert ledger.store_keyed(principal, "u", "f", "x", unless_charged="a") is None
    assert ledger.store_keyed(principal, "u", "f", "x") == "x"
    assert ledger.store_keyed(principal, "u", "f", "y") == "x"  # the first answer stays
    with pytest.raises(ReleaseKeyConflict):
        ledger.store_keyed(principal, "u", "g", "z")
    assert len(ledger.log(principal)) == 2
    assert ledger.spent(principal).epsilon == pytest.approx(0.8)
