"""What an analyst receives, in forms other programs read: a JSON-ready dict and an Arrow table.

Both carry the release only (api.Release: the items, whether their order is a ranking, the bottom
flag, and the privacy guarantee), never the operator diagnostics (access counts, timings, plan
choices depend on the data: DESIGN invariant 7).
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

    from .api import Release

# Keys of the Arrow schema metadata.
GUARANTEE_KEY = b"topk.guarantee"
RANKED_KEY = b"topk.ranked"
BOTTOM_KEY = b"topk.bottom"


def plain(value: Any) -> Any:
    """A numpy scalar as the Python scalar it holds; anything else unchanged."""
    return value.item() if isinstance(value, np.generic) else value


def release_dict(release: Release) -> dict[str, Any]:
    """The release as plain Python values: {"items", "ranked", "bottom", "guarantee"}, the
    guarantee with the fields of privacy.PrivacyGuarantee."""
    return {
        "items": [plain(item) for item in release.items],
        "ranked": release.ranked,
        "bottom": release.bottom,
        "guarantee": dataclasses.asdict(release.privacy),
    }


def release_to_arrow(release: Release) -> pa.Table:
    """An Arrow table (position int32 from 1, item) of the release; the guarantee (JSON), and
    whether the order is a ranking, in the schema metadata. Needs the `arrow` extra."""
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
    return pa.Table.from_arrays(
        [positions, items], names=["position", "item"]
    ).replace_schema_metadata(metadata)
