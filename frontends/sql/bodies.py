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
from pathlib import Path
from typing import Any

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


def server_release(
    plpy: Any,
    GD: dict[str, Any],
    source: Any,
    k: Any,
    epsilon: Any,
    delta: Any,
    noise: Any,
    oblivious: Any = True,
    release_key: Any = None,
) -> list[tuple[int, str | None]]:
    """topk.private_top_k: check, charge session_user, release; the rows (position, item).
    `oblivious` (default true): reads and wall time fixed by public facts
    (mechanisms/oblivious.py), charged oblivious_cost. `release_key`: `keyed_run`."""
    from topk_middleware.api import NOISES, private_top_k
    from topk_middleware.validation import check_common

    no_nulls(
        plpy, source=source, k=k, epsilon=epsilon, delta=delta, noise=noise, oblivious=oblivious
    )

    def check() -> None:
        check_common(k, epsilon, delta)
        check_release_k(k)
        if noise not in NOISES:
            raise ValueError(f"noise must be one of {', '.join(NOISES)}, got {noise!r}")
        check_key(release_key)

    checked(plpy, check)
    arguments = {"k": k, "epsilon": epsilon, "delta": delta, "noise": noise}
    return _charged_release(
        plpy,
        GD,
        source,
        lambda table, budget, seed: private_top_k(
            table,
            k,
            epsilon,
            delta,
            noise,
            seed=seed,
            budget=budget,
            oblivious=bool(oblivious),
            deadline=table.deadline if oblivious else None,
        ),
        Keyed(release_key, "private_top_k", {**arguments, "oblivious": bool(oblivious)}),
    )


def server_release_with_counts(
    plpy: Any,
    GD: dict[str, Any],
    source: Any,
    k: Any,
    epsilon: Any,
    delta: Any,
    noise: Any,
    counts_share: Any,
    oblivious: Any = True,
    release_key: Any = None,
) -> list[tuple[Any, ...]]:
    """topk.private_top_k_with_counts: topk.private_top_k plus each item's noisy count and the
    95% half-width (private_top_k(..., with_counts=True))."""
    from topk_middleware.api import NOISES, private_top_k
    from topk_middleware.noisy_counts import check_counts_share
    from topk_middleware.validation import check_common

    no_nulls(plpy, source=source, k=k, epsilon=epsilon, delta=delta, noise=noise)
    no_nulls(plpy, counts_share=counts_share, oblivious=oblivious)

    def check() -> None:
        check_common(k, epsilon, delta)
        check_release_k(k)
        check_counts_share(counts_share)
        if noise not in NOISES:
            raise ValueError(f"noise must be one of {', '.join(NOISES)}, got {noise!r}")
        check_key(release_key)

    checked(plpy, check)
    arguments = {"k": k, "epsilon": epsilon, "delta": delta, "noise": noise}
    return _charged_release(
        plpy,
        GD,
        source,
        lambda table, budget, seed: private_top_k(
            table,
            k,
            epsilon,
            delta,
            noise,
            seed=seed,
            budget=budget,
            with_counts=True,
            counts_share=counts_share,
            oblivious=bool(oblivious),
            deadline=table.deadline if oblivious else None,
        ),
        Keyed(
            release_key,
            "private_top_k_with_counts",
            {**arguments, "counts_share": counts_share, "oblivious": bool(oblivious)},
        ),
        with_counts=True,
    )


def server_exponential(
    plpy: Any,
    GD: dict[str, Any],
    source: Any,
    epsilon: Any,
    oblivious: Any = True,
    release_key: Any = None,
) -> list[tuple[int, str | None]]:
    """topk.exponential_mechanism: one item, P(i) ~ exp(epsilon h_i) (mechanisms/exponential.py;
    charged accounting.oneshot_cost("gumbel", 1, m, epsilon), as its `budget=` does)."""
    from topk_middleware.mechanisms.exponential import exponential_mechanism
    from topk_middleware.validation import check_common

    no_nulls(plpy, source=source, epsilon=epsilon, oblivious=oblivious)
    checked(plpy, check_common, 1, epsilon, 0.0)
    checked(plpy, check_key, release_key)
    return _charged_release(
        plpy,
        GD,
        source,
        lambda table, budget, seed: exponential_mechanism(
            table,
            epsilon,
            seed=seed,
            budget=budget,
            oblivious=bool(oblivious),
            deadline=table.deadline if oblivious else None,
        ),
        Keyed(
            release_key,
            "exponential_mechanism",
            {"epsilon": epsilon, "oblivious": bool(oblivious)},
        ),
    )


