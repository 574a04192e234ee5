"""The worst calls inside the documented work caps, timed at m = 10^6: joint_top_k at its work
and memory caps (mechanisms/joint.py), peeling_top_k at k = 2,000 and at its cap, an oblivious
private_top_k with COUNTS_MAX_K noisy counts (noisy_counts.py), each in a fresh process (its
wall time, padding included, and its peak resident memory, the interpreter's included).

    python -m benchmarks work-caps [--quick]

Target (the privacy promise's denial-of-service bound): no call inside the caps over 10 s or
256 MiB. The JSON goes to benchmarks/results/work_caps.json with the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import common

# One case: (name, m, code run in the child after `source` is built); the child prints JSON.
_CHILD = """
import json, math, resource, time
import numpy as np
from adapters.memory import ArraySource
from topk_middleware import joint_top_k, peeling_top_k, private_top_k
from topk_middleware.mechanisms.joint import JOINT_MAX_WORK, joint_work, smallest_joint_epsilon
m, k, what = {m}, {k}, {what!r}
rng = np.random.default_rng(1)
scores = np.floor(rng.random(m) * 50_000).astype(np.int64)  # dense integers: many thresholds
source = ArraySource(scores)
epsilon = 1.0
if what == "joint":  # the smallest epsilon the work cap admits: the most thresholds
    epsilon = smallest_joint_epsilon(k, m)
    assert joint_work(k, m, epsilon, True) <= JOINT_MAX_WORK
started = time.perf_counter()
if what == "joint":
    joint_top_k(source, k, epsilon, seed=1)
elif what == "peeling":
    peeling_top_k(source, k, epsilon, seed=1)
else:
    private_top_k(source, k, epsilon, oblivious=True, with_counts=True, seed=1)
seconds = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"seconds": seconds, "peak_mib": peak, "epsilon": epsilon}}))
"""

CASES = [
    ("joint k=16 at the work and memory caps", 1_000_000, 16, "joint"),
    ("joint k=1 at the work cap", 1_000_000, 1, "joint"),
    ("joint k=64 at the memory cap (m = 250,000)", 250_000, 64, "joint"),
    ("peeling k=2,000", 1_000_000, 2000, "peeling"),
    ("peeling k=100,000 (its cap)", 1_000_000, 100_000, "peeling"),
    ("oblivious with 4,000 noisy counts", 1_000_000, 4000, "counts"),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="m / 100, for a smoke test")


def run_case(m: int, k: int, what: str) -> dict[str, Any]:
    code = _CHILD.format(m=m, k=k, what=what)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> Path:
    scale = 100 if args.quick else 1
    points = []
    for name, m, k, what in CASES:
        m_run = max(m // scale, 1000)
        k_run = k if scale == 1 else min(4 if what == "joint" else max(1, k // scale), m_run)
        got = run_case(m_run, k_run, what)
        points.append({"case": name, "m": m_run, "k": k_run, **got})
        if not args.quiet:
            print(f"{name}: {got['seconds']:.2f} s, {got['peak_mib']:.0f} MiB peak", flush=True)
    payload = {
        "machine": common.machine_info(),
        "load_average": list(os.getloadavg()),
        "target": {"seconds": 10, "peak_mib": 256},
        "points": points,
        "worst_seconds": max(p["seconds"] for p in points),
        "worst_peak_mib": max(p["peak_mib"] for p in points),
    }
    out = args.out or (common.SCRATCH_DIR if args.quick else common.RESULTS_DIR)
    return common.write_json(Path(out) / f"{args.name or 'work_caps'}.json", payload)


__all__ = ["CASES", "add_arguments", "run"]
