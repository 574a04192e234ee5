"""`method="auto"`: choose, before any noise is drawn, the cheapest way to sample the one-shot law.

The private threshold algorithm (Algorithm 3), the one-shot mechanism run inside the store
(keyed_noise.py) and the one-shot mechanism over a full read (Algorithm 2) all release exactly
the top-k of h + Z: the same output law (Wu, Ohrimenko, Wirth 2023, Theorem 4.1 for the first).
So the choice between them changes the cost, never the distribution of the release. It is made
from facts that do not involve the noise: m, k, the noise scale b, the store's measured costs
(access.StoreCosts), whether the store keeps runs of tied scores, and a read of the top rows.
Like access counts, the choice depends on the data: it is operator information
(`result.diagnostics.plan`), never part of `result.release()` (DESIGN invariant 7).

The in-store one-shot's cost (in_store_seconds): a round trip, the exceedances' lookups, and the
keyed hash on the rows that can win, which the top rows count only where they reach below the
split's level under the k-th score (skewed data); otherwise the model assumes every row (a
plateau or a spread of scores looks the same in the top rows), so `auto` takes the in-store
one-shot only where the top rows show it cheap. A store whose every sorted read is a scan
(StoreCosts.sorted_scans: DuckDB reading its table as it is now) gets the in-store one-shot
without a read: its probe would cost as much as the one-shot itself. A store whose in-store
one-shot reads another relation than its sorted reads (DuckDB's frozen copy with a pending delta:
the table itself) prices it by its `oneshot_fixed`. A store reading its table itself because its
copy is stale, which serves reads by rank and further sorted reads only from the copy, refreshed
first (Spark: `StoreCosts.copy_refresh`), has a threshold run that goes past the rows read (the
end of the block holding its estimated stop) priced with that refresh and then on the copy, and
a full read likewise; its in-store one-shot reads the table and pays none.

Where the full read costs no more than the cheapest threshold run (one block: two round trips
and k sorted rows) and no more than the least the in-store one-shot can cost, nothing the top
rows show changes the choice: the full read is taken without reading them (a table read whole
into memory at 10^3 rows, where a threshold run's Python outweighs the one-shot's).

The estimate of the threshold run's steps. At step s TA's threshold is h[s] plus the (s+1)-th
largest of m noises, about b ln(m / (s + 1)) for Gumbel(b); the k-th best value it has seen is at
least about h[k-1] + 0.37 b (the median Gumbel noise, on the k best scores) and at least
h[s] + b ln((s + 1) / k) (the k-th largest noise of s + 1 items all scoring >= h[s]). The run
stops near the first s where the threshold falls below either; the second alone gives
s + 1 = sqrt(mk), the plateau's cost (Theorem 5.4). Past the rows read, the estimate is
sqrt(mk), capped by the expected-cost bound 2 (sqrt(mk) + sqrt(m/2)) of Theorem 4.2.

Random reads. Where runs of tied scores answer random access, a threshold run reads no row by
rank; where the estimated run stops within the top rows read, none either (their bounds settle
the random accesses). Otherwise block-max pruning (mechanisms/threshold.py) reads the
first block's L2 items (nothing bounds them yet), at most the zone map, and the few items near
the stop: the model takes at most three batches and 2k + 2 ZONE_MAP_ROWS rows. That assumes the
tail lies below what the noise can lift to the threshold; where it does not (scores spread
within a few b ln(m) of the top, no ties), pruning reads more and the estimate is low.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .access import (
    ZONE_MAP_ROWS,
    CountAtLeast,
    CountedAccess,
    StoreCosts,
    implements,
    offers_in_store,
    store_costs,
)
from .keyed_noise import KeyedNoise, default_exceedances, split_level
from .mechanisms.threshold import Batching

MEDIAN_GUMBEL = -math.log(math.log(2.0))  # 0.3665
GROWTH = 2.0
# The top rows the planner reads first: max(2k, PROBE_ROWS) (stores may serve them with the
# run's first query: DuckDB's frozen copy, PostgreSQL's live table).
PROBE_ROWS = 64


@dataclass(frozen=True)
class Plan:
    """The planner's choice and what it rests on (seconds are modelled, not measured)."""

    chosen: str  # "threshold", "oneshot_in_store" or "oneshot_full_read"
    steps: int  # estimated steps of the threshold run
    probe_rows: int  # top rows read to estimate them
    threshold_seconds: float
    oneshot_seconds: float
    oneshot_kind: str  # which one-shot was priced

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def estimate_steps(scores: np.ndarray, k: int, m: int, scale: float) -> int:
    """Estimated steps of a threshold run from the top scores `scores` (module docstring)."""
    root = math.sqrt(m * k)
    bound = 2.0 * (root + math.sqrt(m / 2.0))
    fallback = int(min(m, bound, math.ceil(root)))
    n = len(scores)
    if n < k:
        return fallback
    s = np.arange(k - 1, n, dtype=np.float64)
    h = scores[k - 1 : n]
    tau = h + scale * np.log(m / (s + 1.0))
    seen = np.maximum(scores[k - 1] + scale * MEDIAN_GUMBEL, h + scale * np.log((s + 1.0) / k))
    stops = np.flatnonzero(tau <= seen)
    return int(s[stops[0]]) + 1 if len(stops) else fallback


