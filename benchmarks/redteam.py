"""The red team's four attacks on the real PostgreSQL, measured as a distinguisher's accuracy.

    python -m benchmarks redteam [--quick] [--trials 100] [--train 30] [--attacks cancel ...]

Each attack tells two neighbouring tables apart (benchmarks/redteam_lab.py: m = 20,000, a head
of 26 votes over a plateau; the neighbour has one client more) from what a role other than the
operator sees, in a database of its own on the server of TOPK_PG_DSN (dropped at the end):

* ``cancel``: the analyst's statement loops on the free topk.my_budget(), catching
  query_canceled, while its other session cancels it every 30 ms; then, in the same statement,
  it releases from the table and reads the release's node in EXPLAIN (ANALYZE, BUFFERS, WAL).
  Neighbours: a registered table and a copy whose head was then raised by an UPDATE (not
  vacuumed: its dead row version and a page no longer all-visible are met by the reads).
  Oblivious (the default) and adaptive releases; the control runs the oblivious attack with the
  hidden window's helpers in their PL/pgSQL forms (as on a server without topk_server).
* ``serializable``: the release called inside a SERIALIZABLE transaction; another role counts
  the SIRead locks of the analyst's backend in pg_locks by lock type. Same neighbours.
* ``statio``: a role that can read the tables releases through the Python API (PostgresTable,
  oblivious; live mode, and copy mode where the pair has written tables) and another role reads
  the scans, tuples and heap and index blocks of the schema's tables (pg_stat_user_tables,
  pg_statio_user_tables). Neighbours (redteam_lab.STATIO_PAIRS): made by an UPDATE (not
  vacuumed; vacuumed with FREEZE and INDEX_CLEANUP ON; written so that the last vote split a
  page of the score index, then vacuumed), and built afresh one client apart at the head or at
  the oblivious depth's boundary, with integer and with text ids. Roles (`--statio-roles`):
  ``reader``, without SET on track_counts, whose oblivious release is refused before anything
  is read (the observer sees what an attempt leaves: nothing); ``accepted``, the same role on a
  table that accepts the channel (accept_statistics_channel: the release runs and its blocks
  show); ``setter``, granted `SET ON PARAMETER track_counts`.
* ``planner``: the analyst sets the red team's planner settings (random_page_cost and
  cpu_index_tuple_cost 1e9, index scans and nested loops off, small work_mem, DISCARD PLANS),
  or keeps the server's, and calls the oblivious release: the call's statistics, EXPLAIN
  counters and wall time.

The distinguisher, for every attack alike: trained on `--train` observations of each table
(interleaved), it scores an observation by its nearest-mean projection (features scaled by
their spread); then `--trials` paired trials, each observing both tables in a random order and
naming the one with the higher score as the neighbour with one client more (a tie: a seeded
coin). Its accuracy is given with a Clopper-Pearson 95% interval. Target: at most 0.60 at 100
trials. Results: benchmarks/results/redteam.json (--quick: benchmarks/scratch/), with the
machine and its load; docs/promise.md shows the table.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from scipy import stats

from adapters.postgres import PostgresTable
from frontends import sql_function
from topk_middleware import private_top_k
from topk_middleware.access import ObliviousReadsSeen
from topk_middleware.mechanisms.oblivious import oblivious_depth

from . import common
from .redteam_lab import EPSILON, STATIO_PAIRS, K, Lab, M, statio_pair, updated_pair

ATTACKS = ("cancel", "serializable", "statio", "planner")
STATIO_ROLES = ("reader", "accepted", "setter")  # the statio attack's releasing roles
HOSTILE = (  # the red team's planner settings
    *("random_page_cost = 1e9", "cpu_index_tuple_cost = 1e9", "enable_indexscan = off"),
    *("enable_indexonlyscan = off", "enable_nestloop = off", "work_mem = '64kB'"),
    "effective_cache_size = '8kB'",
)
# What EXPLAIN (ANALYZE, BUFFERS, WAL) counts at a node: blocks (hit and read summed: which one a
# block is depends on the cache, not on the table), dirtied and written blocks, WAL.
EXPLAIN_SUMS = (
    ("Shared Hit Blocks", "Shared Read Blocks"),
    ("Shared Dirtied Blocks",),
    ("Shared Written Blocks",),
    ("Local Hit Blocks", "Local Read Blocks", "Temp Read Blocks", "Temp Written Blocks"),
    ("WAL Records",),
    ("WAL FPI",),
    ("WAL Bytes",),
)
XACT_STATS = (
    "SELECT coalesce(sum(seq_scan), 0), coalesce(sum(seq_tup_read), 0), "
    "coalesce(sum(idx_scan), 0), coalesce(sum(idx_tup_fetch), 0) FROM pg_stat_xact_user_tables"
)
ATTACK_FUNCTION = """
CREATE FUNCTION pg_temp.attack(seconds float8) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    caught int := 0;
    stop timestamptz := clock_timestamp() + seconds * interval '1 second';
