"""The Polars namespace `topk` (frontends/polars_ns.py): releases from DataFrames and
LazyFrames of counts and from frames of raw events with bounded contributions, checked against
ArraySource and DuckDBTable.from_votes (independent implementations) and a count by hand; the
charge and the refusals. About 2 s."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest

import frontends.polars_ns  # noqa: F401 - registers the namespace
from adapters.duckdb import DuckDBTable
from adapters.memory import ArraySource
from frontends.polars_ns import NAMESPACE, clipped_counts
from topk_middleware import PrivacyLedger, private_top_k
from topk_middleware.release import guarantee_text


@pytest.fixture
def counts() -> pl.DataFrame:
    rng = np.random.default_rng(3)
    m = 5000
    return pl.DataFrame(
        {
            "item": [f"it{i:05d}" for i in rng.permutation(m)],
            "votes": rng.integers(0, 50, m),
            "other": np.zeros(m),
        }
    )


def test_the_namespace_is_topk_on_both_frame_kinds() -> None:
    assert NAMESPACE == "topk" and NAMESPACE != "dp"  # OpenDP's namespace is "dp"
    assert hasattr(pl.DataFrame({"a": [1]}), "topk") and hasattr(pl.LazyFrame(), "topk")


@pytest.mark.parametrize("lazy", [False, True])
def test_frame_release_is_the_array_source_release(counts: pl.DataFrame, lazy: bool) -> None:
    """With one seed the namespace releases what private_top_k over ArraySource.from_polars
    releases, as a frame of rank (Int32 from 1) and item (the id column's type), with the
    guarantee beside it. Fails if the frame, its types or its guarantee differ."""
    frame = counts.lazy() if lazy else counts
    got = frame.topk.private_top_k(k=8, epsilon=2.0, id="item", score="votes", seed=11)
    want = private_top_k(ArraySource.from_polars(counts, id="item", score="votes"), 8, 2.0, seed=11)
    assert got.frame.columns == ["rank", "item"]
    assert got.frame.schema == pl.Schema({"rank": pl.Int32, "item": pl.String})
    assert got.frame.get_column("item").to_list() == want.items
    assert got.frame.get_column("rank").to_list() == list(range(1, 9))
    assert got.privacy == want.privacy
    assert got.guarantee_text == guarantee_text(want.release())
    arrow = got.to_arrow()
    assert b"topk.guarantee" in arrow.schema.metadata


def test_noisy_counts_on_request_and_the_charge(counts: pl.DataFrame, tmp_path: Path) -> None:
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'ledger.db'}")
    budget = ledger.budget("analyst", 3.0)
    got = counts.topk.private_top_k(
        k=5, epsilon=1.0, id="item", score="votes", with_counts=True, budget=budget
    )
    assert got.frame.columns == ["rank", "item", "count"]
    assert got.frame.schema["count"] == pl.Int64
    assert got.release.count_error is not None and "Counts: each within" in got.guarantee_text
    assert len(ledger.releases("analyst")) == 1
    ledger.close()


def test_declared_sensitivity_scales_the_noise(counts: pl.DataFrame) -> None:
    one = counts.topk.private_top_k(k=4, epsilon=1.0, id="item", score="votes", seed=1)
    three = counts.topk.private_top_k(
        k=4, epsilon=1.0, id="item", score="votes", sensitivity=3, seed=1
    )
    assert three.privacy.sensitivity == 3 and three.privacy.scale == pytest.approx(
        3 * one.privacy.scale
    )
    assert "at most 3" in three.guarantee_text


def events(seed: int = 5) -> tuple[pl.DataFrame, list[str]]:
    rng = np.random.default_rng(seed)
    domain = [f"i{j}" for j in range(40)]
    clients = rng.integers(0, 300, 4000)
    items = [domain[j] for j in np.minimum(rng.zipf(1.6, 4000) - 1, 34)]  # i35..i39: no votes
    return pl.DataFrame({"client": clients, "item": items}), domain


def by_hand(frame: pl.DataFrame, domain: list[str], bound: int) -> dict[str, int]:
    """Each client's votes per item clipped at `bound`, summed per item, 0 for the rest."""
    per_pair = Counter(zip(frame["client"].to_list(), frame["item"].to_list(), strict=True))
    totals: dict[str, int] = defaultdict(int)
    for (_, item), n in per_pair.items():
        totals[item] += min(n, bound)
    return {item: totals.get(item, 0) for item in domain}


@pytest.mark.parametrize("bound", [1, 3])
def test_clipped_counts_match_a_count_by_hand_and_duckdb_from_votes(bound: int) -> None:
    frame, domain = events()
    got = clipped_counts(
        frame.lazy(), pl.DataFrame({"id": domain}), "client", "item", None, bound, None
    )
    assert dict(zip(got["id"].to_list(), got["score"].to_list(), strict=True)) == by_hand(
        frame, domain, bound
    )
    con = duckdb.connect()
    con.execute("CREATE TABLE votes AS SELECT * FROM frame")
    con.execute("CREATE TABLE items AS SELECT unnest(?::VARCHAR[]) AS id", [domain])
    table = DuckDBTable.from_votes(con, "votes", "items", max_per_item=bound)
    duck = dict(con.execute(f'SELECT id, score FROM "{table.table}"').fetchall())
    assert duck == by_hand(frame, domain, bound)
    con.close()


def test_items_per_client_keeps_at_most_l_of_each_clients_own_items() -> None:
    """With L = 2 every client adds to at most 2 items, each of its own, each by at most the
    bound; items are kept by one random priority per item (so a client with items {a, b, c}
    keeps the same two whichever other clients exist)."""
    frame, domain = events(9)
    got = clipped_counts(frame.lazy(), pl.DataFrame({"id": domain}), "client", "item", None, 2, 2)
    full = by_hand(frame, domain, 2)
    kept = dict(zip(got["id"].to_list(), got["score"].to_list(), strict=True))
    assert all(0 <= kept[i] <= full[i] for i in domain)
    clients = frame["client"].n_unique()
    assert sum(kept.values()) <= 2 * 2 * clients
    assert sum(kept.values()) < sum(full.values())


def test_release_from_votes_states_the_bounds() -> None:
    frame, domain = events()
    got = frame.lazy().topk.private_top_k_from_votes(
        k=3,
        epsilon=1.0,
        items=pl.Series(domain),
        max_per_item=2,
        max_items_per_client=4,
        seed=2,
    )
    assert got.privacy.sensitivity == 2 and "at most 2" in got.guarantee_text
    assert got.frame.schema == pl.Schema({"rank": pl.Int32, "item": pl.String})
    assert set(got.frame["item"].to_list()) <= set(domain)


def test_refusals_in_the_projects_words_before_anything_is_charged(
    counts: pl.DataFrame, tmp_path: Path
) -> None:
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'ledger.db'}")
    budget = ledger.budget("analyst", 3.0)
    frame, domain = events()
    with pytest.raises(ValueError, match="no column 'nope'"):
        counts.topk.private_top_k(k=3, epsilon=1.0, id="nope", score="votes", budget=budget)
    with pytest.raises(ValueError, match="null at row 2"):
        pl.DataFrame({"id": [1, 2, 3], "score": [1, 2, None]}).topk.private_top_k(
            k=1, epsilon=1.0, budget=budget
        )
    with pytest.raises(ValueError, match="k must be >= 1"):
        counts.topk.private_top_k(k=0, epsilon=1.0, id="item", score="votes", budget=budget)
    with pytest.raises(ValueError, match="missing from the domain"):
        frame.topk.private_top_k_from_votes(k=2, epsilon=1.0, items=pl.Series(domain[:3]))
    with pytest.raises(ValueError, match="max_per_item must be a whole number"):
        frame.topk.private_top_k_from_votes(
            k=2, epsilon=1.0, items=pl.Series(domain), max_per_item=1.5
        )
    with pytest.raises(TypeError, match="items must be a Polars"):
        frame.topk.private_top_k_from_votes(k=2, epsilon=1.0, items=domain)
    assert ledger.releases("analyst") == []
    ledger.close()


