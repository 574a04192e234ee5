"""The command line's front door: a fast --help and --version, a lean `release`, and `unprepare`.

--help and --version import no heavy module (numpy, scipy, drivers, store adapters), and a
`release` imports only what its store and ledger need (no scipy, plotting, dataframe library or
other store's driver): checked with `python -X importtime`, which lists every module a process
imports (no wall-clock assertion; benchmarks/cli.py times the command). `topk-middleware
unprepare` removes what `prepare` made, on a DuckDB file and on PostgreSQL in copy and live mode,
checked against the store's catalog before prepare.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest

from tests.frontends.test_cli import postgres_uri, run
from tests.stores_postgres import DEFAULT_PG_DSN

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("numpy", "scipy", "sqlalchemy", "duckdb", "psycopg", "tqdm", "pyarrow", "polars")
PG_DSN = os.environ.get("TOPK_PG_DSN", DEFAULT_PG_DSN)


def _imported(args: list[str]) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "frontends", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    modules = {
        line.split("|")[-1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return done, modules


@pytest.mark.parametrize(
    "args", [["--help"], ["--version"], ["release", "--help"], ["unprepare", "--help"]]
)
def test_help_and_version_import_nothing_heavy(args: list[str]) -> None:
    done, modules = _imported(args)
    assert done.returncode == 0, done.stderr
    assert "frontends.cli" in modules  # the listing works
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not heavy, f"{args} imported {heavy[:5]}"
    ours = sorted(m for m in modules if m.split(".")[0] in ("adapters", "topk_middleware"))
    assert ours == ["adapters", "adapters.url", "topk_middleware", "topk_middleware.names"]
    if args != ["--version"]:  # the version is read from the package metadata when asked for
        assert "importlib.metadata" not in modules


# Modules no release of a DuckDB file or a SQLite table uses, whatever its options: importing
# any of them is a cost the command does not need (scipy alone takes about half a second).
NEVER_IN_A_RELEASE = (
    "scipy",
    "pyspark",
    "polars",
    "ibis",
    "matplotlib",
    "pyarrow",
    "pandas",
    "tqdm",
    "psycopg",
    "pyinstrument",
    "frontends.duckdb_sql",
    "frontends.polars_ns",
    "adapters.ibis",
    "adapters.postgres",
    "adapters.spark",
)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A prepared DuckDB file and a prepared SQLite table of 500 counts, and a ledger file with
    a budget for principal 'analyst' (made in this process, once for the module)."""
    import sqlite3

    from frontends.cli import main

    folder = tmp_path_factory.mktemp("lean_release")
    duck = folder / "votes.duckdb"
    con = duckdb.connect(str(duck))
    con.execute(
        "CREATE TABLE votes AS SELECT range AS id, (range * 7) % 101 AS score FROM range(500)"
    )
    con.close()
    lite = folder / "votes.sqlite"
    with sqlite3.connect(lite) as db:
        db.execute("CREATE TABLE votes (id INTEGER PRIMARY KEY, score INTEGER NOT NULL)")
        db.executemany("INSERT INTO votes VALUES (?, ?)", [(i, (i * 7) % 101) for i in range(500)])
    urls = {"duckdb": str(duck), "sqlite": f"sqlite:///{lite}"}
    for url in urls.values():
        assert main(["prepare", url, "--table", "votes", "--no-progress", "--json"]) == 0
    ledger = f"sqlite:///{folder / 'ledger.db'}"
    grant = ["--principal", "analyst", "--grant", "9", "--grant-delta", "1e-6", "--json"]
    assert main(["budget", "--ledger", ledger, *grant]) == 0
    return {**urls, "ledger": ledger}


# Modules an oblivious release (the default) does not run: the installer of the SQL functions,
# and the threshold algorithm's noise lists and cost model (an --adaptive release uses them).
NOT_IN_AN_OBLIVIOUS_RELEASE = {
    "frontends.sql",  # the package, imported with any of its modules
    "frontends.sql_function",
    "topk_middleware.lazy_noise",
    "topk_middleware.mechanisms.cost_aware",
    "sortedcontainers",
}


