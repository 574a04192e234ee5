"""`private_top_k`: the front door of the middleware."""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from .access import AccessStats, CountedAccess, InStoreOneShot, Source
from .keyed_noise import KeyedNoise
from .lazy_noise import LazyNoiseList
from .mechanisms.cost_aware import CostModel, cost_aware_threshold_top_k
from .mechanisms.oneshot import oneshot_top_k
from .mechanisms.threshold import Batching, private_threshold_top_k
from .noise import make_noise
from .noise_list import EagerNoiseList
from .planner import plan_run
from .privacy import MIN_ITEM_EPSILON, PrivacyGuarantee, calibrate, check_neighbours
from .randomness import make_rng

NOISES = ("gumbel", "laplace")
METHODS = ("auto", "threshold", "oneshot", "oneshot_in_store", "oneshot_full_read")
ORACLES = ("lazy", "eager")


@dataclass(frozen=True)
class Release:
    """What an analyst receives: the items and the guarantee, nothing else data-dependent.

    `ranked` says whether the order of `items` is part of the release; when it is not (Laplace,
    joint, StableTopK sets) the items come in a data-independent order. `bottom`: the mechanism
    released the bottom symbol (limited domain, StableTopK), itself covered by the guarantee.
    """

    items: tuple[Any, ...]
    privacy: PrivacyGuarantee
    ranked: bool
    bottom: bool = False

    def to_arrow(self) -> Any:
        """The release as a pyarrow Table (position, item; the guarantee in the schema
        metadata): export.release_to_arrow. Needs the `arrow` extra."""
        from .export import release_to_arrow

        return release_to_arrow(self)


@dataclass(frozen=True)
class Diagnostics:
    """Operator-side facts about a run: data-dependent and outside the privacy guarantee (the
    access counts of the threshold algorithm depend on the counts; DESIGN invariant 7)."""

    accesses: AccessStats
    method: str
    m: int
    timings: dict[str, float]
    plan: dict[str, Any]


@dataclass(frozen=True)
class TopKResult:
    """A private top-k run: the release (`release()`, for the analyst) and the operator's
    diagnostics (`diagnostics`; `accesses` stays for the operator's convenience)."""

    items: list[Any]  # item ids: best first when ranked; else in a data-independent order
    privacy: PrivacyGuarantee
    accesses: AccessStats  # operator-side: data-dependent, outside the guarantee
    ranked: bool  # True when the order of `items` is part of the release (Gumbel, Remark 3.5)
    method: str
    m: int
    timings: dict[str, float] = field(default_factory=dict, compare=False)
    plan: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def diagnostics(self) -> Diagnostics:
        return Diagnostics(self.accesses, self.method, self.m, dict(self.timings), dict(self.plan))

    def release(self) -> Release:
        """The analyst's view: items, guarantee, whether ranked (and bottom, where it applies)."""
        return Release(
            tuple(self.items), self.privacy, self.ranked, bool(getattr(self, "bottom", False))
        )

    def to_arrow(self) -> Any:
        """The release only (never the diagnostics) as a pyarrow Table: `release().to_arrow()`."""
        return self.release().to_arrow()


def unranked_order(items: list[Any]) -> list[Any]:
    """A set's items in a data-independent order: sorted by id (ids of one store share a type)."""
    try:
        return sorted(items)
    except TypeError:
        return sorted(items, key=repr)


