"""`topk.private_top_k(...)`: the private top-k as a SQL function inside PostgreSQL (PL/Python).

With it, topk.exponential_mechanism, peeling_top_k, joint_top_k and limited_domain_top_k (the
mechanisms of topk_middleware/mechanisms that fit one table-function call), each charged its
module's own cost through `budget=`; a bottom symbol (limited domain) is a last row with item NULL.

Installed by `topk-middleware install-sql --dsn ...` (`install`), from the SQL in
topk_middleware/sql/install.sql and the function pairs of SQL_FUNCTIONS (`function_sql`). Two
halves live here:

* client side (`install`, `register_source`): create plpython3u and the schema `topk`, record
  where the server's Python finds the project (this checkout, first on sys.path) and its
  dependencies (this virtual environment's site-packages, through site.addsitedir, which honours
  the .pth files of an editable install), check from inside the server that it imports them and
  reaches the ledger, and register tables prepared in live mode (adapters/postgres_live.py).
* server side (`server_*`, called by the PL/Python bodies): the release reads the table through
  SPI (adapters/plpython.py, counted by CountedAccess like every store) in the calling statement's
  snapshot, and charges the caller through a PrivacyLedger whose connection is the server's own
  connection to itself over the local socket (`topk.settings.ledger_dsn`). The charge is
  therefore an autonomous transaction: committed (row lock FOR UPDATE, composition, insert) before
  any row of the table is read, and kept when the caller rolls back; concurrent sessions are
  serialised by the ledger's row lock and never overspend. Only the release (position, item) is
  returned; access counts, method and m go to the ledger's log (topk.topk_ledger_charges).

Who pays: `session_user`, the role that logged in. SET ROLE cannot change it (only a superuser's
SET SESSION AUTHORIZATION can), so a member of several roles cannot draw on several budgets by
switching between them; inside the SECURITY DEFINER function current_user is the owner, so it
could not name the caller anyway. A role without a budget row is refused.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from .validation import first_line

SCHEMA = "topk"
SERVER_DIR = "/var/lib/topk_middleware"  # where a copy readable by the server goes (`stage`)
PROJECT_PACKAGES = ("topk_middleware", "adapters")  # what the server's Python imports of ours
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
    from topk_middleware import sql_function
    GD["topk"] = sql_function"""

INVALID = "22023"  # invalid_parameter_value
NULL_ARGUMENT = "22004"  # null_value_not_allowed
UNDEFINED = "42704"  # undefined_object: an unregistered source
REFUSED = "42501"  # insufficient_privilege: no budget, or over budget


class InstallError(RuntimeError):
    """install-sql could not complete; the message says what to do."""


@dataclass(frozen=True)
class Installed:
    project_path: str
    site_packages: str
    ledger_dsn: str
    server: str  # what the server's Python reported (versions, where the project came from)


# ----- client side ------------------------------------------------------------------------------
@dataclass(frozen=True)
class SqlFunction:
    """A function of schema topk, installed as a pair: a PL/Python body `topk.<body>` that calls
    `<server>` of this module, and the plpgsql front `topk.<name>` that administrators grant,
    which turns the project's refusals into plain SQL errors (topk._plain_refusal). Both are
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


RELEASE = 'TABLE("position" integer, item text)'
SQL_FUNCTIONS = (
    SqlFunction(
        "private_top_k",
        "_release",
        "source regclass, k integer, epsilon double precision, "
        "delta double precision DEFAULT 0, noise text DEFAULT 'gumbel'",
        RELEASE,
        "server_release",
        comment="Private top-k (Wu, Ohrimenko, Wirth 2023): best first with Gumbel noise, a set "
        "in id order with Laplace; charged to session_user.",
    ),
    SqlFunction(
        "exponential_mechanism",
        "_exponential_mechanism",
        "source regclass, epsilon double precision",
        RELEASE,
        "server_exponential",
        comment="The exponential mechanism (k = 1), charged to session_user.",
    ),
    SqlFunction(
        "peeling_top_k",
        "_peeling_top_k",
        "source regclass, k integer, epsilon double precision",
        RELEASE,
        "server_peeling",
        comment="Peeling: k exponential mechanisms, best first, charged to session_user.",
    ),
    SqlFunction(
        "joint_top_k",
        "_joint_top_k",
        "source regclass, k integer, epsilon double precision",
        RELEASE,
        "server_joint",
        comment="The joint exponential mechanism: an unordered set, so position is the order of "
        "a fresh random permutation, not a rank.",
    ),
    SqlFunction(
        "limited_domain_top_k",
        "_limited_domain_top_k",
        "source regclass, k integer, k_bar integer, epsilon double precision, "
        "delta double precision",
        RELEASE,
        "server_limited_domain",
        comment="Limited domain: at most k rows; when fewer than k items beat the threshold, a "
        "last row whose item is NULL stands for the bottom symbol.",
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


def _parameters(params: str) -> tuple[str, str]:
    """(the parameters without their defaults, their names) of a parameter list."""
    bare = [re.sub(r"\s+DEFAULT\s+.*$", "", p.strip()) for p in params.split(",")]
    return ", ".join(bare), ", ".join(p.split()[0] for p in bare)


def function_sql(f: SqlFunction) -> str:
    """The SQL that installs one SqlFunction (body, front, revokes, comment)."""
    bare, args = _parameters(f.params)
    call = (
        f"PERFORM topk.{f.body}({args});"
        if f.returns == "void"
        else f"RETURN QUERY SELECT * FROM topk.{f.body}({args});"
    )
    comment = f.comment.replace("'", "''")
    return f"""
