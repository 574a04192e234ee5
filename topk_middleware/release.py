"""What a run produces: the analyst's release and the operator's diagnostics, and the release in
forms other programs read (a JSON-ready dict, an Arrow table).

The release carries the items, whether their order is a ranking, the bottom flag and the privacy
guarantee; never the operator diagnostics (access counts, timings and plan choices depend on the
data: DESIGN invariant 7).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .access import AccessStats
from .privacy import PrivacyGuarantee

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class Release:
    """What an analyst receives: the items and the guarantee, nothing else data-dependent.

    `ranked` says whether the order of `items` is part of the release; when it is not (Laplace,
    joint, StableTopK sets) the items come in a data-independent order. `bottom`: the mechanism
    released the bottom symbol (limited domain, StableTopK), itself covered by the guarantee.
    """

    items: tuple[Any, ...]
    privacy: PrivacyGuarantee
    ranked: bool
    bottom: bool = False
    # with_counts=True: each item's noisy count (ints aligned with items) and the half-width of
    # their 95% interval (exact discrete Laplace law: noisy_counts.py); None otherwise
    counts: tuple[int, ...] | None = None
    count_error: int | None = None

    def to_arrow(self) -> Any:
        """The release as a pyarrow Table (position, item; the guarantee in the schema
        metadata): release_to_arrow. Needs the `arrow` extra."""
        return release_to_arrow(self)


@dataclass(frozen=True)
class Diagnostics:
    """Operator-side facts about a run: data-dependent and outside the privacy guarantee (the
    access counts of the threshold algorithm depend on the counts; DESIGN invariant 7)."""

    accesses: AccessStats
    method: str
    m: int
    timings: dict[str, float]
    plan: dict[str, Any]


@dataclass(frozen=True)
class TopKResult:
    """A private top-k run: the release (`release()`, for the analyst) and the operator's
    diagnostics (`diagnostics`; `accesses` stays for the operator's convenience)."""

    items: list[Any]  # item ids: best first when ranked; else in a data-independent order
    privacy: PrivacyGuarantee
    accesses: AccessStats  # operator-side: data-dependent, outside the guarantee
    ranked: bool  # True when the order of `items` is part of the release (Gumbel, Remark 3.5)
    method: str
    m: int
    timings: dict[str, float] = field(default_factory=dict, compare=False)
    plan: dict[str, Any] = field(default_factory=dict, compare=False)
    counts: tuple[int, ...] | None = None  # with_counts=True: noisy counts aligned with items
    count_error: int | None = None  # their 95% interval's half-width

    @property
    def diagnostics(self) -> Diagnostics:
        return Diagnostics(self.accesses, self.method, self.m, dict(self.timings), dict(self.plan))

    def release(self) -> Release:
        """The analyst's view: items, guarantee, whether ranked (and bottom, where it applies)."""
        return Release(
            tuple(self.items),
            self.privacy,
            self.ranked,
            bool(getattr(self, "bottom", False)),
            self.counts,
            self.count_error,
        )

    def to_arrow(self) -> Any:
        """The release only (never the diagnostics) as a pyarrow Table: `release().to_arrow()`."""
        return self.release().to_arrow()


def guarantee_text(release: Release, derivation: bool = True) -> str:
    """The guarantee of a release in words, as topk.last_guarantee() returns it and the CLI
    prints it: (epsilon, delta), the neighbours and the noise, the sensitivity assumed, the
    counts' interval where counts were released, and (`derivation`) the derivation, the facts
    and theorems it rests on (Release.privacy.derivation holds it whatever is printed)."""
    p = release.privacy
    lines = [
        f"Guarantee: ({p.epsilon:.6g}, {p.delta:.3g})-DP for add/remove-one-client neighbours, "
        f"{p.noise} noise of per-item scale {p.scale:.6g}; assumes each client changes each "
        f"count by at most {p.sensitivity:g}"
    ]
    if release.counts is not None:
        lines.append(
            f"Counts: each within +/- {release.count_error} of its count with probability at "
            f"least 95% (discrete Laplace noise of scale {p.counts_scale:.6g}, epsilon "
            f"{p.counts_epsilon:.6g} of the total)"
        )
    if derivation:
        lines.append(f"  derived from {p.derivation}")
    return "\n".join(lines)


def unranked_order(items: list[Any]) -> list[Any]:
    """A set's items in a data-independent order: sorted by id (ids of one store share a type)."""
    try:
        return sorted(items)
    except TypeError:
        return sorted(items, key=repr)


# Keys of the Arrow schema metadata.
GUARANTEE_KEY = b"topk.guarantee"
RANKED_KEY = b"topk.ranked"
BOTTOM_KEY = b"topk.bottom"
COUNT_ERROR_KEY = b"topk.count_error"


def plain(value: Any) -> Any:
    """A numpy scalar as the Python scalar it holds; anything else unchanged."""
    return value.item() if isinstance(value, np.generic) else value


def release_dict(release: Release) -> dict[str, Any]:
    """The release as plain Python values: {"items", "ranked", "bottom", "guarantee"}, the
    guarantee with the fields of privacy.PrivacyGuarantee; with noisy counts also "counts" and
    "count_error"."""
    out = {
        "items": [plain(item) for item in release.items],
        "ranked": release.ranked,
        "bottom": release.bottom,
        "guarantee": dataclasses.asdict(release.privacy),
    }
    if release.counts is not None:
        out["counts"] = [int(c) for c in release.counts]
        out["count_error"] = release.count_error
    return out


def release_to_arrow(release: Release) -> pa.Table:
    """An Arrow table (position int32 from 1, item; with noisy counts also count int64) of the
    release; the guarantee (JSON), whether the order is a ranking and the counts' 95% half-width
    in the schema metadata. Needs the `arrow` extra."""
    try:
        import pyarrow as pa
    except ImportError:
        raise ImportError(
            "to_arrow() needs pyarrow: pip install 'topk_middleware[arrow]'"
        ) from None
    data = release_dict(release)
    items = pa.array(data["items"])
    positions = pa.array(range(1, len(items) + 1), type=pa.int32())
    metadata = {
        GUARANTEE_KEY: json.dumps(data["guarantee"]).encode("utf-8"),
        RANKED_KEY: b"true" if release.ranked else b"false",
        BOTTOM_KEY: b"true" if release.bottom else b"false",
    }
    columns, names = [positions, items], ["position", "item"]
    if release.counts is not None:
        columns.append(pa.array(data["counts"], type=pa.int64()))
        names.append("count")
        metadata[COUNT_ERROR_KEY] = str(release.count_error).encode("utf-8")
    return pa.Table.from_arrays(columns, names=names).replace_schema_metadata(metadata)
