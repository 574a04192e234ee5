"""Idempotent releases (release_keys.py, DESIGN invariant 16) on the real ledgers: PostgreSQL,
SQLite and DuckDB.

What would fail: a retry that charges again (two charge rows for one key), a retry that answers
with fresh noise (a second, different list for one key), a key reused with other parameters
that is not refused (or is refused after a charge), keys shared between principals, and, under
concurrency, two workers racing on one key that both pay or answer differently. A process killed
between the charge and the answer must leave the key charged once, and its retry must answer
without paying again."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from adapters.ledger import KEYS
from adapters.memory import ArraySource
from frontends.cli import main as cli_main
from tests.core.test_ledger import ledger_url, postgres_url  # noqa: F401  (fixtures)
from topk_middleware import (
    PrivacyBudget,
    PrivacyLedger,
    ReleaseKeyConflict,
    exponential_mechanism,
    joint_top_k,
    limited_domain_top_k,
    peeling_top_k,
    private_top_k,
    stable_top_k,
)

ROOT = Path(__file__).resolve().parents[2]
# 200 items, nearly tied at the top: two independent releases of k = 5 at epsilon = 0.5 differ
# with probability close to 1 (so an answer drawn twice would show)
SCORES = np.concatenate([np.full(20, 200.0), np.arange(180, dtype=float)])


def fresh_principal() -> str:
    return f"analyst-{uuid.uuid4().hex[:12]}"


def test_a_retry_returns_the_stored_release_and_charges_nothing(ledger_url: str) -> None:  # noqa: F811
    ledger = PrivacyLedger(ledger_url)
    principal = fresh_principal()
    budget = ledger.budget(principal, 2.0)
    source = ArraySource(SCORES)
    first = private_top_k(source, 5, 0.5, budget=budget, release_key="daily-2026-12-04")
    again = [
        private_top_k(source, 5, 0.5, budget=budget, release_key="daily-2026-12-04")
        for _ in range(3)
    ]
    assert all(r.items == first.items and r.privacy == first.privacy for r in again)
    assert all(r.plan == {"stored_release": True} for r in again)
    assert len(ledger.log(principal)) == 1
    assert ledger.spent(principal).epsilon == pytest.approx(0.5)
    # other keys are other releases: fresh noise, charged each
    others = [private_top_k(source, 5, 0.5, budget=budget, release_key=f"k{i}") for i in range(3)]
    assert len(ledger.log(principal)) == 4
    assert len({tuple(r.items) for r in [first, *others]}) > 1
    # a restarted ledger (another process would open it so) replays the same release
    reopened = PrivacyLedger(ledger_url).budget(principal, 2.0)
    replay = private_top_k(ArraySource(SCORES), 5, 0.5, budget=reopened, release_key="k0")
    assert replay.items == others[0].items and len(ledger.log(principal)) == 4


def test_the_same_key_with_other_parameters_is_refused_before_any_charge(
    ledger_url: str,  # noqa: F811
) -> None:
    ledger = PrivacyLedger(ledger_url)
    principal = fresh_principal()
    budget = ledger.budget(principal, 5.0)
    source = ArraySource(SCORES)
    private_top_k(source, 5, 0.5, budget=budget, release_key="q")
    for changed in ({"k": 6}, {"epsilon": 0.6}, {"noise": "laplace"}, {"with_counts": True}):
        options = {"k": 5, "epsilon": 0.5, **changed}
        with pytest.raises(ReleaseKeyConflict, match="other parameters"):
            private_top_k(source, budget=budget, release_key="q", **options)
    assert len(ledger.log(principal)) == 1


def test_keys_are_per_principal(tmp_path: Path) -> None:
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    alice, bob = fresh_principal(), fresh_principal()
    a, b = ledger.budget(alice, 1.0), ledger.budget(bob, 1.0)
    source = ArraySource(SCORES)
    private_top_k(source, 5, 0.5, budget=a, release_key="shared-name")
    private_top_k(source, 5, 0.5, budget=b, release_key="shared-name")
    assert len(ledger.log(alice)) == len(ledger.log(bob)) == 1
    with ledger.store.engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT principal, seq FROM {KEYS}")).all()
    assert sorted(rows) == sorted([(alice, 1), (bob, 1)])


def test_bad_keys_and_budgets_are_refused_before_anything_is_read(tmp_path: Path) -> None:
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    principal = fresh_principal()
    budget = ledger.budget(principal, 1.0)
    source = ArraySource(SCORES)
    with pytest.raises(TypeError, match="PrivacyLedger's budget"):
        private_top_k(source, 5, 0.5, budget=PrivacyBudget(1.0), release_key="x")
    with pytest.raises(TypeError, match="PrivacyLedger's budget"):
        private_top_k(source, 5, 0.5, release_key="x")
    with pytest.raises(ValueError, match="seed=None"):
        private_top_k(source, 5, 0.5, budget=budget, release_key="x", seed=3)
    for bad in ("", 7, "a" * 201, "tab\there"):
        with pytest.raises((TypeError, ValueError), match="release_key must be"):
            private_top_k(source, 5, 0.5, budget=budget, release_key=bad)
    with ledger.store.engine.connect() as conn:
        assert conn.execute(sa.text(f"SELECT count(*) FROM {KEYS}")).scalar_one() == 0
    with pytest.raises(ValueError, match="k must"):
        private_top_k(source, 0, 0.5, budget=budget, release_key="x")
    assert ledger.log(principal) == []
    # the refused call charged nothing, so the key takes the corrected parameters
    fixed = private_top_k(source, 5, 0.5, budget=budget, release_key="x")
    assert len(fixed.items) == 5 and len(ledger.log(principal)) == 1
    with pytest.raises(ReleaseKeyConflict):
        private_top_k(source, 6, 0.5, budget=budget, release_key="x")


@pytest.mark.parametrize(
    "release",
    [
        lambda s, **kw: exponential_mechanism(s, 0.5, **kw),
        lambda s, **kw: peeling_top_k(s, 3, 0.5, **kw),
        lambda s, **kw: joint_top_k(s, 3, 0.5, **kw),
        lambda s, **kw: limited_domain_top_k(s, 3, 25, 1.0, 1e-4, **kw),
        lambda s, **kw: stable_top_k(s, 0.5, 1e-6, k=3, **kw),
    ],
    ids=["exponential", "peeling", "joint", "limited_domain", "stable"],
)
def test_every_release_function_takes_a_key(release: Any, tmp_path: Path) -> None:
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    principal = fresh_principal()
    budget = ledger.budget(principal, 20.0, 1e-2)
    source = ArraySource(SCORES)
    first = release(source, budget=budget, release_key="one")
    again = release(source, budget=budget, release_key="one")
    assert again.items == first.items and type(again) is type(first)
    assert again.plan == {"stored_release": True}
    assert getattr(again, "bottom", False) == getattr(first, "bottom", False)
    assert len(ledger.log(principal)) == 1
    fresh = [release(source, budget=budget, release_key=f"other-{i}") for i in range(4)]
    assert len(ledger.log(principal)) == 5
    assert len({tuple(r.items) for r in [first, *fresh]}) > 1  # other keys: fresh noise


def test_the_noise_key_and_release_never_reach_the_statement_text(tmp_path: Path) -> None:
    """The key's noise secret travels as a bound parameter, never inside SQL text."""
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    statements: list[str] = []
    sa.event.listen(
        ledger.store.engine,
        "before_cursor_execute",
        lambda conn, cursor, statement, *rest: statements.append(statement),
    )
    budget = ledger.budget(fresh_principal(), 1.0)
    private_top_k(ArraySource(SCORES), 5, 0.5, budget=budget, release_key="secret-free")
    with ledger.store.engine.connect() as conn:
        noise_key = conn.execute(sa.text(f"SELECT noise_key FROM {KEYS}")).scalar_one()
    assert len(noise_key) == 64 and all(noise_key not in s for s in statements)
    assert not any("secret-free" in s for s in statements)


