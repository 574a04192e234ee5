"""`topk-middleware prepare`, `unprepare` and `check`: what sublinear access needs, built
(the adapter's prepare(), or prepare(refresh=True) with --refresh), removed (uninstall()), and
reported before a run (check(), and is_stale() with --stale). A long prepare shows the time
elapsed on stderr when stderr is a terminal.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from frontends.cli.options import add_table_options, has_copy, open_store_table
from frontends.cli.reporting import EXIT_OK, PROG, UsageError, json_text

if TYPE_CHECKING:
    from adapters._sql import AccessCheck


# ----- prepare -----------------------------------------------------------------------------------
def add_prepare_parser(sub: Any) -> None:
    p = sub.add_parser(
        "prepare",
        help="build what sublinear access needs (a rank-ordered copy, or a live table's index "
        "and positions)",
    )
    add_table_options(p)
    p.add_argument(
        "--refresh",
        action="store_true",
        help="bring an existing copy up to date after writes (copy mode)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress indicator on stderr")
    p.set_defaults(handler=prepare_command)


def prepare_command(args: argparse.Namespace) -> int:
    """The adapter's prepare() (prepare(refresh=True) with --refresh), then its access plan."""
    if args.refresh and args.mode == "live":
        raise UsageError("--refresh is for copy mode: a live table needs no refresh after writes")
    with open_store_table(args, read_only=False) as source:
        started = time.perf_counter()
        with elapsed_progress(f"preparing {source.where}", enabled=not args.no_progress):
            if args.refresh:
                source.prepare(refresh=True)
            else:
                source.prepare()
        seconds = time.perf_counter() - started
        plan = source.check()
    if args.json:
        print(
            json_text(
                {
                    "prepared": plan.store,
                    "mode": args.mode,
                    "refresh": args.refresh,
                    "seconds": seconds,
                    **_plan_dict(plan),
                }
            )
        )
    else:
        what = "refreshed" if args.refresh else "prepared"
        print(f"{what} {plan.store} in {seconds:.1f} s ({args.mode} mode)\n{plan}")
    return EXIT_OK


@contextmanager
def elapsed_progress(description: str, enabled: bool = True) -> Iterator[None]:
    """A progress indicator on stderr (tqdm) while a long step runs: the step is one statement
    in the store with no fraction done to report, so it shows the time elapsed. Shown only when
    stderr is a terminal."""
    from tqdm import tqdm

    bar = tqdm(
        total=None,
        desc=description,
        bar_format="{desc}: {elapsed}",
        file=sys.stderr,
        disable=None if enabled else True,  # None: only on a terminal
        leave=False,
    )
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(0.5):
            bar.refresh()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        stop.set()
        ticker.join()
        bar.close()


# ----- unprepare ---------------------------------------------------------------------------------
def add_unprepare_parser(sub: Any) -> None:
    p = sub.add_parser(
        "unprepare",
        help="remove everything prepare made (the copy, or a live table's index, positions and "
        "triggers); the table of counts is kept",
    )
    add_table_options(p)
    p.set_defaults(handler=unprepare_command)


def unprepare_command(args: argparse.Namespace) -> int:
    """The adapter's uninstall(): drops what prepare() made for this table and mode."""
    with open_store_table(args, read_only=False) as source:
        source.uninstall()
        where = source.where
    if args.json:
        print(json_text({"unprepared": where, "mode": args.mode}))
    else:
        print(f"removed what prepare made for {where} (mode {args.mode})")
    return EXIT_OK


# ----- check -------------------------------------------------------------------------------------
def add_check_parser(sub: Any) -> None:
    p = sub.add_parser(
        "check", help="say how each access kind will be served (index or full scan), before a run"
    )
    add_table_options(p)
    p.add_argument(
        "--stale",
        action="store_true",
        help="also say whether the table changed since the last prepare (one full scan)",
    )
    p.set_defaults(handler=check_command)


def check_command(args: argparse.Namespace) -> int:
    """The adapter's check() (and is_stale() with --stale); exit 0 whatever the plan."""
    with open_store_table(args, read_only=True) as source:
        plan = source.check()
        prepared = None if args.mode == "live" else has_copy(source, args)
        stale = None
        if args.stale:  # a live table is never stale; a table without a copy always is
            stale = source.is_stale() if prepared else prepared is False
    if args.json:
        print(json_text({**_plan_dict(plan), "prepared": prepared, "stale": stale}))
    else:
        print(plan)
        if prepared is False:
            print(f"  no rank-ordered copy: run {PROG} prepare")
        elif stale is not None:
            print(
                f"  the table changed since the last prepare: run {PROG} prepare --refresh"
                if stale
                else "  the table is as it was at the last prepare"
                if prepared
                else "  live mode: runs read the table as it is now"
            )
    return EXIT_OK


def _plan_dict(plan: AccessCheck) -> dict[str, Any]:
    return {
        "store": plan.store,
        "full_scan": plan.full_scan,
        "paths": [dataclasses.asdict(path) for path in plan.paths],
    }
