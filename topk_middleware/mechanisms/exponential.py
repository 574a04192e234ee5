"""The exponential mechanism in O(sqrt(m)) accesses (Wu, Ohrimenko, Wirth 2023, Corollary 4.3).

The exponential mechanism selects item i with probability
exp(epsilon h[i] / D) / sum_j exp(epsilon h[j] / D) (Wu et al., Section 4.1, counts as the
quality), D the source's sensitivity. No factor 2 in the exponent: under add/remove-one-client
neighbours all counts move by at most D in one direction, so the monotone form applies (Durfee &
Rogers 2019, Lemma 4.3); for replace-one-client neighbours it is exp(epsilon h[i] / (2 D)).
Durfee & Rogers (2019) show it is the one-shot mechanism (Algorithm 2) with k = 1 and
Gumbel(D/epsilon) noise, argmax_i h[i] + Z_i (report noisy max with Gumbel noise), as Wu et al.
state before Corollary 4.3. Running that instance through the private threshold algorithm
(Algorithm 3) with the lazy noise oracle (Algorithm 4) gives the same output distribution in
expected O(sqrt(m)) accesses (Theorem 4.2 with k = 1: at most 2 (sqrt(m) + sqrt(m/2))).
Privacy: epsilon-DP by Fact 3.3 with k = 1 (per-item Gumbel scale D/epsilon, privacy.calibrate).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..access import Source
from ..api import TopKResult, private_top_k
from ..release_keys import keyable
from .threshold import Batching


@keyable
def exponential_mechanism(
    source: Source,
    epsilon: float,
    seed: int | np.random.Generator | None = None,
    *,
    batching: Batching | None = None,
    budget: Any = None,
    neighbours: str = "add_remove",
    oblivious: bool = False,
    delta_pad: float = 1e-9,
    deadline: float | None = None,
) -> TopKResult:
    """One item, drawn with probability proportional to exp(epsilon * count / D) (Corollary
    4.3; D the source's sensitivity, Gumbel scale D / epsilon).

    This is `private_top_k(source, k=1, epsilon, noise="gumbel", method="threshold",
    oracle="lazy")`: nothing more. `result.items` holds the one selected id. `seed` is for tests
    only (module randomness). epsilon-DP for add/remove-one-client neighbours;
    `neighbours="replace"`: the same epsilon for replace-one-client neighbours (scale 2D/epsilon,
    probabilities proportional to exp(epsilon * count / (2 D))).
    `oblivious=True`: read at a fixed depth (mechanisms/oblivious.py), the guarantee then
    (epsilon, (1 + e^epsilon) delta_pad) for the release with the server's view of its reads;
    `deadline` as in private_top_k.
    """
    return private_top_k(
        source,
        1,
        epsilon,
        0.0,
        noise="gumbel",
        method="threshold",
        seed=seed,
        oracle="lazy",
        batching=batching,
        budget=budget,
        neighbours=neighbours,  # type: ignore[arg-type]
        oblivious=oblivious,
        delta_pad=delta_pad,
        deadline=deadline,
    )
