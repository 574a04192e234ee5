"""The cost of the secure generator: seeded PCG64 (tests) against ChaCha20 keyed from the OS
(every unseeded release).

    python -m benchmarks.randomness [--runs 21] [--quick] [--out DIR]

Measures (medians): the private threshold run (Gumbel, k = 10, epsilon = 1, lazy oracle) on the
plateau instance of m = 10^6 items served by ArraySource, and a one-shot draw of 10^7 Gumbel
noises (--quick: 10^5 items, 10^6 noises, 5 runs). Writes randomness.json to benchmarks/results/
(a --quick run: benchmarks/scratch/), or to --out.
"""

from __future__ import annotations

import argparse
import json
import math
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


def _decade(n: int) -> str:
    return f"1e{round(math.log10(n))}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.randomness",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=None, help="runs per median (default 21)")
    common.add_output_arguments(parser, "10^5 items, 10^6 noises, 5 runs")
    args = parser.parse_args(argv)
    m, noises = (10**5, 10**6) if args.quick else (10**6, 10**7)
    runs = args.runs or (5 if args.quick else 21)
    k = 10
    run_key, noise_key = f"threshold_plateau_{_decade(m)}_s", f"oneshot_noises_{_decade(noises)}_s"
    source = ArraySource(common.family_scores("plateau", m, k).astype(np.float64))
    seeds = iter(range(10**6))
    pcg = {
        run_key: median_seconds(lambda: private_top_k(source, k, 1.0, seed=next(seeds)), runs),
        noise_key: median_seconds(
            lambda: np.random.default_rng(next(seeds)).gumbel(0.0, 1.0, noises), 5
        ),
    }
    chacha = {
        run_key: median_seconds(lambda: private_top_k(source, k, 1.0), runs),
        noise_key: median_seconds(lambda: secure_rng().gumbel(0.0, 1.0, noises), 5),
    }
    result = {
        "pcg64_seeded": pcg,
        "chacha20_os_keyed": chacha,
        "ratio": {key: chacha[key] / pcg[key] for key in pcg},
        "runs": runs,
        "machine": common.machine_info(),
    }
    path = common.output_dir(args) / "randomness.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps({key: result[key] for key in ("pcg64_seeded", "chacha20_os_keyed", "ratio")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
