"""What a first command-line session meets: the oblivious default and a budget without delta,
the short guarantee line and --explain, DuckDB's --frozen and a `check` that tells the truth,
docs/cli.md's JSON example, and SQLAlchemyTable given a URL string.

On a DuckDB file and a SQLite file (m = 200, k = 3). The delta an oblivious release spends is
computed here independently: (1 + e^epsilon) * delta_pad with delta_pad = 1e-9
(mechanisms/oblivious.py, docs/oblivious.md). What would fail: the refusal `epsilon = inf`
without the delta to grant, the derivation printed by default or lost from --explain and
JSON, a `check` that promises the copy to runs that read the table, an example whose keys or
figures the code does not print.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import sqlalchemy as sa

from adapters.sqlalchemy import SQLAlchemyTable
from frontends.cli import EXIT_BUDGET, EXIT_OK
from tests.frontends.test_cli import run
from topk_middleware import private_top_k

ROOT = Path(__file__).resolve().parents[2]
ROWS = [(i, (37 * i) % 101 + 1000 * (i < 4)) for i in range(200)]  # items 0-3 far ahead


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "votes.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE item_votes (item BIGINT, votes BIGINT)")
        con.executemany("INSERT INTO item_votes VALUES (?, ?)", ROWS)
    return path


def table(db: Path, *more: object) -> list[object]:
    return [db, "--table", "item_votes", "--id", "item", "--score", "votes", *more]


def test_a_budget_without_delta_says_what_to_grant(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = ["--ledger", f"sqlite:///{tmp_path / 'l.sqlite'}", "--principal", "bo"]
    assert run(["budget", *ledger, "--grant", 2], capsys)[0] == EXIT_OK
    code, out, err = run(["release", *table(db, "--k", 3, "--epsilon", 1, *ledger)], capsys)
    needed = (1 + math.e) * 1e-9  # the oblivious default's delta at epsilon = 1
    assert code == EXIT_BUDGET and out == ""
    assert f"need a total delta of at least {needed:.3g}" in err, err
    assert "--grant-delta" in err and "--adaptive" in err and len(err.splitlines()) == 1
    code, out, err = run(["budget", *ledger, "--json"], capsys)
    assert json.loads(out)["releases"] == 0  # nothing charged
    adaptive = ["release", *table(db, "--k", 3, "--epsilon", 1, "--adaptive", *ledger)]
    assert run(adaptive, capsys)[0] == EXIT_OK  # delta 0 fits the budget


def test_short_guarantee_by_default_and_the_derivation_on_request(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    release = ["release", *table(db, "--k", 3, "--epsilon", 1, "--frozen")]
    assert run(["prepare", *table(db)], capsys)[0] == EXIT_OK
    code, out, _ = run(release, capsys)
    assert code == EXIT_OK and "Guarantee: (1, 3.72e-09)-DP" in out
    assert "derived from" not in out and max(map(len, out.splitlines())) < 200
    code, out, _ = run([*release, "--explain"], capsys)
    assert code == EXIT_OK and "derived from Wu et al. 2023, Fact 3.3" in out
    code, out, _ = run([*release, "--json"], capsys)
    assert "Fact 3.3" in json.loads(out)["guarantee"]["derivation"]


def test_the_json_example_of_docs_cli_is_what_release_prints(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/cli.md's example (`--k 3 --epsilon 1` with the defaults): the same keys, and the
    same guarantee but for the derivation, which the page shortens."""
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    example = json.loads(re.search(r"```json\n(.*?)```", page, re.S)[1])
    code, out, _ = run(["release", *table(db, "--k", 3, "--epsilon", 1, "--json")], capsys)
    printed = json.loads(out)
    assert code == EXIT_OK and printed.keys() == example.keys()
    shown, real = example["guarantee"], printed["guarantee"]
    assert shown.keys() == real.keys()
    assert {k: v for k, v in shown.items() if k != "derivation"} == {
        k: v for k, v in real.items() if k != "derivation"
    }
    assert real["derivation"].startswith(shown["derivation"].removesuffix("..."))


