"""Trending lists: a private top-k refreshed every period on a live table under one stated total.

`trending_top_k(source, k, epsilon, horizon=T, budget=ledger_budget, name=...)` gives a
TrendingStream; a job calls `stream.tick()` once per period and gets a Tick: a fresh list, or
the list that stands. Two mechanisms:

- "independent": every tick is a Gumbel top-k selection (private_top_k: sublinear reads) of
  epsilon_t, the largest per-tick epsilon whose T releases the accountant (accounting.compose:
  basic, advanced, range-bounded or zCDP composition, the best that applies) composes within
  (epsilon, delta).
- "gated" (the sparse vector technique, Dwork & Roth 2014, Algorithms 1-2, Theorem 3.23): the
  first tick selects a list; each later tick asks an AboveThreshold gate whether the list is still
  right, on the gap q = (best count outside the list) - (lowest count in the list), and spends on a
  new selection only when the gate fires; at most `refreshes` = c times, after which the list
  stands to the horizon. A gate instance of epsilon_g adds Laplace(2 Delta / epsilon_g) to its
  threshold (drawn once per instance) and Laplace(4 Delta / epsilon_g) to each query, and fires
  when q + noise >= margin + threshold noise; it is epsilon_g-DP however many ticks it answers
  "the list stands". Delta is the gap's sensitivity: under add/remove-one-client neighbours each
  count moves by at most D (the source's sensitivity), so the best outside count and the lowest
  listed count each move by at most D and q by at most 2 D (Delta = 2 D, which also holds when
  counts move in opposite directions). Re-serving the list is post-processing. Worst case: c + 1
  selections of epsilon_s and c gate instances, composed by the accountant within (epsilon,
  delta). How the total is split (`plan_stream`) follows the rule that composes it: with delta =
  0 (basic composition: epsilons add up) a gate costs gate_share times a selection's epsilon and
  c defaults to ceil(T / 24); with delta > 0 (zCDP: rho adds up; a Gumbel top-k of epsilon e is
  e^2 / (8k)-zCDP, Cesar & Rogers 2021, a gate of epsilon g is g^2 / 2-zCDP, Bun & Steinke 2016
  Prop. 1.4) a gate costs gate_share times a selection's rho, and c defaults to ceil(T / 4): the
  selections' epsilon then falls as 1 / sqrt(c), not 1 / c, and a gate priced in epsilon would
  cost k times a selection's rho.

The neighbour relation is over the whole horizon: one client's whole stream of contributions
moves each count by at most D at every tick (a live table of cumulative counts). The stated
total (`stream.guarantee`) is then for everything the stream releases over its T ticks.

State lives in the ledger (PrivacyLedger's keyed rows, operator-side): the stream's key `<name>`,
made with the stream's first charges, holds its parameters' fingerprint and a 256-bit secret
from which every noise of the stream is derived (release_keys.derived_rng: the selection of
tick t, the query of tick t, the threshold of the gate begun at tick j); each tick's outcome is
stored under `<name>#<t>` (the list, when it was selected, the gate instance, the fires used);
a selection is charged under
`<name>#<t>/select` and a gate instance under `<name>#<t>/gate`, both in one transaction when a
list is selected. So a tick retried after a crash returns its stored outcome, or computes it
again with the same noise and no second charge: a tick whose selection is charged has fired,
whatever the retry's data; charges come before answers, so nothing is ever under-charged.
Ticks are numbered from 1; `tick()` without an index numbers it from the clock (`period`,
`start`), so a job retried within its period gets its tick's answer.
Cost per tick: a tick that stands reads k + 1 rows by sorted access and k by random access
(O(k)), one read of the ledger and one commit (its outcome); a selection adds one private_top_k
run (about sqrt(mk) accesses; after a gate that fired, in the gap's snapshot) and one commit
(its charges, before any of its rows is read).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from typing import Any, Literal

import numpy as np

from .accounting import PrivacyCost, compose, oneshot_cost
from .api import private_top_k
from .privacy import source_sensitivity
from .release import plain
from .release_keys import derived_rng, fingerprint, key_conflict, new_noise_key
from .validation import check_common

MECHANISMS = ("gated", "independent")
GATE_SOURCE = "Dwork & Roth 2014, Algorithm 1 (AboveThreshold), Theorem 3.23"
COMPOSITION_SOURCE = "accounting.compose: the best of basic, advanced and zCDP composition"
# How a stream keeps its state in the ledger (module docstring), in its fingerprint: a stream
# begun under another layout (per-tick noise keys) is refused, never continued with other noise.
STATE_LAYOUT = 2
_ROOT_TOLERANCE = 1e-12
_ROOT_STEPS = 200


def gate_cost(epsilon: float) -> PrivacyCost:
    """One AboveThreshold instance: epsilon-DP (Theorem 3.23), so epsilon^2 / 2-zCDP (Bun &
    Steinke 2016, Prop. 1.4)."""
    return PrivacyCost(
        mechanism="trending gate",
        epsilon=epsilon,
        rho=epsilon**2 / 2.0,
        sources=(GATE_SOURCE, "Bun & Steinke 2016, Prop. 1.4"),
    )


def gate_scales(epsilon: float, sensitivity: float) -> tuple[float, float]:
    """(threshold noise scale, query noise scale) of a gate: 2 Delta / eps and 4 Delta / eps for
    the gap's sensitivity Delta = 2 D."""
    gap_sensitivity = 2.0 * sensitivity
    return 2.0 * gap_sensitivity / epsilon, 4.0 * gap_sensitivity / epsilon


