"""Every shell and SQL example of README.md and docs/ runs as written, on the real stores.

The convention, for whoever writes a page:

* a fenced block opened with ```sh, ```console or ```bash is a shell script: it runs with
  `bash -e` (its lines in order, `\\` continuations and `#` comments as bash reads them); a
  block of plain `topk-middleware ...` lines runs them in this process, through the CLI's
  main() with the same words (no interpreter start per line);
* a fenced block opened with ```sql is run statement by statement on PostgreSQL; a comment
  line `-- alice` (or `-- alice, ...`) runs what follows as the role alice (a connection of its
  own, as the analyst's psql would be), `-- the administrator` as the database's owner again;
* a block opened with ```json must parse as JSON; other blocks (python, text) are not run here;
* a block that cannot run here says why, in an HTML comment on the line just above its fence:
  `<!-- not run: needs root on the server's machine -->` (the rendered page does not show it).

The blocks of one page run in order, in one working directory and one PostgreSQL database, so
a page can prepare in one block and release in the next. The runner supplies what the pages
assume exists: the files `shop.duckdb`, `votes.duckdb` and `shop.sqlite`, each with the table
`item_votes (item, votes)`; a PostgreSQL database with `item_votes` in schemas public and sales
and `page_views_counts` built by from_votes with max_per_item = 5; the role alice; and
`.venv/bin` first on PATH. The connection strings the pages show (`postgresql://...@127.0.0.1/
shop`, `--dsn "host=/var/run/postgresql dbname=shop user=postgres"`, ...) and the role name
alice are replaced by the test's own (CONNECTIONS below): a page names a new one there.

What fails: a command whose flags or table the code no longer accepts (README's `unprepare`
without `--id item --score votes` on a table without the column id), a SQL call the documented
GRANT does not cover, an error or a traceback on stderr. Cost: one page a test, the CLI in
subprocesses, one install-sql: 5-20 s a page.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import psycopg
import pytest
from psycopg import sql

from frontends.cli import main
from tests.frontends.test_cli import postgres_uri
from tests.stores.test_uninstall import PG_DSN

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
SHELL, SQL, JSON = ("sh", "console", "bash"), ("sql",), ("json",)
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.S | re.M)
NOT_RUN = re.compile(r"<!--\s*not run:\s*(?P<why>[^>]*?)\s*-->\s*$")
# The connection strings the pages show, replaced by the test database's ({url}: a URL; {dsn}:
# a libpq key=value string). A page that shows another adds it here.
CONNECTIONS = {
    "postgresql://analytics@127.0.0.1/shop": "{url}",
    "postgresql://admin@127.0.0.1/shop": "{url}",
    "postgresql://127.0.0.1/shop": "{url}",
    '"host=/var/run/postgresql dbname=shop user=postgres"': '"{dsn}"',
    '"host=/var/run/postgresql dbname=analytics user=postgres"': '"{dsn}"',
    '"dbname=shop"': '"{dsn}"',
}
PROGRAMS = ("topk-middleware", ".venv/bin/topk-middleware")
ITEMS = [(i, (37 * i) % 101) for i in range(1, 201)]  # 200 items, 101 distinct counts


@dataclass
class Block:
    page: str
    line: int
    language: str
    text: str
    not_run: str | None  # why the page does not run it


def blocks(page: str) -> list[Block]:
    text = (ROOT / page).read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        above = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        why = NOT_RUN.search(above)
        found.append(
            Block(page, line, match[1], match[2], None if why is None else why["why"] or "?")
        )
    return found


def runnable(page: str) -> bool:
    return any(b.language in SHELL + SQL + JSON and b.not_run is None for b in blocks(page))


@dataclass
class Place:
    """Where a page's blocks run: a working directory, a database, a role."""

    cwd: Path
    dsn: str  # the database's owner (a superuser)
    role: str  # what the pages call alice

    def local(self, text: str) -> str:
        for shown, ours in CONNECTIONS.items():
            text = text.replace(shown, ours.format(url=postgres_uri(self.dsn), dsn=self.dsn))
        return re.sub(r"\balice\b", self.role, text)


def _counts_file(path: Path) -> None:
    if path.suffix == ".duckdb":
        with duckdb.connect(str(path)) as con:
            con.execute("CREATE TABLE item_votes (item BIGINT, votes BIGINT)")
            con.executemany("INSERT INTO item_votes VALUES (?, ?)", ITEMS)
    else:
        import sqlite3

        with sqlite3.connect(path) as con:
            con.execute("CREATE TABLE item_votes (item INTEGER PRIMARY KEY, votes INTEGER)")
            con.executemany("INSERT INTO item_votes VALUES (?, ?)", ITEMS)


