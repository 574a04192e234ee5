"""The dbt example (examples/dbt, frontends/dbt_model.py) on dbt-duckdb, as docs/layers.md runs it.

`dbt run` twice on a copy of the example: one charge in the ledger, one answer (the published
table is the same after both runs), and the key the ledger holds is the model, the table it
read and the run date, so another date is another key. Two `dbt run` processes: about 10 s on an
idle 2-core machine (dbt's own start is most of it).
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "dbt"
BIN = Path(sys.executable).parent


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _published(project: Path) -> list[tuple]:
    con = duckdb.connect(str(project / "warehouse.duckdb"), read_only=True)
    try:
        return con.execute("SELECT * FROM private_top_items ORDER BY rank").fetchall()
    finally:
        con.close()


def _ledger(project: Path, query: str) -> list[tuple]:
    with sqlite3.connect(project / "ledger.sqlite") as db:
        return db.execute(query).fetchall()


def _docs_section() -> str:
    page = (ROOT / "docs" / "layers.md").read_text(encoding="utf-8")
    return page[page.index("\n## dbt\n") :]


def test_the_docs_show_the_example_model_and_config() -> None:
    section = _docs_section()
    model = (EXAMPLE / "models" / "private_top_items.py").read_text(encoding="utf-8")
    assert f"```py\n{model}```" in section
    config = (EXAMPLE / "dbt_project.yml").read_text(encoding="utf-8")
    for line in section.split("```yaml\n")[1].split("```")[0].splitlines()[2:]:
        assert line in config, line


def test_dbt_run_twice_charges_once_and_publishes_one_answer(tmp_path: Path) -> None:
    """The commands of the docs' sh block, in a copy of examples/dbt."""
    project = tmp_path / "dbt"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("target", "logs", "*.duckdb"))
    commands = _docs_section().split("```sh\n")[1].split("```")[0].splitlines()
    assert commands[0].startswith("topk-middleware budget") and commands[1:] == [
        "dbt run --profiles-dir .",
        "dbt run --profiles-dir .",
    ]
    grant, dbt_run = commands[0].split(), commands[1].split()
    _run([str(BIN / grant[0]), *grant[1:]], project)

    _run([str(BIN / dbt_run[0]), *dbt_run[1:]], project)
    first = _published(project)
    _run([str(BIN / dbt_run[0]), *dbt_run[1:]], project)
    assert _published(project) == first  # the stored release, not a second draw
    assert [row[:2] for row in first] == [(rank, row[1]) for rank, row in enumerate(first, 1)]
    assert len(first) == 10 and len({row[1] for row in first}) == 10
    (guarantee,) = {row[2] for row in first}
    assert guarantee.startswith("Guarantee: (1, 1e-06)-DP for add/remove-one-client neighbours")
    charges = _ledger(project, "SELECT principal FROM topk_ledger_charges")
    assert charges == [("reporting",)]
    (key,) = _ledger(project, "SELECT release_key FROM topk_ledger_keys")
    database, schema, rest = key[0].split(".", 2)
    model, date = rest.split("@")
    assert (database, schema, model) == ("warehouse", "main", "private_top_items:main.item_votes")
    compiled = project / "target" / "compiled" / "topk_example" / "models" / "private_top_items.py"
    assert f"'topk_run_date': '{date}'" in compiled.read_text()  # dbt's run_started_at date