CREATE OR REPLACE FUNCTION topk.{f.body}({bare})
RETURNS {f.returns}
LANGUAGE plpython3u {f.volatility} SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET jit = off
AS $$
{BOOT}
return GD["topk"].{f.server}(plpy, GD, {args})
$$;

CREATE OR REPLACE FUNCTION topk.{f.name}({f.params})
RETURNS {f.returns}
LANGUAGE plpgsql {f.volatility} SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    state text;
    message text;
    hint text;
BEGIN
    {call}
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
        hint = PG_EXCEPTION_HINT;
    PERFORM topk._plain_refusal(state, message, hint);
    RAISE;  -- not one of ours: as it came
END
$$;

REVOKE EXECUTE ON FUNCTION topk.{f.body}({bare}), topk.{f.name}({bare}) FROM PUBLIC;
COMMENT ON FUNCTION topk.{f.name}({bare}) IS '{comment}';
"""


def install_sql_text() -> str:
    """install.sql (schema, tables, helpers) followed by every SqlFunction."""
    static = (
        resources.files("topk_middleware")
        .joinpath("sql/install.sql")
        .read_text(encoding="utf-8")
        .replace("{BOOT}", BOOT)
    )
    return static + "".join(function_sql(f) for f in SQL_FUNCTIONS)


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


def stage(project_path: str, site_packages: str, server_dir: str = SERVER_DIR) -> tuple[str, str]:
    """A copy of the project's packages and of the site-packages that the server's OS user can
    read, under `server_dir`, for a checkout it cannot enter (a clone in a private home
    directory). Made afresh at each install; returns (project path, site-packages) to record."""
    key = hashlib.sha256(f"{project_path}\0{site_packages}".encode()).hexdigest()[:16]
    root = Path(server_dir) / key
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


def install(
    dsn: str,
    ledger_dsn: str | None = None,
    project_path: str | None = None,
    site_packages: str | None = None,
) -> Installed:
    """Install the schema `topk` into the database of `dsn` (a superuser), idempotently. Run it
    on the database server's machine: the paths it records are read by the server's Python.
    A checkout or virtual environment that other users cannot read (a private home directory)
    is staged first: a readable copy under SERVER_DIR is recorded instead (`stage`)."""
    import psycopg

    default_project, default_site = default_paths()
    project_path = project_path or default_project
    site_packages = site_packages or default_site
    if _unreadable(project_path) or _unreadable(site_packages):
        project_path, site_packages = stage(project_path, site_packages)
    try:
        conn = psycopg.connect(dsn, autocommit=True)
    except psycopg.Error as error:
        raise InstallError(f"cannot connect to {dsn!r}: {first_line(error)}") from None
    with conn:
        available = conn.execute(
            "SELECT count(*) FROM pg_available_extensions WHERE name = 'plpython3u'"
        ).fetchone()[0]
        if not available:
            raise InstallError(
                "the server has no PL/Python (plpython3u): install the Debian package "
                "postgresql-plpython3-<major> (scripts/ensure-plpython.sh does it, as root)"
            )
        if ledger_dsn is None:
            socket, port, database, user = conn.execute(
                "SELECT split_part(current_setting('unix_socket_directories'), ',', 1), "
                "current_setting('port'), current_database(), current_user"
            ).fetchone()
            ledger_dsn = psycopg.conninfo.make_conninfo(
                host=socket.strip(), port=port, dbname=database, user=user
            )
        try:
            with conn.transaction():
                conn.execute(install_sql_text())
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
        try:
            server = conn.execute("SELECT topk._check()").fetchone()[0]
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
                f"{project_path}, site-packages {site_packages}, ledger {ledger_dsn!r}){why}"
            ) from None
    return Installed(project_path, site_packages, ledger_dsn, server)


def register_source(dsn: str, table: str, id: str, score: str, *, schema: str | None = None) -> str:
    """Prepare `table` in live mode (adapters/postgres_live.py: its B-trees, position table and
    triggers; idempotent) and register it for topk.private_top_k with its id and score columns.
    Returns the table's name as regclass prints it."""
    from adapters.postgres import PostgresTable

    source = PostgresTable(dsn, table, id=id, score=score, schema=schema, mode="live")
    try:
        source.prepare()
        conn = source._conn
        base = source._base.as_string(conn)
        position_table = source._pos.as_string(conn)
        with conn.transaction():
            conn.execute(
                "INSERT INTO topk.sources (source, id_column, score_column, position_table, "
                "trigger_prefix) VALUES (%s::regclass, %s, %s, %s::regclass, %s) "
                "ON CONFLICT (source) DO UPDATE SET id_column = excluded.id_column, "
                "score_column = excluded.score_column, position_table = "
                "excluded.position_table, trigger_prefix = excluded.trigger_prefix, "
                "registered_at = now()",
                [base, id, score, position_table, source.trigger_function],
            )
            return conn.execute("SELECT %s::regclass::text", [base]).fetchone()[0]
    finally:
        source.close()


