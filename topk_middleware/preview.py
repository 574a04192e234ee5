"""`preview`: how good a private top-k would be at each epsilon, for the table's owner.

NOT A PRIVATE RELEASE. The preview reads the exact counts and reports figures that depend on
them; it charges no budget, and its output must never be shown to an analyst. It is reachable
from Python and from the command line (`topk-middleware preview`), never from the SQL functions.

What it reads: the histogram of the scores (topk_middleware/score_histogram.py,
`read_histogram`): the store's runs of tied scores where it keeps them, else the top 16k + 1
rows and one binned aggregate of the rest, else one full read. Nothing is read per item beyond
the top rows.

What it computes, for each epsilon and mechanism, from `trials` simulated releases on that
histogram (fixed `seed`: the same figures every time):
    precision@k       the share of the k released places held by an item whose true count is at
                      least the true k-th count h_(k) (a tie with h_(k) counts as right);
    k-relative error  max over released items of max(0, h_(k) - h_i) (Gillenwater et al. 2022),
                      its 25/50/75% quantiles; a release of fewer than k items (limited domain's
                      bottom symbol) scores its missing places as wrong and not as error;
    P(exact top-k)    the chance that every place is right;
    tail items        the expected number of released items whose count is at most
                      `near_zero` x h_(k) (zero included).
The simulation draws exactly the mechanism's law, not an approximation of it:
  * "threshold" (the default private_top_k: Gumbel noise; the private threshold algorithm, the
    one-shot and peeling share this law, Wu et al. 2023 Lemma 3.1 / Durfee & Rogers Lemma 4.2)
    and "laplace" (the Laplace one-shot): the top 8k items' noise is drawn, tau = the k-th
    largest of their noisy values is a lower bound of the release's k-th noisy value, and in
    every other run of n tied items the number c whose noisy value passes tau is
    Binomial(n, P(Z > tau - v)); the k largest of their c noises (all that can be released)
    are drawn from the law of Z above tau - v through the order statistics of c uniforms
    (inverse survival function). The release is the top k of what passed: exact, and at most
    8k + k x (runs with an item past tau) draws per trial.
  * "limited_domain" (Durfee & Rogers 2019, Algorithm 1): its top k_bar + 1 counts and noises.
    The k_bar reported is the best of k, 2k, 4k, 8k, 16k (below m).
  * "joint" (Gillenwater et al. 2022): its own sampler (mechanisms/joint.py) on the top counts.
Calibration is the one each mechanism would use for a total (epsilon, delta): `calibrate` for
Gumbel and Laplace; for limited domain, delta/2 sets its threshold and delta/2 is the delta' of
its Theorem 1, whose per-item epsilon is the largest meeting epsilon
(`limited_domain_item_epsilon`).

Cost: one read of the histogram (above: 2-3 round trips, at most 16k + 1 rows plus a row per
distinct score or bin) plus trials x (8k + near-top items) draws per epsilon and mechanism; no
budget, no ledger, no write.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .access import AccessStats, CountedAccess, Source
from .accounting import limited_domain_epsilon
from .mechanisms.joint import JOINT_MAX_K, TAIL_LOG_MARGIN, log_number_of_sets, sample_joint
from .mechanisms.limited_domain import threshold_offset
from .names import PREVIEW_DEFAULT_METHODS, PREVIEW_EPSILONS, PREVIEW_METHODS
from .noise import make_noise
from .privacy import calibrate
from .score_histogram import HEAD_ROWS_PER_K, ScoreHistogram, read_histogram
from .validation import check_common, check_k_within

DEFAULT_METHODS = PREVIEW_DEFAULT_METHODS
DEFAULT_EPSILONS = PREVIEW_EPSILONS
NOTICE = (
    "PREVIEW FOR THE TABLE'S OWNER: computed from the exact counts; not a private release. "
    "Do not show it to analysts. No budget was charged."
)
# Where the default falls this far below the best mechanism, or releases this many tail items
# on average, the preview recommends the better setting.
PRECISION_GAP = 0.05
TAIL_WARNING = 0.5
JOINT_MAX_PREFIX = 200_000
# The one-shot simulation draws the top HEAD_FACTOR x k items one by one: the k-th largest of
# their noisy values bounds the release's k-th from below, so few others pass it.
HEAD_FACTOR = 8  # the joint sampler's prefix (k x prefix floats per draw)
BLOCK_CELLS = 1 << 21  # (trial, run) pairs the one-shot simulation holds at once


@dataclass(frozen=True)
class Outcome:
    """The figures of one (epsilon, mechanism) point, from `trials` simulated releases."""

    method: str
    epsilon: float
    precision: float
    error_quantiles: tuple[float, float, float]
    exact: float
    tail_items: float
    k_bar: int | None = None

    @property
    def median_error(self) -> float:
        return self.error_quantiles[1]

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "epsilon": self.epsilon,
            "k_bar": self.k_bar,
            "precision": self.precision,
            "error_q25": self.error_quantiles[0],
            "error_median": self.error_quantiles[1],
            "error_q75": self.error_quantiles[2],
            "exact": self.exact,
            "tail_items": self.tail_items,
        }


@dataclass(frozen=True)
class Preview:
    """What `preview` found; `str()` renders it as the CLI prints it. Owner only (NOTICE)."""

    k: int
    m: int
    delta: float
    kth_count: float
    tail_size: int
    outcomes: tuple[Outcome, ...]
    recommendations: tuple[str, ...]
    accesses: AccessStats
    notice: str = NOTICE
    histogram_runs: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def outcome(self, method: str, epsilon: float) -> Outcome:
        for item in self.outcomes:
            if item.method == method and item.epsilon == epsilon:
                return item
        raise KeyError(f"no outcome for method {method!r} at epsilon {epsilon!r}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "notice": self.notice,
            "k": self.k,
            "m": self.m,
            "delta": self.delta,
            "kth_count": self.kth_count,
            "tail_size": self.tail_size,
            "histogram_runs": self.histogram_runs,
            "rows_fetched": self.accesses.rows_fetched,
            "round_trips": self.accesses.round_trips,
            "outcomes": [item.as_dict() for item in self.outcomes],
            "recommendations": list(self.recommendations),
        }

    def __str__(self) -> str:
        lines = [
            self.notice,
            f"m = {self.m}, k = {self.k}, delta = {self.delta:g}; true k-th count "
            f"{self.kth_count:g}; {self.tail_size} items in the near-zero tail; read "
            f"{self.accesses.rows_fetched} rows in {self.accesses.round_trips} round trips",
            f"{'epsilon':>8} {'mechanism':<16} {'k_bar':>6} {'prec@k':>7} {'err25':>8} "
            f"{'err50':>8} {'err75':>8} {'P(exact)':>8} {'tail':>6}",
        ]
        for item in self.outcomes:
            q25, q50, q75 = item.error_quantiles
            lines.append(
                f"{item.epsilon:>8g} {item.method:<16} {item.k_bar or '':>6} "
                f"{item.precision:>7.3f} {q25:>8.4g} {q50:>8.4g} {q75:>8.4g} {item.exact:>8.3f} "
                f"{item.tail_items:>6.2f}"
            )
        lines.extend(self.recommendations)
        return "\n".join(lines)


def limited_domain_item_epsilon(k: int, epsilon: float, delta_prime: float) -> float:
    """The largest per-item epsilon e with Theorem 1's eps'(k, e, delta') <= epsilon (Durfee &
    Rogers 2019; accounting.limited_domain_epsilon), by bisection: eps' is increasing in e."""
    low, high = epsilon / k, epsilon
    if limited_domain_epsilon(k, high, delta_prime) <= epsilon:
        return high
    for _ in range(100):
        mid = 0.5 * (low + high)
        if limited_domain_epsilon(k, mid, delta_prime) <= epsilon:
            low = mid
        else:
            high = mid
    return low


