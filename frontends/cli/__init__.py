"""Command line: `topk-middleware` (or `python -m frontends`) COMMAND.

`release`, `prepare`, `check` and `budget` work on a table of counts in any store named by a URL
(adapters/url.py: a DuckDB file, postgresql://, any SQLAlchemy URL) and, for budgets, a
PrivacyLedger (ledger.py). `release` prints the release only (items and guarantee, api.Release);
operator diagnostics, which depend on the data, only with --diagnostics and on stderr. Every
failure a user can cause is one line on stderr and an exit code (reporting.py), never a
traceback. One module per command group, each importing its heavy modules (numpy, the stores'
drivers, SQLAlchemy, tqdm) inside the function that needs them, so --help loads none:

parser.py     main(), the parser of every command, --version
reporting.py  exit codes, UsageError, the runner that reports failures, JSON output
options.py    the options every store command shares, and the table they name
ledger.py     the ledger named by --ledger, and a principal's stored budget
release.py    `release`
prepare.py    `prepare`, `unprepare`, `check`
preview.py    `preview`
trend.py      `trend`
budget.py     `budget`
zipf_demo.py  `demo`: a synthetic Zipf table in DuckDB, released two ways

The SQL functions' commands (`install-sql`, `uninstall-sql`) are frontends/sql_cli.py.
"""

from frontends.cli.budget import add_budget_parser, budget_command
from frontends.cli.ledger import LEDGER_URL_HELP, ledger_url, open_ledger, principal_budget
from frontends.cli.options import NOT_FOR_ANALYSTS, STORE_URL_HELP, has_copy
from frontends.cli.parser import (
    ShortUsageParser,
    VersionAction,
    build_parser,
    main,
    version,
)
from frontends.cli.prepare import (
    add_check_parser,
    add_prepare_parser,
    add_unprepare_parser,
    check_command,
    elapsed_progress,
    prepare_command,
    unprepare_command,
)
from frontends.cli.preview import add_preview_parser, preview_command
from frontends.cli.release import add_release_parser, release_command
from frontends.cli.reporting import (
    EXIT_BUDGET,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    PROG,
    UsageError,
    run_reporting_errors,
)
from frontends.cli.trend import (
    TREND_PERIOD,
    TREND_UNITS,
    add_trend_parser,
    start_time,
    trend_command,
    trend_period,
)
from frontends.cli.zipf_demo import (
    DEMO_TABLE,
    add_demo_parser,
    create_zipf_table,
    demo,
    demo_argument_error,
    demo_command,
    zipf_histogram,
)

__all__ = [
    "DEMO_TABLE",
    "EXIT_BUDGET",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "LEDGER_URL_HELP",
    "NOT_FOR_ANALYSTS",
    "PROG",
    "STORE_URL_HELP",
    "TREND_PERIOD",
    "TREND_UNITS",
    "ShortUsageParser",
    "UsageError",
    "VersionAction",
    "add_budget_parser",
    "add_check_parser",
    "add_demo_parser",
    "add_prepare_parser",
    "add_preview_parser",
    "add_release_parser",
    "add_trend_parser",
    "add_unprepare_parser",
    "budget_command",
    "build_parser",
    "check_command",
    "create_zipf_table",
    "demo",
    "demo_argument_error",
    "demo_command",
    "elapsed_progress",
    "has_copy",
    "ledger_url",
    "main",
    "open_ledger",
    "prepare_command",
    "preview_command",
    "principal_budget",
    "release_command",
    "run_reporting_errors",
    "start_time",
    "trend_command",
    "trend_period",
    "unprepare_command",
    "version",
    "zipf_histogram",
]
