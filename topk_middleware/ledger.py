"""A durable privacy budget per principal (analyst): the budget logic over a store of rows.

`PrivacyLedger(url_or_engine_or_store)`; `ledger.budget(principal, epsilon, delta)` gives a budget
object usable as `budget=` by every mechanism. A charge is one transaction of the store,
committed before the mechanism reads any row: the store locks the principal's row and hands this
module the stored total and every cost charged so far; `charge` composes them with the new one
(accounting.compose, the rules of PrivacyBudget) and the store inserts the charge only if the
total still holds. So threads and processes sharing a ledger never overspend it, and a process
killed after the charge leaves it charged. When the release is done, its row is completed with
the release time, its guarantee and source, and the operator diagnostics (access counts, method,
m; for an oblivious release also its depth, deadline, work time, whether the work overran the
deadline and whether it missed: OBLIVIOUS_LOG): operator-side only.

Where the rows live is a `LedgerStore`. A URL or an SQLAlchemy engine opens the SQL store of
adapters/ledger.py (PostgreSQL, SQLite, DuckDB; its docstring gives the tables and how each
dialect locks), loaded on first use by the name SQL_STORE: the core imports no store driver, and
that declared name is its one reference to the layer above (tests/project/test_layers.py).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from .accounting import (
    EXHAUSTED,
    BudgetExceeded,
    ComposedGuarantee,
    PrivacyCost,
    check_budget_total,
    compose,
    refuse_if_over,
)
from .release_keys import (
    Charged,
    ChargeEntry,
    Claim,
    ReleaseKeyConflict,
    key_conflict,
    new_noise_key,
)

# "module:class" of the store a URL or an engine opens, imported when first needed.
SQL_STORE = "adapters.ledger:SQLLedgerStore"
# What the log of an oblivious release keeps besides its access counts (mechanisms/oblivious.py):
# its depth, its deadline, how long its work took, whether that overran the deadline, and whether
# it missed (read the whole table after the fixed batches).
OBLIVIOUS_LOG = ("depth", "deadline", "work_seconds", "deadline_missed", "miss", "full_read")

# Budget windows: calendar periods in UTC, each with the principal's whole total (docs/operations.md
# says what that does and does not promise). Weeks start on Monday 00:00 UTC.
WINDOWS = {
    "hour": dt.timedelta(hours=1),
    "day": dt.timedelta(days=1),
    "week": dt.timedelta(weeks=1),
}
_WINDOW_ORIGIN = dt.datetime(1970, 1, 5)  # a Monday, 00:00 UTC


def check_window(window: object) -> str | None:
    """None (one total for all time) or one of WINDOWS."""
    if window is None or window in WINDOWS:
        return window  # type: ignore[return-value]
    raise ValueError(f"window must be None or one of {sorted(WINDOWS)}, got {window!r}")


def window_start(window: str, now: dt.datetime) -> dt.datetime:
    """The start of the window that `now` (UTC, naive) falls in."""
    length = WINDOWS[window]
    return _WINDOW_ORIGIN + ((now - _WINDOW_ORIGIN) // length) * length


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


@runtime_checkable
class LedgerStore(Protocol):
    """Where a PrivacyLedger keeps its rows: one row per principal (its total) and one per
    charge. Costs travel as JSON text (cost_to_json); `append_charge` is the one transaction
    that must lock."""

    def create_principal(
        self, principal: str, epsilon: float, delta: float, window: str | None = None
    ) -> tuple[float, float]:
        """Insert the principal with this total (and window, if not None) if absent, in one
        transaction; the total stored (either way)."""
        ...

    def window(self, principal: str) -> str | None:
        """The principal's budget window (WINDOWS), None if the total is for all time."""
        ...

    def total(self, principal: str) -> tuple[float, float] | None:
        """The principal's stored (epsilon, delta), None if it has no row."""
        ...

    def append_charges(
        self,
        principal: str,
        entries: Sequence[ChargeEntry],
        decide: Callable[..., ComposedGuarantee],
        claim: bool = False,
        unless_stored: str | None = None,
        claims: Sequence[tuple[str, str, str, str]] = (),
    ) -> Charged:
        """In one transaction holding the principal's row locked (KeyError if it has none):
        if `unless_stored` names a key with a stored release, charge nothing and return
        Charged([], None, that release, {}). Each claim (key, fingerprint, noise key, release):
        the key inserted with them if absent, ReleaseKeyConflict if it holds another
        fingerprint. Each entry with a key: refuse (ReleaseKeyConflict) if the key holds another
        fingerprint (with `claim`, a key absent, or claimed and never charged nor answered, is
        claimed with the entry's fingerprint and noise key), and pay nothing for a key already
        charged. For the rest: call decide(total epsilon, total delta, the window's name or
        None, costs_since (a function: since -> the stored costs charged at or after it, in
        order; None: all), their costs), which raises to refuse, insert one charge each with
        the composition it returned and record its number against its key. Returns Charged(the
        charge numbers of the entries in order, the composition or None if nothing was due,
        None, {claimed key: the noise key it holds})."""
        ...

    def lookup_keys(
        self, principal: str, release_keys: Sequence[str]
    ) -> dict[str, tuple[str, str, int | None, str | None]]:
        """lookup_key for several keys in one read: {key: its row} for those that exist."""
        ...

    def store_keyed(
        self,
        principal: str,
        release_key: str,
        fingerprint: str,
        release: str,
        unless_charged: str | None = None,
        completions: Sequence[tuple[int, str, str, str]] = (),
        noise_key: str = "",
    ) -> str | None:
        """In one transaction (holding the principal's row, as a charge does, when
        `unless_charged` is given): None, storing nothing, if the key `unless_charged` is
        charged; else the key's release: `release`, inserted with the key (and `noise_key`)
        if it is absent, or stored on the key if it has none, or the one it holds;
        ReleaseKeyConflict if it holds another fingerprint. Each completion (seq, guarantee,
        source, diagnostics) completes a charge in the same transaction, as complete_charge
        does."""
        ...

    def claim_key(
        self, principal: str, release_key: str, fingerprint: str, noise_key: str
    ) -> tuple[str, str, int | None, str | None]:
        """Insert the key with this fingerprint and noise key if absent, or give an uncharged
        key these; what is stored then: (fingerprint, noise key, charge number or None,
        release JSON or None)."""
        ...

    def lookup_key(
        self, principal: str, release_key: str
    ) -> tuple[str, str, int | None, str | None] | None:
        """What claim_key would return for a key, without claiming it (None: no such key)."""
        ...

    def store_release(
        self, principal: str, release_key: str, fingerprint: str, release: str
    ) -> str:
        """Store the release against the key (of this fingerprint) unless one is stored; the
        stored release."""
        ...

    def complete_charge(
        self, principal: str, seq: int, guarantee: str, source: str, diagnostics: str
    ) -> None:
        """Mark charge `seq` released now, with its guarantee, source and diagnostics (JSON)."""
        ...

    def charged_costs(
        self, principal: str, since: dt.datetime | None = None
    ) -> tuple[float, list[str]]:
        """(the stored total delta, every stored cost in order; with `since`, those charged at
        or after it), read in one transaction; KeyError if the principal has no row."""
        ...

    def charge_rows(self, principal: str) -> list[dict[str, Any]]:
        """The principal's charge rows as dicts, oldest first (the operator's view)."""
        ...


