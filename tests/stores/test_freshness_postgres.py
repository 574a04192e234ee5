"""PostgreSQL copy mode on a changing table (docs/freshness.md; adapters/sql/freshness.py,
adapters/sql/table_read.py and their SQL, adapters/dialects/postgres/).

Each test wraps a table of distinct even scores 0, 2, ..., 598 (ids 0..299, a primary key) in a
PostgresTable that is not frozen, prepares it, and writes to it from connections of its own. A
release with epsilon = 10^4 has Gumbel scale 6e-4: a gap of 2 is crossed by the noise with
probability below exp(-3000), so the released top-3 is the exact top-3 of the table the release
read. Every write the audit found served silently stale is here: the release must name the
table's new top-3 and the copy must not be served.
"""

from __future__ import annotations

import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql

from adapters.dialects.postgres.tables import constraints_vouch
from adapters.postgres import PostgresTable
from adapters.sql.table_read import guess_cut
from topk_middleware import private_top_k
from topk_middleware.privacy import calibrate

SCORES = np.arange(300, dtype=np.int64) * 2
K = 3
EPSILON = 1e4


@dataclass
class Table:
    conninfo: str
    schema: str
    name: str
    writer: psycopg.Connection[Any]
    source: PostgresTable

    @property
    def ident(self) -> sql.Composable:
        return sql.Identifier(self.schema, self.name)

    def run(self, statement: str, params: Any = None) -> None:
        """Commit one statement ({t} is the table, {trigger} the copy's trigger) on the writer's
        connection."""
        trigger = sql.Identifier(self.source.writes_trigger)
        self.writer.execute(sql.SQL(statement).format(t=self.ident, trigger=trigger), params)

    def top(self, method: str = "auto", **options: Any) -> list[int]:
        result = private_top_k(self.source, k=K, epsilon=EPSILON, method=method, seed=3, **options)
        self.last = result
        return [int(item) for item in result.items]


def _create(conn: psycopg.Connection[Any], ident: sql.Composable, scores: Any) -> None:
    conn.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, score bigint)").format(ident))
    with conn.cursor() as cur, cur.copy(sql.SQL("COPY {} FROM STDIN").format(ident)) as copy:
        for row in enumerate(np.asarray(scores).tolist()):
            copy.write_row(row)


@pytest.fixture
def pg_table(pg_conninfo: str, pg_schema: str) -> Iterator[Table]:
    writer = psycopg.connect(pg_conninfo, autocommit=True)
    name = f"fresh_{uuid.uuid4().hex[:8]}"
    _create(writer, sql.Identifier(pg_schema, name), SCORES)
    source = PostgresTable(pg_conninfo, name, schema=pg_schema)
    source.prepare()
    table = Table(pg_conninfo, pg_schema, name, writer, source)
    yield table
    source.uninstall()
    source.close()
    writer.execute(
        sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(sql.Identifier(pg_schema, name))
    )
    writer.close()


def test_the_copy_is_served_until_a_write(pg_table: Table) -> None:
    """Right after prepare() the copy is proven current and served; a write, even one that
    changes no score, ends the proof until prepare(refresh=True)."""
    assert pg_table.source.serves_copy()
    assert pg_table.top() == [299, 298, 297]
    assert pg_table.last.plan["freshness"]["copy"] == "current"
    pg_table.run("UPDATE {t} SET score = score WHERE id = 5")
    assert not pg_table.source.serves_copy()
    assert pg_table.top() == [299, 298, 297]
    assert pg_table.last.plan["freshness"]["read"] == "table"
    pg_table.source.prepare(refresh=True)
    assert pg_table.source.serves_copy()


