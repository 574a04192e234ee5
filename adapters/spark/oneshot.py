"""The in-store one-shot on a SparkTable (keyed_noise.py; Wu, Ohrimenko, Wirth 2023, Algorithm 2
run inside Spark): `SparkTable.read_oneshot`."""

from __future__ import annotations

from typing import Any

import numpy as np

from topk_middleware.access import AccessError, Rows
from topk_middleware.keyed_noise import KeyedNoise, capped_sql, uniform_from_hex_sql

from .layout import Run, arrow_rows, bucket_of, buckets_between, listed


def read_oneshot(table: Any, run: Run, noise: KeyedNoise, k: int) -> Rows:
    """InStoreOneShot: the k rows of largest score + keyed noise (keyed_noise.py), best
    first, ties by smaller rank, hashing in Spark only the rows that can win.

    The cut of keyed_noise.py, computed here: the scores of the k top ranks and of the
    exceedances come from the runs in hand (else one read by rank), their noises from the
    key, so T (the k-th largest of their noisy scores) is known before the query, and a
    row outside the exceedances can reach T only if its score >= T - bound: in the
    rank-ordered copy, a prefix of ranks [0, R). One query then hashes that prefix in Spark
    (`sha2` of "key:rank"; the exceedances left out) and keeps its k best, and fetches the
    exceedances whose noisy score reaches T; the k best of both are the answer. The key and
    the cut are parameters of the query (Spark binds them into its plan, which the Spark UI
    shows); the exceedances' ranks are in its text, as bucket and rank filters for pruning."""
    m = run.version.m
    k = min(int(k), m)
    exceed = np.asarray(noise.exceed_positions, dtype=np.int64)
    known = np.union1d(np.arange(k, dtype=np.int64), exceed)
    trips = 0
    first, run_scores = run.version.runs_first, run.version.runs_score
    if first is not None and run_scores is not None:
        scores = run_scores[np.searchsorted(first, known, side="right") - 1]
    else:
        scores = table.read_positions(known).scores
        trips += 1
    values = noise.capped(scores) + noise.noises(known)
    cut = float(np.sort(values)[-k])
    low = cut - noise.bound - 1e-12 * abs(cut)
    is_exceedance = np.isin(known, exceed)
    candidates = known[is_exceedance & (values >= cut)]
    exceedance_value = dict(
        zip(known[is_exceedance].tolist(), values[is_exceedance].tolist(), strict=True)
    )
    if first is not None and run_scores is not None:
        runs_above = int(np.count_nonzero(run_scores >= low))
        prefix = int(first[runs_above]) if runs_above < len(first) else m
        where = f"bucket IN ({listed(buckets_between(0, max(prefix, 1)))}) AND rank < {prefix}"
        left_out = exceed[exceed < prefix]
    else:
        where, left_out = "TRUE", exceed
    where += " AND score >= :low"
    if len(left_out):
        where += f" AND NOT rank IN ({listed(left_out.tolist())})"
    digits = (
        "CAST(conv(substr(sha2(concat(:key, ':', CAST(rank AS STRING)), 256), 1, 13), 16, 10) "
        "AS DOUBLE)"
    )
    value = f"{capped_sql('score', noise.score_cap)} + {noise.sql(uniform_from_hex_sql(digits))}"
    query = (
        f"(SELECT rank, id, score, {value} AS v FROM {{rel}} WHERE {where} "
        f"ORDER BY v DESC, rank ASC LIMIT {k})"
    )
    if len(candidates):
        buckets = listed(sorted({bucket_of(int(p)) for p in candidates}))
        query += (
            " UNION ALL (SELECT rank, id, score, CAST(NULL AS DOUBLE) AS v FROM {rel} "
            f"WHERE bucket IN ({buckets}) AND rank IN ({listed(candidates.tolist())}))"
        )
    args = {"key": noise.key, "low": low}  # parameters: not in the statement's text
    got = table._query(lambda: table.spark.sql(query, args=args, rel=run.data).toArrow())
    rows = arrow_rows(got, "rank", in_rank_order=False)
    v = got.column("v").to_pylist()
    ranks = rows.positions.tolist()
    best = [exceedance_value[r] if x is None else x for r, x in zip(ranks, v, strict=True)]
    order = sorted(range(len(ranks)), key=lambda i: (-best[i], ranks[i]))[:k]
    got_rows = Rows(rows.positions[order], rows.ids[order], rows.scores[order], trips + 1)
    if len(got_rows) != k:
        raise AccessError(f"{table.where}: the in-store one-shot found {len(got_rows)} rows")
    return got_rows
