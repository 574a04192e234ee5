"""Command line: `topk-middleware` (or `python -m frontends`) COMMAND.

`release`, `prepare`, `check` and `budget` work on a table of counts in any store named by a URL
(adapters/url.py: a DuckDB file, postgresql://, any SQLAlchemy URL) and, for budgets, a
PrivacyLedger (ledger.py). `release` prints the release only (items and guarantee, api.Release);
operator diagnostics, which depend on the data, only with --diagnostics and on stderr. Every
failure a user can cause is one line on stderr and an exit code (EXIT_* below), never a traceback.

The demo works on an embedded DuckDB file (demo-data/votes-<m>.duckdb): the first time it creates a
synthetic Zipf table of per-item vote counts inside DuckDB and prepares it (adapters/duckdb.py);
then it releases a private top-k with the private threshold algorithm (Wu, Ohrimenko, Wirth 2023,
Algorithm 3) and, for comparison, with the one-shot mechanism (Algorithm 2, a full scan), and
prints the items, the privacy guarantee, and the wall time and rows read of both.

Size: one argparse parser per command with its handler beside it; the SQL functions'
installer is sql_function.py, its commands sql_cli.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import os
import re
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from adapters.url import (
    DUCKDB_SUFFIXES,
    POSTGRES_SCHEMES,
    StoreArgumentError,
    StoreConnectionError,
    parse_store_url,
    split_table,
)
from adapters.url import (
    MODES as STORE_MODES,
)
from frontends import sql_cli
from topk_middleware.names import (
    METHODS,
    NOISES,
    OBLIVIOUS_METHODS,
    PREVIEW_DEFAULT_METHODS,
    PREVIEW_EPSILONS,
    PREVIEW_METHODS,
    first_line,
    mask_secrets,
)

if TYPE_CHECKING:
    import numpy as np

    from adapters._sql import AccessCheck
    from topk_middleware.ledger import LedgerBudget, PrivacyLedger
    from topk_middleware.release import Diagnostics, Release, TopKResult

DEMO_TABLE = "item_votes"


def zipf_histogram(m: int, exponent: float = 1.0, total_votes: float = 1e8) -> np.ndarray:
    """Integer vote counts falling like 1 / rank^exponent, items shuffled so ids carry no order."""
    import numpy as np

    ranks = np.arange(1, m + 1, dtype=np.float64)
    weights = ranks**-exponent
    counts = np.floor(total_votes * weights / weights.sum())
    return np.random.default_rng(0).permutation(counts)


def _coprime_multiplier(m: int) -> int:
    """A multiplier a with gcd(a, m) = 1, so that r -> (a r + b) mod m permutes 0..m-1."""
    for a in (1_000_003, 7_919, 104_729, 15_485_863):
        if math.gcd(a, m) == 1:
            return a
    raise ValueError(f"no multiplier coprime with m = {m}")  # pragma: no cover


def create_zipf_table(
    con, m: int, exponent: float = 1.0, total_votes: float = 1e8, table: str = DEMO_TABLE
) -> None:
    """A DuckDB table (item BIGINT, votes BIGINT) of m items, generated in SQL.

    The item at Zipf position r (1-based) gets floor(total_votes r^-exponent / H) votes, H the sum
    of the weights; item ids are an affine permutation of 0..m-1 so they carry no order.
    """
    from adapters.duckdb import quote_identifier

    a = _coprime_multiplier(m)
    con.execute(
        f"CREATE TABLE {quote_identifier(table)} AS "
        f"SELECT ((r * {a} + 12345) % {m})::BIGINT AS item, "
        f"floor({float(total_votes)!r} * w / sum(w) OVER ())::BIGINT AS votes "
        f"FROM (SELECT range + 1 AS r, pow(range + 1, -{float(exponent)!r}) AS w "
        f"FROM range({m}))"
    )


def _print_run(label: str, result: TopKResult, seconds: float, m: int) -> None:
    a = result.accesses
    print(
        f"  {label:<34} {seconds * 1000:>10.1f} ms   rows read {a.rows_fetched:>12,} "
        f"({a.rows_fetched / m:.4%} of m) in {a.round_trips} round trips"
    )


def demo(
    m: int, k: int, epsilon: float, seed: int | None, data_dir: Path = Path("demo-data")
) -> None:
    import duckdb

    from adapters.duckdb import DuckDBTable
    from topk_middleware.api import private_top_k

    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / f"votes-{m}.duckdb"
    con = duckdb.connect(str(path))
    try:
        exists = con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [DEMO_TABLE]
        ).fetchone()[0]
        if not exists:
            print(f"Creating {path}: a synthetic Zipf vote table of m = {m:,} items ...")
            started = time.perf_counter()
            create_zipf_table(con, m)
            print(f"  created in {time.perf_counter() - started:.1f} s")
        else:
            print(f"Using {path} (m = {m:,} items; delete it to start afresh)")
        # the demo writes its table once and never again: its copy is current by construction
        source = DuckDBTable(con, DEMO_TABLE, id="item", score="votes", frozen=True)
        if not source.has_rank_table():
            print("Preparing sublinear access (a rank-ordered copy with an index on rank) ...")
            started = time.perf_counter()
            source.prepare()
            print(f"  prepared in {time.perf_counter() - started:.1f} s")
        plan = source.check()
        if plan.full_scan:
            print(plan)

        started = time.perf_counter()
        result = private_top_k(source, k=k, epsilon=epsilon, method="threshold", seed=seed)
        threshold_seconds = time.perf_counter() - started
        started = time.perf_counter()
        full = private_top_k(source, k=k, epsilon=epsilon, method="oneshot_full_read", seed=seed)
        oneshot_seconds = time.perf_counter() - started
    finally:
        con.close()

    print(f"\nPrivate top-{k} (private threshold algorithm, {result.privacy.noise} noise):")
    for position, item in enumerate(result.items, 1):
        print(f"  {position:>3}. item {item}")
    from topk_middleware.release import guarantee_text

    print(f"\n{guarantee_text(result.release())}")
    print("\n== Operator diagnostics (data-dependent, outside the guarantee: not for analysts) ==")
    a = result.accesses
    bound = 2 * (math.sqrt(m * k) + math.sqrt(m / 2))
    print(
        f"\nAccesses as the paper counts them: {a.total:,} ({a.sorted:,} sorted + {a.random:,} "
        f"random); Theorem 4.2 bound on the mean: 2(sqrt(mk) + sqrt(m/2)) = {bound:,.0f}"
    )
    print("\nWall time and rows read from DuckDB, same table, same guarantee:")
    _print_run("private threshold (Algorithm 3)", result, threshold_seconds, m)
    _print_run("one-shot full scan (Algorithm 2)", full, oneshot_seconds, m)
    print(
        f"  the full scan read {full.accesses.rows_fetched / max(a.rows_fetched, 1):,.0f}x the "
        f"rows and took {oneshot_seconds / max(threshold_seconds, 1e-9):,.1f}x the time; its "
        f"top-{k}: {', '.join(str(i) for i in full.items)}"
    )


# ----- the command line ------------------------------------------------------------------------
# `demo` above; `release`, `prepare`, `check` and `budget` below, one function each
# (`<name>_command`), over any store URL (adapters/url.py). Exit codes (README "Command line"):
PROG = "topk-middleware"
EXIT_OK = 0
EXIT_FAILED = 1  # the store, the ledger or the mechanism refused or failed
EXIT_USAGE = 2  # the command line is wrong (argparse's code too): nothing was opened or created
EXIT_BUDGET = 3  # the principal's budget would be exceeded: nothing was read, charged or released
EXIT_INTERRUPTED = 130
STORE_URL_HELP = (
    "the store: a DuckDB file (path.duckdb, path.db, duckdb:///path), postgresql://user@host/db "
    "(psycopg), or any SQLAlchemy URL (sqlite:///path, mysql+pymysql://user@host/db, "
    "postgresql+psycopg://user@host/db)"
)
LEDGER_URL_HELP = (
    "the privacy ledger (topk_middleware/ledger.py): an SQLAlchemy URL, a DuckDB file or "
    "postgresql://user@host/db"
)
NOT_FOR_ANALYSTS = "data-dependent, outside the guarantee: not for analysts"


class UsageError(ValueError):
    """What is wrong with the command line, found before anything is opened or created."""


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
    sql_cli.add_install_sql_parser(sub)
    sql_cli.add_uninstall_sql_parser(sub)
    return parser


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


# ----- demo --------------------------------------------------------------------------------------
def add_demo_parser(sub: Any) -> None:
    d = sub.add_parser(
        "demo", help="release a private top-k from a synthetic vote table in an embedded DuckDB"
    )
    d.add_argument("--m", type=int, default=10**7, help="number of items (default 10^7)")
    d.add_argument("--k", type=int, default=10)
    d.add_argument("--epsilon", type=float, default=1.0)
    d.add_argument("--seed", type=int, default=None)
    d.add_argument(
        "--data-dir", type=Path, default=Path("demo-data"), help="where the DuckDB file lives"
    )


def demo_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    problem = demo_argument_error(args.m, args.k, args.epsilon, args.seed)
    if problem:
        parser.error(problem)  # exit code 2, before any file or directory is created
    try:
        demo(args.m, args.k, args.epsilon, args.seed, args.data_dir)
    except Exception as error:  # no traceback: the message, and a non-zero exit code
        print(f"topk_middleware demo: error: {first_line(error)}", file=sys.stderr)
        return 1
    return 0


# ----- options shared by the store commands ------------------------------------------------------
def _add_table_options(p: argparse.ArgumentParser) -> None:
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


def _open(args: argparse.Namespace, *, read_only: bool) -> Any:
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


def _not_prepared(source: Any) -> RuntimeError:
    return RuntimeError(
        f"{source.where} is not prepared (no rank-ordered copy): run {PROG} prepare on it first"
    )


# ----- release -----------------------------------------------------------------------------------
def add_release_parser(sub: Any) -> None:
    p = sub.add_parser(
        "release",
        help="release a private top-k from a table of counts",
        description="Release the k most voted items under (epsilon, delta)-DP (add/remove-one-"
        "client neighbours). Prints only the release, the items and the guarantee; operator "
        "diagnostics only with --diagnostics, on stderr.",
    )
    _add_table_options(p)
    p.add_argument("--k", type=int, required=True, help="how many items to release")
    p.add_argument("--epsilon", type=float, required=True, help="the release's total epsilon")
    p.add_argument("--delta", type=float, default=0.0, help="the release's total delta (0)")
    p.add_argument("--noise", choices=NOISES, default="gumbel", help="gumbel (ranked) or laplace")
    p.add_argument(
        "--method",
        choices=METHODS,
        default=None,
        help="threshold (sublinear accesses), oneshot (one query in the store where it can, "
        "else a full read), oneshot_full_read; default: private_top_k's (auto)",
    )
    p.add_argument(
        "--sensitivity",
        type=float,
        default=None,
        help="the most one client adds to or removes from one count (default: what from_votes "
        "recorded with the table, else 1; a value below the record is refused); scales the noise",
    )
    p.add_argument(
        "--with-counts", action="store_true", help="also release each item's count, noised"
    )
    p.add_argument(
        "--counts-share", type=float, default=0.5, help="share of epsilon for the counts (0.5)"
    )
    p.add_argument(
        "--adaptive",
        "--no-oblivious",
        dest="oblivious",
        action="store_false",
        help="read adaptively (fewer rows on skewed data, but what the store's observers see "
        "then depends on the counts); default: an oblivious release, whose reads and wall time "
        "depend only on m, k, epsilon, delta and the store (docs/oblivious.md)",
    )
    p.add_argument(
        "--delta-pad",
        type=float,
        default=1e-9,
        help="oblivious releases: the chance that the reads depart from the fixed ones, added "
        "to delta as (1 + e^epsilon) * delta_pad (default 1e-9)",
    )
    p.add_argument("--ledger", metavar="URL", default=None, help=LEDGER_URL_HELP)
    p.add_argument(
        "--principal", default=None, help="whose budget in --ledger pays for the release"
    )
    p.add_argument(
        "--key",
        default=None,
        help="a release key (needs --ledger): a rerun with the same key and options prints the "
        "stored release and charges nothing; the same key with other options is refused",
    )
    p.add_argument(
        "--explain",
        action="store_true",
        help="also print the guarantee's derivation: the facts and theorems it rests on",
    )
    p.add_argument(
        "--diagnostics",
        action="store_true",
        help=f"also print the operator diagnostics, on stderr ({NOT_FOR_ANALYSTS})",
    )
    p.set_defaults(handler=release_command)


def release_command(args: argparse.Namespace) -> int:
    """private_top_k over the table, charged to --principal's budget in --ledger if given."""
    from topk_middleware.api import private_top_k
    from topk_middleware.mechanisms.oblivious import check_delta_pad
    from topk_middleware.noisy_counts import check_counts_share
    from topk_middleware.privacy import check_sensitivity
    from topk_middleware.release import release_dict
    from topk_middleware.release_keys import ReleaseKeyConflict, check_release_key
    from topk_middleware.validation import check_common

    parse_store_url(args.url)
    split_table(args.table, args.schema)
    try:
        if args.key is not None:
            check_release_key(args.key)
        check_common(args.k, args.epsilon, args.delta)
        if args.sensitivity is not None:
            check_sensitivity(args.sensitivity, "--sensitivity")
        if args.with_counts:
            check_counts_share(args.counts_share)
        check_delta_pad(args.delta_pad)
    except (TypeError, ValueError) as error:
        raise UsageError(first_line(error)) from None
    if args.oblivious and args.method not in (None, *OBLIVIOUS_METHODS):
        raise UsageError(
            f"--method {args.method} reads a data-dependent number of rows: add --adaptive to "
            "accept that, or use oneshot_full_read"
        )
    if (args.ledger is None) != (args.principal is None):
        raise UsageError("--ledger and --principal go together: whose budget, in which ledger")
    if args.key is not None and args.ledger is None:
        raise UsageError("--key needs --ledger and --principal: the ledger keeps the key's release")
    ledger = None if args.ledger is None else open_ledger(args.ledger, create=False)
    budget = None if ledger is None else principal_budget(ledger, args.principal)
    options = {} if args.method is None else {"method": args.method}
    if args.key is not None:
        options["release_key"] = args.key
    if args.with_counts:
        options.update(with_counts=True, counts_share=args.counts_share)
    with _open(args, read_only=True) as source:  # --sensitivity: declared, checked there
        one_pass = args.method in ("oneshot", "oneshot_full_read")  # a full read or one query
        needs_copy = args.mode == "copy" and not one_pass and source.reads_copy  # DuckDB: frozen
        if needs_copy and not has_copy(source, args):
            raise _not_prepared(source)  # else every read would be a full scan
        try:
            result = private_top_k(
                source,
                k=args.k,
                epsilon=args.epsilon,
                delta=args.delta,
                noise=args.noise,
                budget=budget,
                oblivious=args.oblivious,
                delta_pad=args.delta_pad,
                **options,
            )
        except ReleaseKeyConflict as error:
            raise UsageError(first_line(error)) from None
        where = source.where
    release = result.release()
    if args.json:
        print(_json(release_dict(release)))
    else:
        print(_release_text(release, where, args.explain))
    if args.diagnostics:
        _print_diagnostics(result.diagnostics, args.json)
    return EXIT_OK


