"""How a statement reaches a store: the Driver of the SQL store engine, and one per driver.

A dialect (dialect.py) is the SQL flavour; a driver is how its statements reach the store, as in
SQLAlchemy's `postgresql+psycopg`: PostgreSQL through psycopg, any SQLAlchemy Engine, or SPI
inside the server (SPIDriver, in the dialect's folder: `$1`, `$2`) is one dialect over three
drivers. The engine and the dialects write every statement with one placeholder style, `:name`
(DB-API "named"), and the driver binds it its own way:

* `PsycopgDriver` (psycopg 3): `%(name)s`, bound by the server (extended query protocol), `%`
  doubled; server-side prepared statements on request (`prepare=True`, `prepares`), results in
  binary where asked (`binary=True`, `binary_reads`), and int8 arrays sent in binary
  (`Int8Array`, `binary_arrays`);
* `SQLAlchemyDriver` (any DBAPI behind an Engine): `sqlalchemy.text()` binds `:name` as the
  DBAPI wants; `binds_on_server` is false for the DBAPIs that write parameters into the
  statement text on the client (CLIENT_SIDE_BINDING: psycopg2, the MySQL and MariaDB drivers),
  and the store then declares `parameters_in_text` (access.StoreTraits): no secret is sent;
* `DuckDBDriver`: `$name`; `ChdbDriver` (ClickHouse in process): `{name:Type}`, the type read
  off the value (int Int64, float Float64, str String, lists Array(...)).

Placeholders are found outside quoted text and comments (placeholders.py); what a statement
becomes is cached per driver style.

A driver capability that only some drivers have is a flag of the driver (`prepares`,
`binary_reads`, `binary_arrays`, `binds_on_server`), which the engine and the dialects ask;
they never test a driver's type. Errors: `errors` are the exception types a statement raises,
`sqlstate(error)` its SQLSTATE where the driver knows it, `lost(error)` whether the connection
is gone.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext, suppress
from typing import Any

import numpy as np

from topk_middleware.validation import first_line

from .placeholders import convert


class DriverError(RuntimeError):
    """A statement the store refused, in one line (drivers whose own errors carry no SQLSTATE)."""


class Int8Array(bytes):
    """A one-dimensional int8[] in PostgreSQL's binary array format, written by numpy: a
    parameter that a driver with `binary_arrays` sends as it is (psycopg: `%(name)b`)."""

    @classmethod
    def of(cls, values: Any) -> Int8Array:
        values = np.asarray(values, dtype=np.int64)
        body = np.empty(len(values), dtype=[("size", ">i4"), ("value", ">i8")])
        body["size"], body["value"] = 8, values
        header = struct.pack(">iiiii", 1, 0, 20, len(values), 1)  # 20: int8's type oid
        return cls(header + body.tobytes())


class Driver:
    """How statements reach one store (module docstring). The base holds the flags' defaults;
    each driver fills `execute`, `transaction` and what it can of the rest."""

    style = "text"
    binds_on_server = True  # parameters travel apart from the statement text
    prepares = False  # server-side prepared statements on request (execute(prepare=True))
    binary_reads = False  # results in binary on request (execute(binary=True))
    binary_arrays = False  # Int8Array parameters sent in binary
    errors: tuple[type[BaseException], ...] = (DriverError,)

    def execute(
        self,
        sql: str,
        params: Mapping[str, Any] | None = None,
        *,
        prepare: bool | None = None,
        binary: bool = False,
    ) -> list[tuple[Any, ...]]:
        """Run one statement (in the transaction open on this driver, if any); its rows, []
        where it returns none."""
        raise NotImplementedError

    def one(self, sql: str, params: Mapping[str, Any] | None = None, **options: Any) -> Any:
        """The first row, or None."""
        rows = self.execute(sql, params, **options)
        return rows[0] if rows else None

    def scalar(self, sql: str, params: Mapping[str, Any] | None = None, **options: Any) -> Any:
        """The first column of the first row, or None."""
        row = self.one(sql, params, **options)
        return None if row is None else row[0]

    def transaction(
        self, *, isolation: str | None = None, read_only: bool = False
    ) -> Any:  # a context manager
        """A transaction (a savepoint inside one): committed when left, rolled back on an error.
        `isolation` ("REPEATABLE READ", ...) and `read_only` apply to an outermost one."""
        return nullcontext()

    def savepoint(self) -> Any:
        """A savepoint inside the open transaction: an error inside rolls back to it only."""
        return self.transaction()

    def session(self) -> Any:
        """One connection held for what runs inside (a session lock, several transactions)."""
        return nullcontext()

    @property
    def in_transaction(self) -> bool:
        return False

    @property
    def session_key(self) -> Any:
        """What facts learnt of the connection are kept against (a reconnect makes another)."""
        return self

    @property
    def server_version(self) -> int:
        """The server's version number as it reports it (PostgreSQL: 150004), 0 if unknown."""
        return 0

    def sqlstate(self, error: BaseException) -> str | None:
        """The SQLSTATE of a statement's error, where the driver gives one."""
        return None

    def lost(self, error: BaseException | None = None) -> bool:
        """Whether the connection is gone (closed, broken, terminated)."""
        return False

    def ensure(self) -> None:
        """Before a unit of work: reconnect a lost connection this driver owns (else a clear
        ConnectionError); nothing where the driver keeps no connection."""

    def lost_error(self, where: str, error: BaseException) -> ConnectionError:
        """The error of a run whose connection was lost after it began, in the project's
        words."""
        return ConnectionError(
            f"{where}: the connection was lost during the run ({first_line(error)})"
        )

    def dbapi_connection(self) -> Any:
        """The DBAPI connection statements run on now (a dialect registers a function on it),
        None where there is none or no session is open."""
        return None

    def arrays(self, sql: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The result's columns as numpy arrays, by column name."""
        raise NotImplementedError

    def apart(self) -> Any:
        """A context: a driver on a connection of its own, outside the transaction in progress
        (which a failed statement may have ended)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what this driver opened (never a connection the caller passed in)."""


class PsycopgDriver(Driver):
    """A psycopg 3 connection: a libpq connection string (the driver opens an autocommit
    connection, owns it and reconnects it when lost) or the caller's Connection (not inside a
    transaction; never closed here)."""

    style = "pyformat"
    prepares = True
    binary_reads = True
    binary_arrays = True

    def __init__(self, conninfo_or_connection: Any, where: str = "PostgreSQL") -> None:
        import psycopg

        self._psycopg = psycopg
        self.errors = (psycopg.Error,)
        self.where = where
        if isinstance(conninfo_or_connection, psycopg.Connection):
            self.conn, self.owns, self.conninfo = conninfo_or_connection, False, None
        else:
            self.conn = psycopg.connect(conninfo_or_connection, autocommit=True)
            self.owns, self.conninfo = True, str(conninfo_or_connection)

    def execute(
        self,
        sql: str,
        params: Mapping[str, Any] | None = None,
        *,
        prepare: bool | None = None,
        binary: bool = False,
    ) -> list[tuple[Any, ...]]:
        text, names = convert(sql, self.style) if params else (sql, ())
        values = {name: params[name] for name in names} if params else None
        arrays = [name for name in dict.fromkeys(names) if isinstance(params[name], Int8Array)]
        for name in arrays:  # sent in binary
            text = text.replace(f"%({name})s", f"%({name})b")
        conn = self.conn
        wrap = not conn.autocommit and not self.in_transaction
        with conn.transaction() if wrap else nullcontext(), conn.cursor(binary=binary) as cur:
            if arrays:
                register_int8_arrays(cur)
            cur.execute(text, values, prepare=prepare)
            return cur.fetchall() if cur.description is not None else []

    @contextmanager
    def transaction(
        self, *, isolation: str | None = None, read_only: bool = False
    ) -> Iterator[None]:
        conn = self.conn
        if self.in_transaction or (isolation is None and not read_only):
            with conn.transaction():
                yield
            return
        saved = conn.isolation_level, conn.read_only
        levels = self._psycopg.IsolationLevel
        conn.isolation_level = None if isolation is None else levels[isolation.replace(" ", "_")]
        conn.read_only = read_only
        try:
            with conn.transaction():
                yield
        finally:
            if not conn.closed:
                conn.isolation_level, conn.read_only = saved

    @property
    def in_transaction(self) -> bool:
        status = self.conn.info.transaction_status
        return status != self._psycopg.pq.TransactionStatus.IDLE

    @property
    def server_version(self) -> int:
        return int(self.conn.info.server_version)

    @property
    def session_key(self) -> Any:
        return self.conn

    def sqlstate(self, error: BaseException) -> str | None:
        return getattr(error, "sqlstate", None)

    def lost(self, error: BaseException | None = None) -> bool:
        conn = self.conn
        if conn.closed or conn.broken:
            return True
        return conn.info.transaction_status == self._psycopg.pq.TransactionStatus.UNKNOWN

    def ensure(self) -> None:
        """The connection, opened again if this driver owns it and it was lost (a terminated
        backend, a restarted server); a clear error where it is the caller's."""
        if not self.lost():
            return
        if self.owns and self.conninfo is not None:
            with suppress(self._psycopg.Error):
                self.conn.close()
            try:
                self.conn = self._psycopg.connect(self.conninfo, autocommit=True)
            except self._psycopg.OperationalError as error:
                raise ConnectionError(
                    f"{self.where}: the connection to PostgreSQL was lost and reconnecting failed "
                    f"({first_line(error)})"
                ) from None
            return
        raise ConnectionError(
            f"{self.where}: the connection to PostgreSQL was lost (closed or terminated); make "
            "a PostgresTable with a new connection, or with a conninfo string so that it "
            "reconnects by itself"
        )

    def lost_error(self, where: str, error: BaseException) -> ConnectionError:
        return ConnectionError(
            f"{where}: the connection to PostgreSQL was lost during the run "
            f"({first_line(error)}); "
            + (
                "the next run reconnects"
                if self.owns and self.conninfo
                else "make a PostgresTable with a new connection, or with a conninfo string so "
                "that it reconnects by itself"
            )
        )

    def close(self) -> None:
        if self.owns:
            self.conn.close()


def register_int8_arrays(cursor: Any) -> None:
    """Let `cursor` (only it, not its connection) send Int8Array parameters in binary."""
    from psycopg.adapt import Dumper
    from psycopg.pq import Format

    class Int8ArrayDumper(Dumper):
        format = Format.BINARY
        oid = 1016  # int8[]

        def dump(self, obj: Any) -> bytes:
            return bytes(obj)

    cursor.adapters.register_dumper(Int8Array, Int8ArrayDumper)


# DBAPI modules (SQLAlchemy driver names) that write parameters into the statement text on the
# client, where the server's process list and logs show them.
CLIENT_SIDE_BINDING = tuple(
    "psycopg2 psycopg2cffi pymysql mysqldb mysqlconnector mariadbconnector asyncmy aiomysql "
    "cymysql".split()
)


class SQLAlchemyDriver(Driver):
    """Statements through an SQLAlchemy Engine (any DBAPI). Outside `session()` and
    `transaction()` each statement takes a connection of the pool and commits."""

    style = "text"

    def __init__(
        self,
        engine: Any,
        read_only: Mapping[str, Any] | None = None,
        connection: Any = None,
    ) -> None:
        """`read_only`: the execution options that make a transaction read-only on this
        engine's dialect (the dialect knows them), if any. `connection`: a Connection of the
        engine that the caller holds: every statement runs on it (in its transaction)."""
        import sqlalchemy as sa

        self._sa = sa
        self.engine = engine
        self.errors = (sa.exc.DBAPIError,)
        self.binds_on_server = engine.dialect.driver not in CLIENT_SIDE_BINDING
        self._read_only = dict(read_only or {})
        self._conn: Any = connection  # the connection of the session or transaction in progress
        # transactions open on it (outside one, a statement commits at once); a connection the
        # caller holds is in the caller's transaction
        self._depth = 0 if connection is None else 1

    @contextmanager
    def session(self) -> Iterator[None]:
        if self._conn is not None:
            yield
            return
        with self.engine.connect() as conn:
            self._conn = conn
            try:
                yield
            finally:
                if conn.in_transaction():
                    conn.rollback()
                self._conn = None

    @contextmanager
    def transaction(
        self, *, isolation: str | None = None, read_only: bool = False
    ) -> Iterator[None]:
        with self.session():
            conn = self._conn
            if self._depth:
                self._depth += 1
                try:
                    with conn.begin_nested():
                        yield
                finally:
                    self._depth -= 1
                return
            options: dict[str, Any] = {}
            if isolation is not None:
                options["isolation_level"] = isolation
            if read_only:
                options.update(self._read_only)
            if options:
                conn.execution_options(**options)  # in place, for this connection
            self._depth = 1
            try:
                with conn.begin():
                    yield
            finally:
                self._depth = 0
                if options:  # the session's next transaction gets the defaults again
                    reset: dict[str, Any] = {k: False for k in self._read_only if k in options}
                    if isolation is not None:
                        reset["isolation_level"] = conn.default_isolation_level
                    conn.execution_options(**reset)

    def execute(self, sql: str, params: Mapping[str, Any] | None = None, **_: Any) -> Any:
        return self._result(sql, params)[1]

    def _result(self, sql: str, params: Mapping[str, Any] | None) -> tuple[list[str], list[Any]]:
        """(column names, rows) of one statement."""
        statement = self._sa.text(convert(sql, self.style)[0])
        with nullcontext() if self._conn is not None and self._depth else self._alone():
            result = self._conn.execute(statement, dict(params or {}))
            return (list(result.keys()), list(result.all())) if result.returns_rows else ([], [])

    @contextmanager
    def _alone(self) -> Iterator[None]:
        """A statement of its own, committed."""
        with self.session(), self._conn.begin():
            yield

    def arrays(self, sql: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The result's columns as numpy arrays (text, bytes, decimals, NULLs as objects)."""
        names, rows = self._result(sql, params)
        out: dict[str, Any] = {}
        for i, name in enumerate(names):
            column = np.asarray([row[i] for row in rows]) if rows else np.empty(0)
            if column.dtype.kind not in "iufb":
                column = np.empty(len(rows), dtype=object)
                column[:] = [row[i] for row in rows]
            out[name] = column
        return out

    @contextmanager
    def apart(self) -> Iterator[SQLAlchemyDriver]:
        yield SQLAlchemyDriver(self.engine, self._read_only)

    @property
    def in_transaction(self) -> bool:
        return self._depth > 0

    @property
    def server_version(self) -> int:
        info = (*(self.engine.dialect.server_version_info or (0,)), 0, 0)
        return int(info[0]) * 10000 + int(info[1])

    def sqlstate(self, error: BaseException) -> str | None:
        return getattr(getattr(error, "orig", None), "sqlstate", None)

    def dbapi_connection(self) -> Any:
        return None if self._conn is None else self._conn.connection.driver_connection

    def lost(self, error: BaseException | None = None) -> bool:
        return bool(getattr(error, "connection_invalidated", False))

    def close(self) -> None:
        """Nothing: the Engine is the caller's (dispose() it to close its pool)."""


class DuckDBDriver(Driver):
    """A DuckDB connection (`$name`). With `cursors` (a source's runs and prepare()), each
    outermost transaction runs on a cursor of its own, never in one the caller holds open,
    begins in its first statement and, read-only, ends by closing its cursor (two statements
    fewer a run). Without (from_votes, which reads the caller's registered frames), it runs on
    the connection itself. One inside another joins it (DuckDB has no savepoints). `arrays()`:
    the result's numpy columns (fetchnumpy)."""

    style = "dollar"

    def __init__(self, connection: Any, *, cursors: bool = True) -> None:
        import duckdb

        self.conn, self.cursors = connection, cursors
        self.errors = (duckdb.Error,)
        self._cursor: Any = None  # the open transaction's connection
        self._begin: str | None = None  # the BEGIN its first statement still has to send

    def _run(self, sql: str, params: Mapping[str, Any] | None) -> Any:
        text, names = convert(sql, self.style)
        values = {name: (params or {})[name] for name in dict.fromkeys(names)}
        if self._begin is not None:
            text, self._begin = f"{self._begin}; {text}", None
        return (self.conn if self._cursor is None else self._cursor).execute(text, values or None)

    def execute(self, sql: str, params: Mapping[str, Any] | None = None, **_: Any) -> Any:
        cursor = self._run(sql, params)
        return cursor.fetchall() if cursor.description is not None else []

    def arrays(self, sql: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return dict(self._run(sql, params).fetchnumpy())

    @contextmanager
    def apart(self) -> Iterator[DuckDBDriver]:
        cursor = self.conn.cursor()
        try:
            yield DuckDBDriver(cursor, cursors=False)
        finally:
            cursor.close()

    @contextmanager
    def transaction(
        self, *, isolation: str | None = None, read_only: bool = False
    ) -> Iterator[None]:
        if self._cursor is not None:  # no savepoints: joins the transaction in progress
            yield
            return
        if not self.cursors:
            yield from self._on_connection()
            return
        self._cursor = cursor = self.conn.cursor()
        self._begin = "BEGIN TRANSACTION" + (" READ ONLY" if read_only else "")
        try:
            yield
            if self._begin is None and not read_only:
                cursor.execute("COMMIT")
        finally:  # closing the cursor rolls back what it did not commit
            self._cursor, self._begin = None, None
            cursor.close()

    def _on_connection(self) -> Iterator[None]:
        """A transaction on the connection itself."""
        self.conn.execute("BEGIN TRANSACTION")
        self._cursor = self.conn
        try:
            yield
        except BaseException:
            self._cursor = None
            self.conn.execute("ROLLBACK")
            raise
        self._cursor = None
        self.conn.execute("COMMIT")

    @property
    def in_transaction(self) -> bool:
        return self._cursor is not None


def _clickhouse_type(value: Any) -> str:
    """The ClickHouse type a parameter value is bound as (ChdbDriver)."""
    if isinstance(value, bool):
        return "Bool"
    if isinstance(value, int | np.integer):
        return "Int64"
    if isinstance(value, float | np.floating):
        return "Float64"
    if isinstance(value, list | tuple | np.ndarray):
        items = list(value)
        return f"Array({_clickhouse_type(items[0]) if items else 'Int64'})"
    return "String"


def _clickhouse_value(value: Any) -> Any:
    """A parameter value in the text form ClickHouse parses it from: a string with its
    backslashes, tabs and newlines escaped; an array of strings as a quoted array literal
    (chdb would send its elements unquoted). Still a parameter, never statement text."""
    if isinstance(value, str):
        return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
    if isinstance(value, list | tuple) and value and isinstance(value[0], str):
        quoted = (v.replace("\\", "\\\\").replace("'", "\\'") for v in value)
        return "[" + ",".join(f"'{v}'" for v in quoted) + "]"
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


class ChdbDriver(Driver):
    """ClickHouse in process (chdb): a chdb connection or session, or a database path it
    opens. Parameters are ClickHouse query parameters (`{name:Type}`), bound by the server, never
    pasted into the statement text. No transactions (ClickHouse has none)."""

    style = "brace"

    def __init__(self, connection: Any) -> None:
        if isinstance(connection, str):
            import chdb

            connection = chdb.connect(connection)
        query: Callable[..., Any] | None = getattr(connection, "query", None)
        if not callable(query):
            raise TypeError(
                "ClickHouseTable needs a chdb connection (chdb.connect(path)), a chdb session "
                f"or a database path, got {type(connection).__name__}"
            )
        self.conn = connection

    def _query(self, sql: str, params: Mapping[str, Any] | None) -> Any:
        text, names = convert(sql, self.style)
        values = {name: (params or {})[name] for name in dict.fromkeys(names)}
        for name, value in values.items():
            text = text.replace("{" + name + "}", "{" + f"{name}:{_clickhouse_type(value)}" + "}")
        try:
            return self.conn.query(
                text,
                "ArrowTable",
                params={n: _clickhouse_value(v) for n, v in values.items()} or None,
            )
        except Exception as error:  # chdb raises its own RuntimeError subclasses
            raise DriverError(f"ClickHouse: {first_line(error)}") from None

    def execute(
        self,
        sql: str,
        params: Mapping[str, Any] | None = None,
        *,
        prepare: bool | None = None,
        binary: bool = False,
    ) -> list[tuple[Any, ...]]:
        table = self._query(sql, params)
        if table is None or not hasattr(table, "column_names") or not table.num_columns:
            return []
        columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
        return list(zip(*columns, strict=True))


__all__ = [
    "CLIENT_SIDE_BINDING",
    "ChdbDriver",
    "Driver",
    "DriverError",
    "DuckDBDriver",
    "Int8Array",
    "PsycopgDriver",
    "SQLAlchemyDriver",
    "convert",
]
