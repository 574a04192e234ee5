"""An oblivious release on PostgreSQL by a role that may not set track_counts is refused before
anything is read, released or charged (StoreTraits.oblivious_reads_seen, api.py): the blocks
it would read show in pg_statio_user_tables, which every role reads, and they follow the
table's layout (docs/promise.md). On the real server, as a throwaway LOGIN role made here and
dropped: psycopg copy and live, SQLAlchemy copy and live, Ibis; the refusal sends the server
no statement (each store asked the role's privilege once, when it was made), charges nothing
and moves no statistic; with `GRANT SET ON PARAMETER track_counts` the same release runs and
leaves no statistic; with `accept_statistics_channel` it runs and warns; `topk-middleware
release` is refused in the same words.
Cost: about 20 s (one table, prepared in both modes; 24 releases and refusals, each store's
statistics flushed around them).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
import sqlalchemy as sa
from psycopg import sql

from adapters.postgres import PostgresTable
from adapters.sqlalchemy import SQLAlchemyTable
from tests.stores_postgres import ID_COLUMN, SCORE_COLUMN, _connect, create_table
from topk_middleware import private_top_k
from topk_middleware.access import ObliviousReadsSeen
from topk_middleware.accounting import PrivacyBudget

pytestmark = pytest.mark.xdist_group("statistics-channel")

K, EPSILON = 5, 1.0
STORES = ("psycopg-copy", "psycopg-live", "sqlalchemy-copy", "sqlalchemy-live", "ibis")


class Lab:
    """A schema with one table of counts (prepared in copy and live mode by the superuser) and
    a LOGIN role that may read it but not set track_counts; `close` drops both."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.schema = f"topk_statio_{uuid.uuid4().hex[:8]}"
        self.role = f"topk_statio_{uuid.uuid4().hex[:8]}"
        self.role_conninfo = psycopg.conninfo.make_conninfo(conninfo, user=self.role)
        scores = np.floor(1e4 / np.arange(1, 2001))
        with _connect(conninfo) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(self.schema)))
            create_table(conn, self.schema, "votes", scores, None)
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(self.role)))
        for mode in ("copy", "live"):
            owner = PostgresTable(conninfo, "votes", ID_COLUMN, SCORE_COLUMN, schema=self.schema)
            if mode == "live":
                owner.close()
                owner = PostgresTable(
                    conninfo, "votes", ID_COLUMN, SCORE_COLUMN, schema=self.schema, mode="live"
                )
            owner.prepare()
            owner.close()
        engine = self.engine(conninfo)
        try:  # SQLAlchemyTable's own copy and positions (its names differ from PostgresTable's)
            for mode in ("copy", "live"):
                SQLAlchemyTable(
                    engine, "votes", id=ID_COLUMN, score=SCORE_COLUMN, schema=self.schema, mode=mode
                ).prepare()
        finally:
            engine.dispose()
        self.admin = _connect(conninfo)
        for grant in (
            "GRANT USAGE ON SCHEMA {} TO {}",
            "GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}",
        ):
            self.admin.execute(
                sql.SQL(grant).format(sql.Identifier(self.schema), sql.Identifier(self.role))
            )

    @staticmethod
    def engine(conninfo: str) -> sa.Engine:
        return sa.create_engine(
            "postgresql+psycopg://", connect_args=psycopg.conninfo.conninfo_to_dict(conninfo)
        )

    def grant_track_counts(self, granted: bool) -> None:
        verb = "GRANT {} ON PARAMETER track_counts TO {}"
        if not granted:
            verb = "REVOKE {} ON PARAMETER track_counts FROM {}"
        self.admin.execute(sql.SQL(verb).format(sql.SQL("SET"), sql.Identifier(self.role)))

    def statistics(self) -> tuple[int, ...]:
        """Scans, tuples and blocks of the schema's tables, summed (what every role reads)."""
        self.admin.execute("SET stats_fetch_consistency = none")
        return tuple(
            int(v or 0)
            for v in self.admin.execute(
                "SELECT sum(t.seq_scan), sum(coalesce(t.idx_scan, 0)), sum(t.seq_tup_read), "
                "sum(coalesce(io.heap_blks_read, 0) + coalesce(io.heap_blks_hit, 0)), "
                "sum(coalesce(io.idx_blks_read, 0) + coalesce(io.idx_blks_hit, 0)) "
                "FROM pg_stat_user_tables AS t JOIN pg_statio_user_tables AS io USING (relid) "
                "WHERE t.schemaname = %s",
                [self.schema],
            ).fetchone()
        )

    def close(self) -> None:
        self.admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(self.schema)))
        self.admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(self.role)))
        self.admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(self.role)))
        self.admin.close()


