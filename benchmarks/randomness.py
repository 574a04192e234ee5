"""The cost of the secure generator: seeded PCG64 (tests) against ChaCha20 keyed from the OS
(every unseeded release).

    python -m benchmarks.randomness [--runs 21]

Measures (medians): the private threshold run (Gumbel, k = 10, epsilon = 1, lazy oracle) on the
plateau instance of m = 10^6 items served by ArraySource, and a one-shot draw of 10^7 Gumbel
noises. Writes benchmarks/results/randomness.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from adapters.memory import ArraySource
from topk_middleware import private_top_k
from topk_middleware.randomness import secure_rng

from . import common


def median_seconds(work: Callable[[], Any], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args(argv)
    m, k = 10**6, 10
    source = ArraySource(common.family_scores("plateau", m, k).astype(np.float64))
    seeds = iter(range(10**6))
    pcg = {
        "threshold_plateau_1e6_s": median_seconds(
            lambda: private_top_k(source, k, 1.0, seed=next(seeds)), args.runs
        ),
        "oneshot_noises_1e7_s": median_seconds(
            lambda: np.random.default_rng(next(seeds)).gumbel(0.0, 1.0, 10**7), 5
        ),
    }
    chacha = {
        "threshold_plateau_1e6_s": median_seconds(lambda: private_top_k(source, k, 1.0), args.runs),
        "oneshot_noises_1e7_s": median_seconds(lambda: secure_rng().gumbel(0.0, 1.0, 10**7), 5),
    }
    result = {
        "pcg64_seeded": pcg,
        "chacha20_os_keyed": chacha,
        "ratio": {key: chacha[key] / pcg[key] for key in pcg},
        "runs": args.runs,
        "machine": common.machine_info(),
    }
    path = common.RESULTS_DIR / "randomness.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps({key: result[key] for key in ("pcg64_seeded", "chacha20_os_keyed", "ratio")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
