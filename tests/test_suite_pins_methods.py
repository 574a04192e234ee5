"""The suite's own rule: a test about the threshold algorithm's options pins the method.

`oracle`, `batching` and `costs` act only when the threshold method runs; under the default
`method="auto"` the planner may pick the one-shot mechanism (on small test tables it does), and a
test passing them would then test the one-shot mechanism while its name says otherwise. This scan
fails on any call of private_top_k / budgeted_private_top_k in tests/ that passes one of them
without `method=` (tests.helpers.threshold_run pins it and checks what ran).
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
THRESHOLD_ONLY = {"oracle", "batching", "costs"}
RELEASES = {"private_top_k", "budgeted_private_top_k"}


def unpinned_calls(path: Path) -> list[str]:
    """'file:line' of each release call passing a threshold-only option without a method."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        keywords = {keyword.arg for keyword in node.keywords}
        if name in RELEASES and keywords & THRESHOLD_ONLY and "method" not in keywords:
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_threshold_options_come_with_a_pinned_method() -> None:
    files = sorted(TESTS.rglob("*.py"))
    assert len(files) > 10
    unpinned = [where for path in files for where in unpinned_calls(path)]
    assert not unpinned, f"pass method= (or use tests.helpers.threshold_run): {unpinned}"


def test_the_scan_finds_an_unpinned_call(tmp_path: Path) -> None:
    """The scan itself can fail: it flags unpinned calls and passes a pinned one."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "private_top_k(s, 1, 1.0, oracle='lazy')\n"
        "private_top_k(s, 1, 1.0, method='threshold', oracle='lazy')\n"
        "api.budgeted_private_top_k(b, s, 1, 1.0, costs=c)\n"
    )
    assert unpinned_calls(sample) == ["sample.py:1", "sample.py:3"]