BEGIN
    WHILE clock_timestamp() < stop LOOP
        BEGIN  -- a cancel landing between two calls is caught here
            WHILE clock_timestamp() < stop LOOP
                BEGIN
                    PERFORM * FROM topk.my_budget();
                EXCEPTION WHEN query_canceled THEN
                    caught := caught + 1;
                END;
            END LOOP;
        EXCEPTION WHEN query_canceled THEN
            caught := caught + 1;
        END;
    END LOOP;
    RAISE NOTICE 'caught %', caught;
    RETURN caught;
END $$
"""
# The loop first (a materialized CTE), then the release, whose arguments depend on the loop's
# result so that it runs after it, in the same statement: EXPLAIN reports the release's node.
ATTACK_STATEMENT = (
    "EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) "
    "WITH loop AS MATERIALIZED (SELECT pg_temp.attack(%s) AS caught) "
    "SELECT count(*) FROM loop, LATERAL topk.private_top_k(%s::regclass, {k} + 0 * loop.caught, "
    "{release}) AS r"
)


# ----- the distinguisher -----------------------------------------------------------------------
def paired_accuracy(
    observe: Callable[[int], np.ndarray], train: int, trials: int, seed: int = 0
) -> dict[str, Any]:
    """`observe(side)` (0: the table, 1: its neighbour with one client more) -> a feature vector.
    Nearest-mean scores from `train` interleaved observations of each side, then `trials` paired
    trials (module docstring): the accuracy, its Clopper-Pearson 95% interval, the sides' mean
    features and how many distinct observations each side gave."""
    rng = np.random.default_rng(seed)
    seen = [[observe(side) for side in (0, 1)] for _ in range(train)]
    low, high = (np.array([pair[i] for pair in seen]) for i in (0, 1))
    means = [low.mean(axis=0), high.mean(axis=0)]
    spread = np.vstack([low, high]).std(axis=0) + 1e-12
    weights = (means[1] - means[0]) / spread**2  # a feature whose means agree weighs 0
    right, ties, observed = 0, 0, [list(low), list(high)]
    for _ in range(trials):
        first = int(rng.integers(2))
        pair = {first: observe(first)}
        pair[1 - first] = observe(1 - first)
        observed[0].append(pair[0])
        observed[1].append(pair[1])
        gap = float(weights @ (pair[1] - pair[0]))
        if abs(gap) <= 1e-9 * (1.0 + float(np.abs(weights).sum())):
            ties += 1
            right += int(rng.integers(2))
        else:
            right += int(gap > 0)
    interval = stats.binomtest(right, trials).proportion_ci(0.95, method="exact")
    return {
        "accuracy": right / trials,
        "correct": right,
        "trials": trials,
        "train": train,
        "ties": ties,
        "ci95": [float(interval.low), float(interval.high)],
        "mean_features": [m.tolist() for m in means],
        "distinct_observations": [len({tuple(np.round(x, 9)) for x in side}) for side in observed],
    }


# ----- the attacks -----------------------------------------------------------------------------
def explain_counters(node: dict[str, Any]) -> list[float]:
    """EXPLAIN_SUMS of a plan node."""
    return [sum(float(node.get(key, 0)) for key in keys) for keys in EXPLAIN_SUMS]


def release_node(node: dict[str, Any]) -> dict[str, Any]:
    """The plan node of the call of topk.private_top_k in an EXPLAIN (FORMAT JSON) tree."""
    if node.get("Function Name") == "private_top_k":
        return node
    for child in node.get("Plans", ()):
        found = release_node(child)
        if found:
            return found
    return {}


def cancel_attack(
    lab: Lab, tables: tuple[str, str], release: str, seconds: float
) -> Callable[[int], np.ndarray]:
    """ATTACK_STATEMENT on tables[side], the loop cancelled every 30 ms by the analyst's other
    session for all of it but its last 0.2 s (a statement a late cancel cut off is run again):
    the EXPLAIN counters of the release's node."""
    conn = lab.connect("analyst")
    canceller = lab.connect("analyst")
    conn.execute(ATTACK_FUNCTION)
    caught: list[int] = []  # cancels caught per statement (its notice)
    conn.add_notice_handler(lambda d: caught.append(int((d.message_primary or "0").split()[-1])))
    pid = conn.info.backend_pid
    query = ATTACK_STATEMENT.format(k=K, release=release)
    for table in tables:  # the session's first calls load the project and the catalog
        conn.execute(query, [0.2, table])
    caught.clear()

    def observe(side: int) -> np.ndarray:
        # Again where a cancel delivered after the loop ended cut the release, and where no
        # cancel reached the loop (a loaded machine's canceller late): a trial is an attack.
        for _ in range(10):
            try:
                plan = attacked(tables[side])
            except psycopg.errors.QueryCanceled:
                continue
            if caught and caught[-1] == 0:
                caught.pop()
                continue
            break
        else:
            raise AssertionError("ten attack statements in a row cut off or never cancelled")
        node = release_node(plan[0]["Plan"])
        assert node, "no release node in the plan"
        return np.array(explain_counters(node))

    def attacked(table: str) -> Any:
        done = threading.Event()

        def cancel() -> None:
            while not done.wait(0.03):
                canceller.execute("SELECT pg_cancel_backend(%s)", [pid])

        thread = threading.Thread(target=cancel)
        timer = threading.Timer(seconds - 0.2, done.set)
        thread.start()
        timer.start()
        try:
            return conn.execute(query, [seconds, table]).fetchone()[0]
        finally:
            done.set()
            thread.join()
            timer.join()

    observe.caught = caught  # type: ignore[attr-defined]
    return observe


