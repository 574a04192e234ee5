"""A private top-k callable from DuckDB SQL, charged to one ledger principal.

After `register_private_top_k(con, ledger=..., principal=..., tables=[...])` an analyst writes,
on that connection,

    SELECT * FROM private_top_k('item_votes', 10, 1.0);

and gets (rank, item) rows: the release of private_top_k (topk_middleware/api.py) from the
registered DuckDBTable, charged to `principal` in the ledger before any row is read. The
installed duckdb package offers scalar Python functions only (no table functions from Python),
so the release is a scalar function `__topk_release(...)` returning a LIST of STRUCT(rank,
item) and `private_top_k` is a temporary table macro that unnests it; the macro hands it every
argument as text with its SQL type (`typeof`), so that the project's checks, not DuckDB's binder,
answer a mistyped one. DuckDB refuses a function
that queries the connection running it ("code running inside a query cannot use that query's
connection", tests/frontends/test_duckdb_sql.py): every registered table is read through a cursor of
`con` opened at registration (a second connection to the same database, with a snapshot of its
own). Cost: one release of private_top_k plus one call of a Python function.

Only the owner's declarations reach a release: the tables (each a DuckDBTable the owner built,
with its id and score columns, sensitivity and `frozen` promise) and `oblivious` are fixed at
registration; SQL names a table, k, epsilon, delta and the noise. What comes back is the
release only: rank and item, and `private_top_k_guarantee()` gives the last release's guarantee
in words (release.guarantee_text). Refusals are DuckDB errors whose text is the project's
sentence, no Python traceback; a refusal for a fact of the data (a negative score, k above m)
says only that, with a reference under which the owner reads the reason
(`Registration.refusals`).
"""

from __future__ import annotations

import math
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import duckdb

from adapters.duckdb import DuckDBTable
from topk_middleware.accounting import BudgetExceeded
from topk_middleware.api import NOISES, private_top_k
from topk_middleware.ledger import LedgerBudget, PrivacyLedger
from topk_middleware.privacy import SensitivityError
from topk_middleware.release import Diagnostics, Release, guarantee_text
from topk_middleware.validation import check_common

RELEASE_FUNCTION = "__topk_release"
GUARANTEE_FUNCTION = "private_top_k_guarantee"
RESULT_TYPE = "STRUCT(rank INTEGER, item VARCHAR)[]"
MAX_K = 10_000  # the most items one call releases (as the SQL functions of PostgreSQL)


class PrivateTopKRefused(Exception):
    """A refusal of the SQL function; DuckDB shows its name and message, nothing else."""


@dataclass
class Registration:
    """What `register_private_top_k` set up on one connection (the owner's handle)."""

    connection: duckdb.DuckDBPyConnection
    principal: str
    macro: str
    tables: dict[str, DuckDBTable]
    oblivious: bool
    refusals: dict[str, str] = field(default_factory=dict)  # reference -> the data's reason
    last: Release | None = None  # the last release (its guarantee: private_top_k_guarantee())
    last_diagnostics: Diagnostics | None = None  # the owner's: accesses, plan (never in SQL)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    cursor: Any = None

    def unregister(self) -> None:
        """Remove the macro and the functions from the connection; close the reading cursor."""
        self.connection.execute(f"DROP MACRO TABLE IF EXISTS {self.macro}")
        for name in (RELEASE_FUNCTION, GUARANTEE_FUNCTION):
            try:
                self.connection.remove_function(name)
            except duckdb.InvalidInputException:
                pass  # already removed
        if self.cursor is not None:
            self.cursor.close()
            self.cursor = None