WRITES = {
    "update": ["UPDATE {t} SET score = 10000 WHERE id = 5"],
    "insert": ["INSERT INTO {t} VALUES (1000, 10000)"],
    "delete": ["DELETE FROM {t} WHERE id IN (299, 298)"],
    "truncate": ["TRUNCATE {t}", "INSERT INTO {t} VALUES (7, 5), (8, 3), (9, 1), (10, 0)"],
    "alter type": [
        "ALTER TABLE {t} ALTER score TYPE bigint USING (CASE WHEN id = 5 THEN 10000 ELSE score END)"
    ],
    "disable trigger": [
        "ALTER TABLE {t} DISABLE TRIGGER ALL",
        "UPDATE {t} SET score = 10000 WHERE id = 5",
    ],
    "disable and enable again": [
        "ALTER TABLE {t} DISABLE TRIGGER ALL",
        "UPDATE {t} SET score = 10000 WHERE id = 5",
        "ALTER TABLE {t} ENABLE ALWAYS TRIGGER {trigger}",
    ],
}
EXPECTED = {
    "update": [5, 299, 298],
    "insert": [1000, 299, 298],
    "delete": [297, 296, 295],
    "truncate": [7, 8, 9],
    "alter type": [5, 299, 298],
    "disable trigger": [5, 299, 298],
    "disable and enable again": [5, 299, 298],
}


@pytest.mark.parametrize("write", list(WRITES))
def test_a_release_reflects_every_kind_of_write(pg_table: Table, write: str) -> None:
    """UPDATE, INSERT, DELETE, TRUNCATE, a rewrite by ALTER TYPE (no DML trigger fires), writes
    made with the triggers disabled (and enabled again after): by every method, the release
    names the table's top-3, and the copy is not served. Fails if the proof ignores the
    relation's storage (relfilenode) or the trigger row's state."""
    for statement in WRITES[write]:
        pg_table.run(statement)
    assert not pg_table.source.serves_copy()
    for method in ("auto", "threshold", "oneshot", "oneshot_full_read"):
        assert pg_table.top(method) == EXPECTED[write], method
    pg_table.source.prepare(refresh=True)
    assert pg_table.source.serves_copy()
    assert pg_table.top() == EXPECTED[write]


