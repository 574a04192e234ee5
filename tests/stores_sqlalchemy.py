"""Conformance stores: SQLAlchemyTable on SQLite, PostgreSQL, MariaDB and DuckDB.

Each `make_sqlalchemy_<dialect>_source` fixture returns `(scores, ids) -> SQLAlchemyTable`: it
creates a uniquely named table (id, score), fills it, runs prepare(), and drops the table, its
rank table and its runs table after the test. Each `make_sqlalchemy_live_<dialect>_source`
(SQLite, PostgreSQL, MariaDB) returns a table in mode='live' whose positions are the input
indexes (see _live_maker), and drops it with what its prepare() installed. Servers: PostgreSQL
at TOPK_PG_DSN (default "host=127.0.0.1 port=5432 dbname=test"), MariaDB at TOPK_MARIADB_URL
(default mysql+pymysql://root@127.0.0.1:3306/test). When one is unreachable the tests fail if CI
is set, else they are skipped with a message saying how to provide one. The session fixtures
`shared_sqlalchemy_<dialect>_source` and `shared_sqlalchemy_live_<dialect>_source` build one
table per distinct histogram for the whole session (tests/helpers.py shared_sources), for the
conformance suite's read-only tests.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from adapters.sqlalchemy import SQLAlchemyTable
from tests.helpers import RefreshAfterTheRun, shared_sources

DEFAULT_PG_DSN = "host=127.0.0.1 port=5432 dbname=test"
DEFAULT_MARIADB_URL = "mysql+pymysql://root@127.0.0.1:3306/test?charset=utf8mb4"

MakeSource = Callable[..., SQLAlchemyTable]


def postgres_url_and_args() -> tuple[str, dict[str, Any]]:
    """The SQLAlchemy URL (psycopg 3) and connect_args for the server at TOPK_PG_DSN."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(os.environ.get("TOPK_PG_DSN", DEFAULT_PG_DSN))
    params.setdefault("user", os.environ.get("PGUSER", "root"))
    return "postgresql+psycopg://", params


def require_reachable(engine: sa.Engine, what: str, how: str) -> sa.Engine:
    try:
        with engine.connect() as conn:
            conn.execute(sa.select(1))
    except sa.exc.DBAPIError as error:
        engine.dispose()
        message = f"{what} is unreachable ({error.orig}); {how}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return engine


@pytest.fixture(scope="session")
def sqlalchemy_sqlite_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sa.Engine]:
    path = tmp_path_factory.mktemp("sqlalchemy") / "topk.sqlite"
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        conn.exec_driver_sql("PRAGMA journal_mode=WAL")  # readers keep a snapshot, writers go on
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def sqlalchemy_postgres_engine() -> Iterator[sa.Engine]:
    url, args = postgres_url_and_args()
    engine = require_reachable(
        sa.create_engine(url, connect_args=args),
        f"PostgreSQL at TOPK_PG_DSN={os.environ.get('TOPK_PG_DSN', DEFAULT_PG_DSN)!r}",
        "set TOPK_PG_DSN to a libpq connection string of a server you may create tables on",
    )
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def sqlalchemy_mariadb_engine() -> Iterator[sa.Engine]:
    url = os.environ.get("TOPK_MARIADB_URL", DEFAULT_MARIADB_URL)
    engine = require_reachable(
        sa.create_engine(url),
        f"MariaDB at {url!r}",
        "set TOPK_MARIADB_URL to an SQLAlchemy URL (mysql+pymysql://...) of a server",
    )
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def sqlalchemy_duckdb_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sa.Engine]:
    path = tmp_path_factory.mktemp("sqlalchemy") / "topk.duckdb"
    engine = sa.create_engine(f"duckdb:///{path}")
    yield engine
    engine.dispose()


def unique_name(prefix: str = "topk_test") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def counts_rows(
    scores: Any, ids: Any = None, id_column: str = "id", score_column: str = "score"
) -> tuple[list[dict[str, Any]], bool, bool]:
    """(rows, integral scores?, text ids?) of a histogram, as create_counts_table writes them."""
    scores = np.asarray(scores)
    ids = np.arange(len(scores)) if ids is None else np.asarray(ids)
    integral = np.issubdtype(scores.dtype, np.integer) or bool(
        np.all(np.isfinite(scores)) and np.all(scores == np.round(scores))
    )
    text = not np.issubdtype(ids.dtype, np.integer)
    id_values = [str(v) for v in ids.tolist()] if text else ids.tolist()
    score_values = [int(v) for v in scores.tolist()] if integral else scores.tolist()
    rows = [{id_column: i, score_column: s} for i, s in zip(id_values, score_values, strict=True)]
    return rows, integral, text


