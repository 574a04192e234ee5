"""IbisTable's reads as statements compiled once per table object, values bound by the driver.

Compiling an Ibis expression (Ibis builds a sqlglot tree and writes it) costs milliseconds to
tens of milliseconds, as much as a short read itself on an in-process backend, while a run's
reads have a handful of shapes that differ only in values: the depth and offset of a sorted
read, the last row of a keyset read, the ranks or ids asked. Each shape is compiled by Ibis
once (the backend's own SQL, so the same rows in the same order as executing the expression);
what varies is a bound parameter of the backend's driver:

* a scalar (the last score and id of a keyset read) is written in the expression as a call of
  a stand-in function (`TOPK_PARAM_SCORE()`), whose text in the compiled statement is replaced
  by the driver's placeholder (`$name` on DuckDB, `%(name)s` on psycopg, `:name` on SQLite);
* LIMIT and OFFSET follow the compiled ORDER BY as placeholders;
* a list (ranks, ids) is one bound value: `= ANY(array)` on PostgreSQL, `IN (SELECT
  UNNEST(list))` on DuckDB, `IN (SELECT value FROM json_each(text))` on SQLite, around the
  compiled relation.

Cost: one compilation a shape a table object, then a dictionary look-up and the driver's
execute a read. A value passed this way is never in the statement text on DuckDB and SQLite,
nor on PostgreSQL unless the connection's cursors interpolate client-side (as Ibis's literals
are); IbisTable.traits keeps stating what Ibis alone would show.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import ibis

from topk_middleware.access import AccessError

# The backends whose statements run on the driver's connection; every other backend executes
# the Ibis expression (IbisTable's own reads).
PLACEHOLDERS: dict[str, str] = {"duckdb": "${}", "postgres": "%({})s", "sqlite": ":{}"}
# `column` among the bound list `values`, in each backend's words.
MEMBERSHIP: dict[str, str] = {
    "duckdb": "{column} IN (SELECT UNNEST({values}))",
    "postgres": "{column} = ANY({values})",
    "sqlite": "{column} IN (SELECT value FROM json_each({values}))",
}


def _stand_in(name: str, dtype: Any) -> Any:
    """A call of a function of no argument named `name`, of type `dtype`: a placeholder's
    place in the compiled text (never run)."""
    return ibis.udf.scalar.builtin(lambda: None, name=name, signature=((), dtype))()


class Statements:
    """The compiled shapes of one IbisTable's reads on DuckDB, PostgreSQL or SQLite (module
    docstring). `table` has the columns id and score; `order` is the canonical order and `key`
    the byte key of an id."""

    def __init__(self, backend: Any, table: Any, order: list[Any], key: Callable[[Any], Any]):
        self.backend, self.name = backend, backend.name
        self._table, self._order, self._key = table, order, key
        self._sql: dict[str, str] = {}
        self._id_kind = table.id.type()

    def _mark(self, name: str) -> str:
        return PLACEHOLDERS[self.name].format(name)

    def _compiled(self, expr: Any, stand_ins: tuple[str, ...] = ()) -> str:
        """The backend's SQL of `expr`, each stand-in's call written as its placeholder."""
        text = str(self.backend.compile(expr))
        if self.name == "postgres":  # psycopg reads % as a placeholder's start
            text = text.replace("%", "%%")
        for name in stand_ins:
            call = f"TOPK_PARAM_{name.upper()}()"
            if call not in text:
                raise AccessError(f"Ibis table on {self.name}: a read could not be compiled")
            text = text.replace(call, self._mark(name))
        return text

    def _shape(self, shape: str, build: Callable[[], Any] | None) -> str:
        sql = self._sql.get(shape)
        if sql is not None:
            return sql
        t = self._table
        if build is not None:  # a statement of no parameter
            sql = self._compiled(build())
        elif shape == "sorted":
            sql = self._compiled(t.order_by(self._order))
            sql += f" LIMIT {self._mark('n')} OFFSET {self._mark('start')}"
        elif shape == "keyset":
            score = _stand_in("topk_param_score", t.score.type())
            last = _stand_in("topk_param_last", self._id_kind)
            after = (t.score < score) | ((t.score == score) & (self._key(t.id) > self._key(last)))
            sql = self._compiled(t.filter(after).order_by(self._order), ("score", "last"))
            sql += f" LIMIT {self._mark('n')}"
        elif shape == "ranks":
            ranked = t.mutate(rank=ibis.row_number().over(order_by=self._order))
            among = MEMBERSHIP[self.name].format(column='"rank"', values=self._mark("ranks"))
            sql = (
                f'SELECT "id", "score", "rank" FROM ({self._compiled(ranked)}) AS "topk_ranked" '
                f'WHERE {among} ORDER BY "rank"'
            )
        elif shape == "ids":
            among = MEMBERSHIP[self.name].format(column='"id"', values=self._mark("ids"))
            sql = f'SELECT "id", "score" FROM ({self._compiled(t)}) AS "topk_items" WHERE {among}'
        else:  # the shapes above only
            raise ValueError(shape)
        self._sql[shape] = sql
        return sql

    def run(
        self, shape: str, params: dict[str, Any], build: Callable[[], Any] | None = None
    ) -> list[tuple[Any, ...]]:
        """The rows of `shape` with `params` bound, on the backend's connection (inside the
        transaction snapshot() opened, if any); `build` gives the expression of a shape of
        no parameter (compiled at its first run)."""
        run_hooks = getattr(self.backend, "_run_pre_execute_hooks", None)
        if callable(run_hooks):  # in-memory tables of the expression registered, as Ibis does
            run_hooks(self._table)
        sql = self._shape(shape, build)
        if self.name == "sqlite":
            params = {
                name: json.dumps(value) if isinstance(value, list) else value
                for name, value in params.items()
            }
        if self.name == "postgres":
            with self.backend.con.cursor() as cursor:
                return cursor.execute(sql, params).fetchall()
        cursor = self.backend.con.execute(sql, params)
        try:
            return cursor.fetchall()
        finally:
            if self.name == "sqlite":
                cursor.close()

    def fits(self, value: Any) -> bool:
        """Whether `value` can be an id of the id column (a value that cannot is no item's:
        never sent, so a PostgreSQL transaction is not aborted by a failed cast)."""
        if isinstance(value, bool):
            return False
        kind = self._id_kind
        if kind.is_integer():
            return isinstance(value, int)
        if kind.is_floating():
            return isinstance(value, int | float) and not math.isnan(value)
        return isinstance(value, str)


__all__ = ["MEMBERSHIP", "PLACEHOLDERS", "Statements"]
