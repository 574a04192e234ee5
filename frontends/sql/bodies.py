"""What the PL/Python bodies call (GD["topk"] is this module): one `server_*` per SQL function.

A release function checks its arguments (refusals.py), reads the table's registration
(sources.py), charges session_user through the ledger (ledger.py; committed before any row is
read) and runs its mechanism on the SPI source (frontends/plpython.py, counted by CountedAccess
like every store) in the calling statement's snapshot; under a release key, through keys.py. Only
the release (position, item) is returned; access counts, method and m go to the ledger's log
(topk.topk_ledger_charges). The release's guarantee (with the sensitivity it assumes) is kept for
the session: topk.last_guarantee() returns it. The core's long loops call interrupts.check(),
where a SPI round trip lets the server raise a pending cancel, statement_timeout or terminate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frontends.sql.functions import SQL_FUNCTIONS, _parameters
from frontends.sql.keys import Keyed, check_key, keyed_run
from frontends.sql.ledger import (
    LOCK_TIMEOUT,
    ledger_reachable,
    principal_of,
    server_grant_budget,
    server_my_budget,
    server_spent,
    session_ledger,
    without_delta,
)
from frontends.sql.refusals import (
    INVALID,
    REFUSED,
    REGISTER_AGAIN,
    check_release_k,
    checked,
    is_lock_timeout,
    log_refusal,
    no_nulls,
    no_predicate_locks,
    not_oblivious,
    not_refused_too_often,
    refuse,
)
from frontends.sql.sources import registration, spi_table

# The entry points, one per SQL function (functions.SQL_FUNCTIONS names them); those of
# topk.grant_budget, topk.spent and topk.my_budget live with the ledger (ledger.py).
__all__ = [
    "server_check",
    "server_exponential",
    "server_grant_budget",
    "server_joint",
    "server_last_guarantee",
    "server_limited_domain",
    "server_my_budget",
    "server_peeling",
    "server_release",
    "server_release_with_counts",
    "server_spent",
]


def _charged_release(
    plpy: Any,
    GD: dict[str, Any],
    source: Any,
    run: Callable[[Any, Any, Any], Any],
    keyed: Keyed,
    with_counts: bool = False,
) -> list[tuple[Any, ...]]:
    """The common half of every release function: the source's registration, then `run(table,
    budget, seed)` (a mechanism given the SPI source and session_user's LedgerBudget as
    `budget=`: it charges the ledger before reading any row, and logs its diagnostics there;
    under a key, `keyed_run`), its refusals in the project's words; the rows (position, item) of
    the release. Neither the key nor its noise secret is in any statement's text (the ledger's
    statements bind them as parameters) or in any message."""
    import sqlalchemy as sa

    from topk_middleware.accounting import BudgetExceeded
    from topk_middleware.interrupts import checking
    from topk_middleware.ledger import LedgerBudget
    from topk_middleware.privacy import SensitivityError
    from topk_middleware.release_keys import ReleaseKeyConflict

    no_predicate_locks(plpy, GD)
    found = registration(plpy, GD, source)
    ledger = session_ledger(plpy, GD)
    role, principal = found["role"], principal_of(found["role_oid"])
    not_refused_too_often(plpy, ledger, role)
    try:
        table = spi_table(plpy, GD, found)
    except SensitivityError as error:  # a fact of the registration, not of the counts
        refuse(plpy, str(error), INVALID, hint=REGISTER_AGAIN)
    budget = LedgerBudget(ledger, principal, math.nan, math.nan)  # totals: the ledger's row
    release_run = keyed_run(keyed, found["relation_oid"], run)
    ping = GD.get("topk_ping")
    if ping is None:
        ping = GD["topk_ping"] = plpy.prepare("SELECT 1")
    try:
        # The core's long loops call interrupts.check(); a server round trip there lets the
        # server raise a pending cancel, statement_timeout or terminate (PL/Python does not).
        with checking(lambda: plpy.execute(ping)):
            try:
                result = release_run(table, budget)
            except sa.exc.DBAPIError as error:
                if not error.connection_invalidated:
                    raise
                # The ledger's connection had died (idle too long, server restart): once more
                # on a new one. Had the lost charge committed, it stays charged (never
                # undercounted); under a key, it is not charged again.
                with ledger_reachable(plpy):
                    result = release_run(table, budget)
    except KeyError as error:
        if "has no budget" not in str(error):
            raise
        refuse(
            plpy,
            f"role {role} has no privacy budget; nothing was read or released",
            REFUSED,
            hint="an administrator grants one: SELECT topk.grant_budget('<role>', epsilon, delta)",
        )
    except BudgetExceeded as error:
        if "epsilon = inf" in str(error) and without_delta(ledger, principal):
            refuse(
                plpy,
                f"role {role}: this release spends a delta (an oblivious release, the default, "
                "spends (1 + e^epsilon) * 1e-9 of it), and the role's budget has delta 0; "
                "nothing was read or charged",
                REFUSED,
                hint="an administrator grants a delta: SELECT topk.grant_budget('<role>', "
                "epsilon, 1e-6); or call it with oblivious => false",
            )
        refuse(plpy, f"role {role}: {error}", REFUSED)
    except SensitivityError as error:  # the registration's sensitivity: not a fact of the data
        refuse(plpy, str(error), INVALID, hint=REGISTER_AGAIN)
    except ReleaseKeyConflict:  # the call's own arguments against the key's: not of the data
        refuse(
            plpy,
            f"role {role} has used this release key for a release with other arguments (the "
            "function, the table, k, epsilon or an option differs); nothing was read, charged "
            "or released",
            INVALID,
            hint="a retried job passes the same arguments; a new question takes a new key",
        )
    except ValueError as error:  # k > m, an empty table, bad scores: facts of the data
        charged = getattr(budget._pending, "seq", None) is not None
        reference = log_refusal(ledger, role, found["relation"], str(error))
        refuse(
            plpy,
            f"the release was refused for a reason in the table's data, which only an "
            f"administrator may see (reference {reference}); "
            + ("the budget was charged" if charged else "nothing was charged, read or released"),
            INVALID,
            hint=f"an administrator reads it: SELECT * FROM topk.refusals WHERE reference = "
            f"'{reference}'",
        )
    except Exception as error:
        if is_lock_timeout(error):
            refuse(
                plpy,
                f"the ledger row of role {role} stayed locked for {LOCK_TIMEOUT} (an "
                "uncommitted topk.grant_budget?); nothing was read or released",
                "55P03",
            )
        raise
    release = result.release()
    GD["topk_last_guarantee"] = _guarantee_row(release)  # topk.last_guarantee()
    if with_counts:  # (position, item, count, count_error): noisy counts beside the items
        counts = release.counts or ()
        return [
            (position, str(item), int(count), release.count_error)
            for position, (item, count) in enumerate(zip(release.items, counts, strict=True), 1)
        ]
    rows: list[tuple[Any, ...]] = [
        (position, str(item)) for position, item in enumerate(release.items, 1)
    ]
    if release.bottom:  # limited domain: fewer than k items beat the threshold
        rows.append((len(rows) + 1, None))
    return rows


@dataclass(frozen=True)
class Release:
    """What one release function has of its own; `_release` does the rest for every one.

    `server` names its SqlFunction (functions.py), whose parameters are the arguments the body
    passes, in order. `check(a)` raises the mechanism's ValueError or TypeError for arguments
    `a` (by name); `run(table, a, **options)` runs the mechanism with the call's seed and
    budget (and, where it reads obliviously, `oblivious` and `deadline`) in `options`.
    `refused_obliviously` names a mechanism that cannot read obliviously (refused under the
    oblivious default), None where it can; `last_check` is work known to be excessive, checked
    after that refusal. The key's arguments are every argument but the table and the key (and
    `oblivious` where it must be false). Cost: a dictionary of the arguments per call."""

    server: str
    function: str  # its name under a release key (keys.Keyed)
    check: Callable[[dict[str, Any]], Any]
    run: Callable[..., Any]
    refused_obliviously: str | None = None
    last_check: Callable[[dict[str, Any]], Any] | None = None
    with_counts: bool = False


def _check_top_k(a: dict[str, Any]) -> None:
    from topk_middleware.api import NOISES
    from topk_middleware.noisy_counts import check_counts_share
    from topk_middleware.validation import check_common

    check_common(a["k"], a["epsilon"], a["delta"])
    check_release_k(a["k"])
    if "counts_share" in a:
        check_counts_share(a["counts_share"])
    if a["noise"] not in NOISES:
        raise ValueError(f"noise must be one of {', '.join(NOISES)}, got {a['noise']!r}")


def _top_k(table: Any, a: dict[str, Any], **options: Any) -> Any:
    from topk_middleware.api import private_top_k

    if "counts_share" in a:
        options.update(with_counts=True, counts_share=a["counts_share"])
    return private_top_k(table, a["k"], a["epsilon"], a["delta"], a["noise"], **options)


def _check_unbounded(a: dict[str, Any]) -> None:
    """The checks of the exponential mechanism, peeling and joint: k and epsilon, no delta."""
    from topk_middleware.validation import check_common

    check_common(a.get("k", 1), a["epsilon"], 0.0)


def _exponential(table: Any, a: dict[str, Any], **options: Any) -> Any:
    from topk_middleware.mechanisms.exponential import exponential_mechanism

    return exponential_mechanism(table, a["epsilon"], **options)


def _peeling(table: Any, a: dict[str, Any], **options: Any) -> Any:
    from topk_middleware.mechanisms.peeling import peeling_top_k

    return peeling_top_k(table, a["k"], a["epsilon"], **options)


def _joint(table: Any, a: dict[str, Any], **options: Any) -> Any:
    from topk_middleware.mechanisms.joint import joint_top_k

    return joint_top_k(table, a["k"], a["epsilon"], **options)


def _joint_size(a: dict[str, Any]) -> None:
    from topk_middleware.mechanisms.joint import check_joint_size

    check_joint_size(a["k"])


def _check_limited_domain(a: dict[str, Any]) -> None:
    from topk_middleware.mechanisms.limited_domain import check_limited_domain

    check_limited_domain(a["k"], a["k_bar"], a["epsilon"], a["delta"], None)


def _limited_domain(table: Any, a: dict[str, Any], **options: Any) -> Any:
    from topk_middleware.mechanisms.limited_domain import limited_domain_top_k

    return limited_domain_top_k(table, a["k"], a["k_bar"], a["epsilon"], a["delta"], **options)


# topk.private_top_k and _with_counts: Gumbel or Laplace noise (api.private_top_k), the counts'
# share of epsilon; topk.exponential_mechanism: one item, P(i) ~ exp(epsilon h_i); both read
# obliviously by default (mechanisms/oblivious.py, charged oblivious_cost). topk.peeling_top_k:
# k exponential mechanisms of epsilon/k; topk.joint_top_k: a k-set in random order;
# topk.limited_domain_top_k: Durfee-Rogers Algorithm 1, a bottom symbol as a last row with item
# NULL. Each is charged its module's own cost through `budget=`.
RELEASES = (
    Release("server_release", "private_top_k", _check_top_k, _top_k),
    Release(
        "server_release_with_counts",
        "private_top_k_with_counts",
        _check_top_k,
        _top_k,
        with_counts=True,
    ),
    Release("server_exponential", "exponential_mechanism", _check_unbounded, _exponential),
    Release("server_peeling", "peeling_top_k", _check_unbounded, _peeling, "peeling"),
    Release("server_joint", "joint_top_k", _check_unbounded, _joint, "joint", _joint_size),
    Release(
        "server_limited_domain",
        "limited_domain_top_k",
        _check_limited_domain,
        _limited_domain,
        "limited_domain",
    ),
)


def _release(plpy: Any, GD: dict[str, Any], spec: Release, a: dict[str, Any]) -> list[Any]:
    """One release function's call (`a`: its arguments by name): no NULL but the key, the
    mechanism's checks and the key's, the refusal of oblivious reads where the mechanism has
    none, then `_charged_release` of the mechanism, under the key if one is given."""
    key = a.pop("release_key")
    no_nulls(plpy, **a)
    checked(plpy, lambda: (spec.check(a), check_key(key)))
    oblivious = bool(a["oblivious"])
    if spec.refused_obliviously is not None:
        not_oblivious(plpy, spec.refused_obliviously, oblivious)
        del a["oblivious"]  # false: neither an option of the mechanism nor of the key
    if spec.last_check is not None:
        checked(plpy, spec.last_check, a)
    source = a.pop("source")

    def run(table: Any, budget: Any, seed: Any) -> Any:
        options: dict[str, Any] = {"seed": seed, "budget": budget}
        if "oblivious" in a:
            options.update(oblivious=oblivious, deadline=table.deadline if oblivious else None)
        return spec.run(table, a, **options)

    if "oblivious" in a:
        a["oblivious"] = oblivious  # the key's argument, as a boolean
    keyed = Keyed(key, spec.function, dict(a))
    return _charged_release(plpy, GD, source, run, keyed, with_counts=spec.with_counts)


# What a body installed before the last parameters existed leaves out.
OMITTED = {"oblivious": True, "release_key": None}


def _server(spec: Release) -> Callable[..., list[Any]]:
    """The entry point `spec.server` (plpy, GD, then the SQL function's arguments in order; a
    body of an earlier install passes fewer, OMITTED's defaults)."""
    found = next(_parameters(f.params)[1] for f in SQL_FUNCTIONS if f.server == spec.server)
    names = found.split(", ")

    def server(plpy: Any, GD: dict[str, Any], *values: Any) -> list[Any]:
        if len(values) > len(names):
            raise TypeError(f"{spec.server} takes {len(names)} arguments, got {len(values)}")
        a = dict(zip(names, values, strict=False))
        a.update((name, OMITTED[name]) for name in names[len(values) :])
        return _release(plpy, GD, spec, a)

    server.__name__ = server.__qualname__ = spec.server
    server.__doc__ = f"topk.{spec.function}: `_release` of its Release."
    return server


(
    server_release,
    server_release_with_counts,
    server_exponential,
    server_peeling,
    server_joint,
    server_limited_domain,
) = (_server(spec) for spec in RELEASES)


def _guarantee_row(release: Any) -> tuple[Any, ...]:
    """topk.last_guarantee()'s row for a release: its guarantee's fields and its words."""
    from topk_middleware.release import guarantee_text

    p = release.privacy
    counted = release.counts is not None
    return (
        p.epsilon,
        p.delta,
        p.noise,
        p.scale,
        p.sensitivity,
        p.score_bound,
        p.counts_epsilon if counted else None,
        p.counts_scale if counted else None,
        release.count_error if counted else None,
        guarantee_text(release),
    )


def server_last_guarantee(plpy: Any, GD: dict[str, Any]) -> list[tuple[Any, ...]]:
    """topk.last_guarantee(): the guarantee of the calling session's last release, or no row."""
    found = GD.get("topk_last_guarantee")
    return [] if found is None else [found]


def server_check(plpy: Any, GD: dict[str, Any]) -> str:
    """What install-sql asks the server: its Python, numpy, where the project came from; and
    that the ledger's connection works (its tables are created in schema topk)."""
    import sys

    import numpy

    session_ledger(plpy, GD)
    return (
        f"Python {sys.version.split()[0]}, numpy {numpy.__version__}, "
        f"topk_middleware from {Path(__file__).resolve().parents[1]}"
    )
