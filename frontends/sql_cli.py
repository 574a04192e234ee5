"""The command line's `install-sql` and `uninstall-sql` (frontends/sql/install.py does the
work): their parsers, and the handlers that print what was done. Kept apart so that every other
command's parser is built without loading the installer (about 7 ms of imports a run)."""

from __future__ import annotations

from typing import Any

from topk_middleware.names import mask_secrets


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
    p.add_argument(
        "--ledger-connections",
        type=int,
        default=None,
        metavar="N",
        help="the most connections the ledger's own role holds at once, one per session that "
        "calls a function (default: half the slots open to roles other than superusers)",
    )
    p.add_argument("--source", help="a table to prepare (live mode) and register, [schema.]table")
    p.add_argument("--id", default="id", help="the source's id column (default id)")
    p.add_argument("--score", default="score", help="the source's score column (default score)")
    p.add_argument(
        "--sensitivity",
        type=float,
        default=None,
        help="the most one client adds to or removes from one of the source's counts (default: "
        "what from_votes recorded with the table, else 1; a value below the record is refused)",
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="seconds an oblivious release from the source is padded to (default: the cost "
        "model's; raise it when topk.topk_ledger_charges logs deadline_missed)",
    )
    p.add_argument(
        "--grant",
        action="append",
        default=[],
        metavar="ROLE",
        help="a role (or PUBLIC) that may release from --source (repeatable; later: SELECT "
        "topk.grant_source('<table>', '<role>'))",
    )
    p.set_defaults(handler=run_install_sql)


def add_uninstall_sql_parser(sub: Any) -> None:
    p = sub.add_parser(
        "uninstall-sql",
        help="remove the schema topk and the staged copy install-sql made",
        description="Drop the schema topk (functions, registrations, refusals, budget ledger) "
        "from the database of --dsn (a superuser) and remove the copy of the project staged for "
        "it under /var/lib/topk_middleware, if any. plpython3u and the live-mode structures of "
        "registered tables stay (topk-middleware unprepare ... --mode live removes those).",
    )
    p.add_argument("--dsn", required=True, help="libpq DSN or URL of the database (superuser)")
    p.add_argument(
        "--drop-ledger",
        action="store_true",
        help="also when the budget ledger holds charges (the record of what roles have spent)",
    )
    p.set_defaults(handler=run_uninstall_sql)


def run_uninstall_sql(args: Any) -> int:
    """uninstall-sql: `uninstall`, then what was removed and what stays."""
    from frontends.sql.functions import SCHEMA
    from frontends.sql.install import uninstall

    done = uninstall(args.dsn, drop_ledger=args.drop_ledger)
    if not done.schema_dropped:
        print(f"no schema {SCHEMA} in this database: nothing to remove")
        return 0
    print(f"dropped schema {SCHEMA} ({done.charges} ledger charge(s))")
    if done.staged_copy:
        print(f"  removed the staged copy {done.staged_copy}")
    for source in done.sources:
        print(
            f"  {source} keeps its live-mode structures (topk-middleware unprepare URL "
            "--table TABLE --mode live)"
        )
    return 0


def run_install_sql(args: Any) -> int:
    """install-sql: install, then register --source if given (the CLI reports errors in one
    line, without a traceback: cli.run_reporting_errors)."""
    from frontends.sql.install import install
    from frontends.sql.sources import register_source, registered_sensitivity

    done = install(args.dsn, args.ledger_dsn, ledger_connections=args.ledger_connections)
    print(f"installed schema topk: server {done.server}")
    print(f"  ledger connection: {mask_secrets(done.ledger_dsn)}")
    if done.ledger_connections is not None:
        print(f"  ledger connection limit: {done.ledger_connections} at once")
    if done.ledger_why:
        print(
            "  the ledger's own role could not log in, so its connections log in as the "
            "installing superuser and may take the slots reserved for superusers (the server "
            f"said: {done.ledger_why}); pass --ledger-dsn with a role of its own"
        )
    elif done.ledger_superuser:
        print(
            "  the ledger's connections log in as a superuser, so they may take the slots "
            "reserved for superusers: a role that can connect could lock the superusers out; "
            "pass --ledger-dsn with a role of its own"
        )
    if done.native:
        print(
            "  library topk_server: refusals without CONTEXT lines; the functions' reads kept "
            "out of the caller's EXPLAIN"
        )
    else:
        print(
            "  library topk_server missing: each refusal carries PL/pgSQL CONTEXT lines and "
            "EXPLAIN (ANALYZE, BUFFERS) of a call counts the function's reads (the server "
            f"could not load it: {done.native_why}; run `make server-side` as root on the "
            "server's machine)"
        )
    if args.source:
        schema, _, table = args.source.rpartition(".")
        name = register_source(
            args.dsn,
            table,
            args.id,
            args.score,
            schema=schema or None,
            sensitivity=args.sensitivity,
            deadline=args.deadline,
            grant=args.grant,
        )
        sensitivity = registered_sensitivity(args.dsn, name)
        print(
            f"registered {name} (id {args.id}, score {args.score}, sensitivity "
            f"{sensitivity:g}: assumes each client changes each count by at most {sensitivity:g})"
        )
        print(
            f"  releasable by {', '.join(args.grant)}"
            if args.grant
            else "  releasable by no role yet: SELECT topk.grant_source('<table>', '<role>')"
        )
    return 0
