"""`topk-middleware demo`, on an embedded DuckDB file (demo-data/votes-<m>.duckdb): the first
time it creates a synthetic Zipf table of per-item vote counts inside DuckDB and prepares it
(adapters/duckdb.py); then it releases a private top-k with the private threshold algorithm (Wu,
Ohrimenko, Wirth 2023, Algorithm 3) and, for comparison, with the one-shot mechanism (Algorithm
2, a full scan), and prints the items, the privacy guarantee, and the wall time and rows read of
both. The arguments are checked before any file or directory is created.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from topk_middleware.names import first_line

if TYPE_CHECKING:
    import numpy as np

    from topk_middleware.release import TopKResult

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
