"""Freshness benchmark: releases on a table that changes, against the store's own one-shot query.

The default (`python -m benchmarks freshness`, `freshness_rounds.json`): for each
family of ROUND_FAMILIES (zipf, plateau, distinct, uniform, sparse, band) a DuckDB table of m
rows (default 10^7) in random row order, with k = 10 and epsilon = 1:

1. a frozen copy (`frozen=True`, prepared) released against DuckDB's own one-shot query
   ``SELECT id FROM t ORDER BY score - b*ln(-ln(random())) DESC LIMIT k`` (b the release's
   Gumbel scale), interleaved, before any write;
2. `--rounds` rounds (3), each after `--writes-per-round` transactions (1) that move the counts
   of 1% of the items by 1 to 3; the copy's pending delta grows round by round. Each round
   interleaves, rep by rep: the store's query; the default release (`auto`, not frozen: the
   table read as it is now); and the frozen alternative, `refresh()` then a release on the copy
   and its delta (timed whole and in parts; `auto` there chooses between the threshold run on
   the copy and the in-store one-shot on the table).

PostgreSQL's live mode (`--postgres-families`, zipf by default) gets the same rounds. Every ratio
is the store's query's median over the release's median in the same run: above 1 the release
is faster. Targets (at 10^7): DuckDB after writes >= 1x on every family, a frozen copy
>= 30x on zipf, PostgreSQL live zipf >= 300x. `--quick`: m = 10^5, 3 reps, 2 rounds, into
benchmarks/scratch/.

`--first-release` (`freshness.json`): for each store entry (`STORES`: DuckDB's refresh
by delta, PostgreSQL's live mode), each m (10^6, 10^7) and each family (zipf, plateau) it loads
a table (id BIGINT, score BIGINT) with shuffled ids and prepares it, then:

1. ``release_before``: private_top_k(method="threshold") on the freshly prepared table (today's
   rank-table run, before any write);
2. writes: 1% of the items, chosen at random, get their count moved up or down by 1 to 3 (never
   below 0), in one transaction; then today's path on the new counts is built beside (a second
   rank-ordered copy by a full sort: ``full_rebuild_seconds``);
3. interleaved rep by rep: ``fresh_release`` (a): what the store needs to see the writes (DuckDB:
   `refresh()`, the delta refresh) plus the release, end to end; ``oneshot_sql`` (b): the
   store's own one-shot query on the written table; ``release_unchanged``: a release with no
   write since the last refresh (DuckDB: the run reads the base and the pending delta);
   ``release_today``: today's rank-table run on the same counts (the second copy);
4. the parts of (a): the refresh alone and the release alone.

Targets: DuckDB at 10^7, (a) <= 2x (b); a release on unchanged data <= 1.5x today's
rank-table run (release_unchanged / release_today, interleaved). `--fold-sweep`: what a delta of
each size costs against a full rebuild (the fold fraction, adapters/duckdb_delta.py).

Size: one module per benchmark command (benchmarks/__main__.py); the write rounds, the
single-write run and the fold-fraction sweep share the store entries, the write batches, the
interleaved timing, the report and the command line, so they stay together.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import common
from .wallclock import DuckDBStore, PostgresStore, _time, gumbel_scale, table_name

CHANGED_FRACTION = 0.01  # of the items, written between the preparation and the fresh release
MAX_STEP = 3  # each written count moves by 1..MAX_STEP, up or down
TARGET_M = 10**7
TARGET_FRESH_VS_SQL = 2.0  # (a) / (b) at most: DuckDB, which must refresh
# PostgreSQL's live mode needs no refresh: (a) at most this fraction of (b), per family
TARGET_FRESH_VS_SQL_LIVE = {"zipf": 0.01, "plateau": 0.1}  # >= 100x and >= 10x faster


def fresh_target(store: str, family: str) -> float:
    """The largest (a) / (b) the issue's targets allow for this store and family."""
    if store.startswith("postgres-live"):
        return TARGET_FRESH_VS_SQL_LIVE.get(family, TARGET_FRESH_VS_SQL)
    return TARGET_FRESH_VS_SQL


TARGET_UNCHANGED_VS_TODAY = 1.5  # release_unchanged / release_today at most


