"""StableTopK: private top-k with an adaptive k (Zhu & Wang, AISTATS 2022, Algorithms 1-5).

A1 (Regularized Large Gap): k~ = argmax_{j <= k_bar} {h_(j) - h_(j+1) + r(j) + Gumbel(2/eps)}.
    The gap has sensitivity 1, so this is the exponential mechanism: eps-DP, eps^2/8-zCDP and the
    RDP curve of their Proposition 7. With the cap k_bar it reads only the first k_bar + 1 counts
    (k_bar + 1 sorted accesses); without it, everything.
A2 (StableTopK, adaptive k): k~ by A1 with eps = 2 sqrt(rho), then propose-test-release on the
    gap q = h_(k~) - h_(k~+1):
      A4 (Gaussian): q^ = max{1, q} + N(0, 1/rho) - sqrt(2 ln(1/delta_t) / rho),
      A5 (Laplace):  q^ = q + Lap(1/eps2) - ln(1/delta_t)/eps2, with eps2 = sqrt(rho) here
                     (eps2^2/2 = rho/2, the same zCDP share as A4: our choice);
    if q^ > 1 the true top-k~ set is released without noise, else the bottom symbol.
    Theorem 11: delta_t-approximate rho-zCDP (A1: rho/2, PTR: rho/2 by Lemma 18 / Corollary 19).
A3 (target k): A2 at rho/2 with r(j) = -lam |j - k|, then the exponential mechanism with pure
    budget eps_EM = 2 sqrt(rho) (peeling, Gumbel scale n/eps_EM for n items, equal in
    distribution by Durfee & Rogers Lemma 4.2):
      bottom         -> top-k EM on h,
      k~ = k         -> the released set,
      k~ > k         -> top-k EM among the released k~ items,
      k~ < k         -> the released set plus a top-(k - k~) EM on the other items.
    Theorem 12: delta_t-approximate rho-zCDP (the EM part is eps_EM-range-bounded at worst, i.e.
    rho/2-zCDP, Cesar & Rogers 2021).
    The EM over the whole histogram runs as the private threshold algorithm (Wu et al.
    Algorithm 3, via private_top_k) on the same store, so a capped A3 still reads a sublinear
    number of rows; its accesses are added to the prefix's.

The released sets are unordered: items are returned in random order (ranked=False).
"""

from __future__ import annotations

import functools
import math
import numbers
from contextlib import nullcontext
from typing import Any, Literal

import numpy as np

from ..access import (
    AccessStats,
    CountedAccess,
    Rows,
    RunTraits,
    Source,
    StoreTraits,
    positions_are_ranks,
    store_traits,
)
from ..accounting import (
    MechanismResult,
    PrivacyBudget,
    PrivacyCost,
    RdpCurve,
    charge,
    gaussian_rdp,
    laplace_rdp,
    pure_dp_rdp,
    range_bounded_zcdp,
    rdp_to_dp_epsilon,
    record,
)
from ..api import private_top_k
from ..privacy import PrivacyGuarantee, check_neighbours, require_unit_sensitivity
from ..randomness import make_rng
from ..release_keys import keyable
from ..validation import check_k_within

TESTS = ("gaussian", "laplace")
PURE_SOURCE = "pure: A1 eps-DP + A5 (eps2, delta_t)-DP (Corollary 19), basic composition"


def _em_rdp(epsilon: float) -> RdpCurve:
    """Zhu & Wang 2022, Proposition 7: an eps-range-bounded, eps-DP selection is
    (alpha, min{alpha eps^2/8, pure-DP curve})-RDP."""
    return lambda alpha: min(alpha * range_bounded_zcdp(epsilon), pure_dp_rdp(epsilon, alpha))


def _a2_parts(rho: float, test: str) -> tuple[list[RdpCurve], float | None]:
    """RDP curves of A1 and of the PTR test in A2 at zCDP rho, and A2's pure epsilon if any."""
    eps1 = 2.0 * math.sqrt(rho)
    curves = [_em_rdp(eps1)]
    if test == "gaussian":
        sigma = 1.0 / math.sqrt(rho)
        curves.append(lambda alpha: gaussian_rdp(sigma, alpha))
        return curves, None
    eps2 = math.sqrt(rho)
    curves.append(lambda alpha: laplace_rdp(1.0 / eps2, alpha))
    return curves, eps1 + eps2