@pytest.mark.parametrize(
    ("store", "options", "needed", "unused"),
    [
        (
            "duckdb",
            [],
            {"numpy", "duckdb", "adapters.duckdb"},
            {"sqlalchemy", *NOT_IN_AN_OBLIVIOUS_RELEASE},
        ),
        (
            "duckdb",
            ["--ledger", "LEDGER", "--principal", "analyst"],
            {"duckdb", "sqlalchemy"},
            set(),
        ),
        ("duckdb", ["--with-counts", "--adaptive"], {"duckdb"}, {"sqlalchemy"}),
        (
            "sqlite",
            [],
            {"numpy", "sqlalchemy", "adapters.sqlalchemy"},
            {"duckdb", "adapters.duckdb"},
        ),
    ],
    ids=["duckdb", "duckdb-ledger", "duckdb-counts-adaptive", "sqlite"],
)
def test_a_release_imports_only_what_it_uses(
    stores: dict[str, str], store: str, options: list[str], needed: set[str], unused: set[str]
) -> None:
    """`topk-middleware release` in a process of its own, listed by -X importtime: it fails if a
    module above (or the other store's driver) is imported at the top of the CLI, the package
    or the adapters, or if the listing misses the modules the release does use."""
    options = [stores["ledger"] if o == "LEDGER" else o for o in options]
    done, modules = _imported(
        ["release", stores[store], "--table", "votes", "--k", "3", "--epsilon", "0.5", *options]
    )
    assert done.returncode == 0, done.stderr
    assert "Private top-3" in done.stdout
    assert needed <= modules
    imported = sorted(
        m for m in modules if any(m == n or m.startswith(n + ".") for n in NEVER_IN_A_RELEASE)
    )
    assert not imported, f"{store} {options} imported {imported[:5]}"
    assert not (unused & modules)


def test_a_postgres_release_imports_neither_sqlalchemy_nor_duckdb(
    pg_conninfo: str, pg_schema: str
) -> None:
    """`topk-middleware release postgresql://...` on a prepared copy, listed by -X importtime:
    psycopg and the PostgreSQL adapter, never SQLAlchemy (not needed to mask the URL's
    password: ~0.2 s), DuckDB or the modules an oblivious release does not run."""
    from frontends.cli import main

    uri = postgres_uri(pg_conninfo)
    # A name of this test's own: the session's schema is shared by the modules a worker runs.
    table = f"{pg_schema}.cli_import_votes"
    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {table} AS SELECT g AS id, (g * 7) % 101 AS score "
            "FROM generate_series(0, 499) g"
        )
    try:
        assert main(["prepare", uri, "--table", table, "--no-progress", "--json"]) == 0
        done, modules = _imported(
            ["release", uri, "--table", table, "--k", "3", "--epsilon", "0.5"]
        )
    finally:
        assert main(["unprepare", uri, "--table", table, "--json"]) == 0
        with psycopg.connect(pg_conninfo, autocommit=True) as conn:
            conn.execute(f"DROP TABLE {table}")
    assert done.returncode == 0, done.stderr
    assert "Private top-3" in done.stdout
    assert {"numpy", "psycopg", "adapters.postgres"} <= modules
    unwanted = {"sqlalchemy", "duckdb", "adapters.duckdb", *NOT_IN_AN_OBLIVIOUS_RELEASE}
    unwanted |= set(NEVER_IN_A_RELEASE) - {"psycopg", "adapters.postgres"}
    imported = sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in unwanted))
    assert not imported, imported[:5]


def test_version_prints_the_package_version() -> None:
    from importlib.metadata import version

    done, _ = _imported(["--version"])
    assert done.stdout.strip() == f"topk-middleware {version('topk_middleware')}"


def test_help_lists_unprepare() -> None:
    done, _ = _imported(["--help"])
    assert "unprepare" in done.stdout