# ----- store entries -------------------------------------------------------------------------
class DuckDBEntry:
    """DuckDB: a rank-ordered base, a refresh by delta after writes (adapters/duckdb_delta.py)."""

    name = "duckdb"

    def __init__(self, workdir: Path) -> None:
        self.store = DuckDBStore(workdir / "freshness.duckdb")
        self.source: Any = None
        self.reference: Any = None

    def version(self) -> str:
        return self.store.version()

    def load(self, table: str, ids: np.ndarray, scores: np.ndarray) -> None:
        self.store.load(table, ids, scores)

    def prepare(self, table: str) -> None:
        from adapters.duckdb import DuckDBTable

        # frozen: this entry refreshes the copy itself before each release (the delta path)
        self.source = DuckDBTable(self.store.con, table, frozen=True)
        self.source.prepare(refresh=True, full=True)

    def write(self, table: str, ids: np.ndarray, steps: np.ndarray) -> int:
        """Move the counts of `ids` by `steps` (never below 0) in one transaction; returns how
        many rows changed."""
        con = self.store.con
        changes = {"id": ids, "step": steps}  # noqa: F841 (scanned by name)
        con.execute("BEGIN TRANSACTION")
        before = con.execute(
            f"SELECT count(*) FROM {table} AS t JOIN changes AS c ON t.id = c.id "
            "WHERE greatest(t.score + c.step, 0) <> t.score"
        ).fetchone()[0]
        con.execute(
            f"UPDATE {table} SET score = greatest({table}.score + c.step, 0) FROM changes AS c "
            f"WHERE {table}.id = c.id"
        )
        con.execute("COMMIT")
        return int(before)

    def fold(self) -> None:
        """Rebuild the rank-ordered copy by a full sort (today's refresh)."""
        self.source.prepare(refresh=True, full=True)

    def prepare_reference(self, table: str) -> None:
        """Today's path on the current counts, to compare with: a second rank-ordered copy of
        the table, built by a full sort (`self.reference`)."""
        from adapters.duckdb import DuckDBTable

        self.reference = DuckDBTable(
            self.store.con, table, rank_table=f"{table}_today_rank", frozen=True
        )
        self.reference.prepare(refresh=True, full=True)

    def refresh(self) -> dict[str, Any]:
        report = self.source.refresh()
        return {
            "kind": report.kind,
            "changed": report.changed,
            "delta_rows": report.delta_rows,
            "skip_rows": report.skip_rows,
            "mismatched_rows": report.mismatched_rows,
            "table_reads": report.table_reads,
        }

    def oneshot_sql(self, table: str, k: int, scale: float) -> Callable[[], list[Any]]:
        return self.store.oneshot_sql(table, k, scale)

    def drop(self, table: str) -> None:
        self.store.con.execute(f"DROP TABLE IF EXISTS {table}")
        for source in (self.source, self.reference):
            if source is not None:
                for name in ("rank_table", "runs_table", "shadow_table", "delta_table"):
                    self.store.con.execute(f'DROP TABLE IF EXISTS "{getattr(source, name)}"')
                self.store.con.execute(f'DROP TABLE IF EXISTS "{source.skip_table}"')
        self.source = self.reference = None

    def close(self) -> None:
        self.store.close()


class PostgresLiveEntry:
    """PostgreSQL: `PostgresTable(mode="live")` reads the table itself, so a fresh release needs
    no refresh at all. The reference, today's path, is `mode="copy"`: a rank table built by
    `prepare()` on the current counts."""

    name = "postgres-live"

    def __init__(self, workdir: Path) -> None:
        self.store = PostgresStore(os.environ.get("TOPK_PG_DSN", common.DEFAULT_PG_DSN))
        self.source: Any = None
        self.reference: Any = None

    def version(self) -> str:
        return self.store.version()

    def load(self, table: str, ids: np.ndarray, scores: np.ndarray) -> None:
        self.store.con.execute(f"DROP TABLE IF EXISTS {table}_topk_pos")
        self.store.load(table, ids, scores)
        self.store.con.execute(f"ALTER TABLE {table} ADD PRIMARY KEY (id)")

    def prepare(self, table: str) -> None:
        from adapters.postgres import PostgresTable

        self.source = PostgresTable(self.store.dsn, table, mode="live")
        self.source.prepare()

    def write(self, table: str, ids: np.ndarray, steps: np.ndarray) -> int:
        """Move the counts of `ids` by `steps` (never below 0) in one transaction; returns how
        many rows changed."""
        with self.store.con.transaction():
            cur = self.store.con.execute(
                f"UPDATE {table} AS t SET score = greatest(t.score + c.step, 0) "
                "FROM unnest(%s::bigint[], %s::bigint[]) AS c(id, step) "
                "WHERE t.id = c.id AND greatest(t.score + c.step, 0) <> t.score",
                [ids.tolist(), steps.tolist()],
            )
            return int(cur.rowcount)

    def prepare_reference(self, table: str) -> None:
        """Today's path on the current counts: the rank table of mode="copy"."""
        from adapters.postgres import PostgresTable

        self.reference = PostgresTable(self.store.dsn, table)
        self.reference.prepare(refresh=True)

    def refresh(self) -> dict[str, Any]:
        return {"kind": "none: a live table is read as it is"}

    def oneshot_sql(self, table: str, k: int, scale: float) -> Callable[[], list[Any]]:
        return self.store.oneshot_sql(table, k, scale)

    def drop(self, table: str) -> None:
        con = self.store.con
        con.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
        con.execute(f"DROP TABLE IF EXISTS {table}_topk_pos")
        if self.source is not None:
            con.execute(f'DROP FUNCTION IF EXISTS "{self.source.trigger_function}"()')
            self.source.close()
        if self.reference is not None:
            for name in (self.reference.rank_table, self.reference.runs_table):
                con.execute(f'DROP TABLE IF EXISTS "{name}"')
            self.reference.close()
        self.source = self.reference = None

    def close(self) -> None:
        self.store.close()


class PostgresLivePositionsEntry(PostgresLiveEntry):
    """PostgresTable(mode="live", max_score_runs=0): runs of tied scores off, every run names
    items by the position table (the default `postgres-live` learns few runs and serves ranks)."""

    name = "postgres-live-positions"

    def prepare(self, table: str) -> None:
        from adapters.postgres import PostgresTable

        self.source = PostgresTable(self.store.dsn, table, mode="live", max_score_runs=0)
        self.source.prepare()


STORES: dict[str, Callable[[Path], Any]] = {
    "duckdb": DuckDBEntry,
    "postgres-live": PostgresLiveEntry,
    "postgres-live-positions": PostgresLivePositionsEntry,
}