# ----- server side (called from the PL/Python bodies; `plpy` and `GD` are theirs) --------------
def _ledger(plpy: Any, GD: dict[str, Any]) -> Any:
    """The session's PrivacyLedger on its own connection (search_path topk), made once."""
    ledger = GD.get("topk_ledger")
    if ledger is None:
        import psycopg
        import sqlalchemy as sa

        from .ledger import PrivacyLedger

        dsn = plpy.execute("SELECT ledger_dsn FROM topk.settings")[0]["ledger_dsn"]
        options = f"-c search_path={SCHEMA} -c lock_timeout={LOCK_TIMEOUT}"

        def connect() -> Any:
            return psycopg.connect(dsn, options=options, application_name=APPLICATION_NAME)

        # No pre-ping (two round trips per call): a connection found dead fails its first
        # statement, SQLAlchemy drops it, and server_release runs the release once more.
        engine = sa.create_engine("postgresql+psycopg://", creator=connect, pool_size=1)
        ledger = GD["topk_ledger"] = PrivacyLedger(engine)
    return ledger


def _refuse(plpy: Any, message: str, sqlstate: str, hint: str | None = None) -> None:
    extra = {"hint": hint} if hint else {}
    plpy.error(f"topk: {message}", sqlstate=sqlstate, **extra)


def _registration(plpy: Any, GD: dict[str, Any], source: str) -> dict[str, Any]:
    plan = GD.get("topk_registration")
    if plan is None:
        plan = GD["topk_registration"] = plpy.prepare(
            "SELECT session_user::text AS role, s.source::text AS relation, s.id_column, "
            "s.score_column, "
            "s.position_table::text AS position_table, s.trigger_prefix, "
            "format_type(i.atttypid, i.atttypmod) AS id_type, i.attcollation <> 0 AS text_ids, "
            "format_type(c.atttypid, c.atttypmod) AS score_type "
            "FROM topk.sources AS s "
            "JOIN pg_attribute AS i ON i.attrelid = s.source AND i.attname = s.id_column "
            "JOIN pg_attribute AS c ON c.attrelid = s.source AND c.attname = s.score_column "
            "WHERE s.source = $1::regclass",
            ["text"],
        )
    rows = plpy.execute(plan, [source])
    if not len(rows):
        _refuse(
            plpy,
            f"table {source} is not registered for private top-k",
            UNDEFINED,
            hint="an administrator registers it: topk-middleware install-sql --dsn ... "
            "--source <table> --id <id column> --score <score column>",
        )
    return rows[0]


