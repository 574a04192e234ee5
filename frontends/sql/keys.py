"""Release keys of the SQL functions (`release_key =>`): a retried call gets the stored answer.

A call under a key already answered returns the stored rows and charges nothing; the same key
with other arguments (the table by OID) is refused before anything is read or charged; the noise
comes from the secret the ledger keeps with the key (topk_middleware/release_keys.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Keyed:
    """A release under an analyst's key: the SQL function's name and its arguments (with the
    table, by OID: what "the same parameters" means for a key)."""

    key: str | None
    function: str
    arguments: dict[str, Any]


def check_key(release_key: Any) -> None:
    """A release key: NULL (none) or release_keys.check_release_key's string."""
    from topk_middleware.release_keys import check_release_key

    if release_key is not None:
        check_release_key(release_key)


def keyed_run(
    keyed: Keyed, relation_oid: int, run: Callable[..., Any]
) -> Callable[[Any, Any], Any]:
    """`run(table, budget, seed)` as a release of `keyed` (release_keys.keyed_release, under the
    role's principal): a key already answered returns its stored release, charging nothing; a
    key charged with other arguments is refused (ReleaseKeyConflict) before anything is read or
    charged; the noise comes from the secret the ledger keeps with the key."""
    from topk_middleware.release_keys import keyed_release

    if keyed.key is None:
        return lambda table, budget: run(table, budget, None)
    arguments = {**keyed.arguments, "source": relation_oid}
    return lambda table, budget: keyed_release(
        budget,
        keyed.key,
        keyed.function,
        table,
        arguments,
        lambda rng, keyed_budget: run(table, keyed_budget, rng),
    )
