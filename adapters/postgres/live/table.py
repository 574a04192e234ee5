"""LivePostgresTable: `PostgresTable(..., mode="live")`, the Source protocol (access.py) served
from the user's table itself in each run's snapshot (the package's docstring has the design).

The table's connection is the SQL store engine's psycopg driver (adapters/sql/driver.py:
opened from a conninfo string and reconnected when lost, or the caller's); its name, columns,
record and refusals are the PostgreSQL dialect's and the engine's (adapters/dialects/postgres,
adapters/sql/checks.py), as in copy mode. What is live mode's own lies beside this module:
the position keeper (positions.py), the run's transaction and first statement (run.py), the
runs of tied scores (ties.py), draws deep in a long run (draws.py); its reads by id and by
position and its oblivious reads are the dialect's (adapters/dialects/postgres/live_reads.py).

Reads: sorted access is a server-side cursor over the (score DESC, id) B-tree joined to the
position table (FETCH FORWARD n per read, in binary for integer ids, which numpy converts in one
step; any other start falls back to OFFSET), or, where the run serves ranks, the B-tree alone
returning depths as positions; random access by position goes through the position table's
primary key and the table's id B-tree (`position = ANY(...)`), one query per batch (~20-30 us a
row at m = 10^7), or by rank through the runs of tied scores (ties.read_ranks); random access by
id is the id B-tree. Concurrent writers are never blocked and never change a run (the snapshot
sees one state of the table, its positions and its indexes).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from adapters._sql import AccessCheck, AccessPath, plain_values, rows_from_records
from adapters.contributions import parse_record
from adapters.dialects.postgres import PostgresDialect, live_reads, seq_scans
from adapters.dialects.postgres.costs import LIVE_OBLIVIOUS_COSTS, STORE_COSTS
from adapters.dialects.postgres.live_reads import (
    LiveNames,
    read_depths,
    read_each_position,
    read_top_ids,
)
from adapters.sql.checks import refuse_columns, validate
from adapters.sql.dialect import INTEGER, TEXT
from adapters.sql.driver import PsycopgDriver
from adapters.sql.whole import WholeReads
from topk_middleware.access import AccessError, Rows, RunTraits, ScoreBins, StoreCosts, StoreTraits
from topk_middleware.privacy import resolve_declared

from . import draws, positions, run, ties
from .statements import numeric_rows, sorted_live_query, sorted_ranked_query


class LivePostgresTable:
    """PostgresTable in live mode (the package's docstring); built by
    `PostgresTable(..., mode="live")`. `conninfo_or_connection` is a libpq connection string
    (this object opens and owns an autocommit connection, and reconnects it when lost) or a
    psycopg Connection not inside a transaction. `max_score_runs` and `run_count_rows` bound
    the runs of tied scores a run learns (ties.py; 0 runs: never)."""

    reads_copy = True  # the CLI prepares before a run (live mode: the positions)
    oblivious_costs = LIVE_OBLIVIOUS_COSTS  # one model: no copy
    # No in-store one-shot: its keyed noise names items by rank, which a live table does not
    # keep (None takes the method away, so it is not an InStoreOneShot and the planner knows).
    read_oneshot = None
    # A run serving ranks read its runs with m: the core takes them before any row by rank
    # (a row by rank walks its run: far dearer than the runs).
    score_runs_in_hand = True
    # The operator accepts that another role sees the blocks oblivious runs read where the
    # connection's role may not set track_counts: they run and warn instead of being refused
    # (StoreTraits.oblivious_reads_seen; docs/promise.md).
    accept_statistics_channel: bool = False

    def __init__(
        self,
        conninfo_or_connection: str | psycopg.Connection[Any],
        table: str,
        id: str = "id",
        score: str = "score",
        *,
        schema: str | None = None,
        mode: str = "live",
        sensitivity: float | None = None,
        max_items_per_client: int | None = None,
        frozen: bool = False,
        max_score_runs: int = ties.MAX_SCORE_RUNS,
        run_count_rows: int = ties.RUN_COUNT_ROWS,
    ) -> None:
        for name, value in (("max_score_runs", max_score_runs), ("run_count_rows", run_count_rows)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if not isinstance(frozen, bool):
            raise TypeError(f"frozen must be True or False, got {frozen!r}")
        resolve_declared(sensitivity, max_items_per_client, None, "PostgreSQL table")
        self.mode, self.frozen = mode, frozen
        self.max_score_runs, self.run_count_rows = max_score_runs, run_count_rows
        self.where = "PostgreSQL table " + (
            repr(table) if schema is None else f"{schema!r}.{table!r}"
        )
        self.dialect = PostgresDialect()
        self.driver = PsycopgDriver(conninfo_or_connection, self.where)
        self._run: run.LiveRun | None = None  # the run in progress, inside snapshot()
        self._whole: WholeReads | None = None  # or the small table's rows, read whole (run.py)
        self.last_m: int | None = None  # the size the last run saw (whole.alone_run)
        self._oblivious = False  # inside oblivious_reads(): no probe of the runs of ties
        self._estimate: float | None = None  # pg_stats' distinct scores, read at ...
        self._estimate_read_at: float | None = None  # ... this time.monotonic(), if read
        self._begin_pending = False  # the run's first statement begins its transaction
        self._dense_ids = False  # whether the last run's first statement found ids 0..m-1
        self._positions_unchanged = True
        self._refreshes = 0
        self.last_freshness: dict[str, Any] | None = None  # live runs read the table as it is
        try:  # every name below comes from the catalog's spelling of the table
            self.namespace, self.table = self.dialect.resolve(self.driver, table, schema)
            self.id_column, self.score_column = id, score
            self.source = self.dialect.qualified(self.namespace, self.table)
            self.id_sql, self.score_sql = self.dialect.quote(id), self.dialect.quote(score)
            self.id_info, self.score_info = refuse_columns(self)
            # The most one client moves a count, and how many it moves: declared, else what
            # from_votes recorded in the table's comment (contributions.py), else (1, None).
            record = parse_record(self.dialect.comment(self.driver, self.namespace, self.table))
            self.sensitivity, self.max_items_per_client = resolve_declared(
                sensitivity, max_items_per_client, record, self.where
            )
            self.dialect.hides_statistics(self.driver)  # asked once per connection: traits()
        except BaseException:  # refused: a connection opened here is closed, not left open
            self.driver.close()
            raise
        self.text_ids = self.id_info.kind == TEXT
        self.integer_ids = self.id_info.kind == INTEGER
        self.integer_scores = self.score_info.integer  # the noisy counts' interval
        self._base = sql.Identifier(self.table)
        if self.namespace is not None:
            self._base = sql.Identifier(self.namespace, self.table)
        self._id, self._score = sql.Identifier(id), sql.Identifier(score)
        positions.name_objects(self)
        self.names = LiveNames(  # the dialect's live reads (live_reads.py)
            self.source,
            self.dialect.qualified(self.namespace, self.position_table),
            self.id_sql,
            self.score_sql,
            self.text_ids,
            self.integer_ids,
        )

    # ----- the connection (the driver's: after a reconnect, the new one) ----------------------
    @property
    def schema(self) -> str | None:
        return self.namespace  # type: ignore[no-any-return]

    @property
    def _conn(self) -> psycopg.Connection[Any]:
        return self.driver.conn  # type: ignore[no-any-return]

    @property
    def _owns_connection(self) -> bool:
        return bool(self.driver.owns)

    @_owns_connection.setter
    def _owns_connection(self, owned: bool) -> None:
        self.driver.owns = owned

    @contextmanager
    def _reading(self) -> Iterator[psycopg.Cursor[Any]]:
        """A cursor for reads: inside the run's transaction, or a short transaction of its own."""
        if self._run is not None or self._conn.autocommit:
            with self._conn.cursor() as cur:
                yield cur
        else:
            with self._conn.transaction(), self._conn.cursor() as cur:
                yield cur

    def close(self) -> None:
        """Close the connection if this object opened it."""
        self.driver.close()

    # ----- what the store declares (access.StoreTraits, RunTraits) ----------------------------
    def traits(self) -> StoreTraits:
        """access.StoreTraits: the declared sensitivity and bound, the score column's type,
        what another role would see of an oblivious run (the dialect's oblivious_reads_seen)."""
        self.driver.ensure()  # the first step of a release: a lost connection reopened here
        return StoreTraits(
            self.sensitivity,
            self.max_items_per_client,
            self.integer_scores,
            oblivious_reads_seen=self.dialect.oblivious_reads_seen(
                self.driver, self.where, self.accept_statistics_channel
            ),
        )

    @property
    def store_costs(self) -> StoreCosts:
        """The measured costs of PostgreSQL's reads (adapters/dialects/postgres/costs.py)."""
        return STORE_COSTS

    def run_traits(self) -> RunTraits:
        """access.RunTraits: ranks where the run serves them from its runs, which it read with
        m, and the first rows its first statement fetched; a table read whole, its rows'."""
        if self._whole is not None:
            return self._whole.traits()
        return RunTraits(
            positions_are_ranks=self.positions_are_ranks,
            score_runs_in_hand=self.score_runs_in_hand,
            sorted_rows_in_hand=self.sorted_rows_in_hand,
            costs=self.store_costs,
            oblivious_costs=self.oblivious_costs,
        )

    @property
    def sorted_rows_in_hand(self) -> int:
        """access.CountedAccess: the sorted rows the run's first statement fetched (0 outside a
        run): a sorted read within them makes no round trip."""
        return 0 if self._run is None else self._run.first_rows

    @property
    def positions_are_ranks(self) -> bool:
        """Whether runs serve positions = canonical ranks: inside a run, that run's choice;
        outside, the choice a run would make now (one short snapshot)."""
        if self._whole is not None:
            return True
        if self._run is not None:
            return self._run.runs is not None
        if self.max_score_runs < 1:
            return False
        with self.snapshot():
            return self._whole is not None or self._live_state().runs is not None

    def hides_statistics(self) -> bool:
        """Whether oblivious runs keep their reads out of the statistics views any role reads
        (pg_stat_user_tables, pg_statio_user_tables): they set track_counts off for their
        transaction where the connection's role may set it (the dialect asks the server once per
        connection; a fact of the role, not of the data: docs/oblivious.md)."""
        self.driver.ensure()
        return self.dialect.hides_statistics(self.driver)

    def run_freshness(self) -> dict[str, Any] | None:
        """access.RunFreshness: a live run reads the table as it is (nothing to prove); a small
        one says it read it whole."""
        if self._whole is not None:
            return {key: v for key, v in self._whole.report.items() if key != "copy"}
        return None if self._run is None else {}

    # ----- preparation (positions.py) -------------------------------------------------------
    def validate(self) -> int:
        """Check every row (adapters/sql/checks.validate); returns m."""
        return validate(self)

    def prepare(self, refresh: bool = False) -> None:
        """Install the B-trees, the position table and its triggers if they are missing
        (idempotent; `refresh` is accepted for symmetry and changes nothing: a live table needs
        no rebuild). The table is validated first."""
        if self._run is not None or self._whole is not None:
            raise RuntimeError("prepare() cannot run inside snapshot()")
        self._estimate_read_at = self.last_m = None  # the next run reads the statistics
        self.validate()
        positions.prepare(self)

    def uninstall(self) -> None:
        """Drop everything prepare() made in this mode: the three triggers on the table, their
        function, the position table (one transaction), then the B-tree on (score DESC, id) and
        the unique B-tree on id if prepare() made it (DROP INDEX CONCURRENTLY: writers are not
        blocked). The table and its rows are not touched; an index the table had before is
        kept. Idempotent; runs need prepare() again afterwards."""
        if self._run is not None or self._whole is not None:
            raise RuntimeError("uninstall() cannot run inside snapshot()")
        positions.uninstall(self)
        self._estimate_read_at = self.last_m = None

    def is_stale(self) -> bool:
        """Never: a live run reads the table as it is."""
        return False

    def has_rank_table(self) -> bool:
        return False

    # ----- runs (run.py) --------------------------------------------------------------------
    def snapshot(self) -> AbstractContextManager[None]:
        """One REPEATABLE READ READ ONLY transaction: every read of the run sees one snapshot
        (run.py)."""
        return run.snapshot(self)

    @contextmanager
    def oblivious_reads(self) -> Iterator[None]:
        """access.ObliviousReads: runs opened inside take no runs of tied scores (their probe
        and their walks read as many rows as the data has runs; the probe's plan follows the
        number of distinct scores, which pg_stat_user_tables shows): positions come from the
        position table, read in batches of a fixed size (the dialect's live_reads.py)."""
        saved = self.max_score_runs, self._oblivious
        self.max_score_runs, self._oblivious = 0, True
        try:
            yield
        finally:
            self.max_score_runs, self._oblivious = saved

    def _end_run(self) -> Any:
        """Leave the run; its server-side cursor (or None), to be closed once the transaction
        has ended: its COMMIT closes it on the server, so psycopg sends no CLOSE (one round trip
        fewer a release)."""
        live, self._run = self._run, None
        return None if live is None else live.cursor

    def _live_state(self) -> run.LiveRun:
        if self._run is None:
            raise RuntimeError(f"{self.where}: live reads happen inside snapshot()")
        return self._run

    def domain_size(self) -> int:
        if self._whole is not None:
            return self._whole.m
        if self._run is not None:
            return self._run.m
        with self._reading() as cur:
            return run.facts_and_rows(self, cur)[0]

    def score_run_count(self) -> int | None:
        """The number of runs of tied scores a run serving ranks learnt, None otherwise
        (outside a run: what a run would learn now); None reading the table whole."""
        if self._whole is not None:
            return None
        if self._run is None:
            if self.max_score_runs < 1:
                return None
            with self.snapshot():
                return self.score_run_count()
        runs = self._run.runs
        return None if runs is None else len(runs.scores)

    # ----- the Source protocol --------------------------------------------------------------
    def read_sorted(self, start: int, count: int) -> Rows:
        if self._whole is not None:
            whole = self._whole
            start = max(0, int(start))
            return whole.read_sorted(start, max(start, min(start + int(count), whole.m)))
        live = self._live_state()
        start, stop = int(start), min(int(start) + int(count), live.m)
        if stop <= start:
            return rows_from_records([])
        if self._oblivious and live.runs is None:
            return read_depths(self.driver, self.names, live.dense, start, stop, self.where)
        drawn = [mid.first for mid in live.middles.values() if mid is not None and mid.named]
        if drawn and stop > min(drawn):
            raise AccessError(
                "sorted access after a release named items of a run by draws (draws.py)"
            )
        if live.cursor is None or live.depth != start:
            if live.cursor is not None:
                live.cursor.close()
            # integer ids come in binary and go to numpy in one step (numeric_rows)
            live.cursor = self._conn.cursor(name=run.cursor_name(self), binary=self.integer_ids)
            ranked = live.runs is not None
            query = sorted_ranked_query(self) if ranked else sorted_live_query(self)
            if start:
                query = query + sql.SQL(" OFFSET {}").format(sql.Literal(start))
            live.cursor.execute(query)
            live.depth = start
        if isinstance(live.cursor, run.DeclaredCursor):  # its first rows came with the run
            records, trips = live.cursor.fetch(stop - start)
        else:
            records, trips = live.cursor.fetchmany(stop - start), 1
        depth, live.depth = live.depth, live.depth + len(records)
        if live.runs is None:
            rows = numeric_rows(records) if self.integer_ids else rows_from_records(records)
            return rows if trips == 1 else replace(rows, round_trips=trips)
        if records:
            live.last_id = records[-1][0]
        if self.integer_ids:
            return numeric_rows(records, depth)
        ranks = range(depth, depth + len(records))
        return rows_from_records([(r, i, s) for r, (i, s) in zip(ranks, records, strict=True)])

    def read_sorted_ids(self, count: int) -> Rows:
        """access.SortedIds, in an oblivious run: the top `count` rows' ids and scores from the
        (score DESC, id) B-tree alone, without the position table (positions -1; integer ids
        packed). Outside one: read_sorted's rows (with their positions)."""
        if self._whole is not None:
            return self.read_sorted(0, count)
        live = self._live_state()
        count = min(int(count), live.m)
        if not (self._oblivious and live.runs is None):
            return self.read_sorted(0, count)
        return read_top_ids(self.driver, self.names, count, self.where)

    def read_positions(self, positions: np.ndarray) -> Rows:
        if self._whole is not None:
            return self._whole.read_positions(np.asarray(positions, dtype=np.int64))
        live = self._live_state()
        if live.runs is not None:
            return ties.read_ranks(self, live, live.runs, np.asarray(positions, dtype=np.int64))
        if self._oblivious and len(positions):
            return read_each_position(self.driver, self.names, live.dense, positions, self.where)
        return live_reads.read_positions(self.driver, self.names, positions)

    def read_ranks_exchangeable(self, ranks: np.ndarray, rng: np.random.Generator) -> Rows:
        """access.ExchangeableTies: rows for ranks beyond the fetched prefix, a rank deep in a
        long run named by a uniform draw from the run's unread middle (draws.py), the others by
        their canonical rows."""
        if self._whole is not None:
            return self.read_positions(ranks)
        live = self._live_state()
        ranks = np.asarray(ranks, dtype=np.int64)
        if live.runs is None or not len(ranks):
            return self.read_positions(ranks)
        return draws.ranks_exchangeable(self, live, ranks, rng)

    def _draw(
        self,
        live: run.LiveRun,
        runs: ties.ScoreRuns,
        index: int,
        middle: draws.Middle,
        ranks: np.ndarray,
        rng: np.random.Generator,
    ) -> dict[int, tuple[Any, float]]:
        """Name ranks of a long run's middle by uniform draws (draws.draw)."""
        return draws.draw(self, live, runs, index, middle, ranks, rng)

    def _full_runs(self, live: run.LiveRun) -> ties.ScoreRuns:
        """The run's runs of tied scores, every one sized (ties.full_runs)."""
        return ties.full_runs(self, live)

    def read_ids(self, ids: Sequence[Any]) -> np.ndarray:
        if self._whole is not None:
            return self._whole.read_ids(plain_values(ids))
        return live_reads.read_ids(self.driver, self.names, ids, self.where)

    def read_exact_scores(self, ids: Sequence[Any]) -> list[Any]:
        """access.ExactScores: the scores of the named items in the table's own type (bigint as
        Python ints, numeric as Decimals), from the table itself (or the rows read whole)."""
        if self._whole is not None:
            return self._whole.read_exact_scores(plain_values(ids))
        return self._by_id(ids, exact=True)

    def _by_id(self, ids: Sequence[Any], exact: bool = True) -> list[Any]:
        """The scores of the named items in the table's own type, by one query."""
        return live_reads.read_exact_scores(self.driver, self.names, ids, self.where)

    def read_score_histogram(self, bins: ScoreBins) -> tuple[np.ndarray, np.ndarray] | None:
        """access.ScoreHistogramRead: the scores of the table at or below `bins.top`, binned, by
        one aggregate in the run's snapshot (each bin's largest score and size; one scan). The
        run turns sequential scans off (its reads all have an index path); this one is a scan,
        which a B-tree walk made slower (4.1-4.5 s against 2.3-3.1 s for a parallel sequential
        scan at m = 10^7, load average 19), so it turns them on for its statement. A table
        read whole bins the rows in hand."""
        if self._whole is not None:
            return self._whole.read_score_histogram(bins)
        self._live_state()
        query = sql.SQL(
            "SELECT max(s), count(*) FROM (SELECT {score}::float8 AS s FROM {base}) AS t "
            "WHERE s <= %s GROUP BY {bin}"
        ).format(score=self._score, base=self._base, bin=sql.SQL(bins.sql("s")))
        with self._reading() as cur:
            was = cur.execute(
                "SELECT current_setting('enable_seqscan'), set_config('enable_seqscan', 'on', true)"
            ).fetchone()[0]
            got = cur.execute(query, [float(bins.top)]).fetchall()
            cur.execute("SELECT set_config('enable_seqscan', %s, true)", [was])
        tops = np.array([row[0] for row in got], dtype=np.float64)
        return tops, np.array([row[1] for row in got], dtype=np.int64)

    def read_score_runs(self) -> tuple[np.ndarray, np.ndarray]:
        """Every run's first rank and score: those learnt in the run's first queries, the runs
        below a gap counted now if they were not (ties.full_runs)."""
        live = self._live_state()
        if live.runs is None:
            raise AccessError("this run serves positions apart from ranks: it keeps no runs")
        runs = self._full_runs(live)
        return runs.first.copy(), runs.scores.copy()

    def read_score_runs_head(self) -> tuple[np.ndarray, np.ndarray]:
        """ScoreRuns' head (access.py): the runs learnt in the run's first queries, with no
        further round trip; past a gap, the first ranks of the runs above it and the rank where
        the others begin."""
        runs = self._live_state().runs
        if runs is None:
            raise AccessError("this run serves positions apart from ranks: it keeps no runs")
        if runs.complete:
            return runs.first.copy(), runs.scores.copy()
        return np.append(runs.first, runs.end).astype(np.int64), runs.scores.copy()

    # ----- what a run will read (EXPLAIN) -----------------------------------------------------
    def check(self) -> AccessCheck:
        """How each access kind will be served, from EXPLAIN with sequential scans disabled."""
        with self._conn.transaction(), self._conn.cursor() as cur:
            if not positions.positions_installed(self, cur):
                warnings.warn(f"{self.where}: call prepare() (mode='live')", stacklevel=2)
                return AccessCheck(
                    self.where,
                    [
                        AccessPath(a, True, "no position table: call prepare() (mode='live')")
                        for a in ("sorted", "random by position", "random by id")
                    ],
                )
            cur.execute("SET LOCAL enable_seqscan = off")
            sample = sql.SQL("SELECT {} FROM {} LIMIT 3").format(self._id, self._base)
            probes = [
                ("sorted", sorted_live_query(self) + sql.SQL(" LIMIT 100"), []),
                (
                    "random by position",
                    sql.SQL(
                        "SELECT b.{id} FROM {pos} AS p JOIN {base} AS b ON b.{id} = p.id "
                        "WHERE p.position = ANY(%s::bigint[])"
                    ).format(id=self._id, pos=self._pos, base=self._base),
                    [[1, 2, 3]],
                ),
                (
                    "random by id",
                    sql.SQL("SELECT {score} FROM {base} WHERE {id} = ANY(%s)").format(
                        score=self._score, base=self._base, id=self._id
                    ),
                    [[row[0] for row in cur.execute(sample).fetchall()]],
                ),
            ]
            paths = []
            for access, query, params in probes:
                plan = cur.execute(sql.SQL("EXPLAIN (FORMAT JSON) ") + query, params).fetchone()[0]
                scans = sorted(seq_scans(plan if isinstance(plan, list) else json.loads(plan)))
                how = f"sequential scan of {', '.join(scans)}" if scans else "index scan"
                paths.append(AccessPath(access, bool(scans), how + " (live table)"))
        return AccessCheck(self.where, paths)