def serializable_attack(lab: Lab, tables: tuple[str, str]) -> Callable[[int], np.ndarray]:
    """The release called inside a SERIALIZABLE transaction; the observer counts the SIRead
    locks of the analyst's backend by lock type (relation, page, tuple) while it is open."""
    conn = lab.connect("analyst")
    watcher = lab.connect("observer")
    pid = conn.info.backend_pid
    count = (
        "SELECT count(*) FILTER (WHERE locktype = 'relation'), count(*) FILTER (WHERE locktype = "
        "'page'), count(*) FILTER (WHERE locktype = 'tuple') FROM pg_locks WHERE pid = %s AND "
        "mode = 'SIReadLock'"
    )

    def observe(side: int) -> np.ndarray:
        conn.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        try:
            conn.execute(
                "SELECT * FROM topk.private_top_k(%s::regclass, %s, %s)", [tables[side], K, EPSILON]
            ).fetchall()
            refused = 0.0
        except psycopg.errors.FeatureNotSupported:
            refused = 1.0
        locks = watcher.execute(count, [pid]).fetchone()
        conn.execute("ROLLBACK")
        return np.array([*map(float, locks), refused])

    return observe


STATISTICS = ("seq_scan", "seq_tup_read", "idx_scan", "idx_tup_fetch", "heap", "idx", "toast")


