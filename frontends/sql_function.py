"""`topk.private_top_k(...)`: the private top-k as a SQL function inside PostgreSQL (PL/Python).

With it, topk.exponential_mechanism, peeling_top_k, joint_top_k and limited_domain_top_k (the
mechanisms of topk_middleware/mechanisms that fit one table-function call), each charged its
module's own cost through `budget=`; a bottom symbol (limited domain) is a last row with item NULL.

Installed by `topk-middleware install-sql --dsn ...` (`install`), from the SQL in
frontends/sql/install.sql and the function pairs of SQL_FUNCTIONS (`function_sql`). Two
halves live here:

* client side (`install`, `register_source`): create plpython3u and the schema `topk`, record
  where the server's Python finds the project (this checkout, first on sys.path) and its
  dependencies (this virtual environment's site-packages, through site.addsitedir, which honours
  the .pth files of an editable install), check from inside the server that it imports them and
  reaches the ledger, and register tables prepared in live mode (adapters/postgres/live_mode.py).
* server side (`server_*`, called by the PL/Python bodies): the release reads the table through
  SPI (frontends/plpython.py, counted by CountedAccess like every store) in the calling statement's
  snapshot, and charges the caller through a PrivacyLedger whose connection is the server's own
  connection to itself over the local socket (`topk.settings.ledger_dsn`). The charge is
  therefore an autonomous transaction: committed (row lock FOR UPDATE, composition, insert) before
  any row of the table is read, and kept when the caller rolls back; concurrent sessions are
  serialised by the ledger's row lock and never overspend. Only the release (position, item) is
  returned; access counts, method and m go to the ledger's log (topk.topk_ledger_charges). The
  release's guarantee (with the sensitivity it assumes) is kept for the session:
  topk.last_guarantee() returns it.

Against an analyst who watches the server (docs/security.md): every function pins the settings
that would show its internal queries or count its reads (PINNED_SETTINGS); its long loops answer
cancel, statement_timeout and terminate (topk_middleware/interrupts.py, a SPI round trip); a
refusal whose reason is a fact of the data goes to topk.refusals and the analyst gets only its
reference; topk.my_budget() shows a role its own budget.

Who pays: `session_user`, the role that logged in. SET ROLE cannot change it (only a superuser's
SET SESSION AUTHORIZATION can), so a member of several roles cannot draw on several budgets by
switching between them; inside the SECURITY DEFINER function current_user is the owner, so it
could not name the caller anyway. A role without a budget row is refused.

Size: the installer, the registration of tables and the PL/Python entry points share
the schema's names and the ledger connection; the SPI store is plpython.py.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import sysconfig
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from topk_middleware.names import first_line, mask_secrets

SCHEMA = "topk"
SERVER_DIR = "/var/lib/topk_middleware"  # where a copy readable by the server goes (`stage`)
PROJECT_PACKAGES = (
    "topk_middleware",
    "adapters",
    "frontends",
)  # what the server's Python imports of ours
LOCK_TIMEOUT = "10s"  # the ledger connection's wait for a principal's row (an open grant_budget)
APPLICATION_NAME = "topk_middleware ledger"

# The first lines of every PL/Python body: make the project importable, once per session.
BOOT = """if "topk" not in GD:
    import site, sys
    _where = plpy.execute("SELECT project_path, site_packages FROM topk.settings")
    if not len(_where):
        plpy.error("topk: not installed (no row in topk.settings): run topk-middleware install-sql")
    sys.path.insert(0, _where[0]["project_path"])
    site.addsitedir(_where[0]["site_packages"])
    from frontends import sql_function
    GD["topk"] = sql_function"""

# Settings every SQL function pins for its own duration (function-level SET clauses, applied as
# the superuser owner of these SECURITY DEFINER functions), so that an analyst's session settings
# cannot make the server show it the internal queries, their plans or bound values, and so that
# the function's reads stay out of the statistics views any role reads (track_counts off:
# pg_stat_user_tables and pg_stat_xact_user_tables see none of them); with them, the plans of
# its reads (PINNED_PLAN_SETTINGS of adapters/dialects/postgres/oblivious.py: generic plans, no
# parallel workers, one join method and scan kind per query; added by pinned_settings(), which
# imports them only when SQL is written, so that the command line's help stays light), so that they
# follow neither the analyst's settings nor the planner's statistics. Those absent from a server
# (an extension not loaded) are left out at install time (install_sql_text).
PINNED_SETTINGS = (
    ("debug_print_parse", "off"),
    ("debug_print_rewritten", "off"),
    ("debug_print_plan", "off"),
    ("client_min_messages", "error"),
    ("log_min_messages", "warning"),
    ("log_statement", "none"),
    ("log_duration", "off"),
    ("log_min_duration_statement", "-1"),
    ("log_min_duration_sample", "-1"),
    ("log_parser_stats", "off"),
    ("log_planner_stats", "off"),
    ("log_executor_stats", "off"),
    ("log_statement_stats", "off"),
    ("log_parameter_max_length_on_error", "0"),
    ("trace_sort", "off"),
    ("trace_notify", "off"),
    ("track_counts", "off"),
    ("track_io_timing", "off"),
    ("track_functions", "none"),
    ("auto_explain.log_min_duration", "-1"),
    ("pg_stat_statements.track", "none"),
)


def pinned_settings() -> tuple[tuple[str, str], ...]:
    """PINNED_SETTINGS and the pinned plan settings (plan_cache_mode = force_generic_plan and
    jit = off among them)."""
    from adapters.dialects.postgres.oblivious import PINNED_PLAN_SETTINGS

    return (*PINNED_SETTINGS, *PINNED_PLAN_SETTINGS)


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


class InstallError(RuntimeError):
    """install-sql could not complete; the message says what to do."""


@dataclass(frozen=True)
class Installed:
    project_path: str
    site_packages: str
    ledger_dsn: str
    server: str  # what the server's Python reported (versions, where the project came from)
    # the C helpers of the library topk_server in place: refusals without CONTEXT lines, the
    # calls' reads kept out of the caller's EXPLAIN (False: their PL/pgSQL forms, because of
    # `native_why`, the server's words)
    native: bool = False
    native_why: str = ""
    # why the ledger's connection logs in as the installing role, not its own (the server's
    # words); empty when it has its own role, or when --ledger-dsn named one
    ledger_why: str = ""
    # the ledger's connections log in as a superuser (the fallback above, or a --ledger-dsn
    # naming one): they may take the slots PostgreSQL reserves for superusers
    ledger_superuser: bool = False


# ----- client side ------------------------------------------------------------------------------
@dataclass(frozen=True)
class SqlFunction:
    """A function of schema topk, installed as a pair: a PL/Python body `topk.<body>` that calls
    `<server>` of this module, and the plpgsql front `topk.<name>` that administrators grant,
    which turns the project's refusals into plain SQL errors (topk._refuse). Both are
    SECURITY DEFINER, and EXECUTE on both is revoked from PUBLIC. Releases are STABLE: every SPI
    query of a call runs in the calling statement's snapshot, while their writes (the charge, the
    log) go through the ledger's own connection, committed at once."""

    name: str
    body: str
    params: str  # the front's parameters, defaults included
    returns: str
    server: str
    volatility: str = "STABLE"
    comment: str = ""
    public: bool = False  # EXECUTE granted to PUBLIC (what every role may ask about itself)


