"""DuckDB tables read as they are now (not frozen; dialects/duckdb/table.py), on real DuckDB.

What is checked: the in-store one-shot on the table is exactly the top-k of score + keyed noise
recomputed here in Python (hashlib) over every rowid slot, on spread, skewed, tied and
non-integer scores, with deleted rows (empty slots) and appended ones; a release after UPDATE,
INSERT, DELETE, TRUNCATE, DROP and CREATE again, and ALTER ... TYPE reads the table as it is
(types and keys are read per run, not kept from the constructor); a view gets a one-shot of its
own with the one-shot law; a frozen copy with a pending delta takes its in-store one-shot from the
table itself where the table holds what the copy does, and from the copy where it does not;
oblivious reads name items by rowid slot, read what public facts fix (the same statements,
parameter sizes, rows and round trips for neighbouring tables) and release the Plackett-Luce law.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from typing import Any

import duckdb
import numpy as np
import pytest
from scipy import stats

from adapters.duckdb import DuckDBTable
from tests.helpers import plackett_luce
from topk_middleware import private_top_k
from topk_middleware.keyed_noise import KeyedNoise
from topk_middleware.mechanisms.oblivious import oblivious_depth

M = 70_000  # at least 64 x 1,024: the default split (exceedances) is on


@pytest.fixture
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect()
    yield con
    con.close()


def fill(con: duckdb.DuckDBPyConnection, name: str, scores: np.ndarray, kind: str) -> None:
    """A keyed table of len(scores) rows in shuffled id order, then 500 rows deleted (empty
    rowid slots) and 300 appended (slots past the first ones)."""
    rng = np.random.default_rng(len(scores))
    ids = rng.permutation(len(scores) + 300)
    con.execute(f"CREATE TABLE {name} (id BIGINT PRIMARY KEY, score {kind} NOT NULL)")
    con.execute(
        f"INSERT INTO {name} SELECT unnest(?::BIGINT[]), unnest(?::{kind}[])",
        [ids[: len(scores)].tolist(), scores.tolist()],
    )
    gone = ids[rng.choice(len(scores) - 20, 500, replace=False) + 20].tolist()
    con.execute(f"DELETE FROM {name} WHERE id IN (SELECT unnest(?::BIGINT[]))", [gone])
    late = rng.choice(scores, 300).tolist()
    con.execute(
        f"INSERT INTO {name} SELECT unnest(?::BIGINT[]), unnest(?::{kind}[])",
        [ids[len(scores) :].tolist(), late],
    )


def exact(con: duckdb.DuckDBPyConnection, source: DuckDBTable, name: str, seed: int) -> list:
    """The release private_top_k(source, k=10, epsilon=1, seed) must give: the noise drawn as
    the release draws it (a fresh seeded generator, KeyedNoise.draw over the rowid slots),
    every slot's noise computed here (hashlib), the top 10 of score + noise, ties by rowid."""
    with source.snapshot():
        slots, m = source.oneshot_positions(), source.domain_size()
    scale = private_top_k(source, k=10, epsilon=1.0, seed=0).privacy.scale
    keyed = KeyedNoise.draw(np.random.default_rng(seed), "gumbel", scale, slots, 10)
    rows = con.execute(f"SELECT rowid, id, score::DOUBLE AS score FROM {name}").fetchnumpy()
    assert len(rows["id"]) == m and slots > int(rows["rowid"].max())
    rowids = np.asarray(rows["rowid"], dtype=np.int64)
    noisy = np.asarray(rows["score"], float) + keyed.noises(rowids)
    best = np.lexsort((rowids, -noisy))[:10]
    return np.asarray(rows["id"])[best].tolist()


