"""`result.to_arrow()` and `release.to_arrow()`: the release only (position, item; the guarantee in
the schema metadata), readable by DuckDB and Polars; a clear error when pyarrow is missing."""

from __future__ import annotations

import dataclasses
import json
import sys

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from adapters.memory import ArraySource
from topk_middleware import private_top_k
from topk_middleware.release import BOTTOM_KEY, GUARANTEE_KEY, RANKED_KEY

SCORES = np.random.default_rng(11).integers(0, 1000, size=500)


def test_release_as_an_arrow_table() -> None:
    result = private_top_k(
        ArraySource(SCORES, ids=np.arange(500) * 3 + 1), k=7, epsilon=2.0, seed=4
    )
    table = result.to_arrow()
    assert table.schema.names == ["position", "item"]
    assert table.schema.field("position").type == pa.int32()
    assert table.column("position").to_pylist() == list(range(1, 8))
    assert table.column("item").to_pylist() == [int(i) for i in result.items]
    # The guarantee, and only the release's facts, in the metadata: no access count or timing.
    metadata = table.schema.metadata
    assert set(metadata) == {GUARANTEE_KEY, RANKED_KEY, BOTTOM_KEY}
    assert json.loads(metadata[GUARANTEE_KEY]) == dataclasses.asdict(result.privacy)
    assert metadata[RANKED_KEY] == b"true" and metadata[BOTTOM_KEY] == b"false"
    assert table.equals(result.release().to_arrow(), check_metadata=True)


def test_duckdb_and_polars_query_a_release() -> None:
    result = private_top_k(ArraySource(SCORES), k=5, epsilon=1.0, seed=9)
    release = result.to_arrow()  # noqa: F841  (DuckDB finds the Arrow table by its name)
    rows = duckdb.sql("SELECT position, item FROM release ORDER BY position").fetchall()
    assert rows == [(p, int(i)) for p, i in enumerate(result.items, 1)]
    assert duckdb.sql("SELECT count(*) FROM release WHERE position <= 2").fetchall() == [(2,)]
    frame = pl.from_arrow(result.to_arrow())
    assert frame.columns == ["position", "item"]
    assert frame.sort("position")["item"].to_list() == [int(i) for i in result.items]


def test_text_ids_and_an_unranked_set() -> None:
    ids = np.array([f"item-{i}" for i in range(500)])
    result = private_top_k(ArraySource(SCORES, ids=ids), k=4, epsilon=1.0, noise="laplace", seed=2)
    table = result.to_arrow()
    assert table.schema.field("item").type == pa.string()
    assert table.column("item").to_pylist() == list(result.items) == sorted(result.items)
    assert table.schema.metadata[RANKED_KEY] == b"false"
    assert json.loads(table.schema.metadata[GUARANTEE_KEY])["noise"] == "laplace"


def test_without_pyarrow_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    result = private_top_k(ArraySource(SCORES), k=2, epsilon=1.0, seed=1)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'topk_middleware\[arrow\]'"):
        result.to_arrow()
