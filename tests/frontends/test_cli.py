"""`topk-middleware release | prepare | check | budget` on every kind of store URL, on the real
stores: a DuckDB file, PostgreSQL through psycopg (postgresql://), and SQLAlchemy URLs (SQLite,
MariaDB, postgresql+psycopg://), in copy and live mode where the store has it.

Most runs go through `main(argv)` with captured output; the exit-code and no-traceback checks run
the console entry point as a subprocess (`python -m frontends`), as a user would.

The table holds m = 300 items with ids 10000 + 7 i (never positions) and distinct scores 1000
apart; with epsilon = 30 and k = 3 the Gumbel noise has scale k / epsilon = 0.1, so the release
is the true top-3 except with probability below exp(-1000 / 0.1): an item of the table other than
the top three, a wrong id column or a stale copy would fail the equality.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import duckdb
import numpy as np
import pytest
import sqlalchemy as sa

from frontends.cli import (
    EXIT_BUDGET,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    elapsed_progress,
    main,
    run_reporting_errors,
)
from topk_middleware import calibrate
from topk_middleware.mechanisms.oblivious import oblivious_depth, oblivious_guarantee
from topk_middleware.privacy import PrivacyGuarantee

M, K, EPSILON = 300, 3, 30.0
# epsilon 30 makes the oblivious guarantee's (1 + e^eps) delta_pad vacuous: adaptive releases
ADAPTIVE = ("--epsilon", EPSILON, "--adaptive")
IDS = 10_000 + 7 * np.arange(M)
SCORES = np.random.default_rng(5).permutation(M) * 1000
TOP = [int(i) for i in IDS[np.argsort(-SCORES)[:K]]]
LOWEST = int(IDS[np.argmin(SCORES)])
RELEASE_KEYS = {"items", "ranked", "bottom", "guarantee"}


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `topk-middleware argv` run in this process."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as stop:  # argparse's own errors
        code = int(stop.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def run_process(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m frontends argv` as a separate process (this worktree's code first)."""
    root = Path(__file__).resolve().parents[2]
    paths = [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.run(
        [sys.executable, "-m", "frontends", *[str(a) for a in argv]],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=env,
    )


# ----- the stores -----------------------------------------------------------------------------
@dataclass
class Store:
    """A table of counts (item BIGINT, votes BIGINT) behind a URL, and a writer for it."""

    url: str
    table: str  # as --table takes it: NAME or SCHEMA.NAME
    mode: str
    set_score: Callable[[int, int], None]
    options: tuple[str, ...] = ()  # more table options (--frozen)

    def args(self, *more: Any) -> list[str]:
        return [
            self.url,
            *self.options,
            "--table",
            self.table,
            "--id",
            "item",
            "--score",
            "votes",
            "--mode",
            self.mode,
            *[str(a) for a in more],
        ]


def postgres_uri(conninfo: str) -> str:
    """A postgresql:// URI for a libpq connection string (TOPK_PG_DSN)."""
    if conninfo.startswith(("postgresql://", "postgres://")):
        return conninfo
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(conninfo)
    user = params.pop("user", None) or os.environ.get("PGUSER", "root")
    password = params.pop("password", None)
    host = params.pop("host", "")
    port = params.pop("port", "5432")
    dbname = params.pop("dbname", user)
    auth = quote(user, safe="") + ("" if password is None else ":" + quote(password, safe=""))
    if host.startswith("/"):  # a socket directory goes in the query
        params["host"] = host
        host = ""
    query = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in params.items())
    return f"postgresql://{auth}@{host}:{port}/{dbname}" + (f"?{query}" if query else "")