def open_store(target: Any) -> LedgerStore:
    """`target` if it is a LedgerStore, else the SQL store (SQL_STORE) of a URL or an engine."""
    if isinstance(target, LedgerStore):
        return target
    module, _, name = SQL_STORE.partition(":")
    return getattr(importlib.import_module(module), name)(target)


def cost_to_json(cost: PrivacyCost) -> str:
    """A cost as JSON; a cost with an RDP curve must carry its recipe."""
    if cost.rdp is not None and cost.recipe is None:
        raise ValueError(f"{cost.mechanism}: an RDP curve without a recipe cannot be stored")
    fields = {f.name: getattr(cost, f.name) for f in dataclasses.fields(cost) if f.name != "rdp"}
    return json.dumps(fields)


class UnknownRecipe(ValueError):
    """A stored charge names a recipe outside the project's registry (RECIPES): never run."""


def _stable_cost(**kwargs: Any) -> PrivacyCost:
    from .mechanisms.stable import stable_cost

    return stable_cost(**kwargs)


# The only functions a stored charge may name to rebuild its cost (a cost whose RDP curve is a
# function cannot be stored as data): a fixed table of the project's own cost functions, with the
# parameters each takes and their types. A stored name is looked up here and nowhere else; nothing
# a row says is imported or called.
RECIPES: dict[str, tuple[Callable[..., PrivacyCost], dict[str, tuple[type, ...]]]] = {
    "topk_middleware.mechanisms.stable:stable_cost": (
        _stable_cost,
        {"rho": (float, int), "delta_t": (float, int), "test": (str,), "target": (bool,)},
    ),
}


