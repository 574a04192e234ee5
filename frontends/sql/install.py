"""install-sql and uninstall-sql's work, from the client: `install`, `uninstall`, `stage`.

`install` creates plpython3u and the schema topk (functions.install_sql_text), records where the
server's Python finds the project (this checkout, first on sys.path) and its dependencies (this
virtual environment's site-packages, through site.addsitedir, which honours the .pth files of an
editable install), puts in the C helpers of the library topk_server where the server has it
(hiding.install_native), makes the ledger's own role (ledger.py) and checks from inside the
server that it imports the project and reaches the ledger (topk._check). A checkout that the
server's OS user cannot read is staged first (`stage`). `uninstall` removes what `install` made;
a ledger holding charges only when told. Run on the database server's machine, as a superuser.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frontends.sql.functions import SCHEMA, install_sql_text
from frontends.sql.hiding import HELD_SETTINGS_QUERY, install_native
from frontends.sql.ledger import (
    KEY_BY_OID,
    LEDGER_ROLE_PREFIX,
    check_connection_limit,
    drop_ledger_role,
    ledger_role_name,
    make_ledger_role,
)
from topk_middleware.names import first_line, mask_secrets

SERVER_DIR = "/var/lib/topk_middleware"  # where a copy readable by the server goes (`stage`)
PROJECT_PACKAGES = (
    "topk_middleware",
    "adapters",
    "frontends",
)  # what the server's Python imports of ours


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
    # the ledger's own role's CONNECTION LIMIT (None: --ledger-dsn named another role)
    ledger_connections: int | None = None


def default_paths() -> tuple[str, str]:
    """(the directory holding this topk_middleware package, this interpreter's site-packages)."""
    project = Path(__file__).resolve().parents[2]
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
    ledger_connections: int | None = None,
) -> Installed:
    """Install the schema `topk` into the database of `dsn` (a superuser), idempotently. Run it
    on the database server's machine: the paths it records are read by the server's Python.
    A checkout or virtual environment that other users cannot read (a private home directory)
    is staged first: a readable copy under SERVER_DIR is recorded instead (`stage`). The
    ledger's connection logs in as a role of its own (`make_ledger_role`) unless `ledger_dsn`
    names one, or the server refuses that role a login (then as the installing role). That
    role may hold `ledger_connections` connections at once (default: half the slots open to
    roles other than superusers; ledger.make_ledger_role)."""
    import psycopg
    from psycopg import sql

    ledger_connections = check_connection_limit(ledger_connections)
    if ledger_connections is not None and ledger_dsn is not None:
        raise InstallError(
            "--ledger-connections limits the ledger's own role, which --ledger-dsn replaces: "
            "set that role's CONNECTION LIMIT with ALTER ROLE instead"
        )

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
                native, native_why = install_native(conn)
                if ledger_role is not None:
                    ledger_connections = make_ledger_role(conn, ledger_role, ledger_connections)
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
    if ledger_why:  # the ledger logs in as the installing role: its own role is unused
        ledger_connections = None
    return Installed(
        project_path,
        site_packages,
        ledger_dsn,
        server,
        native,
        native_why,
        ledger_why,
        superuser,
        ledger_connections,
    )


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
            drop_ledger_role(conn, ledger_user)
    staged = _remove_staged(project) if project is not None else None
    return Uninstalled(True, staged, sources, int(charges))