@pytest.fixture(scope="module")
def lab(pg_conninfo: str) -> Iterator[Lab]:
    made = Lab(pg_conninfo)
    yield made
    made.close()


class Counted:
    """A store read as the lab's role, with every statement its connection sends counted and a
    way to flush its backend's statistics (`flush`) and to close it."""

    def __init__(self, lab: Lab, store: str) -> None:
        self.sent: list[str] = []
        self.engine: Any = None
        self.conn: Any = None
        self.source: Any = self._make(lab, store)

    def _logged(self, conninfo: str) -> psycopg.Connection[Any]:
        sent = self.sent

        class Logged(psycopg.Cursor):  # type: ignore[type-arg]
            def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
                sent.append(str(query))
                return super().execute(query, *args, **kwargs)

        class LoggedServer(psycopg.ServerCursor):  # type: ignore[type-arg]
            def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
                sent.append(str(query))
                return super().execute(query, *args, **kwargs)

        conn = psycopg.connect(conninfo, autocommit=True)
        conn.cursor_factory = Logged
        conn.server_cursor_factory = LoggedServer
        return conn

    def _make(self, lab: Lab, store: str) -> Any:
        where = {"schema": lab.schema}
        if store.startswith("psycopg"):
            self.conn = self._logged(lab.role_conninfo)
            mode = store.split("-")[1]
            return PostgresTable(self.conn, "votes", ID_COLUMN, SCORE_COLUMN, mode=mode, **where)
        if store.startswith("sqlalchemy"):
            self.engine = lab.engine(lab.role_conninfo)
            sa.event.listen(
                self.engine,
                "before_cursor_execute",
                lambda conn, cursor, statement, *rest: self.sent.append(statement),
            )
            mode = store.split("-")[1]
            return SQLAlchemyTable(
                self.engine, "votes", id=ID_COLUMN, score=SCORE_COLUMN, mode=mode, **where
            )
        ibis = pytest.importorskip("ibis")
        from adapters.ibis import IbisTable

        params = psycopg.conninfo.conninfo_to_dict(lab.role_conninfo)
        backend = ibis.postgres.connect(
            host=params.get("host"),
            port=int(params.get("port", 5432)),
            database=params.get("dbname"),
            user=lab.role,
        )
        self.conn = backend.con
        source = IbisTable(backend.table("votes", database=lab.schema), ID_COLUMN, SCORE_COLUMN)
        sent = self.sent
        factory = self.conn.cursor_factory

        class Logged(factory):  # type: ignore[misc,valid-type]
            def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
                sent.append(str(query))
                return super().execute(query, *args, **kwargs)

        self.conn.cursor_factory = Logged
        return source

    def flush(self) -> None:
        """This store's backends publish what they counted (an ended backend flushes)."""
        if self.engine is not None:
            self.engine.dispose()
        else:
            self.conn.execute("SELECT pg_stat_force_next_flush()")
        time.sleep(0.3)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.dispose()
        else:
            close = getattr(self.source, "close", None)
            if callable(close):
                close()
            self.conn.close()