def create_counts_table(
    engine: sa.Engine,
    name: str,
    scores: Any,
    ids: Any = None,
    id_column: str = "id",
    score_column: str = "score",
    *,
    text_type: Any = None,
    first_rows: int | None = None,
) -> sa.Table:
    """A table (id_column, score_column) holding the histogram: BIGINT or text ids
    (`text_type`, default VARCHAR(100)), BIGINT scores when they are all integers, else DOUBLE.
    With `first_rows`, only that many rows are written (the others come later)."""
    rows, integral, text = counts_rows(scores, ids, id_column, score_column)
    table = sa.Table(
        name,
        sa.MetaData(),
        sa.Column(id_column, (text_type or sa.String(100)) if text else sa.BigInteger),
        sa.Column(score_column, sa.BigInteger if integral else sa.Double),
    )
    with engine.begin() as conn:
        table.create(conn)
        if rows[:first_rows]:
            conn.execute(table.insert(), rows[:first_rows])
    return table


def drop_tables(engine: sa.Engine, names: list[str]) -> None:
    with engine.begin() as conn:
        for name in names:
            sa.Table(name, sa.MetaData()).drop(conn, checkfirst=True)


def _maker(engine: sa.Engine) -> Iterator[MakeSource]:
    created: list[str] = []
    sources: list[SQLAlchemyTable] = []

    def make(scores: Any, ids: Any = None, **options: Any) -> SQLAlchemyTable:
        name = unique_name()
        create_counts_table(engine, name, scores, ids)
        created.append(name)
        options.setdefault("frozen", True)  # tests of the copy (test_freshness.py: not frozen)
        source = SQLAlchemyTable(engine, name, id="id", score="score", **options)
        created.extend([source.rank_table_name, source.runs_table_name])
        sources.append(source)
        source.prepare()
        return source

    yield make
    for source in sources:  # its triggers and stamp too (the shared tables once unused)
        try:
            source.uninstall()
        except Exception:  # a test may have left the table broken on purpose
            pass
    drop_tables(engine, created)


def live_text_type(engine: sa.Engine) -> Any:
    """A text id column that mode='live' accepts: on MariaDB it must compare and sort by bytes."""
    if engine.dialect.name in ("mysql", "mariadb"):
        from sqlalchemy.dialects import mysql

        return mysql.VARCHAR(100, charset="utf8mb4", collation="utf8mb4_nopad_bin")
    return sa.String(100)


def position_order(source: SQLAlchemyTable) -> list[Any]:
    """The ids of a live table by position, read straight from its position table (which must
    hold exactly the positions 0..m-1)."""
    pos = sa.Table(
        source.position_table_name,  # type: ignore[attr-defined]
        sa.MetaData(),
        sa.Column("position"),
        sa.Column("id"),
    )
    with source.engine.connect() as conn:
        rows = conn.execute(sa.select(pos.c.position, pos.c.id).order_by(pos.c.position)).all()
    assert [r[0] for r in rows] == list(range(len(rows))), "positions are not 0..m-1"
    return [r[1] for r in rows]


def _live_maker(engine: sa.Engine) -> Iterator[MakeSource]:
    """Live tables whose positions are the input indexes: the table starts with the first row,
    prepare() installs the triggers, then the other rows are inserted in input order (each takes
    the next position), which the position table read back must show."""
    made: list[SQLAlchemyTable] = []
    created: list[str] = []

    def make(scores: Any, ids: Any = None, **options: Any) -> SQLAlchemyTable:
        name = unique_name()
        text_type = live_text_type(engine)
        table = create_counts_table(engine, name, scores, ids, text_type=text_type, first_rows=1)
        created.append(name)
        source = SQLAlchemyTable(engine, name, id="id", score="score", mode="live", **options)
        made.append(source)
        source.prepare()
        rows = counts_rows(scores, ids)[0]
        if rows[1:]:
            with engine.begin() as conn:
                conn.execute(table.insert(), rows[1:])
        want = [row["id"] for row in rows]
        assert position_order(source) == want, "inserts did not take positions in input order"
        return source

    yield make
    for source in made:
        source.uninstall()  # type: ignore[attr-defined]
    drop_tables(engine, created)


@pytest.fixture
def make_sqlalchemy_sqlite_source(sqlalchemy_sqlite_engine: sa.Engine) -> Iterator[MakeSource]:
    yield from _maker(sqlalchemy_sqlite_engine)


@pytest.fixture
def make_sqlalchemy_postgres_source(
    sqlalchemy_postgres_engine: sa.Engine,
) -> Iterator[MakeSource]:
    yield from _maker(sqlalchemy_postgres_engine)


@pytest.fixture
def make_sqlalchemy_mariadb_source(sqlalchemy_mariadb_engine: sa.Engine) -> Iterator[MakeSource]:
    yield from _maker(sqlalchemy_mariadb_engine)


@pytest.fixture
def make_sqlalchemy_duckdb_source(sqlalchemy_duckdb_engine: sa.Engine) -> Iterator[MakeSource]:
    yield from _maker(sqlalchemy_duckdb_engine)


