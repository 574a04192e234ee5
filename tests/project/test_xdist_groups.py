"""The parallel scheduler's groups (tests/xdist_groups.py) are the marks written in the files,
and `-n auto` starts one worker per usable core plus one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.xdist_groups import group_of, pytest_xdist_auto_num_workers

ROOT = Path(__file__).resolve().parents[2]


def test_the_suites_groups_are_found() -> None:
    assert (
        group_of(ROOT, "tests/frontends/test_sql_function.py::test_install_sql_command")
        == "sql-function"
    )
    assert group_of(ROOT, "tests/project/test_benchmarks.py::test_x[a-1]") == "bench-harness"
    assert (
        group_of(ROOT, "tests/core/test_noise_laws.py::test_the_classes_hold_their_scale")
        is None
    )


def test_function_and_class_marks_are_found(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "@pytest.mark.xdist_group('one')\n"
        "def test_a(): pass\n"
        "@pytest.mark.xdist_group(name='two')\n"
        "class TestB:\n"
        "    def test_c(self): pass\n"
        "def test_d(): pass\n"
    )
    assert group_of(tmp_path, "test_sample.py::test_a[1]") == "one"
    assert group_of(tmp_path, "test_sample.py::TestB::test_c") == "two"
    assert group_of(tmp_path, "test_sample.py::test_d") is None


def test_auto_starts_one_worker_per_core_plus_one(
    pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    assert pytest_xdist_auto_num_workers(pytestconfig) == len(os.sched_getaffinity(0)) + 1
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "5")
    assert pytest_xdist_auto_num_workers(pytestconfig) is None  # xdist's own hook reads it