RELEASE = 'TABLE("position" integer, item text)'
# The last parameter of every release function: a call under a key already answered returns the
# stored rows and charges nothing (release_keys.py; `_keyed`).
KEY_PARAMETER = "release_key text DEFAULT NULL"
SQL_FUNCTIONS = (
    SqlFunction(
        "private_top_k",
        "_release",
        "source regclass, k integer, epsilon double precision, "
        "delta double precision DEFAULT 0, noise text DEFAULT 'gumbel', "
        "oblivious boolean DEFAULT true, " + KEY_PARAMETER,
        RELEASE,
        "server_release",
        comment="Private top-k (Wu, Ohrimenko, Wirth 2023): best first with Gumbel noise, a set "
        "in id order with Laplace; charged to session_user. oblivious (the default): reads and "
        "wall time fixed by m, k, epsilon and delta, guarantee (epsilon, delta + (1 + e^epsilon) "
        "* 1e-9).",
    ),
    SqlFunction(
        "private_top_k_with_counts",
        "_release_with_counts",
        "source regclass, k integer, epsilon double precision, "
        "delta double precision DEFAULT 0, noise text DEFAULT 'gumbel', "
        "counts_share double precision DEFAULT 0.5, oblivious boolean DEFAULT true, "
        + KEY_PARAMETER,
        'TABLE("position" integer, item text, count bigint, count_error bigint)',
        "server_release_with_counts",
        comment="Private top-k with each item's noisy count (exact discrete Laplace noise; "
        "count_error: the half-width of a 95% interval); counts_share of epsilon goes to the "
        "counts; charged to session_user; oblivious reads by default.",
    ),
    SqlFunction(
        "exponential_mechanism",
        "_exponential_mechanism",
        "source regclass, epsilon double precision, oblivious boolean DEFAULT true, "
        + KEY_PARAMETER,
        RELEASE,
        "server_exponential",
        comment="The exponential mechanism (k = 1), charged to session_user; oblivious reads "
        "by default.",
    ),
    SqlFunction(
        "peeling_top_k",
        "_peeling_top_k",
        "source regclass, k integer, epsilon double precision, oblivious boolean DEFAULT true, "
        + KEY_PARAMETER,
        RELEASE,
        "server_peeling",
        comment="Peeling: k exponential mechanisms, best first, charged to session_user.",
    ),
    SqlFunction(
        "joint_top_k",
        "_joint_top_k",
        "source regclass, k integer, epsilon double precision, oblivious boolean DEFAULT true, "
        + KEY_PARAMETER,
        RELEASE,
        "server_joint",
        comment="The joint exponential mechanism: an unordered set, so position is the order of "
        "a fresh random permutation, not a rank.",
    ),
    SqlFunction(
        "limited_domain_top_k",
        "_limited_domain_top_k",
        "source regclass, k integer, k_bar integer, epsilon double precision, "
        "delta double precision, oblivious boolean DEFAULT true, " + KEY_PARAMETER,
        RELEASE,
        "server_limited_domain",
        comment="Limited domain: at most k rows; when fewer than k items beat the threshold, a "
        "last row whose item is NULL stands for the bottom symbol.",
    ),
    SqlFunction(
        "last_guarantee",
        "_last_guarantee",
        "",
        "TABLE(epsilon double precision, delta double precision, noise text, "
        "scale double precision, sensitivity double precision, score_bound double precision, "
        "counts_epsilon double precision, counts_scale double precision, count_error bigint, "
        "guarantee text)",
        "server_last_guarantee",
        volatility="VOLATILE",
        comment="The guarantee of the calling session's last release (no row before one): epsilon, "
        "delta, the noise and its scale, the sensitivity it assumes, the score bound, the "
        "counts' share and interval, and the guarantee in words with its derivation.",
        public=True,
    ),
    SqlFunction(
        "my_budget",
        "_my_budget",
        "",
        "TABLE(epsilon double precision, delta double precision, rule text, releases integer, "
        "epsilon_total double precision, delta_total double precision)",
        "server_my_budget",
        comment="What the calling role (session_user) has spent (composed) and its total.",
        public=True,
    ),
    SqlFunction(
        "grant_budget",
        "_grant_budget",
        "role regrole, epsilon double precision, delta double precision DEFAULT 0",
        "void",
        "server_grant_budget",
        volatility="VOLATILE",
        comment="Set a role's privacy budget (its total); what it has spent is kept.",
    ),
    SqlFunction(
        "spent",
        "_spent",
        "role regrole",
        "TABLE(epsilon double precision, delta double precision, rule text, releases integer, "
        "epsilon_total double precision, delta_total double precision)",
        "server_spent",
        comment="What a role has spent (composed) and its total.",
    ),
)


# Signatures of earlier installs, dropped first: a release function with one parameter fewer
# would make every call that omits `oblivious` ambiguous.
SUPERSEDED = (
    "private_top_k(regclass, integer, double precision, double precision, text)",
    "_release(regclass, integer, double precision, double precision, text)",
    "exponential_mechanism(regclass, double precision)",
    "_exponential_mechanism(regclass, double precision)",
    "peeling_top_k(regclass, integer, double precision)",
    "_peeling_top_k(regclass, integer, double precision)",
    "joint_top_k(regclass, integer, double precision)",
    "_joint_top_k(regclass, integer, double precision)",
    "limited_domain_top_k(regclass, integer, integer, double precision, double precision)",
    "_limited_domain_top_k(regclass, integer, integer, double precision, double precision)",
    "private_top_k_with_counts(regclass, integer, double precision, double precision, text, "
    "double precision)",
    "_release_with_counts(regclass, integer, double precision, double precision, text, "
    "double precision)",
)


def _parameters(params: str) -> tuple[str, str]:
    """(the parameters without their defaults, their names) of a parameter list."""
    if not params.strip():
        return "", ""
    bare = [re.sub(r"\s+DEFAULT\s+.*$", "", p.strip()) for p in params.split(",")]
    return ", ".join(bare), ", ".join(p.split()[0] for p in bare)


# The settings any role may change that move the plans, the memory or the time of a function's
# internal queries, or how their values read back: every one of them is held at the installing
# session's value (`SET name FROM CURRENT`) where pinned_settings() gives it no value, so that an
# analyst's random_page_cost, cpu_*_cost, enable_*, work_mem, DISCARD PLANS (a replan under the
# caller's settings) and the like change nothing inside. temp_buffers is left out (it cannot
# change once a session has used a temporary table); statement_timeout and lock_timeout are the
# caller's (they end its own statement).
HELD_SETTINGS_QUERY = (
    "SELECT name FROM pg_settings WHERE context = 'user' AND name <> 'temp_buffers' AND ("
    "category LIKE 'Query Tuning%' OR category IN ('Resource Usage / Memory', "
    "'Resource Usage / Asynchronous Behavior') OR name IN ('synchronize_seqscans', "
    "'transform_null_equals', 'array_nulls', 'standard_conforming_strings', 'backslash_quote', "
    "'extra_float_digits', 'bytea_output', 'DateStyle', 'IntervalStyle', 'TimeZone', "
    "'row_security'))"
)


def pinned_clauses(available: Collection[str] | None = None, held: Collection[str] = ()) -> str:
    """The SET clauses of pinned_settings() (those in `available`, the server's pg_settings),
    then `SET name FROM CURRENT` for each of `held` (HELD_SETTINGS_QUERY) they leave out."""
    pinned = [(n, v) for n, v in pinned_settings() if available is None or n in available]
    named = {n.lower() for n, _ in pinned}
    return " ".join(
        [f"SET {name} = '{value}'" for name, value in pinned]
        + [f'SET "{name}" FROM CURRENT' for name in sorted(held) if name.lower() not in named]
    )


