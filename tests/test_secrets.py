"""No secret in any message, output or statement text (issue 20, point 5; DESIGN invariant 12).

What would fail: a password given in a URL (user:password@, ?password=) or a key=value DSN
(password=..., password='...' or password="...") quoted in a CLI error or in install-sql's
output; the in-store one-shot's key or its exceedances (positions and noises) written into the
SQL text the server shows every role in pg_stat_activity; a MariaDB table taking the in-store
path, where pymysql interpolates the key into the text on the client.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import numpy as np
import psycopg
import pytest
import sqlalchemy as sa

from frontends import cli
from topk_middleware import private_top_k
from topk_middleware.access import offers_in_store
from topk_middleware.keyed_noise import KeyedNoise
from topk_middleware.validation import mask_secrets

# The schema topk and its one settings row are one per database: one worker for all its tests.
pytestmark = pytest.mark.xdist_group("topk-schema")

SECRET = "hunter2Sekret"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("postgresql://bob:hunter2Sekret@db:5432/x", "postgresql://bob:***@db:5432/x"),
        (
            "mysql+pymysql://r:hunter2Sekret@h/x?charset=utf8",
            "mysql+pymysql://r:***@h/x?charset=utf8",
        ),
        ("postgresql://bob:p@ss:hunter2Sekret@db/x", "postgresql://bob:***@db/x"),
        (
            "postgresql://bob@db/x?password=hunter2Sekret: failed",
            "postgresql://bob@db/x?password=***: failed",
        ),
        ("sqlite:///f.db?a=1&password=hunter2Sekret&b=2", "sqlite:///f.db?a=1&password=***&b=2"),
        ("host=db password=hunter2Sekret user=bob", "host=db password=*** user=bob"),
        ("host=db password='hun ter2Sekret\\' x' user=bob", "host=db password=*** user=bob"),
        ("host=db PASSWORD = hunter2Sekret", "host=db PASSWORD = ***"),
        ('host=db password="hunter2Sekret" user=bob', "host=db password=*** user=bob"),
        ('host=db password="hun ter2\\"Sekret" user=bob', "host=db password=*** user=bob"),
        ('dsn "host=db password=hunter2Sekret"', 'dsn "host=db password=***"'),
    ],
)
def test_mask_secrets(text: str, shown: str) -> None:
    assert mask_secrets(text) == shown


URLS = [
    f"postgresql://bob:{SECRET}@127.0.0.1:1/x",
    f"postgresql://bob@127.0.0.1:1/x?password={SECRET}",
    f"mysql+pymysql://root:{SECRET}@127.0.0.1:1/x",
    f"mysql+pymysql://root@127.0.0.1:1/x?password={SECRET}",
    f"sqlite:///no-such-file.sqlite?password={SECRET}",
    f"host=127.0.0.1 port=1 password={SECRET}",
    f'host=127.0.0.1 port=1 password="{SECRET}"',
]


@pytest.mark.parametrize("url", URLS)
def test_cli_errors_never_show_a_password(url: str, capsys: Any) -> None:
    """release (store and ledger), budget and install-sql, each failing on an unreachable or
    malformed store: the error names the store with its password masked."""
    commands = [
        ["release", url, "--table", "t", "--k", "1", "--epsilon", "1"],
        ["release", "x.duckdb", "--table", "t", "--k", "1", "--epsilon", "1", "--ledger", url,
         "--principal", "a"],
        ["budget", "--ledger", url, "--principal", "a"],
        ["install-sql", "--dsn", url],
    ]  # fmt: skip
    for argv in commands:
        assert cli.main(argv) != 0
        out, err = capsys.readouterr()
        assert "error:" in err
        assert SECRET not in out + err, (argv, err)


def test_install_sql_prints_no_password(pg_conninfo: str, capsys: Any) -> None:
    """install-sql prints its ledger DSN: with a password in it (trust authentication accepts
    and ignores it here), the output masks it."""
    dsn = psycopg.conninfo.make_conninfo(pg_conninfo, password=SECRET)
    assert cli.main(["install-sql", "--dsn", dsn, "--ledger-dsn", dsn]) == 0
    out, err = capsys.readouterr()
    assert "ledger connection:" in out and "password=***" in out
    assert SECRET not in out + err


def statement_texts(engine: sa.Engine, run: Any) -> list[str]:
    """Run `run()`, and after each statement of `engine` read, from a second connection, the
    text pg_stat_activity shows every role for that backend (its last statement)."""
    seen: list[str] = []
    observer = psycopg.connect(str(engine.url.set(drivername="postgresql")), autocommit=True)
    lock = threading.Lock()

    def after(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        pid = conn.connection.driver_connection.info.backend_pid
        with lock:
            row = observer.execute(
                "SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]
            ).fetchone()
        seen.append(row[0])

    sa.event.listen(engine, "after_cursor_execute", after)
    try:
        run()
    finally:
        sa.event.remove(engine, "after_cursor_execute", after)
        observer.close()
    return seen


def test_in_store_oneshot_binds_key_and_exceedances(
    make_sqlalchemy_postgres_source: Any, sqlalchemy_postgres_engine: sa.Engine
) -> None:
    """The in-store one-shot on the SQLAlchemy PostgreSQL dialect: pg_stat_activity shows its
    statement with placeholders; neither the key nor any exceedance position or noise appears
    (the noises' repr, and every exceedance position as a number, are searched)."""
    scores = np.floor(1e4 / np.arange(1, 3001))
    source = make_sqlalchemy_postgres_source(scores, None)
    keyed = KeyedNoise.draw(np.random.default_rng(5), "gumbel", 2.0, len(scores), 2, exceedances=40)
    assert len(keyed.exceed_positions) > 10
    got: list[Any] = []

    def run() -> None:
        with source.snapshot():
            got.append(source.read_oneshot(keyed, 2))

    texts = statement_texts(sqlalchemy_postgres_engine, run)
    oneshot = [t for t in texts if "unnest" in t]
    assert len(oneshot) == 1 and len(got[0].positions) == 2
    text = oneshot[0]
    assert keyed.key not in text
    for z in keyed.exceed_noises.tolist():
        assert repr(z) not in text and f"{z:.6f}" not in text
    numbers = set(re.findall(r"\b\d{3,}\b", text))
    assert numbers.isdisjoint(str(p) for p in keyed.exceed_positions.tolist() if p >= 100)


def test_mariadb_takes_no_in_store_path(
    make_sqlalchemy_mariadb_source: Any, sqlalchemy_mariadb_engine: sa.Engine
) -> None:
    """pymysql interpolates parameters into the statement on the client, so a MariaDB table is
    no InStoreOneShot: method="oneshot" runs the full read, and no statement sent (text with its
    parameters, which pymysql interpolates) carries a 32-hex-digit key or any noise."""
    source = make_sqlalchemy_mariadb_source(np.arange(200, 0, -1).astype(float), None)
    assert not offers_in_store(source)
    sent: list[str] = []

    def before(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        sent.append(f"{statement} {parameters!r}")

    sa.event.listen(sqlalchemy_mariadb_engine, "before_cursor_execute", before)
    try:
        result = private_top_k(source, 3, 1.0, method="oneshot", seed=3)
    finally:
        sa.event.remove(sqlalchemy_mariadb_engine, "before_cursor_execute", before)
    assert result.diagnostics.plan["in_store"] is False
    assert len(result.items) == 3 and sent
    assert not any(re.search(r"[0-9a-f]{32}", s) or "sha2" in s.lower() for s in sent)
