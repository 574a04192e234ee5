"""What SQLAlchemyTable's live mode (live_mode.py) stands on: the table of counts in an
SQLAlchemy database (PostgreSQL, SQLite, MariaDB / MySQL) found, reflected and checked, and
the transaction a run reads in.

`LiveBase(engine, table, id, score, ...)` finds the table as the catalog spells it
(`catalog_name`: `t`, `T`, `main.t` name one table, whose positions and triggers derive from
that name), reflects it, refuses a missing column, an id column without a declared type and a
score of another type than numbers, and takes the bounds declared, else the record from_votes
kept with the table (its comment; on SQLite its CREATE statement), else (1, None), before
anything is read. `_validate` checks every row in one aggregate pass and one duplicate probe
(DESIGN invariant 6); `snapshot()` opens one read-only transaction per run, in the strongest
read-consistent isolation of the dialect (invariant 4), whose first query the subclass writes
(`_open_run`); `_explain` reads the dialect's plan of a statement (`check()`).

What differs between the dialects is the LiveSQL of the engine's dialect
(adapters/dialects/live.py): this class keeps what they share. All SQL is built with SQLAlchemy
Core; identifiers are quoted by SQLAlchemy, never pasted.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.elements import ColumnElement

from adapters._sql import (
    HIDE_STATISTICS,
    StatisticsChannel,
    id_array,
    sql_name_spellings,
    statistics_accepted,
    statistics_seen,
)
from adapters.dialects.live import live_sql
from adapters.dialects.live_sql import LiveSQL
from adapters.sql.driver import CLIENT_SIDE_BINDING
from topk_middleware.access import Rows, StoreCosts, StoreTraits
from topk_middleware.privacy import resolve_declared

from ..contributions import parse_record
from .table import DEFAULT_MAX_PARAMS, OLD_SQLITE_MAX_PARAMS, SQLAlchemyTable, engine_of

__all__ = ["LiveBase", "catalog_name"]


class LiveBase(StatisticsChannel, SQLAlchemyTable):
    """A table of counts in an SQLAlchemy database, found and checked (module docstring); the
    arguments are SQLAlchemyTable's. Subclasses write a run's first query (`_open_run`) and
    end (`_close_run`), and the reads."""

    def __init__(
        self,
        engine: Engine | str,
        table: str | sa.Table,
        id: str = "id",
        score: str = "score",
        *,
        schema: str | None = None,
        rank_table: str | None = None,
        max_params: int | None = None,
        mode: str = "copy",
        sensitivity: float | None = None,
        max_items_per_client: int | None = None,
        frozen: bool = False,
    ) -> None:
        if mode not in ("copy", "live"):
            raise ValueError(f"mode must be 'copy' or 'live', got {mode!r}")
        if not isinstance(frozen, bool):
            raise TypeError(f"frozen must be True or False, got {frozen!r}")
        self.frozen = frozen  # the caller's promise: the table does not change after prepare()
        self.last_freshness: dict[str, Any] | None = None  # how the last run knew its data
        resolve_declared(sensitivity, max_items_per_client, None, "table")  # bad: refused
        self.engine = engine = engine_of(engine)
        self.dialect = engine.dialect.name
        self._live: LiveSQL = live_sql(engine)
        self._live.check_engine(engine)
        self._no_keyed_sql()
        if isinstance(table, sa.Table):
            schema = table.schema
            table = table.name
        self.where = f"table {table!r}" if schema is None else f"table {schema!r}.{table!r}"
        # every object name derives from the name as the catalog spells it
        table, schema = catalog_name(engine, table, schema, self._live)
        self.table_name: str | None = table
        self.id_column, self.score_column = id, score
        self._source = self._live.reflected(_reflect(engine, table, schema, self.where))
        for name in (id, score):
            if name not in self._source.c:
                raise ValueError(
                    f"{self.where} has no column {name!r} (columns: {list(self._source.c.keys())})"
                )
        self._refuse_untyped_id()
        # The most one client moves a count, and how many counts it moves: declared, else what
        # from_votes recorded with the table (contributions.py), else (1, None).
        self.sensitivity, self.max_items_per_client = resolve_declared(
            sensitivity,
            max_items_per_client,
            parse_record(self._table_comment(table, schema)),
            self.where,
        )
        self._text_ids = isinstance(self._source.c[id].type, sa.String)
        self._from: sa.FromClause = self._source
        self._id: ColumnElement[Any] = self._source.c[id]
        self._score: ColumnElement[Any] = self._source.c[score]
        score_type = self._source.c[score].type
        if not (_is_numeric(score_type) or (not self._live.typed_scores and _untyped(score_type))):
            raise TypeError(
                f"{self.where} column {score!r} must be numeric, its type is {score_type}"
            )
        if max_params is None:
            few = self._live.few_params(engine)
            max_params = OLD_SQLITE_MAX_PARAMS if few else DEFAULT_MAX_PARAMS
        if max_params < 1:
            raise ValueError(f"max_params must be >= 1, got {max_params}")
        self.max_params = int(max_params)
        self._conn: Connection | None = None
        self._m: int | None = None
        self._statistics_role()  # asked once, here: traits() reads it (PostgreSQL only)

    def _table_comment(self, table: str, schema: str | None) -> str | None:
        """The text that may hold a from_votes record for `table` (contributions.py): its
        comment, on SQLite its CREATE TABLE statement (LiveSQL.comment_query)."""
        with self.engine.connect() as conn:
            found = conn.execute(self._live.comment_query(self.engine, table, schema)).first()
        return None if found is None or found[0] is None else str(found[0])

    def _refuse_untyped_id(self) -> None:
        """An id column without a declared type (SQLite allows one) gives the rank table no
        type to copy: refused, saying what to declare."""
        if _untyped(self._source.c[self.id_column].type):
            raise TypeError(
                f"{self.where} column {self.id_column!r} has no declared type: declare it "
                "INTEGER or TEXT (ids of one type), e.g. by copying the table"
            )

    # ----- dialect specifics ----------------------------------------------------------------

    def _id_key(self, column: ColumnElement[Any]) -> ColumnElement[Any]:
        """The id as compared in the canonical order: text in byte order on every dialect."""
        return self._live.byte_order(self, column) if self._text_ids else column

    def _not_finite(self) -> ColumnElement[bool] | None:
        """A condition true for NaN or infinite scores, where the dialect can store them."""
        score = self._score
        if not isinstance(score.type, sa.Float | sa.Numeric) and not _untyped(score.type):
            return None  # integers are finite
        return self._live.not_finite(score)  # None: MariaDB's DOUBLE holds no NaN or infinity

    # ----- checks ---------------------------------------------------------------------------

    def _validate(self, conn: Connection) -> None:
        """One aggregate pass and one duplicate probe over the counts (DESIGN invariant 6)."""
        score, id_ = self._score, self._id
        zero_one = lambda cond: sa.func.sum(sa.case((cond, 1), else_=0))  # noqa: E731
        checks: dict[str, Any] = {
            "rows": sa.func.count(),
            "ids": sa.func.count(id_),
            "scores": sa.func.count(score),
            "negative": zero_one(score < 0),
        }
        not_finite = self._not_finite()
        if not_finite is not None:
            checks["not_finite"] = zero_one(not_finite)
        not_numeric = self._live.not_numeric(score)  # where a column type is only a hint
        if not_numeric is not None:
            checks["not_numeric"] = zero_one(not_numeric)
        query = sa.select(*(expr.label(name) for name, expr in checks.items()))
        facts = {
            k: int(v or 0)
            for k, v in conn.execute(query.select_from(self._from)).one()._asdict().items()
        }
        where, id_name, score_name = self.where, self.id_column, self.score_column
        if facts["rows"] == 0:
            raise ValueError(f"{where} is empty: there is no item to select")
        if facts["ids"] != facts["rows"]:
            raise ValueError(
                f"{where} column {id_name!r} has {facts['rows'] - facts['ids']} NULL id(s)"
            )
        if facts.get("not_numeric"):
            raise TypeError(
                f"{where} column {score_name!r} has {facts['not_numeric']} non-numeric value(s)"
            )
        if facts["scores"] != facts["rows"]:
            raise ValueError(
                f"{where} column {score_name!r} has {facts['rows'] - facts['scores']} NULL score(s)"
            )
        if facts.get("not_finite"):
            raise ValueError(
                f"{where} column {score_name!r} has {facts['not_finite']} NaN or infinite score(s)"
            )
        if facts["negative"]:
            raise ValueError(
                f"{where} column {score_name!r} has {facts['negative']} negative score(s)"
            )
        self._refuse_long_ids(conn)
        key = self._id_key(id_)
        duplicate = conn.execute(
            sa.select(sa.func.min(id_), sa.func.count())
            .select_from(self._from)
            .group_by(key)
            .having(sa.func.count() > 1)
            .limit(1)
        ).first()
        if duplicate is not None:
            raise ValueError(
                f"{where} column {id_name!r} has duplicate ids, e.g. {duplicate[0]!r} "
                f"({duplicate[1]} rows): each item must appear once"
            )

    def _refuse_long_ids(self, conn: Connection) -> None:
        """Text ids longer than the rank table's indexed id column takes: a clear error (not
        MariaDB's "Data too long" or PostgreSQL's "index row requires ... bytes")."""
        bound = self._live.id_length_limit(self._id) if self._text_ids else None
        if bound is None:
            return
        length, limit, unit = bound
        longest = conn.execute(sa.select(sa.func.max(length)).select_from(self._from)).scalar()
        if longest is not None and int(longest) > limit:
            raise ValueError(
                f"{self.where} column {self.id_column!r} has an id of {int(longest)} {unit}: ids "
                f"of at most {limit} {unit} can be indexed on {self.dialect}"
            )

    def _explain(self, conn: Connection, query: sa.Select[Any]) -> tuple[bool, str]:
        """(full scan?, how) for one query. The statement is compiled by SQLAlchemy, values
        rendered as literals, and prefixed with the dialect's EXPLAIN keyword."""
        statement = str(query.compile(conn, compile_kwargs={"literal_binds": True}))
        return self._live.explain(conn, statement)

    # ----- runs -----------------------------------------------------------------------------

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """One read-only transaction for every read of a run (DESIGN invariant 4).

        PostgreSQL: REPEATABLE READ READ ONLY. MariaDB / MySQL: REPEATABLE READ, START TRANSACTION
        WITH CONSISTENT SNAPSHOT, READ ONLY. SQLite: an explicit BEGIN plus a first read, which
        fixes the read snapshot at once (in WAL mode writers go on; otherwise they wait), and
        PRAGMA query_only. In each, the position table is read at once (`_open_run`), so the
        snapshot is taken when the context is entered.
        """
        if self._conn is not None:
            yield  # nested: the outer snapshot holds
            return
        with self.engine.connect() as conn:
            conn = self._live.snapshot_connection(conn)
            transaction = self._begin(conn)
            try:
                transaction = self._open_run(conn, transaction)  # the first read: the snapshot
                self.last_freshness = {"copy": "frozen"} if self.frozen else None
                self._conn = conn
                yield
            finally:
                self._conn = None
                self._close_run()
                self._end(conn, transaction)

    def hides_statistics(self) -> bool:
        """Whether oblivious runs keep their reads out of the statistics views: on PostgreSQL,
        where the engine's role may set track_counts (a superuser, or a role granted `SET ON
        PARAMETER track_counts`), they set it off for their transaction. Asked once per source;
        False on the other dialects (docs/oblivious.md)."""
        return self._statistics_role()[0]

    def _statistics_role(self) -> tuple[bool, str]:
        """(whether the engine's role may set track_counts, its name; "" off PostgreSQL): one
        catalog query per source."""
        if self._hides_statistics is None:
            self._hides_statistics = self._live.statistics_role(self.engine)
        return self._hides_statistics

    _hides_statistics: tuple[bool, str] | None = None  # _statistics_role(), once asked

    def _oblivious_reads_seen(self, accepted: bool = False) -> str | None:
        """StoreTraits.oblivious_reads_seen on PostgreSQL where the role may not set
        track_counts (the warning's words where the operator `accepted` the channel)."""
        if not self._live.statistics_views:
            return None
        allowed, role = self._statistics_role()
        if allowed:
            return None
        said = statistics_accepted if accepted else statistics_seen
        return said(self.where, role)

    def _begin(self, conn: Connection) -> sa.RootTransaction:
        """Open the snapshot's read-only transaction on `conn` (an oblivious run's keeps its
        reads out of the statistics views where the role may: hides_statistics())."""
        transaction = conn.begin()
        if self._oblivious and self.hides_statistics():
            conn.exec_driver_sql(HIDE_STATISTICS)
        self._live.begin_snapshot(conn)
        return transaction

    def _end(self, conn: Connection, transaction: sa.RootTransaction) -> None:
        """Close the snapshot's transaction (a rollback: it wrote nothing)."""
        transaction.rollback()
        self._live.end_snapshot(conn)

    @contextmanager
    def _connection(self) -> Iterator[Connection]:
        """The snapshot's connection inside `snapshot()`, else a short-lived one."""
        if self._conn is not None:
            yield self._conn
            return
        with self.engine.connect() as conn:
            yield conn

    store_costs: StoreCosts | None = None  # None: the planner's generic guess
    reads_copy = True  # the CLI prepares before a run (live mode: the positions)

    def traits(self) -> StoreTraits:
        """access.StoreTraits: the declared sensitivity and bound, the score column's type,
        whether the driver writes parameters into the statement text."""
        return StoreTraits(
            self.sensitivity,
            self.max_items_per_client,
            self.integer_scores,
            parameters_in_text=self.parameters_in_text,
            oblivious_reads_seen=None
            if self.accept_statistics_channel
            else self._oblivious_reads_seen(),
        )

    def run_freshness(self) -> dict[str, Any] | None:
        """How the run in progress knew its data current (access.run_freshness): operator
        diagnostics, result.diagnostics.plan["freshness"]."""
        return None if self._conn is None else dict(self.last_freshness or {})

    # ----- helpers ----------------------------------------------------------------------------

    def _no_keyed_sql(self) -> None:
        """Whether the driver writes parameters into the statement text (every driver of a
        dialect whose LiveSQL says parameters_in_text, and the engine's CLIENT_SIDE_BINDING):
        then an oblivious release does not send it the drawn positions
        (access.parameters_in_text)."""
        self.parameters_in_text = (
            self._live.parameters_in_text or self.engine.dialect.driver in CLIENT_SIDE_BINDING
        )

    def _chunks(self, values: list[Any]) -> Iterator[list[Any]]:
        for i in range(0, len(values), self.max_params):
            yield values[i : i + self.max_params]

    def _rows(self, records: Sequence[Any], round_trips: int) -> Rows:
        if not records:
            empty = np.empty(0, dtype=np.int64)
            return Rows(empty, empty.copy(), np.empty(0, np.float64), round_trips)
        # Column by column: much faster than zip(*records) on a million rows.
        return Rows(
            np.fromiter((rec[0] for rec in records), dtype=np.int64, count=len(records)),
            id_array([rec[1] for rec in records]),
            self._checked(np.asarray([rec[2] for rec in records], dtype=np.float64)),
            round_trips,
        )