def _release_text(release: Release, where: str, explain: bool) -> str:
    from topk_middleware.release import guarantee_text

    order = "best first" if release.ranked else "a set: the order is not a ranking"
    lines = [f"Private top-{len(release.items)} of {where} ({order}):", "", _items_table(release)]
    lines += ["", guarantee_text(release, derivation=explain)]
    return "\n".join(lines)


def _items_table(release: Release) -> str:
    from topk_middleware.release import plain

    header = ("position" if release.ranked else "#", "item")
    rows = [(str(i), str(plain(item))) for i, item in enumerate(release.items, 1)]
    width = max(len(header[0]), *(len(r[0]) for r in rows))
    if release.counts is not None:  # a third column: the noisy counts
        names = max(len(header[1]), *(len(r[1]) for r in rows))
        counts = [str(c) for c in release.counts]
        table = [(*header, "count"), *((a, b, c) for (a, b), c in zip(rows, counts, strict=True))]
        return "\n".join(f"  {a:>{width}}  {b:<{names}}  {c}" for a, b, c in table)
    return "\n".join(f"  {a:>{width}}  {b}" for a, b in [header, *rows])


def _print_diagnostics(diagnostics: Diagnostics, as_json: bool) -> None:
    """Operator diagnostics on stderr, apart from the release on stdout."""
    fields = dataclasses.asdict(diagnostics)
    if as_json:
        print(_json({"diagnostics": fields}), file=sys.stderr)
        return
    a = diagnostics.accesses
    seconds = diagnostics.timings.get("total")
    print(
        f"\n== Operator diagnostics ({NOT_FOR_ANALYSTS}) ==\n"
        f"method {diagnostics.method}, m = {diagnostics.m:,}; accesses {a.total:,} ({a.sorted:,} "
        f"sorted + {a.random:,} random); rows fetched {a.rows_fetched:,} in {a.round_trips:,} "
        "round trips"
        + ("" if seconds is None else f"; {seconds * 1000:.1f} ms")
        + f"; plan {diagnostics.plan}",
        file=sys.stderr,
    )


