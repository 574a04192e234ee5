"""A private top-k as a dbt Python model on dbt-duckdb: `return private_top_k_model(dbt, session,
dbt.ref("item_votes"), k=10, epsilon=1.0, ledger=..., principal=..., run_date=...)`.

The model passes the relation it reads and three values of its config (dbt hands a Python model
only the refs and config keys its own code names, `dbt.ref(...)` and `dbt.config.get(...)`):
the ledger (`topk_ledger`, an SQLAlchemy URL),
who pays (`topk_principal`, a principal already granted a budget there) and the run date
(`topk_run_date`, rendered by dbt from `run_started_at` in dbt_project.yml). The release key is
the
model, the table it reads and the run date (`<database>.<schema>.<model>:<ref>@<date>`), so a
rerun of the same model on the same date, a retry after a failure included, returns the release
stored in the ledger and charges nothing (release_keys.py, DESIGN invariant 16); the next date is
a new release, charged once.

The counts are read from the referenced model's table in the warehouse, through a cursor of the
run's DuckDB connection (adapters/duckdb.DuckDBTable; the referenced model lives in this model's
schema and database), by private_top_k with its default plan. What the model
returns, and dbt writes as its table, is the release only: rank from 1, item (and count, noised,
with `with_counts=True`) and the guarantee in words on every row (release.guarantee_text), never
the access counts or the plan. Every refusal is a ValueError, TypeError or LookupError in the
project's words, raised before the table is read or the budget charged; dbt reports it as the
model's error. Cost: one release of private_top_k, one ledger claim and charge.
"""

from __future__ import annotations

import re
from typing import Any

from adapters.duckdb import DuckDBTable
from topk_middleware.api import private_top_k
from topk_middleware.ledger import PrivacyLedger
from topk_middleware.release import Release, guarantee_text, plain
from topk_middleware.validation import check_common

CONFIG_KEYS = {"ledger": "topk_ledger", "principal": "topk_principal", "run_date": "topk_run_date"}


# dbt-duckdb loads a ref or a source as `con.query('select * from "db"."schema"."table"')`
_QUOTED = r'"((?:[^"]|"")+)"'
_REF_QUERY = re.compile(rf"select \* from {_QUOTED}\.{_QUOTED}\.{_QUOTED}", re.IGNORECASE)


def referenced_table(relation: Any) -> tuple[str, str, str]:
    """(database, schema, table) of a relation that `dbt.ref(...)` or `dbt.source(...)` gave."""
    query = getattr(relation, "sql_query", None)
    found = _REF_QUERY.fullmatch(query().strip()) if callable(query) else None
    if found is None:
        raise TypeError(
            "relation must be what dbt.ref(...) or dbt.source(...) returns on dbt-duckdb (a "
            "table of the warehouse); nothing was read, charged or released"
        )
    database, schema, table = (part.replace('""', '"') for part in found.groups())
    return database, schema, table


def release_key(dbt: Any, table: str, run_date: str) -> str:
    """The release key of this model's run: the model, the table it reads and the run date."""
    this = dbt.this
    return f"{this.database}.{this.schema}.{this.identifier}:{table}@{run_date}"


def _configured(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        key = CONFIG_KEYS[name]
        raise ValueError(
            f"{name} is missing (got {value!r}): set +{key} for this model in dbt_project.yml "
            f"and pass {name}=dbt.config.get({key!r}); nothing was read, charged or released"
        )
    return value


def release_table(release: Release) -> Any:
    """The release as a pyarrow Table: rank (int32 from 1), item, count (noisy, when released)
    and the guarantee in words on every row."""
    import pyarrow as pa

    columns: dict[str, Any] = {
        "rank": pa.array(range(1, len(release.items) + 1), type=pa.int32()),
        "item": pa.array([plain(item) for item in release.items]),
    }
    if release.counts is not None:
        columns["count"] = pa.array([int(c) for c in release.counts], type=pa.int64())
    columns["guarantee"] = pa.array([guarantee_text(release)] * len(release.items), pa.string())
    return pa.table(columns)


def private_top_k_model(
    dbt: Any,
    session: Any,
    relation: Any,
    *,
    k: int,
    epsilon: float,
    ledger: str,
    principal: str,
    run_date: str,
    id: str = "id",
    score: str = "score",
    **options: Any,
) -> Any:
    """Release the k most counted items of the table of `relation` (`dbt.ref(...)`) under
    (epsilon, delta)-DP, charged once per release key (module docstring). `options` go to
    private_top_k (delta, noise, with_counts, counts_share, oblivious; the sensitivity is the
    table's record, else 1). Returns the
    pyarrow Table dbt writes as this model's table."""
    check_common(k, epsilon, options.get("delta", 0.0))
    for name in ("budget", "release_key", "seed"):
        if name in options:
            raise TypeError(
                f"{name}= is the model's own: the ledger and principal come from its config and "
                "the key from the run; nothing was read, charged or released"
            )
    ledger_url = _configured("ledger", ledger)
    principal = _configured("principal", principal)
    database, schema, name = referenced_table(relation)
    key = release_key(dbt, f"{schema}.{name}", _configured("run_date", run_date))
    charges = PrivacyLedger(ledger_url)
    try:
        try:
            budget = charges.budget(principal, *charges.total(principal))
        except KeyError:
            raise LookupError(
                f"principal {principal!r} has no budget in the ledger {ledger_url!r}: grant one "
                f"(topk-middleware budget --ledger URL --principal {principal} --grant EPSILON)"
            ) from None
        cursor = session.cursor()  # a DuckDB connection of its own to the run's database
        try:
            (current,) = cursor.execute("SELECT current_database()").fetchone()
            if database != current:
                raise ValueError(
                    f"the table {database}.{schema}.{name} is in another database than the "
                    f"run's ({current}); nothing was read, charged or released"
                )
            table = DuckDBTable(cursor, name, id, score, schema=schema)
            result = private_top_k(table, k, epsilon, budget=budget, release_key=key, **options)
        finally:
            cursor.close()
    finally:
        charges.close()
    return release_table(result.release())