def _front(f: SqlFunction, params: str, call: str, pins: str, search_path: bool = True) -> str:
    """The plpgsql front: the body's buffer and WAL use kept out of the caller's instrumentation
    (topk._hide_io_begin / _hide_io_end, on the error path too); the project's refusals
    (plpy.Error "topk: ...") raised again as plain SQL errors by topk._refuse (without CONTEXT
    lines); anything else as it came. Both helpers are the library topk_server's where it is
    installed (`install`). Every name in it is qualified or syntax, so it is safe without the
    pinned search_path (`search_path=False`: a text name resolved in the caller's path)."""
    path = "SET search_path = pg_catalog, pg_temp " if search_path else ""
    return f"""
CREATE OR REPLACE FUNCTION topk.{f.name}({params})
RETURNS {f.returns}
LANGUAGE plpgsql {f.volatility} SECURITY DEFINER
{path}{pins}
AS $$
DECLARE
    state pg_catalog.text;
    message pg_catalog.text;
    hint pg_catalog.text;
BEGIN
    PERFORM topk._hide_io_begin();
    {call}
    PERFORM topk._hide_io_end();
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
        hint = PG_EXCEPTION_HINT;
    PERFORM topk._hide_io_end();
    PERFORM topk._refuse(state, message, hint);
    RAISE;  -- not one of ours: as it came
END
$$;
"""


def function_sql(
    f: SqlFunction, available: Collection[str] | None = None, held: Collection[str] = ()
) -> str:
    """The SQL that installs one SqlFunction (body, front, revokes, comment). A function whose
    first parameter is `source regclass` has one front whose `source` is anycompatible: a
    regclass, or a table's name as text (a string literal resolves to text), so that one
    signature, and one GRANT naming the function alone, covers both. The front resolves the
    name inside, in the caller's search_path, as the superuser owner: an analyst without USAGE
    on the table's schema gets the project's refusal, not the cast's "permission denied for
    schema"."""
    bare, args = _parameters(f.params)
    pins = pinned_clauses(available, held)

    def call(arguments: str) -> str:
        return (
            f"PERFORM topk.{f.body}({arguments});"
            if f.returns == "void"
            else f"RETURN QUERY SELECT * FROM topk.{f.body}({arguments});"
        )

    comment = f.comment.replace("'", "''")
    text = f"""
CREATE OR REPLACE FUNCTION topk.{f.body}({bare})
RETURNS {f.returns}
LANGUAGE plpython3u {f.volatility} SECURITY DEFINER
SET search_path = pg_catalog, pg_temp {pins}
AS $$
{BOOT}
return GD["topk"].{f.server}(plpy, GD{", " if args else ""}{args})
$$;
"""
    front_params, front_bare, front_call = f.params, bare, call(args)
    if f.params.startswith("source regclass"):
        front_params = f.params.replace("source regclass", "source anycompatible", 1)
        front_bare, _ = _parameters(front_params)
        front_call = call(
            args.replace(
                "source",
                "CASE WHEN source IS NULL THEN NULL ELSE coalesce(pg_catalog.to_regclass("
                "source::pg_catalog.text), 0::pg_catalog.regclass) END",
                1,
            )
        )
    # The name is resolved in the caller's search_path (no search_path clause on a front taking
    # a source: every name in it is qualified or syntax).
    text += _front(f, front_params, front_call, pins, search_path=front_bare == bare)
    text += (
        f"REVOKE EXECUTE ON FUNCTION topk.{f.body}({bare}), topk.{f.name}({front_bare}) "
        "FROM PUBLIC;\n"
        f"COMMENT ON FUNCTION topk.{f.name}({front_bare}) IS '{comment}';\n"
    )
    if f.public:
        text += f"GRANT EXECUTE ON FUNCTION topk.{f.name}({front_bare}) TO PUBLIC;\n"
    return text


def install_sql_text(available: Collection[str] | None = None, held: Collection[str] = ()) -> str:
    """install.sql (schema, tables, helpers) followed by every SqlFunction; `available` the
    server's setting names (pg_settings), which pinned_settings() are filtered by; `held` those
    kept at the installing session's value (HELD_SETTINGS_QUERY)."""
    static = (
        resources.files("frontends")
        .joinpath("sql/install.sql")
        .read_text(encoding="utf-8")
        .replace("{BOOT}", BOOT)
    )
    # each superseded front also had a twin taking the table's name as text; and the current
    # functions' fronts took a regclass and, in a twin, a text before their source became
    # anycompatible (one signature for both)
    current = [
        f"{f.name}({_parameters(f.params)[0]})"
        for f in SQL_FUNCTIONS
        if f.params.startswith("source regclass")
    ]
    superseded = [
        *SUPERSEDED,
        *(f.replace("(regclass", "(text", 1) for f in SUPERSEDED),
        *current,
        *(f.replace("(regclass", "(text", 1) for f in current),
        *_keyless(),
    ]
    drops = "".join(f"\nDROP FUNCTION IF EXISTS {SCHEMA}.{f};" for f in dict.fromkeys(superseded))
    functions = "".join(function_sql(f, available, held) for f in SQL_FUNCTIONS)
    return static + _KEEP_GRANTS + drops + functions + _GRANT_AGAIN


def _keyless() -> list[str]:
    """The release functions' signatures before KEY_PARAMETER (body: regclass; front:
    anycompatible), dropped by an install over them."""
    found = []
    for f in SQL_FUNCTIONS:
        if f.params.endswith(", " + KEY_PARAMETER):
            bare = _parameters(f.params.removesuffix(", " + KEY_PARAMETER))[0]
            found += [
                f"{f.body}({bare})",
                f"{f.name}({bare.replace('regclass', 'anycompatible', 1)})",
            ]
    return found


# An install that drops a front of an earlier signature (`superseded`) would drop the EXECUTE
# grants administrators gave on it: they are noted first and given again, by name, on the
# function of that name once it is made (one signature per name).
_KEEP_GRANTS = f"""
DROP TABLE IF EXISTS pg_temp.topk_kept_grants;
CREATE TEMP TABLE topk_kept_grants AS
SELECT DISTINCT p.proname::text AS name, a.grantee::regrole::text AS grantee
FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace, aclexplode(p.proacl) AS a
WHERE n.nspname = '{SCHEMA}' AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0
AND a.grantee <> p.proowner;
"""
_GRANT_AGAIN = f"""
DO $$
DECLARE
    kept record;
BEGIN
    FOR kept IN SELECT g.name, g.grantee FROM pg_temp.topk_kept_grants AS g
        WHERE (SELECT count(*) FROM pg_proc AS p WHERE p.proname = g.name
               AND p.pronamespace = '{SCHEMA}'::regnamespace) = 1
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION {SCHEMA}.%I TO %s', kept.name, kept.grantee);
    END LOOP;
END
$$;
DROP TABLE pg_temp.topk_kept_grants;
"""


def default_paths() -> tuple[str, str]:
    """(the directory holding this topk_middleware package, this interpreter's site-packages)."""
    project = Path(__file__).resolve().parent.parent
    return str(project), sysconfig.get_paths()["purelib"]