FAMILIES = {
    "spread": (lambda r: r.integers(0, 1001, M), "BIGINT"),  # the exceedances set the cut
    "zipf": (lambda r: np.floor(1e6 / (1 + r.permutation(M))), "BIGINT"),  # the top rows do
    "plateau": (lambda r: np.where(r.permutation(M) < 837, 1000, 0), "BIGINT"),  # ties
    "halves": (
        lambda r: r.choice([0.5, 40.25, 40.5, 41.0], M, p=[0.98, 0.01, 0.005, 0.005]),
        "DOUBLE",
    ),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_release_is_the_exact_top_k_of_its_keyed_noise(
    con: duckdb.DuckDBPyConnection, family: str
) -> None:
    """Any cut that drops a row that can win (the exceedances filtered by the top rows' k-th
    value, the cut T - bound, integer cuts on non-integer scores) or a noise given to the wrong
    slot changes the answer: three seeds per family must match the reference exactly."""
    make, kind = FAMILIES[family]
    fill(con, "t", np.asarray(make(np.random.default_rng(1))), kind)
    source = DuckDBTable(con, "t")
    for seed in (3, 4, 5):
        result = private_top_k(source, k=10, epsilon=1.0, seed=seed)
        assert result.plan["in_store"] and result.plan["auto"]["chosen"] == "oneshot_in_store"
        assert result.plan["in_store_reads"] == "the table"
        assert result.items == exact(con, source, "t", seed), seed


def test_a_release_reads_every_kind_of_change(con: duckdb.DuckDBPyConnection) -> None:
    """UPDATE, INSERT, DELETE, TRUNCATE, DROP and CREATE again, ALTER ... TYPE: each release,
    by every method, names the top-3 of the table as it is (epsilon 10^4: no rank swaps)."""
    con.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, score BIGINT)")
    con.execute("INSERT INTO t SELECT range, range * 2 FROM range(300)")
    source = DuckDBTable(con, "t")

    def top() -> set[tuple[Any, ...]]:
        return {
            tuple(private_top_k(source, k=3, epsilon=1e4, method=method, seed=1).items)
            for method in ("auto", "threshold", "oneshot")
        }

    assert top() == {(299, 298, 297)}
    con.execute("UPDATE t SET score = 10000 WHERE id = 5")
    assert top() == {(5, 299, 298)}
    con.execute("INSERT INTO t VALUES (1000, 20000)")
    assert top() == {(1000, 5, 299)}
    con.execute("DELETE FROM t WHERE id IN (1000, 299)")
    assert top() == {(5, 298, 297)}
    con.execute("TRUNCATE t")
    with pytest.raises(ValueError, match="empty"):
        private_top_k(source, k=3, epsilon=1.0)
    con.execute("INSERT INTO t SELECT range, 1000 - range FROM range(50)")
    assert top() == {(0, 1, 2)}
    con.execute("DROP TABLE t")
    con.execute("CREATE TABLE t (id BIGINT, score DOUBLE)")
    con.execute("INSERT INTO t SELECT range, range * 1.5 FROM range(400)")
    assert top() == {(399, 398, 397)}
    con.execute("ALTER TABLE t ALTER score TYPE BIGINT")  # 598.5 rounds to 599
    con.execute("UPDATE t SET score = 7000 WHERE id = 9")
    assert top() == {(9, 399, 398)}


def test_a_table_made_again_without_its_key_has_its_ids_checked(
    con: duckdb.DuckDBPyConnection,
) -> None:
    """A wrapper built while the table had a PRIMARY KEY: after DROP and CREATE without one,
    duplicate ids are refused (the key is looked up per run, not kept)."""
    con.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, score BIGINT)")
    con.execute("INSERT INTO t SELECT range, range FROM range(1000)")
    source = DuckDBTable(con, "t")
    assert private_top_k(source, k=1, epsilon=1e4, seed=1).items == [999]
    con.execute("DROP TABLE t")
    con.execute("CREATE TABLE t AS SELECT range % 500 AS id, range AS score FROM range(1000)")
    with pytest.raises(ValueError, match="duplicate ids"):
        private_top_k(source, k=1, epsilon=1e4, seed=1)