def test_the_benchmark_runs_as_the_docs_show(tmp_path: Path) -> None:
    """`python -m benchmarks.polars_ns --quick --out DIR` (docs/layers.md): about 2 s."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.polars_ns", "--quick", "--out", str(tmp_path)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    payload = json.loads((tmp_path / "polars_ns.json").read_text())
    assert set(payload["median_seconds"]) == {"namespace", "from_polars", "lazy_namespace"}


def _frames() -> dict[str, pl.DataFrame]:
    rng = np.random.default_rng(11)
    m = 20_000
    ids = rng.permutation(m)
    ties = rng.integers(0, 30, m)  # long tied runs: the tie-break by id decides most of the order
    return {
        "int-ties": pl.DataFrame({"id": ids, "score": ties}),
        "negative-ids-int32": pl.DataFrame(
            {
                "id": pl.Series(ids - m // 2, dtype=pl.Int32),
                "score": pl.Series(ties, dtype=pl.UInt16),
            }
        ),
        "sparse-ids": pl.DataFrame({"id": ids * 10**12, "score": ties}),  # two-column sort
        "float-scores": pl.DataFrame({"id": ids, "score": ties / 7.0}),
        "scores-past-2^53": pl.DataFrame({"id": ids, "score": ties + 2**60}),  # doubles tie them
        "text-ids": pl.DataFrame({"id": [f"i{i}" for i in ids], "score": ties}),  # from_polars
    }


@pytest.mark.parametrize("name", list(_frames()))
def test_the_namespace_source_is_the_array_source_of_the_frame(name: str) -> None:
    """The namespace sorts integer ids in Polars (frontends/polars_ns._source): the source must
    hold exactly what ArraySource.from_polars holds (ids, scores, exact counts, in order), or
    releases would differ from those of every other layer."""
    from frontends.polars_ns import _source

    frame = _frames()[name]
    ours, theirs = _source(frame, "id", "score"), ArraySource.from_polars(frame)
    m = ours.domain_size()
    assert m == theirs.domain_size() == frame.height
    a, b = ours.read_sorted(0, m), theirs.read_sorted(0, m)
    assert list(a.ids) == list(b.ids)
    assert np.array_equal(a.scores, b.scores)
    assert ours.read_exact_scores(list(b.ids[:50])) == theirs.read_exact_scores(list(b.ids[:50]))


def test_from_canonical_order_checks_the_order_and_the_ids() -> None:
    ArraySource.from_canonical_order(np.array([5, 3, 3]), np.array([9, 1, 2]))  # canonical
    for scores, ids in [([3, 5, 3], [9, 1, 2]), ([5, 3, 3], [9, 2, 1]), ([5, 3, 2], [1, 2, 1])]:
        with pytest.raises(ValueError, match=r"canonical order|duplicate ids"):
            ArraySource.from_canonical_order(np.array(scores), np.array(ids))
    with pytest.raises(ValueError, match="duplicate ids"):  # far apart: the sorted check
        ArraySource.from_canonical_order(np.array([5, 3, 2]), np.array([10**15, 0, 10**15]))
    with pytest.raises(TypeError, match="integer ids"):
        ArraySource.from_canonical_order(np.array([5.0]), np.array(["a"]))
