"""The budget ledger as the SQL functions reach it: its role, its connection, and the functions
that grant and show budgets (topk.grant_budget, topk.spent, topk.my_budget).

The release functions charge the caller through a PrivacyLedger (topk_middleware/ledger.py) whose
connection is the server's own connection to itself over the local socket
(topk.settings.ledger_dsn), logged in as a role of its own (`make_ledger_role`, made by
install-sql: no superuser, so its connections never take the slots PostgreSQL reserves for
superusers). The charge is therefore an autonomous transaction: committed (row lock FOR UPDATE,
composition, insert) before any row of the table is read, and kept when the caller rolls back;
concurrent sessions are serialised by the ledger's row lock and never overspend.

Who pays: `session_user`, the role that logged in, by OID (`principal_of`). SET ROLE cannot
change it (only a superuser's SET SESSION AUTHORIZATION can), so a member of several roles cannot
draw on several budgets by switching between them; inside the SECURITY DEFINER function
current_user is the owner, so it could not name the caller anyway. A role without a budget row
is refused.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from frontends.sql.functions import SCHEMA
from frontends.sql.refusals import INVALID, LEDGER_REFUSED, NO_SLOT, REFUSED, no_nulls, refuse

LOCK_TIMEOUT = "10s"  # the ledger connection's wait for a principal's row (an open grant_budget)
APPLICATION_NAME = "topk_middleware ledger"
LEDGER_ROLE_PREFIX = "topk_ledger_"
# The ledger role's default CONNECTION LIMIT: half the slots the server opens to roles other
# than superusers (max_connections less superuser_reserved_connections, and less
# reserved_connections on PostgreSQL 16 and later), at least 1. The ledger holds one connection
# per session that calls a function, so an analyst's sessions take at most this many slots
# more than the sessions themselves.
DEFAULT_CONNECTION_LIMIT_SQL = (
    "SELECT greatest(1, (current_setting('max_connections')::int "
    "- current_setting('superuser_reserved_connections')::int "
    "- coalesce(current_setting('reserved_connections', true)::int, 0)) / 2)"
)


def check_connection_limit(limit: Any) -> int | None:
    """install-sql's --ledger-connections: None (the default, DEFAULT_CONNECTION_LIMIT_SQL) or
    a whole number of connections >= 1; a clear error otherwise."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(
            f"the ledger's connection limit must be a whole number >= 1, got {limit!r}"
        )
    return int(limit)


def ledger_role_name(database_key: str) -> str:
    """The role the ledger's connections log in as, one per database (install._database_key)."""
    return LEDGER_ROLE_PREFIX + hashlib.sha256(database_key.encode()).hexdigest()[:12]


def make_ledger_role(conn: Any, role: str, connection_limit: int | None = None) -> int:
    """The ledger's own role: LOGIN, no superuser, so that its connections (one per session
    that calls a function) never take the slots PostgreSQL reserves for superusers
    (superuser_reserved_connections) and a role that can connect cannot lock the superuser out;
    and a CONNECTION LIMIT (`connection_limit`, else DEFAULT_CONNECTION_LIMIT_SQL's), so that an
    analyst's sessions, each holding a ledger connection, cannot take every other slot through
    it: a session past the limit gets a refusal (ledger_reachable). Returns the limit.
    It owns the ledger's tables (created by its first connection: CREATE on schema topk until
    install-sql has checked it, then revoked) and may write topk.refusals; nothing else."""
    from psycopg import sql

    name = sql.Identifier(role)
    exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone()
    if not exists:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOINHERIT").format(name))
    limit = check_connection_limit(connection_limit)
    if limit is None:
        limit = int(conn.execute(DEFAULT_CONNECTION_LIMIT_SQL).fetchone()[0])
    conn.execute(sql.SQL("ALTER ROLE {} CONNECTION LIMIT {}").format(name, sql.Literal(limit)))
    database = conn.execute("SELECT current_database()").fetchone()[0]
    conn.execute(
        sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(database), name)
    )
    conn.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA topk TO {}").format(name))
    conn.execute(sql.SQL("GRANT SELECT, INSERT ON topk.refusals TO {}").format(name))
    for (table,) in conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'topk' AND tablename LIKE %s",
        ["topk\\_ledger%"],
    ).fetchall():  # made by an earlier install's connection of the installing role
        conn.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(
                sql.Identifier("topk", table), name
            )
        )
    return limit


def drop_ledger_role(conn: Any, role: str) -> None:
    """Drop the ledger's role of this database (`make_ledger_role`), its sessions ended first;
    left in place (it owns nothing) if the server refuses."""
    import psycopg
    from psycopg import sql

    try:
        with conn.transaction():
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                [role],
            )
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    except psycopg.Error:
        pass


# Ledger rows of an earlier install, keyed by role name, keyed by the role's OID instead
# (principal_of); rows of roles dropped since stay as they were, reachable by no role.
KEY_BY_OID = """
DO $$
DECLARE t text;
BEGIN
    FOR t IN SELECT c.table_name FROM information_schema.columns AS c
             WHERE c.table_schema = 'topk' AND c.column_name = 'principal' LOOP
        EXECUTE format('UPDATE topk.%I AS l SET principal = ''role:'' || r.oid '
                       'FROM pg_roles AS r WHERE l.principal = r.rolname::text', t);
    END LOOP;
END
$$
"""


def principal_of(role_oid: int) -> str:
    """The ledger's principal of a role: its OID (topk.principal(role) in SQL), so that a role
    dropped and created again under its name starts with no budget and no spending, and a
    renamed role keeps both."""
    return f"role:{int(role_oid)}"


