"""IbisTable's in-store one-shot (adapters/ibis.py): on DuckDB and PostgreSQL the backend
computes the keyed noise (keyed_noise.py) over the expression's ranks in one statement, with the
key and the exceedances bound as parameters; SQLite, and a PostgreSQL connection whose cursors
write parameters into the statement text, read the expression in full instead and say so.
(The exact top-k of single statements, and the law, run in tests/core/test_auto_plan.py.)
About 15 s.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import ibis
import numpy as np
import psycopg
import pytest
from psycopg.pq import Trace

from adapters.ibis import IbisTable
from adapters.memory import ArraySource
from tests.stores_postgres import create_table
from topk_middleware import private_top_k
from topk_middleware.access import Rows, offers_in_store
from topk_middleware.keyed_noise import KeyedNoise, default_exceedances

M = 70_000  # at least 64 x 1024 rows: the release splits the noise (drawn exceedances)


class KeyedFullRead(ArraySource):
    """The one-shot over a full read, computed here: the top-k of min(score, cap) + the keyed
    noise KeyedNoise computes in Python (hashlib), at ArraySource's positions (its ranks)."""

    def read_oneshot(self, noise: KeyedNoise, k: int) -> Rows:
        rows = self.read_sorted(0, self.domain_size())
        values = noise.capped(rows.scores) + noise.noises(rows.positions)
        best = np.lexsort((rows.positions, -values))[:k]
        return Rows(rows.positions[best], rows.ids[best], rows.scores[best])


def histogram(ids: str) -> tuple[np.ndarray, np.ndarray]:
    """Four counts, each tied on about M/4 items, under int or text ids (a seeded permutation):
    the noise, not the counts, decides the winners, so each winner's position matters."""
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 4, M)
    numbers = rng.permutation(M) + 10
    return scores, (numbers if ids == "int" else np.asarray([f"item é{n}" for n in numbers]))


@pytest.mark.parametrize("ids", ["int", "text"])
@pytest.mark.parametrize("store", ["ibis-duckdb", "ibis-postgres"])
def test_in_store_release_is_the_keyed_full_reads(
    request: pytest.FixtureRequest, store: str, ids: str
) -> None:
    """With one seed, the in-store release on the backend equals the one-shot computed in
    Python over a full read under the same keyed noise at ArraySource's positions (same items,
    same order), with Gumbel and Laplace noise, split into exceedances (m >= 64 x 1024); counted
    as m sorted accesses in two round trips (m, then the one statement). Fails if a position
    differs from the store's ranks (checked: ties by id descending fail every case); a wrong
    digit in the keyed uniform mostly hides behind the exceedances here, and fails the single
    statements of tests/core/test_auto_plan.py instead (checked: 12 hex digits)."""
    scores, names = histogram(ids)
    source = request.getfixturevalue(f"make_{store.replace('-', '_')}_source")(scores, names)
    reference = KeyedFullRead(scores, names)
    assert offers_in_store(source) and source.oneshot_refusal is None
    assert default_exceedances(M, 5) is not None
    for seed, noise in ((0, "gumbel"), (1, "laplace"), (2, "gumbel")):
        options: dict[str, Any] = dict(k=5, epsilon=0.5, noise=noise, seed=seed)
        got = private_top_k(source, method="oneshot_in_store", **options)
        want = private_top_k(reference, method="oneshot_in_store", **options)
        assert got.items == want.items and got.diagnostics.plan["in_store"], options
        assert got.diagnostics.plan["in_store_reads"] == "the expression"
        a = got.accesses
        assert (a.sorted, a.random, a.rows_fetched, a.round_trips) == (M, 0, M, 2)
        # the same seed's full read draws other noise: a release of its own, read row by row
        full = private_top_k(source, method="oneshot_full_read", **options)
        assert not full.diagnostics.plan["in_store"] and full.accesses.rows_fetched == M


def test_postgres_statement_text_holds_no_key(
    make_ibis_postgres_source: Any, pg_conninfo: str, tmp_path: Path
) -> None:
    """What the server receives, traced by libpq on the Ibis backend's connection: the
    one-shot's statement text (the Parse message, what pg_stat_activity and the server's logs
    show) holds placeholders and neither the key nor any exceedance (noise or position); the
    key arrives in a Bind message, as a parameter. pg_stat_activity, read by another session,
    shows the start of that same text (track_activity_query_size cuts it)."""
    scores = np.floor(1e4 / np.arange(1, 3001))
    source = make_ibis_postgres_source(scores, None)
    keyed = KeyedNoise.draw(np.random.default_rng(5), "gumbel", 2.0, len(scores), 2, exceedances=40)
    assert len(keyed.exceed_positions) > 10
    pgconn = source.backend.con.pgconn
    with open(tmp_path / "trace", "w+") as trace:
        with psycopg.connect(pg_conninfo, autocommit=True) as observer, source.snapshot():
            pgconn.trace(trace.fileno())
            pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS)
            try:
                rows = source.read_oneshot(keyed, 2)
            finally:
                pgconn.untrace()
            shown = observer.execute(
                "SELECT query FROM pg_stat_activity WHERE pid = %s", [pgconn.backend_pid]
            ).fetchone()[0]
        trace.seek(0)
        sent = trace.read().splitlines()
    parsed = [line for line in sent if "\tParse\t" in line]
    assert len(rows) == 2 and len(parsed) == 1
    text = parsed[0]
    assert "sha256" in text and "$1" in text and shown.startswith("WITH floor AS (SELECT")
    assert shown[:200] in text
    assert keyed.key not in text and keyed.key not in shown
    assert any(keyed.key in line for line in sent if "\tBind\t" in line)
    for z in keyed.exceed_noises.tolist():
        assert repr(z) not in text and f"{z:.6f}" not in text
    numbers = set(re.findall(r"\b\d{3,}\b", text))
    assert numbers.isdisjoint(str(p) for p in keyed.exceed_positions.tolist() if p >= 100)