def server_peeling(
    plpy: Any,
    GD: dict[str, Any],
    source: Any,
    k: Any,
    epsilon: Any,
    oblivious: Any = True,
    release_key: Any = None,
) -> list[tuple[int, str | None]]:
    """topk.peeling_top_k: k exponential-mechanism steps of epsilon/k (mechanisms/peeling.py;
    charged peeling_cost(k, epsilon))."""
    from topk_middleware.mechanisms.peeling import peeling_top_k
    from topk_middleware.validation import check_common

    no_nulls(plpy, source=source, k=k, epsilon=epsilon, oblivious=oblivious)
    checked(plpy, check_common, k, epsilon, 0.0)
    checked(plpy, check_key, release_key)
    not_oblivious(plpy, "peeling", oblivious)
    return _charged_release(
        plpy,
        GD,
        source,
        lambda table, budget, seed: peeling_top_k(table, k, epsilon, seed=seed, budget=budget),
        Keyed(release_key, "peeling_top_k", {"k": k, "epsilon": epsilon}),
    )


def server_joint(
    plpy: Any,
    GD: dict[str, Any],
    source: Any,
    k: Any,
    epsilon: Any,
    oblivious: Any = True,
    release_key: Any = None,
) -> list[tuple[int, str | None]]:
    """topk.joint_top_k: a k-set from the joint exponential mechanism, in random order
    (mechanisms/joint.py; charged joint_cost(epsilon))."""
    from topk_middleware.mechanisms.joint import check_joint_size, joint_top_k
    from topk_middleware.validation import check_common

    no_nulls(plpy, source=source, k=k, epsilon=epsilon, oblivious=oblivious)
    checked(plpy, check_common, k, epsilon, 0.0)
    checked(plpy, check_key, release_key)
    not_oblivious(plpy, "joint", oblivious)
    checked(plpy, check_joint_size, k)  # work known to be excessive, before anything
    return _charged_release(
        plpy,
        GD,
        source,
        lambda table, budget, seed: joint_top_k(table, k, epsilon, seed=seed, budget=budget),
        Keyed(release_key, "joint_top_k", {"k": k, "epsilon": epsilon}),
    )


def server_limited_domain(
    plpy: Any,
    GD: dict[str, Any],
    source: Any,
    k: Any,
    k_bar: Any,
    epsilon: Any,
    delta: Any,
    oblivious: Any = True,
    release_key: Any = None,
) -> list[tuple[int, str | None]]:
    """topk.limited_domain_top_k: Durfee-Rogers Algorithm 1 (mechanisms/limited_domain.py;
    charged limited_domain_cost(k, epsilon, delta)); a bottom symbol is a last row with item
    NULL."""
    from topk_middleware.mechanisms.limited_domain import check_limited_domain, limited_domain_top_k

    no_nulls(
        plpy, source=source, k=k, k_bar=k_bar, epsilon=epsilon, delta=delta, oblivious=oblivious
    )
    checked(plpy, check_limited_domain, k, k_bar, epsilon, delta, None)
    checked(plpy, check_key, release_key)
    not_oblivious(plpy, "limited_domain", oblivious)
    return _charged_release(
        plpy,
        GD,
        source,
        lambda table, budget, seed: limited_domain_top_k(
            table, k, k_bar, epsilon, delta, seed=seed, budget=budget
        ),
        Keyed(
            release_key,
            "limited_domain_top_k",
            {"k": k, "k_bar": k_bar, "epsilon": epsilon, "delta": delta},
        ),
    )


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
