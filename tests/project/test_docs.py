"""The documentation: the MkDocs site builds with warnings as errors, and the README is short.

`mkdocs build --strict` fails on any warning: a broken link between pages, a missing image
(the benchmark plots come from benchmarks/results/ through scripts/mkdocs_hooks.py), a page
left out of the nav, or an API reference object that mkdocstrings cannot find. The README is
the front door: at most about 250 lines, linking only to pages that exist. Neither the pages,
the README, nor any docstring or comment of the Python code tells the project's history
(HISTORY: issue numbers, runs or sessions of its making, commit hashes).
"""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BUILD = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet"]


def test_docs_site_builds_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [*BUILD, "--site-dir", str(site)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for page in ("index.html", "concepts/index.html", "reference/index.html"):
        assert (site / page).is_file()
    reference = (site / "reference" / "index.html").read_text(encoding="utf-8")
    for name in (
        "private_top_k",
        "ArraySource",
        "from_arrow",
        "uninstall",
        "PrivacyLedger",
        "SQLLedgerStore",
        "SparkTable",
        "LivePostgresTable",
        "SQLAlchemyLiveTable",
        "TableReads",
    ):
        assert name in reference, f"the API reference lacks {name}"
    assert (site / "results" / "wallclock.png").read_bytes()[:4] == b"\x89PNG"


def _nav_pages(nav: list) -> list[str]:
    pages: list[str] = []
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            pages.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return pages


def test_every_page_is_in_the_nav() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = set(_nav_pages(config["nav"]))
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert pages == nav
    wanted = {
        "index.md", "quickstart.md", "concepts.md", "stores.md", "operations.md", "security.md",
        "mechanisms.md", "benchmarks.md", "architecture.md", "reference.md", "oblivious.md",
        "guarantee.md", "freshness.md", "spark.md", "benchmarks-spark.md",
    }  # fmt: skip
    assert wanted <= nav


def test_readme_is_short_and_links_to_existing_pages() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    links = re.findall(r"\]\(([^)#]+)", text)
    assert links
    for link in links:
        if "://" not in link:
            assert (ROOT / link).is_file(), link
    for phrase in ("make demo", "make test", "topk-middleware", "private_top_k", "uninstall"):
        assert phrase in text
    _no_history("README.md", text)


# Phrases that tell how the project came to be rather than what it is (a space matches any run
# of white space, line breaks included): issue numbers, runs and sessions of its making, commit
# hashes.
HISTORY = (
    r"\bissues? #?\d+",
    r"\bwhat changed since\b",
    r"\b(previous|earlier|prior) (runs?|sessions?|rounds?|versions?)\b",
    r"\b(last|this|next) (session|round)\b",
    r"\bnow taken\b",
    r"\bpreviously\b",
    r"\bcommit [0-9a-f]{7,40}\b",
    r"\bno longer (use|uses|used|the default)\b",
    r"\bused to be\b",
)
PYTHON_TREES = ("topk_middleware", "adapters", "frontends", "benchmarks", "tests", "scripts")


def history_in(text: str) -> list[str]:
    """The history phrases found in `text`."""
    return [
        found.group(0)
        for pattern in HISTORY
        for found in re.finditer(pattern.replace(" ", r"\s+"), text, re.IGNORECASE)
    ]


def _no_history(name: str, text: str) -> None:
    found = history_in(text)
    assert not found, f"{name}: {found}"


def docstrings_and_comments(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every docstring (module, class, function) and comment of a Python file."""
    source = path.read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def test_docs_describe_the_product_not_its_history() -> None:
    for page in sorted((ROOT / "docs").rglob("*.md")):
        _no_history(page.name, page.read_text(encoding="utf-8"))


def test_docstrings_and_comments_describe_the_code_not_its_history() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {history_in(text)}"
        for tree in PYTHON_TREES
        for path in sorted((ROOT / tree).rglob("*.py"))
        for line, text in docstrings_and_comments(path)
        if history_in(text)
    ]
    assert found == [], "history in docstrings or comments:\n" + "\n".join(found)


def test_the_history_check_sees_what_it_should(tmp_path: Path) -> None:
    """The checker itself: phrases across a line break, in a comment and in a docstring."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        '"""Faster (issue\n13): with the 9 reps now taken."""\n'
        "def f():\n"
        '    """An earlier\n    run measured 11.3x."""\n'
        "    return 1  # this round: see commit d2be460\n"
    )
    found = [p for _, text in docstrings_and_comments(probe) for p in history_in(text)]
    assert sorted(p.split()[0].lower() for p in found) == [
        "commit",
        "earlier",
        "issue",
        "now",
        "this",
    ]
    assert history_in("the writes since the last refresh, the ranks it no longer serves") == []