def test_duckdb_check_says_which_table_runs_read(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After prepare, a table that is not frozen is read as it is now (a full read in one
    query): check says so and names --frozen; with --frozen the copy serves every path."""
    assert run(["prepare", *table(db)], capsys)[0] == EXIT_OK
    code, out, _ = run(["check", *table(db, "--json")], capsys)
    plan = json.loads(out)
    assert code == EXIT_OK and plan["full_scan"] is True and plan["prepared"] is True
    assert all("--frozen" in p["how"] for p in plan["paths"] if p["access"] == "sorted")
    code, out, _ = run(["check", *table(db, "--json", "--frozen")], capsys)
    assert json.loads(out)["full_scan"] is False
    code, _, err = run(["check", *table(db, "--frozen", "--mode", "live")], capsys)
    assert code == 2 and "--frozen" in err


def test_sqlalchemy_table_takes_a_url_string(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shop.sqlite'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE item_votes (item INTEGER PRIMARY KEY, votes INTEGER)")
        conn.exec_driver_sql("INSERT INTO item_votes VALUES " + ", ".join(map(str, ROWS)))
    engine.dispose()
    source = SQLAlchemyTable(url, "item_votes", id="item", score="votes")
    source.prepare()
    assert set(private_top_k(source, k=3, epsilon=30.0, seed=1).items) <= {0, 1, 2, 3}
    source.uninstall()
    with pytest.raises(TypeError, match="an SQLAlchemy Engine or a URL string"):
        SQLAlchemyTable(3, "item_votes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cannot make an engine of 'nosuch://x'"):
        SQLAlchemyTable("nosuch://x", "item_votes")


def test_one_bad_flag_gets_two_short_lines(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["release", *table(db, "--k", 3, "--epsilonn", 1)], capsys)
    assert code == 2 and out == ""
    assert err.splitlines() == [
        "topk-middleware release: error: the following arguments are required: --epsilon",
        "  (see topk-middleware release --help)",
    ]


def test_a_reader_that_goes_away_ends_the_command_quietly(db: Path) -> None:
    """`release ... | head -1`: the pipe's reader is gone before the release is printed (its
    end closed at once here); the command exits 0 with nothing on stderr, no
    'Broken pipe' error and no 'Exception ignored' line from the interpreter's last flush."""
    argv = ["release", *map(str, table(db, "--k", 200, "--epsilon", 1, "--adaptive"))]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "frontends", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 0 and err == ""


def test_make_demo_installs_what_the_demo_needs_only() -> None:
    """`make demo` installs the extra `demo` (DuckDB), not the suite's `dev` (Spark, Ibis,
    dbt, ...); `make test` keeps `dev`."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert extras["optional-dependencies"]["demo"] == ["topk_middleware[duckdb]"]
    make = (ROOT / "Makefile").read_text()
    demo = re.search(r"^\$\(DEMO_STAMP\):.*?\n\n", make, re.S | re.M)
    assert demo is not None and "-e '.[demo]'" in demo[0]
    assert re.search(r"^demo: \$\(DEMO_STAMP\)$", make, re.M)
    assert re.search(r"^test: \$\(STAMP\)", make, re.M) and "-e '.[dev]'" in make


def test_progress_bars_only_on_a_terminal() -> None:
    """The benchmarks' bars follow the CLI's rule: tqdm's disable=None (off unless stderr is
    a terminal), True when quiet; a redirected log gets no bar."""
    import io

    from benchmarks.common import bar_off, progress

    assert bar_off(True) is True and bar_off(False) is None
    log = io.StringIO()
    stderr, sys.stderr = sys.stderr, log
    try:
        assert list(progress(range(3), desc="points")) == [0, 1, 2]
    finally:
        sys.stderr = stderr
    assert log.getvalue() == ""
