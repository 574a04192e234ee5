"""Registered tables: what a release function may read, and the SPI source it reads through.

`register_source` (the client side of install-sql --source) prepares a table in live mode
(adapters/postgres/live/) and records it in topk.sources with its id and score columns,
its sensitivity and an oblivious deadline; topk.grant_source names the roles that may release
from it. Inside the server, `registration` reads that row for the caller (one refusal for every
reason the caller may not name or read the table) and `spi_table` makes its SPI source
(frontends/plpython.py) once per session.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

from frontends.sql.refusals import FEATURE_NOT_SUPPORTED, UNDEFINED, refuse


def register_source(
    dsn: str,
    table: str,
    id: str,
    score: str,
    *,
    schema: str | None = None,
    sensitivity: float | None = None,
    deadline: float | None = None,
    grant: Collection[str] = (),
) -> str:
    """Prepare `table` in live mode (adapters/postgres/live/: its B-trees, position table and
    triggers; idempotent) and register it for topk.private_top_k with its id and score columns
    and its sensitivity (the most one client changes one count; scales the noise): the one
    declared, else what from_votes recorded with the table, else 1; a declaration below the
    record is refused (privacy.resolve_declared). `deadline`: the seconds an oblivious release
    from it is padded to (None: the SPI cost model's, mechanisms/oblivious.py), for an operator
    whose ledger log shows overruns. `grant`: the roles (or PUBLIC) that may release from it
    (topk.grant_source; without one, no analyst may). Returns the table's name as regclass
    prints it."""
    from adapters.postgres import PostgresTable
    from topk_middleware.privacy import check_sensitivity

    if sensitivity is not None:
        sensitivity = check_sensitivity(sensitivity, "--sensitivity")
    if deadline is not None and (
        isinstance(deadline, bool) or not (math.isfinite(float(deadline)) and deadline > 0)
    ):
        raise ValueError(f"--deadline must be a number of seconds > 0, got {deadline!r}")

    source = PostgresTable(
        dsn, table, id=id, score=score, schema=schema, mode="live", sensitivity=sensitivity
    )
    sensitivity = source.sensitivity
    try:
        source.prepare()
        conn = source._conn
        base = source._base.as_string(conn)
        position_table = source._pos.as_string(conn)
        with conn.transaction():
            conn.execute(
                "INSERT INTO topk.sources (source, id_column, score_column, position_table, "
                "trigger_prefix, sensitivity, deadline) "
                "VALUES (%s::regclass, %s, %s, %s::regclass, %s, %s, %s) "
                "ON CONFLICT (source) DO UPDATE SET id_column = excluded.id_column, "
                "score_column = excluded.score_column, position_table = "
                "excluded.position_table, trigger_prefix = excluded.trigger_prefix, "
                "sensitivity = excluded.sensitivity, deadline = excluded.deadline, "
                "registered_at = now()",
                [base, id, score, position_table, source.trigger_function, sensitivity, deadline],
            )
            for grantee in grant:
                conn.execute("SELECT topk.grant_source(%s::regclass, %s)", [base, grantee])
            return conn.execute("SELECT %s::regclass::text", [base]).fetchone()[0]
    finally:
        source.close()


def registered_sensitivity(dsn: str, name: str) -> float:
    """The sensitivity a registered table was registered with (topk.sources)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute(
            "SELECT sensitivity FROM topk.sources WHERE source = %s::regclass", [name]
        ).fetchone()
    if found is None:
        raise LookupError(f"{name} is not registered")
    return float(found[0])


def registration(plpy: Any, GD: dict[str, Any], source: str) -> dict[str, Any]:
    plan = GD.get("topk_registration")
    if plan is None:
        plan = GD["topk_registration"] = plpy.prepare(
            "SELECT session_user::text AS role, session_user::regrole::oid::bigint AS role_oid, "
            "s.source::text AS relation, s.source::oid::bigint AS relation_oid, s.id_column, "
            "s.score_column, "
            "s.position_table::text AS position_table, s.trigger_prefix, s.sensitivity, "
            "s.deadline, "
            "format_type(i.atttypid, i.atttypmod) AS id_type, i.attcollation <> 0 AS text_ids, "
            "format_type(c.atttypid, c.atttypmod) AS score_type, "
            "has_schema_privilege(session_user, r.relnamespace, 'USAGE') AS named, "
            "EXISTS (SELECT 1 FROM topk.source_grants AS g WHERE g.source = s.source AND "
            "(g.grantee = 0 OR coalesce(pg_has_role(session_user, g.grantee, 'MEMBER'), false)))"
            " AS granted, r.relrowsecurity AS row_security, "
            "obj_description(s.source, 'pg_class') AS comment "
            "FROM topk.sources AS s JOIN pg_class AS r ON r.oid = s.source "
            "JOIN pg_attribute AS i ON i.attrelid = s.source AND i.attname = s.id_column "
            "JOIN pg_attribute AS c ON c.attrelid = s.source AND c.attname = s.score_column "
            "WHERE s.source = $1::regclass",
            ["text"],
        )
    try:
        rows = plpy.execute(plan, [source])
    except plpy.SPIError:  # not a name or OID regclass takes back
        rows = []
    if not len(rows) or not rows[0]["named"] or not rows[0]["granted"]:
        # One refusal for an unregistered table, a dangling OID, a table not granted to the
        # caller and a table in a schema the caller has no USAGE on: which of them it is would
        # tell the caller about the catalog.
        refuse(
            plpy,
            f"table {source} is not registered for private top-k, or this role may not name "
            "it (USAGE on its schema) or release from it (topk.grant_source)",
            UNDEFINED,
            hint="an administrator registers it (topk-middleware install-sql --dsn ... "
            "--source <table> --id <id column> --score <score column>) and grants it: "
            "SELECT topk.grant_source('<table>', '<role>')",
        )
    if rows[0]["row_security"]:
        refuse(
            plpy,
            f"table {rows[0]['relation']} has row-level security: a release reads every row as "
            "the functions' owner and would not honour its policies; nothing was read or charged",
            FEATURE_NOT_SUPPORTED,
            hint="release from a table (or a copy) without row-level security, holding only "
            "the rows every analyst it is granted to may count",
        )
    return rows[0]


def spi_table(plpy: Any, GD: dict[str, Any], found: dict[str, Any]) -> Any:
    """The SPI source of a registration, kept for the session with its prepared plans (a new
    registration, or a changed column type, makes a new one)."""
    from adapters.contributions import parse_record
    from frontends.plpython import SPITable
    from topk_middleware.privacy import resolve_declared

    tables = GD.setdefault("topk_tables", {})
    varying = ("role", "role_oid", "named", "granted", "row_security", "deadline")
    key = tuple(found[c] for c in sorted(found) if c not in varying)
    table = tables.get(key)
    if table is None:
        table = tables[key] = SPITable(
            plpy,
            found["relation"],
            found["id_column"],
            found["score_column"],
            found["id_type"],
            found["score_type"],
            found["position_table"],
            found["trigger_prefix"],
            bool(found["text_ids"]),
        )
    # Declared at registration; never below what from_votes recorded in the table's comment
    # (the comment may have changed since): SensitivityError otherwise.
    table.sensitivity, table.max_items_per_client = resolve_declared(
        float(found["sensitivity"]), None, parse_record(found["comment"]), table.where
    )
    table.deadline = found["deadline"]  # the operator's padding of oblivious releases, or None
    return table