def _sqlalchemy_store(
    engine: sa.Engine, url: str, schema: str | None, mode: str
) -> Iterator[Store]:
    name = f"cli_{uuid.uuid4().hex[:10]}"
    table = sa.Table(
        name,
        sa.MetaData(),
        sa.Column("item", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("votes", sa.BigInteger, nullable=False),
        schema=schema,
    )
    with engine.begin() as conn:
        table.create(conn)
        conn.execute(
            table.insert(),
            [{"item": int(i), "votes": int(s)} for i, s in zip(IDS, SCORES, strict=True)],
        )

    def set_score(item: int, score: int) -> None:
        with engine.begin() as conn:
            conn.execute(table.update().where(table.c.item == item).values(votes=score))

    yield Store(url, name if schema is None else f"{schema}.{name}", mode, set_score)
    # Drop the table and everything prepare() made beside it (rank, runs, position tables).
    with engine.begin() as conn:
        inspector = sa.inspect(conn)
        for other in inspector.get_table_names(schema=schema):
            if other.startswith(name):
                sa.Table(other, sa.MetaData(), schema=schema).drop(conn)


@pytest.fixture
def duckdb_store(tmp_path: Path) -> Store:
    path = tmp_path / "votes.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute('CREATE SCHEMA s; CREATE TABLE s.votes ("item" BIGINT, "votes" BIGINT)')
        con.executemany(
            "INSERT INTO s.votes VALUES (?, ?)",
            list(zip(IDS.tolist(), SCORES.tolist(), strict=True)),
        )

    def set_score(item: int, score: int) -> None:
        with duckdb.connect(str(path)) as con:
            con.execute("UPDATE s.votes SET votes = ? WHERE item = ?", [score, item])

    return Store(str(path), "s.votes", "copy", set_score)


@pytest.fixture
def sqlite_file(tmp_path: Path) -> Path:
    return tmp_path / "votes.sqlite"


STORES = [
    ("duckdb", "copy"),
    ("postgres", "copy"),
    ("postgres", "live"),
    ("sqlite", "copy"),
    ("sqlite", "live"),
    ("mariadb", "copy"),
    ("mariadb", "live"),
    ("sqlalchemy-postgres", "copy"),
]


@pytest.fixture(params=STORES, ids=["-".join(p) for p in STORES])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    kind, mode = request.param
    if kind == "duckdb":
        yield request.getfixturevalue("duckdb_store")
        return
    if kind == "sqlite":
        path = tmp_path / "votes.sqlite"
        engine = sa.create_engine(f"sqlite:///{path}")
        url, schema = f"sqlite:///{path}", None
    elif kind == "mariadb":
        engine = request.getfixturevalue("sqlalchemy_mariadb_engine")
        url, schema = engine.url.render_as_string(hide_password=False), engine.url.database
    else:
        uri = postgres_uri(request.getfixturevalue("pg_conninfo"))
        schema = request.getfixturevalue("pg_schema")
        engine = sa.create_engine(uri.replace("postgresql://", "postgresql+psycopg://", 1))
        url = uri if kind == "postgres" else uri.replace("postgresql://", "postgresql+psycopg://")
    yield from _sqlalchemy_store(engine, url, schema, mode)
    if kind != "mariadb":
        engine.dispose()


# ----- every command on every store ------------------------------------------------------------
def test_prepare_check_release_and_budget_on_every_store(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if store.url.endswith(".duckdb"):  # DuckDB's runs read the copy of a frozen table only
        store = dataclasses.replace(store, options=("--frozen",))
    ledger = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    code, out, err = run(
        ["budget", "--ledger", ledger, "--principal", "ana", "--grant", 2 * EPSILON, "--json"],
        capsys,
    )
    assert (code, err) == (EXIT_OK, "")
    assert json.loads(out) == {
        "principal": "ana",
        "total": {"epsilon": 2 * EPSILON, "delta": 0.0},
        "spent": {"epsilon": 0.0, "delta": 0.0, "rule": "nothing released"},
        "releases": 0,
    }
    charged = ["--ledger", ledger, "--principal", "ana"]

    # Before prepare: refused, saying to prepare, and nothing charged.
    code, out, err = run(["release", *store.args("--k", K, *ADAPTIVE, *charged)], capsys)
    assert code == EXIT_FAILED and out == ""
    assert "prepare" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert json.loads(run(["budget", *charged, "--json"], capsys)[1])["releases"] == 0

    code, out, _ = run(["check", *store.args("--json", "--stale")], capsys)
    assert code == EXIT_OK and json.loads(out)["full_scan"] is True
    if store.mode == "copy":
        assert (json.loads(out)["prepared"], json.loads(out)["stale"]) == (False, True)

    code, out, err = run(["prepare", *store.args("--json")], capsys)
    assert (code, err) == (EXIT_OK, "")
    prepared = json.loads(out)
    assert prepared["full_scan"] is False and prepared["mode"] == store.mode
    assert {p["access"] for p in prepared["paths"]} >= {"sorted", "random by id"}

    code, out, err = run(["check", *store.args("--json", "--stale")], capsys)
    assert (code, err) == (EXIT_OK, "")
    checked = json.loads(out)
    assert checked["full_scan"] is False and checked["stale"] is False
    assert checked["prepared"] is (True if store.mode == "copy" else None)

    # The release, charged to ana: only items and guarantee on stdout, nothing on stderr.
    code, out, err = run(["release", *store.args("--k", K, *ADAPTIVE, "--json", *charged)], capsys)
    assert (code, err) == (EXIT_OK, "")
    release = json.loads(out)
    assert set(release) == RELEASE_KEYS
    assert release["items"] == TOP and release["ranked"] is True and release["bottom"] is False
    assert PrivacyGuarantee(**release["guarantee"]) == calibrate("gumbel", K, M, EPSILON, 0.0)
    spent = json.loads(run(["budget", *charged, "--json"], capsys)[1])
    assert spent["releases"] == 1 and spent["spent"]["epsilon"] == pytest.approx(EPSILON)

    # The total is 2 epsilon: a second release fits exactly, a third is refused.
    assert (
        run(["release", *store.args("--k", K, *ADAPTIVE, "--json", *charged)], capsys)[0] == EXIT_OK
    )
    code, out, err = run(["release", *store.args("--k", K, *ADAPTIVE, "--json", *charged)], capsys)
    assert code == EXIT_BUDGET and out == ""
    assert "budget exceeded" in err and "nothing was read or released" in err
    assert json.loads(run(["budget", *charged, "--json"], capsys)[1])["releases"] == 2

    # The readable table, and the diagnostics apart (stderr) only when asked for.
    code, out, err = run(
        ["release", *store.args("--k", K, *ADAPTIVE, "--diagnostics", "--explain")], capsys
    )
    assert code == EXIT_OK
    assert [int(line.split()[1]) for line in out.splitlines() if line.strip()[:1].isdigit()] == TOP
    assert "(30, 0)-DP" in out and "Fact 3.3" in out
    assert "accesses" not in out and "Operator diagnostics" in err and "accesses" in err


def test_writes_are_seen_at_once_in_copy_and_live_mode(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["prepare", *store.args()], capsys)[0] == EXIT_OK
    store.set_score(LOWEST, 10**9)  # the last item becomes the first
    release = ["release", *store.args("--k", K, *ADAPTIVE, "--json")]
    new_top = [LOWEST, *TOP[:-1]]
    if store.mode == "copy":  # the copy is stale, the release is not (docs/freshness.md)
        code, out, _ = run(["check", *store.args("--stale", "--json")], capsys)
        assert code == EXIT_OK and json.loads(out)["stale"] is True
        assert json.loads(run(release, capsys)[1])["items"] == new_top
        code, out, err = run(["prepare", *store.args("--refresh")], capsys)
        assert code == EXIT_OK and out.startswith("refreshed") and err == ""
        assert (
            json.loads(run(["check", *store.args("--stale", "--json")], capsys)[1])["stale"]
            is False
        )
    assert json.loads(run(release, capsys)[1])["items"] == new_top


def test_release_methods_and_laplace(
    duckdb_store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    # oneshot needs no preparation (a full read); threshold does.
    code, out, _ = run(
        [
            "release",
            *duckdb_store.args(
                "--k", K, "--epsilon", EPSILON, "--method", "oneshot", "--adaptive", "--json"
            ),
        ],
        capsys,
    )
    assert code == EXIT_OK and json.loads(out)["items"] == TOP
    assert run(["prepare", *duckdb_store.args()], capsys)[0] == EXIT_OK
    code, out, _ = run(
        [
            "release",
            *duckdb_store.args(
                "--k", K, "--epsilon", EPSILON, "--noise", "laplace", "--adaptive", "--json"
            ),
        ],
        capsys,
    )
    release = json.loads(out)
    assert code == EXIT_OK and release["ranked"] is False
    assert release["items"] == sorted(TOP)  # a set, in a data-independent order (by id)
    assert PrivacyGuarantee(**release["guarantee"]) == calibrate("laplace", K, M, EPSILON, 0.0)
    # --json --diagnostics: the release alone on stdout, the diagnostics as JSON on stderr.
    code, out, err = run(
        ["release", *duckdb_store.args("--k", K, "--epsilon", EPSILON, "--json", "--diagnostics")],
        capsys,
    )
    assert code == EXIT_OK and set(json.loads(out)) == RELEASE_KEYS
    diagnostics = json.loads(err)["diagnostics"]
    assert diagnostics["m"] == M and diagnostics["accesses"]["sorted"] > 0


def test_release_is_oblivious_by_default(
    duckdb_store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --adaptive: the oblivious guarantee (eps, (1 + e^eps) 1e-9), charged as such (a
    pure budget refuses it), a fixed read (2d rows); --method oneshot
    (a data-dependent in-store cut) needs --adaptive; a bad --delta-pad is a usage error."""
    assert run(["prepare", *duckdb_store.args()], capsys)[0] == EXIT_OK
    ledger = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    pure, approx = (["--ledger", ledger, "--principal", who] for who in ("pure", "approx"))
    assert run(["budget", *pure, "--grant", 5], capsys)[0] == EXIT_OK
    assert run(["budget", *approx, "--grant", 5, "--grant-delta", 1e-6], capsys)[0] == EXIT_OK
    code, out, err = run(["release", *duckdb_store.args("--k", K, "--epsilon", 1, *pure)], capsys)
    assert code == EXIT_BUDGET and out == ""
    release = ["release", *duckdb_store.args("--k", K, "--epsilon", 1, "--json")]
    code, out, err = run([*release, *approx, "--diagnostics"], capsys)
    assert code == EXIT_OK and json.loads(out)["items"] == TOP
    guarantee = PrivacyGuarantee(**json.loads(out)["guarantee"])
    assert guarantee == oblivious_guarantee(calibrate("gumbel", K, M, 1.0, 0.0), 1e-9)
    plan = json.loads(err)["diagnostics"]["plan"]
    depth = oblivious_depth(M, K, 1e-9)
    assert plan["oblivious"] is True and plan["depth"] == depth and not plan["full_read"]
    assert json.loads(err)["diagnostics"]["accesses"]["rows_fetched"] == 2 * depth
    code, _, err = run([*release, "--method", "oneshot"], capsys)
    assert code == EXIT_USAGE and "--adaptive" in err
    code, _, err = run([*release, "--delta-pad", 0], capsys)
    assert code == EXIT_USAGE and "delta_pad must be in (0, 1)" in err


def test_duckdb_url_form_and_schema_option(
    duckdb_store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["prepare", *duckdb_store.args()], capsys)[0] == EXIT_OK
    url = f"duckdb:///{duckdb_store.url}"  # an absolute path: duckdb:////tmp/...
    code, out, _ = run(
        [
            "release",
            url,
            "--schema",
            "s",
            "--table",
            "votes",
            "--id",
            "item",
            "--score",
            "votes",
            "--k",
            K,
            "--epsilon",
            EPSILON,
            "--json",
        ],
        capsys,
    )
    assert code == EXIT_OK and json.loads(out)["items"] == TOP


# ----- ledgers of every kind -------------------------------------------------------------------
@pytest.fixture(params=["sqlite", "duckdb", "postgres"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    if request.param == "duckdb":
        return str(tmp_path / "ledger.duckdb")
    uri = postgres_uri(request.getfixturevalue("pg_conninfo"))
    schema = f"topk_cli_ledger_{uuid.uuid4().hex[:8]}"
    import psycopg

    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    request.addfinalizer(lambda: _drop_schema(uri, schema))
    separator = "&" if "?" in uri else "?"
    return f"{uri}{separator}options={quote(f'-csearch_path={schema}', safe='')}"


def _drop_schema(uri: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def test_budget_grant_charge_and_refusal_on_every_ledger(
    ledger_url: str, duckdb_store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["prepare", *duckdb_store.args()], capsys)[0] == EXIT_OK
    who = ["--ledger", ledger_url, "--principal", "bo"]
    code, out, err = run(["budget", *who, "--grant", 1.0, "--grant-delta", 1e-6], capsys)
    assert code == EXIT_OK and "total (1, 1e-06)-DP" in out and "0 release(s)" in out
    # Granting the same total again changes nothing; another total is refused.
    assert run(["budget", *who, "--grant", 1.0, "--grant-delta", 1e-6], capsys)[0] == EXIT_OK
    code, _, err = run(["budget", *who, "--grant", 5.0], capsys)
    assert code == EXIT_FAILED and "has the total" in err

    release = ["release", *duckdb_store.args("--k", K, "--epsilon", 0.6, "--json", *who)]
    code, out, _ = run(release, capsys)
    assert code == EXIT_OK and len(json.loads(out)["items"]) == K
    code, out, err = run(release, capsys)  # 0.6 + 0.6 > 1 by every composition rule here
    assert code == EXIT_BUDGET and out == "" and "budget exceeded" in err
    shown = json.loads(run(["budget", *who, "--json"], capsys)[1])
    assert shown["releases"] == 1 and shown["spent"]["epsilon"] == pytest.approx(0.6)
    assert shown["total"] == {"epsilon": 1.0, "delta": 1e-6}

    # A principal without a budget is refused before the table is read.
    code, out, err = run(
        [
            "release",
            *duckdb_store.args(
                "--k", K, "--epsilon", 0.1, "--ledger", ledger_url, "--principal", "eve"
            ),
        ],
        capsys,
    )
    assert code == EXIT_FAILED and out == "" and "'eve' has no budget" in err


# ----- refusals: exit codes, one line, no traceback, nothing left behind -----------------------
def _files(root: Path) -> set[Path]:
    return set(root.rglob("*"))


BAD_ARGUMENTS: list[tuple[list[str], str]] = [
    (
        ["release", "{tmp}/missing.duckdb", "--table", "t", "--k", "3", "--epsilon", "1"],
        "no DuckDB file",
    ),
    (
        ["release", "duckdb:///{tmp}/missing.db", "--table", "t", "--k", "3", "--epsilon", "1"],
        "no DuckDB file",
    ),
    (["prepare", "{tmp}/missing.duckdb", "--table", "t"], "no DuckDB file"),
    (["check", "sqlite:///{tmp}/missing.sqlite", "--table", "t"], "no SQLite file"),
    (
        ["release", "sqlite://", "--table", "t", "--k", "3", "--epsilon", "1"],
        "in-memory SQLite",
    ),
    (
        ["release", "votes.csv", "--table", "t", "--k", "3", "--epsilon", "1"],
        "is not a store URL",
    ),
    (
        ["release", "nosuchdialect://x/y", "--table", "t", "--k", "3", "--epsilon", "1"],
        "cannot load a driver",
    ),
    (["release", "{db}", "--table", "votes", "--k", "0", "--epsilon", "1"], "k must be >= 1"),
    (
        ["release", "{db}", "--table", "votes", "--k", "3", "--epsilon", "0"],
        "epsilon must be finite and > 0",
    ),
    (
        ["release", "{db}", "--table", "votes", "--k", "3", "--epsilon", "nan"],
        "epsilon must be finite and > 0",
    ),
    (
        ["release", "{db}", "--table", "votes", "--k", "3", "--epsilon", "inf"],
        "epsilon must be finite and > 0",
    ),
    (
        ["release", "{db}", "--table", "votes", "--k", "3", "--epsilon", "1", "--delta", "1"],
        "delta must be in [0, 1)",
    ),
    (
        ["release", "{db}", "--table", "votes", "--k", "ten", "--epsilon", "1"],
        "invalid int value",
    ),
    (["release", "{db}", "--table", "votes", "--k", "3"], "--epsilon"),
    (
        [
            "release",
            "{db}",
            "--table",
            "votes",
            "--k",
            "3",
            "--epsilon",
            "1",
            "--noise",
            "normal",
        ],
        "invalid choice",
    ),
    (
        [
            "release",
            "{db}",
            "--table",
            "votes",
            "--k",
            "3",
            "--epsilon",
            "1",
            "--principal",
            "a",
        ],
        "--ledger and --principal go together",
    ),
    (
        ["release", "{db}", "--table", "votes", "--k", "3", "--epsilon", "1", "--mode", "live"],
        "DuckDB has no live mode",
    ),
    (
        [
            "release",
            "{db}",
            "--table",
            "votes",
            "--k",
            "3",
            "--epsilon",
            "1",
            "--ledger",
            "{tmp}/l.duckdb",
            "--principal",
            "a",
        ],
        "no ledger file",
    ),
    (
        ["budget", "--ledger", "sqlite:///{tmp}/ledger.sqlite", "--principal", "a"],
        "no ledger file",
    ),
    (
        [
            "budget",
            "--ledger",
            "sqlite:///{tmp}/ledger.sqlite",
            "--principal",
            "a",
            "--grant",
            "-1",
        ],
        "budget epsilon must be finite and > 0",
    ),
    (
        ["prepare", "{db}", "--table", "votes", "--mode", "live", "--refresh"],
        "--refresh is for copy mode",
    ),
    (
        ["release", "{db}", "--table", ".votes", "--k", "3", "--epsilon", "1"],
        "is not a table name",
    ),
]


def _bad_arguments_setup(tmp_path: Path, argv: list[str]) -> tuple[list[str], set[Path]]:
    """A DuckDB file with a table `votes` under tmp_path/data, argv with its paths filled in,
    and the files there before the command."""
    db = tmp_path / "data" / "votes.duckdb"
    db.parent.mkdir()
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE votes AS SELECT range AS id, range AS score FROM range(10)")
    return [a.format(tmp=tmp_path, db=db) for a in argv], _files(tmp_path)


@pytest.mark.parametrize(("argv", "message"), BAD_ARGUMENTS)
def test_bad_arguments_exit_2_without_traceback_or_file(
    tmp_path: Path,
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each refusal through the console entry point's main(): exit 2, one error line in the
    project's words, nothing on stdout and no file made (an exception would fail the test)."""
    argv, before = _bad_arguments_setup(tmp_path, argv)
    monkeypatch.chdir(tmp_path)
    code, out, err = run(argv, capsys)
    assert code == EXIT_USAGE, err
    assert message in err and "error:" in err
    assert "Traceback" not in err + out and out == ""
    assert _files(tmp_path) == before  # no empty DuckDB, SQLite or ledger file


@pytest.mark.parametrize(
    ("argv", "message"),
    [BAD_ARGUMENTS[0], BAD_ARGUMENTS[3], BAD_ARGUMENTS[-1]],
    ids=["missing DuckDB file", "missing SQLite file", "bad table name"],
)
def test_bad_arguments_exit_2_without_traceback_as_a_process(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    """Refusals as a user meets them: `python -m frontends` in a process of its own exits 2 with
    no traceback on stderr and leaves no file (a file missing, a URL's file missing, a name)."""
    argv, before = _bad_arguments_setup(tmp_path, argv)
    done = run_process(argv, cwd=tmp_path)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert message in done.stderr and "error:" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout and done.stdout == ""
    assert _files(tmp_path) == before


def test_store_failures_exit_1_in_one_line(
    tmp_path: Path, pg_conninfo: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "votes.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE votes AS SELECT range AS id, range * 10 AS score FROM range(10)")
    cases = [
        (
            [
                "release",
                "postgresql://root@127.0.0.1:1/test",
                "--table",
                "t",
                "--k",
                3,
                "--epsilon",
                1,
            ],
            "cannot connect to PostgreSQL at",
        ),
        (
            [
                "release",
                "mysql+pymysql://root@127.0.0.1:1/test",
                "--table",
                "t",
                "--k",
                3,
                "--epsilon",
                1,
            ],
            "cannot connect to mysql+pymysql",
        ),
        (
            [
                "release",
                "postgresql://u:secret@127.0.0.1:1/test",
                "--table",
                "t",
                "--k",
                3,
                "--epsilon",
                1,
            ],
            "postgresql://u:***@",
        ),
        (
            [
                "release",
                postgres_uri(pg_conninfo),
                "--table",
                "no_such_table_here",
                "--k",
                3,
                "--epsilon",
                1,
            ],
            "does not exist",
        ),
        (
            ["release", db, "--table", "nope", "--k", 3, "--epsilon", 1],
            "DuckDB table 'nope' does not exist",
        ),
        (
            ["release", db, "--table", "votes", "--score", "votez", "--k", 3, "--epsilon", 1],
            "has no column 'votez'",
        ),
        (
            [
                "release",
                db,
                "--table",
                "votes",
                "--k",
                11,
                "--epsilon",
                1,
                "--method",
                "oneshot_full_read",
            ],
            "k = 11 exceeds the number of items m = 10",
        ),
        (  # a frozen DuckDB table's runs read the copy: none yet
            ["release", db, "--table", "votes", "--frozen", "--k", 3, "--epsilon", 1],
            "is not prepared",
        ),
    ]
    for argv, message in cases:
        code, out, err = run(argv, capsys)
        assert code == EXIT_FAILED, (argv, err)
        assert message in err and out == "", (argv, err)
        lines = err.strip().splitlines()  # one error line, after any warning lines
        assert [line for line in lines if " error: " in line] == lines[-1:]
        assert all(line.startswith("topk-middleware release: ") for line in lines)
        assert "Traceback" not in err and "secret" not in err
    done = run_process(["release", db, "--table", "nope", "--k", 3, "--epsilon", 1])
    assert done.returncode == EXIT_FAILED and "Traceback" not in done.stderr


def test_budget_exceeded_as_a_process(tmp_path: Path, duckdb_store: Store) -> None:
    """Exit code 3 from the console entry point, the release not printed."""
    assert run_process(["prepare", *duckdb_store.args()]).returncode == EXIT_OK
    ledger = tmp_path / "ledger.duckdb"
    who = ["--ledger", ledger, "--principal", "cy"]
    assert run_process(["budget", *who, "--grant", 1]).returncode == EXIT_OK
    done = run_process(["release", *duckdb_store.args("--k", K, "--epsilon", 2, *who)])
    assert done.returncode == EXIT_BUDGET and done.stdout == ""
    assert "budget exceeded" in done.stderr and "Traceback" not in done.stderr
    shown = json.loads(run_process(["budget", *who, "--json"]).stdout)
    assert shown["releases"] == 0


def test_progress_indicator_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shown (with the step's name) when stderr is a terminal; silent otherwise or when off."""
    import io
    import time

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for enabled, shown in ((True, True), (False, False)):
        terminal = Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        with elapsed_progress("preparing the table", enabled=enabled):
            time.sleep(0.6)
        assert ("preparing the table" in terminal.getvalue()) is shown
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", piped)
    with elapsed_progress("preparing the table"):
        time.sleep(0.6)
    assert piped.getvalue() == ""


def test_release_with_sensitivity_and_counts(
    duckdb_store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """--sensitivity scales the noise and is stated; --with-counts adds a count column and the
    95% half-width (JSON: counts aligned with items, count_error)."""
    base = duckdb_store.args("--k", K, "--epsilon", EPSILON, "--method", "oneshot", "--adaptive")
    code, out, _ = run(["release", *base, "--sensitivity", 4, "--with-counts", "--json"], capsys)
    release = json.loads(out)
    assert code == EXIT_OK and release["guarantee"]["sensitivity"] == 4
    assert release["guarantee"]["scale"] == pytest.approx(4 * (1 - 0.5) ** -1 * K / EPSILON)
    assert len(release["counts"]) == K and isinstance(release["count_error"], int)
    code, out, _ = run(["release", *base, "--sensitivity", 4, "--with-counts"], capsys)
    assert code == EXIT_OK and "assumes each client changes each count by at most 4" in out
    assert "count" in out.splitlines()[2] and f"+/- {release['count_error']}" in out
    code, _, err = run(["release", *base, "--sensitivity", 0], capsys)
    assert code == 2 and "--sensitivity must be finite and > 0" in err


def test_warnings_are_the_commands_own(capsys: pytest.CaptureFixture[str]) -> None:
    """A warning the command raises is one stderr line; a ResourceWarning (a connection that
    other code dropped unclosed, reported when the garbage collector runs mid-command) is not."""
    import argparse
    import warnings

    def handler(args: argparse.Namespace) -> int:
        warnings.warn("a connection was dropped open", ResourceWarning, stacklevel=1)
        warnings.warn("the table has no rank table", UserWarning, stacklevel=1)
        return EXIT_OK

    code = run_reporting_errors(handler, argparse.Namespace(command="release"))
    err = capsys.readouterr().err
    assert code == EXIT_OK
    assert err == "topk-middleware release: warning: the table has no rank table\n"
