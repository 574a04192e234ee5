"""`topk-middleware trend`: one tick of a trending list (topk_middleware/streams.py), for a
scheduler to call once per period. The stream lives in the ledger under --principal and --name;
a run retried within its period prints the stored answer and charges nothing. The tick is
given as --tick, or found from --period and --start.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import re
import sys
from typing import Any

from frontends.cli.ledger import LEDGER_URL_HELP, open_ledger, principal_budget
from frontends.cli.options import NOT_FOR_ANALYSTS, add_table_options, open_store_table
from frontends.cli.reporting import EXIT_OK, UsageError, json_text
from topk_middleware.names import first_line

TREND_PERIOD = re.compile(r"^(\d+)([mhdw])$")
TREND_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def trend_period(text: str) -> dt.timedelta:
    """`30m`, `1h`, `1d`, `1w`: a positive whole number of minutes, hours, days or weeks."""
    match = TREND_PERIOD.match(text.strip())
    if match is None or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(
            f"a period is a positive whole number and a unit m, h, d or w (1h, 30m), not {text!r}"
        )
    return dt.timedelta(**{TREND_UNITS[match.group(2)]: int(match.group(1))})


def start_time(text: str) -> dt.datetime:
    """An ISO 8601 date and time, taken as UTC unless it names its offset."""
    try:
        when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--start takes an ISO date and time (2026-12-04T00:00Z), not {text!r}"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


def add_trend_parser(sub: Any) -> None:
    p = sub.add_parser(
        "trend",
        help="one tick of a trending list under one total budget (for a scheduler)",
        description="One tick of a private trending top-k over a live table: a fresh list, or "
        "the list that stands, under one (epsilon, delta) total over --horizon ticks. The "
        "stream's state is kept in --ledger; a retried run prints the stored answer.",
    )
    add_table_options(p)
    p.add_argument("--k", type=int, required=True, help="how many items in the list")
    p.add_argument("--epsilon", type=float, required=True, help="the total over the horizon")
    p.add_argument("--delta", type=float, default=0.0, help="the total delta (0)")
    p.add_argument("--horizon", type=int, required=True, help="how many ticks the total covers")
    p.add_argument("--name", required=True, help="the stream's name among the principal's")
    p.add_argument("--ledger", metavar="URL", required=True, help=LEDGER_URL_HELP)
    p.add_argument("--principal", required=True, help="whose budget pays for the stream")
    p.add_argument(
        "--mechanism",
        choices=("gated", "independent"),
        default="gated",
        help="gated: a new list only when a private test says the list is wrong (default); "
        "independent: a new list every tick",
    )
    p.add_argument(
        "--refreshes",
        type=int,
        default=None,
        help="gated: most new lists after the first (default: horizon / 24 with --delta 0, "
        "horizon / 4 with a delta)",
    )
    p.add_argument("--tick", type=int, default=None, help="the tick to answer (from 1)")
    p.add_argument(
        "--period", type=trend_period, default=None, help="one tick's length: 1h, 1d, ..."
    )
    p.add_argument("--start", type=start_time, default=None, help="when tick 1 began (ISO, UTC)")
    p.add_argument(
        "--diagnostics",
        action="store_true",
        help=f"also print the operator diagnostics, on stderr ({NOT_FOR_ANALYSTS})",
    )
    p.set_defaults(handler=trend_command)


def trend_command(args: argparse.Namespace) -> int:
    """One tick of the stream named --name, charged to --principal's budget in --ledger."""
    from topk_middleware.release_keys import ReleaseKeyConflict
    from topk_middleware.streams import trending_top_k
    from topk_middleware.validation import check_common

    try:
        check_common(args.k, args.epsilon, args.delta)
    except (TypeError, ValueError) as error:
        raise UsageError(first_line(error)) from None
    if args.tick is None and (args.period is None or args.start is None):
        raise UsageError("give --tick, or --period and --start: which tick this run answers")
    if args.tick is not None and args.period is not None:
        raise UsageError("--tick or --period/--start, not both")
    if args.mode == "copy":
        raise UsageError("a trending list reads the table as it is: add --mode live")
    ledger = open_ledger(args.ledger, create=False)
    budget = principal_budget(ledger, args.principal)
    with open_store_table(args, read_only=True) as source:
        try:
            stream = trending_top_k(
                source,
                args.k,
                args.epsilon,
                args.horizon,
                budget=budget,
                name=args.name,
                delta=args.delta,
                mechanism=args.mechanism,
                refreshes=args.refreshes,
                period=args.period,
                start=args.start,
            )
            tick = stream.tick(args.tick)
        except (ValueError, TypeError, ReleaseKeyConflict) as error:
            raise UsageError(first_line(error)) from None
    g = tick.guarantee
    if args.json:
        shown = {
            "tick": tick.tick,
            "horizon": g.horizon,
            "items": list(tick.items),
            "fresh": tick.fresh,
            "selected_at": tick.selected_at,
            "guarantee": dataclasses.asdict(g),
        }
        print(json_text(shown))
    else:
        state = "a fresh list" if tick.fresh else f"the list of tick {tick.selected_at} stands"
        print(f"tick {tick.tick} of {g.horizon}: {state}")
        for rank, item in enumerate(tick.items, 1):
            print(f"{rank:>4}  {item}")
        print(f"Guarantee over the stream: {g.derivation}")
    if args.diagnostics:
        print(f"diagnostics: {json_text(tick.diagnostics)}", file=sys.stderr)
    return EXIT_OK