def test_replica_role_writes_are_logged(pg_table: Table) -> None:
    """A session with session_replication_role = replica (how a logical replication subscriber
    writes, and how pg_restore loads) skips ordinary triggers; the log's trigger is ENABLE
    ALWAYS and fires."""
    with psycopg.connect(pg_table.conninfo, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute(sql.SQL("UPDATE {} SET score = 10000 WHERE id = 5").format(pg_table.ident))
    assert not pg_table.source.serves_copy()
    assert pg_table.top() == [5, 299, 298]


def test_drop_and_recreate_or_rename_swap_reads_the_new_table(pg_table: Table) -> None:
    """A table of the same name dropped and re-created, or another renamed in its place: the
    copy belongs to the old one, so the run reads the new table (no RankTableMismatchError),
    and prepare() rebuilds the copy for it."""
    pg_table.run("DROP TABLE {t}")
    _create(pg_table.writer, pg_table.ident, SCORES[::-1])  # id 0 now has the top score
    assert not pg_table.source.serves_copy()
    assert pg_table.top() == [0, 1, 2]
    assert pg_table.last.plan["freshness"]["why"] == "another table"
    other = sql.Identifier(pg_table.schema, pg_table.name + "_new")
    _create(pg_table.writer, other, SCORES)
    pg_table.run("ALTER TABLE {t} RENAME TO " + pg_table.name + "_old")
    pg_table.writer.execute(
        sql.SQL("ALTER TABLE {} RENAME TO {}").format(other, sql.Identifier(pg_table.name))
    )
    assert pg_table.top() == [299, 298, 297]
    pg_table.source.prepare()
    assert pg_table.source.serves_copy()
    pg_table.writer.execute(
        sql.SQL("DROP TABLE {}").format(sql.Identifier(pg_table.schema, pg_table.name + "_old"))
    )


def test_frozen_keeps_refusing_a_copy_of_another_table(pg_table: Table) -> None:
    """frozen=True promises the table does not change: a copy of a table since dropped and
    re-created is refused (RankTableMismatchError), not served."""
    from adapters.postgres import RankTableMismatchError

    pg_table.run("DROP TABLE {t}")
    _create(pg_table.writer, pg_table.ident, SCORES)
    frozen = PostgresTable(pg_table.conninfo, pg_table.name, schema=pg_table.schema, frozen=True)
    with pytest.raises(RankTableMismatchError, match="earlier table"):
        private_top_k(frozen, k=K, epsilon=EPSILON)
    frozen.close()


def test_partitions_have_the_trigger_and_new_ones_end_the_proof(
    pg_conninfo: str, pg_schema: str
) -> None:
    """A partitioned table: a write straight into a partition (which fires no statement
    trigger of the parent) ends the proof, and so does a partition attached later (it has no
    trigger yet); the release reads every partition, positions by (partition, ctid)."""
    conn = psycopg.connect(pg_conninfo, autocommit=True)
    name = f"parts_{uuid.uuid4().hex[:8]}"
    t = sql.Identifier(pg_schema, name)
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint NOT NULL, score bigint NOT NULL) PARTITION BY RANGE (id)"
        ).format(t)
    )
    parts = [sql.Identifier(pg_schema, f"{name}_{i}") for i in range(3)]
    for i, part in enumerate(parts[:2]):
        conn.execute(
            sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                part, t, sql.Literal(i * 150), sql.Literal((i + 1) * 150)
            )
        )
    with conn.cursor() as cur, cur.copy(sql.SQL("COPY {} FROM STDIN").format(t)) as copy:
        for row in enumerate(SCORES.tolist()):
            copy.write_row(row)
    source = PostgresTable(pg_conninfo, name, schema=pg_schema)
    try:
        source.prepare()
        assert source.serves_copy()
        conn.execute(sql.SQL("UPDATE {} SET score = 10000 WHERE id = 5").format(parts[0]))
        assert not source.serves_copy()
        got = private_top_k(source, k=K, epsilon=EPSILON, seed=1)
        assert [int(i) for i in got.items] == [5, 299, 298]
        assert got.plan["freshness"]["read"] == "table" and got.plan["in_store"]
        source.prepare(refresh=True)
        assert source.serves_copy()
        conn.execute(
            sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM (300) TO (400)").format(
                parts[2], t
            )
        )
        assert not source.serves_copy()  # the new partition has no trigger
        conn.execute(sql.SQL("INSERT INTO {} VALUES (350, 20000)").format(parts[2]))
        got = private_top_k(source, k=K, epsilon=EPSILON, seed=2)
        assert [int(i) for i in got.items] == [350, 5, 299]
        source.prepare(refresh=True)  # installs the trigger on the new partition
        assert source.serves_copy()
        conn.execute(sql.SQL("UPDATE {} SET score = 0 WHERE id = 350").format(parts[2]))
        assert not source.serves_copy()
    finally:
        source.uninstall()
        source.close()
        conn.execute(sql.SQL("DROP TABLE {} CASCADE").format(t))
        conn.close()


def test_writers_never_wait_for_each_other(pg_conninfo: str, pg_schema: str) -> None:
    """Two writers on two rows of one prepared table, and two transactions writing two prepared
    tables in opposite orders, under lock_timeout = 200 ms: none waits (a shared counter row
    made the second wait for the first's commit, and the crossed pair deadlock)."""
    conn = psycopg.connect(pg_conninfo, autocommit=True)
    names = [f"writers_{uuid.uuid4().hex[:8]}" for _ in range(2)]
    idents = [sql.Identifier(pg_schema, n) for n in names]
    sources = []
    for ident, name in zip(idents, names, strict=True):
        _create(conn, ident, SCORES)
        sources.append(PostgresTable(pg_conninfo, name, schema=pg_schema))
        sources[-1].prepare()
    first = psycopg.connect(pg_conninfo)
    second = psycopg.connect(pg_conninfo)
    try:
        for c in (first, second):
            c.execute("SET lock_timeout = '200ms'")
        update = "UPDATE {} SET score = score + 1 WHERE id = %s"
        first.execute(sql.SQL(update).format(idents[0]), [1])
        second.execute(sql.SQL(update).format(idents[0]), [2])  # waits (and fails) if serialised
        first.execute(sql.SQL(update).format(idents[1]), [1])
        second.execute(sql.SQL(update).format(idents[1]), [2])
        first.commit()
        second.commit()
        first.execute(sql.SQL(update).format(idents[0]), [3])
        second.execute(sql.SQL(update).format(idents[1]), [3])
        first.execute(sql.SQL(update).format(idents[1]), [4])  # opposite orders
        second.execute(sql.SQL(update).format(idents[0]), [4])
        first.commit()
        second.commit()
        for source in sources:
            assert not source.serves_copy()
    finally:
        first.close()
        second.close()
        for source, ident in zip(sources, idents, strict=True):
            source.uninstall()
            source.close()
            conn.execute(sql.SQL("DROP TABLE {}").format(ident))
        conn.close()


