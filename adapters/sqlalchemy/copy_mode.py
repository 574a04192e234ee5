"""SQLAlchemyTable: a table of per-item counts in an SQLAlchemy database, served as a Source.

This class is what from_votes() builds on PostgreSQL (psycopg 3), SQLite, MariaDB (PyMySQL) and
DuckDB (duckdb-engine), and live mode's base (live_mode.py: PostgreSQL, SQLite, MariaDB /
MySQL). SQLAlchemyTable(engine, table) in copy mode is the SQL store engine with the store's
dialect (copy_table.py); an engine of another dialect is refused, in one line, before anything
is read (no dialect of the engine's speaks its SQL).

The canonical order of topk_middleware/access.py (score descending, ties by id ascending, text
ids in byte order) is computed once, by `prepare()`, into a *rank table* (rank, id, score) with
rank = ROW_NUMBER() OVER (ORDER BY score DESC, id) - 1. Every read of a run goes to that table:
sorted access at depth t is a range of ranks, item sampling (Algorithm 3 of Wu, Ohrimenko, Wirth,
ICML 2023, samples a uniformly random unseen item) is `rank IN (...)`, and random access by id is
`id IN (...)`; all three are index reads, so a run reads O(rows it needs), not the table.

Consistency. The rank table is a snapshot of the counts taken by `prepare()`. A run serves it
only where its first query proves it current (the copy compared with the counts: one join);
otherwise the copy is rebuilt first (`_current_copy`), so a release reflects the votes as of its
start.
`is_stale()` says, at the price of one full scan, whether the counts table differs from the
copy. Every read of one run happens inside `snapshot()`, one read-only transaction with the
strongest read-consistent isolation of the dialect, so a concurrent `prepare()` cannot mix two
versions into one answer.

Runs of tied scores (`ScoreRuns`). Beside the rank table, `prepare()` keeps the runs table
`<rank table>_runs`: one row (run, first_rank, score) per distinct score, run its 0-based
position, first_rank its first rank (primary key), score strictly descending along runs, refilled
in the transaction that refills the rank table. Count data has few distinct scores, so random
access by rank is then answered from these rows without reading the rank table. The snapshot
learns how many runs there are in the query that reads m (the last run's number, found through
the primary key), and reads them in one query when the core asks. A rank table built before the
runs table existed gets one from the next `prepare()`; until then `score_run_count()` is None.

All SQL is built with SQLAlchemy Core; identifiers are quoted by SQLAlchemy, never pasted.

Size: one class, SQLAlchemyTable, with the dialect differences (PostgreSQL, MariaDB /
MySQL, SQLite, DuckDB) next to the statement each one changes, until from_votes() and live mode
move onto the engine; live mode is live_mode.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.elements import ColumnElement

from adapters._sql import (
    FINGERPRINT_TAG,
    HIDE_STATISTICS,
    AccessCheck,
    AccessPath,
    RankTableMismatchError,
    id_array,
    may_hide_statistics_sql,
    plain_values,
    sql_name_spellings,
    statistics_accepted,
    statistics_seen,
)
from topk_middleware.access import AccessError, Rows, RunTraits, StoreCosts, StoreTraits
from topk_middleware.keyed_noise import KeyedNoise, oneshot_query, uniform_from_hex_sql
from topk_middleware.privacy import resolve_declared
from topk_middleware.validation import first_line, mask_secrets

from ..contributions import parse_record
from ..dialects.votes import sqlalchemy_dialect
from ..sql.driver import SQLAlchemyDriver, convert
from ..sql.votes import Counts, check_votes, count_votes
from .keyed import _EXCEEDANCES, _KEYED_DIGITS, array_param

__all__ = ["RankTableMismatchError", "SQLAlchemyTable", "StaleRankTableError"]

# Drivers that write every parameter into the statement text on the client (which the server's
# process list, statement history and logs show): pymysql and the other MySQL / MariaDB drivers
# (every one but a connector known to bind on the server, of which none is tested), and psycopg2.
# Such a table is no InStoreOneShot, and an oblivious release does not send it the drawn
# positions (access.parameters_in_text: it reads the whole table instead).
TEXT_PARAMETER_DIALECTS = ("mysql", "mariadb")
TEXT_PARAMETER_DRIVERS = ("psycopg2", "psycopg2cffi")

# Rows per IN list: below every driver's parameter limit (psycopg 65535; SQLite 32766 since
# 3.32, 999 before).
DEFAULT_MAX_PARAMS = 10_000
OLD_SQLITE_MAX_PARAMS = 999
# PostgreSQL truncates identifiers at 63 bytes, MariaDB refuses more than 64 characters.
MAX_NAME_BYTES = 63
# Length of a text id in the MariaDB rank table when the source column has none (TEXT): the
# longest utf8mb4 VARCHAR that InnoDB can index (3072 bytes).
MYSQL_TEXT_ID_LENGTH = 768
# Longest text id (bytes) a PostgreSQL B-tree entry takes with room to spare (limit ~2,700).
PG_MAX_ID_BYTES = 2000
# PostgreSQL prepare(): statement_timeout (seconds), how often the server checks that the client
# is still there (ms), and how long a refresh waits for runs reading the old tables (seconds).
PREPARE_STATEMENT_TIMEOUT = 3600.0
CLIENT_CHECK_INTERVAL_MS = 1000
SWAP_TIMEOUT = 2.0
# The table of rank-table fingerprints, one row per rank table, in the rank table's schema.
FINGERPRINTS_TABLE = "topk_rank_fingerprints"
# Dialects whose catalog gives a table a lasting identity (PostgreSQL oid; MariaDB / MySQL
# InnoDB table id and creation time): elsewhere prepare() compares the copy with the table.
LASTING_IDENTITY = ("postgresql", "mysql", "mariadb")
# from_votes: refreshes of a changing copy before a run gives up.
REFRESH_TRIES = 3


class StaleRankTableError(RuntimeError):
    """The counts table changed after `prepare()` built the rank table."""


def _digest(*parts: str | None) -> str:
    return hashlib.sha1("\x00".join(p or "" for p in parts).encode("utf-8")).hexdigest()[:10]


def _fit(name: str, suffix: str) -> str:
    """`name` + `suffix`, the name cut so that the whole fits MAX_NAME_BYTES."""
    head = name.encode("utf-8")[: MAX_NAME_BYTES - len(suffix.encode("utf-8"))]
    return head.decode("utf-8", "ignore") + suffix


def _runs_name(rank_table: str) -> str:
    """The runs table of `rank_table`: `<rank_table>_runs`, or, past MAX_NAME_BYTES (where
    PostgreSQL would truncate it, possibly to the rank table's own name), the name cut short
    with a hash of the whole of it."""
    name = rank_table + "_runs"
    if len(name.encode("utf-8")) <= MAX_NAME_BYTES:
        return name
    return _fit(rank_table, f"_{_digest(rank_table)}_runs")


class _RunsTableMissing(Exception):
    """The runs table was dropped since this object last saw it."""


def _is_numeric(type_: sa.types.TypeEngine[Any]) -> bool:
    # Float is not a subclass of Numeric since SQLAlchemy 2.1.
    return isinstance(type_, sa.Integer | sa.Numeric | sa.Float) and not isinstance(
        type_, sa.Boolean
    )


class SQLAlchemyTable:
    """A histogram in a database table, read through an SQLAlchemy engine.

    `SQLAlchemyTable(engine, "votes_per_item", id="item", score="votes")` wraps an existing table
    with one row per item of the public domain (zero counts included). Call `prepare()` once (and
    again after the counts change) before running `private_top_k` on it.

    `mode="copy"` (the default) serves runs from the rank table built by `prepare()`.
    `mode="live"` reads the table itself through an index, with item positions kept by
    triggers, so that writes need no rebuild (PostgreSQL, MariaDB / MySQL, SQLite; see
    adapters/sqlalchemy/live_mode.py).
    """

    # The class serving each mode other than "copy" (live_mode.py registers itself), and copy
    # mode on the dialects that have moved onto the SQL store engine (copy_table.py).
    mode_classes: dict[str, type[SQLAlchemyTable]] = {}  # noqa: RUF012
    copy_classes: dict[str, type] = {}  # noqa: RUF012

    def __new__(cls, *args: Any, mode: str = "copy", **kwargs: Any) -> Any:
        if cls is SQLAlchemyTable and mode in cls.mode_classes:
            return super().__new__(cls.mode_classes[mode])
        if cls is SQLAlchemyTable and mode == "copy" and (args or "engine" in kwargs):
            engine = engine_of(args[0] if args else kwargs.pop("engine"))
            moved = cls.copy_classes.get(engine.dialect.name)
            if moved is None:
                raise ValueError(
                    f"SQLAlchemyTable reads PostgreSQL, SQLite, MariaDB / MySQL and DuckDB "
                    f"(duckdb-engine) engines; this engine's dialect is {engine.dialect.name!r}, "
                    "whose SQL it does not speak: read the counts into an ArraySource, or copy "
                    "them into one of those stores"
                )
            return moved(engine, *args[1:], mode=mode, **kwargs)
        return super().__new__(cls)

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
        self._record: str | None = None  # from_votes: what its rank table records
        self.engine = engine = engine_of(engine)
        self.dialect = engine.dialect.name
        if self.dialect == "sqlite" and _sqlite_version(engine) < (3, 25):
            raise RuntimeError("SQLite >= 3.25 is needed (window functions for the rank table)")
        self._no_keyed_sql()
        if isinstance(table, sa.Table):
            schema = table.schema
            table = table.name
        self.where = f"table {table!r}" if schema is None else f"table {schema!r}.{table!r}"
        table, schema = catalog_name(engine, table, schema)  # every object name derives from it
        self.table_name: str | None = table
        self._identity_tables = [(schema, table)]  # what the fingerprint names (see _facts)
        self.id_column, self.score_column = id, score
        self._source = _reflect(engine, table, schema, self.where)
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
            parse_record(_table_comment(engine, table, schema)),
            self.where,
        )
        self._text_ids = isinstance(self._source.c[id].type, sa.String)
        self._from: sa.FromClause = self._source
        self._votes: Counts | None = None
        self._id: ColumnElement[Any] = self._source.c[id]
        self._score: ColumnElement[Any] = self._source.c[score]
        score_type = self._source.c[score].type
        if not (_is_numeric(score_type) or (self.dialect == "sqlite" and _untyped(score_type))):
            raise TypeError(
                f"{self.where} column {score!r} must be numeric, its type is {score_type}"
            )
        digest = _digest(schema, table, id, score)
        self._init_ranks(rank_table or _fit(table, f"__topk_rank_{digest}"), schema, max_params)
        self._source_indexes = self._index_specs(digest)
        self._statistics_role()  # asked once, here: traits() reads it (PostgreSQL only)

    def _refuse_untyped_id(self) -> None:
        """An id column without a declared type (SQLite allows one) gives the rank table no
        type to copy: refused, saying what to declare."""
        if _untyped(self._source.c[self.id_column].type):
            raise TypeError(
                f"{self.where} column {self.id_column!r} has no declared type: declare it "
                "INTEGER or TEXT (ids of one type), e.g. by copying the table"
            )

    # ----- construction from raw votes ------------------------------------------------------
    @classmethod
    def from_votes(
        cls,
        engine: Engine | str,
        votes_table: str,
        items_table: str,
        client: str = "client",
        item: str = "item",
        item_id: str = "id",
        *,
        schema: str | None = None,
        rank_table: str | None = None,
        max_params: int | None = None,
        weight: str | None = None,
        max_per_item: float = 1,
        max_items_per_client: int | None = None,
    ) -> SQLAlchemyTable:
        """Counts from raw votes with bounded contributions (adapters/contributions.py,
        adapters/sql/votes.py): a client adds to an item min(its rows for the item, or the sum
        of their `weight`, `max_per_item`) (COUNT(DISTINCT client) when that is 1 without
        weight), to at most `max_items_per_client` items chosen by a keyed hash (SHA-256 of a
        fresh secret key, the client and the item, a bound parameter; PostgreSQL, MariaDB /
        MySQL and DuckDB: SQLite has no SHA-256 and refuses it); the source's sensitivity is
        `max_per_item`.

        `items_table` lists the public item domain (column `item_id`); `votes_table` holds
        (client, item[, weight]) rows. An outer join keeps the items without votes (score 0), so
        m is the size of the public domain, not the number of items that happen to have votes.
        NULL clients are not counted. Tables, columns and their types are checked here; the
        votes are checked where they are counted, in every build of the copy by prepare() (a
        vote for an item missing from the domain, a negative, NaN or infinite weight: refused),
        and the copy carries the record of the bounds.
        """
        engine = engine_of(engine)
        dialect, driver = sqlalchemy_dialect(engine), SQLAlchemyDriver(engine)
        with driver.session():
            counts = count_votes(
                dialect,
                driver,
                votes=votes_table,
                items=items_table,
                schema=schema,
                client=client,
                item=item,
                item_id=item_id,
                weight=weight,
                max_per_item=max_per_item,
                max_items_per_client=max_items_per_client,
            )
        statement = sa.text(convert(counts.select, "text")[0]).bindparams(**counts.params)
        bound, max_items = counts.sensitivity, counts.max_items
        self = cls.__new__(cls)
        self.sensitivity, self.max_items_per_client = float(bound), max_items
        self._record = counts.record  # recorded with the rank table prepare() fills
        self._votes = counts  # checked in every build of the copy (_validate)
        self.engine = engine
        self.dialect = engine.dialect.name
        self._no_keyed_sql()
        if self.dialect == "sqlite" and _sqlite_version(engine) < (3, 25):
            raise RuntimeError("SQLite >= 3.25 is needed (window functions for the rank table)")
        items = _reflect(engine, items_table, schema, f"table {items_table!r}")
        id_type = items.c[item_id].type
        self._text_ids = isinstance(id_type, sa.String)
        score_type = sa.BigInteger() if weight is None else sa.Double()  # 8 bytes everywhere
        self._from = statement.columns(
            sa.column("id", id_type), sa.column("score", score_type)
        ).subquery("topk_counts")
        self.where = f"votes {votes_table!r} over items {items_table!r}"
        self.table_name = None
        self._identity_tables = [(schema, votes_table), (schema, items_table)]
        self.id_column, self.score_column = item_id, "score"
        self._source = None
        self._id, self._score = self._from.c.id, self._from.c.score
        self._id_type = id_type
        # one copy per definition of the counts: the tables and columns, and the bounds where
        # they differ from one vote per client and item
        bounds = () if (weight, bound, max_items) == (None, 1, None) else (weight, self._record)
        digest = _digest(schema, votes_table, items_table, client, item, item_id, *bounds)
        name = rank_table or _fit(f"{votes_table}__{items_table}", f"__topk_votes_{digest}")
        self._init_ranks(name, schema, max_params, score_type=score_type)
        self._source_indexes = []
        return self

    def _init_ranks(
        self,
        name: str,
        schema: str | None,
        max_params: int | None,
        score_type: sa.types.TypeEngine[Any] | None = None,
    ) -> None:
        id_type = self._id_type if self._source is None else self._source.c[self.id_column].type
        self.rank_table_name = name
        score_type = score_type or _copy_score_type(self._score.type)
        record = getattr(self, "_record", None)
        self._ranks = sa.Table(
            name,
            sa.MetaData(),
            sa.Column("rank", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("id", self._rank_id_type(id_type), nullable=False),
            sa.Column("score", score_type, nullable=False),
            sa.Index(_fit("ix", f"_topk_{_digest(schema, name)}_id"), "id"),
            schema=schema,
            comment=record,
        )
        # The runs of tied scores of the rank table: (run number, first rank, score).
        self.runs_table_name = _runs_name(name)
        self._runs = sa.Table(
            self.runs_table_name,
            sa.MetaData(),
            sa.Column("run", sa.BigInteger, nullable=False, autoincrement=False),
            sa.Column("first_rank", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("score", score_type.copy(), nullable=False),
            schema=schema,
        )
        self._fingerprints = sa.Table(
            FINGERPRINTS_TABLE,
            sa.MetaData(),
            sa.Column("rank_table", sa.String(255), primary_key=True),
            sa.Column("mark", sa.BigInteger, nullable=False),
            schema=schema,
        )
        self._proof: Any = None  # see _trusted(): this object's proof that the copy is current
        self._text_ids = isinstance(id_type, sa.String)
        if max_params is None:
            old = self.dialect == "sqlite" and _sqlite_version(self.engine) < (3, 32)
            max_params = OLD_SQLITE_MAX_PARAMS if old else DEFAULT_MAX_PARAMS
        if max_params < 1:
            raise ValueError(f"max_params must be >= 1, got {max_params}")
        self.max_params = int(max_params)
        self._conn: Connection | None = None
        self._m: int | None = None
        self._run_count: int | None = None  # runs in the snapshot's runs table, if any
        # Whether the runs table exists, as last seen (None: not looked yet). Believed present,
        # it is counted with m at no extra query; believed absent, each snapshot looks again.
        self._with_runs: bool | None = None

    # ----- dialect specifics ----------------------------------------------------------------
    def _mysql_bin_collation(self) -> str:
        """A binary, NO PAD utf8mb4 collation: code point order = UTF-8 byte order, and
        'a' != 'a ' (the PAD SPACE utf8mb4_bin would ignore trailing spaces)."""
        if getattr(self.engine.dialect, "is_mariadb", False):
            return "utf8mb4_nopad_bin"  # MariaDB >= 10.2
        return "utf8mb4_0900_bin"  # MySQL >= 8.0

    def _id_key(self, column: ColumnElement[Any]) -> ColumnElement[Any]:
        """The id as compared in the canonical order: text in byte order on every dialect."""
        if not self._text_ids:
            return column
        if self.dialect == "postgresql":
            return column.collate("C")
        if self.dialect == "sqlite":
            return column.collate("BINARY")
        if self.dialect == "duckdb":
            return column.collate("binary")
        as_utf8 = sa.cast(column, mysql.CHAR(charset="utf8mb4"))  # MariaDB / MySQL
        return as_utf8.collate(self._mysql_bin_collation())

    def _rank_id_type(self, source_type: sa.types.TypeEngine[Any]) -> sa.types.TypeEngine[Any]:
        """The id column of the rank table; text ids get a byte-order collation so that
        `id IN (...)` is an exact, case- and space-sensitive match."""
        if not isinstance(source_type, sa.String):
            return source_type.copy()
        if self.dialect == "postgresql":
            return sa.Text(collation="C")
        if self.dialect == "sqlite":
            return sa.Text(collation="BINARY")
        if self.dialect in ("mysql", "mariadb"):
            length = min(source_type.length or MYSQL_TEXT_ID_LENGTH, MYSQL_TEXT_ID_LENGTH)
            return mysql.VARCHAR(length, charset="utf8mb4", collation=self._mysql_bin_collation())
        return sa.String()

    def _not_finite(self) -> ColumnElement[bool] | None:
        """A condition true for NaN or infinite scores, where the dialect can store them."""
        score = self._score
        if not isinstance(score.type, sa.Float | sa.Numeric) and not _untyped(score.type):
            return None  # integers are finite
        if self.dialect == "postgresql":
            # PostgreSQL orders NaN above every number and treats NaN = NaN as true.
            as_float = sa.cast(score, sa.Double)
            return as_float.in_([math.nan, math.inf, -math.inf])
        if self.dialect == "duckdb":
            return sa.not_(sa.func.isfinite(sa.cast(score, sa.Double)))
        if self.dialect == "sqlite":
            return score.in_([math.inf, -math.inf])  # SQLite stores NaN as NULL
        return None  # MariaDB / MySQL: DOUBLE cannot hold NaN or infinity

    def _index_specs(self, digest: str) -> list[sa.Index]:
        """Indexes on the counts table itself, where the dialect uses them: (score DESC, id) lets
        the window function of prepare() read in order, (id) serves is_stale()."""
        if self._source is None:
            return []  # no index on a query
        id_type = self._source.c[self.id_column].type
        if self.dialect in ("mysql", "mariadb") and isinstance(id_type, sa.String):
            if not id_type.length or id_type.length > MYSQL_TEXT_ID_LENGTH:
                return []  # MariaDB cannot index TEXT, or keys over 3072 bytes, whole
        key = self._id_key(self._id) if self.dialect == "postgresql" else self._id
        return [
            sa.Index(_fit("ix", f"_topk_{digest}_score_id"), self._score.desc(), key),
            sa.Index(_fit("ix", f"_topk_{digest}_id"), self._id),
        ]

    # ----- the fingerprint: does the rank table belong to this table? ---------------------------
    # prepare() records, in the table topk_rank_fingerprints (one row per rank table, written in
    # the transaction that fills it), a mark: a hash of the catalog facts of the counts table
    # (or of the votes and items tables) and of the rank table. Each run reads the mark and the
    # facts in its first query and refuses a rank table whose mark is missing (prepare() did not
    # build it) or differs (built from an earlier table of that name). The facts: PostgreSQL,
    # the tables' oids (a lasting identity); MariaDB, the InnoDB table ids and creation times
    # (MySQL: creation times, to the second); SQLite, each table's root page and CREATE
    # statement; DuckDB, each table's CREATE statement. SQLite and DuckDB have no lasting table
    # identity: a table dropped and re-created with the same definition (and, on SQLite, the
    # same root page, which is often reused) is not seen by a run; prepare() then compares the
    # copy with the table (one scan) unless this object built or verified it and no schema
    # change happened since (SQLite's schema_version, DuckDB's table oids), and rebuilds it if
    # they differ. Writes since the last prepare() are, by the copy's contract, not seen.
    def _facts(self) -> list[ColumnElement[Any]]:
        """The catalog facts of the tables the fingerprint names, as scalar subqueries."""
        tables = [*self._identity_tables, (self._ranks.schema, self._ranks.name)]
        preparer = self.engine.dialect.identifier_preparer
        facts: list[ColumnElement[Any]] = []
        for i, (schema, name) in enumerate(tables):
            s_, t_ = f"topk_s{i}", f"topk_t{i}"
            if self.dialect == "postgresql":
                qualified = (
                    preparer.quote(name)
                    if schema is None
                    else (preparer.quote_schema(schema) + "." + preparer.quote(name))
                )
                query = sa.text(f"SELECT to_regclass(:{t_})::oid::text").bindparams(
                    **{t_: qualified}
                )
            elif self.dialect in ("mysql", "mariadb"):
                where = f"coalesce(:{s_}, database())"
                table_id = (
                    "(SELECT TABLE_ID FROM information_schema.INNODB_SYS_TABLES "
                    f"WHERE NAME = concat({where}, '/', :{t_}))"
                    if getattr(self.engine.dialect, "is_mariadb", False)
                    else "NULL"
                )
                query = sa.text(
                    f"SELECT concat_ws(' ', {table_id}, (SELECT CREATE_TIME FROM "
                    f"information_schema.TABLES WHERE TABLE_SCHEMA = {where} "
                    f"AND TABLE_NAME = :{t_}))"
                ).bindparams(**{s_: schema, t_: name})
            elif self.dialect == "sqlite":
                master = ("" if schema is None else preparer.quote_schema(schema) + ".") + (
                    "sqlite_master"
                )
                query = sa.text(
                    f"SELECT rootpage || ' ' || sql FROM {master} "
                    f"WHERE type = 'table' AND name = :{t_}"
                ).bindparams(**{t_: name})
            else:  # DuckDB
                query = sa.text(
                    "SELECT sql FROM duckdb_tables() WHERE database_name = current_database() "
                    f"AND schema_name = coalesce(:{s_}, current_schema()) AND table_name = :{t_}"
                ).bindparams(**{s_: schema, t_: name})
            facts.append(query.columns(sa.column("fact", sa.String)).scalar_subquery())
        return facts

    def _stored_mark(self) -> ColumnElement[Any]:
        f = self._fingerprints.c
        return sa.select(f.mark).where(f.rank_table == self._ranks.name).scalar_subquery()

    @staticmethod
    def _mark_of(facts: Sequence[Any]) -> int:
        text = "\x00".join([FINGERPRINT_TAG, *("" if f is None else str(f) for f in facts)])
        digest = hashlib.sha1(text.encode("utf-8")).digest()[:8]
        return int.from_bytes(digest, "big", signed=True)

    def _check_mark(self, stored: Any, facts: Sequence[Any], strict: bool = True) -> bool:
        """Whether the stored mark is the current one. A rank table without a mark raises
        RankTableMismatchError; so does one built from an earlier table of this name (dropped
        and re-created, truncated on MariaDB) where `strict`, while a run that is not frozen
        reads the table instead (False)."""
        if stored is None:
            why = "prepare() did not build it (no fingerprint)"
        elif int(stored) != self._mark_of(facts):
            if not strict:
                return False
            why = "it was built from an earlier table of this name, or the table was re-created"
        else:
            return True
        raise RankTableMismatchError(
            f"{self.where}: the rank table {self._ranks.name!r} does not belong to this table "
            f"({why}): call prepare(refresh=True)"
        )

    def _stamp(self, conn: Connection) -> None:
        """Record the current mark (in the caller's transaction, after the fill)."""
        columns = self._facts()
        facts = conn.execute(sa.select(*columns)).one() if columns else ()
        replace_row(
            conn,
            conn.dialect.identifier_preparer.format_table(self._fingerprints),
            {"rank_table": self._ranks.name, "mark": self._mark_of(facts)},
        )

    def _proof_now(self, conn: Connection) -> Any:
        """What proves, to this object, that no table was re-created since it last looked:
        SQLite's schema_version (any schema change moves it), DuckDB's table oids (handed out
        anew within an open database); None elsewhere (the facts are lasting there)."""
        if self.dialect == "sqlite":
            return conn.exec_driver_sql("PRAGMA schema_version").scalar()
        if self.dialect == "duckdb":
            names = [n for _, n in self._identity_tables] + [self._ranks.name]
            return tuple(
                conn.execute(
                    sa.text(
                        "SELECT table_oid FROM duckdb_tables() WHERE database_name = "
                        "current_database() AND table_name IN :names ORDER BY table_name"
                    ).bindparams(sa.bindparam("names", names, expanding=True))
                ).scalars()
            )
        return None

    def _trusted(self, conn: Connection) -> bool:
        """prepare() without refresh, with a filled rank table, in its transaction: keep it
        (True) or rebuild it (False). A rank table prepare() did not build is refused."""
        facts = self._facts()
        stored, *current = conn.execute(sa.select(self._stored_mark(), *facts)).one()
        if stored is None:
            raise RankTableMismatchError(
                f"{self.where}: a table named {self._ranks.name!r} exists but prepare() did not "
                "build it (no fingerprint): drop it, pass another rank_table name, or call "
                "prepare(refresh=True) to replace it"
            )
        if int(stored) != self._mark_of(current):
            return False
        if self.dialect in LASTING_IDENTITY:
            return True
        proof = self._proof_now(conn)
        if proof is not None and proof == self._proof:
            return True
        if self._copy_differs(conn):
            return False
        self._proof = proof
        return True

    # ----- prepare ------------------------------------------------------------------------
    def prepare(
        self,
        refresh: bool = False,
        *,
        index_source: bool = True,
        statement_timeout: float | None = PREPARE_STATEMENT_TIMEOUT,
        swap_timeout: float = SWAP_TIMEOUT,
    ) -> None:
        """Validate the counts and build what sublinear access needs; idempotent.

        Creates, if missing, the rank table (rank primary key, index on id), its runs table
        (first_rank primary key) and, with `index_source`, indexes on (score DESC, id) and (id)
        of the counts table. If the rank table was empty or missing, or with `refresh=True`
        (after writes to the counts), it then validates the counts and refills the rank table
        and the runs table in one transaction (a concurrent run keeps the snapshot it started
        with); without `refresh` a filled rank table is kept, as in the other adapters. Raises
        ValueError naming the table and column for a missing, empty, NULL, NaN, infinite or
        negative score, a NULL id or a duplicate id.

        What is released is what was validated: on PostgreSQL validation and copy read one
        REPEATABLE READ snapshot, and on every dialect the copy itself is checked again before
        the transaction commits (MariaDB's INSERT ... SELECT reads the latest rows, not the
        snapshot), so a row a writer committed in between cannot slip in unvalidated.

        PostgreSQL, as PostgresTable: concurrent prepare() calls on one rank table wait for
        each other (a session advisory lock); each statement has `statement_timeout` seconds
        (None: the server's setting) and the server stops the work of a client that went away;
        a refresh of a filled rank table builds the new tables beside the old ones and swaps
        them in at the end of its transaction (no dead rows; runs in progress keep reading the
        old ones), waiting at most `swap_timeout` seconds for runs still reading them, after
        which it raises TimeoutError and changes nothing.
        """
        if self._conn is not None:
            raise RuntimeError("prepare() cannot run inside snapshot() of the same table")
        with self.engine.connect() as conn:
            had_copy = sa.inspect(conn).has_table(self._ranks.name, schema=self._ranks.schema)
        try:
            self._prepare(refresh, index_source, statement_timeout, swap_timeout)
        except BaseException:
            if not had_copy:  # refused or stopped: what this call made goes again
                self.uninstall()
            raise

    def _prepare(
        self,
        refresh: bool,
        index_source: bool,
        statement_timeout: float | None,
        swap_timeout: float,
    ) -> None:
        """prepare() (its docstring), the undo on failure aside."""
        if statement_timeout is not None and not statement_timeout > 0:
            raise ValueError(f"statement_timeout must be > 0 seconds, got {statement_timeout}")
        if not swap_timeout > 0:
            raise ValueError(f"swap_timeout must be > 0 seconds, got {swap_timeout}")
        with self._prepare_lock() as locked:
            _create_shared(self.engine, self._fingerprints)
            with self._writing(locked) as conn:
                self._create_rank_table(conn)
                if index_source:
                    for index in self._source_indexes:
                        index.create(conn, checkfirst=True)
                filled = conn.execute(sa.select(self._ranks.c.rank).limit(1)).first() is not None
                runs_filled = conn.execute(sa.select(self._runs.c.run).limit(1)).first() is not None
                if filled and runs_filled and not refresh:
                    refresh = not self._trusted(conn)
            if filled and runs_filled and not refresh:
                self._with_runs = True
                return
            try:
                if locked is not None:
                    conn = locked.execution_options(isolation_level="REPEATABLE READ")
                    with conn.begin():
                        self._limit_statements(conn, statement_timeout)
                        if filled:
                            self._fill_beside(conn, swap_timeout)
                        else:
                            self._fill(conn)
                        self._stamp(conn)
                else:
                    with self.engine.connect() as conn, conn.begin():
                        self._fill(conn)
                        self._stamp(conn)
            except sa.exc.OperationalError as error:
                if getattr(error.orig, "sqlstate", None) != "57014":  # query_canceled
                    raise
                raise TimeoutError(
                    f"{self.where}: prepare() was stopped by its statement_timeout of "
                    f"{statement_timeout} s; nothing was changed"
                ) from None
        self._analyze()
        with self.engine.connect() as conn:
            self._proof = self._proof_now(conn)

    def uninstall(self) -> None:
        """Drop everything prepare() made: the rank table and its runs table (their indexes go
        with them), this rank table's row in topk_rank_fingerprints (and that table once no
        rank table is left in it), and the indexes prepare() put on the table of counts. The
        table's rows are not touched. A filled rank table with no fingerprint (not built by
        prepare()) is refused (RankTableMismatchError) and nothing is dropped. Idempotent;
        runs need prepare() again afterwards. An uninstall that empties topk_rank_fingerprints
        while another table's prepare() is copying makes that prepare fail; call it again."""
        if self._conn is not None:
            raise RuntimeError("uninstall() cannot run inside snapshot() of the same table")
        schema, f = self._ranks.schema, self._fingerprints
        with self.engine.begin() as conn:
            inspector = sa.inspect(conn)
            with_marks = inspector.has_table(f.name, schema=schema)
            if inspector.has_table(self._ranks.name, schema=schema):
                filled = conn.execute(sa.select(self._ranks.c.rank).limit(1)).first()
                marked = (
                    with_marks
                    and conn.execute(
                        sa.select(f.c.mark).where(f.c.rank_table == self._ranks.name)
                    ).first()
                )
                if filled is not None and not marked:
                    raise RankTableMismatchError(
                        f"{self.where}: the table {self._ranks.name!r} was not built by "
                        "prepare() (no fingerprint): uninstall() leaves it alone"
                    )
            for table in (self._runs, self._ranks):
                table.drop(conn, checkfirst=True)
            if with_marks:
                conn.execute(sa.delete(f).where(f.c.rank_table == self._ranks.name))
                if conn.execute(sa.select(f.c.rank_table).limit(1)).first() is None:
                    f.drop(conn)
            for index in self._source_indexes:
                index.drop(conn, checkfirst=True)
        self._proof = None

    @contextmanager
    def _writing(self, locked: Connection | None) -> Iterator[Connection]:
        """A connection in a transaction: the locked one, or a short-lived one."""
        if locked is not None:
            with locked.begin():
                yield locked
        else:
            with self.engine.begin() as conn:
                yield conn

    @contextmanager
    def _prepare_lock(self) -> Iterator[Connection | None]:
        """PostgreSQL: a connection holding a session advisory lock on the rank table's name
        for the whole of prepare() (concurrent prepare() calls wait for each other, instead of
        colliding on CREATE TABLE or on the rows); released at the end, or by the server if
        the client dies. Other dialects: None (no lock)."""
        if self.dialect != "postgresql":
            yield None
            return
        name = self.engine.dialect.identifier_preparer.format_table(self._ranks)
        key = int.from_bytes(hashlib.sha1(name.encode("utf-8")).digest()[:8], "big", signed=True)
        with self.engine.connect() as conn:
            conn.execute(sa.select(sa.func.pg_advisory_lock(key)))
            conn.commit()
            try:
                yield conn
            finally:
                if conn.in_transaction():
                    conn.rollback()
                conn.execute(sa.select(sa.func.pg_advisory_unlock(key)))
                conn.commit()

    def _limit_statements(self, conn: Connection, timeout: float | None) -> None:
        """PostgreSQL, for the transaction: statement_timeout, and the server's check that the
        client is still there (PostgreSQL >= 14)."""
        settings = {}
        if timeout is not None:
            settings["statement_timeout"] = str(max(1, round(timeout * 1000)))
        if (self.engine.dialect.server_version_info or (0,)) >= (14,):
            settings["client_connection_check_interval"] = str(CLIENT_CHECK_INTERVAL_MS)
        for name, value in settings.items():
            conn.execute(sa.select(sa.func.set_config(name, value, True)))

    def _beside(self) -> tuple[sa.Table, sa.Table]:
        """The rank and runs tables a PostgreSQL refresh builds beside the old ones, with
        index names of their own (renamed to the old ones' at the swap)."""
        digest = _digest(self._ranks.schema, self._ranks.name)
        meta = sa.MetaData()
        r, u = self._ranks.c, self._runs.c
        ranks = sa.Table(
            f"topk_{digest}_new",
            meta,
            sa.Column("rank", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("id", r.id.type, nullable=False),
            sa.Column("score", r.score.type, nullable=False),
            sa.Index(f"topk_{digest}_new_id", "id"),
            schema=self._ranks.schema,
            comment=self._ranks.comment,
        )
        ranks.primary_key.name = f"topk_{digest}_new_pk"
        runs = sa.Table(
            f"topk_{digest}_new_runs",
            meta,
            sa.Column("run", sa.BigInteger, nullable=False, autoincrement=False),
            sa.Column("first_rank", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("score", u.score.type, nullable=False),
            schema=self._runs.schema,
        )
        runs.primary_key.name = f"topk_{digest}_new_runs_pk"
        return ranks, runs

    def _fill_beside(self, conn: Connection, swap_timeout: float) -> None:
        """PostgreSQL refresh: new tables beside the old ones, filled and checked, then swapped
        in (drop the old ones, rename the new ones and their indexes), all in `conn`'s
        transaction: nothing changes unless it commits, and no dead rows are left."""
        ranks, runs = self._beside()
        for table in (runs, ranks):
            table.drop(conn, checkfirst=True)  # left by a prepare() that was killed
        ranks.create(conn)
        runs.create(conn)
        self._fill(conn, ranks, runs)
        inspector = sa.inspect(conn)
        renames: list[tuple[str | None, str]] = []
        for old, new in ((self._ranks, ranks), (self._runs, runs)):
            renames.append(
                (new.primary_key.name, inspector.get_pk_constraint(old.name, old.schema)["name"])
            )
            by_columns = {
                tuple(ix["column_names"]): ix["name"]
                for ix in inspector.get_indexes(old.name, schema=old.schema)
            }
            designed = {tuple(c.name for c in ix.columns): ix.name for ix in old.indexes}
            for index in new.indexes:
                key = tuple(c.name for c in index.columns)
                renames.append((index.name, by_columns.get(key) or designed[key]))
        preparer = self.engine.dialect.identifier_preparer
        try:
            with conn.begin_nested():
                conn.execute(
                    sa.select(
                        sa.func.set_config(
                            "lock_timeout", str(max(1, round(swap_timeout * 1000))), True
                        )
                    )
                )
                conn.exec_driver_sql(
                    f"DROP TABLE {preparer.format_table(self._runs)}, "
                    f"{preparer.format_table(self._ranks)}"
                )
        except sa.exc.OperationalError as error:
            if getattr(error.orig, "sqlstate", None) != "55P03":  # lock_not_available
                raise
            raise TimeoutError(
                f"{self.where}: prepare(refresh=True) waited {swap_timeout} s (swap_timeout) for "
                f"runs still reading the rank table {self._ranks.name!r}; nothing was changed: "
                "try again when they have ended, or pass a longer swap_timeout"
            ) from None
        conn.execute(sa.select(sa.func.set_config("lock_timeout", "0", True)))
        for old, new in ((self._ranks, ranks), (self._runs, runs)):
            conn.exec_driver_sql(
                f"ALTER TABLE {preparer.format_table(new)} RENAME TO {preparer.quote(old.name)}"
            )
        schema = (
            "" if self._ranks.schema is None else preparer.quote_schema(self._ranks.schema) + "."
        )
        for current, final in renames:
            if current and final and current != final:
                name = schema + preparer.quote(current)
                conn.exec_driver_sql(f"ALTER INDEX {name} RENAME TO {preparer.quote(final)}")

    def _fill(
        self, conn: Connection, ranks: sa.Table | None = None, runs: sa.Table | None = None
    ) -> None:
        """Validate, copy, check the copy: inside the caller's transaction (into the rank and
        runs tables, or the given ones)."""
        ranks = self._ranks if ranks is None else ranks
        runs = self._runs if runs is None else runs
        self._validate(conn)
        conn.execute(sa.delete(ranks))
        position = sa.func.row_number().over(order_by=(self._score.desc(), self._id_key(self._id)))
        try:
            conn.execute(
                sa.insert(ranks).from_select(
                    ["rank", "id", "score"],
                    sa.select(position - 1, self._id, self._score).select_from(self._from),
                )
            )
        except sa.exc.IntegrityError:
            raise ValueError(
                f"{self.where} changed while prepare() copied it (a NULL or duplicate id, or a "
                "NULL score, appeared after validation): nothing was replaced, call "
                "prepare(refresh=True) again"
            ) from None
        r = ranks.c
        first = sa.func.min(r.rank)
        conn.execute(sa.delete(runs))
        conn.execute(
            sa.insert(runs).from_select(
                ["run", "first_rank", "score"],
                sa.select(sa.func.row_number().over(order_by=first) - 1, first, r.score)
                .group_by(r.score)
                .order_by(first),
            )
        )
        self._check_copy(conn, ranks)
        self._with_runs = True

    def _check_copy(self, conn: Connection, ranks: sa.Table) -> None:
        """The rank table just written is a valid histogram (one pass over it, in the writing
        transaction): distinct ids, dense ranks, finite non-negative scores."""
        r = ranks.c
        rows, ids, high = conn.execute(
            sa.select(sa.func.count(), sa.func.count(sa.distinct(r.id)), sa.func.max(r.rank))
        ).one()
        bad = conn.execute(
            sa.select(sa.func.count()).where(sa.or_(r.score < 0, r.score.is_(None)))
        ).scalar_one()
        if rows != ids or bad or high is None or int(high) + 1 != rows:
            raise ValueError(
                f"{self.where} changed while prepare() copied it (the copy has {rows} rows, "
                f"{ids} distinct ids, {bad} bad scores): a concurrent writer added a duplicate "
                "or invalid row; nothing was replaced, call prepare(refresh=True) again"
            )

    def _analyze(self) -> None:
        if self.dialect == "postgresql" or (self.dialect == "sqlite" and _keeps_stat1(self.engine)):
            # Fresh statistics, so that the planner reads the rank table by its indexes.
            with self.engine.begin() as conn:
                for table in (self._ranks, self._runs):
                    name = self.engine.dialect.identifier_preparer.format_table(table)
                    conn.exec_driver_sql(f"ANALYZE {name}")

    def _create_rank_table(self, conn: Connection) -> None:
        """Create the rank table and the runs table where missing (an existing table of the same
        name must have their columns)."""
        inspector = sa.inspect(conn)
        for table, kind in ((self._ranks, "rank"), (self._runs, "runs")):
            schema, name = table.schema, table.name
            if not inspector.has_table(name, schema=schema):
                _create_with_comment(conn, table)
                continue
            have = set(_reflect(conn, name, schema, f"{kind} table {name!r}").c.keys())
            want = set(table.c.keys())
            if have != want:
                columns = ", ".join(table.c.keys())
                raise ValueError(
                    f"{kind} table {name!r} exists with columns {sorted(have)}, not "
                    f"({columns}): drop it or pass another rank_table name"
                )

    def _validate(self, conn: Connection) -> None:
        """One aggregate pass and one duplicate probe over the counts (DESIGN invariant 6)."""
        if self._votes is not None:  # from_votes: the votes this build counts (sql/votes.py)
            check_votes(SQLAlchemyDriver(self.engine, connection=conn), self._votes)
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
        if self.dialect == "sqlite":  # a column type is only a hint in SQLite
            checks["not_numeric"] = zero_one(
                sa.and_(score.is_not(None), sa.func.typeof(score).not_in(["integer", "real"]))
            )
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
        if not self._text_ids:
            return
        if self.dialect in ("mysql", "mariadb"):
            length, limit, unit = sa.func.char_length(self._id), MYSQL_TEXT_ID_LENGTH, "characters"
        elif self.dialect == "postgresql":
            length, limit, unit = sa.func.octet_length(self._id), PG_MAX_ID_BYTES, "bytes"
        else:
            return
        longest = conn.execute(sa.select(sa.func.max(length)).select_from(self._from)).scalar()
        if longest is not None and int(longest) > limit:
            raise ValueError(
                f"{self.where} column {self.id_column!r} has an id of {int(longest)} {unit}: ids "
                f"of at most {limit} {unit} can be indexed on {self.dialect}"
            )

    def check(self) -> AccessCheck:
        """How each access kind will be served, from the dialect's EXPLAIN, before a run.

        PostgreSQL: EXPLAIN (FORMAT JSON) with enable_seqscan off, so a sequential scan means no
        index can serve the read. SQLite: EXPLAIN QUERY PLAN ("SCAN" is a full scan, "SEARCH" an
        index read). MariaDB / MySQL: EXPLAIN, access type ALL is a full scan. DuckDB has no
        index-driven reads: a filter on rank skips the row groups of the rank-ordered table
        whose rank range it excludes (min/max pruning); a lookup by id scans the id column.
        Random access by rank also says whether the runs table of tied scores is there.
        """
        r = self._ranks.c
        with self.engine.connect() as conn:
            inspector = sa.inspect(conn)
            if not inspector.has_table(self._ranks.name, schema=self._ranks.schema):
                why = f"no rank table {self._ranks.name!r}: call prepare()"
                names = ("sorted", "random by rank", "random by id")
                return AccessCheck(self.where, [AccessPath(a, True, why) for a in names])
            runs = (
                f"; scores of tied runs from {self._runs.name!r}"
                if inspector.has_table(self._runs.name, schema=self._runs.schema)
                else f" (no runs table {self._runs.name!r}: call prepare())"
            )
            sample = conn.execute(sa.select(r.id).where(r.rank < 3)).scalars().all()
            probes = [
                ("sorted", sa.select(r.rank, r.id, r.score).where(r.rank >= 0, r.rank < 100)),
                ("random by rank", sa.select(r.rank, r.id, r.score).where(r.rank.in_([0, 1, 2]))),
                ("random by id", sa.select(r.id, r.score).where(r.id.in_(sample))),
            ]
            if self.dialect == "duckdb":
                ordered = f"filtered scan of the rank-ordered {self._ranks.name!r}"
                paths = [
                    AccessPath("sorted", False, ordered + " (row groups pruned by rank)"),
                    AccessPath(
                        "random by rank", False, ordered + " (row groups pruned by rank)" + runs
                    ),
                    AccessPath("random by id", True, "scan of the id column per batch"),
                ]
                return AccessCheck(self.where, paths)
            if self.dialect == "postgresql":  # for this transaction only
                conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
            paths = []
            for access, query in probes:
                full_scan, how = self._explain(conn, query)
                how += runs if access == "random by rank" else ""
                paths.append(AccessPath(access, full_scan, how))
            conn.rollback()
        return AccessCheck(self.where, paths)

    def _explain(self, conn: Connection, query: sa.Select[Any]) -> tuple[bool, str]:
        """(full scan?, how) for one query. The statement is compiled by SQLAlchemy, values
        rendered as literals, and prefixed with the dialect's EXPLAIN keyword."""
        statement = str(query.compile(conn, compile_kwargs={"literal_binds": True}))
        if self.dialect == "postgresql":
            plan = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement).scalar_one()
            scans = sorted(set(_seq_scans(plan if isinstance(plan, list) else json.loads(plan))))
            return bool(scans), (
                f"sequential scan of {', '.join(scans)}" if scans else "index scan"
            )
        if self.dialect == "sqlite":
            # A unique comment defeats the driver's statement cache: a cached EXPLAIN keeps the
            # plan of the schema it was prepared against (it never checks the schema cookie).
            nonce = f" -- {uuid.uuid4().hex}"
            plan = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement + nonce)
            details = [row[-1] for row in plan]
            full = any(d.startswith("SCAN") for d in details)
            return full, "; ".join(details)
        rows = conn.exec_driver_sql("EXPLAIN " + statement).mappings().all()  # MariaDB / MySQL
        full = any(row["type"] == "ALL" for row in rows)
        kinds = ", ".join(f"{row['type']} via {row['key']}" for row in rows)
        return full, f"access type {kinds}"

    def is_stale(self) -> bool:
        """Whether the counts differ from the rank table built by the last `prepare()`.

        One full scan of the counts (a join on id): the price of knowing for sure.
        """
        with self._connection() as conn:
            return self._copy_differs(conn)

    def _copy_differs(self, conn: Connection) -> bool:
        """Whether the counts and the rank table differ (one scan of each, joined on id)."""
        live = (
            sa.select(self._id.label("id"), self._score.label("score"))
            .select_from(self._from)
            .subquery("live")
        )
        ranks = self._ranks
        match = sa.and_(ranks.c.id == self._id_key(live.c.id), ranks.c.score == live.c.score)
        unmatched = conn.execute(
            sa.select(sa.func.count())
            .select_from(live.outerjoin(ranks, match))
            .where(ranks.c.rank.is_(None))
        ).scalar_one()
        live_rows = conn.execute(sa.select(sa.func.count()).select_from(live)).scalar_one()
        rank_rows = conn.execute(sa.select(sa.func.count()).select_from(ranks)).scalar_one()
        return bool(unmatched or live_rows != rank_rows)

    # ----- the Source protocol ---------------------------------------------------------------
    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """One read-only transaction for every read of a run (DESIGN invariant 4).

        PostgreSQL: REPEATABLE READ READ ONLY. MariaDB / MySQL: REPEATABLE READ, START TRANSACTION
        WITH CONSISTENT SNAPSHOT, READ ONLY. SQLite: an explicit BEGIN plus a first read, which
        fixes the read snapshot at once (in WAL mode writers go on; otherwise they wait), and
        PRAGMA query_only. DuckDB: one transaction (MVCC). In each, the rank table is read at
        once, so the snapshot is taken when the context is entered.
        """
        if self._conn is not None:
            yield  # nested: the outer snapshot holds
            return
        with self.engine.connect() as conn:
            if self.dialect == "postgresql":
                conn = conn.execution_options(
                    isolation_level="REPEATABLE READ", postgresql_readonly=True
                )
            elif self.dialect in ("mysql", "mariadb"):
                conn = conn.execution_options(isolation_level="REPEATABLE READ")
            transaction = self._begin(conn)
            try:
                transaction = self._open_run(conn, transaction)  # the first read: the snapshot
                transaction = self._current_copy(conn, transaction)
                self._conn = conn
                yield
            finally:
                self._conn = None
                self._close_run()
                self._end(conn, transaction)

    def _open_run(self, conn: Connection, transaction: sa.RootTransaction) -> sa.RootTransaction:
        """What a run needs to know, read in its transaction's first query (copy mode: m, the
        number of runs of tied scores, the fingerprint check); returns the transaction (a new
        one if the run had to start again)."""
        try:
            counts = self._counts(conn, not self._oblivious and self._runs_exist(conn))
        except _RunsTableMissing:
            # Dropped since it was last seen: start again without it (nothing was read).
            self._end(conn, transaction)
            self._with_runs = False
            transaction = self._begin(conn)
            counts = self._counts(conn, not self._oblivious and self._runs_exist(conn))
        self._m, self._run_count = counts
        return transaction

    def _close_run(self) -> None:
        self._m = self._run_count = None

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
            known = (False, "")
            if self.dialect == "postgresql":
                with self.engine.connect() as conn:
                    major, minor = (conn.dialect.server_version_info or (0, 0))[:2]
                    query = may_hide_statistics_sql(major * 10000 + minor)
                    allowed, role = conn.exec_driver_sql(query).one()
                    known = (bool(allowed), str(role))
            self._hides_statistics = known
        return self._hides_statistics

    _hides_statistics: tuple[bool, str] | None = None  # _statistics_role(), once asked
    # The operator accepts that another role sees the blocks oblivious runs read where the
    # engine's role may not set track_counts: they run and warn instead of being refused
    # (StoreTraits.oblivious_reads_seen; docs/promise.md).
    accept_statistics_channel: bool = False
    _warned_statistics = False  # oblivious_reads() said the channel is open

    def _oblivious_reads_seen(self, accepted: bool = False) -> str | None:
        """StoreTraits.oblivious_reads_seen on PostgreSQL where the role may not set
        track_counts (the warning's words where the operator `accepted` the channel)."""
        if self.dialect != "postgresql":
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
        if self.dialect in ("mysql", "mariadb"):
            conn.exec_driver_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        elif self.dialect == "sqlite":
            # pysqlite opens no transaction before a SELECT (unless the engine was set up to emit
            # BEGIN itself): open one, so every read shares one snapshot.
            if not getattr(conn.connection.driver_connection, "in_transaction", False):
                conn.exec_driver_sql("BEGIN")
            conn.exec_driver_sql("PRAGMA query_only = ON")
        return transaction

    def _end(self, conn: Connection, transaction: sa.RootTransaction) -> None:
        """Close the snapshot's transaction (a rollback: it wrote nothing)."""
        transaction.rollback()
        if self.dialect == "sqlite":
            conn.exec_driver_sql("PRAGMA query_only = OFF")
            conn.rollback()  # the transaction the PRAGMA began

    def _runs_exist(self, conn: Connection) -> bool:
        """Whether to count the runs table with m: yes if it was seen, else look (a catalog
        query, made only until the runs table is seen: tables prepared before it existed)."""
        if not self._with_runs:
            self._with_runs = sa.inspect(conn).has_table(self._runs.name, schema=self._runs.schema)
        return self._with_runs

    @contextmanager
    def _connection(self) -> Iterator[Connection]:
        """The snapshot's connection inside `snapshot()`, else a short-lived one."""
        if self._conn is not None:
            yield self._conn
            return
        with self.engine.connect() as conn:
            yield conn

    def _counts(self, conn: Connection, with_runs: bool = False) -> tuple[int, int | None]:
        """m from the rank primary key (dense ranks 0..m-1: an index read, not a scan) and, in
        the same query, the number of runs of tied scores (the last run's number plus one, by
        the runs primary key; None without a runs table, or an empty one)."""
        r, u = self._ranks.c, self._runs.c
        facts = self._facts()
        columns: list[Any] = [
            # one probe of the rank primary key each (min() and max() together, beside other
            # columns, make SQLite and MariaDB scan the whole rank table)
            sa.select(r.rank).order_by(r.rank).limit(1).scalar_subquery(),
            sa.select(r.rank).order_by(r.rank.desc()).limit(1).scalar_subquery(),
            self._stored_mark(),
            *facts,
        ]
        if with_runs:
            last = sa.select(u.run + 1).order_by(u.first_rank.desc()).limit(1)
            columns.append(last.scalar_subquery())
        proof = sa.literal_column("'frozen'") if getattr(self, "frozen", False) else None
        if proof is not None:
            columns.append(proof)
        try:
            low, high, stored, *rest = conn.execute(sa.select(*columns)).one()
        except sa.exc.DBAPIError as error:
            # Asked on a fresh connection: this one may be in an aborted transaction.
            inspector = sa.inspect(self.engine)
            if not inspector.has_table(self._ranks.name, schema=self._ranks.schema):
                raise RuntimeError(
                    f"rank table {self._ranks.name!r} of {self.where} does not exist: call "
                    "prepare() first"
                ) from error
            if with_runs and not inspector.has_table(self._runs.name, schema=self._runs.schema):
                raise _RunsTableMissing from error
            fingerprints = self._fingerprints
            if not inspector.has_table(fingerprints.name, schema=fingerprints.schema):
                self._check_mark(None, ())
            raise
        if high is None:
            raise RuntimeError(
                f"rank table {self._ranks.name!r} of {self.where} is empty: call prepare() first"
            )
        frozen = getattr(self, "frozen", False)
        belongs = self._check_mark(stored, rest[: len(facts)], strict=frozen)
        if proof is not None:
            proven, rest = rest[-1], rest[:-1]
        else:
            proven = None
        self._why = (
            "another table"
            if not belongs
            else None
            if proven is not None
            else "written"
            if proof is not None
            else "unproven"
        )
        runs = rest[len(facts) :]
        if low != 0:
            raise AccessError(f"rank table {self._ranks.name!r} does not start at rank 0")
        count = runs[0] if runs else None
        return int(high) + 1, None if count is None else int(count)

    _oblivious = False  # inside oblivious_reads(): no probe of the runs of ties

    @contextmanager
    def oblivious_reads(self) -> Iterator[None]:
        """access.ObliviousReads: runs opened inside do not read the runs of tied scores (their
        number is the number of distinct scores). Where the operator accepted the statistics
        channel and it is open, it says so once per source."""
        if self.accept_statistics_channel and not self._warned_statistics:
            seen = self._oblivious_reads_seen(accepted=True)
            if seen is not None:
                self._warned_statistics = True
                warnings.warn(seen, stacklevel=3)
        saved, self._oblivious = self._oblivious, True
        try:
            yield
        finally:
            self._oblivious = saved

    def domain_size(self) -> int:
        if self._m is not None:
            return self._m
        with self._connection() as conn:
            return self._counts(conn)[0]

    def score_run_count(self) -> int | None:
        """ScoreRuns: how many runs of tied scores the snapshot's runs table holds (None
        without one); known with m, so no query inside a snapshot."""
        if self._conn is not None:
            return self._run_count
        with self.snapshot():
            return self._run_count

    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        """ScoreRuns: (first rank, score) of every run of tied scores, in rank order: one
        query."""
        u = self._runs.c
        with self._connection() as conn:
            records = conn.execute(sa.select(u.first_rank, u.score).order_by(u.first_rank)).all()
        first = np.fromiter((rec[0] for rec in records), dtype=np.int64, count=len(records))
        scores = np.asarray([rec[1] for rec in records], dtype=np.float64)
        return first, self._checked(scores)

    def read_sorted(self, start: int, count: int) -> Rows:
        """Ranks start .. start+count-1: one range read of the rank primary key."""
        r = self._ranks.c
        query = (
            sa.select(r.rank, r.id, r.score)
            .where(r.rank >= int(start), r.rank < int(start) + int(count))
            .order_by(r.rank)
        )
        with self._connection() as conn:
            return self._rows(conn.execute(query).all(), round_trips=1)

    def read_positions(self, ranks: np.ndarray) -> Rows:
        """Rows at the given ranks (uniform item sampling): `rank IN (...)`, in chunks."""
        wanted = plain_values(np.asarray(ranks, dtype=np.int64))
        r = self._ranks.c
        query = sa.select(r.rank, r.id, r.score).where(
            r.rank.in_(sa.bindparam("ranks", expanding=True))
        )
        records: list[Any] = []
        chunks = 0
        with self._connection() as conn:
            for chunk in self._chunks(sorted(set(wanted))):
                records.extend(conn.execute(query, {"ranks": chunk}).all())
                chunks += 1
        by_rank = {int(rec[0]): rec for rec in records}
        try:
            ordered = [by_rank[rank] for rank in wanted]
        except KeyError as missing:
            raise AccessError(
                f"rank {missing.args[0]} is not in the rank table of {self.where}"
            ) from None
        return self._rows(ordered, round_trips=chunks)

    def read_ids(self, ids: Sequence[Any]) -> np.ndarray:
        """Scores of the named items, in the order given: `id IN (...)`, in chunks."""
        wanted = plain_values(ids)
        r = self._ranks.c
        query = sa.select(r.id, r.score).where(r.id.in_(sa.bindparam("ids", expanding=True)))
        found: dict[Any, float] = {}
        with self._connection() as conn:
            for chunk in self._chunks(list(dict.fromkeys(wanted))):
                for item, score in conn.execute(query, {"ids": chunk}):
                    found[item] = float(score)
        try:
            scores = np.asarray([found[item] for item in wanted], dtype=np.float64)
        except KeyError as missing:
            raise AccessError(f"{self.where} has no item with id {missing.args[0]!r}") from None
        return self._checked(scores)

    def read_exact_scores(self, ids: Sequence[Any]) -> list[Any]:
        """ExactScores: the scores of the named items as the driver returns them (integers as
        Python ints, numerics as Decimals) from the rank table, which keeps the counts' type."""
        wanted = plain_values(ids)
        r = self._ranks.c
        query = sa.select(r.id, r.score).where(r.id.in_(sa.bindparam("ids", expanding=True)))
        found: dict[Any, Any] = {}
        with self._connection() as conn:
            for chunk in self._chunks(list(dict.fromkeys(wanted))):
                found.update((item, score) for item, score in conn.execute(query, {"ids": chunk}))
        try:
            return [found[item] for item in wanted]
        except KeyError as missing:
            raise AccessError(f"{self.where} has no item with id {missing.args[0]!r}") from None

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

    def run_traits(self) -> RunTraits:
        """access.RunTraits: positions are ranks (the copy's), the generic costs."""
        return RunTraits(costs=self.store_costs)

    store_costs: StoreCosts | None = None  # None: the planner's generic guess

    def oneshot_positions(self) -> int:
        """Positions of the in-store one-shot: the copy's ranks."""
        return self.domain_size()

    def run_freshness(self) -> dict[str, Any] | None:
        """How the run in progress knew its data current (access.run_freshness): operator
        diagnostics, result.diagnostics.plan["freshness"]."""
        return None if self._conn is None else dict(self.last_freshness or {})

    def _current_copy(
        self, conn: Connection, transaction: sa.RootTransaction
    ) -> sa.RootTransaction:
        """Use the copy only where the run's first query proved it current (the copy compared
        with the counts, one join); otherwise (counts from votes have no table of their own to
        read) the copy is refreshed (prepare(refresh=True), outside the snapshot) and the run
        opens again, at most REFRESH_TRIES times. Live mode and frozen sources skip this."""
        frozen = getattr(self, "frozen", False)  # from_votes() builds without __init__
        if frozen or isinstance(self, tuple(self.mode_classes.values())):
            self.last_freshness = {"copy": "frozen"} if frozen else None
            return transaction
        for attempt in range(REFRESH_TRIES + 1):
            why = getattr(self, "_why", "unproven")
            if why == "unproven":
                why = "written" if self._copy_differs(conn) else None
            if why is None:
                self.last_freshness = {"refreshes": attempt, "copy": "current", "proof": "compared"}
                return transaction
            if attempt == REFRESH_TRIES:
                break
            self._end(conn, transaction)
            self._close_run()
            self.prepare(refresh=True)
            transaction = self._begin(conn)
            transaction = self._open_run(conn, transaction)
        self._end(conn, transaction)
        raise RuntimeError(
            f"{self.where} kept changing while its copy was refreshed ({REFRESH_TRIES} times): "
            "try again"
        )

    reads_copy = True  # runs read the rank-ordered copy where it is current (freshness)

    def has_rank_table(self) -> bool:
        """Whether the rank-ordered copy prepare() writes is in the database (one lookup)."""
        with self.engine.connect() as conn:
            return sa.inspect(conn).has_table(self.rank_table_name, schema=self._source.schema)

    @property
    def integer_scores(self) -> bool:
        """Whether the counts are of an integer type (the noisy counts' interval): never on
        SQLite, whose INTEGER columns may hold REAL values."""
        return self.dialect != "sqlite" and isinstance(self._ranks.c.score.type, sa.Integer)

    def read_oneshot(self, noise: KeyedNoise, k: int) -> Rows | None:
        """InStoreOneShot: the k rows of largest score + keyed noise (topk_middleware/
        keyed_noise.py), best first, ties by smaller rank, in one query. The uniform of rank p
        is the first 52 bits of SHA-256("key:p"): sha256 in PostgreSQL and DuckDB; SQLite calls
        a function registered on the run's connection. The key and the exceedances are bound
        parameters (_EXCEEDANCES). None on another dialect (the client-side one-shot runs);
        MySQL / MariaDB tables are not InStoreOneShot at all (__init__), so the planner never
        prices it there."""
        exceedances = _EXCEEDANCES.get(self.dialect)
        if exceedances is None:
            return None
        positions = noise.exceed_positions.tolist() or [-1]  # -1: a position no item has
        noises = noise.exceed_noises.tolist() or [0.0]
        with self._connection() as conn:
            q = conn.dialect.identifier_preparer.quote
            if self.dialect == "sqlite":
                name = "topk_keyed_noise_" + uuid.uuid4().hex[:12]
                driver = conn.connection.driver_connection
                driver.create_function(name, 1, noise.sqlite_function, deterministic=True)
                noise_sql = f"{name}(r.{q('rank')})"
                params: dict[str, Any] = {"k": int(k), "m": self.domain_size()}
            else:
                digits = _KEYED_DIGITS.get(self.dialect)
                if digits is None:
                    return None
                noise_sql = noise.sql(uniform_from_hex_sql(digits.format(rank=f"r.{q('rank')}")))
                params = {"key": noise.key, "k": int(k), "m": self.domain_size()}
            params["positions"] = array_param(self.dialect, positions)
            params["noises"] = array_param(self.dialect, noises, floats=True)
            ranks = conn.dialect.identifier_preparer.format_table(self._ranks)
            materialized = "MATERIALIZED " if self.dialect in ("postgresql", "duckdb") else ""
            text = oneshot_query(
                ranks,
                q("rank"),
                noise_sql,
                exceedances,
                noise.bound,
                ":k",
                materialized,
                # The rows that can win are a prefix of the rank B-tree: binary search where
                # `/` divides integers.
                search_m=":m" if self.dialect in ("postgresql", "sqlite") else None,
                score_cap=noise.score_cap,
            )
            query = sa.text(text).columns(
                sa.column("position"), sa.column("id"), sa.column("score")
            )
            records = conn.execute(query, params).all()
            if self.dialect == "sqlite":
                driver.create_function(name, 1, None)
        if not records:
            empty = np.empty(0, dtype=np.int64)
            return Rows(empty, empty.copy(), np.empty(0, np.float64))
        return Rows(
            np.array([rec[0] for rec in records], dtype=np.int64),
            id_array([rec[1] for rec in records]),
            np.array([rec[2] for rec in records], dtype=np.float64),
        )

    # ----- helpers ----------------------------------------------------------------------------
    def _no_keyed_sql(self) -> None:
        """Where the key and exceedances cannot stay out of the statement text (no entry in
        _EXCEEDANCES, or a driver that interpolates: TEXT_PARAMETER_DIALECTS and
        TEXT_PARAMETER_DRIVERS), the table is no InStoreOneShot."""
        self.parameters_in_text = (
            self.dialect in TEXT_PARAMETER_DIALECTS
            or self.engine.dialect.driver in TEXT_PARAMETER_DRIVERS
        )
        if self.dialect not in _EXCEEDANCES or self.parameters_in_text:
            self.read_oneshot = None  # type: ignore[assignment,method-assign]

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

    def _checked(self, scores: np.ndarray) -> np.ndarray:
        """Cheap guard on what a run reads: the rank table was validated, but is a table."""
        if not np.isfinite(scores).all() or (scores < 0).any():
            raise AccessError(
                f"rank table {self._ranks.name!r} of {self.where} holds a NaN, infinite or "
                "negative score: run prepare() again"
            )
        return scores


def _seq_scans(plan: Any) -> Iterator[str]:
    """Relations read by a sequential scan anywhere in a PostgreSQL EXPLAIN (FORMAT JSON) plan."""
    if isinstance(plan, list):
        for entry in plan:
            yield from _seq_scans(entry)
    elif isinstance(plan, dict):
        if plan.get("Node Type") == "Seq Scan":
            yield str(plan.get("Relation Name"))
        for value in plan.values():
            if isinstance(value, list | dict):
                yield from _seq_scans(value)


def engine_of(engine: Engine | str) -> Engine:
    """An SQLAlchemy Engine, or one made from a URL string by sqlalchemy.create_engine (a URL
    SQLAlchemy cannot read, or whose driver is missing, is refused in one line)."""
    if isinstance(engine, Engine):
        return engine
    if not isinstance(engine, str):
        raise TypeError(
            f"engine must be an SQLAlchemy Engine or a URL string such as 'sqlite:///shop.sqlite', "
            f"got {type(engine).__name__}"
        )
    try:
        return sa.create_engine(engine)
    except (ImportError, sa.exc.ArgumentError) as error:
        raise ValueError(
            f"SQLAlchemy cannot make an engine of {mask_secrets(engine)!r}: {first_line(error)}"
        ) from None


def _keeps_stat1(engine: Engine) -> bool:
    """Whether a SQLite database keeps planner statistics (sqlite_stat1, made by its owner's
    ANALYZE): prepare() then refreshes them for what it built; it never makes the table."""
    with engine.connect() as conn:
        return sa.inspect(conn).has_table("sqlite_stat1")


def _match(name: str, names: Sequence[str], nocase: bool) -> str | None:
    """`name` as `names` spell it: exactly, else (nocase) the one name equal without case."""
    if name in names:
        return name
    if nocase:
        alike = [n for n in names if n.lower() == name.lower()]
        if len(alike) == 1:
            return alike[0]
    return None


def catalog_name(engine: Engine, table: str, schema: str | None) -> tuple[str, str | None]:
    """(table, schema) as the database's catalog spells the table the name finds, the schema
    made explicit (the connection's default where none is given): the name as given, else read
    as SQL reads it (_sql.sql_name_spellings; SQLite compares names without case,
    PostgreSQL folds unquoted names to lower case, MariaDB keeps them). So `t`, `T`, `main.t`
    name one table and derive one rank table, position table and set of triggers. A name that
    finds nothing is kept as given (reflection says it does not exist). Cost: the catalog's
    table and view lists of one or two schemas."""
    dialect = engine.dialect.name
    nocase = dialect == "sqlite"
    fold = (lambda word: word) if dialect in ("mysql", "mariadb") else str.lower
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
    if bind.dialect.name == "duckdb":
        return _reflect_duckdb(bind, table, schema, where)
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
    if bind.dialect.name in ("mysql", "mariadb") and any("``" in c.name for c in reflected.c):
        # The MySQL dialect reflects a backtick in a column name doubled, as SHOW CREATE TABLE
        # writes it: undo that, so the name is quoted once, correctly.
        columns = [sa.Column(c.name.replace("``", "`"), c.type) for c in reflected.c]
        reflected = sa.Table(table, sa.MetaData(), *columns, schema=schema)
    for column in reflected.c:
        if isinstance(column.type, sa.Float):
            # MySQL / MariaDB DOUBLE reflects as asdecimal=True: values would come back as
            # Decimals rounded to 10 places (1e-300 read as 0). Floats are read as floats.
            column.type.asdecimal = False
    return reflected


# DuckDB type names that duckdb-engine's ischema_names lacks.
_DUCKDB_TYPES: dict[str, type[sa.types.TypeEngine[Any]]] = {
    "double": sa.Double,
    "decimal": sa.Numeric,
    "blob": sa.LargeBinary,
}


def _reflect_duckdb(
    bind: Engine | Connection, table: str, schema: str | None, where: str
) -> sa.Table:
    """Columns from information_schema: duckdb-engine 0.17's reflection queries pg_collation,
    which DuckDB lacks, under SQLAlchemy 2.1."""
    columns = sa.table(
        "columns",
        sa.column("table_catalog"),
        sa.column("table_schema"),
        sa.column("table_name"),
        sa.column("column_name"),
        sa.column("data_type"),
        sa.column("numeric_precision"),
        sa.column("numeric_scale"),
        sa.column("ordinal_position"),
        schema="information_schema",
    )
    c = columns.c
    query = (
        sa.select(c.column_name, c.data_type, c.numeric_precision, c.numeric_scale)
        .where(
            c.table_name == table,
            c.table_schema == (schema if schema is not None else sa.func.current_schema()),
            c.table_catalog == sa.func.current_database(),
        )
        .order_by(c.ordinal_position)
    )
    if isinstance(bind, Connection):
        found = bind.execute(query).all()
    else:
        with bind.connect() as conn:
            found = conn.execute(query).all()
    if not found:
        raise ValueError(f"{where} does not exist")
    known = {**bind.dialect.ischema_names, **_DUCKDB_TYPES}
    result = sa.Table(table, sa.MetaData(), schema=schema)
    for name, data_type, precision, scale in found:
        base = str(data_type).split("(")[0].strip().lower()
        type_class = known.get(base)
        if type_class is None:
            type_: sa.types.TypeEngine[Any] = sa.types.NullType()
        elif issubclass(type_class, sa.Numeric) and not issubclass(type_class, sa.Float):
            type_ = type_class(precision, scale)
        else:
            type_ = type_class()
        result.append_column(sa.Column(name, type_))
    return result


def _untyped(type_: sa.types.TypeEngine[Any]) -> bool:
    return isinstance(type_, sa.types.NullType)


def _copy_score_type(type_: sa.types.TypeEngine[Any]) -> sa.types.TypeEngine[Any]:
    if _untyped(type_):
        return sa.Double()
    return type_.copy()


def _sqlite_version(engine: Engine) -> tuple[int, ...]:
    module = engine.dialect.dbapi
    version = getattr(module, "sqlite_version_info", None)
    return tuple(version) if version else (0,)


def _table_comment(engine: Engine, table: str, schema: str | None) -> str | None:
    """The text that may hold a from_votes record for `table` (contributions.py): its comment
    (PostgreSQL, MariaDB / MySQL), its CREATE TABLE statement on SQLite (which keeps no comments
    but keeps that text, comments inside it included)."""
    dialect = engine.dialect.name
    preparer = engine.dialect.identifier_preparer
    if dialect == "postgresql":
        name = preparer.quote(table)
        qualified = name if schema is None else f"{preparer.quote_schema(schema)}.{name}"
        query = sa.text("SELECT obj_description(to_regclass(:t), 'pg_class')").bindparams(
            t=qualified
        )
    elif dialect in ("mysql", "mariadb"):
        query = sa.text(
            "SELECT TABLE_COMMENT FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = coalesce(:s, database()) AND TABLE_NAME = :t"
        ).bindparams(s=schema, t=table)
    else:  # SQLite
        master = ("" if schema is None else preparer.quote_schema(schema) + ".") + "sqlite_master"
        query = sa.text(f"SELECT sql FROM {master} WHERE type = 'table' AND name = :t").bindparams(
            t=table
        )
    with engine.connect() as conn:
        found = conn.execute(query).first()
    return None if found is None or found[0] is None else str(found[0])


def replace_row(conn: Connection, table: str, row: dict[str, Any]) -> None:
    """Insert `row` into `table` (SQL text, quoted), replacing the row with the same first
    column (its primary key). One upsert statement on PostgreSQL, SQLite and MariaDB / MySQL:
    a DELETE then INSERT of a key that is not there takes InnoDB gap locks, on which two
    prepares at once deadlock. Elsewhere a DELETE then an INSERT."""
    key, *rest = row
    names = ", ".join(row)
    values = ", ".join(f":{c}" for c in row)
    dialect = conn.dialect.name
    if dialect in ("mysql", "mariadb"):
        update = ", ".join(f"{c} = VALUES({c})" for c in rest)
        conn.execute(
            sa.text(
                f"INSERT INTO {table} ({names}) VALUES ({values}) ON DUPLICATE KEY UPDATE {update}"
            ),
            row,
        )
    elif dialect in ("postgresql", "sqlite"):
        update = ", ".join(f"{c} = excluded.{c}" for c in rest)
        conn.execute(
            sa.text(
                f"INSERT INTO {table} ({names}) VALUES ({values}) ON CONFLICT ({key}) DO "
                f"UPDATE SET {update}"
            ),
            row,
        )
    else:
        conn.execute(sa.text(f"DELETE FROM {table} WHERE {key} = :{key}"), row)
        conn.execute(sa.text(f"INSERT INTO {table} ({names}) VALUES ({values})"), row)


def _create_shared(engine: Engine, table: sa.Table) -> None:
    """Create `table`, which the copies of several tables share, where it is missing, in a
    transaction of its own: of two prepares creating it at once, the one that loses the race
    (PostgreSQL's unique index of type names, MariaDB's "already exists") finds it made."""
    try:
        with engine.begin() as conn:
            table.create(conn, checkfirst=True)
    except sa.exc.DBAPIError:
        if not sa.inspect(engine).has_table(table.name, schema=table.schema):
            raise


def _create_with_comment(conn: Connection, table: sa.Table) -> None:
    """CREATE `table`. Its comment (a from_votes record) goes where the dialect keeps one: a
    table comment (SQLAlchemy emits it), or on SQLite inside the CREATE TABLE statement."""
    if table.comment is None or conn.dialect.name != "sqlite":
        table.create(conn)
        return
    ddl = str(sa.schema.CreateTable(table).compile(dialect=conn.dialect)).strip()
    head = f"CREATE TABLE {conn.dialect.identifier_preparer.format_table(table)} ("
    if not ddl.startswith(head) or "*/" in table.comment:
        raise AssertionError(f"unexpected DDL for {table.name!r}: {ddl[:80]!r}")
    conn.exec_driver_sql(f"{head} /* {table.comment} */{ddl[len(head) :]}")
    for index in table.indexes:
        index.create(conn)