def write_sqlalchemy_source(source: SQLAlchemyTable, item: Any, score: float) -> Any:
    """A concurrent writer on connections of its own: commits a new score for one item, then
    rebuilds the rank table (prepare() of a second wrapper) so that new runs see it. On
    PostgreSQL the rebuild waits for the run (it swaps tables the run reads): on a thread of its
    own (tests/helpers.py RefreshAfterTheRun)."""
    write_live_source(source, item, score)
    writer = SQLAlchemyTable(
        source.engine, source.table_name, id=source.id_column, score=source.score_column
    )
    if source.engine.dialect.name == "postgresql":
        return RefreshAfterTheRun(lambda: writer.prepare(refresh=True, swap_timeout=60))
    writer.prepare(refresh=True)
    return True


@pytest.fixture
def write_sqlalchemy_sqlite_source() -> Callable[[SQLAlchemyTable, Any, float], bool]:
    return write_sqlalchemy_source


@pytest.fixture
def write_sqlalchemy_postgres_source() -> Callable[[SQLAlchemyTable, Any, float], Any]:
    return write_sqlalchemy_source


@pytest.fixture
def write_sqlalchemy_mariadb_source() -> Callable[[SQLAlchemyTable, Any, float], bool]:
    return write_sqlalchemy_source


@pytest.fixture
def write_sqlalchemy_duckdb_source() -> Callable[[SQLAlchemyTable, Any, float], bool]:
    return write_sqlalchemy_source


@pytest.fixture
def make_sqlalchemy_live_sqlite_source(
    sqlalchemy_sqlite_engine: sa.Engine,
) -> Iterator[MakeSource]:
    yield from _live_maker(sqlalchemy_sqlite_engine)


@pytest.fixture
def make_sqlalchemy_live_postgres_source(
    sqlalchemy_postgres_engine: sa.Engine,
) -> Iterator[MakeSource]:
    yield from _live_maker(sqlalchemy_postgres_engine)


@pytest.fixture
def make_sqlalchemy_live_mariadb_source(
    sqlalchemy_mariadb_engine: sa.Engine,
) -> Iterator[MakeSource]:
    yield from _live_maker(sqlalchemy_mariadb_engine)


def write_live_source(source: SQLAlchemyTable, item: Any, score: float) -> bool:
    """A concurrent writer on a connection of its own: commits a new score for one item; a live
    table needs nothing more for new runs to see it."""
    assert source.table_name is not None
    live = sa.Table(
        source.table_name,
        sa.MetaData(),
        sa.Column(source.id_column),
        sa.Column(source.score_column),
    )
    item = item.item() if isinstance(item, np.generic) else item
    with source.engine.begin() as conn:
        conn.execute(
            live.update()
            .where(live.c[source.id_column] == item)
            .values({live.c[source.score_column]: score})
        )
    return True


@pytest.fixture
def write_sqlalchemy_live_sqlite_source() -> Callable[[SQLAlchemyTable, Any, float], bool]:
    return write_live_source


@pytest.fixture
def write_sqlalchemy_live_postgres_source() -> Callable[[SQLAlchemyTable, Any, float], bool]:
    return write_live_source


@pytest.fixture
def write_sqlalchemy_live_mariadb_source() -> Callable[[SQLAlchemyTable, Any, float], bool]:
    return write_live_source


@pytest.fixture(scope="session")
def shared_sqlalchemy_sqlite_source(sqlalchemy_sqlite_engine: sa.Engine) -> Iterator[MakeSource]:
    yield from shared_sources(_maker(sqlalchemy_sqlite_engine))


@pytest.fixture(scope="session")
def shared_sqlalchemy_postgres_source(
    sqlalchemy_postgres_engine: sa.Engine,
) -> Iterator[MakeSource]:
    yield from shared_sources(_maker(sqlalchemy_postgres_engine))


@pytest.fixture(scope="session")
def shared_sqlalchemy_mariadb_source(
    sqlalchemy_mariadb_engine: sa.Engine,
) -> Iterator[MakeSource]:
    yield from shared_sources(_maker(sqlalchemy_mariadb_engine))


@pytest.fixture(scope="session")
def shared_sqlalchemy_duckdb_source(sqlalchemy_duckdb_engine: sa.Engine) -> Iterator[MakeSource]:
    yield from shared_sources(_maker(sqlalchemy_duckdb_engine))


@pytest.fixture(scope="session")
def shared_sqlalchemy_live_sqlite_source(
    sqlalchemy_sqlite_engine: sa.Engine,
) -> Iterator[MakeSource]:
    yield from shared_sources(_live_maker(sqlalchemy_sqlite_engine))


@pytest.fixture(scope="session")
def shared_sqlalchemy_live_postgres_source(
    sqlalchemy_postgres_engine: sa.Engine,
) -> Iterator[MakeSource]:
    yield from shared_sources(_live_maker(sqlalchemy_postgres_engine))


@pytest.fixture(scope="session")
def shared_sqlalchemy_live_mariadb_source(
    sqlalchemy_mariadb_engine: sa.Engine,
) -> Iterator[MakeSource]:
    yield from shared_sources(_live_maker(sqlalchemy_mariadb_engine))