def test_blob_ids_on_a_table_read_as_it_is_now(con: duckdb.DuckDBPyConnection) -> None:
    """BLOB ids (DuckDB hands them over as bytearrays, which do not hash) on a table that is
    not frozen: every method releases the three items whose counts stand 10^6 above the rest
    (at epsilon 10^4 no noise moves them), and duplicate BLOB ids are refused in the project's
    words. Fails with a raw TypeError where the in-store one-shot's rows are compared."""
    con.execute("CREATE TABLE t (id BLOB, score BIGINT)")
    con.execute(
        "INSERT INTO t SELECT ('item ' || i::VARCHAR)::BLOB, "
        "CASE WHEN i < 3 THEN 1000000 + i ELSE i % 50 END FROM range(2000) AS r(i)"
    )
    source = DuckDBTable(con, "t")
    want = [b"item 2", b"item 1", b"item 0"]
    for method in ("oneshot", "threshold", "auto"):
        got = private_top_k(source, k=3, epsilon=1e4, seed=1, method=method)
        assert [bytes(i) for i in got.items] == want, method
    con.execute("INSERT INTO t VALUES ('item 7'::BLOB, 1)")
    with pytest.raises(ValueError, match="duplicate ids"):
        private_top_k(source, k=3, epsilon=1e4, seed=1, method="oneshot")


def test_a_score_column_altered_to_double_loses_no_candidate(
    con: duckdb.DuckDBPyConnection,
) -> None:
    """BIGINT scores, one release, then ALTER ... TYPE DOUBLE and two items tied at 5.5: the cut
    is a double now (ceil(low) = 6 would drop the tied item the top-N did not return, and the
    other would win every time). Each must win half of 200 releases (binomial, p > 0.001)."""
    con.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, score BIGINT)")
    con.execute("INSERT INTO t SELECT range, 0 FROM range(1000)")
    source = DuckDBTable(con, "t")
    private_top_k(source, k=1, epsilon=1.0, seed=0)
    con.execute("ALTER TABLE t ALTER score TYPE DOUBLE")
    con.execute("UPDATE t SET score = 5.5 WHERE id IN (10, 700)")
    wins = Counter(private_top_k(source, k=1, epsilon=1e3, seed=s).items[0] for s in range(200))
    assert set(wins) == {10, 700}
    assert stats.binomtest(wins[10], 200, 0.5).pvalue > 1e-3


def test_a_non_numeric_score_column_is_refused_in_the_project_words(
    con: duckdb.DuckDBPyConnection,
) -> None:
    con.execute("CREATE TABLE t (id BIGINT, score BIGINT)")
    con.execute("INSERT INTO t SELECT range, range FROM range(100)")
    source = DuckDBTable(con, "t")
    con.execute("ALTER TABLE t ALTER score TYPE VARCHAR")
    with pytest.raises(TypeError, match="must be numeric"):
        private_top_k(source, k=1, epsilon=1.0)
    con.execute("ALTER TABLE t DROP COLUMN score")
    with pytest.raises(ValueError, match="has no column 'score'") as refused:
        private_top_k(source, k=1, epsilon=1.0)
    assert "Binder" not in str(refused.value)
    con.execute("DROP TABLE t")
    with pytest.raises(ValueError, match="does not exist"):
        private_top_k(source, k=1, epsilon=1.0)


def test_a_view_is_read_as_it_is_now(con: duckdb.DuckDBPyConnection) -> None:
    """A view has no rowids: every method reads it as it is now (no BinderException), before and
    after a write to the table under it."""
    con.execute("CREATE TABLE b AS SELECT range AS id, range * 2 AS score FROM range(300)")
    con.execute("CREATE VIEW v AS SELECT id, score FROM b WHERE id <> 7")
    source = DuckDBTable(con, "v")
    for method in ("auto", "threshold", "oneshot", "oneshot_full_read"):
        assert private_top_k(source, k=3, epsilon=1e4, method=method, seed=1).items == [
            299,
            298,
            297,
        ]
    con.execute("UPDATE b SET score = 9000 WHERE id IN (5, 7)")
    for method in ("auto", "threshold", "oneshot"):
        result = private_top_k(source, k=3, epsilon=1e4, method=method, seed=1)
        assert result.items == [5, 299, 298], method
    assert private_top_k(source, k=2, epsilon=1.0, oblivious=True, seed=1, deadline=0).items


