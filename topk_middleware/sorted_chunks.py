"""SortedChunks: a map from int64 keys to float64 values, filled in batches, read in batches.

Used where a run learns values for scattered keys and must look many up at once: scores known
beyond the fetched prefix (access.py) and the noises of placed items (lazy_noise.py). A batch
becomes a sorted chunk; a chunk is merged into the previous one while that one is at most twice
its size, so a run holds O(log n) chunks, n insertions cost O(n log n) in all (a merge of two
sorted runs is one linear stable sort), and a lookup is one vectorised search per chunk.
"""

from __future__ import annotations

import numpy as np


class SortedChunks:
    def __init__(self) -> None:
        self.chunks: list[tuple[np.ndarray, np.ndarray]] = []  # (keys ascending, values)
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def add(self, keys: np.ndarray, values: np.ndarray, order: np.ndarray | None = None) -> None:
        """Add distinct keys that are not present (`order`: their argsort, if known)."""
        if not len(keys):
            return
        if order is None:
            order = np.argsort(keys)
        self.chunks.append((keys[order], values[order]))
        self.count += len(keys)
        while len(self.chunks) >= 2 and len(self.chunks[-2][0]) <= 2 * len(self.chunks[-1][0]):
            (a, va), (b, vb) = self.chunks.pop(), self.chunks.pop()
            merged = np.concatenate([b, a])
            order = np.argsort(merged, kind="stable")  # two sorted runs: a linear merge
            self.chunks.append((merged[order], np.concatenate([vb, va])[order]))

    def get(self, key: int) -> float | None:
        """The value of one key, or None."""
        for keys, values in self.chunks:
            i = int(keys.searchsorted(key))
            if i < len(keys) and keys[i] == key:
                return float(values[i])
        return None

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found mask, values) of many keys; values are NaN where not found. Sorted keys search
        fastest."""
        found = np.zeros(len(keys), dtype=bool)
        values = np.full(len(keys), np.nan)
        for chunk, chunk_values in self.chunks:
            i = np.minimum(np.searchsorted(chunk, keys), len(chunk) - 1)
            hit = chunk[i] == keys
            found |= hit
            values[hit] = chunk_values[i[hit]]
        return found, values

    def neighbours(self, keys: np.ndarray) -> tuple[np.ndarray, ...]:
        """For keys not present: the nearest key below and above each, with its value (key -1 /
        NaN where there is none below, key 2**63 - 1 / NaN where there is none above)."""
        n = len(keys)
        below, below_value = np.full(n, -1, dtype=np.int64), np.full(n, np.nan)
        above, above_value = np.full(n, np.iinfo(np.int64).max), np.full(n, np.nan)
        for chunk, chunk_values in self.chunks:
            i = np.searchsorted(chunk, keys)
            has_below, has_above = i > 0, i < len(chunk)
            j = np.maximum(i - 1, 0)
            better = has_below & (chunk[j] > below)
            below[better], below_value[better] = chunk[j][better], chunk_values[j][better]
            j = np.minimum(i, len(chunk) - 1)
            better = has_above & (chunk[j] < above)
            above[better], above_value[better] = chunk[j][better], chunk_values[j][better]
        return below, below_value, above, above_value

    def all_keys(self) -> np.ndarray:
        return np.concatenate([np.empty(0, dtype=np.int64), *(keys for keys, _ in self.chunks)])
