"""PrivacyLedger: durable per-principal budgets on PostgreSQL, SQLite and DuckDB (real stores).

What would fail: a charge that is not one locked transaction lets concurrent threads or processes
overspend (more successful releases than a sequential PrivacyBudget allows); a charge committed
after the release (or not at all) is lost when the process is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from adapters.memory import ArraySource
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
from topk_middleware.ledger import CHARGES, PRINCIPALS

SCORES = np.array([50, 40, 30, 20, 10, 5, 3, 2, 1, 0], dtype=float)
COST = oneshot_cost("gumbel", 1, len(SCORES), 0.1, 0.0)  # what exponential_mechanism(0.1) costs


def postgres_url() -> str:
    _, params = postgres_url_and_args()
    return str(
        sa.URL.create(
            "postgresql+psycopg",
            username=params.get("user", os.environ.get("USER", "root")),
            host=params.get("host"),
            port=int(params.get("port", 5432)),
            database=params.get("dbname"),
        )
    )


@pytest.fixture(params=["sqlite", "duckdb", "postgres"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
    elif request.param == "duckdb":
        yield f"duckdb:///{tmp_path / 'ledger.duckdb'}"
    else:
        yield postgres_url()


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
    with ledger.engine.connect() as conn:
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
        cwd=Path(__file__).resolve().parents[1],
    )


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_four_processes_never_exceed_the_total(backend: str, tmp_path: Path) -> None:
    """4 processes charging one principal concurrently: the exact sequential allowance in all.
    (DuckDB admits one writing process per file; its ledger is shared by threads.)"""
    url = postgres_url() if backend == "postgres" else f"sqlite:///{tmp_path / 'l.db'}"
    principal = fresh_principal()
    PrivacyLedger(url).budget(principal, 1.0, 1e-6)
    children = [run_child(url, principal, "race") for _ in range(4)]
    counts = [int(c.communicate(timeout=120)[0].split()[-1]) for c in children]
    assert sum(counts) == sequential_allowance(1.0, 1e-6, COST)
    assert PrivacyLedger(url).spent(principal).epsilon <= 1.0 * (1 + 1e-12)


@pytest.mark.parametrize("backend", ["sqlite", "duckdb", "postgres"])
def test_kill_after_charge_leaves_it_charged(backend: str, tmp_path: Path) -> None:
    """kill -9 right after a charge: a restarted ledger sees the spend."""
    urls = {
        "sqlite": f"sqlite:///{tmp_path / 'l.db'}",
        "duckdb": f"duckdb:///{tmp_path / 'l.duckdb'}",
        "postgres": postgres_url(),
    }
    url, principal = urls[backend], fresh_principal()
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
