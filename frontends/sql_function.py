"""The names of the package frontends/sql (the SQL functions inside PostgreSQL) under one module.

Function bodies installed while BOOT read `from frontends import sql_function` keep that import
in the database until install-sql runs again: every `server_*` they call is here, so they keep
working on this code. Callers may import the installer's names from here too. The code lives in
frontends/sql/ (its __init__ says which module holds what); nothing is defined here.
"""

from frontends.sql.bodies import (
    server_check,
    server_exponential,
    server_grant_budget,
    server_joint,
    server_last_guarantee,
    server_limited_domain,
    server_my_budget,
    server_peeling,
    server_release,
    server_release_with_counts,
    server_spent,
)
from frontends.sql.functions import (
    BOOT,
    KEY_PARAMETER,
    RELEASE,
    SCHEMA,
    SQL_FUNCTIONS,
    SUPERSEDED,
    SqlFunction,
    function_sql,
    install_sql_text,
)
from frontends.sql.hiding import (
    HELD_SETTINGS_QUERY,
    NATIVE_FUNCTIONS,
    PINNED_SETTINGS,
    pinned_clauses,
    pinned_settings,
)
from frontends.sql.hiding import install_native as _install_native
from frontends.sql.install import (
    PROJECT_PACKAGES,
    SERVER_DIR,
    Installed,
    InstallError,
    Uninstalled,
    _unreadable,
    default_paths,
    install,
    stage,
    uninstall,
)
from frontends.sql.keys import Keyed
from frontends.sql.ledger import (
    APPLICATION_NAME,
    KEY_BY_OID,
    LEDGER_ROLE_PREFIX,
    LOCK_TIMEOUT,
    ledger_role_name,
    principal_of,
)
from frontends.sql.refusals import (
    FEATURE_NOT_SUPPORTED,
    INVALID,
    LEDGER_REFUSED,
    MAX_RELEASE_K,
    NO_SLOT,
    NULL_ARGUMENT,
    RATE_LIMITED,
    REFUSALS_PER_MINUTE,
    REFUSED,
    UNDEFINED,
    check_release_k,
)
from frontends.sql.sources import register_source, registered_sensitivity

__all__ = [
    "APPLICATION_NAME",
    "BOOT",
    "FEATURE_NOT_SUPPORTED",
    "HELD_SETTINGS_QUERY",
    "INVALID",
    "KEY_BY_OID",
    "KEY_PARAMETER",
    "LEDGER_REFUSED",
    "LEDGER_ROLE_PREFIX",
    "LOCK_TIMEOUT",
    "MAX_RELEASE_K",
    "NATIVE_FUNCTIONS",
    "NO_SLOT",
    "NULL_ARGUMENT",
    "PINNED_SETTINGS",
    "PROJECT_PACKAGES",
    "RATE_LIMITED",
    "REFUSALS_PER_MINUTE",
    "REFUSED",
    "RELEASE",
    "SCHEMA",
    "SERVER_DIR",
    "SQL_FUNCTIONS",
    "SUPERSEDED",
    "UNDEFINED",
    "InstallError",
    "Installed",
    "Keyed",
    "SqlFunction",
    "Uninstalled",
    "_install_native",
    "_unreadable",
    "check_release_k",
    "default_paths",
    "function_sql",
    "install",
    "install_sql_text",
    "ledger_role_name",
    "pinned_clauses",
    "pinned_settings",
    "principal_of",
    "register_source",
    "registered_sensitivity",
    "server_check",
    "server_exponential",
    "server_grant_budget",
    "server_joint",
    "server_last_guarantee",
    "server_limited_domain",
    "server_my_budget",
    "server_peeling",
    "server_release",
    "server_release_with_counts",
    "server_spent",
    "stage",
    "uninstall",
]
