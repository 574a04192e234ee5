"""The documentation: the MkDocs site builds with warnings as errors, and the README is short.

`mkdocs build --strict` fails on any warning: a broken link between pages, a missing image
(the benchmark plots come from benchmarks/results/ through scripts/mkdocs_hooks.py), a page
left out of the nav, or an API reference object that mkdocstrings cannot find. The README is
the front door: at most about 250 lines, linking only to pages that exist, with no project
history in it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
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
    for name in ("private_top_k", "ArraySource", "from_arrow", "uninstall", "PrivacyLedger"):
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


def _no_history(name: str, text: str) -> None:
    for history in (r"\bissue \d+", r"what changed", r"previous (run|session)", r"this session"):
        assert not re.search(history, text, re.IGNORECASE), f"{name}: {history}"


def test_docs_describe_the_product_not_its_history() -> None:
    for page in sorted((ROOT / "docs").rglob("*.md")):
        _no_history(page.name, page.read_text(encoding="utf-8"))
