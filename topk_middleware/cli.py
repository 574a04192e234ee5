"""Command line: `python -m topk_middleware demo`."""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from .api import private_top_k


def zipf_histogram(m: int, exponent: float = 1.0, total_votes: float = 1e8) -> np.ndarray:
    """Integer vote counts falling like 1 / rank^exponent, items shuffled so ids carry no order."""
    ranks = np.arange(1, m + 1, dtype=np.float64)
    weights = ranks**-exponent
    counts = np.floor(total_votes * weights / weights.sum())
    return np.random.default_rng(0).permutation(counts)


def demo(m: int, k: int, epsilon: float, seed: int | None) -> None:
    from adapters.memory import ArraySource

    print(f"Building a synthetic Zipf vote histogram of m = {m:,} items ...")
    source = ArraySource(zipf_histogram(m))
    started = time.perf_counter()
    result = private_top_k(source, k=k, epsilon=epsilon, seed=seed)
    elapsed = time.perf_counter() - started
    print(f"\nPrivate top-{k} (private threshold algorithm, {result.privacy.noise} noise):")
    for position, item in enumerate(result.items, 1):
        print(f"  {position:>3}. item {item}")
    p = result.privacy
    print(f"\nPrivacy: ({p.epsilon:.6g}, {p.delta:.3g})-DP, per-item noise scale {p.scale:.6g}")
    print(f"  derived from {p.derivation}")
    a = result.accesses
    bound = 2 * (math.sqrt(m * k) + math.sqrt(m / 2))
    print(
        f"\nAccesses to the data: {a.total:,} ({a.sorted:,} sorted + {a.random:,} random), "
        f"vs {m:,} for a full scan ({a.total / m:.4%});"
        f"\n  Theorem 4.2 bound on the mean: 2(sqrt(mk) + sqrt(m/2)) = {bound:,.0f}"
        f"\n  rows fetched {a.rows_fetched:,} in {a.round_trips} round trips, {elapsed:.3f} s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="topk_middleware")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="release a private top-k from a synthetic vote histogram")
    d.add_argument("--m", type=int, default=10**6)
    d.add_argument("--k", type=int, default=10)
    d.add_argument("--epsilon", type=float, default=1.0)
    d.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    if args.command == "demo":
        demo(args.m, args.k, args.epsilon, args.seed)
    return 0