def _unreadable(path: str) -> str | None:
    """The first directory on `path` that other users (the server's OS user) cannot enter or
    read, judged from the permission bits (the server's own import is the final word)."""
    current = Path("/")
    for part in Path(path).resolve().parts[1:]:
        current = current / part
        try:
            mode = current.stat().st_mode
        except OSError:
            return str(current)
        if not mode & 0o001 or (current == Path(path).resolve() and not mode & 0o004):
            return str(current)
    return None


def _link_tree(source: Path, target: Path) -> None:
    """Copy a directory tree as hard links where the filesystem allows (instant, no space),
    else as a copy; directories are made readable by every user."""

    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, symlinks=True, copy_function=link_or_copy)
    for root, dirs, _files in os.walk(target):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
    os.chmod(target, 0o755)


def stage(
    project_path: str, site_packages: str, database: str = "", server_dir: str = SERVER_DIR
) -> tuple[str, str]:
    """A copy of the project's packages and of the site-packages that the server's OS user can
    read, under `server_dir`, for a checkout it cannot enter (a clone in a private home
    directory). One copy per (checkout, site-packages, database): `database` names the database
    it is installed into (`_database_key`), so that `uninstall` of one database removes the copy
    no other database records. Made afresh at each install; returns (project path,
    site-packages) to record."""
    key = hashlib.sha256(f"{project_path}\0{site_packages}\0{database}".encode()).hexdigest()
    root = Path(server_dir) / key[:16]
    try:
        if root.exists():
            shutil.rmtree(root)
        (root / "project").mkdir(parents=True)
        for package in PROJECT_PACKAGES:
            shutil.copytree(
                Path(project_path) / package,
                root / "project" / package,
                ignore=shutil.ignore_patterns("__pycache__"),
            )
        _link_tree(Path(site_packages), root / "site-packages")
        for path in (Path(server_dir), root, root / "project"):
            os.chmod(path, 0o755)
        for dirpath, dirs, files in os.walk(root / "project"):
            for name in dirs:
                os.chmod(os.path.join(dirpath, name), 0o755)
            for name in files:
                os.chmod(os.path.join(dirpath, name), 0o644)
    except OSError as error:
        raise InstallError(
            f"the server's OS user cannot read {project_path} or {site_packages}, and a readable "
            f"copy could not be made under {server_dir}: {error} (run install-sql as root, or "
            "chmod o+rx the checkout's directories)"
        ) from None
    return str(root / "project"), str(root / "site-packages")


def _connect_admin(dsn: str) -> Any:
    """An autocommit connection for install / uninstall, or InstallError in the project's words."""
    import psycopg

    try:
        return psycopg.connect(dsn, autocommit=True)
    except psycopg.Error as error:
        raise InstallError(
            f"cannot connect to {mask_secrets(repr(dsn))}: {first_line(error)}"
        ) from None


def _database_key(conn: Any) -> str:
    """What tells this database apart from every other one the staged copies may serve: the
    cluster's system identifier (superusers read it) or else its port, and the database's name."""
    import psycopg

    try:
        with conn.transaction():
            cluster = conn.execute("SELECT system_identifier FROM pg_control_system()").fetchone()
    except psycopg.Error:
        cluster = conn.execute("SELECT current_setting('port')").fetchone()
    name = conn.execute("SELECT current_database()").fetchone()[0]
    return f"{cluster[0]}/{name}"


def install(
    dsn: str,
    ledger_dsn: str | None = None,
    project_path: str | None = None,
    site_packages: str | None = None,
) -> Installed:
    """Install the schema `topk` into the database of `dsn` (a superuser), idempotently. Run it
    on the database server's machine: the paths it records are read by the server's Python.
    A checkout or virtual environment that other users cannot read (a private home directory)
    is staged first: a readable copy under SERVER_DIR is recorded instead (`stage`). The
    ledger's connection logs in as a role of its own (`_make_ledger_role`) unless `ledger_dsn`
    names one, or the server refuses that role a login (then as the installing role)."""
    import psycopg
    from psycopg import sql

    default_project, default_site = default_paths()
    project_path = project_path or default_project
    site_packages = site_packages or default_site
    conn = _connect_admin(dsn)
    with conn:
        if _unreadable(project_path) or _unreadable(site_packages):
            project_path, site_packages = stage(project_path, site_packages, _database_key(conn))
        available = conn.execute(
            "SELECT count(*) FROM pg_available_extensions WHERE name = 'plpython3u'"
        ).fetchone()[0]
        if not available:
            raise InstallError(
                "the server has no PL/Python (plpython3u): install the Debian package "
                "postgresql-plpython3-<major> (scripts/ensure-server-side.sh does it, as root)"
            )
        ledger_role = installer_dsn = None
        if ledger_dsn is None:
            socket, port, database, user = conn.execute(
                "SELECT split_part(current_setting('unix_socket_directories'), ',', 1), "
                "current_setting('port'), current_database(), current_user"
            ).fetchone()
            ledger_role = ledger_role_name(_database_key(conn))
            installer_dsn, ledger_dsn = (
                psycopg.conninfo.make_conninfo(
                    host=socket.strip(), port=port, dbname=database, user=who
                )
                for who in (user, ledger_role)
            )
        earlier = _recorded_project(conn)
        try:
            with conn.transaction():
                settings = {r[0] for r in conn.execute("SELECT name FROM pg_settings")}
                held = {r[0] for r in conn.execute(HELD_SETTINGS_QUERY)}
                conn.execute(install_sql_text(settings, held))
                native, native_why = _install_native(conn)
                if ledger_role is not None:
                    _make_ledger_role(conn, ledger_role)
                conn.execute(
                    "INSERT INTO topk.settings (project_path, site_packages, ledger_dsn) "
                    "VALUES (%s, %s, %s) ON CONFLICT (singleton) DO UPDATE SET "
                    "project_path = excluded.project_path, site_packages = "
                    "excluded.site_packages, ledger_dsn = excluded.ledger_dsn",
                    [project_path, site_packages, ledger_dsn],
                )
        except psycopg.errors.InsufficientPrivilege as error:
            raise InstallError(
                f"install-sql needs a superuser (plpython3u is untrusted): {first_line(error)}"
            ) from None
        ledger_why = ""
        try:
            try:
                server = conn.execute("SELECT topk._check()").fetchone()[0]
            except psycopg.Error as error:
                if installer_dsn is None:
                    raise
                # the server would not let the ledger's role in (peer authentication, say):
                # the installing role's connection instead, which install-sql reports
                ledger_why, ledger_dsn = first_line(error), installer_dsn
                conn.execute("UPDATE topk.settings SET ledger_dsn = %s", [ledger_dsn])
                server = conn.execute("SELECT topk._check()").fetchone()[0]
            if ledger_role is not None:
                conn.execute(
                    sql.SQL("REVOKE CREATE ON SCHEMA topk FROM {}").format(
                        sql.Identifier(ledger_role)
                    )
                )
            conn.execute(KEY_BY_OID)
            ledger_user = psycopg.conninfo.conninfo_to_dict(ledger_dsn).get("user")
            superuser = conn.execute(
                "SELECT coalesce(bool_or(rolsuper), false) FROM pg_roles WHERE rolname = %s",
                [ledger_user or ""],
            ).fetchone()[0]
        except psycopg.Error as error:
            blocked = [b for b in map(_unreadable, (project_path, site_packages)) if b]
            why = (
                f"; {blocked[0]} is not readable by other users such as the server's OS user "
                "(chmod o+rx it, or install the project elsewhere)"
                if blocked
                else ""
            )
            raise InstallError(
                f"the server's Python cannot run the project: {first_line(error)} (project "
                f"{project_path}, site-packages {site_packages}, ledger "
                f"{mask_secrets(repr(ledger_dsn))}){why}"
            ) from None
    if earlier is not None and earlier != project_path:
        _remove_staged(earlier)  # the staged copy the settings named before this install
    return Installed(
        project_path, site_packages, ledger_dsn, server, native, native_why, ledger_why, superuser
    )


