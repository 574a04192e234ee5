"""The engine's refusals, each written once: what a table of counts must be before anything
is read, released or charged (DESIGN invariant 6), in the project's words.

* `refuse_columns`: the table exists and has the id and score columns, the score of a numeric
  type, the id of a type with an equality and an order (the dialect's `Column`);
* `validate`: one pass over the table (no NULL or repeated id, no NULL, NaN, infinite or
  negative score, no score that is not a number where types are hints, not empty), after the
  scores a double cannot hold and the ids too long for the copy's index are refused (a clear
  error instead of a cast or index failure);
* `check_copy`: a copy just built is a valid histogram, where the store has no snapshot
  transaction to make validation and copy read one state;
* `is_stale`: whether the copy differs from the table (one full scan of both).
"""

from __future__ import annotations

from typing import Any

from adapters._sql import TableFacts, raise_if_invalid

from .dialect import FLOAT, INTEGER, Column


def refuse_columns(t: Any) -> tuple[Column, Column]:
    """The id and score columns of table `t` (engine.SQLTable), or a refusal."""
    columns = t.dialect.columns(t.driver, t.namespace, t.table)
    if columns is None:
        raise ValueError(f"{t.where} does not exist (or is not visible)")
    for name in (t.id_column, t.score_column):
        if name not in columns:
            raise ValueError(f"{t.where} has no column {name!r} (columns: {sorted(columns)})")
    d = t.dialect
    id_info = d.counts_column(t.where, "id", t.id_column, columns[t.id_column])
    score_info = d.counts_column(t.where, "score", t.score_column, columns[t.score_column])
    if score_info.kind not in (INTEGER, FLOAT):
        raise TypeError(
            f"{t.where} column {t.score_column!r} must be numeric, it is {score_info.type} "
            f"(scores are numbers: {t.dialect.score_types})"
        )
    if not id_info.id_ok:
        raise TypeError(
            f"{t.where} column {t.id_column!r} is {id_info.type}: ids must have an equality "
            f"and an order ({t.dialect.id_types})"
        )
    return id_info, score_info


def validate(t: Any) -> int:
    """Check every row of table `t` (module docstring); returns m. Raises naming the table and
    the column at fault."""
    d, s, i, driver = t.dialect, t.score_sql, t.id_sql, t.driver
    beyond = d.beyond_double(s, t.score_info)
    if beyond is not None:
        big = driver.scalar(f"SELECT count(*) FROM {t.source} WHERE {beyond}")
        if big:
            raise ValueError(
                f"{t.where} column {t.score_column!r} has {big} score(s) beyond the float8 "
                "range (about 1.8e308): scores are compared as float8"
            )
    if t.text_ids and d.max_id_bytes is not None:
        longest = driver.scalar(f"SELECT max({d.id_length(i)}) FROM {t.source}")
        if longest and longest > d.max_id_bytes:
            raise ValueError(
                f"{t.where} column {t.id_column!r} has an id of {longest} {d.id_length_unit}: "
                f"ids of at most {d.max_id_bytes} {d.id_length_unit} can be indexed"
            )
    bad = d.non_finite(s, t.score_info) or "1 = 0"
    odd = d.non_numbers(s) or "1 = 0"
    key = d.byte_order(i) if t.text_ids else i  # ids equal only byte for byte
    row = driver.one(
        f"SELECT count(*), count(*) - count({i}), count(DISTINCT {key}), count(*) - count({s}), "
        f"{d.count_if(bad)}, {d.count_if(f'{s} < 0')}, {d.count_if(odd)} FROM {t.source}"
    )
    refuse_non_numbers(t, int(row[0] or 0), int(row[6] or 0))
    facts = TableFacts(*(int(x or 0) for x in row[:6]))
    duplicate = None
    if facts.null_ids == 0 and facts.distinct_ids != facts.rows:
        duplicate = driver.scalar(
            f"SELECT {key} FROM {t.source} GROUP BY {key} HAVING count(*) > 1 LIMIT 1"
        )
    raise_if_invalid(facts, t.where, t.id_column, t.score_column, duplicate)
    return facts.rows


def refuse_non_numbers(t: Any, rows: int, count: int) -> None:
    """Values of the score column that are not numbers (a store whose types are hints)."""
    if rows and count:
        raise TypeError(f"{t.where} column {t.score_column!r} has {count} non-numeric value(s)")


def check_copy(t: Any, ranks: str) -> None:
    """The copy `ranks` of table `t`, just built, is a valid histogram (one pass over it): a
    writer's bad row that slipped in between validation and copy is refused, nothing
    published."""
    bad = "id IS NULL OR NOT (score >= 0 AND score <= 1.7976931348623157e308)"
    rows, ids, high, wrong = t.driver.one(
        f"SELECT count(*), count(DISTINCT id), max(rank), {t.dialect.count_if(bad)} FROM {ranks}"
    )
    if int(rows) != int(ids) or int(wrong or 0) or high is None or int(high) + 1 != int(rows):
        raise ValueError(
            f"{t.where} changed while prepare() copied it (the copy has {rows} rows, {ids} "
            f"distinct ids, {wrong} bad rows): nothing was replaced, call prepare(refresh=True) "
            "again"
        )


def is_stale(t: Any) -> bool:
    """Whether the counts differ from the copy (True without one): a scan, joined on both."""
    with t.dialect.run_transaction(t.driver, False):
        opened = t.copies.open(strict=False, runs=False)
        if opened is None:
            return True
        row = t.driver.one(
            f"SELECT count(*) - count(r.id), (SELECT count(*) FROM {t.source}), "
            f"(SELECT count(*) FROM {opened.ranks}) FROM {t.source_as('b')} LEFT JOIN "
            f"{opened.ranks} AS r ON r.id = b.{t.id_sql} AND r.score = "
            f"{t.dialect.double('b.' + t.score_sql)}"
        )
    unmatched, live, ranked = (int(x) for x in row)
    return bool(unmatched or live != ranked)


__all__ = ["check_copy", "is_stale", "refuse_columns", "refuse_non_numbers", "validate"]