# ----- the benchmark -------------------------------------------------------------------------
@dataclass
class FreshnessConfig:
    stores: tuple[str, ...] = ("duckdb", "postgres-live")
    ms: tuple[int, ...] = (10**6, 10**7)
    families: tuple[str, ...] = ("zipf", "plateau")
    k: int = 10
    epsilon: float = 1.0
    reps: int = 5
    reps_large: int = 3  # at m >= 10^7
    seed: int = 0
    out: Path = common.RESULTS_DIR
    name: str = "freshness"
    plots: bool = True
    quiet: bool = False


def _summary(values: list[float]) -> dict[str, Any]:
    return {"seconds": values, "median": statistics.median(values), "min": min(values)}


def bench_table(cfg: FreshnessConfig, entry: Any, family: str, m: int, oracle: str) -> dict:
    from topk_middleware import private_top_k

    table = table_name(family, m)
    scores = common.family_scores(family, m, cfg.k)
    ids = common.shuffled_ids(m, seed=cfg.seed)
    start = time.perf_counter()
    entry.load(table, ids, scores)
    load_seconds = time.perf_counter() - start
    prepare_seconds, _ = _time(lambda: entry.prepare(table))
    scale = gumbel_scale(cfg.k, cfg.epsilon, m)
    reps = cfg.reps_large if m >= 10**7 else cfg.reps
    seeds = iter(range(cfg.seed + 1, cfg.seed + 10**6))

    def release(source: Any = None) -> Any:
        return private_top_k(
            source or entry.source, k=cfg.k, epsilon=cfg.epsilon, seed=next(seeds), oracle=oracle
        )

    release()  # warm-up
    before = [_time(release)[0] for _ in range(reps)]
    rng = np.random.default_rng(cfg.seed + m)
    chosen = rng.choice(m, size=max(1, int(CHANGED_FRACTION * m)), replace=False)
    steps = rng.integers(1, MAX_STEP + 1, size=len(chosen)) * rng.choice([-1, 1], len(chosen))
    written = ids[chosen]
    del scores, ids
    write_seconds, changed_rows = _time(lambda: entry.write(table, written, steps))
    rebuild_seconds, _ = _time(lambda: entry.prepare_reference(table))
    release(entry.reference)  # warm-up
    oneshot = entry.oneshot_sql(table, cfg.k, scale)
    oneshot()  # warm-up
    fresh: list[float] = []
    refresh_parts: list[float] = []
    release_parts: list[float] = []
    sql: list[float] = []
    unchanged: list[float] = []
    today: list[float] = []
    refresh_info: dict[str, Any] = {}
    accesses: dict[str, Any] = {}
    for _ in range(reps):
        start = time.perf_counter()
        refresh_info = entry.refresh()
        middle = time.perf_counter()
        result = release()
        end = time.perf_counter()
        fresh.append(end - start)
        refresh_parts.append(middle - start)
        release_parts.append(end - middle)
        sql.append(_time(oneshot)[0])
        seconds, result = _time(release)
        unchanged.append(seconds)
        accesses = {"total": result.accesses.total, "rows_fetched": result.accesses.rows_fetched}
        today.append(_time(lambda: release(entry.reference))[0])
    out = {
        "store": entry.name,
        "family": family,
        "m": m,
        "k": cfg.k,
        "epsilon": cfg.epsilon,
        "reps": reps,
        "load_seconds": load_seconds,
        "prepare_seconds": prepare_seconds,
        "write_seconds": write_seconds,
        "items_written": len(chosen),
        "rows_changed": changed_rows,
        "refresh": refresh_info,
        "full_rebuild_seconds": rebuild_seconds,
        "oneshot_sql_query": (
            f"SELECT id FROM {table} ORDER BY score - {scale!r} * ln(-ln(random())) DESC "
            f"LIMIT {cfg.k}"
        ),
        "methods": {
            "release_before": _summary(before),
            "fresh_release": _summary(fresh),
            "refresh_part": _summary(refresh_parts),
            "release_part": _summary(release_parts),
            "oneshot_sql": _summary(sql),
            "release_unchanged": _summary(unchanged),
            "release_today": _summary(today),
        },
        "release_unchanged_accesses": accesses,
    }
    med = {name: v["median"] for name, v in out["methods"].items()}
    out["ratios"] = {
        "fresh_vs_oneshot_sql": med["fresh_release"] / med["oneshot_sql"],
        "unchanged_vs_today": med["release_unchanged"] / med["release_today"],
    }
    entry.drop(table)
    return out