def _from_recipe(recipe: Any) -> PrivacyCost:
    """The cost a stored recipe names, from RECIPES only; anything else is UnknownRecipe."""
    try:
        name, pairs = recipe
        kwargs = dict(pairs)
    except (TypeError, ValueError):
        raise UnknownRecipe("a ledger charge holds a malformed recipe; it was not run") from None
    entry = RECIPES.get(name) if isinstance(name, str) else None
    if entry is None:
        shown = name if isinstance(name, str) and len(name) <= 80 else "(not shown)"
        raise UnknownRecipe(
            f"a ledger charge names the recipe {shown!r}, which is not one of the project's cost "
            f"functions ({', '.join(sorted(RECIPES))}); it was not run: the ledger was written by "
            "something else than this project"
        )
    function, parameters = entry
    for key, value in kwargs.items():
        allowed = parameters.get(key) if isinstance(key, str) else None
        if allowed is None or not isinstance(value, allowed):
            raise UnknownRecipe(
                f"a ledger charge gives the recipe {name!r} a parameter it does not take or of "
                "the wrong type; it was not run"
            )
    return function(**kwargs)


class CorruptLedger(BudgetExceeded):
    """The ledger holds a total or a cost no budget may hold (NaN, negative, an infinite
    total): every charge of that principal is refused until an operator repairs the row."""


def _admissible(cost: PrivacyCost) -> PrivacyCost:
    """`cost` if every number it claims is >= 0 (NaN and negative values would let a later
    charge through: NaN compares false with every total); CorruptLedger otherwise. +inf is
    admitted: it only makes the composition refuse."""
    numbers = [cost.epsilon, cost.delta, cost.rho, cost.range_bounded_delta]
    numbers += [*cost.range_bounded, *(x for pair in cost.approx for x in pair)]
    for value in numbers:
        if value is not None and not float(value) >= 0.0:
            raise CorruptLedger(
                f"the ledger holds a charge of {cost.mechanism} with a value {value!r} no cost "
                "may have; nothing was read or released (an operator repairs the ledger)"
            )
    return cost


def cost_from_json(text: str) -> PrivacyCost:
    """A stored cost; a recipe is rebuilt through the registry RECIPES, never imported.
    CorruptLedger for a cost with a NaN or negative number (`_admissible`)."""
    data = json.loads(text)
    if data.get("recipe"):
        return _admissible(_from_recipe(data["recipe"]))
    data["range_bounded"] = tuple(data["range_bounded"])
    data["approx"] = tuple(tuple(pair) for pair in data["approx"])
    data["sources"] = tuple(data["sources"])
    data["recipe"] = None
    return _admissible(PrivacyCost(**data))


def costs_from_json(stored: list[str]) -> list[PrivacyCost]:
    """Stored costs, in order; equal texts are read once and give one object (so that
    `compose` counts their RDP curve once, with its multiplicity)."""
    read: dict[str, PrivacyCost] = {}
    for text in stored:
        if text not in read:
            read[text] = cost_from_json(text)
    return [read[text] for text in stored]