LEDGER_ROLE_PREFIX = "topk_ledger_"


def _drop_ledger_role(conn: Any, role: str) -> None:
    """Drop the ledger's role of this database (`_make_ledger_role`), its sessions ended first;
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


def ledger_role_name(database_key: str) -> str:
    """The role the ledger's connections log in as, one per database (`_database_key`)."""
    return LEDGER_ROLE_PREFIX + hashlib.sha256(database_key.encode()).hexdigest()[:12]


def _make_ledger_role(conn: Any, role: str) -> None:
    """The ledger's own role: LOGIN, no superuser, so that its connections (one per session
    that calls a function) never take the slots PostgreSQL reserves for superusers
    (superuser_reserved_connections) and a role that can connect cannot lock the superuser out.
    It owns the ledger's tables (created by its first connection: CREATE on schema topk until
    install-sql has checked it, then revoked) and may write topk.refusals; nothing else."""
    from psycopg import sql

    name = sql.Identifier(role)
    exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone()
    if not exists:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOINHERIT").format(name))
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


# The C helpers of the library topk_server (frontends/sql/server/topk_server.c):
# (signature, C symbol).
NATIVE_FUNCTIONS = (
    ("_refuse(state text, message text, hint text)", "topk_refuse"),
    ("_hide_io_begin()", "topk_hide_io_begin"),
    ("_hide_io_end()", "topk_hide_io_end"),
)


def _install_native(conn: Any) -> tuple[bool, str]:
    """Replace the PL/pgSQL forms of install.sql (topk._refuse, _hide_io_begin, _hide_io_end)
    with the C forms of the library topk_server (built by scripts/ensure-server-side.sh), all or
    none: (True, "") where it did, else (False, why: the server's words, e.g. no such file, or a
    library built for another major version)."""
    import psycopg

    try:
        with conn.transaction():
            for signature, symbol in NATIVE_FUNCTIONS:
                conn.execute(
                    f"CREATE OR REPLACE FUNCTION topk.{signature} RETURNS void LANGUAGE c "
                    f"VOLATILE AS '$libdir/topk_server', '{symbol}'"
                )
                bare = re.sub(r"\b(state|message|hint) ", "", signature)
                conn.execute(f"REVOKE EXECUTE ON FUNCTION topk.{bare} FROM PUBLIC")
    except psycopg.Error as error:  # the savepoint rolled back: the PL/pgSQL forms stay
        return False, first_line(error)
    return True, ""


def _recorded_project(conn: Any) -> str | None:
    """The project path topk.settings records (None: not installed)."""
    found = conn.execute("SELECT to_regclass('topk.settings') IS NOT NULL").fetchone()[0]
    if not found:
        return None
    row = conn.execute("SELECT project_path FROM topk.settings").fetchone()
    return None if row is None else str(row[0])


def _remove_staged(project_path: str, server_dir: str = SERVER_DIR) -> str | None:
    """Remove the staged copy `project_path` lies in (`stage`: <server_dir>/<key>/project), if it
    is one; what was removed. Anything else (a checkout) is left alone."""
    path = Path(project_path)
    root = path.parent
    if path.name != "project" or root.parent != Path(server_dir) or not root.is_dir():
        return None
    shutil.rmtree(root, ignore_errors=True)
    return str(root)


@dataclass(frozen=True)
class Uninstalled:
    schema_dropped: bool
    staged_copy: str | None  # the staged copy removed, if the database used one
    sources: tuple[str, ...]  # the tables that were registered (their live structures remain)
    charges: int  # the ledger's charges dropped with the schema


def uninstall(dsn: str, drop_ledger: bool = False) -> Uninstalled:
    """Remove what `install` made in the database of `dsn` (a superuser): the schema `topk` with
    its functions, registrations, refusals log and budget ledger, and the staged copy of the
    project the database recorded (under SERVER_DIR), if any. The extension plpython3u stays
    (other functions may use it), and so do the live-mode structures of registered tables
    (`topk-middleware unprepare URL --table TABLE --mode live` removes them). A ledger holding
    charges is the record of what every role has spent: it is dropped only with `drop_ledger`."""
    import psycopg

    with _connect_admin(dsn) as conn:
        project = _recorded_project(conn)
        exists = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", [SCHEMA]
        ).fetchone()[0]
        if not exists:
            return Uninstalled(False, None, (), 0)
        sources: tuple[str, ...] = ()
        if conn.execute("SELECT to_regclass('topk.sources') IS NOT NULL").fetchone()[0]:
            sources = tuple(r[0] for r in conn.execute("SELECT source::text FROM topk.sources"))
        charges = 0
        if conn.execute(
            f"SELECT to_regclass('{SCHEMA}.topk_ledger_charges') IS NOT NULL"
        ).fetchone()[0]:
            charges = conn.execute(f"SELECT count(*) FROM {SCHEMA}.topk_ledger_charges").fetchone()[
                0
            ]
        if charges and not drop_ledger:
            raise InstallError(
                f"the budget ledger in schema {SCHEMA} holds {charges} charge(s), the record of "
                "what each role has spent; nothing was removed (pass --drop-ledger to drop it "
                "with the schema)"
            )
        ledger_user = None
        if conn.execute("SELECT to_regclass('topk.settings') IS NOT NULL").fetchone()[0]:
            row = conn.execute("SELECT ledger_dsn FROM topk.settings").fetchone()
            if row is not None:
                ledger_user = psycopg.conninfo.conninfo_to_dict(row[0]).get("user")
        try:
            conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")
        except psycopg.errors.InsufficientPrivilege as error:
            raise InstallError(
                f"uninstall-sql needs the owner of schema {SCHEMA} (a superuser): "
                f"{first_line(error)}"
            ) from None
        if ledger_user and ledger_user.startswith(LEDGER_ROLE_PREFIX):
            _drop_ledger_role(conn, ledger_user)
    staged = _remove_staged(project) if project is not None else None
    return Uninstalled(True, staged, sources, int(charges))


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
    """Prepare `table` in live mode (adapters/postgres/live_mode.py: its B-trees, position table and
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


# ----- server side (called from the PL/Python bodies; `plpy` and `GD` are theirs) --------------
def _ledger(plpy: Any, GD: dict[str, Any]) -> Any:
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
        with _ledger_reachable(plpy):
            ledger = GD["topk_ledger"] = PrivacyLedger(engine)
    return ledger


@contextmanager
def _ledger_reachable(plpy: Any) -> Iterator[None]:
    """A ledger connection the server refuses (no free slot: an analyst holding every slot open
    to non-superusers; or authentication) becomes a refusal in the project's words with the
    server's reason, never the driver's message, the DSN or a traceback; nothing was charged."""
    import sqlalchemy as sa

    try:
        yield
    except sa.exc.DBAPIError as error:
        text = str(error.orig)
        if not text.startswith("connection failed"):
            raise
        reason = text.rsplit("FATAL:", 1)[-1].strip().splitlines()[0] if "FATAL:" in text else ""
        full = "too many clients" in reason or "slots are reserved" in reason
        _refuse(
            plpy,
            "the budget ledger could not open its connection to this server"
            + (f" ({reason})" if reason else "")
            + "; nothing was read, released or charged",
            NO_SLOT if full else LEDGER_REFUSED,
            hint="every connection slot open to roles other than superusers is taken: try "
            "again later (an administrator may raise max_connections)"
            if full
            else "an administrator reads the server's log",
        )


def _refuse(plpy: Any, message: str, sqlstate: str, hint: str | None = None) -> None:
    extra = {"hint": hint} if hint else {}
    plpy.error(f"topk: {message}", sqlstate=sqlstate, **extra)


def _registration(plpy: Any, GD: dict[str, Any], source: str) -> dict[str, Any]:
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
        _refuse(
            plpy,
            f"table {source} is not registered for private top-k, or this role may not name "
            "it (USAGE on its schema) or release from it (topk.grant_source)",
            UNDEFINED,
            hint="an administrator registers it (topk-middleware install-sql --dsn ... "
            "--source <table> --id <id column> --score <score column>) and grants it: "
            "SELECT topk.grant_source('<table>', '<role>')",
        )
    if rows[0]["row_security"]:
        _refuse(
            plpy,
            f"table {rows[0]['relation']} has row-level security: a release reads every row as "
            "the functions' owner and would not honour its policies; nothing was read or charged",
            FEATURE_NOT_SUPPORTED,
            hint="release from a table (or a copy) without row-level security, holding only "
            "the rows every analyst it is granted to may count",
        )
    return rows[0]


def _spi_table(plpy: Any, GD: dict[str, Any], found: dict[str, Any]) -> Any:
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


_REGISTER_AGAIN = (
    "the sensitivity is set when the table is registered: an administrator registers it "
    "again, topk-middleware install-sql --dsn ... --source <table> --sensitivity N"
)


def _no_nulls(plpy: Any, **arguments: Any) -> None:
    for name, value in arguments.items():
        if value is None:
            _refuse(plpy, f"{name} must not be NULL", NULL_ARGUMENT)


def _checked(plpy: Any, check: Callable[..., None], *arguments: Any) -> None:
    """Run a mechanism's own argument check; its refusal as invalid_parameter_value."""
    try:
        check(*arguments)
    except (TypeError, ValueError) as error:
        _refuse(plpy, str(error), INVALID)


