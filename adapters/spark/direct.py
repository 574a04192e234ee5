"""Reading a SparkTable's source itself, for a run whose copy is not current (DESIGN invariant 14).

When the source changed since the copy's version (its fingerprint differs, or, for a source
Spark lists no files for, one pass finds other contents), a run must not read the copy. It has
two ways to the release, priced before any noise (`price`) and recorded in
`result.diagnostics.plan["freshness"]`:

* *refresh*: prepare() a new version (validation, one distributed sort, the writes), then a
  threshold run on it: a full sort now, cheap releases until the next write;
* *the table*: the one-shot mechanism (Wu, Ohrimenko, Wirth 2023, Algorithm 2) run by Spark on
  the source as it is now, with keyed noise (keyed_noise.py): one pass for the checks of
  `validate()` and the top rows (kept for the source's fingerprint), one query hashing the rows
  that can win.

For one release the table is always cheaper (a pass or two against a sort and writes of every
row), but every release on a stale copy pays it again, so the choice follows the ski-rental
rule: read the table while the seconds spent so on this version of the copy (measured: the
rent) and this release's (modelled) stay below one refresh and the threshold run after it
(this object's last prepare(), measured and scaled to m, else modelled); then refresh. Over
the releases between two writes that costs at most about twice what the better of "always
read the table" and "refresh at once" would have (Karlin, Manasse, Rudolph, Sleator 1988: the
deterministic ski-rental bound).

Positions. Keyed noise needs a label per item that the key hashes and that no two items share;
the split (keyed_noise.py: exceedances drawn by the client) needs more, a dense numbering
0..N-1 of the items known before the query, so that the client can draw which positions
exceed the level. The copy's ranks are one; the source has none that Spark keeps stable
without a pass (`monotonically_increasing_id` depends on the scan's partitioning and is not
dense; `_metadata.row_index` is dense per Parquet file, but the files' row counts take a pass
and a DataFrame that is not a file scan has no row index). The item's id is a label: unique
(checked), fixed, public. So the noise is keyed by id, U = SHA-256(key ":" id) (the position's
decimal text where the copy hashes ranks; text ids as their UTF-8 bytes), without a split: every
noise lies below the grid's ceiling, b (53 ln 2 + 1). Any k rows bound the answer from below
(T, the k-th largest of their noisy scores, computed here), so Spark hashes only the rows with
score >= T - ceiling; each item's noise is still an independent draw of the law (under the PRF
assumption of keyed_noise.py), so the release is the one-shot's. Ties of score + noise (which
the 2^-52 grid makes improbable) go to the smaller id.

A run on the table serves m, the top rows (the canonical prefix: each with its rank as its
position, which the copy would give it), the scores of the rows it read, and the in-store
one-shot; a read that only the copy serves (a threshold run's reads by rank, a full read)
refreshes the copy first, to the state the run started from (its fingerprint checked), and the
run goes on there.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from topk_middleware.access import AccessError, CopyRefresh, Rows, ScoreBins, StoreCosts
from topk_middleware.keyed_noise import (
    UNIFORM_BITS,
    UNIFORM_HEX,
    KeyedNoise,
    capped_sql,
    uniform_from_hex_sql,
)

from .._sql import TableFacts, raise_if_invalid
from .layout import (
    HASH_ROW,
    JOB_SECONDS,
    PREPARE_JOBS,
    PREPARE_ROW,
    SCAN_ROW,
    STORE_COSTS,
    functions_for,
)


@dataclass
class Facts:
    """One pass over the source: m, a hash of its contents, and its top rows (ids, scores) in
    canonical order, of which the first `canonical` are the canonical prefix."""

    m: int
    content: int
    ids: np.ndarray
    scores: np.ndarray
    canonical: int


@dataclass
class Direct:
    """A run reading the source itself: the source's DataFrame (its file listing), the
    fingerprint at the run's start, its facts, the modelled price of reading the table and of
    the refresh a read only the copy serves would make, and the scores of rows read."""

    frame: Any
    fingerprint: str
    facts: Facts
    table_seconds: float
    refresh_seconds: float = 0.0  # a refresh of the copy (the ski rental's price, less the run)
    known: dict[Any, float] = field(default_factory=dict)


def price(m: int, facts_known: bool) -> tuple[float, float]:
    """Modelled seconds of a release, before any noise: (reading the table: the pass of the
    checks unless it is known for this state of the source, and the pass of the hashing query;
    refreshing: prepare() and a threshold run of a few queries). The rows hashed depend on
    the release's k and noise scale, which the snapshot does not know: the rent counts them
    as measured (SparkTable.snapshot)."""
    scan = JOB_SECONDS + m * SCAN_ROW
    table = (0.0 if facts_known else scan) + scan
    return table, prepare_seconds(m) + 3 * STORE_COSTS.round_trip


def prepare_seconds(m: int) -> float:
    """Modelled seconds of prepare() on m rows (SparkTable prices a refresh with its own last
    prepare(), measured and scaled to m, where it made one)."""
    return PREPARE_JOBS * JOB_SECONDS + m * PREPARE_ROW


def direct_costs(m: int, refresh_seconds: float) -> StoreCosts:
    """The planner's costs on the table read directly: the in-store one-shot is a pass
    (`oneshot_fixed`), so `auto` takes it without reading ahead (planner.py); a read by rank,
    a sorted read past the rows the run has read and a full read refresh the copy first
    (`copy_refresh`: `refresh_seconds`, then the copy's STORE_COSTS), so that a threshold run
    that would make one is priced with the refresh it triggers."""
    return StoreCosts(
        round_trip=JOB_SECONDS,
        sorted_row=SCAN_ROW,
        random_batch=JOB_SECONDS + m * SCAN_ROW,
        random_row=1e-6,
        oneshot_row=HASH_ROW,
        full_read_row=1e-6,
        oneshot_fixed=JOB_SECONDS + m * SCAN_ROW,
        copy_refresh=CopyRefresh(refresh_seconds, STORE_COSTS),
    )


def source_facts(
    spark: Any,
    rows: Any,
    where: str,
    id_column: str,
    score_column: str,
    *,
    distinct: bool,
    top: int,
) -> Facts:
    """The checks of `validate()` over `rows` (id, score), m and the content's hash, and the
    `top` rows of largest score, in one Spark job; ids are counted where `distinct`, else the
    top rows are checked for duplicates. Raises ValueError naming the table and column."""
    F = functions_for(spark)
    s = F.col("score")
    bad = F.isnan(s) | (F.abs(s) == float("inf"))
    aggregates = [
        F.count(F.lit(1)),
        F.count("id"),
        F.count("score"),
        F.sum(F.when(bad, 1).otherwise(0)),
        F.sum(F.when(s < 0, 1).otherwise(0)),
        F.expr("bit_xor(xxhash64(id, score))"),
    ]
    if top:
        aggregates.append(F.max_by(F.struct("score", "id"), "score", top))
    elif distinct:  # beside max_by, count(DISTINCT) costs 50x more (measured): a job apart
        aggregates.append(F.count_distinct("id"))
    got = rows.agg(*aggregates).collect()[0]
    count, ids_, scores_, bad_, negative = (int(x or 0) for x in got[:5])
    distinct_ids = ids_  # unless counted: the top rows are checked below
    if distinct:
        distinct_ids = int(got[6] if not top else rows.agg(F.count_distinct("id")).collect()[0][0])
    facts = TableFacts(count, count - ids_, distinct_ids, count - scores_, bad_, negative)
    duplicate = None
    if facts.null_ids == 0 and facts.distinct_ids != facts.rows:
        found = rows.groupBy("id").count().where("count > 1").limit(1).collect()
        duplicate = found[0][0] if found else None
    raise_if_invalid(facts, where, id_column, score_column, duplicate)
    pairs = sorted((-float(r[0]), r[1]) for r in (got[6] if top else []))
    ids = [p[1] for p in pairs]
    if len(set(ids)) != len(ids):
        seen: set[Any] = set()
        example = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
        raise_if_invalid(
            TableFacts(len(ids), 0, len(set(ids)), 0, 0, 0), where, id_column, score_column, example
        )
    scores = np.asarray([-p[0] for p in pairs], dtype=np.float64)
    canonical = len(pairs)
    if len(pairs) < count:  # rows beyond these may tie the lowest score kept
        canonical = int(np.count_nonzero(scores > scores[-1])) if len(pairs) else 0
    return Facts(count, int(got[5] or 0), id_array(ids), scores, canonical)


def id_array(ids: list[Any]) -> np.ndarray:
    if ids and all(isinstance(v, int) for v in ids):
        return np.asarray(ids, dtype=np.int64)
    out = np.empty(len(ids), dtype=object)
    out[:] = ids
    return out


def read_top(table: Any, direct: Direct, count: int) -> None:
    """The first `count` rows of the canonical order, from one top-N query over the source,
    made the run's top rows (all canonical)."""
    F = functions_for(table.spark)
    rows = table._columns(direct.frame)
    got = table._query(
        lambda: rows.orderBy(F.col("score").desc(), F.col("id").asc()).limit(count).toArrow(),
        direct=True,
    )
    ids = id_array(got.column("id").to_pylist())
    scores = np.asarray(got.column("score").to_pylist(), dtype=np.float64)
    if len(set(ids.tolist())) != len(ids):
        raise AccessError(f"{table.where} has duplicate ids among its top rows")
    direct.facts.ids, direct.facts.scores, direct.facts.canonical = ids, scores, len(ids)


def direct_histogram(table: Any, direct: Direct, bins: ScoreBins) -> tuple[np.ndarray, np.ndarray]:
    """access.ScoreHistogramRead on the table itself: the scores at or below `bins.top`, binned
    by one aggregate query over the source (each bin's largest score and size)."""
    F = functions_for(table.spark)
    rows = table._columns(direct.frame)
    got = table._query(
        lambda: (
            rows.where(F.col("score") <= F.lit(float(bins.top)))
            .groupBy(F.expr(bins.sql("score")).alias("bin"))
            .agg(F.max("score").alias("top"), F.count(F.lit(1)).alias("n"))
            .toArrow()
        ),
        direct=True,
    )
    tops = np.asarray(got.column("top").to_pylist(), dtype=np.float64)
    return tops, np.asarray(got.column("n").to_pylist(), dtype=np.int64)


def id_noises(noise: KeyedNoise, ids: np.ndarray) -> np.ndarray:
    """The keyed noise of items labelled by id (module docstring), computed here."""
    out = np.empty(len(ids), dtype=np.float64)
    for i, v in enumerate(ids.tolist()):
        digest = hashlib.sha256(f"{noise.key}:{v}".encode()).hexdigest()
        out[i] = noise.noise_of_uniform((int(digest[:UNIFORM_HEX], 16) + 0.5) / 2.0**UNIFORM_BITS)
    return out


def direct_oneshot(table: Any, direct: Direct, noise: KeyedNoise, k: int) -> Rows:
    """InStoreOneShot on the source (module docstring): T from the top rows' noisy scores,
    then one query keeping the k best of score + noise among the rows with score >= T - bound."""
    if len(noise.exceed_positions):
        raise AccessError("the in-store one-shot on the table itself takes no split")
    facts = direct.facts
    if len(facts.ids) < k:
        read_top(table, direct, k)
    values = noise.capped(facts.scores) + id_noises(noise, facts.ids)  # min(score, B) + noise
    cut = float(np.sort(values)[-k])
    low = cut - noise.bound - 1e-12 * abs(cut)
    digits = (
        "CAST(conv(substr(sha2(concat(:key, ':', CAST(id AS STRING)), 256), 1, 13), 16, 10) "
        "AS DOUBLE)"
    )
    value = f"{capped_sql('score', noise.score_cap)} + {noise.sql(uniform_from_hex_sql(digits))}"
    query = (
        f"SELECT id, score, {value} AS v FROM {{rows}} WHERE score >= :low "
        f"ORDER BY v DESC, id ASC LIMIT {int(k)}"
    )
    rows = table._columns(direct.frame)
    got = table._query(
        lambda: table.spark.sql(query, args={"key": noise.key, "low": low}, rows=rows).toArrow(),
        direct=True,
    )
    ids = id_array(got.column("id").to_pylist())
    scores = np.asarray(got.column("score").to_pylist(), dtype=np.float64)
    if len(set(ids.tolist())) != len(ids):
        raise AccessError(f"{table.where} has duplicate ids among the rows read")
    if len(ids) != k:
        raise AccessError(f"{table.where}: the in-store one-shot found {len(ids)} rows")
    direct.known.update(zip(ids.tolist(), scores.tolist(), strict=True))
    return Rows(np.arange(len(ids), dtype=np.int64), ids, scores)
