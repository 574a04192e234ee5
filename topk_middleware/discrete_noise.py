"""Exact integer noise: the discrete Laplace sampler of Canonne, Kamath & Steinke 2020.

The discrete Laplace law with scale t > 0 puts mass P(X = x) = (1 - q)/(1 + q) q^|x|, q = e^(-1/t),
on every integer x. Adding it to an integer count of sensitivity D gives (D/t)-DP (Canonne,
Kamath & Steinke 2020, "The discrete Gaussian for differential privacy", Proposition 3 / the
geometric mechanism of Ghosh, Roughgarden & Sundararajan 2009).

The sampler uses only integer arithmetic on uniform integers drawn from the run's generator
(randomness.randbelow: whole bytes, rejection), so its output law is exactly the discrete
Laplace law with the rational scale t = a/b given (no floating point anywhere). Proof sketch
(CKS 2020, Algorithms 1 and 2, Proposition 5 of the arXiv version):

* `bernoulli_exp(g)` for rational g in [0, 1]: the loop draws A_j ~ Bernoulli(g / j) until one
  is 0 and returns whether the number K of draws is odd; P(K > n) = g^n / n!, so
  P(K odd) = sum_n (-1)^n g^n / n! = e^(-g). For g > 1, e^(-g) = e^(-1)^floor(g) e^(-(g - floor g)):
  floor(g) independent Bernoulli(e^-1) draws and one more, all of which must be 1.
* `discrete_laplace(a, b)` (scale t = a/b): U uniform on {0..a-1} accepted with probability
  e^(-U/a), and V ~ Geometric(1 - e^-1) (count of Bernoulli(e^-1) successes), make
  X = U + a V geometric with P(X = x) proportional to e^(-x/a); Y = floor(X / b) is then geometric
  with P(Y = y) proportional to e^(-y b/a) = q^y; a fair sign B, with (B = 1, Y = 0) rejected so
  that 0 is not counted twice, gives P(Z = z) proportional to q^|z|.

Timing: the loops run a random number of times that grows with |Z| (Jin et al. 2022 recover the
noise's magnitude from it). What this implies for the guarantee is stated in docs/guarantee.md:
the analyst receives no timing; a server observer who times the call sees the access pattern
anyway (DESIGN invariant 12), and the oblivious mode pads the call's time.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from .randomness import randbelow


def bernoulli(rng: np.random.Generator, p: Fraction) -> bool:
    """True with probability p (a rational in [0, 1]), exactly."""
    return randbelow(rng, p.denominator) < p.numerator


def bernoulli_exp(rng: np.random.Generator, gamma: Fraction) -> bool:
    """True with probability exp(-gamma), gamma >= 0 rational (CKS 2020, Algorithm 1)."""
    if gamma < 0:
        raise ValueError(f"bernoulli_exp needs gamma >= 0, got {gamma}")
    whole = math.floor(gamma)
    for _ in range(whole):
        if not _bernoulli_exp_unit(rng, Fraction(1)):
            return False
    return _bernoulli_exp_unit(rng, gamma - whole)


def _bernoulli_exp_unit(rng: np.random.Generator, gamma: Fraction) -> bool:
    """exp(-gamma) for gamma in [0, 1]: the parity of the first failure's index."""
    k = 1
    while bernoulli(rng, gamma / k):
        k += 1
    return k % 2 == 1


def discrete_laplace(rng: np.random.Generator, scale: Fraction) -> int:
    """One draw with P(Z = z) proportional to exp(-|z| / scale), exactly (CKS 2020, Alg. 2)."""
    if scale <= 0:
        raise ValueError(f"the discrete Laplace scale must be > 0, got {scale}")
    a, b = scale.numerator, scale.denominator
    while True:
        u = randbelow(rng, a)
        if not bernoulli_exp(rng, Fraction(u, a)):
            continue
        v = 0
        while bernoulli_exp(rng, Fraction(1)):
            v += 1
        y = (u + a * v) // b
        negative = bool(randbelow(rng, 2))
        if negative and y == 0:
            continue
        return -y if negative else y


def discrete_laplace_pmf(z: np.ndarray | int, scale: float) -> np.ndarray:
    """P(Z = z) of the discrete Laplace law with this scale (tests, intervals)."""
    q = math.exp(-1.0 / scale)
    return (1.0 - q) / (1.0 + q) * q ** np.abs(np.asarray(z, dtype=np.float64))


def discrete_laplace_half_width(scale: float, level: float = 0.95) -> int:
    """The least integer w with P(|Z| <= w) >= level: P(|Z| > w) = 2 q^(w+1) / (1 + q)."""
    q = math.exp(-1.0 / scale)  # 0 for a tiny scale: then Z = 0 surely, and w = 0

    def beyond(w: int) -> float:  # P(|Z| > w)
        return 2.0 * math.exp(-(w + 1) / scale) / (1.0 + q)

    tail = 1.0 - level
    w = max(0, math.ceil(-scale * math.log(tail * (1.0 + q) / 2.0)) - 1)
    while beyond(w) > tail:  # guard the float rounding of the log
        w += 1
    while w > 0 and beyond(w - 1) <= tail:
        w -= 1
    return w
