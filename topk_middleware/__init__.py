"""topk_middleware: differentially private top-k from the table that holds the counts.

The core, one idea per module:
    access.py        sorted / random access, and the CountedAccess layer that counts them
    noise.py         Gumbel and Laplace noise
    noise_list.py    the noise list L2 (eager; the lazy oracle of Algorithm 4)
    threshold.py     Fagin's Threshold Algorithm (Algorithm 1) and its stopping rule
    mechanisms/      one-shot (Algorithm 2), private threshold (Algorithm 3), ...
    privacy.py       guarantees and noise calibration (Facts 3.2, 3.3)
    api.py           private_top_k
"""

from .access import AccessStats, CountedAccess, RandomAccess, Rows, SortedAccess, Source
from .api import TopKResult, private_top_k
from .mechanisms.exponential import exponential_mechanism
from .mechanisms.threshold import Batching
from .privacy import PrivacyGuarantee, calibrate
from .threshold import ArrayList, TAResult, threshold_algorithm

__all__ = [
    "AccessStats",
    "ArrayList",
    "Batching",
    "CountedAccess",
    "PrivacyGuarantee",
    "RandomAccess",
    "Rows",
    "SortedAccess",
    "Source",
    "TAResult",
    "TopKResult",
    "calibrate",
    "exponential_mechanism",
    "private_top_k",
    "threshold_algorithm",
]
