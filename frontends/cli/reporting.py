"""How a command of `topk-middleware` ends: its exit codes, the usage error, and the runner that
turns every failure a user can cause into one line on stderr and an exit code, never a
traceback; and the JSON text the commands print with --json.

Exit codes (README "Command line"): EXIT_OK, EXIT_FAILED (the store, the ledger or the mechanism
refused or failed), EXIT_USAGE (argparse's code too), EXIT_BUDGET, EXIT_INTERRUPTED.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

from adapters.url import StoreArgumentError
from topk_middleware.names import first_line, mask_secrets

PROG = "topk-middleware"
EXIT_OK = 0
EXIT_FAILED = 1  # the store, the ledger or the mechanism refused or failed
EXIT_USAGE = 2  # the command line is wrong (argparse's code too): nothing was opened or created
EXIT_BUDGET = 3  # the principal's budget would be exceeded: nothing was read, charged or released
EXIT_INTERRUPTED = 130


class UsageError(ValueError):
    """What is wrong with the command line, found before anything is opened or created."""


def run_reporting_errors(handler: Callable[[argparse.Namespace], int], args: Any) -> int:
    """Run one subcommand: warnings and errors as one line each on stderr, no traceback, and
    the exit code of the failure (module constants)."""
    from topk_middleware.accounting import BudgetExceeded

    name = f"{PROG} {args.command}"
    caught: list[warnings.WarningMessage] = []
    problem: tuple[int, str] | None = None
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            # a connection some other code dropped unclosed is not this command's news
            warnings.simplefilter("ignore", ResourceWarning)
            code = handler(args)
    except (UsageError, StoreArgumentError) as error:
        problem = (EXIT_USAGE, first_line(error))
    except BudgetExceeded as error:
        message = f"budget exceeded: {first_line(error)}"
        if error.needed_delta is not None:  # budget totals are fixed: a principal of its own
            message += (
                f" (on the command line: {PROG} budget --grant EPSILON --grant-delta 1e-6 for a "
                "new principal, or release --adaptive)"
            )
        problem = (EXIT_BUDGET, message)
    except KeyboardInterrupt:
        problem = (EXIT_INTERRUPTED, "interrupted")
    except BrokenPipeError:  # the reader went away (`| head`): nothing more to say to it
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush goes nowhere
        return EXIT_OK
    except Exception as error:  # every other failure: the message, never a traceback
        message = first_line(error)
        if "prepare()" in message:
            live = " --mode live" if getattr(args, "mode", None) == "live" else ""
            message += f" (on the command line: {PROG} prepare URL --table TABLE{live})"
        problem = (EXIT_FAILED, message)
    for warning in caught:
        print(f"{name}: warning: {first_line(warning.message)}", file=sys.stderr)  # type: ignore[arg-type]
    if problem is not None:
        print(f"{name}: error: {mask_secrets(problem[1])}", file=sys.stderr)
        return problem[0]
    return code


def json_text(value: Any) -> str:
    """JSON text; non-finite numbers as the strings "inf", "-inf", "nan" (JSON has none)."""
    from topk_middleware.release import plain

    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return str(x)
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [clean(v) for v in x]
        return plain(x)

    return json.dumps(clean(value), default=str)
