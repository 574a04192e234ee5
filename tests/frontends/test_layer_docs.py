"""Every Python example of docs/layers.md runs as written, each in a fresh directory, and prints
what the page says it prints (a release of rank and item, and the guarantee). About 2 s."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "layers.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def examples() -> list[str]:
    return BLOCK.findall(PAGE.read_text(encoding="utf-8"))


def test_the_page_has_its_examples() -> None:
    assert len(examples()) >= 1


@pytest.mark.parametrize("number", range(len(examples())))
def test_example_runs_as_written(number: int, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(examples()[number], encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Guarantee: (" in done.stdout, done.stdout
