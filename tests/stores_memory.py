"""Conformance store: ArraySource (numpy arrays)."""

from collections.abc import Callable
from typing import Any

import pytest

from adapters.memory import ArraySource


@pytest.fixture
def make_memory_source() -> Callable[[Any, Any], ArraySource]:
    return lambda scores, ids: ArraySource(scores, ids)
