"""What an analyst receives (result.release()) and what stays with the operator
(result.diagnostics); Laplace sets in a data-independent order."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from adapters.memory import ArraySource
from topk_middleware import limited_domain_top_k, private_top_k
from topk_middleware.release import Diagnostics, Release


def test_release_holds_items_and_guarantee_only() -> None:
    result = private_top_k(ArraySource(np.arange(100.0)), 3, 1.0, method="threshold", seed=1)
    release = result.release()
    assert isinstance(release, Release)
    fields = {f.name for f in dataclasses.fields(release)}
    assert fields == {"items", "privacy", "ranked", "bottom", "counts", "count_error"}
    assert release.counts is None and release.count_error is None  # with_counts=False
    assert release.items == tuple(result.items) and release.privacy == result.privacy
    with pytest.raises(dataclasses.FrozenInstanceError):
        release.items = ()  # type: ignore[misc]
    d = result.diagnostics
    assert isinstance(d, Diagnostics)
    assert d.accesses == result.accesses and d.m == 100 and d.method == "threshold"
    assert d.plan == {
        "oracle": "lazy",
        "cost_aware": False,
        "requested": "threshold",
        "in_store": False,
    }
    assert d.timings["total"] > 0


def test_bottom_is_part_of_the_release() -> None:
    r = limited_domain_top_k(ArraySource(np.zeros(50)), 3, 10, 1.0, 1e-6, seed=0)
    assert r.release().bottom is r.bottom is True


def test_laplace_sets_come_sorted_by_id_not_by_noisy_rank() -> None:
    """Ids ordered against the counts: the released order is the id order whatever the noise."""
    scores = np.arange(200.0)
    ids = [f"item{999 - i:04d}" for i in range(200)]
    for seed in range(20):
        r = private_top_k(ArraySource(scores, ids=ids), 5, 2.0, noise="laplace", seed=seed)
        assert r.items == sorted(r.items) and r.ranked is False
