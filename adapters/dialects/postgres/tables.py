"""PostgreSQL's SQL for runs that read the table itself (adapters/sql/table_read.py).

Slots: a row's position is block * P + offset - 1 from its ctid, P = MaxHeapTuplesPerPage
((block size - page header) / (aligned tuple header + line pointer): 291 for 8 kB pages), plus
the first slot of its relation where the table has partitions or inheritance children. Within
the run's snapshot every visible row keeps its ctid (a version the snapshot sees is not
pruned, and the table's ACCESS SHARE lock, taken by the run's first query, keeps VACUUM FULL,
CLUSTER and TRUNCATE out); the relations' sizes are read after the lock, in the same statement.

The first query (`open_table`): a catalog query (NOT NULL, unique keys, a B-tree leading with
the score, pg_stats), an EXPLAIN where CHECK constraints may vouch for the scores' range
(constraint_exclusion on: no scan left means PostgreSQL's own prover refutes every bad score),
then one aggregate pass. Without a unique key, ids are counted distinct on tables of at most
DISTINCT_CHECK_MAX rows (estimated), and only the rows a release reads are checked above.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

import numpy as np

from adapters._sql import TableFacts, int_array_literal, raise_if_invalid, tid_array_literal
from adapters.sql.table_read import TableState
from topk_middleware.keyed_noise import KeyedNoise, capped_sql

# Ids are counted distinct on tables of at most this many rows without a unique key (a hash
# aggregate: about 40 ms at 10^5 rows, 0.2-0.4 s at 10^6); above, the rows read are checked.
DISTINCT_CHECK_MAX = 100_000
INTEGER_TYPES = ("smallint", "integer", "bigint")


def packed_whole(driver: Any, t: Any) -> dict[str, Any] | None:
    """Every (id, score) of table `t` in one row: each row's id and score as 16 bytes
    (int8send, then int8send or float8send), concatenated by one aggregate so both columns keep
    the same row order, unpacked by numpy; beside them the rows no pack holds as read (a NULL,
    an id or integer score that is not a whole int8, from a column altered since). None where
    there are any, or the columns are not integer ids and integer or float scores (numeric:
    not exactly a double). Cost: one scan and 16 bytes a row on the wire, no Python object a
    row (a row read as tuples costs about 1 us of Python; this about 10 ns)."""
    score_type = t.score_info.type
    if not t.integer_ids or score_type not in (*INTEGER_TYPES, "real", "double precision"):
        return None
    i, s = t.id_sql, t.score_sql
    if t.integer_scores:
        send, odd = f"int8send({s}::int8)", f" OR {s}::int8 <> {s}"
    else:
        send, odd = f"float8send({s}::float8)", ""
    row = driver.one(
        f"SELECT count(*) FILTER (WHERE {i} IS NULL OR {s} IS NULL OR {i}::int8 <> {i}{odd}), "
        f"string_agg(int8send({i}::int8) || {send}, ''::bytea) FROM {t.source}"
    )
    if row is None or row[0]:
        return None
    kind = ">i8" if t.integer_scores else ">f8"
    packed = np.frombuffer(bytes(row[1] or b""), dtype=[("id", ">i8"), ("score", kind)])
    return {
        "id": packed["id"].astype(np.int64),
        "score": packed["score"].astype(np.int64 if t.integer_scores else np.float64),
    }


def slots_per_page(block_size: int) -> int:
    """MaxHeapTuplesPerPage: (block size - page header) / (aligned tuple header + line pointer)."""
    return (block_size - 24) // (24 + 4)


def _parse_array(text: Any) -> list[float]:
    """An array of numbers as pg_stats prints it ('{1,2.5}'), as floats (NaN and infinities
    dropped: a cut is only guessed from finite values)."""
    if not text:
        return []
    out = []
    for part in str(text).strip("{}").split(","):
        try:
            value = float(part.strip('"'))
        except ValueError:
            continue
        if math.isfinite(value):
            out.append(value)
    return out


def _stats(row: Any) -> tuple[list[float], list[float], list[float], float] | None:
    """The planner's statistics of the score column (pg_stats: most common values, their
    frequencies, histogram bounds, null fraction), if it has them."""
    values, freqs = _parse_array(row[0]), _parse_array(row[1])
    if len(values) != len(freqs):
        values, freqs = [], []
    bounds = sorted(_parse_array(row[2]))
    if not values and len(bounds) < 2:
        return None
    return values, freqs, bounds, float(row[3] or 0.0)


def open_table(t: Any) -> TableState | None:
    """m and the state of a run that reads the table (module docstring); None where the table
    is no table (a view, a foreign or materialized table: no ctid to name positions by)."""
    driver = t.driver
    facts = driver.one(
        "SELECT c.oid, c.relkind, c.reltuples, format_type(sa.atttypid, sa.atttypmod), "
        "ia.attnotnull, sa.attnotnull, EXISTS (SELECT 1 FROM pg_index x "
        "WHERE x.indrelid = c.oid AND x.indisunique AND x.indisvalid AND x.indnkeyatts = 1 "
        "AND x.indexprs IS NULL AND x.indpred IS NULL AND x.indkey[0] = ia.attnum), "
        "EXISTS (SELECT 1 FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
        "JOIN pg_am am ON am.oid = i.relam WHERE x.indrelid = c.oid AND x.indisvalid "
        "AND am.amname = 'btree' AND x.indexprs IS NULL AND x.indpred IS NULL "
        "AND x.indkey[0] = sa.attnum), current_setting('block_size')::int, "
        "st.most_common_vals::text, st.most_common_freqs::text, "
        "st.histogram_bounds::text, st.null_frac "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_attribute ia ON ia.attrelid = c.oid AND ia.attname = :id "
        "AND NOT ia.attisdropped JOIN pg_attribute sa ON sa.attrelid = c.oid "
        "AND sa.attname = :score AND NOT sa.attisdropped "
        "LEFT JOIN LATERAL (SELECT * FROM pg_stats s WHERE s.schemaname = n.nspname "
        "AND s.tablename = c.relname AND s.attname = :score "
        "ORDER BY s.inherited DESC LIMIT 1) st ON true WHERE c.oid = to_regclass(:base)",
        {"id": t.id_column, "score": t.score_column, "base": t.source},
    )
    if facts is None:
        raise ValueError(
            f"{t.where} does not exist, or has no column {t.id_column!r} or "
            f"{t.score_column!r} (any more)"
        )
    oid, kind, estimate, score_type, ids_present, scores_present = facts[:6]
    unique, score_index, block_size = facts[6:9]
    if kind not in ("r", "p"):
        return None
    in_range = constraints_vouch(t, score_type)
    s, i = t.score_sql, t.id_sql
    count_distinct = not unique and float(estimate) <= DISTINCT_CHECK_MAX
    per_page = slots_per_page(int(block_size))
    columns = [
        "count(*)",
        f"max({s})",
        f"count({i})" if not ids_present else "NULL",
        f"count({s})" if not scores_present else "NULL",
        f"min({s})" if not in_range else "NULL",
        f"count(DISTINCT {i})" if count_distinct else "NULL",
        f"(WITH RECURSIVE tree(rel) AS (SELECT {int(oid)}::oid UNION ALL SELECT i.inhrelid "
        "FROM pg_inherits i JOIN tree t ON i.inhparent = t.rel) "
        "SELECT json_agg(json_build_array(c.oid, quote_ident(n.nspname) || '.' || "
        f"quote_ident(c.relname), pg_relation_size(c.oid) / {int(block_size)}) ORDER BY c.oid) "
        "FROM tree t JOIN pg_class c ON c.oid = t.rel "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'r')",
    ]
    m, high, ids, scores, low, distinct, layout = driver.one(
        f"SELECT {', '.join(columns)} FROM {t.source}"
    )
    ids = m if ids is None else ids
    scores = m if scores is None else scores
    _check_aggregates(t, int(m), high, (ids, scores, low))
    if count_distinct and int(distinct) != int(m):
        duplicate = driver.scalar(
            f"SELECT {i} FROM {t.source} GROUP BY {i} HAVING count(*) > 1 LIMIT 1"
        )
        facts_ = TableFacts(int(m), 0, int(distinct), 0, 0, 0)
        raise_if_invalid(facts_, t.where, t.id_column, t.score_column, duplicate)
    if isinstance(layout, str):
        layout = json.loads(layout)
    leaves, first = [], 0
    for rel, name, blocks in layout or []:
        leaves.append((int(rel), str(name), first))
        first += int(blocks) * per_page
    return TableState(
        leaves,
        per_page,
        max(first, 1),
        float(high),
        score_type,
        bool(unique) or count_distinct,
        bool(score_index),
        int(m),
        None if score_index else _stats(facts[9:13]),
    )


def constraints_vouch(t: Any, score_type: str) -> bool:
    """Whether the table's validated CHECK constraints refute every score out of range
    (negative, NaN, infinite, beyond float8): EXPLAIN of a query for them with
    constraint_exclusion on (for this run's transaction) leaves no scan."""
    s = t.score_sql
    bad = [f"{s} < 0"]
    if score_type not in INTEGER_TYPES:
        bad += [f"{s} = '{value}'::float8" for value in ("NaN", "Infinity", "-Infinity")]
    if score_type.startswith("numeric"):
        bad.append(f"abs({s}) > 1.7976931348623157e308::numeric")
    t.driver.execute("SELECT set_config('constraint_exclusion', 'on', true)")
    plan = t.driver.scalar(
        f"EXPLAIN (FORMAT JSON) SELECT 1 FROM {t.source} WHERE {' OR '.join(bad)}"
    )
    plan = plan if isinstance(plan, list) else json.loads(plan)
    return not any(True for _ in _scans(plan))


def _check_aggregates(t: Any, m: int, high: Any, checks: tuple[Any, ...]) -> None:
    """validate()'s refusals from the aggregate pass (exact counts in a second query for the
    message, only when something is wrong)."""
    if m == 0:
        raise ValueError(f"{t.where} is empty: there is no item to select")
    if isinstance(high, Decimal) and high.is_finite() and abs(high) > Decimal("1.7e308"):
        raise ValueError(
            f"{t.where} column {t.score_column!r} has score(s) beyond the float8 "
            "range (about 1.8e308): scores are compared as float8"
        )
    ids, scores, low = checks
    top = float(high) if high is not None else 0.0
    if int(ids) == m and int(scores) == m and (low is None or float(low) >= 0):
        if math.isfinite(top):
            return
    s = t.score_sql
    non_finite, negative = t.driver.one(
        f"SELECT count(*) FILTER (WHERE {s}::float8 IN ('NaN', 'Infinity', '-Infinity')), "
        f"count(*) FILTER (WHERE {s} < 0) FROM {t.source}"
    )
    facts = TableFacts(m, m - int(ids), m, m - int(scores), int(non_finite), int(negative))
    raise_if_invalid(facts, t.where, t.id_column, t.score_column)


def position_sql(state: TableState, alias: str = "") -> str:
    """SQL of a row's slot (module docstring) from its ctid (and tableoid)."""
    a = f"{alias}." if alias else ""
    point = f"({a}ctid::text::point)"
    local = f"(({point}[0])::bigint * {state.per_page} + ({point}[1])::bigint - 1)"
    if not state.partitioned:
        return local
    cases = " ".join(f"WHEN {rel} THEN {first}" for rel, _, first in state.leaves)
    return f"((CASE {a}tableoid {cases} END) + {local})"


def known_rows_sql(
    t: Any, state: TableState, noise: KeyedNoise, k: int, top: bool
) -> tuple[str, dict[str, Any]]:
    """The rows at the exceedances' positions (by ctid: a TID scan per relation), and the k
    rows of the top scores where `top`: (position, id, score)."""
    import numpy as np

    parts: list[str] = []
    params: dict[str, Any] = {}
    firsts = np.array([first for _, _, first in state.leaves], dtype=np.int64)
    exceed = np.asarray(noise.exceed_positions, dtype=np.int64)
    leaf_of = np.searchsorted(firsts, exceed, side="right") - 1
    score, pos = f"{t.score_sql}::float8", position_sql(state)
    for leaf in np.unique(leaf_of).tolist():
        name = f"tids{leaf}"
        params[name] = tid_array_literal(exceed[leaf_of == leaf] - firsts[leaf], state.per_page)
        parts.append(
            f"(SELECT {pos}, {t.id_sql}, {score} FROM ONLY {state.leaves[leaf][1]} "
            f"WHERE ctid = ANY(CAST(:{name} AS tid[])))"
        )
    if top:
        params["k"] = int(k)
        parts.append(
            f"(SELECT {pos}, {t.id_sql}, {score} FROM {t.source} "
            f"ORDER BY {t.score_sql} DESC LIMIT :k)"
        )
    return " UNION ALL ".join(parts), params


def range_read_sql(
    t: Any, state: TableState, noise: KeyedNoise, k: int, cut: float
) -> tuple[str, dict[str, Any]]:
    """The k best rows by score + keyed noise among those with score >= `cut` outside the
    exceedances, the noise computed in PostgreSQL: (position, id, score, noisy score). The
    cut in the column's own type where that keeps an index usable (integers: the ceiling;
    numeric: the exact decimal)."""
    keyed = noise.sql(t.dialect.keyed_uniform("key", "r.pos"))
    params: dict[str, Any] = {
        "key": noise.key,
        "k": int(k),
        "positions": int_array_literal(noise.exceed_positions),
    }
    where = ""
    if math.isfinite(cut):
        if state.score_type in INTEGER_TYPES:
            kind, params["cut"] = "bigint", math.ceil(cut)
        elif state.score_type.startswith("numeric"):
            kind, params["cut"] = "numeric", Decimal(cut)
        else:
            kind, params["cut"] = "float8", float(cut)
        where = f" WHERE {t.score_sql} >= CAST(:cut AS {kind})"
    query = (
        f"SELECT r.pos, r.id, r.score, {capped_sql('r.score', noise.score_cap)} + {keyed} AS v "
        f"FROM (SELECT {position_sql(state)} AS pos, {t.id_sql} AS id, {t.score_sql}::float8 "
        f"AS score FROM {t.source}{where}) AS r WHERE r.pos NOT IN "
        "(SELECT unnest(CAST(:positions AS bigint[]))) ORDER BY v DESC NULLS FIRST, r.pos "
        "LIMIT :k"
    )
    return query, params


def _scans(plan: Any) -> Any:
    """Every scan node of an EXPLAIN (FORMAT JSON) plan."""
    if isinstance(plan, list):
        for entry in plan:
            yield from _scans(entry)
    elif isinstance(plan, dict):
        node = str(plan.get("Node Type", ""))
        if node.endswith("Scan"):
            yield node
        for value in plan.values():
            if isinstance(value, list | dict):
                yield from _scans(value)


__all__ = [
    "DISTINCT_CHECK_MAX",
    "constraints_vouch",
    "known_rows_sql",
    "open_table",
    "position_sql",
    "range_read_sql",
    "slots_per_page",
]
