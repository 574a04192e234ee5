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

Noise confined to rows that can win: a split at a level t. Before the query the client draws,
from the run's generator, which items' noise exceeds t and what it is: each item does so with
probability q = P(Z > t), independently, so their number is Binomial(m, q), their positions a
uniform sample of that size, and their noises i.i.d. from the law of Z given Z > t (the
*exceedances*, sent with the query: `exceed_positions`, `exceed_noises`). Every other item's
noise comes from its keyed uniform conditioned on Z <= t (U_p F(t) through the inverse CDF F^-1).
Membership and both conditional laws together are exactly i.i.d. draws of Z, so the release is
the one-shot law. The level makes the expected number of exceedances max(EXCEEDANCES, 64 k)
(t >= 0), a function of m and k only; a table smaller than SPLIT_MIN_RATIO times that is not
split (sending and joining the exceedances would cost more than hashing every row).

Then any k rows bound the k-th largest noisy score from below: the store takes T = the k-th
largest of score + noise over the exceedances and its k top rows, and a row outside the
exceedances can reach T only if its score >= T - t, so it hashes those rows alone. Where scores
are spread within a few tens of b of the top (the uniform family), T - t lies above the top
score: nothing but the exceedances and the k top rows is hashed. Without a split (t = inf, the
default of a bare KeyedNoise) the bound is `ceiling` = b (53 ln 2 + 1): the
uniforms lie on a 2^-52 grid, so no noise exceeds it.

Privacy rests on an assumption, stated here and in the README: SHA-256 keyed this way (a secret
key prefixed to the message; no length extension matters, since the output is never extended) is
a pseudo-random function, so that to anyone without the key the U_p are indistinguishable from
independent uniforms. Under it the release is (computationally) the one-shot mechanism's, with
its guarantee (Fact 3.3 for Gumbel, Fact 3.2 for Laplace); the key and the exceedances live
only in the client's memory and in the parameters of one query, and are never reused (like the
noise of any release: whoever reads that query's parameters learns the noise). The uniforms are
on a grid of 2^-52 (the largest keyed Gumbel noise is b ln(2^53), about 36.7 b, far beyond the
maximum of m <= 10^12 Gumbels with any real probability).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

UNIFORM_BITS = 52
UNIFORM_HEX = UNIFORM_BITS // 4  # 13 hex digits
KEY_BYTES = 16
EXCEEDANCES = 1024  # expected exceedances drawn by the client (at least 64 k; module docstring)
SPLIT_MIN_RATIO = 64  # by default, split only where m >= 64 x the exceedances (module docstring)
ROUNDING = 1e-6  # of the scale, and 1e-12 of |T|: slack in the cut for rounding in the store