def stable_cost(
    rho: float, delta_t: float, test: str = "gaussian", target: bool = False
) -> PrivacyCost:
    """The guarantee of stable_top_k (Zhu & Wang 2022, Theorem 11 for A2, Theorem 12 for A3)."""
    if target:
        curves, pure = _a2_parts(rho / 2.0, test)
        eps_em = 2.0 * math.sqrt(rho)
        curves.append(_em_rdp(eps_em))
        pure = None if pure is None else pure + eps_em
    else:
        curves, pure = _a2_parts(rho, test)
    return PrivacyCost(
        recipe=(
            "topk_middleware.mechanisms.stable:stable_cost",
            (("rho", rho), ("delta_t", delta_t), ("test", test), ("target", target)),
        ),
        mechanism="stable_top_k" + ("_target" if target else ""),
        epsilon=pure,
        delta=delta_t,
        rho=rho,
        rdp=lambda alpha: sum(curve(alpha) for curve in curves),
        sources=(
            "Zhu & Wang 2022, Theorem 11 (A2) / Theorem 12 (A3): delta_t-approximate rho-zCDP",
            "RDP: Proposition 7 (A1, EM), Corollary 19 (PTR), Lemma 16 (composition)",
        )
        + (
            ("pure: A1 eps-DP + A5 (eps2, delta_t)-DP (Corollary 19), basic composition",)
            if pure
            else ()
        ),
    )


@functools.lru_cache(maxsize=256)
def _headline_epsilon(rho: float, delta_t: float, test: str, target: bool, delta: float) -> float:
    """epsilon of (epsilon, delta + delta_t)-DP from the RDP curve (cached: it costs a few ms)."""
    curve = stable_cost(rho, delta_t, test, target).rdp
    return rdp_to_dp_epsilon(curve, delta)[0]  # type: ignore[arg-type]


class _Suffix:
    """The histogram without the items at its first `offset` depths, as a Source (for the EM on
    h \\ S). `removed` are their positions. Where positions are ranks the suffix's positions are
    the ranks shifted down by `offset`; otherwise each removed position below m - offset is given
    to one of the items at the positions m - offset .. m - 1 that remain (so positions stay dense).
    """

    def __init__(self, source: Source, offset: int, removed: np.ndarray) -> None:
        self.source, self.offset = source, offset
        self.positions_are_ranks = positions_are_ranks(source)
        m = int(source.domain_size())
        removed = np.asarray(removed, dtype=np.int64)
        holes = np.sort(removed[removed < m - offset])
        tail = np.arange(m - offset, m, dtype=np.int64)
        movers = np.setdiff1d(tail, removed)  # sorted, as many as the holes
        self._to_source = dict(zip(holes.tolist(), movers.tolist(), strict=True))
        self._from_source = dict(zip(movers.tolist(), holes.tolist(), strict=True))

    def traits(self) -> StoreTraits:
        return store_traits(self.source)

    def run_traits(self) -> RunTraits:
        return RunTraits(positions_are_ranks=self.positions_are_ranks)

    def domain_size(self) -> int:
        return int(self.source.domain_size()) - self.offset

    def snapshot(self) -> nullcontext[None]:
        return nullcontext()  # runs inside the caller's snapshot

    def _shift(self, rows: Rows) -> Rows:
        if self.positions_are_ranks:
            positions = rows.positions - self.offset
        else:
            moved = self._from_source
            positions = np.array([moved.get(p, p) for p in rows.positions.tolist()], np.int64)
        return Rows(positions, rows.ids, rows.scores, rows.round_trips)

    def read_sorted(self, start: int, count: int) -> Rows:
        return self._shift(self.source.read_sorted(start + self.offset, count))

    def read_positions(self, positions: np.ndarray) -> Rows:
        if self.positions_are_ranks:
            wanted = np.asarray(positions) + self.offset
        else:
            moved = self._to_source
            wanted = np.array([moved.get(p, p) for p in np.asarray(positions).tolist()], np.int64)
        return self._shift(self.source.read_positions(wanted))

    def read_ids(self, ids: Any) -> np.ndarray:
        return self.source.read_ids(ids)


def _add(a: AccessStats, b: AccessStats) -> AccessStats:
    return AccessStats(
        a.sorted + b.sorted,
        a.random + b.random,
        a.rows_fetched + b.rows_fetched,
        a.round_trips + b.round_trips,
    )