def run(cfg: FreshnessConfig) -> dict[str, Any]:
    """Every store entry, size and family; writes <out>/<name>.json and a PNG."""
    oracle = common.best_oracle()
    info = common.machine_info(None)
    workdir = Path(tempfile.mkdtemp(prefix="topk_freshness_"))
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    versions: dict[str, str] = {}
    try:
        for store in cfg.stores:
            entry = STORES[store](workdir)
            versions[store] = entry.version()
            try:
                plan = [(f, m) for m in cfg.ms for f in cfg.families]
                for family, m in common.progress(plan, desc=store, quiet=cfg.quiet):
                    results.append(bench_table(cfg, entry, family, m, oracle))
            finally:
                entry.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    targets = []
    for e in results:
        if e["m"] != TARGET_M:
            continue
        r = e["ratios"]
        targets.append(
            {
                "store": e["store"],
                "family": e["family"],
                "fresh_vs_oneshot_sql": r["fresh_vs_oneshot_sql"],
                "fresh_target": fresh_target(e["store"], e["family"]),
                "fresh_met": r["fresh_vs_oneshot_sql"] <= fresh_target(e["store"], e["family"]),
                "unchanged_vs_today": r["unchanged_vs_today"],
                "unchanged_met": r["unchanged_vs_today"] <= TARGET_UNCHANGED_VS_TODAY,
            }
        )
    payload = {
        "benchmark": "freshness",
        "machine": {**info, "store_versions": versions},
        "config": {
            **{k: v for k, v in asdict(cfg).items() if k != "out"},
            "oracle": oracle,
            "changed_fraction": CHANGED_FRACTION,
            "max_step": MAX_STEP,
        },
        "elapsed_seconds": time.perf_counter() - started,
        "results": results,
        "targets": targets,
    }
    cfg.out.mkdir(parents=True, exist_ok=True)
    path = common.write_json(cfg.out / f"{cfg.name}.json", payload)
    payload["files"] = [str(path)]
    if cfg.plots and results:
        payload["files"].append(str(plot(payload, cfg.out, cfg.name)))
    return payload


# ----- the fold fraction ---------------------------------------------------------------------
FOLD_SWEEP = (0.01, 0.02, 0.05, 0.1, 0.2)  # fractions of m changed since the base


def fold_sweep(cfg: FreshnessConfig) -> dict[str, Any]:
    """What a delta of a given size costs (refresh, and a release reading it) against a full
    rebuild, to choose the fold fraction: for each size and family, writes reach each fraction
    of FOLD_SWEEP in turn (distinct random items, cumulative; the delta never folds here)."""
    from topk_middleware import private_top_k

    oracle = common.best_oracle()
    info = common.machine_info(None)
    workdir = Path(tempfile.mkdtemp(prefix="topk_freshness_"))
    results = []
    try:
        entry = DuckDBEntry(workdir)
        try:
            for m in cfg.ms:
                for family in cfg.families:
                    table = table_name(family, m)
                    scores = common.family_scores(family, m, cfg.k)
                    ids = common.shuffled_ids(m, seed=cfg.seed)
                    entry.load(table, ids, scores)
                    entry.prepare(table)
                    entry.source.fold_fraction = 1.0
                    seeds = iter(range(cfg.seed + 1, cfg.seed + 10**6))

                    def release(seeds: Any = seeds) -> Any:
                        return private_top_k(
                            entry.source,
                            k=cfg.k,
                            epsilon=cfg.epsilon,
                            seed=next(seeds),
                            oracle=oracle,
                        )

                    rng = np.random.default_rng(cfg.seed + m)
                    order = rng.permutation(m)
                    done = 0
                    points = []
                    for fraction in FOLD_SWEEP:
                        upto = int(fraction * m)
                        chunk = order[done:upto]
                        steps = rng.integers(1, MAX_STEP + 1, len(chunk)) * rng.choice(
                            [-1, 1], len(chunk)
                        )
                        entry.write(table, ids[chunk], steps)
                        done = upto
                        refresh = [_time(entry.refresh) for _ in range(2)]
                        release()
                        runs = [_time(release)[0] for _ in range(3)]
                        points.append(
                            {
                                "items_written_fraction": fraction,
                                "delta_rows": refresh[-1][1]["delta_rows"],
                                "refresh_seconds": statistics.median(t for t, _ in refresh),
                                "release_seconds": statistics.median(runs),
                            }
                        )
                    rebuild, _ = _time(entry.fold)
                    release()
                    today = statistics.median(_time(release)[0] for _ in range(3))
                    results.append(
                        {
                            "family": family,
                            "m": m,
                            "points": points,
                            "full_rebuild_seconds": rebuild,
                            "release_after_rebuild_seconds": today,
                        }
                    )
                    entry.drop(table)
        finally:
            entry.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    payload = {"benchmark": "freshness_fold", "machine": info, "results": results}
    path = common.write_json(cfg.out / f"{cfg.name}_fold.json", payload)
    payload["files"] = [str(path)]
    return payload


