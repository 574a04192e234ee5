"""The one-shot private top-k (Wu, Ohrimenko, Wirth 2023, Algorithm 2): a full read.

v[i] = h[i] + Z_i for every item, and the k largest are returned. Privacy: Fact 3.3 (Gumbel) or
Fact 3.2 (Laplace), see privacy.py. This is the reference every other top-k mechanism here is
tested against, and the baseline of the benchmarks (m sorted accesses).
"""

from __future__ import annotations

import numpy as np

from ..access import CountedAccess


def top_k_ranks(values: np.ndarray, k: int, keys: np.ndarray | None = None) -> np.ndarray:
    """Indices of the k largest values, best first; ties go to the smaller key (default: index)."""
    if k >= len(values):
        candidates = np.arange(len(values))
    else:
        kth = np.partition(values, len(values) - k)[len(values) - k]
        candidates = np.flatnonzero(values >= kth)
    tie_keys = candidates if keys is None else keys[candidates]
    order = np.lexsort((tie_keys, -values[candidates]))
    return candidates[order][:k]


def oneshot_top_k(access: CountedAccess, noises: np.ndarray, k: int) -> list[int]:
    """Algorithm 2 with the given noise vector (noises[p] belongs to the item at position p):
    the positions of the k largest h + Z, best first (ties: smaller position)."""
    rows = access.read_all()
    positions = np.asarray(rows.positions, dtype=np.int64)
    return positions[top_k_ranks(rows.scores + noises[positions], k, positions)].tolist()