def _check(
    rho: float, delta_t: float, k: int | None, k_bar: int | None, test: str, lam: float
) -> None:
    for name, value in (("rho", rho), ("delta_t", delta_t), ("lam", lam)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a real number, got {value!r}")
    if not (math.isfinite(rho) and rho > 0):
        raise ValueError(f"rho must be finite and > 0, got {rho}")
    if not (0.0 < delta_t < 1.0):
        raise ValueError(f"delta_t must be in (0, 1), got {delta_t}")
    if test not in TESTS:
        raise ValueError(f"test must be one of {TESTS}, got {test!r}")
    for name, value in (("k", k), ("k_bar", k_bar)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1
        ):
            raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
    if not (math.isfinite(lam) and lam >= 0):
        raise ValueError(f"lam must be finite and >= 0, got {lam}")


@keyable
def stable_top_k(
    source: Source,
    rho: float,
    delta_t: float,
    *,
    k: int | None = None,
    k_bar: int | None = None,
    test: Literal["gaussian", "laplace"] = "gaussian",
    lam: float = 1.0,
    delta: float | None = None,
    seed: int | None = None,
    budget: PrivacyBudget | None = None,
    neighbours: str = "add_remove",
) -> MechanismResult:
    """Zhu-Wang StableTopK: A2 (k=None: adaptive k, may return bottom) or A3 (target k).

    `rho`, `delta_t`: the delta_t-approximate rho-zCDP budget. `k_bar` caps the chosen k (and the
    sorted prefix read). `delta` is where `result.privacy` converts to (epsilon, delta + delta_t)
    (default: delta_t). Guarantees are for add/remove-one-client neighbours; "replace" is
    refused. `seed` is for tests only.
    """
    _check(rho, delta_t, k, k_bar, test, lam)
    check_neighbours(neighbours)
    require_unit_sensitivity(source, "stable_top_k (StableTopK: its gap test assumes unit steps)")
    if neighbours == "replace":
        raise ValueError(
            "stable_top_k is calibrated for add/remove-one-client neighbours only: under "
            "replace-one neighbours a gap h_(j) - h_(j+1) moves by up to 2 and the released top-k "
            "set is not noised, so the propose-test-release test (A4/A5) has no valid calibration "
            "here; nothing was read or charged"
        )
    if delta is not None and not (isinstance(delta, numbers.Real) and 0.0 < delta < 1.0):
        raise ValueError(f"delta must be in (0, 1) or None, got {delta!r}")
    rho, delta_t = float(rho), float(delta_t)
    target = k is not None
    cost = stable_cost(rho, delta_t, test, target)
    rng = make_rng(seed)
    with source.snapshot():
        access = CountedAccess(source)
        m = access.m
        if m < 2:
            raise ValueError("StableTopK needs at least two items (it selects a gap)")
        if target:
            check_k_within(int(k), m)  # type: ignore[arg-type]
        span = m - 1 if k_bar is None else min(int(k_bar), m - 1)
        charge(budget, cost)
        if span == m - 1:
            scores = np.asarray(access.read_all().scores, dtype=np.float64)
        else:
            access.fetch_sorted_until(span + 1)
            scores = np.array([access.sorted_access()[1] for _ in range(span + 1)])
        a2_rho = rho / 2.0 if target else rho
        # A1: the gap at j (1-based) is scores[j-1] - scores[j], j = 1..span.
        gaps = scores[:span] - scores[1 : span + 1]
        j = np.arange(1, span + 1)
        utility = gaps - (lam * np.abs(j - int(k)) if target else 0.0)
        eps1 = 2.0 * math.sqrt(a2_rho)
        k_tilde = int(np.argmax(utility + rng.gumbel(0.0, 2.0 / eps1, span))) + 1
        q = float(gaps[k_tilde - 1])
        if test == "gaussian":
            sigma = 1.0 / math.sqrt(a2_rho)
            q_hat = max(1.0, q) + rng.normal(0.0, sigma) - sigma * math.sqrt(2 * -math.log(delta_t))
        else:
            eps2 = math.sqrt(a2_rho)
            q_hat = q + rng.laplace(0.0, 1.0 / eps2) - -math.log(delta_t) / eps2
        passed = q_hat > 1.0
        stats = access.stats
        ranks: list[int] = list(range(k_tilde)) if passed else []
        items = access.ids_at_depths(ranks)
        if target:
            eps_em = 2.0 * math.sqrt(rho)
            want = int(k)  # type: ignore[arg-type]
            if not passed:
                extra = private_top_k(
                    _Suffix(source, 0, np.empty(0, np.int64)),
                    want,
                    eps_em,
                    0.0,
                    "gumbel",
                    seed=rng,
                )
                items, stats = list(extra.items), _add(stats, extra.accesses)
            elif k_tilde > want:
                noisy = scores[:k_tilde] + rng.gumbel(0.0, want / eps_em, k_tilde)
                keep = np.argsort(-noisy, kind="stable")[:want]
                items = access.ids_at_depths(sorted(int(r) for r in keep))
            elif k_tilde < want:
                extra = private_top_k(
                    _Suffix(source, k_tilde, access.prefix_positions()[:k_tilde]),
                    want - k_tilde,
                    eps_em,
                    0.0,
                    "gumbel",
                    seed=rng,
                )
                items, stats = items + list(extra.items), _add(stats, extra.accesses)
        order = rng.permutation(len(items))
        items = [items[i] for i in order]
    report_delta = delta_t if delta is None else float(delta)
    eps_report = _headline_epsilon(rho, delta_t, test, target, report_delta)
    guarantee = PrivacyGuarantee(
        eps_report,
        report_delta + delta_t,
        test,
        1.0 / math.sqrt(rho),
        f"Zhu & Wang 2022, Theorem {12 if target else 11}: delta_t-approximate rho-zCDP, "
        "RDP converted by Canonne-Kamath-Steinke 2020 Prop. 12 (add/remove one client)",
    )
    result = MechanismResult(
        items,
        guarantee,
        stats,
        False,
        "stable_top_k",
        m,
        bottom=not target and not passed,
        k_chosen=k_tilde,
        cost=cost,
        details={"passed_test": passed},
    )
    return record(budget, result)
