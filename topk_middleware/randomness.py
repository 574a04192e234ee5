"""Where every mechanism's randomness comes from: `make_rng(seed)`.

Without a seed (production), the generator is numpy's Generator over randomgen's ChaCha bit
generator (20 rounds, the ChaCha20 stream cipher of Bernstein 2008), keyed with 256 bits from the
operating system (`os.urandom`): a cryptographically secure stream, so no observer of earlier
releases can predict the noise of the next one. With a seed, the generator is numpy's seeded
PCG64: reproducible, and *not* secure. A seed is a testing tool: it makes the release a
deterministic function of the data, which voids the privacy guarantee for anyone who knows it.
"""

from __future__ import annotations

import numbers
import os

import numpy as np
from randomgen import ChaCha

SECURE_ROUNDS = 20


def secure_rng() -> np.random.Generator:
    """A Generator over ChaCha20 keyed with 256 bits from os.urandom."""
    key = int.from_bytes(os.urandom(32), "little")
    return np.random.Generator(ChaCha(key=key, counter=0, rounds=SECURE_ROUNDS))


def check_seed(seed: object) -> None:
    """Refuse a seed that is neither None, a Generator, nor a non-negative integer."""
    if seed is None or isinstance(seed, np.random.Generator):
        return
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(
            f"seed must be None (secure randomness) or a non-negative integer (tests only), "
            f"got {seed!r}"
        )
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer (tests only), got {seed}")


def make_rng(seed: int | np.random.Generator | None) -> np.random.Generator:
    """The generator of one release: secure (ChaCha20, OS-keyed) when `seed` is None; numpy's
    PCG64 seeded with `seed` (testing only) otherwise; a Generator is used as it is (a mechanism
    handing its own generator to a sub-mechanism)."""
    check_seed(seed)
    if seed is None:
        return secure_rng()
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(int(seed))


def is_secure(rng: np.random.Generator) -> bool:
    """True when `rng` draws from the ChaCha20 bit generator (the unseeded default)."""
    bits = rng.bit_generator
    return isinstance(bits, ChaCha) and bits.state["state"].get("rounds", SECURE_ROUNDS) >= 20


def randbelow(rng: np.random.Generator, n: int) -> int:
    """A uniform integer in [0, n) for any positive Python int n (rejection on whole bytes)."""
    if n < 1:
        raise ValueError(f"randbelow needs n >= 1, got {n}")
    nbytes = ((n - 1).bit_length() + 7) // 8 or 1
    limit = (256**nbytes // n) * n
    while True:
        value = int.from_bytes(rng.bytes(nbytes), "little")
        if value < limit:
            return value % n