def test_a_view_one_shot_has_the_exponential_law(con: duckdb.DuckDBPyConnection) -> None:
    """The view's one-shot (positions its row numbers, split at the default level) releases
    item i as top-1 with probability exp(h_i / b) / sum_j exp(h_j / b) (Fact 3.3, k = 1): five
    items lifted over 69,995 zeros, chi-square over 300 seeded releases, p > 0.001."""
    b = 1.0  # k / epsilon
    lifts = b * (np.log(M) + np.array([0.0, 0.5, 1.0, 1.5, 2.0]))
    con.execute("CREATE TABLE b (id BIGINT, score DOUBLE)")
    con.execute(
        "INSERT INTO b SELECT range, CASE WHEN range < 5 THEN ?[range + 1] ELSE 0 END "
        f"FROM range({M})",
        [lifts.tolist()],
    )
    con.execute("CREATE VIEW v AS SELECT * FROM b")
    source = DuckDBTable(con, "v")
    weights = np.concatenate([np.exp(lifts / b), [M - 5.0]])
    counts = np.zeros(6)
    runs = 300
    for seed in range(runs):
        result = private_top_k(source, k=1, epsilon=1.0, method="oneshot", seed=seed)
        assert result.plan["in_store_reads"] == "the view" and result.privacy.scale == b
        item = int(result.items[0])
        counts[min(item, 5)] += 1
    assert stats.chisquare(counts, weights / weights.sum() * runs).pvalue > 1e-3


def test_a_frozen_copy_with_a_pending_delta_reads_the_table_for_its_one_shot(
    con: duckdb.DuckDBPyConnection,
) -> None:
    """frozen=True after refresh(): the in-store one-shot reads the table (rowid slots, the
    exact keyed release) where it holds the copy's m rows; once the table no longer does (a
    write the caller promised not to make), the copy and its delta."""
    make, kind = FAMILIES["spread"]
    fill(con, "t", np.asarray(make(np.random.default_rng(2))), kind)
    source = DuckDBTable(con, "t", frozen=True)
    source.prepare()
    con.execute("UPDATE t SET score = score + 7 WHERE id % 50 = 3")
    assert source.refresh().kind == "delta"
    with source.snapshot():
        assert source.oneshot_positions() > source.domain_size()  # the table's slots
    result = private_top_k(source, k=10, epsilon=1.0, method="oneshot", seed=6)
    assert result.plan["in_store_reads"] == "the table"
    live = DuckDBTable(con, "t")
    assert result.items == exact(con, live, "t", 6)
    con.execute("DELETE FROM t WHERE id = (SELECT min(id) FROM t)")  # the promise broken
    with source.snapshot():
        assert source.oneshot_positions() == source.domain_size()  # the copy's positions
    result = private_top_k(source, k=10, epsilon=1.0, method="oneshot", seed=6)
    assert result.plan["in_store_reads"] == "the copy and its delta"


# ----- oblivious reads by rowid slot ----------------------------------------------------------
class Recorder:
    """A DuckDB connection whose cursors record each statement's text and the sizes of its
    parameters (what a server observer sees), passing everything to the real connection."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con, self.log = con, []

    def cursor(self) -> Any:
        recorder = self

        class Cursor:
            def __init__(self, inner: duckdb.DuckDBPyConnection) -> None:
                self.inner = inner

            def execute(self, query: str, params: Any = None) -> Any:
                values = params.values() if isinstance(params, dict) else params or []
                sizes = tuple(len(v) if isinstance(v, list) else v for v in values)
                recorder.log.append((query, sizes))
                return self.inner.execute(query, params)

            def __getattr__(self, name: str) -> Any:
                return getattr(self.inner, name)

        return Cursor(self.con.cursor())

    def execute(self, *args: Any) -> Any:
        return self.con.execute(*args)


def slotted(con: duckdb.DuckDBPyConnection, scores: np.ndarray) -> DuckDBTable:
    """The scores in a table of 1.2 x len(scores) rows of which every sixth was deleted (its
    rowid slot empty): item i has id 6 (i // 5) + i % 5."""
    slots = len(scores) * 6 // 5
    con.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, score DOUBLE)")
    full = np.zeros(slots)
    full[np.arange(slots) % 6 != 5] = scores
    con.execute(f"INSERT INTO t SELECT range, ?[range + 1] FROM range({slots})", [full.tolist()])
    con.execute("DELETE FROM t WHERE id % 6 = 5")
    return DuckDBTable(con, "t")


