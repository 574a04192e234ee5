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
    randomness.py    make_rng: ChaCha20 from the OS unless a (test) seed is given
    api.py           private_top_k
"""

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
from .privacy import PrivacyGuarantee, calibrate
from .threshold import ArrayList, TAResult, threshold_algorithm

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
    "PrivacyBudget",
    "PrivacyCost",
    "PrivacyGuarantee",
    "PrivacyLedger",
    "RandomAccess",
    "Rows",
    "SortedAccess",
    "Source",
    "TAResult",
    "TopKResult",
    "calibrate",
    "exponential_mechanism",
    "joint_top_k",
    "limited_domain_top_k",
    "peeling_top_k",
    "private_top_k",
    "stable_top_k",
    "threshold_algorithm",
]
