"""The privacy ledger named by --ledger (topk_middleware/ledger.py, stored by adapters/ledger.py):
the URL forms the command line accepts, the ledger opened without creating one where the
command only reads or charges it, and a principal's stored budget. Used by `release`, `trend`
and `budget`; SQLAlchemy is imported only when a ledger is opened.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from adapters.url import DUCKDB_SUFFIXES, POSTGRES_SCHEMES, StoreConnectionError
from frontends.cli.reporting import PROG, UsageError
from topk_middleware.names import first_line, mask_secrets

if TYPE_CHECKING:
    from topk_middleware.ledger import LedgerBudget, PrivacyLedger

LEDGER_URL_HELP = (
    "the privacy ledger (topk_middleware/ledger.py): an SQLAlchemy URL, a DuckDB file or "
    "postgresql://user@host/db"
)


def ledger_url(text: str) -> str:
    """The SQLAlchemy URL of a ledger given as a DuckDB file, a postgresql:// URI or a URL."""
    if "://" not in text and text.lower().endswith(DUCKDB_SUFFIXES):
        return "duckdb:///" + text
    for scheme in POSTGRES_SCHEMES:
        if text.startswith(scheme):
            return "postgresql+psycopg://" + text[len(scheme) :]
    return text


def open_ledger(text: str, *, create: bool) -> PrivacyLedger:
    """The PrivacyLedger at `text`. Unless `create`, it must already be one: no file and no
    table is created by a command that only reads or charges it."""
    import sqlalchemy as sa

    from adapters.ledger import PRINCIPALS as LEDGER_PRINCIPALS
    from topk_middleware.ledger import PrivacyLedger

    try:
        url = sa.make_url(ledger_url(text))
    except (sa.exc.ArgumentError, ValueError):  # ValueError's message may quote the password
        raise UsageError(
            f"--ledger {mask_secrets(text)!r} is not a URL: expected {LEDGER_URL_HELP}"
        ) from None
    shown = url.render_as_string(hide_password=True)
    if url.get_backend_name() in ("sqlite", "duckdb"):
        database = url.database or ""
        if database in ("", ":memory:"):
            raise UsageError(f"--ledger {shown!r}: an in-memory ledger keeps nothing; name a file")
        if not create and not Path(database).is_file():
            raise UsageError(f"no ledger file at {database!r} (grant a budget first)")
        if not Path(database).exists():
            return PrivacyLedger(url)  # a new file, created 0600 by the ledger itself
    try:
        engine = sa.create_engine(url)
    except (ImportError, sa.exc.ArgumentError) as error:
        raise UsageError(
            f"--ledger {shown}: SQLAlchemy cannot load its driver ({first_line(error)})"
        ) from None
    try:
        with engine.connect() as conn:
            exists = sa.inspect(conn).has_table(LEDGER_PRINCIPALS)
    except sa.exc.DBAPIError as error:
        raise StoreConnectionError(
            f"cannot connect to the ledger at {shown}: {first_line(error.orig)}"
        ) from None
    finally:
        engine.dispose()
    if not exists and not create:
        raise LookupError(
            f"no privacy ledger at {shown}: grant a budget first ({PROG} budget --ledger URL "
            "--principal NAME --grant EPSILON)"
        )
    return PrivacyLedger(url)


def principal_budget(ledger: PrivacyLedger, principal: str) -> LedgerBudget:
    """The budget of a principal already in the ledger, with the total stored there."""
    try:
        epsilon, delta = ledger.total(principal)
    except KeyError:
        raise LookupError(
            f"principal {principal!r} has no budget in this ledger: grant one with {PROG} "
            f"budget --ledger URL --principal {principal} --grant EPSILON"
        ) from None
    return ledger.budget(principal, epsilon, delta, ledger.window(principal))