def session_ledger(plpy: Any, GD: dict[str, Any]) -> Any:
    """The session's PrivacyLedger on its own connection (search_path topk), made once."""
    ledger = GD.get("topk_ledger")
    if ledger is None:
        import psycopg
        import sqlalchemy as sa

        from topk_middleware.ledger import PrivacyLedger

        dsn = plpy.execute("SELECT ledger_dsn FROM topk.settings")[0]["ledger_dsn"]
        options = f"-c search_path={SCHEMA} -c lock_timeout={LOCK_TIMEOUT}"

        def connect() -> Any:
            return psycopg.connect(dsn, options=options, application_name=APPLICATION_NAME)

        # No pre-ping (two round trips per call): a connection found dead fails its first
        # statement, SQLAlchemy drops it, and server_release runs the release once more.
        engine = sa.create_engine("postgresql+psycopg://", creator=connect, pool_size=1)
        with ledger_reachable(plpy):
            ledger = GD["topk_ledger"] = PrivacyLedger(engine)
    return ledger


@contextmanager
def ledger_reachable(plpy: Any) -> Iterator[None]:
    """A ledger connection the server refuses (no free slot: an analyst holding every slot open
    to non-superusers, or every connection the ledger's role may hold; or authentication)
    becomes a refusal in the project's words with the server's reason, never the driver's
    message, the DSN or a traceback; nothing was charged."""
    import sqlalchemy as sa

    try:
        yield
    except sa.exc.DBAPIError as error:
        text = str(error.orig)
        if not text.startswith("connection failed"):
            raise
        reason = text.rsplit("FATAL:", 1)[-1].strip().splitlines()[0] if "FATAL:" in text else ""
        full = "too many clients" in reason or "slots are reserved" in reason
        limited = "too many connections for role" in reason
        hint = "an administrator reads the server's log"
        if full:
            hint = (
                "every connection slot open to roles other than superusers is taken: try "
                "again later (an administrator may raise max_connections)"
            )
        elif limited:
            hint = (
                "other sessions hold every connection the ledger's role may open (its "
                "CONNECTION LIMIT): try again later (an administrator may raise it: "
                "topk-middleware install-sql --ledger-connections N)"
            )
        refuse(
            plpy,
            "the budget ledger could not open its connection to this server"
            + (f" ({reason})" if reason else "")
            + "; nothing was read, released or charged",
            NO_SLOT if full or limited else LEDGER_REFUSED,
            hint=hint,
        )


def _role(plpy: Any, role: str) -> tuple[str, str]:
    """(name, ledger principal) of a role given as regrole text."""
    plan = plpy.prepare(
        "SELECT rolname::text AS name, oid::bigint AS oid FROM pg_roles WHERE oid = $1::regrole",
        ["text"],
    )
    found = plpy.execute(plan, [role])[0]
    return found["name"], principal_of(found["oid"])


def without_delta(ledger: Any, principal: str) -> bool:
    """Whether the role's budget was granted with delta 0 (so no release spending delta fits)."""
    try:
        return ledger.total(principal)[1] == 0.0
    except KeyError:
        return False


def server_grant_budget(plpy: Any, GD: dict[str, Any], role: Any, epsilon: Any, delta: Any) -> None:
    """topk.grant_budget: set the role's total (created, or changed) in the caller's transaction;
    what the role has spent is kept."""
    from adapters.ledger import PRINCIPALS
    from topk_middleware.accounting import check_budget_total

    no_nulls(plpy, role=role, epsilon=epsilon, delta=delta)
    try:
        check_budget_total(epsilon, delta)
    except (TypeError, ValueError) as error:
        refuse(plpy, str(error), INVALID)
    session_ledger(plpy, GD)  # the ledger's tables exist
    plan = plpy.prepare(
        f"INSERT INTO {SCHEMA}.{PRINCIPALS} (principal, epsilon, delta, charges) "
        "VALUES ($1, $2, $3, 0) ON CONFLICT (principal) DO UPDATE SET "
        "epsilon = excluded.epsilon, delta = excluded.delta",
        ["text", "float8", "float8"],
    )
    plpy.execute(plan, [_role(plpy, role)[1], float(epsilon), float(delta)])


def server_spent(plpy: Any, GD: dict[str, Any], role: Any) -> list[tuple[Any, ...]]:
    """topk.spent: the composition of the role's releases (the ledger's, committed charges) and
    its total."""
    from adapters.ledger import PRINCIPALS

    no_nulls(plpy, role=role)
    from topk_middleware.accounting import BudgetExceeded

    name, principal = _role(plpy, role)
    ledger = session_ledger(plpy, GD)
    try:
        spent = ledger.spent(principal)
    except KeyError:
        refuse(plpy, f"role {name} has no privacy budget", REFUSED)
    except BudgetExceeded as error:  # CorruptLedger: a tampered charge
        refuse(plpy, f"role {name}: {error}", REFUSED)
    plan = plpy.prepare(
        f"SELECT epsilon, delta, charges FROM {SCHEMA}.{PRINCIPALS} WHERE principal = $1",
        ["text"],
    )
    total = plpy.execute(plan, [principal])[0]
    return [
        (spent.epsilon, spent.delta, spent.rule, total["charges"], total["epsilon"], total["delta"])
    ]


def server_my_budget(plpy: Any, GD: dict[str, Any]) -> list[tuple[Any, ...]]:
    """topk.my_budget: topk.spent of the calling role (session_user), which any role may ask."""
    role = plpy.execute("SELECT session_user::text AS role")[0]["role"]
    return server_spent(plpy, GD, plpy.quote_ident(role))