def fold_report(payload: dict[str, Any]) -> str:
    lines = [
        "| data | m | written | delta rows | refresh | release | full rebuild | today's run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in payload["results"]:
        for p in e["points"]:
            lines.append(
                f"| {e['family']} | {e['m']:.0e} | {p['items_written_fraction']:.0%} | "
                f"{p['delta_rows']:,} | {_ms(p['refresh_seconds'])} | "
                f"{_ms(p['release_seconds'])} | {_ms(e['full_rebuild_seconds'])} | "
                f"{_ms(e['release_after_rebuild_seconds'])} |"
            )
    return "\n".join(lines)


# ----- output --------------------------------------------------------------------------------
def _ms(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.1f} ms"


def markdown_table(payload: dict[str, Any]) -> str:
    lines = [
        "| store | data | m | (a) refresh + release | refresh | release | (b) one-shot SQL | "
        "(a)/(b) | release unchanged | today's run | unchanged/today | today's refresh "
        "(full rebuild) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in payload["results"]:
        med = {name: v["median"] for name, v in e["methods"].items()}
        lines.append(
            f"| {e['store']} | {e['family']} | {e['m']:.0e} | {_ms(med['fresh_release'])} | "
            f"{_ms(med['refresh_part'])} | {_ms(med['release_part'])} | "
            f"{_ms(med['oneshot_sql'])} | {e['ratios']['fresh_vs_oneshot_sql']:.2f}x | "
            f"{_ms(med['release_unchanged'])} | {_ms(med['release_today'])} | "
            f"{e['ratios']['unchanged_vs_today']:.2f}x | {_ms(e['full_rebuild_seconds'])} |"
        )
    return "\n".join(lines)


def report(payload: dict[str, Any]) -> str:
    lines = [markdown_table(payload), ""]
    for t in payload["targets"]:
        lines.append(
            f"target {t['store']} {t['family']} 1e7: (a)/(b) {t['fresh_vs_oneshot_sql']:.2f}x "
            f"(<= {t['fresh_target']}: {'met' if t['fresh_met'] else 'MISSED'}); unchanged/"
            f"today {t['unchanged_vs_today']:.2f}x (<= {TARGET_UNCHANGED_VS_TODAY}: "
            f"{'met' if t['unchanged_met'] else 'MISSED'})"
        )
    lines.append(f"elapsed: {payload['elapsed_seconds']:.1f} s")
    return "\n".join(lines)


def plot(payload: dict[str, Any], out: Path, name: str) -> Path:
    """Median seconds of each timed step (log scale), one group of bars per store / data / m."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = payload["results"]
    steps = ["fresh_release", "oneshot_sql", "release_unchanged", "release_today"]
    width = 0.8 / len(steps)
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(entries)), 4.6))
    x = np.arange(len(entries))
    for i, step in enumerate(steps):
        values = [e["methods"][step]["median"] for e in entries]
        ax.bar(x + (i - (len(steps) - 1) / 2) * width, values, width, label=step)
    ax.set_yscale("log")
    ax.set_xticks(x)
    ax.set_xticklabels([f"{e['store']}\n{e['family']}\nm={e['m']:.0e}" for e in entries])
    ax.set_ylabel("median seconds (log)")
    config = payload["config"]
    ax.set_title(
        f"Release after {config['changed_fraction']:.0%} writes, k = {config['k']}, "
        f"epsilon = {config['epsilon']}"
    )
    common.legend_outside(ax)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    path = out / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----- write rounds: the default release on a changing table, every family -------------------
ROUND_FAMILIES = ("zipf", "plateau", "distinct", "uniform", "sparse", "band")
SPARSE_NONZERO = 0.01  # of the items: the sparse family's non-zero counts (zipf), the rest 0
TARGET_ROUNDS_VS_SQL = 1.0  # DuckDB after 1% writes: (b) / (a) at least
TARGET_FROZEN_ZIPF_VS_SQL = 30.0  # a release on a current copy, zipf: (b) / (a) at least
TARGET_POSTGRES_LIVE_ZIPF = 300.0
FROZEN_REPS = 9  # reps of the frozen copy against the store's query (releases of a few ms)


@dataclass
class RoundsConfig:
    """The default benchmark (`python -m benchmarks freshness`): write rounds, every family."""

    ms: tuple[int, ...] = (10**7,)
    families: tuple[str, ...] = ROUND_FAMILIES
    postgres_families: tuple[str, ...] = ("zipf",)
    rounds: int = 3
    writes_per_round: int = 1  # 1% write transactions between one round's releases and the next
    k: int = 10
    epsilon: float = 1.0
    reps: int = 5
    reps_large: int = 5  # at m >= 10^7
    seed: int = 0
    out: Path = common.RESULTS_DIR
    name: str = "freshness_rounds"
    plots: bool = True
    quiet: bool = False


def round_scores(family: str, m: int, k: int, scale: float) -> np.ndarray:
    """The counts of a family in canonical order: common.family_scores, plus "sparse" (the
    first 1% of ranks zipf, the rest 0) and "band" (every score within scale/3 of the top:
    PLATEAU_HEIGHT minus an even spread over [0, scale/3), all distinct, as DOUBLE)."""
    if family == "sparse":
        r = np.arange(m, dtype=np.int64)
        nonzero = max(k, int(SPARSE_NONZERO * m))
        return np.where(r < nonzero, np.floor(common.ZIPF_TOP / (r + 1.0)), 0).astype(np.int64)
    if family == "band":
        return common.PLATEAU_HEIGHT - (scale / 3.0) * np.arange(m, dtype=np.float64) / m
    return common.family_scores(family, m, k)


def _write_batch(
    rng: np.random.Generator, m: int, ids: np.ndarray, floating: bool, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """1% of the items, each count moved by 1..MAX_STEP up or down (the band by scale/100
    steps: it stays a band)."""
    chosen = rng.choice(m, size=max(1, int(CHANGED_FRACTION * m)), replace=False)
    steps = rng.integers(1, MAX_STEP + 1, size=len(chosen)) * rng.choice([-1, 1], len(chosen))
    return ids[chosen], steps * (scale / 100.0) if floating else steps


def rounds_table(cfg: RoundsConfig, store: Any, family: str, m: int) -> dict:
    """One family on DuckDB, rows in random order. Before any write: a frozen copy's release
    against the store's query. Then `cfg.rounds` rounds, each after `cfg.writes_per_round`
    transactions of 1% writes (the pending delta of the copy grows round by round), each round
    interleaving rep by rep: the store's one-shot query; the default release (auto, not frozen:
    the table read as it is now); the frozen alternative, `refresh()` then a release (auto) on
    the copy and its delta, timed as a whole and in parts."""
    from adapters.duckdb import DuckDBTable
    from topk_middleware import private_top_k

    table = table_name(family, m)
    scale = gumbel_scale(cfg.k, cfg.epsilon, m)
    scores = round_scores(family, m, cfg.k, scale)
    floating = scores.dtype.kind == "f"
    ids = common.shuffled_ids(m, seed=cfg.seed)
    order = np.random.default_rng(cfg.seed + 1).permutation(m)  # rows not in rank order
    started = time.perf_counter()
    store.load(table, ids[order], scores[order])
    load_seconds = time.perf_counter() - started
    del order, scores
    reps = cfg.reps_large if m >= 10**7 else cfg.reps
    seeds = iter(range(cfg.seed + 1, cfg.seed + 10**6))
    live = DuckDBTable(store.con, table)
    frozen = DuckDBTable(store.con, table, frozen=True)
    prepare_seconds, _ = _time(lambda: frozen.prepare(refresh=True, full=True))
    oneshot = store.oneshot_sql(table, cfg.k, scale)

    def release(on: Any) -> Any:
        return private_top_k(on, k=cfg.k, epsilon=cfg.epsilon, seed=next(seeds))

    release(frozen), release(live), oneshot()  # warm-up
    frozen_runs, sql_before = [], []
    for _ in range(max(reps, FROZEN_REPS)):  # a few ms each: more reps steady the median
        frozen_runs.append(_time(lambda: release(frozen))[0])
        sql_before.append(_time(oneshot)[0])
    entry = DuckDBEntry.__new__(DuckDBEntry)
    entry.store = store
    rng = np.random.default_rng(cfg.seed + m)
    out_rounds = []
    written = 0
    for number in range(1, cfg.rounds + 1):
        write_seconds = changed = 0.0
        for _ in range(cfg.writes_per_round):
            batch, moves = _write_batch(rng, m, ids, floating, scale)
            took, rows = _time(lambda: entry.write(table, batch, moves))  # noqa: B023
            write_seconds, changed, written = write_seconds + took, changed + rows, written + 1
        times: dict[str, list[float]] = {
            "oneshot_sql": [],
            "release": [],
            "refresh": [],
            "frozen_release": [],
            "refresh_and_release": [],
        }
        plans: dict[str, set[str]] = {"release": set(), "frozen_release": set()}
        report = None
        for _ in range(reps):
            times["oneshot_sql"].append(_time(oneshot)[0])
            seconds, result = _time(lambda: release(live))
            times["release"].append(seconds)
            plans["release"].add(_plan_name(result))
            refresh_seconds, report = _time(frozen.refresh)
            seconds, result = _time(lambda: release(frozen))
            times["refresh"].append(refresh_seconds)
            times["frozen_release"].append(seconds)
            times["refresh_and_release"].append(refresh_seconds + seconds)
            plans["frozen_release"].add(_plan_name(result))
        med = {name: statistics.median(v) for name, v in times.items()}
        out_rounds.append(
            {
                "round": number,
                "items_written_so_far": written * max(1, int(CHANGED_FRACTION * m)),
                "write_seconds": write_seconds,
                "rows_changed": changed,
                "refresh_report": None
                if report is None
                else {"kind": report.kind, "delta_rows": report.delta_rows},
                **{name: _summary(v) for name, v in times.items()},
                "plans": {name: sorted(v) for name, v in plans.items()},
                "sql_vs_release": med["oneshot_sql"] / med["release"],
                "sql_vs_frozen_release": med["oneshot_sql"] / med["frozen_release"],
                "sql_vs_refresh_and_release": med["oneshot_sql"] / med["refresh_and_release"],
            }
        )
    frozen.uninstall()
    store.con.execute(f"DROP TABLE IF EXISTS {table}")
    return {
        "store": "duckdb",
        "family": family,
        "m": m,
        "k": cfg.k,
        "epsilon": cfg.epsilon,
        "reps": reps,
        "load_seconds": load_seconds,
        "prepare_seconds": prepare_seconds,
        "frozen_copy_release": _summary(frozen_runs),
        "oneshot_sql_before": _summary(sql_before),
        "sql_vs_frozen_copy": statistics.median(sql_before) / statistics.median(frozen_runs),
        "rounds": out_rounds,
        "worst_sql_vs_release": min(r["sql_vs_release"] for r in out_rounds),
    }


def _plan_name(result: Any) -> str:
    """What ran: the method auto chose, and where the in-store one-shot read."""
    plan = result.plan
    chosen = plan.get("auto", {}).get("chosen", plan.get("requested"))
    where = plan.get("in_store_reads")
    return f"{chosen} ({where})" if where else str(chosen)


def rounds_postgres_live(cfg: RoundsConfig, family: str, m: int) -> dict:
    """PostgreSQL live mode: the same write rounds, the release against the store's query."""
    from topk_middleware import private_top_k

    entry = PostgresLiveEntry(Path(tempfile.gettempdir()))
    table = table_name(family, m)
    scale = gumbel_scale(cfg.k, cfg.epsilon, m)
    scores = round_scores(family, m, cfg.k, scale)
    floating = scores.dtype.kind == "f"
    ids = common.shuffled_ids(m, seed=cfg.seed)
    order = np.random.default_rng(cfg.seed + 1).permutation(m)
    entry.load(table, ids[order], scores[order])
    del order, scores
    entry.prepare(table)
    reps = cfg.reps_large if m >= 10**7 else cfg.reps
    seeds = iter(range(cfg.seed + 1, cfg.seed + 10**6))
    oneshot = entry.oneshot_sql(table, cfg.k, scale)

    def release() -> Any:
        return private_top_k(entry.source, k=cfg.k, epsilon=cfg.epsilon, seed=next(seeds))

    release(), oneshot()
    rng = np.random.default_rng(cfg.seed + m)
    out_rounds = []
    try:
        for number in range(1, cfg.rounds + 1):
            for _ in range(cfg.writes_per_round):
                batch, moves = _write_batch(rng, m, ids, floating, scale)
                entry.write(table, batch, moves)
            ours, sql = [], []
            for _ in range(reps):
                sql.append(_time(oneshot)[0])
                ours.append(_time(release)[0])
            out_rounds.append(
                {
                    "round": number,
                    "release": _summary(ours),
                    "oneshot_sql": _summary(sql),
                    "sql_vs_release": statistics.median(sql) / statistics.median(ours),
                }
            )
    finally:
        entry.drop(table)
        entry.close()
    return {
        "store": "postgres-live",
        "family": family,
        "m": m,
        "reps": reps,
        "rounds": out_rounds,
        "worst_sql_vs_release": min(r["sql_vs_release"] for r in out_rounds),
    }


def rounds_run(cfg: RoundsConfig) -> dict[str, Any]:
    """Every family on DuckDB and PostgreSQL live (its families) at each m; writes
    <out>/<name>.json (and a PNG)."""
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="topk_rounds_"))
    store = DuckDBStore(workdir / "rounds.duckdb")
    results: list[dict[str, Any]] = []
    cfg.out.mkdir(parents=True, exist_ok=True)
    try:
        plan = [(f, m) for m in cfg.ms for f in cfg.families]
        for family, m in common.progress(plan, desc="duckdb rounds", quiet=cfg.quiet):
            results.append(rounds_table(cfg, store, family, m))
            common.write_json(cfg.out / f"{cfg.name}.json", {"partial": results})
        version = store.version()
    finally:
        store.close()
        shutil.rmtree(workdir, ignore_errors=True)
    pg_version = None
    if cfg.postgres_families:
        plan = [(f, m) for m in cfg.ms for f in cfg.postgres_families]
        for family, m in common.progress(plan, desc="postgres live", quiet=cfg.quiet):
            results.append(rounds_postgres_live(cfg, family, m))
            common.write_json(cfg.out / f"{cfg.name}.json", {"partial": results})
        pg_version = PostgresStore(os.environ.get("TOPK_PG_DSN", common.DEFAULT_PG_DSN))
        pg_version, _ = pg_version.version(), pg_version.close()
    payload = {
        "benchmark": "freshness_rounds",
        "machine": {**common.machine_info(None), "duckdb": version, "postgres": pg_version},
        "config": {
            **{k: v for k, v in asdict(cfg).items() if k != "out"},
            "changed_fraction": CHANGED_FRACTION,
            "max_step": MAX_STEP,
        },
        "elapsed_seconds": time.perf_counter() - started,
        "results": results,
        "targets": rounds_targets(results),
    }
    path = common.write_json(cfg.out / f"{cfg.name}.json", payload)
    payload["files"] = [str(path)]
    if cfg.plots and results:
        payload["files"].append(str(rounds_plot(payload, cfg.out, cfg.name)))
    return payload


