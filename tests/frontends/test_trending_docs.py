"""docs/trending.md runs as written: its SQL, its shell commands (prepare, budget, trend, twice)
and its Python example, on a live PostgreSQL table of the test database.

What would fail: a command or an option the page shows that the CLI does not take, a trend run
that does not print a list and the stream's guarantee, a rerun in the same hour that answers
differently or charges again, and a Python example that does not run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.stores_postgres import pg_conninfo  # noqa: F401  (fixture)
from topk_middleware import PrivacyLedger

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "trending.md").read_text()
DOC_URL = "postgresql://127.0.0.1/shop"
DOC_DSN = "host=127.0.0.1 dbname=shop"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE, flags=re.S)


@pytest.fixture
def page_views(pg_conninfo: str) -> Iterator[str]:  # noqa: F811
    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS page_views CASCADE")
        for statement in blocks("sql")[0].split(";"):
            if statement.strip():
                conn.execute(statement)
    yield pg_conninfo
    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS page_views CASCADE")


def test_the_hourly_example_runs_as_written(page_views: str, tmp_path: Path) -> None:
    params = conninfo_to_dict(page_views)
    user = params.get("user") or os.environ.get("USER", "root")
    url = f"postgresql://{user}@{params['host']}:{params.get('port', 5432)}/{params['dbname']}"
    script = blocks("sh")[0].replace(DOC_URL, url)
    trend = script[script.index("topk-middleware trend") :]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    run = subprocess.run(
        ["bash", "-ec", script + "\n" + f"PG={url}\n" + trend],  # the hourly job, then its rerun
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    answers = re.findall(r"(tick \d+ of 24: .*?)\nGuarantee over the stream", run.stdout, re.S)
    assert len(answers) == 2 and answers[0] == answers[1]  # the rerun prints the stored answer
    assert "a fresh list" in answers[0] and len(answers[0].splitlines()) == 11
    assert "(1, 0)-DP over 24 ticks" in run.stdout
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'trending-ledger.sqlite'}")
    charges = ledger.log("dashboard")
    assert [c["mechanism"] for c in charges] == ["gumbel top-10", "trending gate"]
    # the Python example opens the same stream: the same tick, stored, nothing charged
    code = blocks("python")[-1].replace(DOC_DSN, page_views)
    python = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert python.returncode == 0, python.stderr
    tick, fresh = python.stdout.split()[:2]
    assert answers[0].startswith(f"tick {tick} of 24") and fresh == "True"
    assert len(ledger.log("dashboard")) == 2


def test_trend_refuses_bad_runs_in_words(
    page_views: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from frontends.cli import main

    ledger = f"sqlite:///{tmp_path / 'l.sqlite'}"
    assert main(["budget", "--ledger", ledger, "--principal", "p", "--grant", "1"]) == 0
    params = conninfo_to_dict(page_views)
    user = params.get("user") or os.environ.get("USER", "root")
    url = f"postgresql://{user}@{params['host']}:{params.get('port', 5432)}/{params['dbname']}"
    base = ["trend", url, "--table", "page_views", "--id", "page", "--score", "views", "--k", "5",
            "--epsilon", "1", "--horizon", "24", "--name", "s", "--ledger", ledger,
            "--principal", "p"]  # fmt: skip
    prepare = ["prepare", url, "--table", "page_views", "--id", "page", "--score", "views"]
    assert main([*prepare, "--mode", "live"]) == 0
    capsys.readouterr()
    for extra, message in (
        (["--mode", "live"], "give --tick, or --period and --start"),
        (["--tick", "3"], "add --mode live"),
        (["--mode", "live", "--tick", "25"], r"tick must be a whole number in [1, 24]"),
        (["--mode", "live", "--tick", "1", "--period", "1h", "--start", "2026-12-04"], "not both"),
    ):
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
    assert PrivacyLedger(ledger).log("p") == []
    assert main([*base, "--mode", "live", "--tick", "1", "--json"]) == 0
    assert '"fresh": true' in capsys.readouterr().out
