"""Inputs: text ids validated without per-id Python, pyarrow Tables and Polars DataFrames as
sources, and a clear refusal for a DuckDB view registered on one connection.

The vectorised text-id path (topk_middleware/validation.py, _check_text_ids) must agree with the
general path: the same order key (code point order for str, byte order for bytes), the same
duplicate refusals, and the general path for ids a fixed-width numpy string would alter (a
trailing NUL). A frame source releases exactly what ArraySource over the same arrays releases
with the same seed (the mechanism sees the same histogram).
"""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from adapters.duckdb import DuckDBTable
from adapters.memory import ArraySource, _arrow_column
from topk_middleware import private_top_k
from topk_middleware import validation as v

RNG = np.random.default_rng(17)
M = 3000
SCORES = RNG.integers(0, 40, size=M)  # many ties: the id order decides


def _random_text(n: int) -> list[str]:
    alphabet = list("abcXYZ09 é中\U0001f600\x01")
    rows = {"".join(RNG.choice(alphabet, size=RNG.integers(1, 9))) for _ in range(3 * n)}
    return sorted(rows)[:n] if len(rows) >= n else pytest.fail("too few distinct ids")


TEXT = [str(t) for t in np.random.default_rng(2).permutation(_random_text(M))]


def _general_key(ids: list[object]) -> np.ndarray:
    """The order key as Python's sort gives it (the general path's definition)."""
    order = sorted(range(len(ids)), key=lambda i: ids[i])  # type: ignore[arg-type,return-value]
    key = np.empty(len(ids), dtype=np.int64)
    key[np.asarray(order)] = np.arange(len(ids))
    return key


@pytest.mark.parametrize("kind", ["str", "bytes"])
def test_text_ids_take_the_vectorised_path_and_agree(kind: str) -> None:
    ids: list[object] = TEXT if kind == "str" else [t.encode() for t in TEXT]
    fast = v._check_text_ids(list(ids), "ids")
    assert fast is not None
    out, key = fast
    assert out.dtype == object and out.tolist() == ids
    assert all(type(x) is type(ids[0]) for x in out)
    np.testing.assert_array_equal(key, _general_key(ids))
    np.testing.assert_array_equal(v.check_ids(ids, M, "ids")[1], key)


@pytest.mark.parametrize("kind", ["U", "S"])
def test_numpy_fixed_width_arrays_are_sorted_as_they_are(kind: str) -> None:
    ids = np.array(TEXT) if kind == "U" else np.array([t.encode() for t in TEXT])
    out, key = v.check_ids(ids, M, "ids")
    assert out.dtype == object and out.tolist() == ids.tolist()
    assert {type(x) for x in out} == ({str} if kind == "U" else {bytes})
    np.testing.assert_array_equal(key, _general_key(ids.tolist()))


def test_numpy_string_scalars_come_back_plain() -> None:
    out, key = v.check_ids(list(np.array(TEXT[:50])), 50, "ids")
    assert [type(x) for x in out] == [str] * 50 and out.tolist() == TEXT[:50]
    np.testing.assert_array_equal(key, _general_key(TEXT[:50]))


def test_a_trailing_nul_or_mixed_kinds_take_the_general_path() -> None:
    ids = ["a", "a\x00", "b", "a\x00\x00"]
    assert v._check_text_ids(ids, "ids") is None  # numpy would drop the NULs
    out, key = v.check_ids(ids, 4, "ids")
    assert out.tolist() == ids
    np.testing.assert_array_equal(key, _general_key(ids))
    assert v._check_text_ids(["a", b"a"], "ids") is None


def test_duplicate_text_ids_are_refused_naming_both_indexes() -> None:
    ids = [*TEXT[:10], TEXT[3]]
    with pytest.raises(ValueError, match=r"duplicate ids, e\.g\. .* at indexes 3 and 10"):
        ArraySource(np.arange(11), ids)
    with pytest.raises(ValueError, match="duplicate ids"):
        ArraySource(np.arange(11), np.array(ids))  # a numpy 'U' array


def test_text_ids_release_what_the_general_path_releases() -> None:
    # The same histogram with each text id replaced by its rank in code point order.
    fast = private_top_k(ArraySource(SCORES, TEXT), k=10, epsilon=2.0, seed=5)
    ranks = _general_key(list(TEXT))
    general = private_top_k(ArraySource(SCORES, ranks), k=10, epsilon=2.0, seed=5)
    assert fast.items == [TEXT[int(np.flatnonzero(ranks == r)[0])] for r in general.items]


# ----- pyarrow and Polars ------------------------------------------------------------------------
INT_IDS = 10_000 + 3 * np.arange(M)


