"""The in-store one-shot's keyed noise per SQLAlchemy dialect (topk_middleware/keyed_noise.py):
the SQL of the first 52 bits of SHA-256("key:position"), and the exceedances as bound arrays."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from adapters._sql import float_array_literal, int_array_literal

# The first 52 bits of SHA-256("key:rank") as a double, per dialect (keyed_noise.py); `:key` is
# the run's secret key, a bound parameter.
_KEYED_DIGITS = {
    "postgresql": (
        "(('x' || encode(substring(sha256((:key || ':' || {rank})::bytea) FROM 1 FOR 7), "
        "'hex'))::bit(56)::bigint >> 4)::float8"
    ),
    "duckdb": (
        "('0x' || substr(sha256(:key || ':' || CAST({rank} AS VARCHAR)), 1, 13))::UBIGINT::DOUBLE"
    ),
}
# The exceedances (position, noise) as bound arrays, per dialect: never literals in the statement
# text, which pg_stat_activity and the server's logs show. SQLite (in-process, no server) reads
# them from two bound JSON arrays. MySQL / MariaDB have no such path: pymysql interpolates every
# parameter into the text on the client, key included, so there the one-shot runs in the client.
_EXCEEDANCES = {
    "postgresql": "SELECT * FROM unnest(CAST(:positions AS bigint[]), CAST(:noises AS float8[]))",
    "duckdb": "SELECT unnest(CAST(:positions AS BIGINT[])), unnest(CAST(:noises AS DOUBLE[]))",
    "sqlite": (
        "SELECT CAST(p.value AS INTEGER), z.value FROM json_each(:positions) AS p "
        "JOIN json_each(:noises) AS z ON z.key = p.key"
    ),
}


def array_param(dialect: str, values: Sequence[Any], floats: bool = False) -> Any:
    """A list bound as one parameter, in the form the dialect's SQL above reads it: JSON text
    (SQLite's json_each), PostgreSQL's array literal (one text value: psycopg's list adapter
    would quote each element), or the list itself (DuckDB)."""
    if dialect == "sqlite":
        return json.dumps(list(values))
    if dialect == "postgresql":
        return float_array_literal(values) if floats else int_array_literal(values)
    return list(values)
