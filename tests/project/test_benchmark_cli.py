"""The benchmarks' command line as documented: every --help works, quick runs go to scratch.

`python -m benchmarks --help` and each command's --help must print usage (argparse formats help
strings with %, so a bare % used to crash it); a --quick run without --out writes to
benchmarks/scratch/ (ignored by git), never into the committed benchmarks/results/, and its
report carries no target verdict (one decade of m is a smoke run, not a slope measurement).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import common
from benchmarks.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = [
    "access",
    "wallclock",
    "profile",
    "freshness",
    "replot",
    "oblivious",
    "spark",
    "utility",
    "sizes",
    "redteam",
    "engine-ab",
]
MODULES = [
    "exponential",
    "inputs",
    "in_store",
    "mechanisms_table",
    "randomness",
    "sql_function",
    "sqlalchemy_live",
]


def _help(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, *args, "--help"], cwd=ROOT, env=env, capture_output=True, text=True
    )


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_every_command_prints_help(command: str | None) -> None:
    done = _help(["-m", "benchmarks", *([command] if command else [])])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m benchmarks")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("module", MODULES)
def test_every_benchmark_module_prints_help(module: str) -> None:
    done = _help(["-m", f"benchmarks.{module}"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage:")
    assert "--out" in done.stdout, "every benchmark says where its results go"


@pytest.mark.parametrize("module", ["randomness", "sql_function", "sqlalchemy_live"])
def test_module_benchmarks_take_quick_and_out(module: str) -> None:
    done = _help(["-m", f"benchmarks.{module}"])
    text = " ".join(done.stdout.split())  # argparse wraps help text to the terminal's width
    assert "--quick" in text and "benchmarks/scratch for --quick" in text


def test_a_quick_module_run_writes_to_scratch_or_out(tmp_path: Path) -> None:
    """benchmarks.randomness --quick: randomness.json in benchmarks/scratch/, the committed
    results file untouched; with --out, there instead."""
    from benchmarks import randomness

    committed = (common.RESULTS_DIR / "randomness.json").read_bytes()
    scratch = common.SCRATCH_DIR / "randomness.json"
    scratch.unlink(missing_ok=True)
    try:
        assert randomness.main(["--quick", "--runs", "1"]) == 0
        quick = json.loads(scratch.read_text())
        assert "threshold_plateau_1e5_s" in quick["ratio"] and quick["runs"] == 1
        assert (common.RESULTS_DIR / "randomness.json").read_bytes() == committed
        assert randomness.main(["--quick", "--runs", "1", "--out", str(tmp_path)]) == 0
        assert (
            "oneshot_noises_1e6_s"
            in json.loads((tmp_path / "randomness.json").read_text())["ratio"]
        )
    finally:
        scratch.unlink(missing_ok=True)


def test_quick_run_writes_to_scratch_not_results(capsys: pytest.CaptureFixture[str]) -> None:
    name = "test_quick_scratch"
    target = common.SCRATCH_DIR / f"{name}.json"
    committed = common.RESULTS_DIR / f"{name}.json"
    target.unlink(missing_ok=True)
    try:
        main(
            [
                "access", "--quick", "--families", "plateau", "--k", "1", "--runs", "2",
                "--min-runs", "2", "--oneshot-runs", "1", "--jobs", "1", "--quiet",
                "--no-plot", "--name", name,
            ]
        )  # fmt: skip
        out = capsys.readouterr().out
        payload = json.loads(target.read_text())
        assert not committed.exists()
        assert {p["m"] for p in payload["points"]} == {10**3, 10**4}
        assert payload["plateau_slopes"], "a quick run still fits the plateau slope"
        assert "OUT OF" not in out and "outside" not in out
        assert "quick sweep: not checked" in out
    finally:
        target.unlink(missing_ok=True)


def test_scratch_folder_is_ignored_by_git() -> None:
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert "benchmarks/scratch/" in ignored


def test_replot_redraws_the_plots_from_the_json(tmp_path: Path) -> None:
    for name in ("wallclock.json", "freshness.json", "exponential.json"):
        (tmp_path / name).write_bytes((common.RESULTS_DIR / name).read_bytes())
    assert main(["replot", "--out", str(tmp_path)]) == 0
    for name in ("wallclock.png", "freshness.png", "exponential.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
