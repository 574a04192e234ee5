"""topk_middleware: differentially private top-k from the table that holds the counts.

The core, one idea per module:
    access.py        sorted / random access, and the CountedAccess layer that counts them
    noise.py         Gumbel and Laplace noise
    noise_list.py    the noise list L2 (eager; the lazy oracle of Algorithm 4)
    threshold.py     Fagin's Threshold Algorithm (Algorithm 1) and its stopping rule
    mechanisms/      one-shot (Algorithm 2), private threshold (Algorithm 3), ...
    privacy.py       guarantees and noise calibration (Facts 3.2, 3.3)
    accounting.py    each release's guarantee in every form; PrivacyBudget composes them
    ledger.py        PrivacyLedger: durable per-principal budgets in a SQL database
    release_keys.py  idempotent releases: one charge and one answer per release key
    streams.py       trending_top_k: a list refreshed every period under one total
    randomness.py    make_rng: ChaCha20 from the OS unless a (test) seed is given
    api.py           private_top_k
    preview.py       preview: the expected utility at each epsilon, for the table's owner only
    names.py         the public names and error quoting, without numpy (the CLI's --help)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Public name -> the module that defines it. Imported on first use (PEP 562), so that importing
# one light module of the package (names.py for the CLI's --help) loads no numpy or scipy.
_WHERE = {
    "AccessStats": ".access",
    "CountedAccess": ".access",
    "RandomAccess": ".access",
    "Rows": ".access",
    "SortedAccess": ".access",
    "Source": ".access",
    "BudgetExceeded": ".accounting",
    "MechanismResult": ".accounting",
    "PrivacyBudget": ".accounting",
    "PrivacyCost": ".accounting",
    "TopKResult": ".api",
    "private_top_k": ".api",
    "LedgerBudget": ".ledger",
    "PrivacyLedger": ".ledger",
    "ReleaseKeyConflict": ".release_keys",
    "TrendingStream": ".streams",
    "trending_top_k": ".streams",
    "CostModel": ".mechanisms.cost_aware",
    "exponential_mechanism": ".mechanisms.exponential",
    "joint_top_k": ".mechanisms.joint",
    "limited_domain_top_k": ".mechanisms.limited_domain",
    "PayWhatYouGet": ".mechanisms.pay_what_you_get",
    "peeling_top_k": ".mechanisms.peeling",
    "stable_top_k": ".mechanisms.stable",
    "Batching": ".mechanisms.threshold",
    "Preview": ".preview",
    "preview": ".preview",
    "PrivacyGuarantee": ".privacy",
    "calibrate": ".privacy",
    "ArrayList": ".threshold",
    "TAResult": ".threshold",
    "threshold_algorithm": ".threshold",
}

if TYPE_CHECKING:
    from .access import AccessStats, CountedAccess, RandomAccess, Rows, SortedAccess, Source
    from .accounting import BudgetExceeded, MechanismResult, PrivacyBudget, PrivacyCost
    from .api import TopKResult, private_top_k
    from .ledger import LedgerBudget, PrivacyLedger
    from .mechanisms.cost_aware import CostModel
    from .mechanisms.exponential import exponential_mechanism
    from .mechanisms.joint import joint_top_k
    from .mechanisms.limited_domain import limited_domain_top_k
    from .mechanisms.pay_what_you_get import PayWhatYouGet
    from .mechanisms.peeling import peeling_top_k
    from .mechanisms.stable import stable_top_k
    from .mechanisms.threshold import Batching
    from .preview import Preview, preview
    from .privacy import PrivacyGuarantee, calibrate
    from .release_keys import ReleaseKeyConflict
    from .streams import TrendingStream, trending_top_k
    from .threshold import ArrayList, TAResult, threshold_algorithm


def __getattr__(name: str) -> Any:
    """Load a public name's module on first use (PEP 562)."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'topk_middleware' has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


__all__ = [
    "AccessStats",
    "ArrayList",
    "Batching",
    "BudgetExceeded",
    "CostModel",
    "CountedAccess",
    "LedgerBudget",
    "MechanismResult",
    "PayWhatYouGet",
    "Preview",
    "PrivacyBudget",
    "PrivacyCost",
    "PrivacyGuarantee",
    "PrivacyLedger",
    "RandomAccess",
    "ReleaseKeyConflict",
    "Rows",
    "SortedAccess",
    "Source",
    "TAResult",
    "TopKResult",
    "TrendingStream",
    "calibrate",
    "exponential_mechanism",
    "joint_top_k",
    "limited_domain_top_k",
    "peeling_top_k",
    "preview",
    "private_top_k",
    "stable_top_k",
    "threshold_algorithm",
    "trending_top_k",
]