@pytest.fixture
def store(lab: Lab) -> Iterator[Callable[[str], Counted]]:
    made: list[Counted] = []

    def make(kind: str) -> Counted:
        made.append(Counted(lab, kind))
        return made[-1]

    yield make
    for counted in made:
        counted.close()


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("method", ["auto", "threshold", "oneshot_full_read"])
def test_an_oblivious_release_by_a_role_that_may_not_set_track_counts_is_refused(
    lab: Lab, store: Callable[[str], Counted], kind: str, method: str
) -> None:
    """Refused in the project's words (what another role would learn, the GRANT that closes
    it, the SQL functions), before any statement reaches the server: nothing charged, and the
    schema's statistics (pg_stat_user_tables, pg_statio_user_tables) do not move."""
    counted = store(kind)
    budget = PrivacyBudget(10.0, 1e-3)
    counted.flush()
    before = lab.statistics()
    counted.sent.clear()
    with pytest.raises(ObliviousReadsSeen) as refused:
        private_top_k(counted.source, K, EPSILON, method=method, budget=budget, oblivious=True)
    message = str(refused.value)
    assert "nothing read, released or charged" in message
    assert "pg_statio_user_tables" in message and "neighbouring tables" in message
    assert f"GRANT SET ON PARAMETER track_counts TO {lab.role}" in message
    assert "SQL functions" in message and "\n" not in message
    assert counted.sent == []  # no statement: nothing read
    assert budget.releases == []  # nothing charged
    counted.flush()
    assert lab.statistics() == before
    # the adaptive release promises no obliviousness, and is not refused
    assert len(private_top_k(counted.source, K, EPSILON, budget=budget).items) == K


@pytest.mark.parametrize("kind", STORES)
def test_the_grant_lets_the_release_run_and_hides_its_reads(
    lab: Lab, store: Callable[[str], Counted], kind: str
) -> None:
    """With SET ON PARAMETER track_counts granted to the role, the oblivious release runs, is
    charged, and leaves the schema's statistics where they were (track_counts off inside)."""
    lab.grant_track_counts(True)
    try:
        counted = store(kind)  # the privilege is asked once per connection: a new one
        budget = PrivacyBudget(10.0, 1e-3)
        counted.flush()
        before = lab.statistics()
        result = private_top_k(
            counted.source, K, EPSILON, budget=budget, oblivious=True, deadline=0
        )
        assert len(result.items) == K and len(budget.releases) == 1
        counted.flush()
        assert lab.statistics() == before
    finally:
        lab.grant_track_counts(False)


@pytest.mark.parametrize("kind", STORES)
def test_an_operator_who_accepts_the_channel_gets_the_release_and_a_warning(
    lab: Lab, store: Callable[[str], Counted], kind: str
) -> None:
    """accept_statistics_channel = True: the oblivious release runs, says once that the
    statistics views show its reads, and they do."""
    counted = store(kind)
    counted.source.accept_statistics_channel = True
    counted.flush()
    before = lab.statistics()
    with pytest.warns(UserWarning, match="accept_statistics_channel is set") as said:
        private_top_k(counted.source, K, EPSILON, oblivious=True, deadline=0)
    assert f"GRANT SET ON PARAMETER track_counts TO {lab.role}" in str(said[0].message)
    counted.flush()
    assert lab.statistics() != before


def test_the_command_line_release_is_refused_in_the_same_words(
    lab: Lab, capsys: pytest.CaptureFixture[str]
) -> None:
    """`topk-middleware release` (oblivious by default) as the role: exit code 1 and the
    refusal's one line, the GRANT among it; `--adaptive` releases."""
    from frontends.cli import EXIT_FAILED, EXIT_OK, main
    from tests.frontends.test_cli import postgres_uri

    url = postgres_uri(lab.role_conninfo)
    argv = ["release", url, "--schema", lab.schema, "--table", "votes", "--id", ID_COLUMN]
    argv += ["--score", SCORE_COLUMN, "--mode", "live", "--k", str(K), "--epsilon", "1"]
    assert main(argv) == EXIT_FAILED
    err = capsys.readouterr().err
    assert "oblivious release refused (nothing read, released or charged)" in err
    assert f"GRANT SET ON PARAMETER track_counts TO {lab.role}" in err
    assert main([*argv, "--adaptive"]) == EXIT_OK
    capsys.readouterr()
