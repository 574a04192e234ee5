"""SQLAlchemyTable.from_votes on the SQL store engine (adapters/sql/): counts of raw votes with
bounded contributions (adapters/sql/votes.py over adapters/contributions.py) held by a
rank-ordered copy in SQLAlchemyTable's catalog layout (adapters/sql/recorded.py), on
PostgreSQL, SQLite, MariaDB / MySQL and DuckDB (duckdb-engine).

The counts have no table of their own: the copy's source is the counting statement, a subquery
(`topk_counts`) of one row (id, score) per item of the items table. Every build of the copy
checks the votes again in its transaction (sql/votes.check_votes: votes for items missing from
the items table; weights negative, NaN, infinite or not numbers), then the counts as any table
of counts is checked (checks.validate), then copies them. The copy is named after the votes
and items tables, `<votes>__<items>__topk_votes_<digest>` (a digest of the schema as given,
both tables' names, the three columns and, where the count is not one vote per client and
item, the weight and the record of the bounds), carries that record (its comment; SQLite: a
comment in its CREATE statement), and its mark in topk_rank_fingerprints names the votes
table, the items table and the copy (tests/stores/test_catalog_layout_sqlalchemy_votes.py pins it).
Nothing is put on the votes or items tables. A run proves the copy current by comparing it
with the counts in its first query (freshness.Compared: the counting statement, one pass over
the votes, joined with the copy); a copy that is not current is rebuilt before the run reads
(engine.SQLTable.counts_query), at most engine.REFRESH_TRIES times.

The keyed hash's key (max_items_per_client) is drawn once per from_votes() and bound with each
statement that names it (`KeyedDriver`), never written into the statement text.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from adapters import contributions as law
from adapters.sql.dialect import FLOAT, INTEGER, Column
from adapters.sql.driver import SQLAlchemyDriver
from adapters.sql.engine import SQLTable
from adapters.sql.freshness import Compared
from adapters.sql.recorded import RecordedCopy
from adapters.sql.votes import Counts, check_votes, count_votes

from .copy_table import DIALECTS, SQLAlchemyCopyTable, copy_names
from .table import DEFAULT_MAX_PARAMS, SQLAlchemyTable, _digest, _fit, engine_of

KEY = ":" + law.KEY_PARAMETER  # the key's placeholder in the counting statement


class KeyedDriver(SQLAlchemyDriver):
    """SQLAlchemyDriver binding `bound` (the counts' key, where they have one) with every
    statement that names it."""

    def __init__(self, engine: Engine, bound: Mapping[str, Any], read_only: Any = None) -> None:
        super().__init__(engine, read_only)
        self.bound = dict(bound)

    def _with(self, sql: str, params: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        return {**self.bound, **(params or {})} if self.bound and KEY in sql else params

    def execute(self, sql: str, params: Mapping[str, Any] | None = None, **options: Any) -> Any:
        return super().execute(sql, self._with(sql, params), **options)

    def arrays(self, sql: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return super().arrays(sql, self._with(sql, params))

    @contextmanager
    def apart(self) -> Iterator[KeyedDriver]:
        yield KeyedDriver(self.engine, self.bound, self._read_only)


class SQLAlchemyVotesTable(SQLAlchemyCopyTable):
    """Counted votes in an SQLAlchemy database whose dialect is on the engine, read through
    their copy (module docstring); built by SQLAlchemyTable.from_votes()."""

    counts_query = True

    def __init__(
        self,
        engine: Engine,
        counts: Counts,
        *,
        votes: str,
        items: str,
        item_id: str,
        schema: str | None,
        weighted: bool,
        rank_table: str,
        max_params: int | None,
    ) -> None:
        if max_params is not None and max_params < 1:
            raise ValueError(f"max_params must be >= 1, got {max_params}")
        self.engine, self.mode = engine, "copy"
        self.max_params = int(max_params or DEFAULT_MAX_PARAMS)
        self.counts = counts
        dialect = DIALECTS[engine.dialect.name](engine)
        double = sa.Double().compile(dialect=engine.dialect)  # 8 bytes on every store
        self._columns = (
            items,
            item_id,
            Column(FLOAT, double) if weighted else Column(INTEGER, "BIGINT"),
        )
        names = copy_names(
            schema,
            rank_table,
            record=counts.record,
            identity=(dialect.qualified(schema, votes), dialect.qualified(schema, items)),
        )
        lock = engine.dialect.identifier_preparer.format_table(sa.table(rank_table, schema=schema))
        SQLTable.__init__(
            self,
            KeyedDriver(engine, counts.params, dialect.sqlalchemy_read_only),
            dialect,
            votes,
            item_id,
            "score",
            namespace=schema,
            where=f"votes {votes!r} over items {items!r}",
            layout=lambda t: RecordedCopy(t, names),
            proof=lambda t: Compared(t, lock),
        )
        dialect.hides_statistics(self.driver)  # asked once, here: traits() reads it

    def describe(self, table: str, namespace: Any, where: Any, *declared: Any) -> None:
        """The counts: the counting statement as a subquery, ids of the items table's id
        column's type, scores BIGINT (votes) or the store's 8-byte double (weights), the bounds
        counted with."""
        d = self.dialect
        items, item_id, score = self._columns
        self.namespace, self.table, self.where = namespace, table, where
        self.id_sql, self.score_sql = d.quote("id"), d.quote("score")
        self.source = self.source_as("topk_counts")
        found = d.columns(self.driver, namespace, items) or {}
        if item_id not in found:
            raise ValueError(law.no_table(f"{d.name} table {items!r}"))
        self.id_info = d.counts_column(where, "id", item_id, found[item_id])
        self.score_info = d.counts_column(where, "score", "score", score)
        self.sensitivity = float(self.counts.sensitivity)
        self.max_items_per_client = self.counts.max_items

    def source_as(self, alias: str) -> str:
        return f"({self.counts.select}) AS {alias}"

    @property
    def table_name(self) -> None:  # type: ignore[override]
        """None: the counts are a query, not a table."""
        return None

    @classmethod
    def build(
        cls,
        engine: Engine | str,
        votes_table: str,
        items_table: str,
        client: str,
        item: str,
        item_id: str,
        *,
        schema: str | None,
        rank_table: str | None,
        max_params: int | None,
        weight: str | None,
        max_per_item: float,
        max_items_per_client: int | None,
    ) -> SQLAlchemyVotesTable:
        """SQLAlchemyTable.from_votes (its docstring): the checks that read no vote, then the copy's
        definition (module docstring); nothing is written before prepare()."""
        engine = engine_of(engine)
        dialect_of = DIALECTS.get(engine.dialect.name)
        if dialect_of is None:
            raise ValueError(
                "from_votes through SQLAlchemy counts on PostgreSQL, SQLite, MariaDB / MySQL and "
                f"DuckDB; this engine's dialect is {engine.dialect.name!r}"
            )
        words, driver = dialect_of(engine), SQLAlchemyDriver(engine)
        with driver.session():
            counts = count_votes(
                words,
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
        # one copy per definition of the counts: the tables and columns, and the bounds where they
        # differ from one vote per client and item
        plain = (weight, counts.sensitivity, counts.max_items) == (None, 1, None)
        bounds = () if plain else (weight, counts.record)
        digest = _digest(schema, votes_table, items_table, client, item, item_id, *bounds)
        return cls(
            engine,
            counts,
            votes=votes_table,
            items=items_table,
            item_id=item_id,
            schema=schema,
            weighted=weight is not None,
            rank_table=rank_table
            or _fit(f"{votes_table}__{items_table}", f"__topk_votes_{digest}"),
            max_params=max_params,
        )

    def validate(self) -> int:
        """The votes checked (sql/votes.check_votes), then the counts (checks.validate);
        returns m."""
        check_votes(self.driver, self.counts)
        return super().validate()


SQLAlchemyTable.votes_class = SQLAlchemyVotesTable

__all__ = ["KeyedDriver", "SQLAlchemyVotesTable"]