def test_a_write_begun_before_the_copy_and_committed_after_is_seen(pg_table: Table) -> None:
    """A transaction that wrote before prepare(refresh=True) took its snapshot and committed
    after: its write is not in the copy, and its log row, written by a transaction the copy's
    snapshot saw in progress, ends the proof (a counter or a sequence read at prepare() would
    have counted it already, and the copy would be served stale)."""
    slow = psycopg.connect(pg_table.conninfo)
    try:
        slow.execute(sql.SQL("UPDATE {} SET score = 10000 WHERE id = 5").format(pg_table.ident))
        pg_table.source.prepare(refresh=True)  # the trigger exists: no DDL waits for `slow`
        slow.commit()
    finally:
        slow.close()
    assert not pg_table.source.serves_copy()
    assert pg_table.top() == [5, 299, 298]


def test_writes_during_a_run_do_not_leak_into_it(pg_table: Table) -> None:
    """A run reads its table in the snapshot of its start: a write committed while it runs
    (after it opened) is not in its release, whether it reads the copy or the table."""
    for stale in (False, True):
        if stale:
            pg_table.run("UPDATE {t} SET score = 1 WHERE id = 0")
        with pg_table.source.snapshot():
            pg_table.run("UPDATE {t} SET score = 50000 WHERE id = 7")
            assert pg_table.top() == [299, 298, 297]
        assert pg_table.top() == [7, 299, 298]
        pg_table.run("UPDATE {t} SET score = 14 WHERE id = 7")
        pg_table.source.prepare(refresh=True)


def test_writers_need_no_right_on_the_log(pg_table: Table) -> None:
    """The trigger function is SECURITY DEFINER: a role allowed to update the table only
    writes, and the write is logged."""
    role = f"topk_writer_{uuid.uuid4().hex[:8]}"
    w = pg_table.writer
    w.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
    try:
        w.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                sql.Identifier(pg_table.schema), sql.Identifier(role)
            )
        )
        w.execute(
            sql.SQL("GRANT SELECT, UPDATE ON {} TO {}").format(pg_table.ident, sql.Identifier(role))
        )
        with psycopg.connect(pg_table.conninfo, autocommit=True) as conn:
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("UPDATE {} SET score = 10000 WHERE id = 5").format(pg_table.ident))
        assert not pg_table.source.serves_copy()
        assert pg_table.top() == [5, 299, 298]
    finally:
        w.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        w.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_bad_rows_written_since_the_copy_are_refused(pg_table: Table) -> None:
    """Without constraints that vouch for them, the run's aggregate pass checks the rows it
    reads now: a NULL, a negative score, a duplicate id (a table without a key) are refused in
    the project's words before anything is released."""
    pg_table.run("UPDATE {t} SET score = -1 WHERE id = 3")
    with pytest.raises(ValueError, match="has 1 negative score"):
        private_top_k(pg_table.source, k=K, epsilon=1.0)
    pg_table.run("UPDATE {t} SET score = NULL WHERE id = 3")
    with pytest.raises(ValueError, match="has 1 NULL score"):
        private_top_k(pg_table.source, k=K, epsilon=1.0)
    pg_table.run("UPDATE {t} SET score = 6 WHERE id = 3")
    pg_table.run("ALTER TABLE {t} DROP CONSTRAINT " + pg_table.name + "_pkey")
    pg_table.run("INSERT INTO {t} VALUES (3, 6)")
    with pytest.raises(ValueError, match="duplicate ids"):
        private_top_k(pg_table.source, k=K, epsilon=1.0)


