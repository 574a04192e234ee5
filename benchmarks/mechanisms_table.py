"""Measured data access of every mechanism, for the README's "Mechanisms" table.

    python -m benchmarks.mechanisms_table [--m 1000000] [--runs 20] [--k 10] [--out DIR]

Every mechanism runs on an ArraySource through CountedAccess, so `sorted` / `random` are the
accesses as the paper counts them. Two histograms of m items:

* zipf: frontends.cli.zipf_histogram(m) (10^8 votes falling like 1/rank, shuffled ids);
* plateau: the lower-bound instance of Wu et al. Theorem 5.4 (benchmarks.common), the hard case
  for sublinear access.

Parameters (k = 10): pure mechanisms at epsilon = 1; limited domain at per-item epsilon = 0.1
(Theorem 1: (1, 1e-6)-DP at delta' = 0, or 0.88 at delta' = 1e-6), k_bar = 100; StableTopK at
rho = 0.05, delta_t = 1e-6, k_bar = 100 (capped) or uncapped. Writes
benchmarks/results/mechanisms_table.json: per mechanism and histogram the mean / min / max of the
accesses over `runs` seeds, the mean number of items, how often bottom came out, and the guarantee.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from adapters.memory import ArraySource
from benchmarks import common
from frontends.cli import zipf_histogram
from topk_middleware import (
    exponential_mechanism,
    joint_top_k,
    limited_domain_top_k,
    peeling_top_k,
    private_top_k,
    stable_top_k,
)

EPSILON, DELTA, K_BAR, RHO, DELTA_T = 1.0, 1e-6, 100, 0.05, 1e-6

Runner = Callable[[ArraySource, int, int], Any]

# name -> (paper and algorithm, data access, output, runner(source, k, seed))
MECHANISMS: dict[str, tuple[str, str, str, Runner]] = {
    "private_top_k threshold": (
        "Wu, Ohrimenko, Wirth 2023, Alg. 3 (+ lazy oracle, Alg. 4)",
        "sorted + random",
        "ranked list (Gumbel)",
        lambda s, k, seed: private_top_k(s, k, EPSILON, seed=seed),
    ),
    "private_top_k oneshot": (
        "Wu, Ohrimenko, Wirth 2023, Alg. 2",
        "full read",
        "ranked list (Gumbel)",
        lambda s, k, seed: private_top_k(s, k, EPSILON, method="oneshot_full_read", seed=seed),
    ),
    "exponential_mechanism": (
        "Wu, Ohrimenko, Wirth 2023, Cor. 4.3 (k = 1)",
        "sorted + random",
        "one item",
        lambda s, k, seed: exponential_mechanism(s, EPSILON, seed=seed),
    ),
    "peeling_top_k": (
        "Durfee & Rogers 2019, Sec. 4.1 (peeling EM)",
        "full read",
        "ranked list",
        lambda s, k, seed: peeling_top_k(s, k, EPSILON, seed=seed),
    ),
    "joint_top_k": (
        "Gillenwater et al. 2022, Alg. 1 (JOINT)",
        "sorted prefix (+ random for drawn tail ranks); full read when tied",
        "set",
        lambda s, k, seed: joint_top_k(s, k, EPSILON, seed=seed),
    ),
    "limited_domain_top_k": (
        "Durfee & Rogers 2019, Alg. 1 (LimitDom)",
        "sorted only (k_bar + 1)",
        "ranked list, possibly fewer than k + bottom",
        lambda s, k, seed: limited_domain_top_k(s, k, K_BAR, EPSILON / k, DELTA, seed=seed),
    ),
    "stable_top_k capped (A2)": (
        "Zhu & Wang 2022, Alg. 2 (A1 + A4), k_bar cap",
        "sorted only (k_bar + 1)",
        "set of adaptive size k~, or bottom",
        lambda s, k, seed: stable_top_k(s, RHO, DELTA_T, k_bar=K_BAR, seed=seed),
    ),
    "stable_top_k uncapped (A2)": (
        "Zhu & Wang 2022, Alg. 2 (A1 + A4)",
        "full read",
        "set of adaptive size k~, or bottom",
        lambda s, k, seed: stable_top_k(s, RHO, DELTA_T, seed=seed),
    ),
    "stable_top_k target k (A3)": (
        "Zhu & Wang 2022, Alg. 3 (A2 at rho/2 + EM fallback via Alg. 3 of Wu et al.)",
        "sorted prefix; + sorted/random of the threshold algorithm on fallback",
        "set of exactly k",
        lambda s, k, seed: stable_top_k(s, RHO, DELTA_T, k=k, k_bar=K_BAR, seed=seed),
    ),
}


def histograms(m: int, k: int) -> dict[str, np.ndarray]:
    return {
        "zipf": zipf_histogram(m),
        "plateau": common.family_scores("plateau", m, k).astype(np.float64),
    }


def measure(m: int, k: int, runs: int, quiet: bool) -> list[dict[str, Any]]:
    rows = []
    for family, scores in histograms(m, k).items():
        source = ArraySource(scores)
        for name, (paper, access, output, run) in MECHANISMS.items():
            results, seconds = [], []
            for seed in common.progress(range(runs), desc=f"{family} {name}", quiet=quiet):
                started = time.perf_counter()
                results.append(run(source, k, seed))
                seconds.append(time.perf_counter() - started)
            last = results[-1]
            cost = getattr(last, "cost", None)
            rows.append(
                {
                    "family": family,
                    "mechanism": name,
                    "paper": paper,
                    "data_access": access,
                    "output": output,
                    "sorted": common.summarize(r.accesses.sorted for r in results),
                    "random": common.summarize(r.accesses.random for r in results),
                    "total": common.summarize(r.accesses.total for r in results),
                    "rows_fetched": common.summarize(r.accesses.rows_fetched for r in results),
                    "items": common.summarize(len(r.items) for r in results),
                    "bottom_rate": float(np.mean([getattr(r, "bottom", False) for r in results])),
                    "seconds": common.summarize(seconds),
                    "epsilon": last.privacy.epsilon,
                    "delta": last.privacy.delta,
                    "derivation": last.privacy.derivation,
                    "rho": None if cost is None else cost.rho,
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mechanisms_table")
    parser.add_argument("--m", type=int, default=10**6)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", type=Path, default=common.RESULTS_DIR / "mechanisms_table.json")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    machine = common.machine_info()
    machine["command"] = "python -m benchmarks.mechanisms_table " + " ".join(sys.argv[1:])
    payload = {
        "machine": machine,
        "config": {
            "m": args.m,
            "k": args.k,
            "runs": args.runs,
            "epsilon": EPSILON,
            "limited_domain": {
                "epsilon_per_item": EPSILON / args.k,
                "delta": DELTA,
                "k_bar": K_BAR,
            },
            "stable": {"rho": RHO, "delta_t": DELTA_T, "k_bar": K_BAR},
        },
        "rows": measure(args.m, args.k, args.runs, args.quiet),
    }
    path = common.write_json(args.out, payload)
    for row in payload["rows"]:
        print(
            f"{row['family']:8} {row['mechanism']:28} total mean {row['total']['mean']:>11,.1f}"
            f" (sorted {row['sorted']['mean']:,.1f}, random {row['random']['mean']:,.1f})"
            f" items {row['items']['mean']:.1f} bottom {row['bottom_rate']:.2f}"
        )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