def test_a_connection_that_writes_parameters_into_the_text_gets_no_key(
    pg_conninfo: str, pg_schema: str
) -> None:
    """psycopg's ClientCursor interpolates parameters on the client: that connection is no
    InStoreOneShot, says why, and method="oneshot" reads the expression in full (m rows)."""
    conn = psycopg.connect(pg_conninfo, autocommit=True, cursor_factory=psycopg.ClientCursor)
    name = f"client_{uuid.uuid4().hex[:8]}"
    try:
        create_table(conn, pg_schema, name, np.arange(300, 0, -1), None)
        source = IbisTable(
            ibis.postgres.from_connection(conn).table(name, database=pg_schema),
            id="Item ID",
            score="select",
        )
        assert not offers_in_store(source)
        assert "write parameters into the statement text" in source.oneshot_in_store
        assert "statement text" in str(source.check())
        got = private_top_k(source, 3, 1.0, method="oneshot", seed=4)
        assert not got.diagnostics.plan["in_store"] and got.accesses.rows_fetched == 300
    finally:
        conn.execute(f'DROP TABLE IF EXISTS "{pg_schema}"."{name}"')
        conn.close()


def test_sqlite_reads_in_full_and_says_why(make_ibis_sqlite_source: Any) -> None:
    """SQLite has no SHA-256 in SQL: no in-store one-shot (check() and oneshot_in_store say it
    is a full read and why); method="oneshot_in_store" falls back to the full read, the same
    release as ArraySource's full read under that seed."""
    scores = np.floor(500 / np.arange(1, 801))
    source = make_ibis_sqlite_source(scores, None)
    assert not offers_in_store(source) and source.read_oneshot is None
    assert source.oneshot_in_store == "a full read into the client: SQLite has no SHA-256 in SQL"
    assert "one-shot        FULL SCAN a full read into the client" in str(source.check())
    got = private_top_k(source, 4, 1.0, method="oneshot_in_store", seed=6)
    want = private_top_k(ArraySource(scores), 4, 1.0, method="oneshot_in_store", seed=6)
    assert not got.diagnostics.plan["in_store"] and got.items == want.items
    assert got.accesses.sorted == got.accesses.rows_fetched == 800


@pytest.mark.parametrize("store", ["ibis-duckdb", "ibis-postgres"])
def test_auto_takes_the_in_store_one_shot_without_reading_first(
    request: pytest.FixtureRequest, store: str
) -> None:
    """Where the one-shot runs in the backend, every sorted read sorts the expression as the
    one-shot does (run_traits: sorted_scans), so `auto` takes the one-shot at once: two round
    trips (m, the statement), m sorted accesses counted, no read before; the same release as
    method="oneshot_in_store" under that seed. On SQLite (no in-store one-shot) auto reads the
    top rows first and chooses as before."""
    scores = np.floor(1e5 / np.arange(1, 3001))
    source = request.getfixturevalue(f"make_{store.replace('-', '_')}_source")(scores, None)
    got = private_top_k(source, 5, 1.0, seed=8)
    assert got.diagnostics.plan["auto"]["chosen"] == "oneshot_in_store"
    assert got.diagnostics.plan["in_store"] and got.accesses.round_trips == 2
    assert got.accesses.sorted == 3000 and got.accesses.random == 0
    assert got.items == private_top_k(source, 5, 1.0, seed=8, method="oneshot_in_store").items


def test_sqlite_auto_reads_first(make_ibis_sqlite_source: Any) -> None:
    scores = np.floor(1e5 / np.arange(1, 3001))
    got = private_top_k(make_ibis_sqlite_source(scores, None), 5, 1.0, seed=8)
    assert got.diagnostics.plan["auto"]["chosen"] in ("threshold", "oneshot_full_read")
    assert not got.diagnostics.plan["in_store"]


def test_an_oblivious_release_on_postgres_sends_no_drawn_rank(
    make_ibis_postgres_source: Any, make_ibis_duckdb_source: Any, tmp_path: Path
) -> None:
    """Ibis writes the ranks a read asks for into the statement text, which PostgreSQL's
    observers read (pg_stat_activity, logs): an oblivious release there reads the whole
    expression (m rows, libpq's trace holds no statement that reads by rank) and refuses the
    threshold method; in-process DuckDB reads 2d rows by rank as other stores do."""
    scores = np.floor(1e4 / np.arange(1, 3001))
    source = make_ibis_postgres_source(scores, None)
    assert source.traits().parameters_in_text
    assert not make_ibis_duckdb_source(scores, None).traits().parameters_in_text
    with pytest.raises(ValueError, match="cannot run obliviously on this store"):
        private_top_k(source, 3, 1.0, oblivious=True, method="threshold", seed=1)
    pgconn = source.backend.con.pgconn
    with open(tmp_path / "trace", "w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS)
        try:
            got = private_top_k(source, 3, 1.0, oblivious=True, seed=1, deadline=0)
        finally:
            pgconn.untrace()
        trace.seek(0)
        sent = [
            line for line in trace.read().splitlines() if "\tQuery\t" in line or "\tParse\t" in line
        ]
    assert got.plan["full_read"] and got.accesses.rows_fetched == 3000
    assert sent and not any("ROW_NUMBER" in line.upper() for line in sent)
