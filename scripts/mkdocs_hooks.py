"""MkDocs hook: the benchmark plots in benchmarks/results/ become pages' images under results/.

The plots stay where the benchmarks write them (one copy, in the repository); the docs site
gets them at build time, so docs/benchmarks.md links `results/<name>.png` and `mkdocs build
--strict` checks that each one exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def on_files(files: Files, config: Any) -> Files:
    for png in sorted(RESULTS.glob("*.png")):
        files.append(
            File(
                f"results/{png.name}",
                src_dir=str(RESULTS.parent),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
            )
        )
    return files