def _not_oblivious(plpy: Any, mechanism: str, oblivious: Any) -> None:
    """Refuse a mechanism that cannot be made oblivious (mechanisms/oblivious.py) under the
    functions' oblivious default, before anything is read or charged."""
    if oblivious:
        _refuse(
            plpy,
            f"{mechanism} cannot run obliviously: which rows and how many it reads depend on "
            "the counts, and anyone who can watch the server could see them; nothing was read "
            "or charged",
            INVALID,
            hint="pass oblivious => false to accept that, or use topk.private_top_k",
        )


def _no_predicate_locks(plpy: Any, GD: dict[str, Any]) -> None:
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
        _refuse(
            plpy,
            "a release does not run inside a SERIALIZABLE transaction: its reads would leave "
            "predicate locks that every role sees in pg_locks; nothing was read or charged",
            FEATURE_NOT_SUPPORTED,
            hint="call it in a READ COMMITTED or REPEATABLE READ transaction",
        )


@dataclass(frozen=True)
class Keyed:
    """A release under an analyst's key: the SQL function's name and its arguments (with the
    table, by OID: what "the same parameters" means for a key)."""

    key: str | None
    function: str
    arguments: dict[str, Any]


def _check_key(release_key: Any) -> None:
    """A release key: NULL (none) or release_keys.check_release_key's string."""
    from topk_middleware.release_keys import check_release_key

    if release_key is not None:
        check_release_key(release_key)


def _keyed(keyed: Keyed, relation_oid: int, run: Callable[..., Any]) -> Callable[[Any, Any], Any]:
    """`run(table, budget, seed)` as a release of `keyed` (release_keys.keyed_release, under the
    role's principal): a key already answered returns its stored release, charging nothing; a
    key charged with other arguments is refused (ReleaseKeyConflict) before anything is read or
    charged; the noise comes from the secret the ledger keeps with the key."""
    from topk_middleware.release_keys import keyed_release

    if keyed.key is None:
        return lambda table, budget: run(table, budget, None)
    arguments = {**keyed.arguments, "source": relation_oid}
    return lambda table, budget: keyed_release(
        budget,
        keyed.key,
        keyed.function,
        table,
        arguments,
        lambda rng, keyed_budget: run(table, keyed_budget, rng),
    )


def _charged_release(
    plpy: Any,
    GD: dict[str, Any],
    source: Any,
    run: Callable[[Any, Any, Any], Any],
    keyed: Keyed,
    with_counts: bool = False,
) -> list[tuple[Any, ...]]:
    """The common half of every release function: the source's registration, then `run(table,
    budget, seed)` (a mechanism given the SPI source and session_user's LedgerBudget as
    `budget=`: it charges the ledger before reading any row, and logs its diagnostics there;
    under a key, `_keyed`), its refusals in the project's words; the rows (position, item) of
    the release. Neither the key nor its noise secret is in any statement's text (the ledger's
    statements bind them as parameters) or in any message."""
    import sqlalchemy as sa

    from topk_middleware.accounting import BudgetExceeded
    from topk_middleware.interrupts import checking
    from topk_middleware.ledger import LedgerBudget
    from topk_middleware.privacy import SensitivityError
    from topk_middleware.release_keys import ReleaseKeyConflict

    _no_predicate_locks(plpy, GD)
    found = _registration(plpy, GD, source)
    ledger = _ledger(plpy, GD)
    role, principal = found["role"], principal_of(found["role_oid"])
    _not_refused_too_often(plpy, ledger, role)
    try:
        table = _spi_table(plpy, GD, found)
    except SensitivityError as error:  # a fact of the registration, not of the counts
        _refuse(plpy, str(error), INVALID, hint=_REGISTER_AGAIN)
    budget = LedgerBudget(ledger, principal, math.nan, math.nan)  # totals: the ledger's row
    release_run = _keyed(keyed, found["relation_oid"], run)
    ping = GD.get("topk_ping")
    if ping is None:
        ping = GD["topk_ping"] = plpy.prepare("SELECT 1")
    try:
        # The core's long loops call interrupts.check(); a server round trip there lets the
        # server raise a pending cancel, statement_timeout or terminate (PL/Python does not).
        with checking(lambda: plpy.execute(ping)):
            try:
                result = release_run(table, budget)
            except sa.exc.DBAPIError as error:
                if not error.connection_invalidated:
                    raise
                # The ledger's connection had died (idle too long, server restart): once more
                # on a new one. Had the lost charge committed, it stays charged (never
                # undercounted); under a key, it is not charged again.
                with _ledger_reachable(plpy):
                    result = release_run(table, budget)
    except KeyError as error:
        if "has no budget" not in str(error):
            raise
        _refuse(
            plpy,
            f"role {role} has no privacy budget; nothing was read or released",
            REFUSED,
            hint="an administrator grants one: SELECT topk.grant_budget('<role>', epsilon, delta)",
        )
    except BudgetExceeded as error:
        if "epsilon = inf" in str(error) and _without_delta(ledger, principal):
            _refuse(
                plpy,
                f"role {role}: this release spends a delta (an oblivious release, the default, "
                "spends (1 + e^epsilon) * 1e-9 of it), and the role's budget has delta 0; "
                "nothing was read or charged",
                REFUSED,
                hint="an administrator grants a delta: SELECT topk.grant_budget('<role>', "
                "epsilon, 1e-6); or call it with oblivious => false",
            )
        _refuse(plpy, f"role {role}: {error}", REFUSED)
    except SensitivityError as error:  # the registration's sensitivity: not a fact of the data
        _refuse(plpy, str(error), INVALID, hint=_REGISTER_AGAIN)
    except ReleaseKeyConflict:  # the call's own arguments against the key's: not of the data
        _refuse(
            plpy,
            f"role {role} has used this release key for a release with other arguments (the "
            "function, the table, k, epsilon or an option differs); nothing was read, charged "
            "or released",
            INVALID,
            hint="a retried job passes the same arguments; a new question takes a new key",
        )
    except ValueError as error:  # k > m, an empty table, bad scores: facts of the data
        charged = getattr(budget._pending, "seq", None) is not None
        reference = _log_refusal(ledger, role, found["relation"], str(error))
        _refuse(
            plpy,
            f"the release was refused for a reason in the table's data, which only an "
            f"administrator may see (reference {reference}); "
            + ("the budget was charged" if charged else "nothing was charged, read or released"),
            INVALID,
            hint=f"an administrator reads it: SELECT * FROM topk.refusals WHERE reference = "
            f"'{reference}'",
        )
    except Exception as error:
        if _is_lock_timeout(error):
            _refuse(
                plpy,
                f"the ledger row of role {role} stayed locked for {LOCK_TIMEOUT} (an "
                "uncommitted topk.grant_budget?); nothing was read or released",
                "55P03",
            )
        raise
    release = result.release()
    GD["topk_last_guarantee"] = _guarantee_row(release)  # topk.last_guarantee()
    if with_counts:  # (position, item, count, count_error): noisy counts beside the items
        counts = release.counts or ()
        return [
            (position, str(item), int(count), release.count_error)
            for position, (item, count) in enumerate(zip(release.items, counts, strict=True), 1)
        ]
    rows: list[tuple[Any, ...]] = [
        (position, str(item)) for position, item in enumerate(release.items, 1)
    ]
    if release.bottom:  # limited domain: fewer than k items beat the threshold
        rows.append((len(rows) + 1, None))
    return rows


