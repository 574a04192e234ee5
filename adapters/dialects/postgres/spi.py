"""SPIDriver: PostgreSQL's statements run by the server process itself, through PL/Python's SPI.

The third driver of the PostgreSQL dialect (adapters/sql/driver.py has psycopg and SQLAlchemy),
for code that runs inside a SQL function (frontends/plpython.py): `plpy.prepare` and
`plpy.execute`, no network round trip. The engine's `:name` placeholders become `$1`, `$2`, ...
and each is declared with the type the driver was given for its name (SPI plans need parameter
types; a name always binds one type, e.g. the id column's). Each statement is prepared once
and its plan kept with the driver (a plan per statement text). Transactions are the calling
statement's: a SQL function opens none and, STABLE, reads in the caller's snapshot. Rows come
back as tuples in column order (every statement names its columns apart); interrupts are
checked every INTERRUPT_ROWS rows while they are converted (topk_middleware/interrupts.py),
where a pending cancel reaches PL/Python only through a call into the server. Cost: one
plpy.execute per statement, a few microseconds per row converted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.sql.driver import Driver, DriverError
from adapters.sql.placeholders import convert
from topk_middleware.interrupts import check as check_interrupts

INTERRUPT_ROWS = 4096


class SPIDriver(Driver):
    """Statements through `plpy` (module docstring); `types`: each parameter name's type."""

    style = "numbered"

    def __init__(self, plpy: Any, types: Mapping[str, str]) -> None:
        self.plpy, self.types = plpy, dict(types)
        self.errors = (plpy.SPIError,)
        self._plans: dict[str, Any] = {}

    def execute(
        self, sql: str, params: Mapping[str, Any] | None = None, **_: Any
    ) -> list[tuple[Any, ...]]:
        text, names = convert(sql, self.style)
        order = list(dict.fromkeys(names))
        plan = self._plans.get(text)
        if plan is None:
            plan = self._plans[text] = self.plpy.prepare(text, [self.types[n] for n in order])
        result = self.plpy.execute(plan, [(params or {})[n] for n in order])
        if len(result) and len(set(result.colnames())) < len(result.colnames()):
            raise DriverError(f"SPI: a statement returns two columns of one name: {text}")
        rows = []
        for number, row in enumerate(result):
            if number % INTERRUPT_ROWS == 0:
                check_interrupts()
            rows.append(tuple(row.values()))
        return rows

    @property
    def in_transaction(self) -> bool:
        return True  # the calling statement's


__all__ = ["SPIDriver"]
