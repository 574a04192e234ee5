"""The options every store command shares (`release`, `prepare`, `unprepare`, `check`,
`preview`, `trend`): the store URL, the table and its columns, the mode, --frozen and --json;
and the table they name, opened through adapters/url.py (no store is opened before the command
line is checked).
"""

from __future__ import annotations

import argparse
from typing import Any

from adapters.url import MODES as STORE_MODES
from adapters.url import parse_store_url, split_table
from frontends.cli.reporting import PROG, UsageError

STORE_URL_HELP = (
    "the store: a DuckDB file (path.duckdb, path.db, duckdb:///path), postgresql://user@host/db "
    "(psycopg), or any SQLAlchemy URL (sqlite:///path, mysql+pymysql://user@host/db, "
    "postgresql+psycopg://user@host/db)"
)
NOT_FOR_ANALYSTS = "data-dependent, outside the guarantee: not for analysts"


def add_table_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", metavar="URL", help=STORE_URL_HELP)
    p.add_argument("--table", required=True, help="the table of counts: NAME or SCHEMA.NAME")
    p.add_argument(
        "--schema", default=None, help="the table's schema (then --table is taken whole, dots too)"
    )
    p.add_argument("--id", default="id", help="the item id column (default: id)")
    p.add_argument("--score", default="score", help="the count column (default: score)")
    p.add_argument(
        "--mode",
        choices=STORE_MODES,
        default="copy",
        help="copy: runs read the rank-ordered copy prepare writes (every store); live: runs "
        "read the table itself, no rebuild after writes (PostgreSQL and SQLAlchemy stores)",
    )
    p.add_argument(
        "--frozen",
        action="store_true",
        help="copy mode: the table does not change after prepare, so runs read the copy without "
        "proving it current (DuckDB, which has no cheap proof, reads the table itself otherwise)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def open_store_table(args: argparse.Namespace, *, read_only: bool) -> Any:
    """The table named by the command line, as a context manager (adapters/url.py), with the
    sensitivity declared by --sensitivity where the command has it."""
    from adapters.url import open_table

    store = parse_store_url(args.url)
    table, schema = split_table(args.table, args.schema)
    if args.frozen and args.mode == "live":
        raise UsageError("--frozen is a promise about the copy of copy mode: not with --mode live")
    return open_table(
        store,
        table,
        args.id,
        args.score,
        schema=schema,
        mode=args.mode,
        read_only=read_only,
        sensitivity=getattr(args, "sensitivity", None),
        frozen=args.frozen,
    )


def has_copy(source: Any, args: argparse.Namespace) -> bool:
    """Whether a copy-mode table has the rank-ordered copy prepare() writes (one catalog
    lookup)."""
    return bool(source.has_rank_table())


def not_prepared(source: Any) -> RuntimeError:
    """The error of a run that needs the rank-ordered copy on a table without one."""
    return RuntimeError(
        f"{source.where} is not prepared (no rank-ordered copy): run {PROG} prepare on it first"
    )
