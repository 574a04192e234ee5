"""`topk-middleware preview`: the table owner's preview (topk_middleware/preview.py) of how good
a private top-k would be at each epsilon and mechanism, from the exact counts. Not a private
release; charges nothing; never shown to analysts.
"""

from __future__ import annotations

import argparse
from typing import Any

from adapters.url import parse_store_url, split_table
from frontends.cli.options import add_table_options, open_store_table
from frontends.cli.reporting import EXIT_OK, UsageError, json_text
from topk_middleware.names import (
    PREVIEW_DEFAULT_METHODS,
    PREVIEW_EPSILONS,
    PREVIEW_METHODS,
    first_line,
)


def add_preview_parser(sub: Any) -> None:
    p = sub.add_parser(
        "preview",
        help="the table owner's preview: how good a private top-k would be at each epsilon",
        description="For the table's owner only: predicts precision@k, k-relative error and "
        "near-zero items per epsilon and mechanism from the exact counts (one read of the score "
        "histogram). Not a private release; charges nothing; never show it to analysts.",
    )
    add_table_options(p)
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
    with open_store_table(args, read_only=True) as source:
        found = preview(
            source,
            args.k,
            epsilons=args.epsilons,
            methods=args.methods,
            delta=args.delta,
            trials=args.trials,
        )
    print(json_text(found.as_dict()) if args.json else found)
    return EXIT_OK
