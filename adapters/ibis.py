"""IbisTable: a store over any Ibis table expression of per-item counts.

`IbisTable(table_expr, id="id", score="score")` serves the two access kinds through Ibis
expressions compiled by the expression's backend:

* sorted access: the canonical order (score descending, ties by id ascending) as
  `ORDER BY score DESC, key(id) LIMIT n`, keyset-limited (`WHERE score < s OR (score = s AND
  key(id) > key(last))`) when a read continues the previous one, else with OFFSET;
* random access by position (positions are ranks: an expression has no positional index): the
  rows whose `row_number() OVER (canonical order) - 1` is among the ranks, one query a batch
  (a window over the whole expression: about one sort of it on the backend);
* random access by id: `WHERE id IN (...)`;
* the runs of tied scores (ScoreRuns): one GROUP BY score.

On DuckDB, PostgreSQL and SQLite each of these shapes is compiled by Ibis once per IbisTable
and run on the backend's connection, what varies (depth, offset, the last row, ranks, ids)
bound by the driver (adapters/ibis_statements.py); other backends execute the expression.

Text ids compare by the bytes of their UTF-8 text (`key(id)`): `encode(id)` on DuckDB,
`convert_to(id, 'UTF8')` on PostgreSQL, the text itself on SQLite (whose default collation
compares bytes). A backend with no known byte key refuses text ids. All reads of a run happen
in one transaction of the backend's connection (`snapshot()`): BEGIN TRANSACTION on DuckDB,
BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY on PostgreSQL, BEGIN on SQLite; another backend
is refused unless the caller promises that the data do not change during a run
(`frozen=True`). A backend without window functions (Ibis's Polars backend) reads each
rank with its own ORDER BY .. LIMIT 1 OFFSET query.

The in-store one-shot (access.InStoreOneShot; topk_middleware/keyed_noise.py) on DuckDB and
PostgreSQL: one statement of the backend's own SQL around the expression as Ibis compiles it,
its rows numbered in the canonical order (the positions of every other read here), computed
once (a materialized CTE: one sort of the expression); each row that can win gets the keyed
uniform of its position, the first 52 bits of SHA-256("key:position") (DuckDB's sha256, and
PostgreSQL's, in the words of their dialects: adapters/dialects/), the exceedances joined from
bound arrays. The key and the exceedances are bound
by the driver (DuckDB's prepared parameters, psycopg 3's server-side binding), never written
into the statement text, which Ibis cannot promise (it inlines every value as a literal): the
statement runs on the backend's connection, not through Ibis. Every other backend, and a
PostgreSQL connection whose cursors interpolate parameters client-side (psycopg's
ClientCursor), is not given the key: there `method="oneshot"` reads the expression once in
full into the client (`oneshot_in_store` and check() say why). SQLite has no SHA-256 in SQL.
Where the one-shot runs in the backend, `auto` takes it without reading first (run_traits):
every sorted or random read sorts the expression anyway.

The values a read asks for (ranks, ids) are counted as seen by a server (PostgreSQL): Ibis
writes them into the statement text, and a bound one shows in the server's statement log (and
in the text under a ClientCursor), so an oblivious release there reads the whole expression
and sends no drawn rank (traits: parameters_in_text). On PostgreSQL an oblivious run sets
track_counts off for its transaction where the connection's role may (a superuser, or a role
granted SET on it); where it may not, the blocks it reads would show in pg_statio_user_tables,
and the store says so (traits: oblivious_reads_seen), so the release is refused unless the
operator set `accept_statistics_channel` (docs/promise.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from adapters._sql import (
    HIDE_STATISTICS,
    StatisticsChannel,
    may_hide_statistics_sql,
    statistics_accepted,
    statistics_seen,
)
from topk_middleware.access import AccessError, Rows, RunTraits, StoreCosts, StoreTraits
from topk_middleware.keyed_noise import KeyedNoise, capped_sql, oneshot_query
from topk_middleware.privacy import resolve_declared

from ._sql import AccessCheck, AccessPath, float_array_literal, int_array_literal
from .dialects.duckdb import DuckDBDialect
from .dialects.postgres import PostgresDialect
from .ibis_statements import PLACEHOLDERS, Statements
from .sql.dialect import Dialect
from .sql.placeholders import convert

try:
    import ibis
    import ibis.expr.operations as ops
    import ibis.expr.types as ir
except ImportError as error:  # pragma: no cover - the 'ibis' extra
    raise ImportError("adapters.ibis needs Ibis: pip install 'topk_middleware[ibis]'") from error


@ibis.udf.scalar.builtin
def convert_to(text: str, encoding: str) -> bytes:  # type: ignore[empty-body]
    """PostgreSQL's convert_to(text, encoding): the text's bytes."""


@ibis.udf.scalar.builtin(name="topk_oneshot_floor")
def _oneshot_floor() -> float:  # type: ignore[empty-body]
    """A stand-in in the compiled SQL for the one-shot's floor (IbisTable.read_oneshot), whose
    value is a bound parameter: replaced in the statement text, never run."""


FLOOR_CALL = "TOPK_ONESHOT_FLOOR()"


@ibis.udf.scalar.builtin
def encode(text: str) -> bytes:  # type: ignore[empty-body]
    """DuckDB's encode(text): the UTF-8 bytes of the text as a BLOB."""