def test_constraints_vouch_for_the_scores(pg_table: Table) -> None:
    """NOT NULL and a validated CHECK (score >= 0) make the aggregate pass skip those checks
    (PostgreSQL's constraint prover refutes the bad rows); without the CHECK it must check."""
    pg_table.run("UPDATE {t} SET score = score WHERE id = 0")
    source = pg_table.source
    with source.snapshot():
        assert not constraints_vouch(source, "bigint")
    pg_table.run("ALTER TABLE {t} ADD CHECK (score >= 0), ALTER score SET NOT NULL")
    with source.snapshot():
        assert constraints_vouch(source, "bigint")
        assert not constraints_vouch(source, "double precision")  # NaN is not refuted


def test_oblivious_runs_refresh_a_stale_copy_first(pg_table: Table) -> None:
    """An oblivious release never reads the table itself with data-dependent queries: a stale
    copy is rebuilt first (the freshness report says so), then read at the fixed depth."""
    pg_table.run("UPDATE {t} SET score = 10000 WHERE id = 5")
    got = private_top_k(pg_table.source, k=K, epsilon=EPSILON, oblivious=True, deadline=0, seed=1)
    assert [int(i) for i in got.items] == [5, 299, 298]
    assert got.plan["freshness"] == {"copy": "current", "proof": "triggers", "refreshes": 1}
    assert pg_table.source.serves_copy()


def test_statistics_gone_stale_cost_a_second_read_not_an_answer(pg_table: Table) -> None:
    """The cut guessed from pg_stats is checked: after ANALYZE, the top third of the scores
    falls to 0, far below what the statistics saw; the guessed cut is too high (no row above
    it), the range is read again from the exact cut, and the release is still the table's
    top-3."""
    pg_table.run("ANALYZE {t}")
    pg_table.run("UPDATE {t} SET score = 0 WHERE score >= 400")  # below the guessed cut
    assert pg_table.top("oneshot") == [199, 198, 197]
    report = pg_table.last.plan["freshness"]
    assert report["cut_guessed"] and report["cut_missed"]


def test_guess_cut_counts_whole_buckets_only() -> None:
    """pg_stats' histogram read without interpolation: the cut is a bound with at least the
    asked rows above it, counting only buckets wholly above (a linear reading within the top
    bucket of Zipf counts would put it far too high)."""
    bounds = [0.0, 10.0, 100.0, 10_000.0]  # 3 buckets of 1/3 of the non-MCV rows each
    stats = ([5.0], [0.5], bounds, 0.0)
    assert guess_cut(stats, 600, 50) == 100.0  # one bucket: 100 rows
    assert guess_cut(stats, 600, 150) == 10.0
    assert guess_cut(stats, 600, 400) == 5.0  # the MCV adds 300
    assert guess_cut(stats, 600, 700) is None


def _law_counts(source: PostgresTable, m: int, runs: int) -> np.ndarray:
    counts = np.zeros(6)
    for seed in range(runs):
        result = private_top_k(source, k=1, epsilon=1.0, method="oneshot", seed=seed)
        assert result.plan["in_store"] and result.plan["freshness"]["read"] == "table"
        item = int(result.items[0])
        counts[item if item < 5 else 5] += 1
    return counts


