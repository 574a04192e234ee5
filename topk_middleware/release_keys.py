"""Idempotent releases (DESIGN invariant 16): a release is a function of its key.

`keyed_release(budget, release_key, function, parameters, run)` runs a release at most once per
(principal, key) as far as the analyst and the budget can tell:

1. claim: the ledger inserts (principal, key, fingerprint of the parameters, a fresh 256-bit
   noise key from os.urandom) if the key is new, else hands back what it holds. A stored release
   is returned at once, charging nothing; a charged key whose fingerprint is not this call's is
   refused (ReleaseKeyConflict) before anything is read or charged. A key claimed but never
   charged (its call was refused as bad input, or died before its charge) takes the new
   parameters: a corrected retry is not locked out by a mistyped first try.
2. charge: the cost is charged in the ledger's locked charge transaction, which also checks the
   key's fingerprint (ReleaseKeyConflict) and records the charge's sequence number against the
   key; a key already charged is not charged again (a retry after a crash, or a second worker
   racing the first).
3. run: the mechanism draws all its noise from ChaCha20 keyed by the stored noise key, so every
   attempt under one key uses the same noise: on unchanged data, attempts read the same rows and
   compute the same release.
4. store: the release is written against the key only if none is stored yet (one conditional
   update); the caller gets the release that was stored, whoever stored it.

So whatever crashes or races happen, one key costs one charge and yields one answer. A process
killed after the charge and before the store has given nobody an answer; its retry computes the
release (with the same noise) without paying again. What a server observer sees is each
attempt's reads; attempts share their noise, so they differ only where the data changed between
them. The ledger holds the noise key and the stored release: operator-side tables, never shown
to an analyst beyond the release itself. Cost: one claim transaction, the charge as without a
key, one conditional update; a replay is one read.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import os
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import numpy as np
from randomgen import ChaCha

from .randomness import SECURE_ROUNDS

KEY_MAX_LENGTH = 200


class ReleaseKeyConflict(ValueError):
    """A release key already names a release with other parameters: nothing was read, charged
    or released."""


def key_conflict(principal: str, release_key: str) -> ReleaseKeyConflict:
    """The refusal of a key that names a release with other parameters."""
    return ReleaseKeyConflict(
        f"release key {release_key!r} of principal {principal!r} names a release with other "
        "parameters (function, source type, k, epsilon or an option differs); nothing was read, "
        "charged or released: use a new key for a new question"
    )


def check_release_key(key: Any) -> str:
    """A release key: a non-empty string of at most KEY_MAX_LENGTH printable characters."""
    if not isinstance(key, str) or not key:
        raise TypeError(f"release_key must be a non-empty string, got {type(key).__name__}")
    if len(key) > KEY_MAX_LENGTH or not key.isprintable():
        raise ValueError(
            f"release_key must be at most {KEY_MAX_LENGTH} printable characters "
            f"(got {len(key)} characters)"
        )
    return key


def new_noise_key() -> str:
    """256 bits from the operating system, as hex: the noise of every attempt under one key."""
    return os.urandom(32).hex()


def keyed_rng(noise_key: str) -> np.random.Generator:
    """ChaCha20 (randomness.py) keyed with a stored noise key."""
    return np.random.Generator(ChaCha(key=int(noise_key, 16), counter=0, rounds=SECURE_ROUNDS))


def derived_rng(secret: str, purpose: str) -> np.random.Generator:
    """keyed_rng of SHA-256(secret, purpose): one stored secret gives each of its uses (a
    trending stream's selection, query or threshold of a tick) noise of its own, the same on
    every attempt; as secure as SHA-256 is a PRF."""
    digest = hashlib.sha256(f"{secret}\x00{purpose}".encode()).hexdigest()
    return keyed_rng(digest)


def fingerprint(function: str, source: Any, parameters: dict[str, Any]) -> str:
    """SHA-256 of the release's function, the source's type and every parameter (canonical JSON;
    objects by repr): what "the same parameters" means for a key."""
    described = {
        "function": function,
        "source": f"{type(source).__module__}.{type(source).__qualname__}",
        "parameters": parameters,
    }
    text = json.dumps(described, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclasses.dataclass(frozen=True)
class Claim:
    """What the ledger holds for a key: its noise key, whether it is charged, its release."""

    noise_key: str
    charged: bool
    release: str | None
    fingerprint: str


class ChargeEntry(NamedTuple):
    """One cost for a ledger to charge (its JSON text), under a release key or none."""

    mechanism: str
    cost: str
    key: str | None = None
    fingerprint: str | None = None
    noise_key: str = ""


class Charged(NamedTuple):
    """What a ledger's charge did: the charge numbers of its entries, the composition after
    them (None: nothing was due), the release stored under its `unless_stored` key (then
    nothing was charged), the noise keys its claims hold."""

    seqs: list[int]
    after: Any
    stored: str | None
    noise_keys: dict[str, str]


class KeyedBudget:
    """A ledger budget that charges under a release key: a key already charged is not charged
    again (the ledger's charge transaction decides, under the principal's lock)."""

    def __init__(self, budget: Any, release_key: str, claim: Claim) -> None:
        self.budget, self.release_key, self.claim = budget, release_key, claim
        self.charged = claim.charged
        self.epsilon, self.delta = budget.epsilon, budget.delta

    def charge(self, cost: Any) -> Any:
        return self.budget.charge(
            cost, release_key=self.release_key, fingerprint=self.claim.fingerprint
        )

    def log_release(self, result: Any) -> None:
        self.budget.log_release(result)

    def spent(self) -> Any:
        return self.budget.spent()

    @property
    def releases(self) -> list[Any] | None:
        # A charged key pays nothing more: no precheck may refuse its retry.
        return None if self.charged else self.budget.releases


def result_to_json(result: Any) -> str:
    """A release result as JSON: items, guarantee, ranking, counts; the operator's method, m and
    access counts; for a MechanismResult also bottom, k_chosen and details."""
    from .release import plain

    data: dict[str, Any] = {
        "kind": type(result).__name__,
        "items": [plain(item) for item in result.items],
        "privacy": dataclasses.asdict(result.privacy),
        "accesses": dataclasses.asdict(result.accesses),
        "ranked": bool(result.ranked),
        "method": result.method,
        "m": int(result.m),
        "counts": None if result.counts is None else [int(c) for c in result.counts],
        "count_error": result.count_error,
    }
    if hasattr(result, "k_chosen"):
        data["bottom"] = bool(result.bottom)
        data["k_chosen"] = result.k_chosen
        data["details"] = result.details
    return json.dumps(data, default=str)


def result_from_json(text: str) -> Any:
    """The stored release as the result type it was (plan: {"stored_release": True})."""
    from .access import AccessStats
    from .accounting import MechanismResult
    from .privacy import PrivacyGuarantee
    from .release import TopKResult

    data = json.loads(text)
    common: dict[str, Any] = {
        "items": list(data["items"]),
        "privacy": PrivacyGuarantee(**data["privacy"]),
        "accesses": AccessStats(**data["accesses"]),
        "ranked": data["ranked"],
        "method": data["method"],
        "m": data["m"],
        "timings": {},
        "plan": {"stored_release": True},
        "counts": None if data["counts"] is None else tuple(data["counts"]),
        "count_error": data["count_error"],
    }
    if data["kind"] == "MechanismResult":
        return MechanismResult(
            **common, bottom=data["bottom"], k_chosen=data["k_chosen"], details=data["details"]
        )
    return TopKResult(**common)


def keyed_release(
    budget: Any,
    release_key: Any,
    function: str,
    source: Any,
    parameters: dict[str, Any],
    run: Callable[[np.random.Generator, Any], Any],
) -> Any:
    """Run `run(rng, budget)` under `release_key` (module docstring): a stored release is returned
    and charges nothing; other parameters under a used key are refused."""
    key = check_release_key(release_key)
    ledger, principal = getattr(budget, "ledger", None), getattr(budget, "principal", None)
    if ledger is None or principal is None or not hasattr(ledger, "claim_release"):
        raise TypeError(
            "release_key needs budget= a PrivacyLedger's budget (ledger.budget(principal, ...)): "
            "the ledger keeps the key, its charge and its release"
        )
    claim = ledger.claim_release(principal, key, fingerprint(function, source, parameters))
    if claim.release is not None:
        return result_from_json(claim.release)
    result = run(keyed_rng(claim.noise_key), KeyedBudget(budget, key, claim))
    ours = result_to_json(result)
    stored = ledger.store_release(principal, key, claim.fingerprint, ours)
    return result if stored == ours else result_from_json(stored)


F = TypeVar("F", bound=Callable[..., Any])


def keyable(function: F) -> F:
    """Give a release function taking `source`, `seed` and `budget` the keyword `release_key`
    (keyed_release: idempotent under a PrivacyLedger's budget; with it, `seed` must be None)."""
    signature = inspect.signature(function)

    @functools.wraps(function)
    def release(*args: Any, release_key: str | None = None, **kwargs: Any) -> Any:
        if release_key is None:
            return function(*args, **kwargs)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"{function.__name__}: {error}") from None
        bound.apply_defaults()
        parameters = dict(bound.arguments)
        source, budget = parameters.pop("source"), parameters.pop("budget")
        if parameters.pop("seed") is not None:
            raise ValueError(
                "release_key draws the noise from a secret kept with the key in the ledger: "
                "pass seed=None"
            )
        return keyed_release(
            budget,
            release_key,
            function.__name__,
            source,
            parameters,
            lambda rng, keyed: function(source=source, seed=rng, budget=keyed, **parameters),
        )

    keyword = inspect.Parameter(
        "release_key", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="str | None"
    )
    release.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*signature.parameters.values(), keyword]
    )
    return release  # type: ignore[return-value]


__all__ = [
    "KEY_MAX_LENGTH",
    "ReleaseKeyConflict",
    "check_release_key",
    "derived_rng",
    "keyable",
    "keyed_release",
]