# The expression whose order is the byte order of a text id's UTF-8, per backend.
BYTE_KEYS: dict[str, Callable[[Any], Any]] = {
    "duckdb": encode,
    "postgres": lambda text: convert_to(text, "UTF8"),
    "sqlite": lambda text: text,
}
# The statements that open and close one consistent read of the backend's connection. On
# PostgreSQL, for that transaction only: no JIT (a read that sorts the expression is planned at
# a cost that compiles it, ~0.4 s at 10^6 rows, more than the sort) and the sort in memory up to
# 64 MB (the default 4 MB spills 10^6 rows to disk).
SNAPSHOTS: dict[str, tuple[str, str]] = {
    "duckdb": ("BEGIN TRANSACTION", "COMMIT"),
    "postgres": (
        "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT set_config('jit', 'off', true), "
        "set_config('work_mem', '64MB', true)",
        "COMMIT",
    ),
    "sqlite": ("BEGIN", "COMMIT"),
}
# The backends whose SQL computes SHA-256 and whose driver binds parameters apart from the
# statement text: the store's dialect, which writes the keyed uniform (SHA-256 of key ":"
# position) and the exceedances' rows, and the driver's placeholder style (module docstring).
KEYED_HASHES: dict[str, tuple[type[Dialect], str]] = {
    "duckdb": (DuckDBDialect, "dollar"),
    "postgres": (PostgresDialect, "pyformat"),
}
NO_KEYED_HASH = {"sqlite": "SQLite has no SHA-256 in SQL"}
# Backends that run in this process: no server, so no observer of their statement text.
IN_PROCESS = frozenset({"duckdb", "sqlite", "polars", "datafusion", "pandas"})
# The model of an in-store one-shot (run_traits): a statement compiled and run (Ibis and the
# backend, ~10 ms), and two scans of the expression (~5 ns a row on DuckDB; PostgreSQL's scans
# are slower). An operator's estimate only: with sorted_scans the planner does not compare it.
ONESHOT_STATEMENT_SECONDS = 1e-2
SCAN_ROW_SECONDS = 5e-9


