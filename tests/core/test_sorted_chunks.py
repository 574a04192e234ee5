"""SortedChunks against a plain dict and a brute-force neighbour search."""

from __future__ import annotations

import itertools

import numpy as np

from topk_middleware.sorted_chunks import SortedChunks


def test_lookups_and_neighbours_match_brute_force() -> None:
    """Batches of every size, in random order: every lookup equals the dict's, every neighbour
    the nearest present key, and the chunks stay geometric (each more than twice the next: at
    most log2(n) + 1 of them)."""
    rng = np.random.default_rng(0)
    chunks, truth = SortedChunks(), {}
    universe = rng.permutation(200_000)
    at = 0
    for size in [1, 3, 64, 500, 2, 7_000, 40, 1, 12_000, 333]:
        keys = universe[at : at + size].astype(np.int64)
        at += size
        values = rng.random(size)
        chunks.add(keys, values)
        truth.update(zip(keys.tolist(), values.tolist(), strict=True))
        assert all(len(a[0]) > 2 * len(b[0]) for a, b in itertools.pairwise(chunks.chunks))
        assert len(chunks) == len(truth)
        probe = rng.integers(0, 200_000, 2_000)
        found, got = chunks.lookup(probe)
        want = np.array([truth.get(int(k), np.nan) for k in probe])
        np.testing.assert_array_equal(found, ~np.isnan(want))
        np.testing.assert_array_equal(got, want)
        present = np.sort(np.fromiter(truth, dtype=np.int64))
        absent = probe[~found]
        below, below_value, above, above_value = chunks.neighbours(absent)
        i = np.searchsorted(present, absent)
        want_below = np.where(i > 0, present[np.maximum(i - 1, 0)], -1)
        want_above = np.where(
            i < len(present), present[np.minimum(i, len(present) - 1)], np.iinfo(np.int64).max
        )
        np.testing.assert_array_equal(below, want_below)
        np.testing.assert_array_equal(above, want_above)
        np.testing.assert_array_equal(
            below_value, [truth[int(k)] if k >= 0 else np.nan for k in want_below]
        )
        np.testing.assert_array_equal(above_value, [truth.get(int(k), np.nan) for k in want_above])
        assert chunks.get(int(keys[0])) == truth[int(keys[0])]
    assert chunks.get(-5) is None
    assert sorted(chunks.all_keys().tolist()) == sorted(truth)