def _without_delta(ledger: Any, principal: str) -> bool:
    """Whether the role's budget was granted with delta 0 (so no release spending delta fits)."""
    try:
        return ledger.total(principal)[1] == 0.0
    except KeyError:
        return False


def check_release_k(k: int) -> None:
    """Refuse k above MAX_RELEASE_K (the request's own argument: a public refusal)."""
    if k > MAX_RELEASE_K:
        raise ValueError(
            f"k = {k} is more than the {MAX_RELEASE_K:,} items a release of the SQL functions takes"
        )


def server_release(
    plpy: Any,
    GD: dict[str, Any],
    source: Any,
    k: Any,
    epsilon: Any,
    delta: Any,
    noise: Any,
    oblivious: Any = True,
    release_key: Any = None,
) -> list[tuple[int, str | None]]:
    """topk.private_top_k: check, charge session_user, release; the rows (position, item).
    `oblivious` (default true): reads and wall time fixed by public facts
    (mechanisms/oblivious.py), charged oblivious_cost. `release_key`: `_keyed`."""
    from topk_middleware.api import NOISES, private_top_k
    from topk_middleware.validation import check_common

    _no_nulls(
        plpy, source=source, k=k, epsilon=epsilon, delta=delta, noise=noise, oblivious=oblivious
    )

    def check() -> None:
        check_common(k, epsilon, delta)
        check_release_k(k)
        if noise not in NOISES:
            raise ValueError(f"noise must be one of {', '.join(NOISES)}, got {noise!r}")
        _check_key(release_key)

    _checked(plpy, check)
    arguments = {"k": k, "epsilon": epsilon, "delta": delta, "noise": noise}
    return _charged_release(
        plpy,
        GD,
        source,
        lambda table, budget, seed: private_top_k(
            table,
            k,
            epsilon,
            delta,
            noise,
            seed=seed,
            budget=budget,
            oblivious=bool(oblivious),
            deadline=table.deadline if oblivious else None,
        ),
        Keyed(release_key, "private_top_k", {**arguments, "oblivious": bool(oblivious)}),
    )


def server_release_with_counts(
    plpy: Any,
    GD: dict[str, Any],
    source: Any,
    k: Any,
    epsilon: Any,
    delta: Any,
    noise: Any,
    counts_share: Any,
    oblivious: Any = True,
    release_key: Any = None,
) -> list[tuple[Any, ...]]:
    """topk.private_top_k_with_counts: topk.private_top_k plus each item's noisy count and the
    95% half-width (private_top_k(..., with_counts=True))."""
    from topk_middleware.api import NOISES, private_top_k
    from topk_middleware.noisy_counts import check_counts_share
    from topk_middleware.validation import check_common

    _no_nulls(plpy, source=source, k=k, epsilon=epsilon, delta=delta, noise=noise)
    _no_nulls(plpy, counts_share=counts_share, oblivious=oblivious)

    def check() -> None:
        check_common(k, epsilon, delta)
        check_release_k(k)
        check_counts_share(counts_share)
        if noise not in NOISES:
            raise ValueError(f"noise must be one of {', '.join(NOISES)}, got {noise!r}")
        _check_key(release_key)

    _checked(plpy, check)
    arguments = {"k": k, "epsilon": epsilon, "delta": delta, "noise": noise}
    return _charged_release(
        plpy,
        GD,
        source,
        lambda table, budget, seed: private_top_k(
            table,
            k,
            epsilon,
            delta,
            noise,
            seed=seed,
            budget=budget,
            with_counts=True,
            counts_share=counts_share,
            oblivious=bool(oblivious),
            deadline=table.deadline if oblivious else None,
        ),
        Keyed(
            release_key,
            "private_top_k_with_counts",
            {**arguments, "counts_share": counts_share, "oblivious": bool(oblivious)},
        ),
        with_counts=True,
    )


def server_exponential(
    plpy: Any,
    GD: dict[str, Any],
    source: Any,
    epsilon: Any,
    oblivious: Any = True,
    release_key: Any = None,
) -> list[tuple[int, str | None]]:
    """topk.exponential_mechanism: one item, P(i) ~ exp(epsilon h_i) (mechanisms/exponential.py;
    charged accounting.oneshot_cost("gumbel", 1, m, epsilon), as its `budget=` does)."""
    from topk_middleware.mechanisms.exponential import exponential_mechanism
    from topk_middleware.validation import check_common

    _no_nulls(plpy, source=source, epsilon=epsilon, oblivious=oblivious)
    _checked(plpy, check_common, 1, epsilon, 0.0)
    _checked(plpy, _check_key, release_key)
    return _charged_release(
        plpy,
        GD,
        source,
        lambda table, budget, seed: exponential_mechanism(
            table,
            epsilon,
            seed=seed,
            budget=budget,
            oblivious=bool(oblivious),
            deadline=table.deadline if oblivious else None,
        ),
        Keyed(
            release_key,
            "exponential_mechanism",
            {"epsilon": epsilon, "oblivious": bool(oblivious)},
        ),
    )