def statistics_names(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    """What statistics_of returns, as <table>.<counter> (blocks: hit and read summed)."""
    tables = conn.execute(
        "SELECT relname FROM pg_stat_user_tables WHERE schemaname = %s ORDER BY relname", [schema]
    ).fetchall()
    return [f"{table}.{name}" for (table,) in tables for name in STATISTICS]


def statistics_of(conn: psycopg.Connection[Any], schema: str) -> np.ndarray:
    """Scans, tuples, heap, index and TOAST blocks of every table of `schema`, in name order."""
    rows = conn.execute(
        "SELECT t.seq_scan, t.seq_tup_read, coalesce(t.idx_scan, 0), coalesce(t.idx_tup_fetch, 0), "
        "coalesce(io.heap_blks_read, 0) + coalesce(io.heap_blks_hit, 0), "
        "coalesce(io.idx_blks_read, 0) + coalesce(io.idx_blks_hit, 0), "
        "coalesce(io.toast_blks_read, 0) + coalesce(io.toast_blks_hit, 0) "
        "+ coalesce(io.tidx_blks_read, 0) + coalesce(io.tidx_blks_hit, 0) "
        "FROM pg_stat_user_tables AS t JOIN pg_statio_user_tables AS io USING (relid) "
        "WHERE t.schemaname = %s ORDER BY t.relname",
        [schema],
    ).fetchall()
    return np.array(rows, dtype=float).ravel()


def settled(watcher: psycopg.Connection[Any], schema: str, before: np.ndarray) -> np.ndarray:
    """The schema's statistics once a flush has reached them: read until they differ from
    `before` and two reads 0.05 s apart agree, or for 0.25 s where they do not change (the
    release's backend flushes them as its pg_stat_force_next_flush() returns)."""
    deadline, last = time.monotonic() + 0.25, before
    while True:
        time.sleep(0.05)
        now = statistics_of(watcher, schema)
        if np.array_equal(now, last) and (
            not np.array_equal(now, before) or time.monotonic() > deadline
        ):
            return now
        last = now


def statio_attack(
    lab: Lab, schemas: tuple[str, str], role: str, mode: str
) -> Callable[[int], np.ndarray]:
    """An oblivious Python-API release of schemas[side].votes (`mode`) by `role` (STATIO_ROLES:
    "accepted" is the reader on a table that accepts the statistics channel); the change of the
    schema's statistics (statistics_of) the observer reads once they are flushed. The reader's
    releases are refused before anything is read: each attempt is checked to be refused, and
    what the observer reads is what it left. `observe.refused` counts the refusals;
    `observe.close()` ends the attack's sessions."""
    watcher = lab.connect("observer")
    watcher.execute("SET stats_fetch_consistency = none")
    sources = []
    refused = [0]

    def release(source: PostgresTable, seed: int) -> None:
        try:
            private_top_k(source, K, EPSILON, oblivious=True, seed=seed, deadline=0)
        except ObliviousReadsSeen:
            assert role == "reader"
            refused[0] += 1
        else:
            assert role != "reader", "a reader's oblivious release ran"

    sessions = [watcher]
    for schema in schemas:
        conn = lab.connect("setter" if role == "setter" else "reader")
        sessions.append(conn)
        source = PostgresTable(conn, "votes", "id", "score", schema=schema, mode=mode)
        assert source.hides_statistics() == (role == "setter")
        source.accept_statistics_channel = role == "accepted"
        before = statistics_of(watcher, schema)
        release(source, 0)  # the metapages
        conn.execute("SELECT pg_stat_force_next_flush()")
        settled(watcher, schema, before)
        sources.append((conn, source))
    seeds = iter(range(1, 1 << 30))

    def observe(side: int) -> np.ndarray:
        conn, source = sources[side]
        before = statistics_of(watcher, schemas[side])
        release(source, next(seeds))
        conn.execute("SELECT pg_stat_force_next_flush()")
        return settled(watcher, schemas[side], before) - before

    observe.refused = refused  # type: ignore[attr-defined]
    observe.close = lambda: [s.close() for s in sessions]  # type: ignore[attr-defined]
    return observe


def planner_attack(lab: Lab, tables: tuple[str, str], hostile: bool) -> Callable[[int], np.ndarray]:
    """The oblivious release called under the red team's planner settings (or the server's):
    its statistics, EXPLAIN counters and wall time, in one transaction rolled back."""
    conn = lab.connect("analyst")
    if hostile:
        for setting in HOSTILE:
            conn.execute(f"SET {setting}")
        conn.execute("DISCARD PLANS")
    call = (
        "EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) "
        f"SELECT * FROM topk.private_top_k(%s::regclass, {K}, {EPSILON})"
    )
    for table in tables:
        conn.execute(call, [table])

    def observe(side: int) -> np.ndarray:
        with conn.transaction(force_rollback=True):
            before = np.array(conn.execute(XACT_STATS).fetchone(), dtype=float)
            started = time.perf_counter()
            plan = conn.execute(call, [tables[side]]).fetchone()[0]
            seconds = time.perf_counter() - started
            after = np.array(conn.execute(XACT_STATS).fetchone(), dtype=float)
        return np.array([*(after - before), *explain_counters(plan[0]["Plan"]), seconds])

    return observe


@contextmanager
def without_the_library(lab: Lab) -> Iterator[None]:
    """The hidden window's helpers in their PL/pgSQL forms of install.sql (they do nothing, as
    on a server without the library topk_server), then the library's C forms again."""
    text = resources.files("frontends").joinpath("sql/install.sql").read_text(encoding="utf-8")
    for name in ("_hide_io_begin", "_hide_io_end"):
        start = text.index(f"CREATE OR REPLACE FUNCTION topk.{name}()")
        lab.admin.execute(text[start : text.index("$$;", start) + 3])
    try:
        yield
    finally:
        assert sql_function._install_native(lab.admin)[0]


# ----- the run ---------------------------------------------------------------------------------
def measure(
    name: str, observe: Callable[[int], np.ndarray], args: argparse.Namespace, **facts: Any
) -> dict[str, Any]:
    started = time.perf_counter()
    got = paired_accuracy(observe, args.train, args.trials, args.seed)
    caught = getattr(observe, "caught", None)
    if caught:  # the cancel attack: how many cancels each statement caught
        facts["cancels_caught"] = {"min": min(caught), "median": float(np.median(caught))}
    refused = getattr(observe, "refused", None)
    if refused is not None:  # the statio attack: releases refused, of all attempted
        facts["refused"] = refused[0]
    got.update(
        facts,
        attack=name,
        seconds=time.perf_counter() - started,
        load_average=list(os.getloadavg()),
    )
    if not args.quiet:
        low, high = got["ci95"]
        shown = {k: v for k, v in facts.items() if k != "features"}
        print(
            f"{name} {shown}: accuracy {got['accuracy']:.2f} [{low:.2f}, {high:.2f}] "
            f"({got['seconds']:.0f} s)",
            flush=True,
        )
    return got


def cases(lab: Lab, args: argparse.Namespace) -> Iterator[tuple[str, Any, dict[str, Any]]]:
    """(attack, its observe function, what it ran on) for each measurement asked for."""
    oblivious, adaptive = f"{EPSILON}", f"{EPSILON}, 0, 'gumbel', false"
    needed = {"cancel", "serializable", "planner"} & set(args.attacks)
    pair = updated_pair(lab) if needed else ("", "")
    updated = {"pair": "head, updated"}
    if "cancel" in args.attacks:
        for mode, release in (("oblivious", oblivious), ("adaptive", adaptive)):
            observe = cancel_attack(lab, pair, release, args.cancel_seconds)
            yield "cancel", observe, {**updated, "mode": mode, "library": True}
        with without_the_library(lab):
            observe = cancel_attack(lab, pair, oblivious, args.cancel_seconds)
            yield "cancel", observe, {**updated, "mode": "oblivious", "library": False}
    if "serializable" in args.attacks:
        yield "serializable", serializable_attack(lab, pair), {**updated, "mode": "oblivious"}
    if "planner" in args.attacks:
        for hostile in (False, True):
            observe = planner_attack(lab, pair, hostile)
            yield "planner", observe, {**updated, "mode": "oblivious", "hostile": hostile}
    if "statio" in args.attacks:
        for kind, where, ids, state in STATIO_PAIRS:
            copy = state in ("vacuumed", "split") or "long" in ids
            for mode in ("live", "copy") if copy else ("live",):
                schemas = statio_pair(lab, where, ids, state, mode)
                for role in args.statio_roles:
                    observe = statio_attack(lab, schemas, role, mode)
                    facts = {"pair": kind, "mode": mode, "settable": role == "setter"}
                    facts["role"] = role
                    facts["features"] = statistics_names(lab.admin, schemas[0])
                    yield "statio", observe, facts
                    observe.close()  # type: ignore[attr-defined]


def run(args: argparse.Namespace) -> Path:
    lab = Lab(args.dsn)
    try:
        points = [
            measure(name, observe, args, **facts) for name, observe, facts in cases(lab, args)
        ]
    finally:
        lab.close()
    payload = {
        "machine": common.machine_info(args.dsn),
        "m": M,
        "k": K,
        "epsilon": EPSILON,
        "oblivious_depth": oblivious_depth(M, K, 1e-9),
        "target": {"accuracy_at_most": 0.60, "trials": 100},
        "points": points,
    }
    out = Path(args.out) if args.out else (common.SCRATCH_DIR if args.quick else common.RESULTS_DIR)
    return common.write_json(out / f"{args.name or 'redteam'}.json", payload)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dsn", default=os.environ.get("TOPK_PG_DSN", common.DEFAULT_PG_DSN))
    parser.add_argument("--quick", action="store_true", help="20 trials, 8 training each")
    parser.add_argument("--trials", type=int, default=None, help="paired trials (default 100)")
    parser.add_argument(
        "--train", type=int, default=None, help="training observations per side (default 30)"
    )
    parser.add_argument("--attacks", nargs="+", choices=ATTACKS, default=list(ATTACKS))
    parser.add_argument(
        "--cancel-seconds", type=float, default=0.5, help="each cancel attack's loop"
    )
    parser.add_argument(
        "--statio-roles",
        nargs="+",
        choices=STATIO_ROLES,
        default=list(STATIO_ROLES),
        help="the statio attack's releasing roles: a reader (refused), the reader on a table "
        "that accepts the channel, a role granted SET on track_counts",
    )


def configure(args: argparse.Namespace) -> argparse.Namespace:
    args.trials = args.trials or (20 if args.quick else 100)
    args.train = args.train or (8 if args.quick else 30)
    return args


__all__ = [
    "ATTACKS",
    "STATIO_PAIRS",
    "STATIO_ROLES",
    "add_arguments",
    "configure",
    "paired_accuracy",
    "run",
]