class IbisTable(StatisticsChannel):
    """A histogram behind an Ibis table expression: `id` and `score` columns (module docstring).

    `sensitivity` (default 1) is the most one client adds to or removes from one count and
    `max_items_per_client` how many counts it moves, both declared by whoever built the table.
    `frozen=True` is the caller's promise that the data do not change during a run, needed on
    a backend whose transactions this adapter does not know.
    """

    positions_are_ranks = True

    def __init__(
        self,
        table: Any,
        id: str = "id",
        score: str = "score",
        *,
        sensitivity: float | None = None,
        max_items_per_client: int | None = None,
        frozen: bool = False,
    ) -> None:
        if not isinstance(table, ir.Table):
            raise TypeError(f"IbisTable takes an Ibis table expression, got {type(table).__name__}")
        if not isinstance(frozen, bool):
            raise TypeError(f"frozen must be True or False, got {frozen!r}")
        self.backend = table._find_backend()
        self.backend_name = self.backend.name
        self.where = f"Ibis table on {self.backend_name}"
        schema = table.schema()
        for column in (id, score):
            if column not in schema:
                raise ValueError(f"{self.where} has no column {column!r} (columns: {schema.names})")
        if not schema[score].is_numeric():
            raise TypeError(f"{self.where} column {score!r} must be numeric, it is {schema[score]}")
        kind = schema[id]
        if not (kind.is_integer() or kind.is_floating() or kind.is_string()):
            raise TypeError(
                f"{self.where} column {id!r} is {kind}: ids must be integer, floating point or "
                "string"
            )
        self.text_ids = kind.is_string()
        if self.text_ids and self.backend_name not in BYTE_KEYS:
            raise ValueError(
                f"{self.where}: text ids need the byte order of their UTF-8 text, which this "
                f"adapter knows how to ask of {', '.join(sorted(BYTE_KEYS))} only"
            )
        if self.backend_name not in SNAPSHOTS and not frozen:
            raise ValueError(
                f"{self.where}: this adapter cannot open a consistent read on "
                f"{self.backend_name}; pass frozen=True if the data do not change during a run"
            )
        self.frozen = frozen
        self.sensitivity, self.max_items_per_client = resolve_declared(
            sensitivity, max_items_per_client, None, self.where
        )
        # PostgreSQL: (whether the role may set track_counts, its name), asked once here
        self._statistics: tuple[bool, str] | None = None
        if self.backend_name == "postgres":
            version = int(self.backend.con.info.server_version)
            cursor = self.backend.raw_sql(may_hide_statistics_sql(version))
            try:
                allowed, role = cursor.fetchone()
            finally:
                cursor.close()
            self._statistics = (bool(allowed), str(role))
        self.id_column, self.score_column = id, score
        self._table = table.select(id=table[id], score=table[score])
        self._key: Callable[[Any], Any] = (
            BYTE_KEYS[self.backend_name] if self.text_ids else (lambda value: value)
        )
        t = self._table
        self._order = [ibis.desc(t.score), self._key(t.id).asc()]
        # each read's shape compiled once, its values bound by the driver (ibis_statements.py)
        self._statements = (
            Statements(self.backend, t, self._order, self._key)
            if self.backend_name in PLACEHOLDERS
            else None
        )
        # row numbers in the canonical order (a window); without them, one query a rank
        self.numbers_rows = self.backend.has_operation(
            ops.RowNumber
        ) and self.backend.has_operation(ops.WindowFunction)
        self.oneshot_refusal = self._oneshot_refusal()
        if self.oneshot_refusal is not None:  # not an InStoreOneShot (access.offers_in_store)
            self.read_oneshot = None  # type: ignore[method-assign,assignment]
        self._depth = 0  # nested snapshot() calls
        self._m: int | None = None
        self._runs: int | None = None
        self._oneshot_sql: dict[int, tuple[str, str]] = {}  # k -> SQL (_oneshot_relations)
        self._next: tuple[int, float, Any] | None = None  # (start, score, id) of a keyset read

    def _oneshot_refusal(self) -> str | None:
        """Why this backend gets no in-store one-shot, or None where it runs one."""
        if self.backend_name not in KEYED_HASHES:
            return NO_KEYED_HASH.get(
                self.backend_name,
                f"this adapter knows no keyed hash with parameters bound apart from the "
                f"statement text on {self.backend_name}",
            )
        cursor = getattr(self.backend.con, "cursor_factory", None)
        if self.backend_name == "postgres" and "ClientCursor" in {
            c.__name__ for c in getattr(cursor, "__mro__", ())
        }:
            return "this connection's cursors write parameters into the statement text"
        return None

    @property
    def oneshot_in_store(self) -> str:
        """How method="oneshot" reads this expression, in words (the operator's diagnostics)."""
        if self.oneshot_refusal is None:
            return (
                f"in {self.backend_name}: one statement, SHA-256 keyed noise on the rows that "
                "can win, the key bound as a parameter"
            )
        return f"a full read into the client: {self.oneshot_refusal}"

    def check(self) -> AccessCheck:
        """How each access kind is served, before a run (no read of the data)."""
        sort = f"the backend sorts the expression ({self.backend_name}; no copy)"
        by_rank = (
            "row_number() over the canonical order, one query a batch: " + sort
            if self.numbers_rows
            else "ORDER BY .. LIMIT 1 OFFSET rank, one query a rank: " + sort
        )
        return AccessCheck(
            self.where,
            [
                AccessPath("sorted", True, "ORDER BY .. LIMIT n, by keyset: " + sort),
                AccessPath("random by rank", True, by_rank),
                AccessPath("random by id", True, "WHERE id IN (...)"),
                AccessPath("one-shot", True, self.oneshot_in_store),
            ],
        )

    # ----- the snapshot -------------------------------------------------------------------------
    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """One transaction of the backend's connection around every read of a run."""
        statements = SNAPSHOTS.get(self.backend_name)
        if self._depth or statements is None:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if not self._depth:
                    self._forget()
            return
        begin, end = statements
        self._raw(begin)
        if self._oblivious and self._statistics is not None and self._statistics[0]:
            self._raw(HIDE_STATISTICS)  # the run's reads stay out of the statistics views
        self._depth += 1
        try:
            yield
        except BaseException:
            self._depth -= 1
            self._forget()
            self._raw("ROLLBACK")
            raise
        self._depth -= 1
        self._forget()
        self._raw(end)

    def _raw(self, statement: str) -> None:
        result = self.backend.raw_sql(statement)
        # a cursor to close (PostgreSQL, SQLite); DuckDB's execute returns the connection itself
        if result is not None and result is not getattr(self.backend, "con", None):
            close = getattr(result, "close", None)
            if callable(close):
                close()

    def _forget(self) -> None:
        self._m = self._runs = None
        self._next = None

    # ----- the Source protocol ------------------------------------------------------------------
    def traits(self) -> StoreTraits:
        """access.StoreTraits: the declared sensitivity and bound. The values a read asks for
        (ranks, ids) reach a server backend's statement text or log, which its observers read:
        there `parameters_in_text` (an oblivious release reads the whole expression and sends
        no drawn position); a backend in this process has no observer."""
        return StoreTraits(
            self.sensitivity,
            self.max_items_per_client,
            parameters_in_text=self.backend_name not in IN_PROCESS,
            oblivious_reads_seen=None
            if self.accept_statistics_channel
            else self._oblivious_reads_seen(),
        )

    def _oblivious_reads_seen(self, accepted: bool = False) -> str | None:
        """StoreTraits.oblivious_reads_seen on PostgreSQL where the role may not set
        track_counts (the warning's words where the operator `accepted` the channel)."""
        if self._statistics is None or self._statistics[0]:
            return None
        role = self._statistics[1]
        said = statistics_accepted if accepted else statistics_seen
        return said(self.where, role)

    def hides_statistics(self) -> bool:
        """Whether oblivious runs keep their reads out of the statistics views (PostgreSQL,
        a role that may set track_counts); False on the other backends."""
        return self._statistics is not None and self._statistics[0]

    def run_traits(self) -> RunTraits:
        """access.RunTraits: positions are ranks; where the one-shot runs in the backend, every
        sorted read sorts the expression as the one-shot does (`sorted_scans`: `auto` takes the
        one-shot without reading first), its cost modelled as one statement and two scans."""
        if self.oneshot_refusal is not None:
            return RunTraits()
        m = self._m if self._m is not None else 0
        fixed = ONESHOT_STATEMENT_SECONDS + 2 * SCAN_ROW_SECONDS * m
        return RunTraits(costs=StoreCosts(sorted_scans=True, oneshot_fixed=fixed))

    def domain_size(self) -> int:
        if self._m is None or not self._depth:
            self._count()
        return self._m  # type: ignore[return-value]

    def _count(self) -> None:
        """m and the number of runs of tied scores (score_run_count, which a run asks next), in
        one query. Integer counts repeat (few distinct values): one GROUP BY score, a scan and
        a small hash aggregate (PostgreSQL's count(DISTINCT) sorts every row: 5.7 s against
        1.5 s for zipf counts at 10^7 rows); other scores rarely tie, where count(DISTINCT)'s
        sort beats a hash aggregate of m groups (1.3 s against 6.9 s at 10^6 distinct doubles
        on PostgreSQL, under load 19)."""
        t = self._table

        def query() -> Any:
            if t.score.type().is_integer():
                runs = t.group_by("score").aggregate(n=t.count())
                return runs.aggregate(m=ibis.coalesce(runs.n.sum(), 0), runs=runs.count())
            return t.aggregate(m=t.count(), runs=t.score.nunique())

        if self._statements is not None:
            ((m, runs),) = self._statements.run("count", {}, query)
        else:
            frame = query().execute()
            m, runs = frame["m"].iloc[0], frame["runs"].iloc[0]
        self._m, self._runs = int(m), int(runs)

    def read_sorted(self, start: int, count: int) -> Rows:
        start, count = int(start), int(count)
        if count <= 0:
            return _rows([], [], start)
        keyset = self._next is not None and self._next[0] == start and start > 0
        score, last = self._next[1:] if keyset else (None, None)  # type: ignore[index]
        if self._statements is not None:
            shape, params = ("keyset", {"score": score, "last": last, "n": count}) if keyset else (
                "sorted", {"n": count, "start": start})  # fmt: skip
            records = self._statements.run(shape, params)
        else:
            t = self._table
            query = t.order_by(self._order).limit(count, offset=start)
            if keyset:
                after = (t.score < score) | (
                    (t.score == score) & (self._key(t.id) > self._key(ibis.literal(last)))
                )
                query = t.filter(after).order_by(self._order).limit(count)
            frame = query.execute()
            records = list(zip(frame["id"].tolist(), frame["score"].tolist(), strict=True))
        if records:  # the last row read, in the column's own type (a keyset read's bound)
            self._next = (start + len(records), records[-1][1], records[-1][0])
        return _rows([r[0] for r in records], [r[1] for r in records], start)

    def read_positions(self, positions: np.ndarray) -> Rows:
        wanted = np.asarray(positions, dtype=np.int64)
        if len(wanted) == 0:
            return Rows(wanted, np.asarray([], dtype=object), np.asarray([], dtype=np.float64))
        if not self.numbers_rows:
            return self._read_ranks_one_by_one(np.unique(wanted))
        ranks = [int(r) for r in np.unique(wanted)]
        if self._statements is not None:
            records = self._statements.run("ranks", {"ranks": ranks})
        else:
            t = self._table
            ranked = t.mutate(rank=ibis.row_number().over(order_by=self._order))
            frame = ranked.filter(ranked.rank.isin(ranks)).order_by(ranked.rank).execute()
            columns = (frame["id"].tolist(), frame["score"].tolist(), frame["rank"].tolist())
            records = list(zip(*columns, strict=True))
        return Rows(
            np.asarray([r[2] for r in records], dtype=np.int64),
            _id_array([r[0] for r in records]),
            np.asarray([r[1] for r in records], dtype=np.float64),
        )

    def _read_ranks_one_by_one(self, ranks: np.ndarray) -> Rows:
        """A backend without window functions: the row at each rank by ORDER BY .. LIMIT 1
        OFFSET rank, one query a rank (round_trips says how many)."""
        ordered = self._table.order_by(self._order)
        ids, scores = [], []
        for rank in ranks.tolist():
            frame = ordered.limit(1, offset=int(rank)).execute()
            ids.append(frame["id"].tolist()[0])
            scores.append(float(frame["score"].iloc[0]))
        return Rows(
            ranks.astype(np.int64),
            _id_array(ids),
            np.asarray(scores, dtype=np.float64),
            round_trips=len(ranks),
        )

    def read_ids(self, ids: Sequence[Any]) -> np.ndarray:
        wanted = [value.item() if isinstance(value, np.generic) else value for value in ids]
        if not wanted:
            return np.asarray([], dtype=np.float64)
        t = self._table
        if self._statements is not None:  # a value the id column cannot hold is not sent
            asked = [value for value in dict.fromkeys(wanted) if self._statements.fits(value)]
            records = self._statements.run("ids", {"ids": asked}) if asked else []
            found = {record[0]: record[1] for record in records}
        else:
            try:
                frame = t.filter(t.id.isin(list(dict.fromkeys(wanted)))).execute()
            except Exception as error:  # a value the id column cannot hold: no such item
                raise AccessError(f"{self.where} cannot look up these ids: {error}") from None
            found = dict(zip(frame["id"].tolist(), frame["score"].tolist(), strict=True))
        missing = [value for value in wanted if value not in found]
        if missing:
            raise AccessError(f"{self.where} has no item with id {missing[0]!r}")
        return np.asarray([found[value] for value in wanted], dtype=np.float64)

    # ----- the in-store one-shot (access.InStoreOneShot) -------------------------------------
    def read_oneshot(self, noise: KeyedNoise, k: int) -> Rows | None:
        """The k rows of largest min(score, cap) + keyed noise, best first, ties by smaller
        position, in one statement on the backend's connection (module docstring). The key,
        the exceedances and the floor below are bound parameters; k, public, is a literal.

        Only a prefix of the canonical order is numbered (sorted): the rows scoring at least
        floor = min(k-th largest score, cap) + lowest noise - max(bound, largest exceedance) - b,
        found after a top-k of the expression (one scan, no sort). A row below it cannot win:
        its value is below min(k-th score, cap) + lowest noise, which the k top rows' values
        all reach; so an exceedance past the prefix is left out of `known` (keyed_noise.py),
        which only lowers the cut. Cost: two scans of the expression (or an index on score,
        where the backend has one), a sort of the prefix (all of it where every score lies
        within the noise of the top), SHA-256 on the rows within the cut."""
        relation, top_k = self._oneshot_relations(int(k))
        dialect, style = KEYED_HASHES[self.backend_name]
        words = dialect()

        def native(sql: str) -> str:  # the dialect's `:name` placeholders in the driver's style
            return convert(sql, style)[0]

        largest = float(noise.exceed_noises.max()) if len(noise.exceed_noises) else -math.inf
        params: dict[str, Any] = {
            "key": noise.key,
            "slack": noise.lowest - max(noise.bound, largest) - noise.scale,
        }
        if self.backend_name == "postgres":  # psycopg reads % as a placeholder's start
            relation, top_k = relation.replace("%", "%%"), top_k.replace("%", "%%")
            params["positions"] = int_array_literal(noise.exceed_positions)
            params["noises"] = float_array_literal(noise.exceed_noises)
        else:
            params["positions"] = noise.exceed_positions.tolist()
            params["noises"] = noise.exceed_noises.tolist()
        prelude = (
            f"floor AS (SELECT min({capped_sql('s.score', noise.score_cap)}) + "
            f"CAST({native(':slack')} AS DOUBLE PRECISION) AS c FROM ({top_k}) s), "
            f"ranked AS MATERIALIZED ({relation})"
        )
        statement = oneshot_query(
            "ranked",
            "position",
            noise.sql(native(words.keyed_uniform("key", "r.position"))),
            native(words.exceedances_sql()),
            noise.bound,
            str(int(k)),
            materialized="MATERIALIZED ",
            score_cap=noise.score_cap,
            prelude=prelude,
        )
        if self.backend_name == "duckdb":
            records = self.backend.con.execute(statement, params).fetchall()
        else:
            with self.backend.con.cursor() as cursor:
                records = cursor.execute(statement, params).fetchall()
        return Rows(
            np.asarray([r[0] for r in records], dtype=np.int64),
            _id_array([r[1] for r in records]),
            np.asarray([r[2] for r in records], dtype=np.float64),
        )

    def _oneshot_relations(self, k: int) -> tuple[str, str]:
        """The SQL of the numbered prefix (its floor a subquery of the CTE `floor`) and of the
        top-k scores, compiled by Ibis once per k (about 20 ms of compiling a statement)."""
        t = self._table
        run_hooks = getattr(self.backend, "_run_pre_execute_hooks", None)
        if callable(run_hooks):  # in-memory tables of the expression registered, as execute does
            run_hooks(t)
        if k in self._oneshot_sql:
            return self._oneshot_sql[k]
        floor = _oneshot_floor()
        if t.score.type().is_integer():  # compared as integers: an index on score serves it
            floor = ibis.greatest(floor, -(2.0**62)).ceil()
        prefix = t.filter(t.score >= floor)
        numbered = prefix.mutate(
            position=ibis.row_number().over(
                order_by=[ibis.desc(prefix.score), self._key(prefix.id).asc()]
            ),
            score=prefix.score.cast("float64"),
        )
        top = t.order_by(ibis.desc(t.score)).limit(k).select(score=t.score.cast("float64"))
        relation, top_k = (str(self.backend.compile(expr)) for expr in (numbered, top))
        if relation.count(FLOOR_CALL) != 1:
            raise AccessError(f"{self.where}: the one-shot statement could not be built")
        relation = relation.replace(FLOOR_CALL, "(SELECT c FROM floor)")
        self._oneshot_sql[k] = relation, top_k
        return relation, top_k

    def oneshot_reads(self) -> str | None:
        """OneShotReads: what the in-store one-shot reads."""
        return "the expression"

    # ----- ScoreRuns ----------------------------------------------------------------------------
    def score_run_count(self) -> int | None:
        if self._runs is None or not self._depth:
            self._count()
        return self._runs

    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        t = self._table
        query = t.group_by("score").aggregate(n=t.count()).order_by(ibis.desc("score"))
        if self._statements is not None:
            records = self._statements.run("runs", {}, lambda: query)
        else:
            frame = query.execute()
            records = list(zip(frame["score"].tolist(), frame["n"].tolist(), strict=True))
        scores = np.asarray([r[0] for r in records], dtype=np.float64)
        sizes = np.asarray([r[1] for r in records], dtype=np.int64)
        first = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        return first, scores


def _id_array(values: list[Any]) -> np.ndarray:
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return np.asarray(values, dtype=np.int64)
    if values and all(isinstance(v, float) for v in values):
        return np.asarray(values, dtype=np.float64)
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _rows(ids: list[Any], scores: Any, start: int) -> Rows:
    positions = np.arange(start, start + len(ids), dtype=np.int64)
    return Rows(positions, _id_array(ids), np.asarray(scores, dtype=np.float64))


__all__ = ["BYTE_KEYS", "KEYED_HASHES", "SNAPSHOTS", "IbisTable"]