def server_peeling(
    plpy: Any,
    GD: dict[str, Any],
    source: Any,
    k: Any,
    epsilon: Any,
    oblivious: Any = True,
    release_key: Any = None,
) -> list[tuple[int, str | None]]:
    """topk.peeling_top_k: k exponential-mechanism steps of epsilon/k (mechanisms/peeling.py;
    charged peeling_cost(k, epsilon))."""
    from topk_middleware.mechanisms.peeling import peeling_top_k
    from topk_middleware.validation import check_common

    _no_nulls(plpy, source=source, k=k, epsilon=epsilon, oblivious=oblivious)
    _checked(plpy, check_common, k, epsilon, 0.0)
    _checked(plpy, _check_key, release_key)
    _not_oblivious(plpy, "peeling", oblivious)
    return _charged_release(
        plpy,
        GD,
        source,
        lambda table, budget, seed: peeling_top_k(table, k, epsilon, seed=seed, budget=budget),
        Keyed(release_key, "peeling_top_k", {"k": k, "epsilon": epsilon}),
    )


def server_joint(
    plpy: Any,
    GD: dict[str, Any],
    source: Any,
    k: Any,
    epsilon: Any,
    oblivious: Any = True,
    release_key: Any = None,
) -> list[tuple[int, str | None]]:
    """topk.joint_top_k: a k-set from the joint exponential mechanism, in random order
    (mechanisms/joint.py; charged joint_cost(epsilon))."""
    from topk_middleware.mechanisms.joint import check_joint_size, joint_top_k
    from topk_middleware.validation import check_common

    _no_nulls(plpy, source=source, k=k, epsilon=epsilon, oblivious=oblivious)
    _checked(plpy, check_common, k, epsilon, 0.0)
    _checked(plpy, _check_key, release_key)
    _not_oblivious(plpy, "joint", oblivious)
    _checked(plpy, check_joint_size, k)  # work known to be excessive, before anything
    return _charged_release(
        plpy,
        GD,
        source,
        lambda table, budget, seed: joint_top_k(table, k, epsilon, seed=seed, budget=budget),
        Keyed(release_key, "joint_top_k", {"k": k, "epsilon": epsilon}),
    )


def server_limited_domain(
    plpy: Any,
    GD: dict[str, Any],
    source: Any,
    k: Any,
    k_bar: Any,
    epsilon: Any,
    delta: Any,
    oblivious: Any = True,
    release_key: Any = None,
) -> list[tuple[int, str | None]]:
    """topk.limited_domain_top_k: Durfee-Rogers Algorithm 1 (mechanisms/limited_domain.py;
    charged limited_domain_cost(k, epsilon, delta)); a bottom symbol is a last row with item
    NULL."""
    from topk_middleware.mechanisms.limited_domain import check_limited_domain, limited_domain_top_k

    _no_nulls(
        plpy, source=source, k=k, k_bar=k_bar, epsilon=epsilon, delta=delta, oblivious=oblivious
    )
    _checked(plpy, check_limited_domain, k, k_bar, epsilon, delta, None)
    _checked(plpy, _check_key, release_key)
    _not_oblivious(plpy, "limited_domain", oblivious)
    return _charged_release(
        plpy,
        GD,
        source,
        lambda table, budget, seed: limited_domain_top_k(
            table, k, k_bar, epsilon, delta, seed=seed, budget=budget
        ),
        Keyed(
            release_key,
            "limited_domain_top_k",
            {"k": k, "k_bar": k_bar, "epsilon": epsilon, "delta": delta},
        ),
    )


def _guarantee_row(release: Any) -> tuple[Any, ...]:
    """topk.last_guarantee()'s row for a release: its guarantee's fields and its words."""
    from topk_middleware.release import guarantee_text

    p = release.privacy
    counted = release.counts is not None
    return (
        p.epsilon,
        p.delta,
        p.noise,
        p.scale,
        p.sensitivity,
        p.score_bound,
        p.counts_epsilon if counted else None,
        p.counts_scale if counted else None,
        release.count_error if counted else None,
        guarantee_text(release),
    )


def server_last_guarantee(plpy: Any, GD: dict[str, Any]) -> list[tuple[Any, ...]]:
    """topk.last_guarantee(): the guarantee of the calling session's last release, or no row."""
    found = GD.get("topk_last_guarantee")
    return [] if found is None else [found]


def _not_refused_too_often(plpy: Any, ledger: Any, role: str) -> None:
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
        _refuse(
            plpy,
            f"role {role} had {REFUSALS_PER_MINUTE} releases refused for a reason in the data "
            "within a minute; releases are paused for it until the minute has passed; nothing "
            "was read, charged or logged",
            RATE_LIMITED,
            hint="an administrator reads the reasons: SELECT * FROM topk.refusals WHERE role = "
            f"'{role}' ORDER BY refused_at DESC",
        )


def _log_refusal(ledger: Any, role: str, relation: str, detail: str) -> str:
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


def _is_lock_timeout(error: Exception) -> bool:
    import psycopg

    cause = getattr(error, "orig", error)
    return isinstance(cause, psycopg.errors.LockNotAvailable)


def principal_of(role_oid: int) -> str:
    """The ledger's principal of a role: its OID (topk.principal(role) in SQL), so that a role
    dropped and created again under its name starts with no budget and no spending, and a
    renamed role keeps both."""
    return f"role:{int(role_oid)}"


def _role(plpy: Any, role: str) -> tuple[str, str]:
    """(name, ledger principal) of a role given as regrole text."""
    plan = plpy.prepare(
        "SELECT rolname::text AS name, oid::bigint AS oid FROM pg_roles WHERE oid = $1::regrole",
        ["text"],
    )
    found = plpy.execute(plan, [role])[0]
    return found["name"], principal_of(found["oid"])


def server_grant_budget(plpy: Any, GD: dict[str, Any], role: Any, epsilon: Any, delta: Any) -> None:
    """topk.grant_budget: set the role's total (created, or changed) in the caller's transaction;
    what the role has spent is kept."""
    from adapters.ledger import PRINCIPALS
    from topk_middleware.accounting import check_budget_total

    _no_nulls(plpy, role=role, epsilon=epsilon, delta=delta)
    try:
        check_budget_total(epsilon, delta)
    except (TypeError, ValueError) as error:
        _refuse(plpy, str(error), INVALID)
    _ledger(plpy, GD)  # the ledger's tables exist
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

    _no_nulls(plpy, role=role)
    from topk_middleware.accounting import BudgetExceeded

    name, principal = _role(plpy, role)
    ledger = _ledger(plpy, GD)
    try:
        spent = ledger.spent(principal)
    except KeyError:
        _refuse(plpy, f"role {name} has no privacy budget", REFUSED)
    except BudgetExceeded as error:  # CorruptLedger: a tampered charge
        _refuse(plpy, f"role {name}: {error}", REFUSED)
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


def server_check(plpy: Any, GD: dict[str, Any]) -> str:
    """What install-sql asks the server: its Python, numpy, where the project came from; and
    that the ledger's connection works (its tables are created in schema topk)."""
    import sys

    import numpy

    _ledger(plpy, GD)
    return (
        f"Python {sys.version.split()[0]}, numpy {numpy.__version__}, "
        f"topk_middleware from {Path(__file__).resolve().parent}"
    )


# ----- the command line: `topk-middleware install-sql` (registered by cli.py) ------------------