def gate_fires(gap: float, margin: float, threshold_noise: float, query_noise: float) -> bool:
    """AboveThreshold's test: the noisy gap reaches the noisy threshold."""
    return gap + query_noise >= margin + threshold_noise


def default_refreshes(horizon: int, delta: float) -> int:
    """The gated stream's refreshes when none are given: ceil(T / 24) under basic composition
    (delta = 0), ceil(T / 4) under zCDP (delta > 0) (module docstring); measured on the three
    streams of benchmarks/trending.py (docs/trending.md)."""
    return max(1, math.ceil(horizon / (24 if delta == 0.0 else 4)))


@dataclasses.dataclass(frozen=True)
class StreamGuarantee:
    """The stream's total over its horizon and how it was derived."""

    epsilon: float
    delta: float
    horizon: int
    mechanism: str
    select_epsilon: float  # each selection's epsilon
    gate_epsilon: float  # each gate instance's epsilon (0 for independent releases)
    refreshes: int  # selections after the first (gated; independent: horizon - 1)
    rule: str
    derivation: str


def _largest(costs_of: Any, epsilon: float, delta: float) -> tuple[float, str]:
    """The largest unit e in (0, epsilon] whose worst-case costs compose within (epsilon,
    delta), to a relative 1e-12 of the total, and the rule that composes it: the secant method
    on log(composed epsilon) against log(e) (near power laws: e for basic composition, between
    e and e^2 under zCDP) aimed just below the total, kept inside the bracket of the largest e
    known to fit and the smallest known not to (halved in log when a step leaves it). The
    accountant (accounting.compose) judges every e tried, and only an e it composes within
    (epsilon, delta) is returned. Cost: typically 3-6 compositions, against 60 for bisection."""
    aim = epsilon * (1.0 - _ROOT_TOLERANCE)
    low, low_rule = 0.0, ""  # fits (e = 0 releases nothing)
    high = epsilon
    composed = compose(costs_of(high), delta)
    if composed.epsilon <= epsilon:
        return high, composed.rule
    tried = [(high, composed.epsilon)]
    guess = high * epsilon / composed.epsilon  # the first step: linear from the origin
    for _ in range(_ROOT_STEPS):
        if not low < guess < high:
            guess = math.sqrt(low * high) if low > 0.0 else high / 2.0
        composed = compose(costs_of(guess), delta)
        if composed.epsilon <= epsilon:
            low, low_rule = guess, composed.rule
            if composed.epsilon >= epsilon * (1.0 - 2.0 * _ROOT_TOLERANCE):
                break
        else:
            high = guess
        if high - low <= _ROOT_TOLERANCE * high:
            break
        tried.append((guess, composed.epsilon))
        (e0, f0), (e1, f1) = tried[-2], tried[-1]
        if f0 > 0.0 and f1 > 0.0 and f0 != f1 and e0 != e1:
            power = math.log(f1 / f0) / math.log(e1 / e0)
            guess = e1 * math.exp(math.log(aim / f1) / power) if power > 0.0 else -1.0
        else:
            guess = -1.0  # outside the bracket: halved
    if low <= 0.0:
        raise ValueError(f"no per-release epsilon fits a total of {epsilon:g} over the horizon")
    return low, low_rule