RACER = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    from adapters.memory import ArraySource
    from topk_middleware import PrivacyLedger, private_top_k
    url, principal, start, keys = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    scores = np.concatenate([np.full(20, 200.0), np.arange(180, dtype=float)])
    budget = PrivacyLedger(url).budget(principal, 100.0)
    source = ArraySource(scores)
    time.sleep(max(0.0, start - time.time()))  # both racers start together
    out = {}
    for i in range(keys):
        out[i] = private_top_k(source, 5, 0.5, budget=budget, release_key=f"race-{i}").items
    print(json.dumps(out), flush=True)
    """
)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_two_processes_racing_on_each_key_pay_once_and_answer_once(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two processes release the same 10 keys at the same moment: 10 charges (not 20) and, for
    every key, the same list in both. Cost: two interpreters, about 3 s."""
    import time

    url = (
        request.getfixturevalue("postgres_url")
        if backend == "postgres"
        else f"sqlite:///{tmp_path / 'l.db'}"
    )
    principal = fresh_principal()
    ledger = PrivacyLedger(url)
    ledger.budget(principal, 100.0)
    start = time.time() + 4.0  # after both interpreters have imported everything
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, url, principal, str(start), "10"],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for _ in range(2)
    ]
    answers = [json.loads(r.communicate(timeout=120)[0]) for r in racers]
    assert all(r.returncode == 0 for r in racers)
    assert answers[0] == answers[1]
    assert len(ledger.log(principal)) == 10
    assert ledger.spent(principal).epsilon == pytest.approx(5.0)


