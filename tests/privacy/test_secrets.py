"""No secret in any message, output or statement text (DESIGN invariant 12).

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
    f"mysql+pymysql://root:p@ss:{SECRET}@127.0.0.1:1/x",  # an @ and a : in the password
    f"postgresql://bob:p@ss:{SECRET}@127.0.0.1:1/x",
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


def statements_mariadb_saw(engine: sa.Engine, names: list[str], run: Any) -> list[str]:
    """Run `run()` with MariaDB's general query log written to its table, and return the text of
    every statement the server received that names one of `names` (the test's own tables: other
    sessions on the shared server are left out). The log settings are restored after."""
    with engine.connect() as admin:
        saved = admin.exec_driver_sql("SELECT @@GLOBAL.general_log, @@GLOBAL.log_output").one()
        admin.exec_driver_sql("SET GLOBAL log_output = 'TABLE'")
        admin.exec_driver_sql("SET GLOBAL general_log = 'ON'")
        started = admin.exec_driver_sql("SELECT NOW(6)").scalar_one()
        try:
            run()
        finally:
            admin.exec_driver_sql(f"SET GLOBAL general_log = {int(saved[0])}")
            admin.exec_driver_sql("SET GLOBAL log_output = %s", (saved[1],))
        texts = [
            row[0].decode() if isinstance(row[0], bytes) else str(row[0])
            for row in admin.exec_driver_sql(
                "SELECT argument FROM mysql.general_log WHERE event_time >= %s "
                "AND command_type IN ('Query', 'Execute')",
                (started,),
            )
        ]
    return [t for t in texts if any(name in t for name in names)]


# MariaDB's general log is one setting of the whole server: a second worker restoring it while
# this test reads it would leave this one an empty log, so both modes run on one worker.
@pytest.mark.xdist_group("mariadb-general-log")
@pytest.mark.parametrize("mode", ["copy", "live"])
def test_mariadb_oblivious_release_sends_no_drawn_position(
    mode: str,
    make_sqlalchemy_mariadb_source: Any,
    make_sqlalchemy_live_mariadb_source: Any,
    sqlalchemy_mariadb_engine: sa.Engine,
) -> None:
    """pymysql writes every parameter into the statement text, which the server's general log
    (and its process list) shows. An oblivious release there must not send the positions of the
    largest noises: method="auto" reads the whole table instead (m rows), and no statement the
    server saw carries a list of positions (an IN list, as the fixed-depth random read sends) or
    the top score (a keyset page would); method="threshold" is refused before any statement."""
    m = 3000
    scores = np.floor(1e4 / np.arange(1, m + 1))
    make = make_sqlalchemy_mariadb_source if mode == "copy" else make_sqlalchemy_live_mariadb_source
    source = make(scores, None)
    names = [source.table_name]
    names += [n for n in (getattr(source, "rank_table_name", None),) if n and mode == "copy"]
    got: list[Any] = []
    texts = statements_mariadb_saw(
        sqlalchemy_mariadb_engine,
        names,
        lambda: got.append(private_top_k(source, 3, 1.0, oblivious=True, seed=4)),
    )
    result = got[0]
    assert result.diagnostics.plan["full_read"] and len(result.items) == 3
    assert texts and any("SELECT" in t.upper() for t in texts)  # the log did see the reads
    for text in texts:
        assert not re.search(r"\bIN\s*\(\s*\d+\s*,\s*\d+", text, re.IGNORECASE), text[:200]
        assert "10000" not in text, text[:200]  # the top score (1e4 / 1)
    errors: list[Exception] = []

    def refused_run() -> None:
        try:
            private_top_k(source, 3, 1.0, method="threshold", oblivious=True, seed=4)
        except ValueError as error:
            errors.append(error)

    refused = statements_mariadb_saw(sqlalchemy_mariadb_engine, names, refused_run)
    assert len(errors) == 1 and "statement text" in str(errors[0]) and refused == []
