"""Command line of the benchmarks.

    python -m benchmarks access [--quick] [--runs N] [--max-m M] ...   accesses vs the bounds
    python -m benchmarks wallclock [--quick] [--stores duckdb postgres] ...   real stores
    python -m benchmarks profile [--store duckdb] [--family plateau] ...   where the time goes
    python -m benchmarks freshness [--quick] [--m 1e7] [--rounds 3] ...   releases after writes
    python -m benchmarks freshness-copy [--m 1e6] ...   PostgreSQL / SQLAlchemy copies after writes
    python -m benchmarks sizes [--quick] [--ms 1e3 1e4 ...] ...   every size and state vs the query
    python -m benchmarks replot [--out DIR]   redraw the PNGs of the results' JSON, nothing run
    python -m benchmarks oblivious [--m M] [--stores duckdb postgres postgres-live] ...   vs SQL
    python -m benchmarks spark [--quick] [--ms 1e7 1e8] ...   a SparkTable vs Spark's one-shot
    python -m benchmarks utility [--quick] [--trials 200] ...   precision and error per epsilon
    python -m benchmarks work-caps [--quick]   the worst calls inside the work caps at m = 10^6
    python -m benchmarks redteam [--quick] [--trials 100] ...   the red team's attacks' accuracy
    python -m benchmarks engine-ab --before COMMIT [--m 1e7] ...   two commits side by side

Results (JSON, PNG) go to benchmarks/results/, and those of a --quick run to the scratch folder
benchmarks/scratch/ (not kept by git), unless --out says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import common


def _common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results folder (default: benchmarks/results, benchmarks/scratch for --quick)",
    )
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

    from . import access, freshness, freshness_copy, oblivious, wallclock

    p_access = sub.add_parser("access", help="access cost against sqrt(mk) and Theorem 4.2")
    _common_arguments(p_access)
    access.add_arguments(p_access)

    p_wall = sub.add_parser("wallclock", help="wall clock on DuckDB and PostgreSQL")
    _common_arguments(p_wall)
    wallclock.add_arguments(p_wall)

    p_prof = sub.add_parser("profile", help="profile one threshold run on a store (pyinstrument)")
    _common_arguments(p_prof)
    wallclock.add_profile_arguments(p_prof)

    p_fresh = sub.add_parser("freshness", help="releases after 1%% write rounds vs SQL")
    _common_arguments(p_fresh)
    freshness.add_arguments(p_fresh)

    p_copy = sub.add_parser("freshness-copy", help="copy mode after writes vs SQL (PostgreSQL)")
    _common_arguments(p_copy)
    freshness_copy.add_arguments(p_copy)

    from . import sizes

    p_sizes = sub.add_parser("sizes", help="every table size and state vs the store's query")
    _common_arguments(p_sizes)
    sizes.add_arguments(p_sizes)

    p_replot = sub.add_parser("replot", help="redraw the PNG plots from the JSON results")
    p_replot.add_argument(
        "--out", type=Path, default=common.RESULTS_DIR, help="folder of the JSON and PNG files"
    )
    p_obliv = sub.add_parser("oblivious", help="oblivious releases vs the store's one-shot query")
    _common_arguments(p_obliv)
    oblivious.add_arguments(p_obliv)
    from . import spark

    p_spark = sub.add_parser("spark", help="a SparkTable release vs Spark's own one-shot query")
    _common_arguments(p_spark)
    spark.add_arguments(p_spark)

    from . import utility

    p_utility = sub.add_parser("utility", help="precision and error of every mechanism per epsilon")
    _common_arguments(p_utility)
    utility.add_arguments(p_utility)

    from . import work_caps

    p_caps = sub.add_parser("work-caps", help="the worst calls inside the work caps")
    _common_arguments(p_caps)
    work_caps.add_arguments(p_caps)

    from . import redteam

    p_red = sub.add_parser("redteam", help="the red team's attacks as a distinguisher's accuracy")
    _common_arguments(p_red)
    redteam.add_arguments(p_red)

    from . import engine_ab

    p_ab = sub.add_parser("engine-ab", help="two commits side by side, each against the query")
    _common_arguments(p_ab)
    engine_ab.add_arguments(p_ab)

    args = parser.parse_args(argv)
    if args.command == "replot":
        files = replot(args.out)
        print("written: " + ", ".join(str(f) for f in files), file=sys.stderr)
        return 0
    if args.out is None:
        args.out = common.SCRATCH_DIR if getattr(args, "quick", False) else common.RESULTS_DIR
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
        if args.fold_sweep or args.first_release:
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
        else:  # the default: write rounds on every family
            rcfg = freshness.rounds_config_from_args(args)
            rcfg.seed, rcfg.out = args.seed, args.out
            rcfg.plots, rcfg.quiet = not args.no_plot, args.quiet
            if args.name:
                rcfg.name = args.name
            payload = freshness.rounds_run(rcfg)
            print(freshness.rounds_report(payload))
    elif args.command == "freshness-copy":
        payload = {"files": [str(freshness_copy.main(args))]}
    elif args.command == "sizes":
        payload = {"files": [str(sizes.main(args))]}
    elif args.command == "oblivious":
        ocfg = oblivious.config_from_args(args)
        ocfg.seed, ocfg.out = args.seed, args.out
        if args.name:
            ocfg.name = args.name
        payload = oblivious.run(ocfg)
        print(oblivious.markdown_table(payload))
    elif args.command == "utility":
        return utility.main(args)
    elif args.command == "work-caps":
        payload = {"files": [str(work_caps.run(args))]}
    elif args.command == "engine-ab":
        payload = {"files": [str(engine_ab.main(args))]}
    elif args.command == "redteam":
        payload = {"files": [str(redteam.run(redteam.configure(args)))]}
    elif args.command == "spark":
        cfg = spark.config_from_args(args)
        cfg.seed, cfg.out = args.seed, args.out
        cfg.plots, cfg.quiet = not args.no_plot, args.quiet
        if args.name:
            cfg.name = args.name
        payload = spark.run(cfg)
        print(spark.report(payload))
    else:
        payload = wallclock.profile(args)
        print(json.dumps({k: v for k, v in payload.items() if k != "text"}, indent=2))
    print("written: " + ", ".join(payload.get("files", [])), file=sys.stderr)
    return 0


def replot(folder: Path) -> list[Path]:
    """Redraw the plots of the access, exponential, wallclock and freshness results in `folder`
    from their JSON (the plots' layout changes without a rerun of the measurements)."""
    from . import access, exponential, freshness, wallclock

    files: list[Path] = []
    for path in sorted(folder.glob("*.json")):
        payload = json.loads(path.read_text())
        kind = payload.get("benchmark") if isinstance(payload, dict) else None
        if kind == "access":
            files += access.plot(payload, folder, path.stem)
        elif kind == "wallclock":
            files.append(wallclock.plot(payload, folder, path.stem))
        elif kind == "freshness":
            files.append(freshness.plot(payload, folder, path.stem))
        elif isinstance(kind, str) and kind.startswith("exponential mechanism"):
            exponential.replot(payload, folder / f"{path.stem}.png")
            files.append(folder / f"{path.stem}.png")
    return files


if __name__ == "__main__":
    raise SystemExit(main())