def rounds_targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The targets (set at m = 10^7; smaller runs report the same ratios against them)."""
    targets = []
    for e in results:
        where = f"{e['family']} m={e['m']:.0e}"
        if e["store"] == "duckdb":
            targets.append(
                {
                    "what": f"duckdb {where}, after 1% writes: SQL / release (worst round)",
                    "value": e["worst_sql_vs_release"],
                    "target": TARGET_ROUNDS_VS_SQL,
                    "met": e["worst_sql_vs_release"] >= TARGET_ROUNDS_VS_SQL,
                }
            )
            if e["family"] == "zipf":
                targets.append(
                    {
                        "what": f"duckdb {where}, frozen copy: SQL / release",
                        "value": e["sql_vs_frozen_copy"],
                        "target": TARGET_FROZEN_ZIPF_VS_SQL,
                        "met": e["sql_vs_frozen_copy"] >= TARGET_FROZEN_ZIPF_VS_SQL,
                    }
                )
        elif e["family"] == "zipf":
            targets.append(
                {
                    "what": f"postgres-live {where}, after 1% writes: SQL / release (worst round)",
                    "value": e["worst_sql_vs_release"],
                    "target": TARGET_POSTGRES_LIVE_ZIPF,
                    "met": e["worst_sql_vs_release"] >= TARGET_POSTGRES_LIVE_ZIPF,
                }
            )
    return targets


def rounds_report(payload: dict[str, Any]) -> str:
    """Markdown tables: DuckDB per family and round (the default release and the frozen
    alternative, each against the store's query), then PostgreSQL live, then the targets."""
    lines = [
        "| data | m | frozen copy, no write | SQL / frozen | round | one-shot SQL | release "
        "(default) | SQL / release | plan | refresh + release (frozen) | SQL / (refresh + "
        "release) | release part | plan (frozen) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in payload["results"]:
        if e["store"] != "duckdb":
            continue
        for r in e["rounds"]:
            lines.append(
                f"| {e['family']} | {e['m']:.0e} | {_ms(e['frozen_copy_release']['median'])} | "
                f"{e['sql_vs_frozen_copy']:.1f}x | {r['round']} | "
                f"{_ms(r['oneshot_sql']['median'])} | {_ms(r['release']['median'])} | "
                f"{r['sql_vs_release']:.2f}x | {', '.join(r['plans']['release'])} | "
                f"{_ms(r['refresh_and_release']['median'])} | "
                f"{r['sql_vs_refresh_and_release']:.2f}x | {_ms(r['frozen_release']['median'])} | "
                f"{', '.join(r['plans']['frozen_release'])} |"
            )
    pg = [e for e in payload["results"] if e["store"] != "duckdb"]
    if pg:
        lines += [
            "",
            "| store | data | m | round | one-shot SQL | release | SQL / release |",
            "|---|---|---|---|---|---|---|",
        ]
        for e in pg:
            for r in e["rounds"]:
                lines.append(
                    f"| {e['store']} | {e['family']} | {e['m']:.0e} | {r['round']} | "
                    f"{_ms(r['oneshot_sql']['median'])} | {_ms(r['release']['median'])} | "
                    f"{r['sql_vs_release']:.1f}x |"
                )
    lines.append("")
    for t in payload["targets"]:
        lines.append(
            f"- {t['what']}: {t['value']:.2f}x (target >= {t['target']}: "
            f"{'met' if t['met'] else 'MISSED'})"
        )
    lines.append(f"\nelapsed: {payload['elapsed_seconds']:.1f} s")
    return "\n".join(lines)


def rounds_plot(payload: dict[str, Any], out: Path, name: str) -> Path:
    """SQL / release per family and round (log scale): the default release and the frozen
    alternative (refresh + release), the line at 1x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = [e for e in payload["results"] if e["store"] == "duckdb"]
    labels, live, frozen = [], [], []
    for e in entries:
        for r in e["rounds"]:
            labels.append(f"{e['family']}\nround {r['round']}")
            live.append(r["sql_vs_release"])
            frozen.append(r["sql_vs_refresh_and_release"])
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(labels)), 4.4))
    x = np.arange(len(labels))
    ax.bar(x - 0.2, live, 0.4, label="default release (the table as it is)")
    ax.bar(x + 0.2, frozen, 0.4, label="frozen: refresh() + release")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("DuckDB's one-shot query / ours (log)")
    ms = sorted({e["m"] for e in entries})
    ax.set_title(f"DuckDB after 1% write rounds, m = {', '.join(f'{m:.0e}' for m in ms)}")
    common.legend_outside(ax)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    path = out / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----- command line --------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="m = 1e5, 3 reps, 2 rounds (scratch folder)"
    )
    parser.add_argument("--m", type=float, nargs="+", default=None, help="sizes (1e7)")
    parser.add_argument(
        "--families",
        nargs="+",
        choices=sorted(set(common.FAMILIES) | set(ROUND_FAMILIES)),
        default=None,
    )
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=None, help="timed reps below 10^7 (5)")
    parser.add_argument("--reps-large", type=int, default=None, help="timed reps at 10^7 (5)")
    parser.add_argument("--rounds", type=int, default=None, help="1%% write rounds (3)")
    parser.add_argument(
        "--writes-per-round", type=int, default=None, help="1%% write batches per round (1)"
    )
    parser.add_argument(
        "--postgres-families",
        nargs="*",
        choices=sorted(ROUND_FAMILIES),
        default=None,
        help="families on PostgreSQL live (zipf; none: leave PostgreSQL out)",
    )
    parser.add_argument(
        "--first-release",
        action="store_true",
        help="the first release after writes vs a full rebuild (DuckDB delta, PostgreSQL live)",
    )
    parser.add_argument("--stores", nargs="+", choices=sorted(STORES), default=None)
    parser.add_argument(
        "--fold-sweep", action="store_true", help="delta size against a full rebuild (DuckDB)"
    )


def config_from_args(args: argparse.Namespace) -> FreshnessConfig:
    """The configuration of --first-release and --fold-sweep."""
    cfg = FreshnessConfig()
    if args.quick:
        cfg.ms, cfg.reps, cfg.reps_large, cfg.name = (10**4, 10**5), 2, 2, "freshness_quick"
    if args.stores:
        cfg.stores = tuple(args.stores)
    if args.m:
        cfg.ms = tuple(int(m) for m in args.m)
    if args.families:
        cfg.families = tuple(args.families)
    cfg.k, cfg.epsilon = args.k, args.epsilon
    if args.reps is not None:
        cfg.reps = args.reps
    if args.reps_large is not None:
        cfg.reps_large = args.reps_large
    return cfg


def rounds_config_from_args(args: argparse.Namespace) -> RoundsConfig:
    """The configuration of the default benchmark (write rounds)."""
    cfg = RoundsConfig()
    if args.quick:
        cfg.ms, cfg.reps, cfg.rounds, cfg.name = (10**5,), 3, 2, "freshness_rounds_quick"
    if args.m:
        cfg.ms = tuple(int(m) for m in args.m)
    if args.families:
        cfg.families = tuple(args.families)
    if args.postgres_families is not None:
        cfg.postgres_families = tuple(args.postgres_families)
    cfg.k, cfg.epsilon = args.k, args.epsilon
    for name in ("reps", "reps_large", "rounds", "writes_per_round"):
        if getattr(args, name) is not None:
            setattr(cfg, name, getattr(args, name))
    return cfg