def _is_numeric(type_: sa.types.TypeEngine[Any]) -> bool:
    # Float is not a subclass of Numeric since SQLAlchemy 2.1.
    return isinstance(type_, sa.Integer | sa.Numeric | sa.Float) and not isinstance(
        type_, sa.Boolean
    )


def _match(name: str, names: Sequence[str], nocase: bool) -> str | None:
    """`name` as `names` spell it: exactly, else (nocase) the one name equal without case."""
    if name in names:
        return name
    if nocase:
        alike = [n for n in names if n.lower() == name.lower()]
        if len(alike) == 1:
            return alike[0]
    return None


def catalog_name(
    engine: Engine, table: str, schema: str | None, live: LiveSQL
) -> tuple[str, str | None]:
    """(table, schema) as the database's catalog spells the table the name finds, the schema
    made explicit (the connection's default where none is given): the name as given, else read
    as SQL reads it (_sql.sql_name_spellings; SQLite compares names without case,
    PostgreSQL folds unquoted names to lower case, MariaDB keeps them). So `t`, `T`, `main.t`
    name one table and derive one rank table, position table and set of triggers. A name that
    finds nothing is kept as given (reflection says it does not exist). Cost: the catalog's
    table and view lists of one or two schemas."""
    nocase, fold = live.nocase, live.fold
    try:
        inspector = sa.inspect(engine)
        default = inspector.default_schema_name
        schemas: list[str] | None = None
        for spelled_schema, spelled in sql_name_spellings(table, schema, fold):
            home = default if spelled_schema is None else spelled_schema
            if spelled_schema is not None:
                schemas = schemas if schemas is not None else inspector.get_schema_names()
                home = _match(spelled_schema, schemas, nocase)
            if home is None:
                continue
            names = [*inspector.get_table_names(schema=home), *inspector.get_view_names(home)]
            found = _match(spelled, names, nocase)
            if found is not None:
                return found, home
    except (sa.exc.DBAPIError, NotImplementedError):
        pass  # a catalog this dialect cannot list: the name as given
    return table, schema


def _reflect(bind: Engine | Connection, table: str, schema: str | None, where: str) -> sa.Table:
    try:
        reflected = sa.Table(table, sa.MetaData(), autoload_with=bind, schema=schema)
    except sa.exc.NoSuchTableError:
        raise ValueError(f"{where} does not exist") from None
    except sa.exc.DBAPIError:
        if schema is None:
            raise
        raise ValueError(
            f"{where} cannot be read: schema {schema!r} does not exist or is not visible"
        ) from None
    for column in reflected.c:
        if isinstance(column.type, sa.Float):
            # MySQL / MariaDB DOUBLE reflects as asdecimal=True: values would come back as
            # Decimals rounded to 10 places (1e-300 read as 0). Floats are read as floats.
            column.type.asdecimal = False
    return reflected


def _untyped(type_: sa.types.TypeEngine[Any]) -> bool:
    return isinstance(type_, sa.types.NullType)
