"""The hostile battery (issue 11): bad input, races and faults, one test per class of defect, on
the real stores. Each test failed on the code before the fix it guards."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from adapters.memory import ArraySource
from topk_middleware import private_top_k

# ----- ids come back exactly as given ---------------------------------------------------------


def test_array_source_returns_ids_with_their_type_and_value() -> None:
    source = ArraySource([50, 40, 30, 20, 10], ids=[1, "a", 2.5, "x\x00", b"\xff"])
    rows = source.read_sorted(0, 5)
    assert rows.ids.tolist() == [1, "a", 2.5, "x\x00", b"\xff"]
    assert [type(i) for i in rows.ids.tolist()] == [int, str, float, str, bytes]
    released = private_top_k(source, k=4, epsilon=1e6, seed=1).items  # noise far below the gaps
    assert released == [1, "a", 2.5, "x\x00"]
    assert type(released[0]) is int


def test_array_source_one_and_text_one_are_two_items() -> None:
    source = ArraySource([7, 7, 7], ids=["1", 1, "x"])
    # The documented total order: numbers, then text in code point order.
    assert source.read_sorted(0, 3).ids.tolist() == [1, "1", "x"]
    assert source.read_ids(["1", 1]).tolist() == [7.0, 7.0]


def test_array_source_mixed_ties_follow_the_documented_order() -> None:
    source = ArraySource([1, 1, 1, 1, 1], ids=[b"a", "b", 2, "a", 1.5])
    assert source.read_sorted(0, 5).ids.tolist() == [1.5, 2, "a", "b", b"a"]


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([None, 1, 2], r"ids\[0\] is None .*ids must be int, float, str or bytes"),
        ([1, True, 2], r"ids\[1\] is True \(bool\)"),
        ([1, 2, float("nan")], r"ids\[2\] is NaN"),
        ([1, 1.0, 2], r"duplicate ids, e.g. 1 at indexes 0 and 1"),
        (["a", ("b",), "c"], r"ids\[1\] is \('b',\) \(tuple\)"),
        (np.array([3.0, np.nan, 1.0]), r"ids\[1\] is NaN"),
    ],
)
def test_array_source_refuses_bad_ids_clearly(ids, message) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        ArraySource([1, 2, 3], ids=ids)


# ----- the CLI: bad arguments, no traceback, nothing left behind -------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--m", "0"], "--m must be >= 1"),
        (["--m", "-5"], "--m must be >= 1"),
        (["--m", "10", "--k", "0"], "--k must be >= 1"),
        (["--m", "10", "--k", "11"], "--k = 11 exceeds the number of items"),
        (["--m", "10", "--epsilon", "nan"], "--epsilon must be finite and > 0"),
        (["--m", "10", "--epsilon", "-1"], "--epsilon must be finite and > 0"),
        (["--m", "10", "--seed", "-1"], "--seed must be >= 0"),
        (["--m", "ten"], "invalid int value"),
    ],
)
def test_cli_refuses_bad_arguments_without_traceback_or_file(
    tmp_path: Path, args: list[str], message: str
) -> None:
    data = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, "-m", "topk_middleware", "demo", *args, "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert not data.exists()  # no directory, no empty DuckDB file


def test_cli_reports_a_store_failure_without_traceback(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    done = subprocess.run(
        [sys.executable, "-m", "topk_middleware", "demo", "--m", "10", "--data-dir", str(blocker)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "topk_middleware demo: error:" in done.stderr
    assert "Traceback" not in done.stderr