def register_private_top_k(
    con: duckdb.DuckDBPyConnection,
    *,
    ledger: PrivacyLedger,
    principal: str,
    tables: Iterable[DuckDBTable],
    oblivious: bool = True,
    name: str = "private_top_k",
) -> Registration:
    """Make `name(source, k, epsilon, delta := 0, noise := 'gumbel')` a table function of `con`
    releasing from the registered `tables` (named in SQL by their table name, schema-qualified
    where they have a schema), each call charged to `principal` (who must hold a budget in
    `ledger`). `oblivious` (default True, as the PostgreSQL functions: whoever runs the SQL can
    time the call) makes every call's reads and wall time a function of public facts
    (mechanisms/oblivious.py); False runs the adaptive threshold algorithm, whose access pattern
    depends on the counts."""
    if not isinstance(con, duckdb.DuckDBPyConnection):
        raise TypeError(f"con must be a DuckDB connection, got {type(con).__name__}")
    if not isinstance(ledger, PrivacyLedger):
        raise TypeError(f"ledger must be a PrivacyLedger, got {type(ledger).__name__}")
    if not isinstance(oblivious, bool):
        raise TypeError(f"oblivious must be True or False, got {oblivious!r}")
    if not name.isidentifier():
        raise ValueError(f"name must be a plain SQL identifier, got {name!r}")
    ledger.total(principal)  # KeyError in words: the principal has no budget
    cursor = con.cursor()  # reads of every release: a connection of their own
    declared: dict[str, DuckDBTable] = {}
    for table in tables:
        if not isinstance(table, DuckDBTable):
            raise TypeError(f"tables must be DuckDBTable objects, got {type(table).__name__}")
        key = table.table if table.schema is None else f"{table.schema}.{table.table}"
        declared[key] = DuckDBTable(
            cursor,
            table.table,
            table.id_column,
            table.score_column,
            schema=table.schema,
            rank_table=table.rank_table,
            sensitivity=table.sensitivity,
            max_items_per_client=table.max_items_per_client,
            frozen=table.frozen,
        )
    if not declared:
        raise ValueError("register_private_top_k needs at least one table to release from")
    registration = Registration(con, principal, name, declared, oblivious, cursor=cursor)
    # A result left open on `con` (DuckDB refuses create_function while one is): read to its end.
    con.execute("SELECT 1").fetchall()
    for function in (RELEASE_FUNCTION, GUARANTEE_FUNCTION):  # a registration again replaces it
        try:
            con.remove_function(function)
        except duckdb.InvalidInputException:
            pass  # not registered yet
    budget = LedgerBudget(ledger, principal, math.nan, math.nan)  # totals: the ledger's row

    def release(
        source: Any, noise: Any, k: Any, k_type: Any, eps: Any, eps_type: Any, d: Any, d_type: Any
    ) -> list[dict]:
        k, epsilon, delta = _sql_value(k, k_type), _sql_value(eps, eps_type), _sql_value(d, d_type)
        with registration.lock:
            return _release(registration, budget, source, k, epsilon, delta, noise)

    def last_guarantee() -> str | None:
        found = registration.last
        return None if found is None else guarantee_text(found)

    con.create_function(
        RELEASE_FUNCTION,
        release,
        ["VARCHAR"] * 8,
        RESULT_TYPE,
        side_effects=True,  # every call is a release: never folded or cached
        null_handling="special",  # NULL arguments reach the function, which refuses them
    )
    con.create_function(GUARANTEE_FUNCTION, last_guarantee, [], "VARCHAR", side_effects=True)
    # every argument reaches Python as text with its SQL type, so that a mistyped one is
    # refused in the project's words (check_common) rather than by DuckDB's function binder
    typed = ", ".join(f"CAST({a} AS VARCHAR), typeof({a})" for a in ("k", "epsilon", "delta"))
    con.execute(
        f"CREATE OR REPLACE TEMP MACRO {name}(source, k, epsilon, delta := 0.0, "
        f"noise := 'gumbel') AS TABLE SELECT unnest({RELEASE_FUNCTION}(CAST(source AS VARCHAR), "
        f"CAST(noise AS VARCHAR), {typed}), recursive := true)"
    )
    return registration


_INTEGER_TYPES = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "INTEGER_LITERAL"}
_INTEGER_TYPES |= {"U" + name for name in _INTEGER_TYPES}
_REAL_TYPES = {"FLOAT", "DOUBLE", "REAL"}


def _sql_value(text: str | None, sql_type: str) -> Any:
    """A number argument given to the SQL function, back from its text and SQL type (`typeof`):
    an int for an integer type, a float for a real or decimal one, else the text itself (which
    check_common refuses in words)."""
    if text is None:
        return None
    name = sql_type.upper()
    if name in _INTEGER_TYPES:
        return int(text)
    if name in _REAL_TYPES or name.startswith("DECIMAL("):
        return float(text)
    return text


def _refuse(message: str) -> PrivateTopKRefused:
    return PrivateTopKRefused(message)


def _release(
    registration: Registration,
    budget: LedgerBudget,
    source: Any,
    k: Any,
    epsilon: Any,
    delta: Any,
    noise: Any,
) -> list[dict[str, Any]]:
    """One call: the arguments checked, the table looked up, the release charged and run."""
    for label, value in (
        ("source", source),
        ("k", k),
        ("epsilon", epsilon),
        ("delta", delta),
        ("noise", noise),
    ):
        if value is None:
            raise _refuse(f"{label} must not be NULL; nothing was read, charged or released")
    try:
        check_common(k, epsilon, delta)
        if k > MAX_K:
            raise ValueError(f"k = {k} is more than the {MAX_K:,} items one release takes")
        if noise not in NOISES:
            raise ValueError(f"noise must be one of {', '.join(NOISES)}, got {noise!r}")
    except (TypeError, ValueError) as error:
        raise _refuse(f"{error}; nothing was read, charged or released") from None
    table = registration.tables.get(source)
    if table is None:
        known = ", ".join(sorted(registration.tables))
        raise _refuse(
            f"{source!r} is not a table registered for private releases on this connection "
            f"(registered: {known}); nothing was read, charged or released"
        )
    principal = registration.principal
    try:
        result = private_top_k(
            table,
            int(k),
            float(epsilon),
            float(delta),
            noise,
            budget=budget,
            oblivious=registration.oblivious,
        )
    except KeyError as error:
        if "has no budget" not in str(error):
            raise
        raise _refuse(
            f"principal {principal!r} has no privacy budget; nothing was read or released"
        ) from None
    except BudgetExceeded as error:
        raise _refuse(f"principal {principal!r}: {error}") from None
    except SensitivityError as error:  # the owner's declaration, not a fact of the counts
        raise _refuse(f"{error}; nothing was read or released") from None
    except ValueError as error:  # k > m, bad scores: facts of the data, for the owner only
        charged = getattr(budget._pending, "seq", None) is not None
        reference = "R-" + uuid.uuid4().hex[:12]
        registration.refusals[reference] = str(error)
        raise _refuse(
            f"the release was refused for a reason in the table's data, which only the "
            f"table's owner may see (reference {reference}); "
            + ("the budget was charged" if charged else "nothing was charged, read or released")
        ) from None
    release = result.release()
    registration.last, registration.last_diagnostics = release, result.diagnostics
    return [{"rank": rank, "item": str(item)} for rank, item in enumerate(release.items, 1)]


__all__ = ["PrivateTopKRefused", "Registration", "register_private_top_k"]