# ----- prepare -----------------------------------------------------------------------------------
def add_prepare_parser(sub: Any) -> None:
    p = sub.add_parser(
        "prepare",
        help="build what sublinear access needs (a rank-ordered copy, or a live table's index "
        "and positions)",
    )
    _add_table_options(p)
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
    with _open(args, read_only=False) as source:
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
            _json(
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
    _add_table_options(p)
    p.set_defaults(handler=unprepare_command)


def unprepare_command(args: argparse.Namespace) -> int:
    """The adapter's uninstall(): drops what prepare() made for this table and mode."""
    with _open(args, read_only=False) as source:
        source.uninstall()
        where = source.where
    if args.json:
        print(_json({"unprepared": where, "mode": args.mode}))
    else:
        print(f"removed what prepare made for {where} (mode {args.mode})")
    return EXIT_OK


# ----- check -------------------------------------------------------------------------------------
def add_check_parser(sub: Any) -> None:
    p = sub.add_parser(
        "check", help="say how each access kind will be served (index or full scan), before a run"
    )
    _add_table_options(p)
    p.add_argument(
        "--stale",
        action="store_true",
        help="also say whether the table changed since the last prepare (one full scan)",
    )
    p.set_defaults(handler=check_command)


def check_command(args: argparse.Namespace) -> int:
    """The adapter's check() (and is_stale() with --stale); exit 0 whatever the plan."""
    with _open(args, read_only=True) as source:
        plan = source.check()
        prepared = None if args.mode == "live" else has_copy(source, args)
        stale = None
        if args.stale:  # a live table is never stale; a table without a copy always is
            stale = source.is_stale() if prepared else prepared is False
    if args.json:
        print(_json({**_plan_dict(plan), "prepared": prepared, "stale": stale}))
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


# ----- preview -----------------------------------------------------------------------------------
def add_preview_parser(sub: Any) -> None:
    p = sub.add_parser(
        "preview",
        help="the table owner's preview: how good a private top-k would be at each epsilon",
        description="For the table's owner only: predicts precision@k, k-relative error and "
        "near-zero items per epsilon and mechanism from the exact counts (one read of the score "
        "histogram). Not a private release; charges nothing; never show it to analysts.",
    )
    _add_table_options(p)
    p.add_argument("--k", type=int, required=True, help="how many items a release would hold")
    p.add_argument(
        "--epsilons",
        type=float,
        nargs="+",
        default=list(PREVIEW_EPSILONS),
        help=f"the total epsilons to preview (default: {' '.join(map(str, PREVIEW_EPSILONS))})",
    )
    p.add_argument(
        "--methods",
        nargs="+",
        choices=PREVIEW_METHODS,
        default=list(PREVIEW_DEFAULT_METHODS),
        help=f"the mechanisms to preview (default: {' '.join(PREVIEW_DEFAULT_METHODS)})",
    )
    p.add_argument(
        "--delta", type=float, default=1e-6, help="the releases' delta (1e-6; limited domain > 0)"
    )
    p.add_argument("--trials", type=int, default=200, help="simulated releases per point (200)")
    p.set_defaults(handler=preview_command)


def preview_command(args: argparse.Namespace) -> int:
    """preview() over the table: the owner's tool, no budget, no release."""
    from topk_middleware.preview import check_preview_arguments, preview

    parse_store_url(args.url)
    split_table(args.table, args.schema)
    try:
        check_preview_arguments(args.k, args.epsilons, args.methods, args.delta, args.trials)
    except (TypeError, ValueError) as error:
        raise UsageError(first_line(error)) from None
    with _open(args, read_only=True) as source:
        found = preview(
            source,
            args.k,
            epsilons=args.epsilons,
            methods=args.methods,
            delta=args.delta,
            trials=args.trials,
        )
    print(_json(found.as_dict()) if args.json else found)
    return EXIT_OK


# ----- trend -------------------------------------------------------------------------------------
# One tick of a trending list (topk_middleware/streams.py), for a scheduler to call once per
# period: the stream lives in the ledger under --principal and --name, a run retried within its
# period prints the stored answer and charges nothing.
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
    _add_table_options(p)
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
    with _open(args, read_only=True) as source:
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
        print(_json(shown))
    else:
        state = "a fresh list" if tick.fresh else f"the list of tick {tick.selected_at} stands"
        print(f"tick {tick.tick} of {g.horizon}: {state}")
        for rank, item in enumerate(tick.items, 1):
            print(f"{rank:>4}  {item}")
        print(f"Guarantee over the stream: {g.derivation}")
    if args.diagnostics:
        print(f"diagnostics: {_json(tick.diagnostics)}", file=sys.stderr)
    return EXIT_OK


# ----- budget ------------------------------------------------------------------------------------
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
        print(_json(shown))
    else:
        per = "" if window is None else f" per {window}"
        where = "" if since is None else f" in the {window} from {since:%Y-%m-%d %H:%M} UTC"
        print(
            f"principal {args.principal!r}: total ({budget.epsilon:.6g}, {budget.delta:.3g})-DP"
            f"{per}; spent ({spent.epsilon:.6g}, {spent.delta:.3g})-DP over {releases} "
            f"release(s){where}" + ("" if not releases else f" ({spent.rule})")
        )
    return EXIT_OK


def ledger_url(text: str) -> str:
    """The SQLAlchemy URL of a ledger given as a DuckDB file, a postgresql:// URI or a URL."""
    if "://" not in text and text.lower().endswith(DUCKDB_SUFFIXES):
        return "duckdb:///" + text
    for scheme in POSTGRES_SCHEMES:
        if text.startswith(scheme):
            return "postgresql+psycopg://" + text[len(scheme) :]
    return text


def open_ledger(text: str, *, create: bool) -> PrivacyLedger:
    """The PrivacyLedger at `text`. Unless `create`, it must already be one: no file and no
    table is created by a command that only reads or charges it."""
    import sqlalchemy as sa

    from adapters.ledger import PRINCIPALS as LEDGER_PRINCIPALS
    from topk_middleware.ledger import PrivacyLedger

    try:
        url = sa.make_url(ledger_url(text))
    except (sa.exc.ArgumentError, ValueError):  # ValueError's message may quote the password
        raise UsageError(
            f"--ledger {mask_secrets(text)!r} is not a URL: expected {LEDGER_URL_HELP}"
        ) from None
    shown = url.render_as_string(hide_password=True)
    if url.get_backend_name() in ("sqlite", "duckdb"):
        database = url.database or ""
        if database in ("", ":memory:"):
            raise UsageError(f"--ledger {shown!r}: an in-memory ledger keeps nothing; name a file")
        if not create and not Path(database).is_file():
            raise UsageError(f"no ledger file at {database!r} (grant a budget first)")
        if not Path(database).exists():
            return PrivacyLedger(url)  # a new file, created 0600 by the ledger itself
    try:
        engine = sa.create_engine(url)
    except (ImportError, sa.exc.ArgumentError) as error:
        raise UsageError(
            f"--ledger {shown}: SQLAlchemy cannot load its driver ({first_line(error)})"
        ) from None
    try:
        with engine.connect() as conn:
            exists = sa.inspect(conn).has_table(LEDGER_PRINCIPALS)
    except sa.exc.DBAPIError as error:
        raise StoreConnectionError(
            f"cannot connect to the ledger at {shown}: {first_line(error.orig)}"
        ) from None
    finally:
        engine.dispose()
    if not exists and not create:
        raise LookupError(
            f"no privacy ledger at {shown}: grant a budget first ({PROG} budget --ledger URL "
            "--principal NAME --grant EPSILON)"
        )
    return PrivacyLedger(url)


def principal_budget(ledger: PrivacyLedger, principal: str) -> LedgerBudget:
    """The budget of a principal already in the ledger, with the total stored there."""
    try:
        epsilon, delta = ledger.total(principal)
    except KeyError:
        raise LookupError(
            f"principal {principal!r} has no budget in this ledger: grant one with {PROG} "
            f"budget --ledger URL --principal {principal} --grant EPSILON"
        ) from None
    return ledger.budget(principal, epsilon, delta, ledger.window(principal))


def _json(value: Any) -> str:
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


def demo_argument_error(m: int, k: int, epsilon: float, seed: int | None) -> str | None:
    """What is wrong with the demo's arguments, in words (None if nothing): checked before the
    DuckDB file is created, so a refused command leaves nothing behind."""
    if m < 1:
        return f"--m must be >= 1 (the number of items), got {m}"
    if k < 1:
        return f"--k must be >= 1, got {k}"
    if k > m:
        return f"--k = {k} exceeds the number of items --m = {m}"
    if not (math.isfinite(epsilon) and epsilon > 0):
        return f"--epsilon must be finite and > 0, got {epsilon}"
    if seed is not None and seed < 0:
        return f"--seed must be >= 0, got {seed}"
    return None