def test_oblivious_reads_of_a_live_table_depend_on_public_facts_only() -> None:
    """Neighbouring tables (the head at 26 or 27 over a tied plateau) and a zipf table, all
    5,000 items in 6,000 slots: the same statements, parameter sizes, rows (2d, d the depth for
    6,000 slots) and round trips (m and the two batches), seed after seed."""
    low = np.full(5000, 2.0)
    low[:20], low[0] = 20.0, 26.0
    high = low.copy()
    high[0] = 27.0
    zipf = np.floor(1000.0 / (1 + np.random.default_rng(4).permutation(5000)))
    d = oblivious_depth(6000, 3, 1e-9)
    transcripts = set()
    for scores in (low, high, zipf):
        con = duckdb.connect()
        try:
            source = slotted(con, scores)
            recorder = Recorder(con)
            source.driver.conn = recorder  # the statements of every run go through it
            for seed in (1, 2, 3):
                recorder.log.clear()
                result = private_top_k(source, 3, 1.0, oblivious=True, seed=seed, deadline=0)
                assert not result.plan["miss"] and not result.plan["full_read"]
                assert result.plan["depth"] == d
                stats_seen = (result.accesses.rows_fetched, result.accesses.round_trips)
                assert stats_seen == (2 * d, 3)
                transcripts.add((tuple(recorder.log), stats_seen))
        finally:
            con.close()
    assert len(transcripts) == 1
    ((log, _),) = transcripts
    assert any(sizes == (d,) for _, sizes in log)  # the random batch: d slots, one parameter