@dataclass(frozen=True, eq=False)
class KeyedNoise:
    """The noise of one in-store one-shot run: the secret key, the noise family, its scale, and
    the split (level t, the exceedances' positions and noises; module docstring)."""

    key: str  # 32 hex digits, drawn from the run's generator
    noise: str  # "gumbel" or "laplace"
    scale: float
    level: float = math.inf  # t >= 0; inf: no split, every noise keyed
    exceed_positions: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    exceed_noises: np.ndarray = field(default_factory=lambda: np.empty(0, np.float64))
    # Scores above it count as it (privacy.score_bound; the store clamps: `capped_sql`)
    score_cap: float = math.inf

    @classmethod
    def draw(
        cls,
        rng: np.random.Generator,
        noise: str,
        scale: float,
        m: int = 0,
        k: int = 1,
        exceedances: int | None = None,
        score_cap: float = math.inf,
    ) -> KeyedNoise:
        """A fresh key from the run's generator (secure unless the run is seeded) and, for a
        domain of m items (m > 0), the split: its level (about `exceedances` noises above it,
        by default max(EXCEEDANCES, 64 k), and then only where m >= SPLIT_MIN_RATIO times
        that) and the exceedances."""
        if noise not in ("gumbel", "laplace"):
            raise ValueError(f"noise must be 'gumbel' or 'laplace', got {noise!r}")
        key = rng.bytes(KEY_BYTES).hex()
        above = default_exceedances(m, k) if exceedances is None else exceedances
        cap = float(score_cap)
        if m <= 0 or above is None:  # no split: a small table is hashed whole
            return cls(key, noise, float(scale), score_cap=cap)
        level = split_level(noise, float(scale), m, above)
        q = exceedance_probability(noise, float(scale), level)
        count = int(rng.binomial(m, q))
        positions = np.sort(rng.choice(m, size=count, replace=False)).astype(np.int64)
        tail = 1.0 - rng.random(count)  # in (0, 1]
        b = float(scale)
        if noise == "gumbel":  # U uniform on (F(t), 1): -ln U = -log1p(-q W)
            noises = -b * np.log(-np.log1p(-q * tail))
        else:  # beyond t >= 0 the Laplace tail is t + Exponential(b)
            noises = level - b * np.log(tail)
        return cls(key, noise, b, level, positions, noises, cap)

    def capped(self, scores: np.ndarray) -> np.ndarray:
        """Scores clamped at score_cap, as the store clamps them (capped_sql)."""
        values = np.asarray(scores, dtype=np.float64)
        return np.minimum(values, self.score_cap) if self.score_cap < math.inf else values

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
        """Z_p for each position: an exceedance's drawn noise, else the keyed noise below t."""
        positions = np.asarray(positions, dtype=np.int64)
        out = np.empty(len(positions), dtype=np.float64)
        found = np.zeros(len(positions), dtype=bool)
        if len(self.exceed_positions):  # sorted by draw()
            where = np.minimum(
                np.searchsorted(self.exceed_positions, positions), len(self.exceed_positions) - 1
            )
            found = self.exceed_positions[where] == positions
            out[found] = self.exceed_noises[where[found]]
        keyed = ~found  # hashed only where no exceedance gives the noise
        out[keyed] = [self.noise_of_uniform(u) for u in self.uniforms(positions[keyed])]
        return out

    @property
    def ceiling(self) -> float:
        """An upper bound of every keyed Z_p without a split (module docstring)."""
        return self.scale * ((UNIFORM_BITS + 1) * math.log(2.0) + 1.0)

    @property
    def lowest(self) -> float:
        """A lower bound of every Z_p: the keyed noise at the smallest uniform of the grid,
        1/2^53 (the inverse CDF increases with U; an exceedance's noise is above the level)."""
        return self.noise_of_uniform(0.5 / 2.0**UNIFORM_BITS)

    @property
    def bound(self) -> float:
        """An upper bound of every Z_p outside the exceedances: the level plus the rounding
        slack, or the ceiling without a split."""
        return min(self.ceiling, self.level + ROUNDING * self.scale)

    def _below_level(self) -> float:
        """The factor on U of the conditional law below t: F(t) (1 without a split); for Gumbel
        the term exp(-t / b) added to -ln U instead."""
        if self.noise == "gumbel":
            return math.exp(-self.level / self.scale)
        return 1.0 - 0.5 * math.exp(-self.level / self.scale)

    def noise_of_uniform(self, u: float) -> float:
        """The noise below the level from the uniform U (inverse CDF of U F(t))."""
        b, factor = self.scale, self._below_level()
        if self.noise == "gumbel":
            return -b * math.log(factor - math.log(u))
        v = u * factor if factor != 1.0 else u
        return b * math.log(2.0 * v) if v < 0.5 else -b * math.log(2.0 - 2.0 * v)

    def sqlite_function(self, position: int) -> float:
        """Z_p below the level, for a store without SHA-256 in SQL (SQLite: registered on the
        connection; the exceedances join in SQL as for every store)."""
        digest = hashlib.sha256(self.message(position).encode("ascii")).hexdigest()
        return self.noise_of_uniform((int(digest[:UNIFORM_HEX], 16) + 0.5) / 2.0**UNIFORM_BITS)

    def sql(self, uniform: str) -> str:
        """The noise below the level as SQL over `uniform`, an SQL expression of U_p (a double
        in (0, 1)). Constants are Python floats printed exactly (repr round-trips)."""
        b, factor = repr(self.scale), self._below_level()
        if self.noise == "gumbel":
            return f"(-{b} * ln({factor!r} - ln({uniform})))"
        v = f"({uniform} * {factor!r})" if factor != 1.0 else uniform
        return f"(CASE WHEN {v} < 0.5 THEN {b} * ln(2.0 * {v}) ELSE -{b} * ln(2.0 - 2.0 * {v}) END)"


def default_exceedances(m: int, k: int) -> int | None:
    """The expected exceedances of a default split, max(EXCEEDANCES, 64 k), or None where m is
    below SPLIT_MIN_RATIO times that (no split)."""
    above = max(EXCEEDANCES, 64 * k)
    return above if m >= SPLIT_MIN_RATIO * above else None


def split_level(noise: str, scale: float, m: int, above: int) -> float:
    """The level t >= 0 above which `above` of m noises lie in expectation (fewer where t = 0
    leaves fewer: Gumbel 63%, Laplace 50%)."""
    rate = min(1.0, above / m)
    if noise == "gumbel":  # P(Z > t) = -expm1(-exp(-t / b))
        t = -scale * math.log(-math.log1p(-rate)) if rate < 1.0 else -math.inf
    else:  # P(Z > t) = exp(-t / b) / 2 for t >= 0
        t = -scale * math.log(2.0 * rate)
    return max(0.0, t)