def _reference(ids: object) -> list[object]:
    return private_top_k(ArraySource(SCORES, ids), k=8, epsilon=1.0, seed=9).items


@pytest.mark.parametrize(
    "ids", [INT_IDS, np.array(TEXT, dtype=object)], ids=["int ids", "text ids"]
)
def test_arrow_table_is_a_source(ids: np.ndarray) -> None:
    table = pa.table({"item": pa.array(ids.tolist()), "votes": pa.array(SCORES)})
    source = ArraySource.from_arrow(table, id="item", score="votes")
    assert private_top_k(source, k=8, epsilon=1.0, seed=9).items == _reference(ids)
    chunked = pa.concat_tables([table.slice(0, 1000), table.slice(1000)])
    assert chunked.column("item").num_chunks == 2
    source = ArraySource.from_arrow(chunked, id="item", score="votes")
    assert private_top_k(source, k=8, epsilon=1.0, seed=9).items == _reference(ids)
    batch = table.to_batches()[0]
    source = ArraySource.from_arrow(batch, id="item", score="votes")
    assert private_top_k(source, k=8, epsilon=1.0, seed=9).items == _reference(ids)


def test_arrow_numeric_column_is_read_without_a_copy() -> None:
    table = pa.table({"id": INT_IDS, "score": SCORES})
    array = _arrow_column(table, "score", "score", pa)
    buffer = table.column("score").chunk(0).buffers()[1]
    assert array.__array_interface__["data"][0] == buffer.address


def test_arrow_dictionary_ids() -> None:
    ids = pa.array(TEXT).dictionary_encode()
    table = pa.table({"id": ids, "score": SCORES})
    items = private_top_k(ArraySource.from_arrow(table), k=8, epsilon=1.0, seed=9).items
    assert items == _reference(np.array(TEXT, dtype=object))


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            pa.table({"id": [1, 2], "s": [1, 2]}),
            r"no score column 'score' \(columns: \['id', 's'\]\)",
        ),
        (pa.table({"id": [1, None], "score": [1, 2]}), "id column 'id' has a null at row 1"),
        (pa.table({"id": [1, 2], "score": [3, None]}), "score column 'score' has a null at row 1"),
        (pa.table({"id": [True, False], "score": [1, 2]}), "Arrow type bool: it must be"),
        (pa.table({"id": [1, 2], "score": ["a", "b"]}), "score column 'score' is of Arrow type"),
    ],
)
def test_arrow_bad_input_refused_in_words(table: pa.Table, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        ArraySource.from_arrow(table)


def test_polars_frame_is_a_source() -> None:
    for ids in (INT_IDS, np.array(TEXT, dtype=object)):
        frame = pl.DataFrame({"item": ids.tolist(), "votes": SCORES})
        source = ArraySource.from_polars(frame, id="item", score="votes")
        assert private_top_k(source, k=8, epsilon=1.0, seed=9).items == _reference(ids)
    categorical = pl.DataFrame({"id": TEXT, "score": SCORES}).with_columns(
        pl.col("id").cast(pl.Categorical)
    )
    items = private_top_k(ArraySource.from_polars(categorical), k=8, epsilon=1.0, seed=9).items
    assert items == _reference(np.array(TEXT, dtype=object))


@pytest.mark.parametrize(
    ("frame", "error", "message"),
    [
        (pl.DataFrame({"id": [1, 2]}), ValueError, r"no score column 'score'"),
        (pl.DataFrame({"id": [1, 2], "score": [1, None]}), ValueError, "null at row 1"),
        (pl.DataFrame({"id": [True, False], "score": [1, 2]}), TypeError, "type Boolean"),
        (pl.DataFrame({"id": [1, 2], "score": [1, 2]}).lazy(), TypeError, "collect"),
        ({"id": [1], "score": [1]}, TypeError, "got dict"),
    ],
)
def test_polars_bad_input_refused_in_words(frame: object, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        ArraySource.from_polars(frame)


def test_duckdb_registered_arrow_view_is_refused_clearly() -> None:
    con = duckdb.connect()
    table = pa.table({"id": INT_IDS, "score": SCORES})
    con.register("votes_view", table)
    with pytest.raises(ValueError, match="temporary table or view of this connection") as caught:
        DuckDBTable(con, "votes_view")
    assert "ArraySource.from_arrow" in str(caught.value)
    con.execute("CREATE TABLE votes AS SELECT * FROM votes_view")  # the remedy it names
    source = DuckDBTable(con, "votes")
    source.prepare()
    items = private_top_k(source, k=8, epsilon=1000.0, seed=9).items
    score_of = dict(zip(INT_IDS.tolist(), SCORES.tolist(), strict=True))
    assert len(set(items)) == 8 and min(score_of[i] for i in items) == np.sort(SCORES)[-8]