KILLED = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    from adapters.memory import ArraySource
    from topk_middleware import PrivacyLedger, private_top_k
    url, principal, where = sys.argv[1], sys.argv[2], sys.argv[3]
    scores = np.concatenate([np.full(20, 200.0), np.arange(180, dtype=float)])
    ledger = PrivacyLedger(url)
    budget = ledger.budget(principal, 1.0)

    source = ArraySource(scores)
    if where == "before_answer":  # the first read comes after the charge
        source.read_sorted = lambda start, count: os.kill(os.getpid(), signal.SIGKILL)
    else:  # after the release is stored, before it is returned
        store = ledger.store_release
        def store_then_die(*args):
            store(*args)
            os.kill(os.getpid(), signal.SIGKILL)
        ledger.store_release = store_then_die
    private_top_k(source, 5, 0.5, method="threshold", budget=budget, release_key="nightly")
    """
)


@pytest.mark.parametrize("where", ["before_answer", "after_store"])
@pytest.mark.parametrize("backend", ["sqlite", "duckdb", "postgres"])
def test_a_kill_between_charge_and_answer_neither_loses_nor_double_charges(
    where: str, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """kill -9 after the charge (before any read, or after the release is stored): the key is
    charged once, and retries answer one list without a second charge."""
    url = {
        "sqlite": f"sqlite:///{tmp_path / 'l.db'}",
        "duckdb": f"duckdb:///{tmp_path / 'l.duckdb'}",
        "postgres": request.getfixturevalue("postgres_url") if backend == "postgres" else "",
    }[backend]
    principal = fresh_principal()
    child = subprocess.run(
        [sys.executable, "-c", KILLED, url, principal, where], cwd=ROOT, timeout=120
    )
    assert child.returncode == -signal.SIGKILL
    ledger = PrivacyLedger(url)
    assert len(ledger.log(principal)) == 1  # charged before it died
    budget = ledger.budget(principal, 1.0)
    retries = [
        private_top_k(ArraySource(SCORES), 5, 0.5, method="threshold", budget=budget,
                      release_key="nightly")
        for _ in range(3)
    ]  # fmt: skip
    assert len({tuple(r.items) for r in retries}) == 1
    assert len(ledger.log(principal)) == 1
    assert ledger.spent(principal).epsilon == pytest.approx(0.5)
    stored = [r.plan == {"stored_release": True} for r in retries]
    # died after storing: every retry returns the child's release; died before any read: the
    # first retry computes it (with the key's noise, unpaid) and the others return it
    assert stored == ([True] * 3 if where == "after_store" else [False, True, True])


def test_cli_key_prints_the_stored_release_and_charges_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import duckdb

    db = tmp_path / "votes.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE votes(id INTEGER, score DOUBLE)")
        con.executemany("INSERT INTO votes VALUES (?, ?)", list(enumerate(SCORES.tolist())))
    assert cli_main(["prepare", str(db), "--table", "votes"]) == 0
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    principal = fresh_principal()
    assert cli_main(["budget", "--ledger", url, "--principal", principal,
                     "--grant", "1.0"]) == 0  # fmt: skip
    run = ["release", str(db), "--table", "votes", "--k", "5", "--epsilon", "0.5", "--json",
           "--ledger", url, "--principal", principal, "--key", "hourly-18",
           "--adaptive"]  # fmt: skip
    capsys.readouterr()
    outputs = []
    for _ in range(2):
        assert cli_main(run) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[0] == outputs[1]
    assert len(PrivacyLedger(url).log(principal)) == 1
    assert cli_main([*run[:7], "0.7", *run[8:]]) == 2
    err = capsys.readouterr().err
    assert "other parameters" in err and "Traceback" not in err
    assert cli_main([*run[:9], "--key", "x", "--adaptive"]) == 2
    assert "--key needs --ledger" in capsys.readouterr().err
    assert len(PrivacyLedger(url).log(principal)) == 1