class PrivacyLedger:
    """Per-principal budgets kept in a LedgerStore (module docstring): a URL, an SQLAlchemy
    engine, or a store object."""

    def __init__(self, url_or_engine_or_store: Any) -> None:
        self.store = open_store(url_or_engine_or_store)

    def close(self) -> None:
        """Close the store's connections if it opened them (a URL); also done when the ledger
        is garbage collected. A store object without close() is left as it is."""
        close = getattr(self.store, "close", None)
        if callable(close):
            close()

    def budget(
        self, principal: str, epsilon: float, delta: float = 0.0, window: str | None = None
    ) -> LedgerBudget:
        """The budget of `principal`: created with this total if new; if it exists, its stored
        total must be this one (an analyst cannot raise their own total through this call).
        `window` ("hour", "day", "week"; WINDOWS): the total holds per calendar window (UTC),
        and a charge counts in the window it falls in; None: one total for all time. Fixed at
        the grant like the total."""
        if not isinstance(principal, str) or not principal:
            raise TypeError(f"principal must be a non-empty string, got {principal!r}")
        check_budget_total(epsilon, delta)
        window = check_window(window)
        epsilon, delta = float(epsilon), float(delta)
        stored = self.store.create_principal(principal, epsilon, delta, window)
        if stored != (epsilon, delta):
            raise ValueError(
                f"principal {principal!r} has the total (epsilon={stored[0]:g}, "
                f"delta={stored[1]:g}) in the ledger, not ({epsilon:g}, {delta:g})"
            )
        stored_window = self.store.window(principal)
        if stored_window != window:
            raise ValueError(
                f"principal {principal!r} has the window {stored_window!r} in the ledger, not "
                f"{window!r}"
            )
        return LedgerBudget(self, principal, epsilon, delta)

    def window(self, principal: str) -> str | None:
        """The principal's budget window, None for one total for all time."""
        return self.store.window(principal)

    def since(self, principal: str, now: dt.datetime | None = None) -> dt.datetime | None:
        """The start of the principal's current window (None: no window): the charges that
        count against the total are those at or after it."""
        window = self.store.window(principal)
        return None if window is None else window_start(window, now or _utc_now())

    def total(self, principal: str) -> tuple[float, float]:
        """The principal's stored total (epsilon, delta); KeyError if it has no budget."""
        found = self.store.total(principal)
        if found is None:
            raise KeyError(f"principal {principal!r} has no budget in this ledger")
        return found

    def _decider(self, principal: str, now: dt.datetime) -> Callable[..., ComposedGuarantee]:
        """The `decide` of a charge (LedgerStore.append_charges): the stored costs of the
        principal's current window (all, without one) composed with the new ones, refused
        (BudgetExceeded, CorruptLedger) past the total or on a total no budget may have."""

        def decide(
            epsilon: float, delta: float, window: str | None, costs_since: Any, new: list[str]
        ) -> ComposedGuarantee:
            try:  # a tampered total (NaN, infinite, negative) admits nothing
                check_budget_total(epsilon, delta)
            except (TypeError, ValueError) as error:
                raise CorruptLedger(
                    f"the ledger's total for {principal!r} is no budget ({error}); nothing was "
                    "read or released (an operator repairs the ledger)"
                ) from None
            since = None if window is None else window_start(window, now)
            costs = costs_from_json(costs_since(since))
            added = [cost_from_json(text) for text in new]
            after = compose([*costs, *added], delta)
            # the composition before them only matters where the total is used up (the
            # composition grows with every cost: below that, the earlier one is too)
            exhausted = after.epsilon >= epsilon * (1 - EXHAUSTED)
            before = compose(costs, delta) if costs and exhausted else None
            if not (after.epsilon >= 0.0 and after.delta >= 0.0):  # NaN: no composition
                raise CorruptLedger(
                    f"the composition of {principal!r}'s charges is not a number; nothing was "
                    "read or released (an operator repairs the ledger)"
                )
            named = added[0] if len(added) == 1 else _together(added)
            try:
                refuse_if_over(after, epsilon, delta, named, before)
            except BudgetExceeded as error:
                if since is None:
                    raise
                raise BudgetExceeded(
                    f"{error} (the total of the {window} window that began "
                    f"{since:%Y-%m-%d %H:%M} UTC)"
                ) from None
            return after

        return decide

    def charge(
        self,
        principal: str,
        cost: PrivacyCost,
        release_key: str | None = None,
        fingerprint: str | None = None,
    ) -> tuple[int, ComposedGuarantee]:
        """Add `cost` to the principal's releases in one committed transaction, or raise
        BudgetExceeded and record nothing. Returns (charge seq, composition after it). Under a
        claimed `release_key` that is already charged, nothing is added (release_keys.py)."""
        entry = ChargeEntry(cost.mechanism, cost_to_json(cost), release_key, fingerprint)
        done = self.store.append_charges(principal, [entry], self._decider(principal, _utc_now()))
        return done.seqs[0], self.spent(principal) if done.after is None else done.after

    def charge_keyed(
        self,
        principal: str,
        costs: Sequence[tuple[str, str, PrivacyCost]],
        unless_stored: str | None = None,
        claims: Sequence[tuple[str, str, str, str]] = (),
    ) -> Charged:
        """Charge (release key, fingerprint, cost) triples in one transaction, claiming each key
        that is new (its noise drawn elsewhere: streams.py); a key already charged pays nothing;
        all or nothing (BudgetExceeded). With `unless_stored`, a key whose release is stored
        means nothing is charged (Charged.stored). `claims`: (key, fingerprint, noise key,
        release) rows made in the same transaction if absent (Charged.noise_keys: what each
        holds)."""
        entries = [
            ChargeEntry(cost.mechanism, cost_to_json(cost), key, fingerprint)
            for key, fingerprint, cost in costs
        ]
        decide = self._decider(principal, _utc_now())
        return self.store.append_charges(principal, entries, decide, True, unless_stored, claims)

    def lookup_releases(self, principal: str, release_keys: Sequence[str]) -> dict[str, Claim]:
        """The claims of those of `release_keys` that exist, in one read (no claim made)."""
        found = self.store.lookup_keys(principal, release_keys)
        return {
            key: Claim(noise_key, seq is not None, release, stored)
            for key, (stored, noise_key, seq, release) in found.items()
        }

    def store_keyed(
        self,
        principal: str,
        release_key: str,
        fingerprint: str,
        release: str,
        unless_charged: str | None = None,
        logs: Sequence[tuple[int, Any]] = (),
        noise_key: str = "",
    ) -> str | None:
        """Store `release` under the key (inserted with `noise_key` if new) unless it holds one:
        the stored release; None, storing nothing, if the key `unless_charged` is charged.
        `logs`: (charge seq, result) pairs completed in the same transaction (log_release)."""
        completions = [(seq, *_log_fields(result)) for seq, result in logs]
        return self.store.store_keyed(
            principal, release_key, fingerprint, release, unless_charged, completions, noise_key
        )

    def claim_release(self, principal: str, release_key: str, fingerprint: str) -> Claim:
        """The key's claim (release_keys.py): inserted with a fresh noise key if new; refused
        (ReleaseKeyConflict) if the key holds other parameters."""
        if self.store.total(principal) is None:
            raise KeyError(f"principal {principal!r} has no budget in this ledger")
        stored, noise_key, seq, release = self.store.claim_key(
            principal, release_key, fingerprint, new_noise_key()
        )
        if stored != fingerprint:
            raise key_conflict(principal, release_key)
        return Claim(noise_key, seq is not None, release, fingerprint)

    def lookup_release(self, principal: str, release_key: str) -> Claim | None:
        """The key's claim if it has one, without claiming it (read only)."""
        found = self.store.lookup_key(principal, release_key)
        if found is None:
            return None
        stored, noise_key, seq, release = found
        return Claim(noise_key, seq is not None, release, stored)

    def store_release(
        self, principal: str, release_key: str, fingerprint: str, release: str
    ) -> str:
        """Store a keyed release unless one is stored; the stored one (release_keys.py)."""
        return self.store.store_release(principal, release_key, fingerprint, release)

    def log_release(self, principal: str, seq: int, result: Any) -> None:
        """Complete charge `seq` with its release: time, guarantee, source, diagnostics."""
        self.store.complete_charge(principal, seq, *_log_fields(result))

    def releases(self, principal: str) -> list[PrivacyCost]:
        """Every cost charged to `principal` (in its current window, if it has one), oldest
        first."""
        return costs_from_json(self.store.charged_costs(principal, self.since(principal))[1])

    def spent(self, principal: str) -> ComposedGuarantee:
        """The composition of everything charged to `principal` (in its current window, if it
        has one), after any restart."""
        delta, stored = self.store.charged_costs(principal, self.since(principal))
        return compose(costs_from_json(stored), delta)

    def log(self, principal: str) -> list[dict[str, Any]]:
        """The principal's charges and releases, oldest first (operator view)."""
        return self.store.charge_rows(principal)

    def dp_events(self, principal: str) -> Any:
        """The principal's releases as one dp_accounting ComposedDpEvent (release_dp_event each;
        needs the dp-accounting extra)."""
        from dp_accounting import dp_event

        return dp_event.ComposedDpEvent([release_dp_event(c) for c in self.releases(principal)])


