"""`python -m frontends demo` end to end, on a small m in a temporary directory."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pytest

from adapters.memory import ArraySource
from frontends.cli import DEMO_TABLE, create_zipf_table, main
from topk_middleware import private_top_k


def test_zipf_table_is_a_permutation_with_zipf_counts() -> None:
    con = duckdb.connect()
    create_zipf_table(con, 1000, exponent=1.0, total_votes=1e6)
    items, votes = con.execute(f"SELECT item, votes FROM {DEMO_TABLE}").fetchnumpy().values()
    assert sorted(items.tolist()) == list(range(1000))
    weights = 1.0 / np.arange(1, 1001)
    want = np.floor(1e6 * weights / weights.sum())
    np.testing.assert_array_equal(np.sort(votes)[::-1], want)


def test_demo_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m, k, seed = 4000, 5, 3
    main(["demo", "--m", str(m), "--k", str(k), "--seed", str(seed), "--data-dir", str(tmp_path)])
    first = capsys.readouterr().out
    assert "Creating" in first and "Preparing sublinear access" in first
    released = [int(x) for x in re.findall(r"^\s+\d+\. item (\d+)$", first, flags=re.M)]
    assert len(released) == k
    # The same seed on the same counts held in memory gives the same items.
    with duckdb.connect(str(tmp_path / f"votes-{m}.duckdb")) as con:
        items, votes = con.execute(f"SELECT item, votes FROM {DEMO_TABLE}").fetchnumpy().values()
    assert (
        released
        == private_top_k(
            ArraySource(votes, items), k=k, epsilon=1.0, method="threshold", seed=seed
        ).items
    )
    assert "(1, 0)-DP" in first and "Fact 3.3" in first
    assert "assumes each client changes each count by at most 1" in first
    rows = dict(
        re.findall(
            r"^\s+(private threshold|one-shot full scan).*rows read\s+([\d,]+)", first, flags=re.M
        )
    )
    assert int(rows["one-shot full scan"].replace(",", "")) == m
    assert 0 < int(rows["private threshold"].replace(",", "")) < m

    # The second time the file is reused, not rebuilt.
    main(["demo", "--m", str(m), "--k", str(k), "--seed", str(seed), "--data-dir", str(tmp_path)])
    second = capsys.readouterr().out
    assert "Using" in second and "Creating" not in second and "Preparing" not in second
    assert [int(x) for x in re.findall(r"^\s+\d+\. item (\d+)$", second, flags=re.M)] == released


def test_demo_as_a_module(tmp_path: Path) -> None:
    """What `make demo` runs, as a separate process."""
    done = subprocess.run(
        [sys.executable, "-m", "frontends", "demo", "--m", "2000", "--data-dir", tmp_path],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "Private top-10" in done.stdout and "one-shot full scan" in done.stdout