def test_oblivious_release_on_a_live_table_is_plackett_luce() -> None:
    """Ranked top-2 over 2,500 items in 3,000 slots (empty slots never win), chi-square against
    the exact Plackett-Luce law with weights exp(h / b), 800 fixed-seed runs; misses are
    frequent at delta_pad = 0.2 (the whole table read by slot) and keep the law."""
    lifted = {0: 9.0, 1234: 8.0, 2000: 7.0, 2499: 6.0}  # item: score
    scores = np.zeros(2500)
    scores[list(lifted)] = list(lifted.values())
    con = duckdb.connect()
    source = slotted(con, scores)
    assert 2 * oblivious_depth(3000, 2, 0.2) < 3000  # the fixed-depth path
    rng = np.random.default_rng(11)
    runs = 800
    got: Counter[tuple[int, ...]] = Counter()
    misses = 0
    for _ in range(runs):
        result = private_top_k(source, 2, 1.0, oblivious=True, delta_pad=0.2, seed=rng, deadline=0)
        got[tuple(result.items)] += 1
        misses += result.plan["miss"]
    con.close()
    ids = [6 * (i // 5) + i % 5 for i in lifted]
    weights = np.exp(np.array(list(lifted.values())) / result.privacy.scale)
    others = np.full(len(scores) - len(lifted), 1.0)  # exp(0 / b)
    everyone = np.concatenate([weights, others])
    cells = [(a, b) for a in range(4) for b in range(4) if a != b]
    expected = [runs * plackett_luce(everyone, cell) for cell in cells]
    observed = [got[(ids[a], ids[b])] for a, b in cells]
    expected.append(runs - sum(expected))
    observed.append(runs - sum(observed))
    assert misses > 0 and expected[-1] > 5
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_a_table_with_fewer_live_rows_than_the_depth_reads_them_all() -> None:
    """20 live rows left of 4,000 slots, k = 10: the depth for 4,000 slots (d) exceeds half the
    live rows, so every release reads the 20 rows (a full read, a fixed count) and never
    misses; comparing 2d with the slots instead read d rows and d slots and missed in about 22%
    of releases (P(Hypergeometric(4000, 20, d) < 10)), against delta_pad = 1e-9."""
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE t AS SELECT range AS id, (range % 97)::DOUBLE AS score FROM range(4000)"
    )
    con.execute("DELETE FROM t WHERE id % 200 <> 0")
    source = DuckDBTable(con, "t")
    d = oblivious_depth(4000, 10, 1e-9)
    assert source.domain_size() == 20 and 2 * d >= 20
    assert stats.hypergeom(4000, 20, d).cdf(9) > 0.2  # what the miss was
    for seed in range(40):
        result = private_top_k(source, 10, 1.0, oblivious=True, seed=seed, deadline=0)
        assert result.plan["depth"] == d  # chosen for the 4,000 slots
        assert result.plan["full_read"] and not result.plan["miss"]
        assert result.accesses.rows_fetched == 20
    con.close()


def test_miss_rate_on_slots_is_the_hypergeometric_law() -> None:
    """2,500 items in 3,000 slots, k = 2, delta_pad = 0.2: the misses of 600 seeded releases
    against P(Hypergeometric(3000, d, d) < 2), the law the depth was chosen for (binomial test;
    a miss law for fewer sorted rows than d would be far off)."""
    con = duckdb.connect()
    source = slotted(con, np.arange(2500, dtype=float))
    d = oblivious_depth(3000, 2, 0.2)
    p = stats.hypergeom(3000, d, d).cdf(1)
    assert 0.05 < p <= 0.2 and 2 * d < 2500
    rng = np.random.default_rng(5)
    misses = sum(
        private_top_k(source, 2, 1.0, oblivious=True, delta_pad=0.2, seed=rng, deadline=0).plan[
            "miss"
        ]
        for _ in range(600)
    )
    con.close()
    assert stats.binomtest(misses, 600, p).pvalue > 1e-3


def test_auto_on_a_frozen_copy_with_a_pending_delta_prices_both_and_says_which(
    con: duckdb.DuckDBPyConnection,
) -> None:
    """frozen=True after refresh(): `auto` reads the planner's probe from the copy and its delta
    and prices the threshold run there against the in-store one-shot on the table (finite
    costs, both recorded); it takes the cheaper, and the release is the one of the method it
    names (pinned, same seed)."""
    make, kind = FAMILIES["zipf"]
    fill(con, "t", np.asarray(make(np.random.default_rng(2))), kind)
    source = DuckDBTable(con, "t", frozen=True)
    source.prepare()
    con.execute("UPDATE t SET score = score + 1 WHERE id % 50 = 3")
    assert source.refresh().kind == "delta"
    result = private_top_k(source, k=10, epsilon=1.0, seed=8)
    plan = result.plan["auto"]
    assert plan["probe_rows"] > 0 and math.isfinite(plan["threshold_seconds"])
    assert math.isfinite(plan["oneshot_seconds"]) and plan["oneshot_kind"] == "oneshot_in_store"
    cheaper = "threshold" if plan["threshold_seconds"] <= plan["oneshot_seconds"] else "oneshot"
    assert plan["chosen"] == ("threshold" if cheaper == "threshold" else "oneshot_in_store")
    pinned = private_top_k(source, k=10, epsilon=1.0, seed=8, method=cheaper)
    assert pinned.items == result.items


def test_an_oblivious_full_read_of_a_live_table_draws_a_noise_per_slot() -> None:
    """method="oneshot_full_read" in oblivious mode reads the whole table by slot (positions up
    to the slot count, past m where rows were deleted): every row gets its slot's noise, and
    the release is the top-k (epsilon 10^4: no rank swaps)."""
    scores = np.zeros(2500)
    scores[[0, 2400, 2499]] = [90.0, 80.0, 70.0]  # ids 0, 2880, 2998: slots past m = 2,500
    con = duckdb.connect()
    source = slotted(con, scores)
    result = private_top_k(
        source, 3, 1e4, oblivious=True, method="oneshot_full_read", seed=1, deadline=0
    )
    con.close()
    assert result.items == [0, 2880, 2998]
    assert result.accesses.rows_fetched == 2500 and result.plan["full_read"]
