"""Which adapter serves a store URL, and opening a table of counts through it (the CLI's door).

Three kinds of URL:

* a DuckDB file: a path ending in `.duckdb` or `.db`, or `duckdb:///path` (`duckdb:////abs/path`)
  -> adapters/duckdb.DuckDBTable. The file must exist: nothing is created.
* `postgresql://...` (or `postgres://...`), a libpq URI -> adapters/postgres.PostgresTable
  (psycopg 3).
* any other SQLAlchemy URL (`sqlite:///path`, `mysql+pymysql://...`, `postgresql+psycopg://...`)
  -> adapters/sqlalchemy.SQLAlchemyTable. A SQLite file must exist (SQLite would create an empty
  one), and `:memory:` holds no table.

`parse_store_url` refuses what names no store (StoreArgumentError) before anything is opened;
`open_table` connects, wraps the table and closes what it opened on the way out; a store that
cannot be reached is a StoreConnectionError, in words that hide the password.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topk_middleware.names import first_line, mask_secrets

DUCKDB_SUFFIXES = (".duckdb", ".db")
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
CONNECT_TIMEOUT_SECONDS = 10
MODES = ("copy", "live")
URL_FORMS = (
    "a DuckDB file (path.duckdb, path.db or duckdb:///path), postgresql://user@host/db, or an "
    "SQLAlchemy URL such as sqlite:///path.sqlite or mysql+pymysql://user@host/db"
)


class StoreArgumentError(ValueError):
    """The URL or the options name no table this project can open; nothing was opened."""


class StoreConnectionError(ConnectionError):
    """The store named by a valid URL could not be reached or opened."""


@dataclass(frozen=True)
class StoreURL:
    """A parsed store URL: its kind ("duckdb", "postgres", "sqlalchemy"), what the driver is
    given (a file path, a libpq URI, an SQLAlchemy URL) and how messages show it."""

    kind: str
    target: str
    shown: str


def _hide_password(url: str) -> str:
    import sqlalchemy as sa

    try:
        return mask_secrets(sa.make_url(url).render_as_string(hide_password=True))
    except (sa.exc.ArgumentError, ValueError):  # ValueError: a port SQLAlchemy cannot read
        return mask_secrets(url)


def parse_store_url(text: str) -> StoreURL:
    """The kind of store `text` names (module docstring), checked without opening anything."""
    if not text:
        raise StoreArgumentError(f"no store URL given: expected {URL_FORMS}")
    if text.startswith("duckdb:"):
        if not text.startswith("duckdb:///") or text[len("duckdb:///") :] in ("", ":memory:"):
            raise StoreArgumentError(
                f"{mask_secrets(text)!r}: a DuckDB URL names a file, duckdb:///relative/path or "
                "duckdb:////absolute/path"
            )
        return _duckdb_file(text[len("duckdb:///") :])
    if "://" not in text and text.lower().endswith(DUCKDB_SUFFIXES):
        return _duckdb_file(text)
    if text.startswith(POSTGRES_SCHEMES):  # masked without loading SQLAlchemy (~0.2 s)
        return StoreURL("postgres", text, mask_secrets(text))
    import sqlalchemy as sa

    try:
        url = sa.make_url(text)
    except (sa.exc.ArgumentError, ValueError):  # its message may quote the password
        raise StoreArgumentError(
            f"{mask_secrets(text)!r} is not a store URL: expected {URL_FORMS}"
        ) from None
    if url.get_backend_name() == "sqlite":
        database = url.database or ""
        if database in ("", ":memory:") or database.startswith("file:"):
            raise StoreArgumentError(
                f"{mask_secrets(text)!r}: an in-memory SQLite database holds no table; "
                "name a file, sqlite:///path.sqlite"
            )
        if not Path(database).is_file():
            raise StoreArgumentError(
                f"no SQLite file at {database!r} (from {mask_secrets(text)!r})"
            )
    return StoreURL("sqlalchemy", text, _hide_password(text))


def _duckdb_file(path: str) -> StoreURL:
    if not Path(path).is_file():
        raise StoreArgumentError(f"no DuckDB file at {path!r}")
    return StoreURL("duckdb", path, path)


def split_table(text: str, schema: str | None) -> tuple[str, str | None]:
    """(table, schema) from `--table` and `--schema`: `schema.table` is split at its first dot
    unless a schema is given apart (then the table name is taken whole, dots and all)."""
    if not text:
        raise StoreArgumentError("the table name is empty")
    if schema is not None or "." not in text:
        return text, schema
    schema, table = text.split(".", 1)
    if not schema or not table:
        raise StoreArgumentError(f"{mask_secrets(text)!r} is not a table name or schema.table")
    return table, schema


@contextmanager
def open_table(
    url: StoreURL,
    table: str,
    id: str = "id",
    score: str = "score",
    *,
    schema: str | None = None,
    mode: str = "copy",
    read_only: bool = False,
    sensitivity: float | None = None,
    frozen: bool = False,
) -> Iterator[Any]:
    """The table of counts at `url` wrapped by its adapter (closed on exit). `read_only` opens
    a DuckDB file read-only (several processes may read it); other stores ignore it.
    `sensitivity`: the caller's declaration (None: what the table records, else 1; a
    declaration below the record is refused by the adapter)."""
    if mode not in MODES:
        raise StoreArgumentError(f"mode must be one of {MODES}, got {mode!r}")
    declared: dict[str, Any] = {} if sensitivity is None else {"sensitivity": sensitivity}
    if frozen:  # the caller's promise that the table does not change after prepare()
        declared["frozen"] = True
    if url.kind == "duckdb":
        with _duckdb_table(url, table, id, score, schema, mode, read_only, declared) as source:
            yield source
    elif url.kind == "postgres":
        with _postgres_table(url, table, id, score, schema, mode, declared) as source:
            yield source
    else:
        with _sqlalchemy_table(url, table, id, score, schema, mode, declared) as source:
            yield source


def _needs(extra: str, error: ImportError) -> StoreArgumentError:
    return StoreArgumentError(
        f"this store needs the {extra!r} extra ({first_line(error)}): "
        f"pip install 'topk_middleware[{extra}]'"
    )


@contextmanager
def _duckdb_table(
    url: StoreURL,
    table: str,
    id: str,
    score: str,
    schema: str | None,
    mode: str,
    read_only: bool,
    declared: dict[str, Any],
) -> Iterator[Any]:
    try:
        import duckdb

        from adapters.duckdb import DuckDBTable
    except ImportError as error:
        raise _needs("duckdb", error) from None
    options: dict[str, Any] = {"schema": schema, **declared}
    if "mode" in inspect.signature(DuckDBTable.__init__).parameters:
        options["mode"] = mode
    elif mode != "copy":
        raise StoreArgumentError("DuckDB has no live mode: use --mode copy (the default)")
    try:
        con = duckdb.connect(os.fspath(url.target), read_only=read_only)
    except duckdb.Error as error:
        raise StoreConnectionError(
            f"cannot open the DuckDB file {url.shown!r}: {first_line(error)}"
        ) from None
    try:
        yield DuckDBTable(con, table, id=id, score=score, **options)
    finally:
        con.close()


@contextmanager
def _postgres_table(
    url: StoreURL,
    table: str,
    id: str,
    score: str,
    schema: str | None,
    mode: str,
    declared: dict[str, Any],
) -> Iterator[Any]:
    try:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        from adapters.postgres import PostgresTable
    except ImportError as error:
        raise _needs("postgres", error) from None
    try:
        given = conninfo_to_dict(url.target)
    except psycopg.ProgrammingError as error:
        raise StoreArgumentError(f"{url.shown!r}: {first_line(error)}") from None
    timeout = {} if "connect_timeout" in given else {"connect_timeout": CONNECT_TIMEOUT_SECONDS}
    conninfo = make_conninfo(url.target, **timeout)
    try:
        conn = psycopg.connect(conninfo, autocommit=True)
    except psycopg.Error as error:
        raise StoreConnectionError(
            f"cannot connect to PostgreSQL at {url.shown}: {first_line(error)}"
        ) from None
    try:
        yield PostgresTable(conn, table, id=id, score=score, schema=schema, mode=mode, **declared)
    finally:
        conn.close()


@contextmanager
def _sqlalchemy_table(
    url: StoreURL,
    table: str,
    id: str,
    score: str,
    schema: str | None,
    mode: str,
    declared: dict[str, Any],
) -> Iterator[Any]:
    try:
        import sqlalchemy as sa

        from adapters.sqlalchemy import SQLAlchemyTable
    except ImportError as error:
        raise _needs("sqlalchemy", error) from None
    try:
        engine = sa.create_engine(url.target)
    except (ImportError, sa.exc.ArgumentError) as error:
        raise StoreArgumentError(
            f"SQLAlchemy cannot load a driver for {url.shown} ({first_line(error)}): install "
            "it, or name another driver in the URL"
        ) from None
    try:
        try:
            with engine.connect() as conn:
                conn.execute(sa.select(1))
        except sa.exc.DBAPIError as error:
            raise StoreConnectionError(
                f"cannot connect to {url.shown}: {first_line(error.orig)}"
            ) from None
        yield SQLAlchemyTable(
            engine, table, id=id, score=score, schema=schema, mode=mode, **declared
        )
    finally:
        engine.dispose()