def _spi_table(plpy: Any, GD: dict[str, Any], found: dict[str, Any]) -> Any:
    """The SPI source of a registration, kept for the session with its prepared plans (a new
    registration, or a changed column type, makes a new one)."""
    from adapters.plpython import SPITable

    tables = GD.setdefault("topk_tables", {})
    key = tuple(found[c] for c in sorted(found) if c != "role")
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
    return table


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


def _charged_release(
    plpy: Any, GD: dict[str, Any], source: Any, run: Callable[[Any, Any], Any]
) -> list[tuple[int, str | None]]:
    """The common half of every release function: the source's registration, then `run(table,
    budget)` (a mechanism given the SPI source and session_user's LedgerBudget as `budget=`: it
    charges the ledger before reading any row, and logs its diagnostics there), its refusals in
    the project's words; the rows (position, item) of the release."""
    import sqlalchemy as sa

    from .accounting import BudgetExceeded
    from .ledger import LedgerBudget

    found = _registration(plpy, GD, source)
    ledger = _ledger(plpy, GD)
    role = found["role"]
    table = _spi_table(plpy, GD, found)
    budget = LedgerBudget(ledger, role, math.nan, math.nan)  # totals: the ledger's row
    try:
        try:
            result = run(table, budget)
        except sa.exc.DBAPIError as error:
            if not error.connection_invalidated:
                raise
            # The ledger's connection had died (idle too long, server restart): once more on a
            # new one. Had the lost charge committed, it stays charged (never undercounted).
            result = run(table, budget)
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
        _refuse(plpy, f"role {role}: {error}", REFUSED)
    except ValueError as error:  # k > m, an empty table, bad scores
        _refuse(plpy, str(error), INVALID)
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
    rows: list[tuple[int, str | None]] = [
        (position, str(item)) for position, item in enumerate(release.items, 1)
    ]
    if release.bottom:  # limited domain: fewer than k items beat the threshold
        rows.append((len(rows) + 1, None))
    return rows


def server_release(
    plpy: Any, GD: dict[str, Any], source: Any, k: Any, epsilon: Any, delta: Any, noise: Any
) -> list[tuple[int, str | None]]:
    """topk.private_top_k: check, charge session_user, release; the rows (position, item)."""
    from .api import NOISES, check_common, private_top_k

    _no_nulls(plpy, source=source, k=k, epsilon=epsilon, delta=delta, noise=noise)

    def check() -> None:
        check_common(k, epsilon, delta)
        if noise not in NOISES:
            raise ValueError(f"noise must be one of {', '.join(NOISES)}, got {noise!r}")

    _checked(plpy, check)
    return _charged_release(
        plpy,
        GD,
        source,
        lambda table, budget: private_top_k(table, k, epsilon, delta, noise, budget=budget),
    )


def server_exponential(
    plpy: Any, GD: dict[str, Any], source: Any, epsilon: Any
) -> list[tuple[int, str | None]]:
    """topk.exponential_mechanism: one item, P(i) ~ exp(epsilon h_i) (mechanisms/exponential.py;
    charged accounting.oneshot_cost("gumbel", 1, m, epsilon), as its `budget=` does)."""
    from .api import check_common
    from .mechanisms.exponential import exponential_mechanism

    _no_nulls(plpy, source=source, epsilon=epsilon)
    _checked(plpy, check_common, 1, epsilon, 0.0)
    return _charged_release(
        plpy, GD, source, lambda table, budget: exponential_mechanism(table, epsilon, budget=budget)
    )


def server_peeling(
    plpy: Any, GD: dict[str, Any], source: Any, k: Any, epsilon: Any
) -> list[tuple[int, str | None]]:
    """topk.peeling_top_k: k exponential-mechanism steps of epsilon/k (mechanisms/peeling.py;
    charged peeling_cost(k, epsilon))."""
    from .api import check_common
    from .mechanisms.peeling import peeling_top_k

    _no_nulls(plpy, source=source, k=k, epsilon=epsilon)
    _checked(plpy, check_common, k, epsilon, 0.0)
    return _charged_release(
        plpy, GD, source, lambda table, budget: peeling_top_k(table, k, epsilon, budget=budget)
    )


def server_joint(
    plpy: Any, GD: dict[str, Any], source: Any, k: Any, epsilon: Any
) -> list[tuple[int, str | None]]:
    """topk.joint_top_k: a k-set from the joint exponential mechanism, in random order
    (mechanisms/joint.py; charged joint_cost(epsilon))."""
    from .api import check_common
    from .mechanisms.joint import joint_top_k

    _no_nulls(plpy, source=source, k=k, epsilon=epsilon)
    _checked(plpy, check_common, k, epsilon, 0.0)
    return _charged_release(
        plpy, GD, source, lambda table, budget: joint_top_k(table, k, epsilon, budget=budget)
    )


