"""Reading a stale copy *around* the rows written since it was made (docs/freshness.md,
"Reading around the writes").

A write log proves a copy current or not; it names transactions, not rows. Beside it, a
dialect may keep a change log of the copy (its `changes` SQL, beside its write log):
every row a writing statement removed or added, in an order in which the last entry of an id
is its current row. A run whose copy is stale then reads the copy with the changed rows beside
it, no row of the table read: the run's first query counts the entries since the copy in one
pass, without grouping them by id (m is m_copy plus the new rows minus the old rows logged:
an id's entries alternate old, new), and the one-shot reads the rows and entries it needs by
index, scanning the entries only where the largest new score logged reaches its cut.

Positions (the one-shot's, keyed_noise.py): an unchanged item keeps its copy rank; the copy
ranks of changed items are holes; an item present among the changed ids takes m_copy + n -
n_min, n its last entry's number (superseded entries, and numbers drawn by other copies or by
transactions rolled back, are holes). Every item has one position, fixed before any noise is
drawn, so the in-store one-shot over these M = m_copy + n_max - n_min + 1 positions has the
one-shot law exactly as over a fresh copy (tested against the exact law and an ArraySource of
the current rows). A run falls back to the table read (table_read.py) when the changes are
invalid (a NULL id, a bad score: that read refuses them in the project's words), when what
reading around rests on changed since the copy, or when reading around is priced above it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from adapters._sql import id_array
from topk_middleware.access import Rows
from topk_middleware.keyed_noise import KeyedNoise, capped_sql


@dataclass
class AroundState:
    """What a run reading around the changes knows after its first queries."""

    snapshot: Any  # the copy's snapshot, as the change log's SQL reads it
    m_copy: int
    logged: int  # entries logged since the copy (old rows and new rows)
    removed: int  # of them, old rows
    added: int  # of them, new rows
    max_score: float | None  # the largest score of a new row logged (None: none)
    first_entry: int = 0  # the smallest entry number n among the changes
    entries: int = 0  # the span of entry numbers: largest - smallest + 1

    @property
    def m(self) -> int:
        return self.m_copy - self.removed + self.added

    @property
    def positions(self) -> int:
        return self.m_copy + self.entries


class ChangeLog:
    """The change log of one copy: installed, stamped and dropped with its write log
    (freshness.WriteLog), in the dialect's SQL (`dialect.changes`); `names` its objects."""

    def __init__(self, t: Any, names: Any) -> None:
        self.t, self.names, self.sql = t, names, t.dialect.changes

    def install(self, relations: list[Any]) -> None:
        self.sql.install(self.t.driver, self.names, relations, self.t.dialect.quote)

    def stamp(self) -> str:
        return str(self.sql.stamp(self.t.driver, self.names))

    def uninstall(self) -> None:
        self.sql.uninstall(self.t.driver, self.names, self.t.dialect.quote)


def around_state(t: Any, copies: Any, run: Any) -> AroundState | None:
    """The facts of reading around (one query), or None where the copy cannot be read around:
    no change log stamped with it, its tables missing, the catalog facts changed since, a NULL
    id or a new row whose score is not a finite count >= 0 among the changes (the table read
    then refuses the current rows or reads them)."""
    log = t.proof.changes
    if log is None:
        return None
    sql = log.sql
    lines = (run.record or "").split("\n")
    if len(lines) < 3 or not lines[2].startswith(sql.CHANGES_TAG + " "):
        return None
    snapshot = sql.parse_snapshot(lines[1])
    if snapshot is None:
        return None
    if not t.driver.one(sql.settings_sql(log.names))[-1]:
        return None
    row = t.driver.one(sql.facts_sql(log.names, t.proof.state_sql()), sql.snapshot_params(snapshot))
    digest, state, logged, null_ids, removed, added, bad, top, low, high, unnumbered = row
    if digest is None or lines[2] != f"{sql.CHANGES_TAG} {digest}":
        return None
    if state is None or lines[1].split(" ")[2] != state or null_ids or bad or unnumbered:
        return None
    span = 0 if low is None else int(high) - int(low) + 1
    return AroundState(
        snapshot, run.m, int(logged), int(removed), int(added),
        None if top is None else float(top), int(low or 0), span,
    )  # fmt: skip


def around_oneshot(t: Any, copies: Any, run: Any, noise: KeyedNoise, k: int) -> Rows:
    """The in-store one-shot over the copy with the changed rows beside it (module docstring),
    best first, ties by smaller position, in one query; positions 0..k-1, as the table's
    one-shot returns (the run's positions go past m)."""
    log, state = t.proof.changes, run.around
    sql = log.sql
    keyed = noise.sql(t.dialect.keyed_uniform("key", "{p}.position"))
    query = sql.oneshot_sql(
        log.names,
        run.ranks,
        keyed.replace("{", "{{").replace("}", "}}").replace("{{p}}", "{p}"),
        noise.bound,
        lambda score: capped_sql(score, noise.score_cap),
    )
    d = t.dialect
    params = sql.snapshot_params(state.snapshot) | {
        "key": noise.key,
        "k": int(k),
        "m": int(state.m_copy),
        "first": int(state.first_entry),
        "top": state.max_score,
        "positions": d.array_value(noise.exceed_positions, "integer", t.driver),
        "noises": d.array_value(noise.exceed_noises, "float", t.driver),
    }
    previous = t.driver.one(sql.oneshot_settings_sql())[0]
    records = t.driver.execute(query, params)
    t.driver.execute(sql.restore_sql(), {"value": previous})
    return Rows(
        np.arange(len(records), dtype=np.int64),
        id_array([r[1] for r in records]),
        np.array([r[2] for r in records], dtype=np.float64),
    )


__all__ = ["AroundState", "ChangeLog", "around_oneshot", "around_state"]
