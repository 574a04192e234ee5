"""`topk-middleware release`: private_top_k over a table of counts, charged to --principal's
budget in --ledger if given. It prints the release only (items and guarantee, api.Release), as
a table or JSON; operator diagnostics, which depend on the data, only with --diagnostics and on
stderr. Every argument is checked before the store is opened.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TYPE_CHECKING, Any

from adapters.url import parse_store_url, split_table
from frontends.cli.ledger import LEDGER_URL_HELP, open_ledger, principal_budget
from frontends.cli.options import (
    NOT_FOR_ANALYSTS,
    add_table_options,
    has_copy,
    not_prepared,
    open_store_table,
)
from frontends.cli.reporting import EXIT_OK, UsageError, json_text
from topk_middleware.names import METHODS, NOISES, OBLIVIOUS_METHODS, first_line

if TYPE_CHECKING:
    from topk_middleware.release import Diagnostics, Release


def add_release_parser(sub: Any) -> None:
    p = sub.add_parser(
        "release",
        help="release a private top-k from a table of counts",
        description="Release the k most voted items under (epsilon, delta)-DP (add/remove-one-"
        "client neighbours). Prints only the release, the items and the guarantee; operator "
        "diagnostics only with --diagnostics, on stderr.",
    )
    add_table_options(p)
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
    with open_store_table(args, read_only=True) as source:  # --sensitivity: declared, checked there
        one_pass = args.method in ("oneshot", "oneshot_full_read")  # a full read or one query
        needs_copy = args.mode == "copy" and not one_pass and source.reads_copy  # DuckDB: frozen
        if needs_copy and not has_copy(source, args):
            raise not_prepared(source)  # else every read would be a full scan
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
        print(json_text(release_dict(release)))
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
        print(json_text({"diagnostics": fields}), file=sys.stderr)
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
