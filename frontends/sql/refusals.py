"""Refusals of the SQL functions, in the project's words, before anything is read or charged.

`refuse` raises plpy.Error "topk: ..." with a SQLSTATE (the codes below) and a hint; the plpgsql
front raises it again as a plain SQL error (topk._refuse, hiding.py). The arguments are checked
first: no NULLs, each mechanism's own checks, k at most MAX_RELEASE_K, no mechanism that cannot
be oblivious under the oblivious default, no SERIALIZABLE transaction. A refusal whose reason is
a fact of the data is written to topk.refusals (`log_refusal`, through the ledger's own
connection) and the analyst gets only its reference; those are rate-limited per role
(`not_refused_too_often`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from frontends.sql.functions import SCHEMA

# The largest k the release functions take: more is work known to be excessive (a release
# that long is no top-k), refused before anything is read or charged. An oblivious release is
# also refused, before the charge, when it would read more rows than the SPI store holds
# (plpython.MAX_OBLIVIOUS_ROWS; the analyst then gets a data refusal's reference).
MAX_RELEASE_K = 10_000

INVALID = "22023"  # invalid_parameter_value
NULL_ARGUMENT = "22004"  # null_value_not_allowed
UNDEFINED = "42704"  # undefined_object: an unregistered source
REFUSED = "42501"  # insufficient_privilege: no budget, or over budget
FEATURE_NOT_SUPPORTED = "0A000"  # SERIALIZABLE, or row-level security on the table
RATE_LIMITED = "54000"  # program_limit_exceeded: too many data refusals within a minute
NO_SLOT = "53300"  # too_many_connections: the ledger's connection found no free slot
LEDGER_REFUSED = "08004"  # the server refused the ledger's connection for another reason

# A role's releases refused for a fact of the data, within one minute, after which its releases
# are refused at once, reading and writing nothing, until the minute has passed.
REFUSALS_PER_MINUTE = 30
# The hint of a refusal for the registration's sensitivity.
REGISTER_AGAIN = (
    "the sensitivity is set when the table is registered: an administrator registers it "
    "again, topk-middleware install-sql --dsn ... --source <table> --sensitivity N"
)


def refuse(plpy: Any, message: str, sqlstate: str, hint: str | None = None) -> None:
    extra = {"hint": hint} if hint else {}
    plpy.error(f"topk: {message}", sqlstate=sqlstate, **extra)


def no_nulls(plpy: Any, **arguments: Any) -> None:
    for name, value in arguments.items():
        if value is None:
            refuse(plpy, f"{name} must not be NULL", NULL_ARGUMENT)


def checked(plpy: Any, check: Callable[..., None], *arguments: Any) -> None:
    """Run a mechanism's own argument check; its refusal as invalid_parameter_value."""
    try:
        check(*arguments)
    except (TypeError, ValueError) as error:
        refuse(plpy, str(error), INVALID)


def check_release_k(k: int) -> None:
    """Refuse k above MAX_RELEASE_K (the request's own argument: a public refusal)."""
    if k > MAX_RELEASE_K:
        raise ValueError(
            f"k = {k} is more than the {MAX_RELEASE_K:,} items a release of the SQL functions takes"
        )


def not_oblivious(plpy: Any, mechanism: str, oblivious: Any) -> None:
    """Refuse a mechanism that cannot be made oblivious (mechanisms/oblivious.py) under the
    functions' oblivious default, before anything is read or charged."""
    if oblivious:
        refuse(
            plpy,
            f"{mechanism} cannot run obliviously: which rows and how many it reads depend on "
            "the counts, and anyone who can watch the server could see them; nothing was read "
            "or charged",
            INVALID,
            hint="pass oblivious => false to accept that, or use topk.private_top_k",
        )


def no_predicate_locks(plpy: Any, GD: dict[str, Any]) -> None:
    """Refuse a release inside a SERIALIZABLE transaction, before anything is read or charged:
    there every page a read touches takes a predicate (SIRead) lock, listed in pg_locks to
    every role until the transaction's last overlapping one ends, so another role would see
    which index and heap pages the release read."""
    plan = GD.get("topk_isolation")
    if plan is None:
        plan = GD["topk_isolation"] = plpy.prepare(
            "SELECT current_setting('transaction_isolation') AS level"
        )
    if plpy.execute(plan)[0]["level"] == "serializable":
        refuse(
            plpy,
            "a release does not run inside a SERIALIZABLE transaction: its reads would leave "
            "predicate locks that every role sees in pg_locks; nothing was read or charged",
            FEATURE_NOT_SUPPORTED,
            hint="call it in a READ COMMITTED or REPEATABLE READ transaction",
        )


def not_refused_too_often(plpy: Any, ledger: Any, role: str) -> None:
    """Refuse at once, reading and writing nothing, a role whose releases were refused for a
    fact of the data REFUSALS_PER_MINUTE times in the last minute: such refusals are free and
    each writes a row of topk.refusals, so they are rate-limited per role (counted through the
    ledger's connection, which sees every committed refusal whatever the caller's snapshot)."""
    import sqlalchemy as sa

    with ledger.store.engine.connect() as conn:
        recent = conn.execute(
            sa.text(
                f"SELECT count(*) FROM {SCHEMA}.refusals WHERE role = :role "
                "AND refused_at > now() - interval '1 minute'"
            ),
            {"role": role},
        ).scalar_one()
    if recent >= REFUSALS_PER_MINUTE:
        refuse(
            plpy,
            f"role {role} had {REFUSALS_PER_MINUTE} releases refused for a reason in the data "
            "within a minute; releases are paused for it until the minute has passed; nothing "
            "was read, charged or logged",
            RATE_LIMITED,
            hint="an administrator reads the reasons: SELECT * FROM topk.refusals WHERE role = "
            f"'{role}' ORDER BY refused_at DESC",
        )


def log_refusal(ledger: Any, role: str, relation: str, detail: str) -> str:
    """Record a refusal's data facts in topk.refusals (the operator's log, through the ledger's
    own connection: committed although the caller's statement fails); its reference."""
    import uuid

    import sqlalchemy as sa

    reference = "R-" + uuid.uuid4().hex[:12]
    with ledger.store.engine.begin() as conn:
        conn.execute(
            sa.text(
                f"INSERT INTO {SCHEMA}.refusals (reference, role, source, detail) "
                "VALUES (:reference, :role, :source, :detail)"
            ),
            {"reference": reference, "role": role, "source": relation, "detail": detail},
        )
    return reference


def is_lock_timeout(error: Exception) -> bool:
    import psycopg

    cause = getattr(error, "orig", error)
    return isinstance(cause, psycopg.errors.LockNotAvailable)