def check_common(k: Any, epsilon: Any, delta: Any) -> None:
    """Refuse bad (k, epsilon, delta) before anything is read or drawn."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"k must be an integer, got {k!r}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real):
        raise TypeError(f"epsilon must be a real number, got {epsilon!r}")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon}")
    if epsilon / k < MIN_ITEM_EPSILON:
        raise ValueError(
            f"epsilon = {epsilon:g} is below the floor k * {MIN_ITEM_EPSILON:g} = "
            f"{k * MIN_ITEM_EPSILON:g}: the noise scale would not be a finite number; nothing "
            "was read or charged"
        )
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real):
        raise TypeError(f"delta must be a real number, got {delta!r}")
    if not (0.0 <= delta < 1.0):
        raise ValueError(f"delta must be in [0, 1), got {delta}")


def check_k_within(k: int, m: int) -> None:
    if m < 1:
        raise ValueError("the source is empty: there is no item to select")
    if k > m:
        raise ValueError(f"k = {k} exceeds the number of items m = {m}")


def private_top_k(
    source: Source,
    k: int,
    epsilon: float,
    delta: float = 0.0,
    noise: Literal["gumbel", "laplace"] = "gumbel",
    method: Literal[
        "auto", "threshold", "oneshot", "oneshot_in_store", "oneshot_full_read"
    ] = "auto",
    seed: int | np.random.Generator | None = None,
    *,
    oracle: Literal["lazy", "eager"] = "lazy",
    batching: Batching | None = None,
    costs: CostModel | None = None,
    budget: Any = None,
    neighbours: Literal["add_remove", "replace"] = "add_remove",
) -> TopKResult:
    """Release the (approximately) k most voted items under (epsilon, delta)-DP.

    `epsilon`, `delta` are the total guarantee of the release; the per-item noise scale is derived
    from them (privacy.calibrate). `method="threshold"` runs the private threshold algorithm
    (Algorithm 3) in about sqrt(mk) accesses; `"oneshot"` is Algorithm 2, run inside the store
    where it can (an InStoreOneShot: keyed_noise.py, one query, noise from this run's generator;
    security rests on SHA-256 being a PRF), else over a full read; `"oneshot_in_store"` is the
    same; `"oneshot_full_read"` is Algorithm 2 over a full read always (with the eager oracle
    and a seed, the threshold run's noise vector). `"auto"` (the default) picks
    the cheapest from noise-free facts, after the budget is charged and before any
    noise is drawn (planner.py); the choice is in `result.diagnostics.plan`, never in the
    release. All have the same output distribution; with the same seed and the eager oracle,
    threshold and the full-read one-shot give the same output.
    `seed` is a testing tool: it makes the run reproducible, and so the release a deterministic
    function of the data (no privacy for anyone who knows it). Without it (production) the noise
    comes from ChaCha20 keyed by the operating system (randomness.make_rng).
    `oracle` is the noise list of the threshold method: "lazy" (Algorithm 4, samples only the
    noises it reads) or "eager" (draws all m noises; the same noise vector as the one-shot run).
    `costs` (a CostModel) selects the cost-aware threshold algorithm (mechanisms/cost_aware.py)
    and, unless `batching` is given, the block schedule with the least modelled cost.
    `budget` (a PrivacyBudget or a PrivacyLedger's budget) is charged the release's cost once m is
    known and before any row is read; BudgetExceeded refuses the release.
    The guarantee is for add/remove-one-client neighbours (every count moves by at most 1, all in
    the same direction); `neighbours="replace"` (counts move by at most 1 either way) doubles the
    noise scale for the same guarantee (Laplace: pure only; privacy.py).
    """
    check_common(k, epsilon, delta)
    if noise not in NOISES:
        raise ValueError(f"noise must be one of {NOISES}, got {noise!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if oracle not in ORACLES:
        raise ValueError(f"oracle must be one of {ORACLES}, got {oracle!r}")
    check_neighbours(neighbours)
    k = int(k)
    rng = make_rng(seed)
    started = time.perf_counter()
    with source.snapshot():
        access = CountedAccess(source, rng=rng)
        check_k_within(k, access.m)
        guarantee = calibrate(noise, k, access.m, float(epsilon), float(delta), neighbours)
        if budget is not None:
            from .accounting import oneshot_cost  # accounting builds on this module

            budget.charge(
                oneshot_cost(noise, k, access.m, float(epsilon), float(delta), neighbours)
            )
        distribution = make_noise(noise, guarantee.scale)
        chosen, estimate = method, None
        if method == "auto":  # after the charge, before any noise: planner.py
            estimate = plan_run(access, k, guarantee.scale)
            chosen = estimate.chosen
        items = None
        in_store = False
        if chosen in ("oneshot", "oneshot_in_store", "oneshot_full_read"):
            if chosen != "oneshot_full_read" and isinstance(source, InStoreOneShot):
                keyed = KeyedNoise.draw(rng, noise, guarantee.scale, access.m, k)
                items = access.oneshot_in_store(keyed, k)
                in_store = items is not None
            if items is None:
                positions = oneshot_top_k(access, distribution.sample(rng, access.m), k)
        else:
            if oracle == "lazy":
                noise_list = LazyNoiseList(distribution, access.m, rng)
            else:
                noise_list = EagerNoiseList.draw(distribution, access.m, rng)
            if costs is None:
                schedule = batching or Batching()
                positions = private_threshold_top_k(access, noise_list, k, schedule)
            else:
                schedule = batching or costs.batching(k, access.m)
                positions = cost_aware_threshold_top_k(access, noise_list, k, schedule, costs)
        if items is None:
            items = access.ids_of(positions)
    if noise == "laplace":  # a set (Fact 3.2): its order must not tell the noisy ranking
        items = unranked_order(items)
    plan: dict[str, Any] = {"oracle": oracle, "cost_aware": costs is not None}
    plan["requested"], plan["in_store"] = method, in_store
    if estimate is not None:
        plan["auto"] = estimate.as_dict()
    seconds = {"total": time.perf_counter() - started}
    ran = "threshold" if chosen == "threshold" else "oneshot"  # the mechanism; where: plan
    result = TopKResult(
        items, guarantee, access.stats, noise == "gumbel", ran, access.m, seconds, plan
    )
    log = getattr(budget, "log_release", None)
    if log is not None:
        log(result)
    return result
