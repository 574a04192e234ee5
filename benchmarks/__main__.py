"""Command line of the benchmarks.

    python -m benchmarks access [--quick] [--runs N] [--max-m M] ...   accesses vs the bounds
    python -m benchmarks wallclock [--quick] [--stores duckdb postgres] ...   real stores
    python -m benchmarks profile [--store duckdb] [--family plateau] ...   where the time goes
    python -m benchmarks freshness [--quick] [--stores duckdb] ...   the first release after writes

Results (JSON, PNG) go to benchmarks/results/ unless --out says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import common


def _common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=common.RESULTS_DIR, help="results folder")
    parser.add_argument("--name", default=None, help="file name stem of the results")
    parser.add_argument("--jobs", type=int, default=None, help="worker processes (default: cpus)")
    parser.add_argument("--seed", type=int, default=0, help="base seed of the runs")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG plots")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    from . import access, freshness, wallclock

    p_access = sub.add_parser("access", help="access cost against sqrt(mk) and Theorem 4.2")
    _common_arguments(p_access)
    access.add_arguments(p_access)

    p_wall = sub.add_parser("wallclock", help="wall clock on DuckDB and PostgreSQL")
    _common_arguments(p_wall)
    wallclock.add_arguments(p_wall)

    p_prof = sub.add_parser("profile", help="profile one threshold run on a store (pyinstrument)")
    _common_arguments(p_prof)
    wallclock.add_profile_arguments(p_prof)

    p_fresh = sub.add_parser("freshness", help="refresh + release after 1% writes vs SQL")
    _common_arguments(p_fresh)
    freshness.add_arguments(p_fresh)

    args = parser.parse_args(argv)
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    jobs = args.jobs or usable or 1

    if args.command == "access":
        cfg = access.config_from_args(args)
        cfg.jobs, cfg.seed, cfg.out = jobs, args.seed, args.out
        cfg.plots, cfg.quiet = not args.no_plot, args.quiet
        if args.name:
            cfg.name = args.name
        payload = access.run(cfg)
        print(access.report(payload))
    elif args.command == "wallclock":
        cfg = wallclock.config_from_args(args)
        cfg.seed, cfg.out = args.seed, args.out
        cfg.plots, cfg.quiet = not args.no_plot, args.quiet
        if args.name:
            cfg.name = args.name
        payload = wallclock.run(cfg)
        print(wallclock.report(payload))
    elif args.command == "freshness":
        cfg = freshness.config_from_args(args)
        cfg.seed, cfg.out = args.seed, args.out
        cfg.plots, cfg.quiet = not args.no_plot, args.quiet
        if args.name:
            cfg.name = args.name
        if args.fold_sweep:
            payload = freshness.fold_sweep(cfg)
            print(freshness.fold_report(payload))
        else:
            payload = freshness.run(cfg)
            print(freshness.report(payload))
    else:
        payload = wallclock.profile(args)
        print(json.dumps({k: v for k, v in payload.items() if k != "text"}, indent=2))
    print("written: " + ", ".join(payload.get("files", [])), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