def _counts_database(dsn: str, role: str, make_role: bool) -> None:
    from adapters.postgres import PostgresTable

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA sales")
        for schema in ("public", "sales"):
            conn.execute(
                sql.SQL("CREATE TABLE {} (item bigint PRIMARY KEY, votes bigint)").format(
                    sql.Identifier(schema, "item_votes")
                )
            )
            with conn.cursor() as cur:
                cur.executemany(
                    sql.SQL("INSERT INTO {} VALUES (%s, %s)").format(
                        sql.Identifier(schema, "item_votes")
                    ),
                    ITEMS,
                )
        # the votes behind page_views_counts, under names no page uses
        conn.execute("CREATE TABLE topk_docs_views (client bigint, item bigint, views bigint)")
        conn.execute("CREATE TABLE topk_docs_pages (id bigint PRIMARY KEY)")
        conn.execute("INSERT INTO topk_docs_pages SELECT g FROM generate_series(1, 30) g")
        conn.execute(
            "INSERT INTO topk_docs_views SELECT g % 50, 1 + g % 30, 1 + g % 7 "
            "FROM generate_series(1, 600) g"
        )
        if make_role:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    PostgresTable.from_votes(
        dsn,
        "topk_docs_views",
        "topk_docs_pages",
        client="client",
        item="item",
        into="page_views_counts",
        weight="views",
        max_per_item=5,
    ).close()


@pytest.fixture
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    page: str = request.node.callspec.params["page"]
    name = f"topk_docs_{uuid.uuid4().hex[:8]}"
    role = f"alice_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = psycopg.conninfo.make_conninfo(PG_DSN, dbname=name)
    page_sql = "\n".join(b.text for b in blocks(page) if b.language in SQL)
    made_by_page = re.search(r"CREATE ROLE alice\b", page_sql) is not None
    try:
        _counts_database(dsn, role, make_role=not made_by_page)
        for file in ("shop.duckdb", "votes.duckdb", "shop.sqlite"):
            _counts_file(tmp_path / file)
        (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
        yield Place(tmp_path, dsn, role)
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def _commands(script: str) -> list[list[str]] | None:
    """The script's commands as argv lists, if every one is a plain `topk-middleware ...` (no
    pipe, redirection or variable): those run in this process, through the CLI's main(), as
    the console script would run them; None: the script goes to bash."""
    joined = script.replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0] not in PROGRAMS or re.search(r"[|<>;&$`]", line.split("#")[0]):
            return None
        commands.append(words[1:])
    return commands


def run_shell(block: Block, place: Place, monkeypatch: pytest.MonkeyPatch) -> None:
    where = f"{block.page}:{block.line}"
    commands = _commands(place.local(block.text))
    if commands is not None:
        monkeypatch.chdir(place.cwd)
        for argv in commands:
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = main(argv)
                except SystemExit as stop:
                    code = int(stop.code or 0)
            assert code == 0, f"{where}: {shlex.join(argv)}: exit {code}\n{err.getvalue()}"
        return
    env = {
        **os.environ,
        "PATH": f"{place.cwd / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        ["bash", "-e", "-c", place.local(block.text)],
        cwd=place.cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{where}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr, f"{where}:\n{done.stderr}"


def run_sql(block: Block, place: Place) -> None:
    owner = psycopg.connect(place.dsn, autocommit=True)
    conns = [owner]
    conn = owner
    try:
        statement: list[str] = []
        for line in [*place.local(block.text).splitlines(), ";"]:
            role = re.fullmatch(r"--\s*(\w+)\b.*", line.strip())
            if role is not None and not statement:
                who = role[1]
                if who == place.role:
                    conn = psycopg.connect(
                        psycopg.conninfo.make_conninfo(place.dsn, user=place.role),
                        autocommit=True,
                    )
                    conns.append(conn)
                elif who == "the":  # -- the administrator
                    conn = owner
                continue
            if statement or line.strip():
                statement.append(line)
            if re.search(r";\s*(--.*)?$", line):
                text = "\n".join(statement).strip().rstrip(";").strip()
                statement = []
                if text and not all(s.strip().startswith("--") for s in text.splitlines()):
                    try:
                        cursor = conn.execute(text)
                        if cursor.description is not None:
                            assert cursor.fetchall() is not None
                    except psycopg.Error as error:
                        pytest.fail(f"{block.page}:{block.line}: {text!r}: {error}")
    finally:
        for c in conns:
            c.close()


@pytest.mark.parametrize("page", [p for p in PAGES if runnable(p)])
def test_page_commands_run_as_written(
    page: str, place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran = 0
    for block in blocks(page):
        if block.not_run is not None:
            continue
        if block.language in SHELL:
            run_shell(block, place, monkeypatch)
        elif block.language in SQL:
            run_sql(block, place)
        elif block.language in JSON:
            json.loads(block.text)
        else:
            continue
        ran += 1
    assert ran


def test_every_block_that_is_not_run_says_why() -> None:
    """A shell or SQL block either runs or carries `<!-- not run: why -->` with a reason."""
    for page in PAGES:
        for block in blocks(page):
            if block.language in SHELL + SQL and block.not_run is not None:
                assert len(block.not_run) > 10, f"{page}:{block.line}: say why it is not run"


def test_every_plot_in_the_results_is_shown_on_a_page() -> None:
    """Each PNG under benchmarks/results/ appears as an image (`results/<name>.png`) on a page
    of the site (scripts/mkdocs_hooks.py copies them into the build)."""
    shown = {
        name
        for page in (ROOT / "docs").glob("*.md")
        for name in re.findall(r"!\[[^\]]*\]\(results/([^)\s]+\.png)\)", page.read_text())
    }
    built = {p.name for p in (ROOT / "benchmarks" / "results").glob("*.png")}
    assert built - shown == set()
