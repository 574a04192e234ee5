"""Keyed noise: the one-shot mechanism's noise computed inside a store, from a secret key.

The one-shot mechanism (Wu, Ohrimenko, Wirth 2023, Algorithm 2) adds an independent noise Z_p to
the score of every item and keeps the k largest. Run inside a store, the store must compute Z_p
itself, yet the randomness must be the middleware's: reproducible under a seed, unpredictable
without one, never the database's own random(). So each run draws a fresh 128-bit secret key
from its generator (randomness.make_rng: ChaCha20 keyed by the operating system, or a test seed)
and the store derives the uniform of the item at position p from a keyed hash:

    U_p = (first 52 bits of SHA-256(key_hex ":" p) + 1/2) / 2^52        in (0, 1)

then the noise by inverse CDF at the calibrated scale b: Gumbel Z = -b ln(-ln U); Laplace
Z = b ln(2U) for U < 1/2, -b ln(2 - 2U) otherwise. SHA-256 exists in PostgreSQL, DuckDB and
MariaDB (SHA2); SQLite takes `KeyedNoise.sqlite_function`, registered on its connection.

Noise confined to rows that can win. The uniforms lie on a grid: U_p <= 1 - 2^-53, so no noise
exceeds `KeyedNoise.ceiling` = b (53 ln 2 + 1) (Gumbel: -b ln(-ln U) <= b ln 2^53; Laplace:
-b ln(2 - 2U) <= b ln 2^52; b more for rounding). Any k items' noisy scores bound the k-th
largest of all from below: the store takes T = the least noisy score of its k top rows, and only
rows with score >= T - ceiling can reach T, so it computes the keyed hash on those alone and
returns the same k rows as over the whole table. On skewed data and plateaus the rows that can
win are a few thousand; where scores are spread within ~37 b of the top (the uniform family) most
rows still can, and the cost stays near the full evaluation's.

Privacy rests on an assumption, stated here and in the README: SHA-256 keyed this way (a secret
key prefixed to the message; no length extension matters, since the output is never extended) is
a pseudo-random function, so that to anyone without the key the U_p are indistinguishable from
independent uniforms. Under it the release is (computationally) the one-shot mechanism's, with
its guarantee (Fact 3.3 for Gumbel, Fact 3.2 for Laplace); the key lives only in the client's
memory and in the text of one query, and is never reused. The uniforms are on a grid of 2^-52
(the largest Gumbel noise is b ln(2^53), about 36.7 b, far beyond the maximum of m <= 10^12
Gumbels with any real probability).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

UNIFORM_BITS = 52
UNIFORM_HEX = UNIFORM_BITS // 4  # 13 hex digits
KEY_BYTES = 16


@dataclass(frozen=True)
class KeyedNoise:
    """The noise of one in-store one-shot run: the secret key, the noise family and its scale."""

    key: str  # 32 hex digits, drawn from the run's generator
    noise: str  # "gumbel" or "laplace"
    scale: float

    @classmethod
    def draw(cls, rng: np.random.Generator, noise: str, scale: float) -> KeyedNoise:
        """A fresh key from the run's generator (secure unless the run is seeded)."""
        if noise not in ("gumbel", "laplace"):
            raise ValueError(f"noise must be 'gumbel' or 'laplace', got {noise!r}")
        return cls(rng.bytes(KEY_BYTES).hex(), noise, float(scale))

    def message(self, position: int) -> str:
        """The text hashed for the item at `position`."""
        return f"{self.key}:{int(position)}"

    def uniforms(self, positions: np.ndarray) -> np.ndarray:
        """U_p for each position, computed here (the reference the stores are tested against)."""
        out = np.empty(len(positions), dtype=np.float64)
        for i, p in enumerate(np.asarray(positions, dtype=np.int64).tolist()):
            digest = hashlib.sha256(self.message(p).encode("ascii")).hexdigest()
            out[i] = (int(digest[:UNIFORM_HEX], 16) + 0.5) / 2.0**UNIFORM_BITS
        return out

    def noises(self, positions: np.ndarray) -> np.ndarray:
        """Z_p for each position (inverse CDF of U_p at the scale)."""
        return np.array([self.noise_of_uniform(u) for u in self.uniforms(positions)])

    @property
    def ceiling(self) -> float:
        """An upper bound of every Z_p this noise gives (module docstring)."""
        return self.scale * ((UNIFORM_BITS + 1) * math.log(2.0) + 1.0)

    def noise_of_uniform(self, u: float) -> float:
        b = self.scale
        if self.noise == "gumbel":
            return -b * math.log(-math.log(u))
        return b * math.log(2.0 * u) if u < 0.5 else -b * math.log(2.0 - 2.0 * u)

    def sqlite_function(self, position: int) -> float:
        """Z_p, for a store without SHA-256 in SQL (SQLite: registered on the connection)."""
        digest = hashlib.sha256(self.message(position).encode("ascii")).hexdigest()
        return self.noise_of_uniform((int(digest[:UNIFORM_HEX], 16) + 0.5) / 2.0**UNIFORM_BITS)

    def sql(self, uniform: str) -> str:
        """The noise as SQL over `uniform`, an SQL expression of U_p (a double in (0, 1)).
        The scale is a Python float printed exactly (repr round-trips); nothing else varies."""
        b = repr(self.scale)
        if self.noise == "gumbel":
            return f"(-{b} * ln(-ln({uniform})))"
        return (
            f"(CASE WHEN {uniform} < 0.5 THEN {b} * ln(2.0 * {uniform}) "
            f"ELSE -{b} * ln(2.0 - 2.0 * {uniform}) END)"
        )


def cut_sql(relation: str, position: str, value: str, ceiling: float, k: str) -> str:
    """SQL of the least score a row of `relation` needs to reach the k-th largest noisy score
    (module docstring): the least `value` (score + noise) of the rows at `position` < k, minus
    the ceiling; any k rows bound it, a rank table's top k bound it tightly."""
    return (
        f"(SELECT min(top_rows.v) - {float(ceiling)!r} FROM (SELECT {value} AS v FROM {relation} "
        f"WHERE {position} < {k}) AS top_rows)"
    )


def uniform_from_hex_sql(hex_digits: str) -> str:
    """SQL turning an expression of the first 13 hex digits into U_p (no dialect-specific part)."""
    return f"(({hex_digits}) + 0.5) / {float(2**UNIFORM_BITS)!r}"