def server_limited_domain(
    plpy: Any, GD: dict[str, Any], source: Any, k: Any, k_bar: Any, epsilon: Any, delta: Any
) -> list[tuple[int, str | None]]:
    """topk.limited_domain_top_k: Durfee-Rogers Algorithm 1 (mechanisms/limited_domain.py;
    charged limited_domain_cost(k, epsilon, delta)); a bottom symbol is a last row with item
    NULL."""
    from .mechanisms.limited_domain import check_limited_domain, limited_domain_top_k

    _no_nulls(plpy, source=source, k=k, k_bar=k_bar, epsilon=epsilon, delta=delta)
    _checked(plpy, check_limited_domain, k, k_bar, epsilon, delta, None)
    return _charged_release(
        plpy,
        GD,
        source,
        lambda table, budget: limited_domain_top_k(table, k, k_bar, epsilon, delta, budget=budget),
    )


def _is_lock_timeout(error: Exception) -> bool:
    import psycopg

    cause = getattr(error, "orig", error)
    return isinstance(cause, psycopg.errors.LockNotAvailable)


def _role_name(plpy: Any, role: str) -> str:
    plan = plpy.prepare(
        "SELECT rolname::text AS name FROM pg_roles WHERE oid = $1::regrole", ["text"]
    )
    return plpy.execute(plan, [role])[0]["name"]


def server_grant_budget(plpy: Any, GD: dict[str, Any], role: Any, epsilon: Any, delta: Any) -> None:
    """topk.grant_budget: set the role's total (created, or changed) in the caller's transaction;
    what the role has spent is kept."""
    from .accounting import check_budget_total
    from .ledger import PRINCIPALS

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
    plpy.execute(plan, [_role_name(plpy, role), float(epsilon), float(delta)])


def server_spent(plpy: Any, GD: dict[str, Any], role: Any) -> list[tuple[Any, ...]]:
    """topk.spent: the composition of the role's releases (the ledger's, committed charges) and
    its total."""
    from .ledger import PRINCIPALS

    _no_nulls(plpy, role=role)
    name = _role_name(plpy, role)
    ledger = _ledger(plpy, GD)
    try:
        spent = ledger.spent(name)
    except KeyError:
        _refuse(plpy, f"role {name} has no privacy budget", REFUSED)
    plan = plpy.prepare(
        f"SELECT epsilon, delta, charges FROM {SCHEMA}.{PRINCIPALS} WHERE principal = $1",
        ["text"],
    )
    total = plpy.execute(plan, [name])[0]
    return [
        (spent.epsilon, spent.delta, spent.rule, total["charges"], total["epsilon"], total["delta"])
    ]


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
def add_install_sql_parser(sub: Any) -> None:
    p = sub.add_parser(
        "install-sql",
        help="install topk.private_top_k(...) into a PostgreSQL database (PL/Python)",
        description="Install the schema topk (topk.private_top_k, exponential_mechanism, "
        "peeling_top_k, joint_top_k, limited_domain_top_k, grant_budget, spent) into the "
        "database of --dsn (a superuser), and optionally prepare and register a table.",
    )
    p.add_argument("--dsn", required=True, help="libpq DSN or URL of the database (superuser)")
    p.add_argument(
        "--ledger-dsn",
        help="DSN the server uses to reach itself for the budget ledger (default: the local "
        "socket, this database, this user)",
    )
    p.add_argument("--source", help="a table to prepare (live mode) and register, [schema.]table")
    p.add_argument("--id", default="id", help="the source's id column (default id)")
    p.add_argument("--score", default="score", help="the source's score column (default score)")
    p.set_defaults(handler=run_install_sql)


def run_install_sql(args: Any) -> int:
    """install-sql: install, then register --source if given (the CLI reports errors in one
    line, without a traceback: cli.run_reporting_errors)."""
    done = install(args.dsn, args.ledger_dsn)
    print(f"installed schema topk: server {done.server}")
    print(f"  ledger connection: {done.ledger_dsn}")
    if args.source:
        schema, _, table = args.source.rpartition(".")
        name = register_source(args.dsn, table, args.id, args.score, schema=schema or None)
        print(f"registered {name} (id {args.id}, score {args.score})")
    return 0