def _log_fields(result: Any) -> tuple[str, str, str]:
    """(guarantee JSON, source, diagnostics JSON) of a release for its charge's log: its
    method, m and access counts; for an oblivious release also OBLIVIOUS_LOG."""
    privacy = result.privacy
    guarantee = {"epsilon": privacy.epsilon, "delta": privacy.delta, "noise": privacy.noise}
    diagnostics = {
        "method": result.method,
        "m": result.m,
        "accesses": dataclasses.asdict(result.accesses),
    }
    plan = getattr(result, "plan", None) or {}
    if plan.get("oblivious"):  # what the operator watches: overruns and misses
        diagnostics["oblivious"] = {key: plan.get(key) for key in OBLIVIOUS_LOG}
    return json.dumps(guarantee), privacy.derivation, json.dumps(diagnostics, default=str)


def _together(costs: list[PrivacyCost]) -> PrivacyCost:
    """What a refusal names when several costs are charged together."""
    return PrivacyCost(
        mechanism=" and ".join(c.mechanism for c in costs), delta=sum(c.delta for c in costs)
    )


def release_dp_event(cost: PrivacyCost) -> Any:
    """One release as a dp_accounting DpEvent. dp_accounting has no event for a bare
    (epsilon, delta) pair, so: a release with delta = 0 and a zCDP rho (the Gumbel / exponential
    family: range-bounded, Cesar & Rogers 2021) is ZCDpEvent(rho); a pure epsilon-DP release
    without one is ZCDpEvent(epsilon^2 / 2) (Bun & Steinke 2016, Prop. 1.4); a release with a
    failure probability delta > 0 (limited domain, StableTopK) is an UnsupportedDpEvent, which
    dp_accounting's accountants refuse rather than under-count."""
    from dp_accounting import dp_event

    if cost.delta == 0.0 and cost.rho is not None:
        return dp_event.ZCDpEvent(cost.rho)
    if cost.delta == 0.0 and cost.epsilon is not None:
        return dp_event.ZCDpEvent(cost.epsilon**2 / 2.0)
    return dp_event.UnsupportedDpEvent()


class LedgerBudget:
    """One principal's budget in a PrivacyLedger, usable as `budget=` by every mechanism."""

    def __init__(self, ledger: PrivacyLedger, principal: str, epsilon: float, delta: float):
        self.ledger, self.principal = ledger, principal
        self.epsilon, self.delta = epsilon, delta
        self._pending = threading.local()

    def charge(
        self, cost: PrivacyCost, release_key: str | None = None, fingerprint: str | None = None
    ) -> ComposedGuarantee:
        seq, after = self.ledger.charge(self.principal, cost, release_key, fingerprint)
        self._pending.seq = seq
        return after

    def log_release(self, result: Any) -> None:
        seq = getattr(self._pending, "seq", None)
        if seq is not None:
            self._pending.seq = None
            self.ledger.log_release(self.principal, seq, result)

    def spent(self) -> ComposedGuarantee:
        return self.ledger.spent(self.principal)

    @property
    def releases(self) -> list[PrivacyCost]:
        return self.ledger.releases(self.principal)


__all__ = [
    "BudgetExceeded",
    "CorruptLedger",
    "LedgerBudget",
    "LedgerStore",
    "PrivacyLedger",
    "ReleaseKeyConflict",
    "release_dp_event",
]
