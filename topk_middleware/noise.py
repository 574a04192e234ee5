"""Noise distributions of the one-shot mechanism (Wu, Ohrimenko, Wirth 2023, Definition 3.1).

Each distribution can be sampled directly and through its inverse survival function: the lazy noise
list (Algorithm 4) draws order statistics of uniforms and maps them to noises. It works with the
survival probability v = 1 - U, because the largest noises have U within ~1/m of 1, where doubles
lose the digits that matter; v keeps them (and log1p keeps the rest).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

NoiseName = Literal["gumbel", "laplace"]


@dataclass(frozen=True)
class Gumbel:
    """Gumbel(0, b): density (1/b) exp(-(z/b + exp(-z/b)))."""

    scale: float
    name: str = "gumbel"

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.gumbel(0.0, self.scale, size)

    def from_survival(self, v: np.ndarray | float) -> np.ndarray | float:
        """The noise z with P(Z > z) = v, accurate for v near 0 (the largest noises)."""
        # One value (the lazy list's scalar accesses): a numpy scalar, not a 0-d array, and
        # numpy's log, not math's, whose result may differ from numpy's SIMD loops in the last bit.
        v = np.float64(v) if type(v) is float else np.asarray(v, dtype=np.float64)
        return -self.scale * np.log(-np.log1p(-v))

    def survival(self, z: np.ndarray | float) -> np.ndarray:
        """P(Z > z)."""
        return -np.expm1(-np.exp(-np.asarray(z, dtype=np.float64) / self.scale))


@dataclass(frozen=True)
class Laplace:
    """Laplace(0, b): density (1/2b) exp(-|z|/b)."""

    scale: float
    name: str = "laplace"

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.laplace(0.0, self.scale, size)

    def from_survival(self, v: np.ndarray | float) -> np.ndarray | float:
        """The noise z with P(Z > z) = v, accurate in both tails."""
        if type(v) is float:  # one value, as Gumbel.from_survival
            v = np.float64(v)
            if v <= 0.5:
                return -self.scale * np.log(2.0 * v)
            return self.scale * (math.log(2.0) + np.log1p(-v))
        v = np.asarray(v, dtype=np.float64)
        upper = -self.scale * np.log(2.0 * np.minimum(v, 0.5))
        lower = self.scale * (math.log(2.0) + np.log1p(-np.maximum(v, 0.5)))
        return np.where(v <= 0.5, upper, lower)

    def survival(self, z: np.ndarray | float) -> np.ndarray:
        """P(Z > z)."""
        z = np.asarray(z, dtype=np.float64)
        return np.where(z >= 0, 0.5 * np.exp(-z / self.scale), 1.0 - 0.5 * np.exp(z / self.scale))


NoiseDistribution = Gumbel | Laplace


def make_noise(name: str, scale: float) -> NoiseDistribution:
    if name == "gumbel":
        return Gumbel(scale)
    if name == "laplace":
        return Laplace(scale)
    raise ValueError(f"noise must be 'gumbel' or 'laplace', got {name!r}")
