"""`private_top_k`: the front door of the middleware."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .access import (
    CountedAccess,
    ObliviousReadsSeen,
    OneShotPositions,
    OneShotReads,
    Source,
    implements,
    oblivious_reads,
    offers_in_store,
    parameters_in_text,
    run_freshness,
    store_traits,
)
from .accounting import PrivacyBudget, oblivious_cost, oneshot_cost, record
from .mechanisms.oblivious import (
    DEADLINES,
    check_delta_pad,
    check_read_size,
    oblivious_deadline,
    oblivious_depth,
    oblivious_guarantee,
    oblivious_top_k,
    pad_to,
    source_oblivious_costs,
)
from .mechanisms.oneshot import oneshot_top_k
from .names import METHODS, NOISES, OBLIVIOUS_METHODS, ORACLES
from .noise import make_noise
from .noisy_counts import (
    CountsPlan,
    check_counts_k,
    check_counts_share,
    counts_seconds,
    split_epsilon,
    with_counts_cost,
    with_counts_guarantee,
)
from .privacy import (
    MIN_ITEM_EPSILON,
    calibrate,
    check_max_items,
    check_neighbours,
    check_sensitivity,
)
from .randomness import make_rng
from .release import TopKResult, unranked_order
from .release_keys import keyable

if TYPE_CHECKING:  # the threshold run's and the planner's modules load when a run needs them
    from .mechanisms.cost_aware import CostModel
    from .mechanisms.threshold import Batching
from .validation import check_common, check_k_within


@keyable
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
    with_counts: bool = False,
    counts_share: float = 0.5,
    oblivious: bool = False,
    delta_pad: float = 1e-9,
    deadline: float | None = None,
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
    noises it reads) or "eager" (draws all m noises; the same noise vector as the one-shot run);
    `oracle`, `batching` and `costs` act only when the threshold method runs (pin
    `method="threshold"`): `diagnostics.plan["oracle"]` names the oracle used, None otherwise.
    `costs` (a CostModel) selects the cost-aware threshold algorithm (mechanisms/cost_aware.py)
    and, unless `batching` is given, the block schedule with the least modelled cost.
    `budget` (a PrivacyBudget or a PrivacyLedger's budget) is charged the release's cost once m is
    known and before any row is read; BudgetExceeded refuses the release.
    The guarantee is for add/remove-one-client neighbours (every count moves by at most 1, all in
    the same direction); `neighbours="replace"` (counts move by at most 1 either way) doubles the
    noise scale for the same guarantee (Laplace: pure only; privacy.py).
    The noise scale is multiplied by the source's declared `sensitivity` D (the most one client
    changes one count; privacy.py), and the guarantee states it. Every score is read as
    min(score, B), B = privacy.score_bound(scale, D) (the guarantee states it): beyond B a
    double cannot resolve score + noise, and clamping keeps the neighbour relation, so the
    release stays private whatever the data, with nothing refused for it.
    `with_counts=True` also releases each selected item's count plus exact discrete Laplace
    noise (`result.counts`, `result.count_error` the 95% half-width): `counts_share` of epsilon
    goes to the counts, the rest (and delta) to the selection; the source's
    `max_items_per_client` L, where it declares one, lowers the counts' noise to min(k, L)
    counts' worth (min(k, 2L) under replace neighbours); noisy_counts.py.
    `oblivious=True` (mechanisms/oblivious.py) reads a fixed depth of both lists, so that what a
    server observer sees (queries, their sizes, rows read, the wall time, padded to a deadline
    from the store's cost model) depends on public facts only, except with probability
    `delta_pad`; the guarantee is then (epsilon, delta + (1 + e^epsilon) delta_pad). The release
    has the one-shot law; `method` may be "auto", "threshold" or "oneshot_full_read" (a full
    read); the in-store one-shot and `costs` (cost-aware reads) are refused. `deadline`: the
    seconds an oblivious release is padded to (None: from the store's cost model; 0: no padding,
    for statistical tests only: the wall time then tells the data). A store that declares that
    another user of it would see which blocks the run reads (StoreTraits.oblivious_reads_seen:
    PostgreSQL, a role that may not set track_counts) refuses an oblivious release before
    anything is read or charged (ObliviousReadsSeen, saying what closes the channel).
    `release_key` (with `budget=` a PrivacyLedger's budget) makes the release idempotent
    (release_keys.py): a second call with the same key and parameters returns the stored
    release and charges nothing; the same key with other parameters is refused
    (ReleaseKeyConflict); keys are per principal. The noise then comes from a secret kept with
    the key in the ledger, so `seed` must be None.
    """
    check_common(k, epsilon, delta)
    if noise not in NOISES:
        raise ValueError(f"noise must be one of {NOISES}, got {noise!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if oracle not in ORACLES:
        raise ValueError(f"oracle must be one of {ORACLES}, got {oracle!r}")
    delta_pad = check_delta_pad(delta_pad)
    if not isinstance(oblivious, bool | np.bool_):
        raise TypeError(f"oblivious must be True or False, got {oblivious!r}")
    if oblivious and method not in OBLIVIOUS_METHODS:
        raise ValueError(
            f"method {method!r} cannot run obliviously (its reads depend on the data): use one of "
            f"{OBLIVIOUS_METHODS}, or oblivious=False"
        )
    if deadline is not None and (
        isinstance(deadline, bool)
        or not isinstance(deadline, int | float)
        or not (math.isfinite(deadline) and deadline >= 0)
    ):
        raise ValueError(f"deadline must be a finite number of seconds >= 0, got {deadline!r}")
    if oblivious and costs is not None:
        raise ValueError(
            "the cost-aware threshold algorithm (costs=) cannot run obliviously: its reads depend "
            "on the scores it reads; drop costs= or pass oblivious=False"
        )
    check_neighbours(neighbours)
    if not isinstance(with_counts, bool):
        raise TypeError(f"with_counts must be True or False, got {with_counts!r}")
    share = check_counts_share(counts_share) if with_counts else 0.0
    if with_counts:
        check_counts_k(int(k))
    traits = store_traits(source)  # what the store declares: before anything is read
    sensitivity = check_sensitivity(traits.sensitivity, "the source's sensitivity")
    if oblivious and traits.oblivious_reads_seen is not None:
        raise ObliviousReadsSeen(
            "oblivious release refused (nothing read, released or charged): "
            + traits.oblivious_reads_seen
        )
    k = int(k)
    select_epsilon, counts_epsilon = split_epsilon(float(epsilon), share)
    if with_counts and select_epsilon / k < MIN_ITEM_EPSILON:
        check_common(k, select_epsilon, delta)
    counts_plan = None
    if with_counts:
        counts_plan = CountsPlan.make(
            k,
            counts_epsilon,
            sensitivity,
            check_max_items(traits.max_items_per_client),
            traits.integer_scores,
            neighbours,
        )
    rng = make_rng(seed)
    started = time.perf_counter()
    if oblivious:
        return _oblivious_release(
            source,
            k,
            select_epsilon,
            float(delta),
            noise,
            method,
            rng,
            budget,
            neighbours,
            delta_pad,
            started,
            deadline,
            sensitivity,
            counts_plan,
        )
    with source.snapshot():
        access = CountedAccess(source, rng=rng)
        check_k_within(k, access.m)
        guarantee = calibrate(
            noise, k, access.m, select_epsilon, float(delta), neighbours, sensitivity
        )
        access.cap_scores(guarantee.score_bound or np.inf)  # every score read as min(score, B)
        if budget is not None:
            cost = oneshot_cost(
                noise, k, access.m, select_epsilon, float(delta), neighbours, sensitivity
            )
            budget.charge(cost if counts_plan is None else with_counts_cost(cost, counts_plan))
        # the counts' noise before any read: its sampler's time tells nothing of the rows read
        count_noises = None if counts_plan is None else counts_plan.draw(rng)
        distribution = make_noise(noise, guarantee.scale)
        chosen, estimate = method, None
        if method == "auto":  # after the charge, before any selection noise: planner.py
            from .planner import plan_run

            estimate = plan_run(access, k, guarantee.scale)
            chosen = estimate.chosen
        items = None
        in_store = False
        if chosen in ("oneshot", "oneshot_in_store", "oneshot_full_read"):
            if chosen != "oneshot_full_read" and offers_in_store(source):
                from .keyed_noise import KeyedNoise

                positions = (
                    source.oneshot_positions() if implements(source, OneShotPositions) else access.m
                )
                keyed = KeyedNoise.draw(
                    rng, noise, guarantee.scale, positions, k, score_cap=guarantee.score_bound
                )
                items = access.oneshot_in_store(keyed, k)
                in_store = items is not None
            if items is None:
                positions = oneshot_top_k(access, distribution.sample(rng, access.m), k)
        else:
            positions = _threshold_run(access, distribution, rng, k, oracle, batching, costs)
        if items is None:
            items = access.ids_of(positions)
        if noise == "laplace":  # a set (Fact 3.2): its order must not tell the noisy ranking
            items = unranked_order(items)
        counts = None
        if counts_plan is not None and count_noises is not None:  # k random accesses
            counts = counts_plan.release(count_noises, *access.exact_scores_of(items))
            guarantee = with_counts_guarantee(guarantee, counts_plan)
        freshness = run_freshness(source)  # the store's own account, still in the snapshot
    # The oracle and the cost model are the threshold run's: None / False when it did not run.
    threshold_ran = chosen == "threshold"
    plan: dict[str, Any] = {
        "oracle": oracle if threshold_ran else None,
        "cost_aware": threshold_ran and costs is not None,
    }
    plan["requested"], plan["in_store"] = method, in_store
    if freshness is not None:
        plan["freshness"] = freshness
    if in_store:  # where a store's in-store one-shot read, if it says (DuckDB: table or copy)
        plan["in_store_reads"] = (
            source.oneshot_reads() if implements(source, OneShotReads) else None
        )
    if estimate is not None:
        plan["auto"] = estimate.as_dict()
    seconds = {"total": time.perf_counter() - started}
    ran = "threshold" if threshold_ran else "oneshot"  # the mechanism; where: plan
    result = TopKResult(
        items,
        guarantee,
        access.stats,
        noise == "gumbel",
        ran,
        access.m,
        seconds,
        plan,
        counts=counts,
        count_error=None if counts_plan is None else counts_plan.count_error,
    )
    return record(budget, result)


def _threshold_run(
    access: CountedAccess,
    distribution: Any,
    rng: np.random.Generator,
    k: int,
    oracle: str,
    batching: Batching | None,
    costs: CostModel | None,
) -> list[int]:
    """The private threshold algorithm's positions (Algorithm 3; the cost-aware reads with
    `costs`), its noise list lazy or eager; its modules loaded here, by the runs that use them."""
    from .lazy_noise import LazyNoiseList
    from .mechanisms.cost_aware import cost_aware_threshold_top_k
    from .mechanisms.threshold import DEFAULT_BATCHING, private_threshold_top_k
    from .noise_list import EagerNoiseList

    if oracle == "lazy":
        noise_list: Any = LazyNoiseList(distribution, access.m, rng)
    else:
        noise_list = EagerNoiseList.draw(distribution, access.m, rng)
    if costs is None:
        return private_threshold_top_k(access, noise_list, k, batching or DEFAULT_BATCHING)
    schedule = batching or costs.batching(k, access.m)
    return cost_aware_threshold_top_k(access, noise_list, k, schedule, costs)


def _oblivious_release(
    source: Source,
    k: int,
    epsilon: float,
    delta: float,
    noise: str,
    method: str,
    rng: np.random.Generator,
    budget: Any,
    neighbours: str,
    delta_pad: float,
    started: float,
    deadline: float | None,
    sensitivity: float = 1.0,
    counts_plan: CountsPlan | None = None,
) -> TopKResult:
    """private_top_k(..., oblivious=True): charge, read at a fixed depth (or in full), pad the
    reads, their computation and the noisy counts to the deadline, all from public facts
    (mechanisms/oblivious.py). On a store whose driver writes parameters into the statement
    text (pymysql), the drawn positions would be there for a server observer to read: "auto"
    reads the whole table instead (m rows, a fixed count), "threshold" is refused."""
    full_read = method == "oneshot_full_read"
    if parameters_in_text(source) and not full_read:
        if method != "auto":
            raise ValueError(
                f"method {method!r} cannot run obliviously on this store: its driver writes "
                "query parameters into the statement text (MySQL / MariaDB drivers, psycopg2), "
                "where the drawn positions would be seen; use method='auto' or "
                "'oneshot_full_read' (a full read), or oblivious=False"
            )
        full_read = True
    with oblivious_reads(source), source.snapshot():
        access = CountedAccess(source, rng=rng)
        check_k_within(k, access.m)
        m = access.m
        base = calibrate(noise, k, m, epsilon, delta, neighbours, sensitivity)
        counts_epsilon = 0.0 if counts_plan is None else counts_plan.epsilon
        guarantee = oblivious_guarantee(base, delta_pad, counts_epsilon)
        access.cap_scores(base.score_bound or np.inf)  # every score read as min(score, B)
        depth = m if full_read else oblivious_depth(access.slots, k, delta_pad)
        check_read_size(source, k, m, depth)  # work known to be excessive: before the charge
        if budget is not None:
            cost = oblivious_cost(
                noise, k, m, epsilon, delta, neighbours, delta_pad, sensitivity, counts_epsilon
            )
            budget.charge(cost if counts_plan is None else with_counts_cost(cost, counts_plan))
        distribution = make_noise(noise, guarantee.scale)
        counted = 0 if counts_plan is None else k
        if deadline is None:
            deadline = oblivious_deadline(source_oblivious_costs(source), m, depth, counted)
            if counts_plan is not None:  # their noise is drawn inside the window
                deadline += counts_seconds(k)
        # The padded window starts after the charge: its time follows the budget's history,
        # not the table's counts.
        reading = time.perf_counter()
        # the counts' noise first, before any read: the sampler's time (which grows with |Z|)
        # is inside the padded window
        count_noises = None if counts_plan is None else counts_plan.draw(rng)
        run = oblivious_top_k(access, distribution, rng, k, delta_pad, full_read)
        items = run.items
        if noise == "laplace":
            items = unranked_order(items)
        counts = None
        if counts_plan is not None and count_noises is not None:  # k random accesses (public k)
            counts = counts_plan.release(count_noises, *access.exact_scores_of(items))
            guarantee = with_counts_guarantee(guarantee, counts_plan)
        took, overran = pad_to(reading, deadline)
        freshness = run_freshness(source)
    if deadline > 0:  # deadline=0 (no padding: statistical tests) is not an overrun
        DEADLINES.record(overran, took - deadline)
    else:
        overran = False
    plan: dict[str, Any] = {
        "requested": method,
        "in_store": False,
        "oblivious": True,
        "delta_pad": delta_pad,
        "depth": depth,
        "full_read": run.full_read,
        "overlap": run.overlap,
        "miss": run.missed,
        "deadline": deadline,
        "work_seconds": took,
        "deadline_missed": overran,
        "deadline_misses": DEADLINES.as_dict(),
    }
    if freshness is not None:
        plan["freshness"] = freshness
    seconds = {"total": time.perf_counter() - started, "work": took}
    result = TopKResult(
        items,
        guarantee,
        access.stats,
        noise == "gumbel",
        "oneshot",
        m,
        seconds,
        plan,
        counts=counts,
        count_error=None if counts_plan is None else counts_plan.count_error,
    )
    return record(budget, result)


def budgeted_private_top_k(
    budget: PrivacyBudget, source: Source, k: int, epsilon: float, delta: float = 0.0, **kwargs: Any
) -> TopKResult:
    """private_top_k, charged to `budget` first: refused (BudgetExceeded) before any row is read.
    Only the domain size m is asked of the store before the charge (the calibration needs it)."""
    return private_top_k(source, k, epsilon, delta, budget=budget, **kwargs)
