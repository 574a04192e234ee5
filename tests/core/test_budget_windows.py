"""Budget windows (ledger.py WINDOWS) on the real ledgers: PostgreSQL, SQLite and DuckDB.

What would fail: a window that starts anywhere but its calendar boundary (checked against
Python's own ISO calendar), charges of an earlier window still counted against the current
total (or charges of the current window forgotten), a grant whose window can be changed
afterwards, and a refusal that does not say which window is full."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from adapters.ledger import CHARGES
from adapters.memory import ArraySource
from frontends.cli import main as cli_main
from tests.core.test_ledger import ledger_url, postgres_url  # noqa: F401  (fixtures)
from topk_middleware import BudgetExceeded, PrivacyLedger, private_top_k
from topk_middleware.ledger import window_start

SCORES = np.arange(50, dtype=float)


def fresh_principal() -> str:
    return f"analyst-{uuid.uuid4().hex[:12]}"


@pytest.mark.parametrize(
    "now",
    [
        dt.datetime(2026, 12, 4, 18, 39, 45),
        dt.datetime(2026, 11, 30, 0, 0, 0),  # a Monday, at its first instant
        dt.datetime(2027, 1, 3, 23, 59, 59),  # a Sunday, across a year's end
        dt.datetime(2024, 2, 29, 12, 0, 0),
    ],
)
def test_windows_start_on_their_calendar_boundaries(now: dt.datetime) -> None:
    year, week, _ = now.isocalendar()
    monday = dt.datetime.combine(dt.date.fromisocalendar(year, week, 1), dt.time())
    assert window_start("week", now) == monday
    assert window_start("day", now) == dt.datetime.combine(now.date(), dt.time())
    assert window_start("hour", now) == now.replace(minute=0, second=0, microsecond=0)


def age_charges(ledger: PrivacyLedger, principal: str, by: dt.timedelta) -> None:
    """Move the principal's charges back in time (as if made in an earlier window)."""
    charges = sa.table(CHARGES, sa.column("principal"), sa.column("charged_at"))
    with ledger.store.engine.begin() as conn:
        rows = conn.execute(
            sa.select(sa.column("seq"), charges.c.charged_at)
            .select_from(charges)
            .where(charges.c.principal == principal)
        ).all()
        for seq, charged_at in rows:
            if isinstance(charged_at, str):
                charged_at = dt.datetime.fromisoformat(charged_at)
            conn.execute(
                sa.text(f"UPDATE {CHARGES} SET charged_at = :t WHERE principal = :p AND seq = :s"),
                {"t": charged_at - by, "p": principal, "s": seq},
            )


def test_a_window_counts_only_its_own_charges(ledger_url: str) -> None:  # noqa: F811
    ledger = PrivacyLedger(ledger_url)
    principal = fresh_principal()
    budget = ledger.budget(principal, 1.0, window="week")
    source = ArraySource(SCORES)
    for _ in range(2):
        private_top_k(source, 2, 0.5, budget=budget)
    with pytest.raises(BudgetExceeded, match="week window that began"):
        private_top_k(source, 2, 0.5, budget=budget)
    assert ledger.spent(principal).epsilon == pytest.approx(1.0)
    age_charges(ledger, principal, dt.timedelta(weeks=1))  # last week's releases
    assert ledger.spent(principal).epsilon == 0.0 and ledger.releases(principal) == []
    private_top_k(source, 2, 0.5, budget=budget)  # this week's total is whole again
    assert ledger.spent(principal).epsilon == pytest.approx(0.5)
    assert len(ledger.log(principal)) == 3  # the log keeps every window's charges
    # an all-time principal in the same ledger: aged charges still count
    forever = fresh_principal()
    other = ledger.budget(forever, 1.0)
    private_top_k(source, 2, 0.5, budget=other)
    age_charges(ledger, forever, dt.timedelta(weeks=1))
    assert ledger.spent(forever).epsilon == pytest.approx(0.5)


def test_the_window_is_fixed_at_the_grant(tmp_path: Path) -> None:
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    principal = fresh_principal()
    ledger.budget(principal, 1.0, window="day")
    with pytest.raises(ValueError, match="has the window 'day'"):
        ledger.budget(principal, 1.0, window="week")
    with pytest.raises(ValueError, match="has the window 'day'"):
        ledger.budget(principal, 1.0)
    with pytest.raises(ValueError, match="window must be None or one of"):
        ledger.budget(fresh_principal(), 1.0, window="fortnight")
    plain = fresh_principal()
    ledger.budget(plain, 1.0)
    with pytest.raises(ValueError, match="has the window None"):
        ledger.budget(plain, 1.0, window="hour")
    assert ledger.window(principal) == "day" and ledger.window(plain) is None


def test_cli_grants_and_shows_a_window(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    grant = ["budget", "--ledger", url, "--principal", "dashboard", "--grant", "1.0"]
    assert cli_main([*grant, "--window", "week", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    monday = window_start("week", dt.datetime.now(dt.UTC).replace(tzinfo=None))
    assert shown["window"] == "week" and shown["window_start"] == monday.isoformat() + "Z"
    assert cli_main(["budget", "--ledger", url, "--principal", "dashboard"]) == 0
    assert "per week" in capsys.readouterr().out
    assert cli_main(["budget", "--ledger", url, "--principal", "dashboard", "--window", "day"]) == 2
    assert "--window goes with --grant" in capsys.readouterr().err
    assert cli_main([*grant, "--window", "day"]) != 0
    assert "has the window 'week'" in capsys.readouterr().err