def release_figures(
    values: np.ndarray, kth: float, near_zero: float, k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-release precision@k, k-relative error and tail items, from the true counts `values`
    of the released items (releases x k, NaN for a place left empty)."""
    released = ~np.isnan(values)
    right = released & (values >= kth)
    precision = right.sum(axis=1) / k
    gap = np.where(released, kth - values, 0.0)
    error = np.maximum(gap.max(axis=1), 0.0)
    tail = (released & (values <= near_zero)).sum(axis=1)
    return precision, error, tail


def simulate_one_shot(
    hist: ScoreHistogram, k: int, noise: str, scale: float, trials: int, rng: np.random.Generator
) -> np.ndarray:
    """True counts of the k items of `trials` one-shot releases with noise of this law and scale
    (trials x k), drawn exactly (module docstring). For a block of trials at once (BLOCK_CELLS
    (trial, run) pairs): the head's noises, each trial's k best of them and tau, the k-th; for
    every run beyond the head, the Binomial count of its items whose noise passes tau. Then per
    trial, the k largest of those items' noises in each run, from the law above tau - v, and
    the k best of both. Work O(trials x (8k + runs x (1 + k))), no Python loop over runs or
    items."""
    law = make_noise(noise, scale)
    m = hist.m
    explicit = min(m, HEAD_FACTOR * k)  # the top items, drawn one by one
    head = hist.top(explicit)
    cum = np.cumsum(hist.sizes)
    boundary = int(np.searchsorted(cum, explicit))  # the run that holds depth `explicit`
    rest_sizes = hist.sizes.copy()
    if boundary < len(rest_sizes):
        rest_sizes[boundary] = cum[boundary] - explicit
    rest_sizes[:boundary] = 0
    keep = rest_sizes > 0
    values, sizes = hist.values[keep], rest_sizes[keep]
    head_noisy = head + law.sample(rng, (trials, explicit))
    best = np.argpartition(-head_noisy, k - 1, axis=1)[:, :k] if k < explicit else None
    if best is None:
        best = np.broadcast_to(np.arange(explicit), (trials, explicit))
    best_noisy = np.take_along_axis(head_noisy, best, axis=1)
    best_truth = head[best]
    # the k-th largest noisy value of the top items: a lower bound of the release's k-th
    tau = best_noisy.min(axis=1)
    out = np.empty((trials, k))
    step = max(1, BLOCK_CELLS // max(1, len(values)))
    for lo in range(0, trials, step):
        hi = min(trials, lo + step)
        with np.errstate(over="ignore"):
            passing = law.survival(tau[lo:hi, None] - values[None, :])
        counts = rng.binomial(sizes[None, :], passing)
        for t in range(lo, hi):
            row = counts[t - lo]
            which = np.flatnonzero(row)
            if not len(which):  # nothing beyond the head passes tau: the head's k best
                out[t] = best_truth[t]
                continue
            # of the c items of a run that pass tau, only the k largest noises can be released:
            # their survival probabilities are p (= P(Z > tau - v)) times the k smallest of c
            # uniforms, S_i / (S_j + G) for S_i the sums of i exponentials, i <= j = min(c, k),
            # and G ~ Gamma(c + 1 - j) (the order statistics of uniforms by exponential
            # spacings: exact, and O(k) draws per run however many pass)
            reps = row[which]
            take = np.minimum(reps, k)
            run_of = np.repeat(np.arange(len(which)), take)
            sums = np.cumsum(rng.standard_exponential(int(take.sum())))
            ends = np.cumsum(take) - 1
            before = np.concatenate([[0.0], sums[ends[:-1]]])
            spacing = sums - before[run_of]
            total = spacing[ends] + rng.standard_gamma(reps + 1 - take)
            tails = passing[t - lo, which][run_of] * (spacing / total[run_of])
            truth = values[which][run_of]
            noisy = truth + law.from_survival(tails)
            pool = np.concatenate([best_noisy[t], noisy])
            top = np.argpartition(-pool, k - 1)[:k]
            out[t] = np.concatenate([best_truth[t], truth])[top]
    return out


def simulate_limited_domain(
    hist: ScoreHistogram,
    k: int,
    k_bar: int,
    item_epsilon: float,
    delta: float,
    trials: int,
    rng: np.random.Generator,
    noise: np.ndarray | None = None,
) -> np.ndarray:
    """True counts of the released items of Algorithm 1 (trials x k, NaN after the bottom).
    `noise`: Gumbel(1/item_epsilon) draws (trials x at least k_bar + 1) to use, shared by the
    k_bar choices of one preview point (each choice still has its own exact law)."""
    scores = hist.top(k_bar + 1)
    if noise is None:
        noise = rng.gumbel(0.0, 1.0 / item_epsilon, (trials, k_bar + 1))
    noisy = scores + noise[:, : k_bar + 1]
    bottom = noisy[:, k_bar] + threshold_offset(k_bar, item_epsilon, delta, None)
    head = noisy[:, :k_bar]
    order = np.argpartition(-head, k - 1, axis=1)[:, :k] if k < k_bar else np.argsort(-head, 1)
    chosen = np.take_along_axis(head, order, axis=1)
    truth = scores[:k_bar][order]
    return np.where(chosen > bottom[:, None], truth, np.nan)


def simulate_joint(
    hist: ScoreHistogram, k: int, epsilon: float, trials: int, rng: np.random.Generator
) -> np.ndarray | None:
    """True counts of `trials` joint-mechanism sets (trials x k), or None where its prefix is
    too long to hold (k > JOINT_MAX_K or more than JOINT_MAX_PREFIX counts near h_(k))."""
    if k > JOINT_MAX_K:
        return None
    m = hist.m
    cut = 2.0 * (log_number_of_sets(m, k) + TAIL_LOG_MARGIN) / epsilon
    # every count >= h_(k) - cut, and one more (sample_joint's prefix rule)
    depth = min(m, int(hist.sizes[hist.values >= hist.kth(k) - cut].sum()) + 1)
    if depth > JOINT_MAX_PREFIX:
        return None
    scores = hist.top(depth)
    out = np.empty((trials, k))
    for t in range(trials):
        ranks = sample_joint(scores, m, k, epsilon, rng)
        if ranks is None:  # the draw needs the whole histogram
            return None
        out[t] = hist.at_ranks(np.asarray(ranks, dtype=np.int64))
    return out


def _outcome(
    method: str,
    epsilon: float,
    values: np.ndarray,
    kth: float,
    near_zero: float,
    k: int,
    k_bar: int | None = None,
) -> Outcome:
    precision, error, tail = release_figures(values, kth, near_zero, k)
    q = np.quantile(error, [0.25, 0.5, 0.75])
    return Outcome(
        method,
        float(epsilon),
        float(precision.mean()),
        (float(q[0]), float(q[1]), float(q[2])),
        float(np.mean(precision == 1.0)),
        float(tail.mean()),
        k_bar,
    )


def k_bar_choices(k: int, m: int) -> list[int]:
    """The k_bar values a preview tries for limited domain: k, 2k, 4k, 8k, 16k, below m."""
    return [k * f for f in (1, 2, 4, 8, 16) if k * f < m] or [m - 1]


def simulate(
    hist: ScoreHistogram,
    k: int,
    epsilon: float,
    delta: float,
    method: str,
    trials: int,
    rng: np.random.Generator,
    near_zero: float,
) -> Outcome | None:
    """One point of the preview: the method's calibration at (epsilon, delta), then its law."""
    kth = hist.kth(k)
    tail_bound = near_zero * kth
    m = hist.m
    if method in ("threshold", "laplace"):
        noise = "gumbel" if method == "threshold" else "laplace"
        scale = calibrate(noise, k, m, epsilon, delta).scale
        values = simulate_one_shot(hist, k, noise, scale, trials, rng)
        return _outcome(method, epsilon, values, kth, tail_bound, k)
    if method == "limited_domain":
        if delta <= 0.0 or m <= k:
            return None
        item_epsilon = limited_domain_item_epsilon(k, epsilon, delta / 2.0)
        best = None
        choices = k_bar_choices(k, m)
        # one draw for all choices (common random numbers: a paired comparison of the k_bars)
        shared = rng.gumbel(0.0, 1.0 / item_epsilon, (trials, max(choices) + 1))
        for k_bar in choices:
            values = simulate_limited_domain(
                hist, k, k_bar, item_epsilon, delta / 2.0, trials, rng, shared
            )
            found = _outcome(method, epsilon, values, kth, tail_bound, k, k_bar)
            if best is None or (found.precision, -found.median_error) > (
                best.precision,
                -best.median_error,
            ):
                best = found
        return best
    if method == "joint":
        values = simulate_joint(hist, k, epsilon, trials, rng)
        return None if values is None else _outcome(method, epsilon, values, kth, tail_bound, k)
    raise ValueError(f"method must be one of {PREVIEW_METHODS}, got {method!r}")


def _setting(item: Outcome) -> str:
    return item.method + (f" with k_bar = {item.k_bar}" if item.k_bar else "")


def recommend(outcomes: list[Outcome], default: str = "threshold") -> list[str]:
    """Where the default does badly (precision below the best by PRECISION_GAP, or TAIL_WARNING
    near-zero items released on average), a warning that names a setting doing at least as well:
    the best mechanism at that epsilon, else the smallest epsilon tried at which the default's
    tail is quiet; and the smallest epsilon at which some mechanism reaches precision 0.9."""
    lines: list[str] = []
    epsilons = sorted({item.epsilon for item in outcomes})
    for epsilon in epsilons:
        here = [item for item in outcomes if item.epsilon == epsilon]
        base = next((item for item in here if item.method == default), None)
        if base is None:
            continue
        best = max(here, key=lambda item: (item.precision, -item.median_error, -item.tail_items))
        tail = base.tail_items >= TAIL_WARNING
        if not tail and best.precision - base.precision < PRECISION_GAP:
            continue
        why = (
            f"the default releases {base.tail_items:.1f} near-zero items on average (the tail's "
            "largest noise outruns the k-th count)"
            if tail
            else f"the default's precision@k is {base.precision:.2f}"
        )
        if best is not base and best.precision > base.precision:
            fix = (
                f"use {_setting(best)} (precision@k {best.precision:.2f}, median k-relative "
                f"error {best.median_error:.3g}, {best.tail_items:.1f} near-zero items)"
            )
        else:
            quiet = [
                item
                for item in outcomes
                if item.method == default and item.epsilon > epsilon and item.tail_items < 0.5
            ]
            fix = (
                f"raise epsilon to {quiet[0].epsilon:g} (precision@k {quiet[0].precision:.2f}, "
                f"{quiet[0].tail_items:.1f} near-zero items) or lower k"
                if quiet
                else "lower k: no epsilon tried keeps the tail out"
            )
        lines.append(f"warning at epsilon {epsilon:g}: {why}; {fix}")
    # the smallest epsilon at which some mechanism reaches 0.9; there, the default if it does
    good = sorted(
        (item for item in outcomes if item.precision >= 0.9),
        key=lambda i: (i.epsilon, i.method != default, -i.precision),
    )
    if good:
        lines.append(
            f"recommendation: epsilon {good[0].epsilon:g} with {_setting(good[0])} is the smallest "
            f"epsilon tried whose precision@k reaches 0.9 ({good[0].precision:.2f})"
        )
    else:
        lines.append("recommendation: no epsilon tried reaches precision@k 0.9: try a smaller k")
    return lines


def smallest_scale(
    k: int, m: int, epsilons: tuple[float, ...], methods: tuple[str, ...], delta: float
) -> float:
    """The smallest noise scale among the points a preview simulates (Gumbel or Laplace scale;
    2 / epsilon for the joint mechanism's exponential weights)."""
    scales = [2.0 / max(epsilons)] if "joint" in methods else []
    for epsilon in epsilons:
        if "threshold" in methods:
            scales.append(calibrate("gumbel", k, m, epsilon, delta).scale)
        if "laplace" in methods:
            scales.append(calibrate("laplace", k, m, epsilon, delta).scale)
        if "limited_domain" in methods and delta > 0.0:
            scales.append(1.0 / limited_domain_item_epsilon(k, epsilon, delta / 2.0))
    return min(scales, default=1.0)


def check_preview_arguments(
    k: Any,
    epsilons: Any,
    methods: Any,
    delta: Any,
    trials: Any,
    near_zero: Any = 0.01,
) -> tuple[tuple[float, ...], tuple[str, ...]]:
    """Refuse bad preview arguments in the project's words before anything is read."""
    check_common(k, 1.0, delta)
    epsilons = tuple(epsilons)
    if not epsilons:
        raise ValueError("epsilons must name at least one epsilon")
    for epsilon in epsilons:
        check_common(k, epsilon, delta)
    methods = tuple(methods)
    unknown = [name for name in methods if name not in PREVIEW_METHODS]
    if unknown or not methods:
        raise ValueError(f"methods must be among {PREVIEW_METHODS}, got {list(methods)!r}")
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ValueError(f"trials must be a positive integer, got {trials!r}")
    if not (isinstance(near_zero, int | float) and 0.0 <= near_zero < 1.0):
        raise ValueError(
            f"near_zero must be a share of the k-th count in [0, 1), got {near_zero!r}"
        )
    return tuple(float(e) for e in epsilons), methods


def preview(
    source: Source,
    k: int,
    epsilons: tuple[float, ...] | list[float] = DEFAULT_EPSILONS,
    methods: tuple[str, ...] | list[str] = DEFAULT_METHODS,
    *,
    delta: float = 1e-6,
    trials: int = 200,
    seed: int = 0,
    near_zero: float = 0.01,
) -> Preview:
    """Predict, for each epsilon and mechanism, what a private top-k of `source` would give
    (module docstring). Owner only: it reads the exact counts, charges nothing, releases nothing.
    `delta`: the delta the releases would use (limited domain needs delta > 0). Cost: one read of
    the score histogram (`read_histogram`: the store's runs, or 16k + 1 rows and one aggregate
    on a live table)."""
    epsilons, methods = check_preview_arguments(k, epsilons, methods, delta, trials, near_zero)
    k = int(k)
    with source.snapshot():
        access = CountedAccess(source)
        check_k_within(k, access.m)
        scale = smallest_scale(k, access.m, epsilons, methods, float(delta))
        hist = read_histogram(access, k, scale)
    rng = np.random.default_rng(seed)
    outcomes: list[Outcome] = []
    for epsilon in epsilons:
        for method in methods:
            found = simulate(hist, k, float(epsilon), float(delta), method, trials, rng, near_zero)
            if found is not None:
                outcomes.append(found)
    kth = hist.kth(k)
    return Preview(
        k,
        hist.m,
        float(delta),
        kth,
        int(hist.sizes[hist.values <= near_zero * kth].sum()),
        tuple(outcomes),
        tuple(recommend(outcomes)),
        access.stats,
        histogram_runs=len(hist.values),
    )


__all__ = [
    "HEAD_ROWS_PER_K",
    "Preview",
    "ScoreHistogram",
    "check_preview_arguments",
    "preview",
    "read_histogram",
    "simulate",
    "simulate_one_shot",
]