def plan_stream(
    k: int,
    m: int,
    epsilon: float,
    delta: float,
    horizon: int,
    mechanism: str,
    refreshes: int,
    gate_share: float,
    sensitivity: float,
) -> StreamGuarantee:
    """Per-release epsilons for the stream's worst case, composed within (epsilon, delta). A
    gate costs `gate_share` of a selection in the currency of the composition: its epsilon when
    delta = 0, its zCDP rho (e^2 / (8k)) when delta > 0, so g = e sqrt(gate_share / (4k))."""

    def selection(e: float) -> PrivacyCost:
        return oneshot_cost("gumbel", k, m, e, 0.0, "add_remove", sensitivity)

    def gate_of(e: float) -> float:
        rho = selection(e).rho
        return math.sqrt(2.0 * gate_share * rho) if delta > 0.0 and rho else gate_share * e

    if mechanism == "independent":
        unit, rule = _largest(lambda e: [selection(e)] * horizon, epsilon, delta)
        gate, refreshes = 0.0, horizon - 1
    else:
        unit, rule = _largest(
            lambda e: [selection(e)] * (refreshes + 1) + [gate_cost(gate_of(e))] * refreshes,
            epsilon,
            delta,
        )
        gate = gate_of(unit)
    share = "zCDP rho" if delta > 0.0 else "epsilon"
    worst = (
        f"{horizon} Gumbel top-{k} releases of epsilon {unit:.6g}"
        if mechanism == "independent"
        else f"{refreshes + 1} Gumbel top-{k} selections of epsilon {unit:.6g} and {refreshes} "
        f"AboveThreshold gates of epsilon {gate:.6g}, each {gate_share:g} of a selection's "
        f"{share} (gap sensitivity {2 * sensitivity:g}; {GATE_SOURCE})"
    )
    derivation = (
        f"({epsilon:g}, {delta:g})-DP over {horizon} ticks for add/remove-one-client neighbours "
        f"over the whole horizon (a client's whole stream of contributions moves each count by "
        f"at most {sensitivity:g} at every tick): the worst case, {worst}, composed by {rule} "
        f"({COMPOSITION_SOURCE}); re-served lists are post-processing"
    )
    return StreamGuarantee(
        epsilon, delta, horizon, mechanism, unit, gate, refreshes, rule, derivation
    )


@dataclasses.dataclass(frozen=True)
class Tick:
    """One tick's answer: the list (`items`), whether it was selected at this tick (`fresh`)
    or stands from tick `selected_at`, and the stream's total guarantee. `diagnostics`:
    operator-side (rows read this tick, whether the answer was stored before)."""

    tick: int
    items: tuple[Any, ...]
    fresh: bool
    selected_at: int
    guarantee: StreamGuarantee
    diagnostics: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)