def _duckdb_objects(path: Path) -> set[Any]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        tables = con.execute("SELECT 'table', table_name FROM duckdb_tables()").fetchall()
        indexes = con.execute("SELECT 'index', index_name FROM duckdb_indexes()").fetchall()
        return set(tables) | set(indexes)
    finally:
        con.close()


def test_unprepare_a_duckdb_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "votes.duckdb"
    con = duckdb.connect(str(path))
    con.execute(
        "CREATE TABLE votes AS SELECT range AS id, (range * 7) % 101 AS score FROM range(500)"
    )
    con.close()
    before = _duckdb_objects(path)
    assert run(["prepare", path, "--table", "votes", "--no-progress"], capsys)[0] == 0
    assert _duckdb_objects(path) > before
    code, out, err = run(["unprepare", path, "--table", "votes"], capsys)
    assert (code, err) == (0, "")
    assert "removed what prepare made" in out
    assert _duckdb_objects(path) == before
    release = ["release", path, "--table", "votes", "--k", "3", "--epsilon", "1"]
    code, _, err = run([*release, "--frozen"], capsys)
    assert code != 0 and "prepare" in err  # a frozen table's release needs prepare again
    code, _, err = run(release, capsys)  # the others read the table as it is now
    assert (code, err) == (0, "") and _duckdb_objects(path) == before


def _pg_objects(conn: psycopg.Connection[Any], schema: str) -> set[Any]:
    relations = conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s",
        [schema],
    ).fetchall()
    triggers = conn.execute(
        "SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND NOT t.tgisinternal",
        [schema],
    ).fetchall()
    functions = conn.execute(
        "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = %s",
        [schema],
    ).fetchall()
    return (
        {("rel", *r) for r in relations}
        | {("trg", *t) for t in triggers}
        | {("fn", *f) for f in functions}
    )


@pytest.mark.parametrize("mode", ["copy", "live"])
def test_unprepare_on_postgres(mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    conn = psycopg.connect(PG_DSN, autocommit=True)
    schema = f"unprep_{uuid.uuid4().hex[:10]}"
    conn.execute(f"CREATE SCHEMA {schema}")
    try:
        conn.execute(
            f"CREATE TABLE {schema}.votes AS SELECT g AS id, (g * 7) % 101 AS score "
            "FROM generate_series(1, 500) AS g"
        )
        before = _pg_objects(conn, schema)
        url = postgres_uri(PG_DSN)
        table = ["--table", "votes", "--schema", schema, "--mode", mode]
        assert run(["prepare", url, *table, "--no-progress"], capsys)[0] == 0
        assert _pg_objects(conn, schema) > before
        code, out, err = run(["unprepare", url, *table, "--json"], capsys)
        assert (code, err) == (0, "")
        assert json.loads(out) == {
            "unprepared": f"PostgreSQL table {schema!r}.'votes'",
            "mode": mode,
        }
        assert _pg_objects(conn, schema) == before
    finally:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
        conn.close()


def test_the_cli_benchmark_runs_quick(tmp_path: Path) -> None:
    """`python -m benchmarks.cli --quick --out DIR` (docs/cli.md): m = 10^4, one rep of each of
    six processes after a warm-up (about 5 s idle, 10 s loaded); the JSON has every rep, the
    load average before each, and the release's imports, which include duckdb and none of the
    modules a release never uses."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.cli", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    payload = json.loads((tmp_path / "cli.json").read_text())
    assert payload["m"] == 10**4
    labels = {"release", "release_adaptive", "release_frozen", "store_query", "help", "python"}
    assert set(payload["seconds"]) == labels
    assert all(len(values) == 1 for values in payload["seconds"].values())
    assert set(payload["cpu_seconds"]) == labels
    assert payload["store"] == "duckdb" and len(payload["load_averages"]) == 2
    assert all(0 < cpu for (cpu,) in payload["cpu_seconds"].values())
    packages = set(payload["release_imports"]["packages"])
    assert {"duckdb", "numpy", "topk_middleware", "adapters", "frontends"} <= packages
    assert not packages & {"scipy", "sqlalchemy", "psycopg", "polars", "pyarrow", "matplotlib"}
