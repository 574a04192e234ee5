"""`topk-middleware budget`: a principal's privacy budget in a ledger, shown, or granted (a
total for all time, or per calendar window). What the releases charged composes by the rule of
accounting.py; the ledger is created only by a grant.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from frontends.cli.ledger import LEDGER_URL_HELP, open_ledger, principal_budget
from frontends.cli.reporting import EXIT_OK, UsageError, json_text
from topk_middleware.names import first_line


def add_budget_parser(sub: Any) -> None:
    p = sub.add_parser("budget", help="show a principal's privacy budget in a ledger, or grant one")
    p.add_argument("--ledger", metavar="URL", required=True, help=LEDGER_URL_HELP)
    p.add_argument("--principal", required=True, help="the analyst whose budget it is")
    p.add_argument(
        "--grant",
        type=float,
        metavar="EPSILON",
        default=None,
        help="give the principal this total epsilon (a new principal; the same total again is "
        "a no-op, another total is refused)",
    )
    p.add_argument("--grant-delta", type=float, metavar="DELTA", default=0.0, help="total delta")
    p.add_argument(
        "--window",
        choices=("hour", "day", "week"),
        default=None,
        help="with --grant: the total holds per calendar window (UTC; weeks from Monday), and "
        "each release counts in the window it falls in; default: one total for all time",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(handler=budget_command)


def budget_command(args: argparse.Namespace) -> int:
    """The principal's total and what the releases charged to it compose to (accounting.py)."""
    from topk_middleware.accounting import check_budget_total

    if args.grant is not None:
        try:
            check_budget_total(args.grant, args.grant_delta)
        except (TypeError, ValueError) as error:
            raise UsageError(first_line(error)) from None
    if not args.principal:
        raise UsageError("--principal must not be empty")
    if args.window is not None and args.grant is None:
        raise UsageError("--window goes with --grant: a window is fixed when the budget is granted")
    ledger = open_ledger(args.ledger, create=args.grant is not None)
    if args.grant is not None:
        budget = ledger.budget(args.principal, args.grant, args.grant_delta, args.window)
    else:
        budget = principal_budget(ledger, args.principal)
    spent = budget.spent()
    releases = len(budget.releases)
    window, since = ledger.window(args.principal), ledger.since(args.principal)
    if args.json:
        shown: dict[str, Any] = {
            "principal": args.principal,
            "total": {"epsilon": budget.epsilon, "delta": budget.delta},
            "spent": dataclasses.asdict(spent),
            "releases": releases,
        }
        if since is not None:  # a windowed grant: which window the spend is of
            shown.update(window=window, window_start=since.isoformat() + "Z")
        print(json_text(shown))
    else:
        per = "" if window is None else f" per {window}"
        where = "" if since is None else f" in the {window} from {since:%Y-%m-%d %H:%M} UTC"
        print(
            f"principal {args.principal!r}: total ({budget.epsilon:.6g}, {budget.delta:.3g})-DP"
            f"{per}; spent ({spent.epsilon:.6g}, {spent.delta:.3g})-DP over {releases} "
            f"release(s){where}" + ("" if not releases else f" ({spent.rule})")
        )
    return EXIT_OK
