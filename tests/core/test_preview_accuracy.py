"""The preview's numbers on the benchmark's real data sets (benchmarks/utility_data.py) and on
the synthetic families: its predicted precision@k and median k-relative error against 200
measured releases of private_top_k (the default, threshold with Gumbel noise) and of the
limited-domain mechanism at the k_bar the preview picks, fixed seeds, at two epsilons per data
set chosen where the figures move (precision below 1, or a median error not 0). Tolerance: 0.05
in precision, 10% in the median error (or both zero). The preview runs 1,000 trials, so that
the tolerance covers the 200 measured releases' own spread: a median over 200 draws moves by
about 1.25 IQR / (1.35 sqrt(200)), 5-7% of the median at these points. A preview that drew the
wrong law (a noise scale off by 2x, the tail's Binomial counts dropped) misses by far more.
Where errors take few values (Zipf counts near the k-th), a median may sit at a step of their
distribution, where the share of errors at or below one value is about 1/2: it then flips
between that value and the next with a few draws. Two medians that differ by more than 10% pass
only as such a step: the measured releases put 1/2 +- 0.07 (two standard errors of a share
over 200 draws) of their errors at or below the lower one and below the upper one, i.e.
nothing measured lies between them and the distribution crosses 1/2 there (words, k = 100,
epsilon 0.5: P(error <= 72) = 0.49 in 4,000 simulated and 600 measured releases, medians 72
or 95 by the draw). The full comparison, every mechanism and epsilon,
is in benchmarks/results/utility.json ("preview:" rows beside the measured ones). Cost: about
10 CPU seconds.
"""

from __future__ import annotations

import numpy as np
import pytest

from adapters.memory import ArraySource
from benchmarks import common
from benchmarks.utility_data import load
from topk_middleware import limited_domain_top_k, preview, private_top_k
from topk_middleware.preview import limited_domain_item_epsilon, release_figures

TRIALS, DELTA = 200, 1e-6
# (data set, k, two epsilons where the figures move: precision below 1 or a median error not 0)
POINTS = [
    ("words", 100, (0.1, 0.5)),
    ("unicode", 100, (0.5, 1.0)),
    ("senses", 10, (0.1, 0.5)),
    ("senses", 100, (1.0, 2.0)),
    ("zipf", 100, (0.5, 1.0)),
    ("plateau", 10, (0.25, 1.0)),
]


def scores_of(name: str, k: int) -> np.ndarray:
    if name in ("zipf", "plateau"):
        return np.asarray(common.family_scores(name, 10_000, k), dtype=np.float64)
    return load(name)


def measured(scores: np.ndarray, k: int, release) -> tuple[float, np.ndarray]:
    values = np.full((TRIALS, k), np.nan)
    for seed in range(TRIALS):
        items = np.asarray(release(seed), dtype=np.int64)  # ids are ranks
        values[seed, : len(items)] = scores[items]
    kth = float(scores[k - 1])
    precision, error, _ = release_figures(values, kth, 0.01 * kth, k)
    return float(precision.mean()), error


def medians_agree(predicted: float, errors: np.ndarray) -> bool:
    """Within 10% of the measured median, or on either side of one step of the measured errors'
    distribution where it crosses 1/2 (module docstring)."""
    observed = float(np.median(errors))
    if abs(predicted - observed) <= 0.1 * observed + 1e-9:
        return True
    lower, upper = sorted((predicted, observed))
    return bool(np.mean(errors <= lower) >= 0.43 and np.mean(errors < upper) <= 0.57)


@pytest.mark.parametrize(("name", "k", "epsilons"), POINTS, ids=[f"{p[0]}-k{p[1]}" for p in POINTS])
def test_preview_predicts_measured_precision_and_error(name: str, k: int, epsilons) -> None:
    scores = scores_of(name, k)
    source = ArraySource(scores)
    found = preview(
        source,
        k,
        epsilons=epsilons,
        methods=["threshold", "limited_domain"],
        delta=DELTA,
        trials=1000,
    )
    for epsilon in epsilons:
        limited = found.outcome("limited_domain", epsilon)
        item = limited_domain_item_epsilon(k, epsilon, DELTA / 2)
        observed = {
            "threshold": measured(
                scores,
                k,
                lambda s, e=epsilon: (
                    private_top_k(source, k, e, DELTA, method="threshold", seed=s).items
                ),
            ),
            "limited_domain": measured(
                scores,
                k,
                lambda s, k_bar=limited.k_bar, item=item: (
                    limited_domain_top_k(
                        source, k, k_bar, item, DELTA / 2, delta_prime=DELTA / 2, seed=s
                    ).items
                ),
            ),
        }
        for method, (precision, errors) in observed.items():
            got = found.outcome(method, epsilon)
            assert abs(got.precision - precision) <= 0.05, (name, epsilon, method, got, precision)
            assert medians_agree(got.median_error, errors), (
                name,
                epsilon,
                method,
                got,
                float(np.median(errors)),
            )


def test_utility_benchmark_quick_run(tmp_path) -> None:
    """python -m benchmarks utility --quick on the smallest data set: the preview's rows beside
    the measured ones, every figure in range, and a PNG per data set."""
    import json

    from benchmarks.__main__ import main

    argv = ["utility", "--quick", "--data", "unicode", "--trials", "10", "--jobs", "1"]
    argv += ["--mechanisms", "threshold", "limited_domain", "opendp_gumbel", "--out", str(tmp_path)]
    assert main(argv) == 0
    rows = json.loads((tmp_path / "utility.json").read_text())["rows"]
    kinds = {row["mechanism"] for row in rows}
    assert {"preview:threshold", "threshold", "limited_domain", "opendp_gumbel"} <= kinds
    for row in rows:
        assert 0.0 <= row["precision"] <= 1.0 and row["error_q25"] <= row["error_median"]
        assert row["error_median"] <= row["error_q75"]
    assert (tmp_path / "utility_unicode.png").read_bytes()[:4] == b"\x89PNG"
