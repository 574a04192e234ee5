"""The `topk-middleware` command line put together: main() (the console script and `python -m
frontends`), the parser with one subcommand per command module, --version (read from the
package metadata only when asked for) and the short usage error (exit code 2).
"""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from frontends.cli.budget import add_budget_parser
from frontends.cli.prepare import add_check_parser, add_prepare_parser, add_unprepare_parser
from frontends.cli.preview import add_preview_parser
from frontends.cli.release import add_release_parser
from frontends.cli.reporting import EXIT_USAGE, PROG, run_reporting_errors
from frontends.cli.trend import add_trend_parser
from frontends.cli.zipf_demo import add_demo_parser, demo_command
from frontends.sql_cli import add_install_sql_parser, add_uninstall_sql_parser


def main(argv: list[str] | None = None) -> int:
    """The console script `topk-middleware` and `python -m frontends`."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo_command(args, parser)
    return run_reporting_errors(args.handler, args)


def version() -> str:
    """The installed package's version (its metadata; no module of the package is imported)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("topk_middleware")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown (not installed)"


class VersionAction(argparse.Action):
    """`--version`: the package's version, read from its metadata only when asked for (reading
    it loads importlib.metadata, which no other command needs)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **_: Any) -> None:
        super().__init__(
            option_strings, dest, default=argparse.SUPPRESS, nargs=0, help="print the version"
        )

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"{parser.prog} {version()}")
        parser.exit()


class ShortUsageParser(argparse.ArgumentParser):
    """An argparse parser whose error is two short lines (what is wrong, then where the usage
    is), not the command's whole usage: one bad flag, one message. Exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n  (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = ShortUsageParser(
        prog=PROG,
        description="Differentially private top-k straight from the table that holds the counts.",
    )
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_demo_parser(sub)
    add_release_parser(sub)
    add_prepare_parser(sub)
    add_unprepare_parser(sub)
    add_check_parser(sub)
    add_preview_parser(sub)
    add_budget_parser(sub)
    add_trend_parser(sub)
    add_install_sql_parser(sub)
    add_uninstall_sql_parser(sub)
    return parser