def exceedance_probability(noise: str, scale: float, level: float) -> float:
    """q = P(Z > level) for the noise at `scale` (level >= 0)."""
    if noise == "gumbel":
        return -math.expm1(-math.exp(-level / scale))
    return 0.5 * math.exp(-level / scale)


def capped_sql(score: str, cap: float) -> str:
    """SQL of min(score, cap) in every dialect here (a CASE: SQLite has no LEAST); the score
    itself when there is no cap. The cap is a Python float printed exactly (repr)."""
    if not cap < math.inf:
        return score
    return f"(CASE WHEN {score} > {float(cap)!r} THEN {float(cap)!r} ELSE {score} END)"


def oneshot_query(
    relation: str,
    position: str,
    noise_sql: str,
    exceedances: str,
    bound: float,
    k: str,
    materialized: str = "",
    search_m: str | None = None,
    score_cap: float = math.inf,
    prelude: str = "",
) -> str:
    """SQL of the in-store one-shot (module docstring): the (position, id, score) of the k rows
    of largest score + noise, best first, ties by smaller position. `relation` has columns
    `position`, id and score; `noise_sql` is the keyed noise below the level of the row `r`
    (over r.`position`); `exceedances` a query of (position, noise) rows; `bound`
    KeyedNoise.bound; `k` the placeholder of k; `materialized` "MATERIALIZED " where the
    dialect takes it (the exceedances and known rows are read twice).

    `search_m` (the placeholder of m), for a rank table whose scores do not increase with the
    position, in a dialect whose `/` divides integers and that casts to BIGINT (PostgreSQL,
    SQLite): the rows with score >= the cut are then a prefix of the positions, found by binary
    search through the position's B-tree (about 2 log2 m probes), so the others are not scanned.

    Values are min(score, `score_cap`) + noise (privacy.score_bound); the cut compares raw
    scores, which are at least the clamped ones, so it keeps every row that can win.
    `prelude`: common table expressions put before the query's own (a `relation` computed once
    and read three times: `ranked AS MATERIALIZED (...)`)."""
    pos = position
    score = capped_sql("r.score", score_cap)
    keyed = f"{score} + {noise_sql}"
    ctes = [
        *([prelude] if prelude else []),
        f"e(position, z) AS {materialized}({exceedances})",
        f"known AS {materialized}(SELECT r.{pos} AS position, r.id AS id, r.score AS score, "
        f"{score} + e.z AS v FROM {relation} r JOIN e ON r.{pos} = e.position "
        f"UNION ALL SELECT r.{pos}, r.id, r.score, {keyed} FROM {relation} r "
        f"WHERE r.{pos} < {k} AND r.{pos} NOT IN (SELECT position FROM e))",
        f"cut AS (SELECT min(best.v) - {float(bound)!r} - 1e-12 * abs(min(best.v)) AS low "
        f"FROM (SELECT v FROM known ORDER BY v DESC LIMIT {k}) best)",
    ]
    rest = f"r.score >= (SELECT low FROM cut) AND r.{pos} >= {k}"
    if search_m is not None:  # invariant: [k, lo) score >= low, [hi, m) score < low
        mid = "(b.lo + b.hi) / 2"
        above = f"(SELECT s.score FROM {relation} s WHERE s.{pos} = {mid}) >= (SELECT low FROM cut)"
        ctes.append(
            f"prefix(lo, hi) AS (SELECT CAST({k} AS BIGINT), CAST({search_m} AS BIGINT) "
            f"UNION ALL SELECT CASE WHEN {above} THEN {mid} + 1 ELSE b.lo END, "
            f"CASE WHEN {above} THEN b.hi ELSE {mid} END FROM prefix b WHERE b.lo < b.hi)"
        )
        rest += f" AND r.{pos} < (SELECT min(hi) FROM prefix)"
    return (
        f"WITH {'RECURSIVE ' if search_m is not None else ''}{', '.join(ctes)} "
        "SELECT c.position, c.id, c.score FROM (SELECT position, id, score, v FROM known "
        f"UNION ALL SELECT r.{pos}, r.id, r.score, {keyed} FROM {relation} r WHERE {rest} "
        f"AND r.{pos} NOT IN (SELECT position FROM e)) c "
        f"ORDER BY c.v DESC, c.position ASC LIMIT {k}"
    )


def uniform_from_hex_sql(hex_digits: str) -> str:
    """SQL turning an expression of the first 13 hex digits into U_p (no dialect-specific part)."""
    return f"(({hex_digits}) + 0.5) / {float(2**UNIFORM_BITS)!r}"