class TrendingStream:
    """A trending list over a live source (module docstring); made by trending_top_k."""

    def __init__(
        self,
        source: Any,
        k: int,
        epsilon: float,
        horizon: int,
        budget: Any,
        name: str,
        delta: float,
        mechanism: str,
        refreshes: int | None,
        gate_share: float,
        margin: float,
        period: dt.timedelta | None,
        start: dt.datetime | None,
        paced: bool = True,
    ) -> None:
        check_common(k, epsilon, delta)
        if mechanism not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}")
        if isinstance(horizon, bool) or not isinstance(horizon, int | np.integer) or horizon < 1:
            raise ValueError(f"horizon must be a whole number of ticks >= 1, got {horizon!r}")
        horizon = int(horizon)
        if refreshes is None:
            refreshes = default_refreshes(horizon, float(delta))
        if isinstance(refreshes, bool) or not isinstance(refreshes, int) or refreshes < 0:
            raise ValueError(f"refreshes must be a whole number >= 0, got {refreshes!r}")
        if not (isinstance(gate_share, int | float) and 0.0 < gate_share <= 10.0):
            raise ValueError(f"gate_share must be in (0, 10], got {gate_share!r}")
        if not (isinstance(margin, int | float) and math.isfinite(margin)):
            raise ValueError(f"margin must be a finite number, got {margin!r}")
        if not isinstance(name, str) or not name or "#" in name:
            raise ValueError(f"name must be a non-empty string without '#', got {name!r}")
        if (period is None) != (start is None):
            raise ValueError("period and start go together: the clock that numbers the ticks")
        if period is not None and period <= dt.timedelta(0):
            raise ValueError(f"period must be positive, got {period!r}")
        ledger = getattr(budget, "ledger", None)
        if ledger is None or not hasattr(ledger, "charge_keyed"):
            raise TypeError(
                "a trending stream needs budget= a PrivacyLedger's budget: its state and its "
                "charges live in the ledger"
            )
        self.source, self.k, self.horizon, self.name = source, int(k), horizon, name
        self.budget, self.ledger, self.principal = budget, ledger, budget.principal
        self.mechanism, self.margin, self.paced = mechanism, float(margin), bool(paced)
        self.period, self.start = period, start
        self.sensitivity = source_sensitivity(source)
        self.m = int(source.domain_size())
        self.guarantee = plan_stream(
            self.k, self.m, float(epsilon), float(delta), horizon, mechanism,
            refreshes if mechanism == "gated" else horizon - 1, float(gate_share),
            self.sensitivity,
        )  # fmt: skip
        parameters = {
            "k": self.k, "epsilon": float(epsilon), "delta": float(delta), "horizon": horizon,
            "mechanism": mechanism, "refreshes": refreshes, "gate_share": float(gate_share),
            "margin": self.margin, "paced": bool(paced), "state": STATE_LAYOUT,
        }  # fmt: skip
        self.fingerprint = fingerprint("trending_top_k", source, parameters)

    # ----- ticks ---------------------------------------------------------------------------
    def allowed_refreshes(self, t: int) -> int:
        """Refreshes the gated stream may have made by tick t: all c at once, or, paced, one
        more every T / c ticks (1 + floor((t - 1) c / T), at most c), so that early changes
        cannot use up the refreshes of the whole horizon. A function of t only: skipping the
        gate's query then tells nothing and costs nothing."""
        c = self.guarantee.refreshes
        if not self.paced:
            return c
        return min(c, 1 + (t - 1) * c // self.horizon)

    def current_tick(self, now: dt.datetime | None = None) -> int:
        """The tick the clock is in: 1 + whole periods since `start` (UTC)."""
        if self.period is None or self.start is None:
            raise ValueError("this stream has no clock (period, start): pass tick(index)")
        now = now or dt.datetime.now(dt.UTC).replace(tzinfo=None)
        start = (
            self.start.astimezone(dt.UTC).replace(tzinfo=None) if self.start.tzinfo else self.start
        )
        return int((now - start) // self.period) + 1

    def _key(self, t: int, part: str = "") -> str:
        return f"{self.name}#{t}{part}"

    def tick(self, index: int | None = None) -> Tick:
        """The answer of tick `index` (default: the clock's): stored if it was answered before,
        else computed, charged where it spends, and stored. Ledger work: one read of the
        stream's keys; one commit for an answer that stands; one more (the charges, before any
        row is read) for a selection."""
        t = self.current_tick() if index is None else index
        if isinstance(t, bool) or not isinstance(t, int | np.integer) or not 1 <= t <= self.horizon:
            raise ValueError(f"tick must be a whole number in [1, {self.horizon}], got {t!r}")
        t = int(t)
        keys = [self.name, self._key(t), self._key(t, "/select"), self._key(t - 1)]
        state = self.ledger.lookup_releases(self.principal, keys)
        for key, claim in state.items():
            if claim.fingerprint != self.fingerprint:
                raise key_conflict(self.principal, key)
        answered = state.get(self._key(t))
        if answered is not None and answered.release is not None:
            return self._tick_of(json.loads(answered.release), stored=True)
        stream = state.get(self.name)
        secret = None if stream is None else stream.noise_key  # None: made with the charges
        charged = state.get(self._key(t, "/select"))
        if self.mechanism == "independent":
            return self._selected(t, secret, {"gate": None, "fires": 0}, 0)
        previous = state.get(self._key(t - 1))
        outcome = (
            json.loads(previous.release)
            if previous is not None and previous.release is not None
            else self._previous(t)
        )
        if outcome is None:  # the first selection and the first gate
            return self._selected(t, secret, {"gate": None, "fires": -1}, 0)
        if secret is None:  # answered ticks, no stream key: another layout, or removed
            raise LookupError(f"the stream {self.name!r} has no secret in the ledger")
        if charged is not None and charged.charged:  # an earlier attempt of tick t fired
            return self._selected(t, secret, outcome, 0)
        standing = {k: outcome[k] for k in ("items", "selected_at", "gate", "fires")}
        standing.update(tick=t, fresh=False, rows_read=0)
        gate = outcome["gate"]
        if gate is not None and outcome["fires"] < self.allowed_refreshes(t):
            # the gap and, if the gate fires, the selection read one snapshot (the selection
            # after its charge has committed): one set-up of the store's snapshot, not two
            with self.source.snapshot():
                fired, rows = self._gate(t, gate, secret, outcome["items"])
                if fired:
                    return self._selected(t, secret, outcome, rows)
            standing["rows_read"] = rows
        text = json.dumps(standing, default=str)
        stored = self.ledger.store_keyed(
            self.principal, self._key(t), self.fingerprint, text, self._key(t, "/select")
        )
        if stored is not None:
            return self._tick_of(json.loads(stored), stored=stored != text)
        # another attempt fired meanwhile (its selection is charged): so did this tick
        return self._selected(t, secret, outcome, 0)

    def _previous(self, t: int) -> dict[str, Any] | None:
        """The outcome of the latest answered tick before t - 1 (None: t is the first), one
        read (a skipped tick: tick() looks at t - 1 first)."""
        keys = [self._key(j) for j in range(1, t - 1)]
        found = self.ledger.lookup_releases(self.principal, keys) if keys else {}
        answered = [j for j in range(1, t - 1) if getattr(found.get(self._key(j)), "release", None)]
        if not answered:
            return None
        claim = found[self._key(max(answered))]
        if claim.fingerprint != self.fingerprint:
            raise key_conflict(self.principal, self._key(max(answered)))
        return json.loads(claim.release)

    def _gate(self, t: int, gate: int, secret: str, items: list[Any]) -> tuple[bool, int]:
        """The gate begun at tick `gate` asked at tick t: (fires, rows read). Its threshold
        noise Laplace(2 Delta / eps_g) and the query noise Laplace(4 Delta / eps_g) of tick t
        come from the stream's secret."""
        threshold_scale, query_scale = gate_scales(self.guarantee.gate_epsilon, self.sensitivity)
        threshold = float(derived_rng(secret, f"threshold/{gate}").laplace(0.0, threshold_scale))
        query = float(derived_rng(secret, f"query/{t}").laplace(0.0, query_scale))
        gap, rows = self._gap(items)
        return gate_fires(gap, self.margin, threshold, query), rows

    def _gap(self, items: list[Any]) -> tuple[float, int]:
        """(best count outside the list) - (lowest count in the list), and the rows read."""
        with self.source.snapshot():
            top = self.source.read_sorted(0, self.k + 1)
            listed = np.asarray(self.source.read_ids(items), dtype=float)
        inside = {plain_id(i) for i in items}
        outside = [s for i, s in zip(top.ids, top.scores, strict=True) if plain_id(i) not in inside]
        best_outside = float(outside[0]) if outside else -math.inf
        return best_outside - float(listed.min()), len(top) + len(items)

    def _selected(self, t: int, secret: str | None, outcome: dict[str, Any], rows: int) -> Tick:
        """Tick t selects a list: its selection (and, gated, the next gate instance while
        refreshes remain) charged in one transaction unless the tick is answered meanwhile (the
        stream's key made in it if `secret` is None: the stream's first charge), then
        private_top_k with the noise of tick t, then the outcome stored with the selection's
        log."""
        g = self.guarantee
        fires = outcome["fires"] + 1  # -1 for the first selection
        costs = [(self._key(t, "/select"), self.fingerprint, self._selection_cost())]
        gate = None
        if self.mechanism == "gated" and fires < g.refreshes:
            gate = t
            costs.append((self._key(t, "/gate"), self.fingerprint, gate_cost(g.gate_epsilon)))
        claims = []
        if secret is None:
            stream = json.dumps({"stream": STATE_LAYOUT})
            claims.append((self.name, self.fingerprint, new_noise_key(), stream))
        done = self.ledger.charge_keyed(self.principal, costs, self._key(t), claims)
        if done.stored is not None:
            return self._tick_of(json.loads(done.stored), stored=True)
        secret = done.noise_keys.get(self.name, secret)
        if not secret:
            raise LookupError(f"the stream {self.name!r} has no secret in the ledger")
        result = private_top_k(
            self.source, self.k, g.select_epsilon, seed=derived_rng(secret, f"select/{t}")
        )
        answer = {
            "tick": t,
            "items": [plain(i) for i in result.items],
            "fresh": True,
            "selected_at": t,
            "gate": gate,
            "fires": max(fires, 0),
            "rows_read": rows + result.accesses.total,
        }
        text = json.dumps(answer, default=str)
        stored = self.ledger.store_keyed(
            self.principal, self._key(t), self.fingerprint, text, logs=[(done.seqs[0], result)]
        )
        return self._tick_of(json.loads(stored), stored=stored != text)

    def _selection_cost(self) -> PrivacyCost:
        """A selection's cost, as private_top_k charges it (delta 0: m does not enter it)."""
        return oneshot_cost(
            "gumbel", self.k, self.m, self.guarantee.select_epsilon, 0.0, "add_remove",
            self.sensitivity,
        )  # fmt: skip

    def _tick_of(self, outcome: dict[str, Any], stored: bool) -> Tick:
        diagnostics = {"stored": stored, "rows_read": outcome.get("rows_read", 0)}
        return Tick(
            outcome["tick"],
            tuple(outcome["items"]),
            outcome["fresh"],
            outcome["selected_at"],
            self.guarantee,
            diagnostics,
        )


def plain_id(item: Any) -> Any:
    """An item id as a plain Python value (numpy scalars compared with stored JSON ids)."""
    return item.item() if isinstance(item, np.generic) else item


def trending_top_k(
    source: Any,
    k: int,
    epsilon: float,
    horizon: int,
    *,
    budget: Any,
    name: str,
    delta: float = 0.0,
    mechanism: Literal["gated", "independent"] = "gated",
    refreshes: int | None = None,
    gate_share: float = 0.5,
    margin: float = 0.0,
    period: dt.timedelta | None = None,
    start: dt.datetime | None = None,
    paced: bool = True,
) -> TrendingStream:
    """A trending top-k over `horizon` ticks under one total (epsilon, delta) (module
    docstring): `stream.tick()` each period. `budget`: a PrivacyLedger's budget (the stream's
    state and charges live there); `name`: the stream's name among the principal's keys (a
    rerun of the job opens the same stream). `mechanism`: "gated" (sparse vector; at most
    `refreshes` new selections after the first, default default_refreshes(horizon, delta);
    each gate instance costs `gate_share` of a selection, in epsilon when delta = 0 and in zCDP
    rho when delta > 0 (plan_stream), and fires when the best outside item beats the list's
    k-th by `margin` after noise; `paced`: one more refresh allowed every horizon / refreshes
    ticks, not all at once) or "independent" (a release every tick). `period` and `start`
    (UTC) number the ticks from the clock; without them pass `tick(index)`."""
    return TrendingStream(
        source, k, epsilon, horizon, budget, name, delta, mechanism, refreshes, gate_share,
        margin, period, start, paced,
    )  # fmt: skip


__all__ = [
    "StreamGuarantee",
    "Tick",
    "TrendingStream",
    "default_refreshes",
    "gate_cost",
    "gate_fires",
    "gate_scales",
    "plan_stream",
    "trending_top_k",
]