def threshold_seconds(
    steps: int,
    k: int,
    m: int,
    costs: StoreCosts,
    tied_runs: bool,
    pruned: bool = False,
    prefix_rows: int = 0,
) -> float:
    """Modelled cost of a threshold run of `steps` steps: per block a sorted read and a batch
    of random reads, per step a sorted row and a random row. No random reads where runs of tied
    scores answer them; where `pruned` (block-max pruning, on every store), at most three
    batches and 2k + 2 ZONE_MAP_ROWS rows (module docstring). Blocks grow x2 from 2k; where
    batches are flat, two blocks' worth of round trips (the store reads ahead: DuckDB's
    `sorted_read_rows`). Batches are priced as full ones, though a pruned run's are small
    (DuckDB serves those from its index): an overestimate. Where the estimated run stops
    within the `prefix_rows` already read (skewed data), none: the prefix bounds every unread
    score below what can still win (measured: a zipf run at 10^7 reads no random row on DuckDB,
    PostgreSQL or a live table)."""
    blocks = 1 + max(0, math.ceil(math.log(max(steps, 1) / (2 * k), GROWTH)))
    if costs.flat_random_batches(m):
        blocks = min(blocks, 2)
    batches, rows = blocks, steps
    if pruned:
        batches, rows = min(blocks, 3), min(steps, 2 * k + 2 * ZONE_MAP_ROWS)
        if steps <= prefix_rows:  # the run stops in the rows read: their bounds settle it
            batches, rows = 0, 0
    random = 0.0 if tied_runs else batches * costs.random_batch_seconds(m) + rows * costs.random_row
    return blocks * 2 * costs.round_trip + steps * costs.sorted_row + random


def in_store_seconds(
    scores: np.ndarray,
    k: int,
    m: int,
    scale: float,
    costs: StoreCosts,
    count_at_least: Any = None,
) -> float:
    """Modelled cost of the in-store one-shot (keyed_noise.py): one round trip, a batch of
    random reads for the exceedances (where the table is split), and the keyed hash on the rows
    that can win: those within the split's level, or the ceiling, and one b below the k-th top
    score, counted in the top rows `scores` when they reach below that, else taken as all m
    (the top rows cannot tell)."""
    exceedances = default_exceedances(m, k)
    if exceedances is not None:
        level = split_level("gumbel", scale, m, exceedances)
        lookups = costs.random_batch_seconds(m) + exceedances * costs.random_row
    else:  # a small table is not split: the grid's ceiling bounds the noise
        level, lookups = KeyedNoise("", "gumbel", scale).ceiling, 0.0
    hashed = m
    if len(scores) >= k and scores[-1] < scores[k - 1] - level - scale:
        hashed = int(np.count_nonzero(scores >= scores[k - 1] - level - scale))
    elif len(scores) >= k and count_at_least is not None:  # the store counts them (zone maps)
        counted = count_at_least(float(scores[k - 1] - level - scale))
        hashed = m if counted is None else int(counted)
    if costs.oneshot_fixed is not None:
        return costs.oneshot_fixed + hashed * costs.oneshot_row
    return costs.round_trip + costs.oneshot_query + lookups + hashed * costs.oneshot_row