@pytest.mark.parametrize("path", ["statistics", "score index", "partitions"])
def test_the_one_shot_on_the_table_has_the_exponential_law(
    pg_conninfo: str, pg_schema: str, path: str
) -> None:
    """The one-shot on the table (keyed noise on ctid slots, split at the default level: a
    table at fillfactor 10 has 18 rows a page of 291 slots, so most positions hold no row, and
    deleted rows leave more) releases item i as top-1 with probability exp(h_i / b) / sum_j
    exp(h_j / b) (Gumbel-max, Fact 3.3 with k = 1). Five items stand out of 4,995 zeros by
    ln(m) + 0, 0.5, ..., 2 scales. The cut comes from pg_stats, from a B-tree on the score, or
    the table has two partitions (positions offset by partition). Chi-square over 600 seeded
    releases, p > 0.001 (fails with probability 0.001 if the law holds)."""
    from scipy import stats

    m = 5000
    b = calibrate("gumbel", 1, m, 1.0, 0.0).scale
    lifts = np.array([0.0, 0.5, 1.0, 1.5, 2.0])
    tops = b * (np.log(m) + lifts)
    conn = psycopg.connect(pg_conninfo, autocommit=True)
    name = f"law_{uuid.uuid4().hex[:8]}"
    t = sql.Identifier(pg_schema, name)
    if path == "partitions":
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id bigint PRIMARY KEY, score float8 NOT NULL) "
                "PARTITION BY RANGE (id)"
            ).format(t)
        )
        for i, (low, high) in enumerate(((0, 2600), (2600, 10**6))):
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({}) "
                    "WITH (fillfactor = 10)"
                ).format(
                    sql.Identifier(pg_schema, f"{name}_{i}"), t, sql.Literal(low), sql.Literal(high)
                )
            )
    else:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id bigint PRIMARY KEY, score float8 NOT NULL) "
                "WITH (fillfactor = 10)"
            ).format(t)
        )
    zeros = list(range(100, 100 + m - 5 + 300))
    rows = [(i, 0.0) for i in zeros] + [(i, float(h)) for i, h in enumerate(tops)]
    rows.sort(key=lambda r: (r[0] * 7919) % 10007)  # the top items scattered among the zeros
    with conn.cursor() as cur, cur.copy(sql.SQL("COPY {} FROM STDIN").format(t)) as copy:
        for row in rows:
            copy.write_row(row)
    conn.execute(
        sql.SQL("DELETE FROM {} WHERE id IN (SELECT unnest(%s::bigint[]))").format(t),
        [zeros[::16][:300]],
    )
    if path == "score index":
        conn.execute(sql.SQL("CREATE INDEX ON {} (score)").format(t))
    conn.execute(sql.SQL("ANALYZE {}").format(t))
    source = PostgresTable(pg_conninfo, name, schema=pg_schema)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # no rank table: read the table
            with source.snapshot():
                assert source.domain_size() == m and source.oneshot_positions() > 64 * 1024
                assert source._run.table.score_index == (path == "score index")
            weights = np.concatenate([np.exp(tops / b), [m - 5.0]])
            runs = 600
            counts = _law_counts(source, m, runs)
        assert stats.chisquare(counts, weights / weights.sum() * runs).pvalue > 1e-3
    finally:
        source.close()
        conn.execute(sql.SQL("DROP TABLE {} CASCADE").format(t))
        conn.close()


def test_a_concurrent_refresh_does_not_break_a_run(pg_table: Table) -> None:
    """A run on the table (stale copy) while another wrapper refreshes the copy: the refresh
    waits for nothing the run holds on the table, and the run's answer is its snapshot's."""
    pg_table.run("UPDATE {t} SET score = 10000 WHERE id = 5")
    other = PostgresTable(pg_table.conninfo, pg_table.name, schema=pg_table.schema)
    done = threading.Event()

    def refresh() -> None:
        other.prepare(refresh=True, swap_timeout=30)
        done.set()

    with pg_table.source.snapshot():
        thread = threading.Thread(target=refresh)
        thread.start()
        time.sleep(0.2)
        assert pg_table.top() == [5, 299, 298]
    thread.join(30)
    assert done.is_set()
    other.close()
    assert pg_table.source.serves_copy()