def plan_run(access: CountedAccess, k: int, scale: float) -> Plan:
    """Read the top rows (counted: a threshold run reads them anyway) and choose the method."""
    m = access.m
    costs = store_costs(access.source)
    if costs.sorted_scans and offers_in_store(access.source):
        # A store that reads its table as it is now (DuckDB, not frozen): every sorted read is
        # a scan as dear as the one-shot's own, so the one-shot, without reading first.
        fixed = costs.oneshot_fixed if costs.oneshot_fixed is not None else costs.round_trip
        return Plan("oneshot_in_store", 0, 0, math.inf, fixed, "oneshot_in_store")
    full = _full_read_seconds(costs, m)
    least = 2 * costs.round_trip + k * costs.sorted_row  # the cheapest threshold run: one block
    if full <= least and costs.copy_refresh is None and full <= _least_in_store(access, k, costs):
        # Nothing a read of the top rows shows can make another way cheaper: the full read,
        # without that read (a table read whole at 10^3 rows: rows in hand, Python the cost).
        return Plan("oneshot_full_read", 0, 0, least, full, "oneshot_full_read")
    probe = min(m, max(2 * k, PROBE_ROWS))
    access.fetch_sorted_until(probe)
    scores = np.asarray(access.prefix_scores()[:probe], dtype=np.float64)
    steps = estimate_steps(scores, k, m, scale)
    # read on towards the estimate (never past sqrt(mk)), unless the store's one-shot is a
    # few scans (`oneshot_fixed`: a table read as it is now, where each sorted read is a scan)
    if steps > probe and steps < m and costs.oneshot_fixed is None and not costs.sorted_scans:
        more = min(m, math.ceil(math.sqrt(m * k)), 4 * probe)
        access.fetch_sorted_until(more)
        scores = np.asarray(access.prefix_scores()[:more], dtype=np.float64)
        probe = more
        steps = estimate_steps(scores, k, m, scale)
    run_count = access.run_count
    tied_runs = run_count is not None and run_count * 100 < m
    # Block-max pruning bounds unread scores on every store (ranked: known ranks and the zone
    # map; unranked: the prefix's last score), so the model prices pruned random reads on all.
    thr = threshold_seconds(steps, k, m, costs, tied_runs, pruned=True, prefix_rows=probe)
    refresh = costs.copy_refresh
    if refresh is not None and block_end(steps, k, m) > probe:
        # A store reading its table itself serves reads by rank and sorted reads past the rows
        # read only from its copy, refreshed first: a run that goes on past the probe (random
        # reads, or a further sorted read) pays the refresh, then runs on the copy.
        thr = refresh.seconds + threshold_seconds(
            steps, k, m, refresh.costs, False, pruned=True, prefix_rows=probe
        )
    kind, one = _oneshot_choice(access, scores, k, m, scale, costs)
    chosen = "threshold" if thr <= one else kind
    return Plan(chosen, steps, probe, thr, one, kind)


def block_end(steps: int, k: int, m: int) -> int:
    """The depth a threshold run of `steps` steps reads sorted rows to: the end of the default
    Batching's block holding its last step (blocks of 2k steps, then x2)."""
    end = 0
    for size in Batching().blocks(k):
        if end >= steps or end >= m:
            break
        end += size
    return min(end, m)


def _oneshot_choice(
    access: CountedAccess, scores: np.ndarray, k: int, m: int, scale: float, costs: StoreCosts
) -> tuple[str, float]:
    """The cheaper one-shot (in the store where it can run, or over a full read) and its cost.
    A full read a store serves only from a refreshed copy (`copy_refresh`) pays the refresh."""
    full = _full_read_seconds(costs, m)
    if offers_in_store(access.source):
        source = access.source
        counter = source.count_at_least if implements(source, CountAtLeast) else None  # type: ignore[attr-defined]
        in_store = in_store_seconds(scores, k, m, scale, costs, counter)
        if in_store < full:
            return "oneshot_in_store", in_store
    return "oneshot_full_read", full


def _full_read_seconds(costs: StoreCosts, m: int) -> float:
    """Modelled cost of the one-shot over a full read: a round trip and m rows, after the
    copy's refresh where only a refreshed copy serves it (`copy_refresh`)."""
    if costs.copy_refresh is not None:
        copy = costs.copy_refresh.costs
        return costs.copy_refresh.seconds + copy.round_trip + m * copy.full_read_row
    return costs.round_trip + m * costs.full_read_row


def _least_in_store(access: CountedAccess, k: int, costs: StoreCosts) -> float:
    """A lower bound on the in-store one-shot's modelled cost (in_store_seconds with k rows
    hashed, no lookups), infinite where the store does not offer it."""
    if not offers_in_store(access.source):
        return math.inf
    if costs.oneshot_fixed is not None:
        return costs.oneshot_fixed + k * costs.oneshot_row
    return costs.round_trip + costs.oneshot_query + k * costs.oneshot_row
