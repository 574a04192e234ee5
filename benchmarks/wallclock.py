"""Wall-clock benchmark on real stores: the private threshold algorithm against full-scan baselines.

For each store (a DuckDB file, the PostgreSQL server of TOPK_PG_DSN), each m (10^6, 10^7) and each
family (zipf, plateau) it loads a table (id BIGINT, score BIGINT) with shuffled ids, runs the
adapter's `prepare()` (the rank table), and then, interleaved rep by rep, times:

* ``threshold``: private_top_k(method="threshold"): Algorithm 3 through the adapter;
* ``oneshot_scan`` (baseline a): private_top_k(method="oneshot_full_read"): every row into the
  client, noise added there (Algorithm 2);
* ``oneshot_sql`` (baseline b): the one-shot mechanism pushed into SQL, the fastest thing a user
  could write: ``SELECT id FROM t ORDER BY score - b * ln(-ln(random())) DESC LIMIT k``, i.e.
  score plus Gumbel(b) noise from the database's own random(), with b the same noise scale
  (k / epsilon, Fact 3.3) the threshold run uses;
* the cost-aware threshold algorithm, when the core offers it.

Each is timed from the call to the released answer (connections are open beforehand; loading and
prepare() are timed separately and are not part of the ratios). One untimed warm-up run of each
comes first. The ratios are median(baseline) / median(threshold). An extra instrumented threshold
run splits its time into time inside the store's read calls and the rest (Python).

Size: one module per benchmark command (benchmarks/__main__.py); the two stores' loaders, the
timed variants, the report and plot, and the `profile` command read one table layout and one
result record, so they stay together.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import struct
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from topk_middleware.access import (
    RunTraits,
    ScoreRuns,
    StoreTraits,
    implements,
    run_traits,
    store_traits,
)

from . import common

TARGETS = {  # (store, family) at m = 10^7: minimum speed-up of threshold over oneshot_sql
    ("postgres", "zipf"): 100.0,
    ("postgres", "plateau"): 10.0,
    ("duckdb", "zipf"): 10.0,
    ("duckdb", "plateau"): 3.0,
}
TARGET_M = 10**7
# (store, family) at m = 10^7: minimum speed-up of auto over oneshot_sql
AUTO_TARGETS = {
    **{
        (store, family): 1.0
        for store in ("duckdb", "postgres")
        for family in ("zipf", "plateau", "distinct", "uniform")
    },
    ("duckdb", "distinct"): 2.0,
    ("postgres", "distinct"): 20.0,
    ("duckdb", "zipf"): 20.0,
    ("postgres", "zipf"): 200.0,
}


# ----- timing the store's share --------------------------------------------------------------
class TimedSource:
    """Wraps a Source and adds up the time spent inside its calls (the store's share). It keeps
    the store's optional capabilities (runs of tied scores, read-ahead), so the instrumented run
    reads what the plain one does."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seconds = 0.0
        self.calls = 0
        if implements(inner, ScoreRuns):
            self.score_run_count = lambda: self._timed(inner.score_run_count)
            self.read_score_runs = lambda: self._timed(inner.read_score_runs)

    def traits(self) -> StoreTraits:
        return store_traits(self.inner)

    def run_traits(self) -> RunTraits:
        """The inner store's read-ahead, costs (the batching fitted to it) and positions."""
        inner = run_traits(self.inner)
        return RunTraits(
            positions_are_ranks=inner.positions_are_ranks,
            sorted_read_rows=inner.sorted_read_rows,
            costs=inner.costs,
        )

    def _timed(self, fn: Callable[..., Any], *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1

    def domain_size(self) -> int:
        return self._timed(self.inner.domain_size)

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        start = time.perf_counter()
        context: AbstractContextManager[Any] = self.inner.snapshot()
        context.__enter__()
        self.seconds += time.perf_counter() - start
        try:
            yield
        finally:
            start = time.perf_counter()
            context.__exit__(None, None, None)
            self.seconds += time.perf_counter() - start

    def read_sorted(self, start: int, count: int) -> Any:
        return self._timed(self.inner.read_sorted, start, count)

    def read_positions(self, ranks: np.ndarray) -> Any:
        return self._timed(self.inner.read_positions, ranks)

    def read_ids(self, ids: Sequence[Any]) -> Any:
        return self._timed(self.inner.read_ids, ids)


# ----- loading -------------------------------------------------------------------------------
def table_name(family: str, m: int) -> str:
    return f"topk_bench_{family}_{m}"


def pg_copy_payload(ids: np.ndarray, scores: np.ndarray) -> bytes:
    """PostgreSQL's binary COPY format for rows (id int8, score int8), built by numpy."""
    row = np.dtype([("n", ">i2"), ("l1", ">i4"), ("id", ">i8"), ("l2", ">i4"), ("score", ">i8")])
    data = np.empty(len(ids), dtype=row)
    data["n"], data["l1"], data["l2"] = 2, 8, 8
    if scores.dtype.kind == "f":  # float8 scores: the same 8 bytes, IEEE big-endian
        row = np.dtype(
            [("n", ">i2"), ("l1", ">i4"), ("id", ">i8"), ("l2", ">i4"), ("score", ">f8")]
        )
        data = np.empty(len(ids), dtype=row)
        data["n"], data["l1"], data["l2"] = 2, 8, 8
    data["id"], data["score"] = ids, scores
    return b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0) + data.tobytes() + b"\xff\xff"


class DuckDBStore:
    """A DuckDB file holding the benchmark tables."""

    name = "duckdb"

    def __init__(self, path: Path) -> None:
        import duckdb

        self.path = path
        self.con = duckdb.connect(str(path))

    def version(self) -> str:
        import duckdb

        return duckdb.__version__

    def exists(self, table: str, m: int) -> bool:
        try:
            return self.con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == m
        except Exception:
            return False

    def load(self, table: str, ids: np.ndarray, scores: np.ndarray) -> None:
        kind = np.float64 if scores.dtype.kind == "f" else np.int64
        data = {"id": ids, "score": scores.astype(kind)}  # noqa: F841 (scanned by name)
        self.con.execute(f"CREATE OR REPLACE TABLE {table} AS SELECT id, score FROM data")
        self.con.execute("CHECKPOINT")

    def source(self, table: str) -> Any:
        from adapters.duckdb import DuckDBTable

        return DuckDBTable(self.con, table)

    def oneshot_sql(self, table: str, k: int, scale: float) -> Callable[[], list[Any]]:
        query = (
            f"SELECT id FROM {table} ORDER BY score - {scale!r} * ln(-ln(random())) DESC "
            f"LIMIT {int(k)}"
        )

        def run() -> list[Any]:
            return [r[0] for r in self.con.execute(query).fetchall()]

        return run

    def drop(self, table: str, source: Any) -> None:
        self.con.execute(f"DROP TABLE IF EXISTS {table}")
        if source is not None:
            for name in (source.rank_table, getattr(source, "runs_table", None)):
                if name:
                    self.con.execute(f'DROP TABLE IF EXISTS "{name}"')

    def close(self) -> None:
        self.con.close()


class PostgresStore:
    """The PostgreSQL server of the DSN."""

    name = "postgres"

    def __init__(self, dsn: str) -> None:
        import psycopg

        self.dsn = dsn
        self.con = psycopg.connect(dsn, autocommit=True)
        self.sources: list[Any] = []

    def version(self) -> str:
        return str(self.con.execute("SHOW server_version").fetchone()[0])

    def exists(self, table: str, m: int) -> bool:
        found = self.con.execute("SELECT to_regclass(%s)", [table]).fetchone()[0]
        if found is None:
            return False
        return self.con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == m

    def load(self, table: str, ids: np.ndarray, scores: np.ndarray) -> None:
        con = self.con
        con.execute(f"DROP TABLE IF EXISTS {table}")
        kind = "float8" if scores.dtype.kind == "f" else "bigint"
        con.execute(f"CREATE TABLE {table} (id bigint NOT NULL, score {kind} NOT NULL)")
        payload = pg_copy_payload(ids, scores)
        copy_sql = f"COPY {table} (id, score) FROM STDIN (FORMAT BINARY)"
        with con.cursor() as cur, cur.copy(copy_sql) as copy:
            step = 1 << 24
            for at in range(0, len(payload), step):
                copy.write(payload[at : at + step])
        con.execute(f"VACUUM ANALYZE {table}")

    def source(self, table: str) -> Any:
        from adapters.postgres import PostgresTable

        source = PostgresTable(self.dsn, table)
        self.sources.append(source)
        return source

    def oneshot_sql(self, table: str, k: int, scale: float) -> Callable[[], list[Any]]:
        query = (
            f"SELECT id FROM {table} ORDER BY score - {scale!r} * ln(-ln(random())) DESC "
            f"LIMIT {int(k)}"
        )

        def run() -> list[Any]:
            return [r[0] for r in self.con.execute(query).fetchall()]

        return run

    def drop(self, table: str, source: Any) -> None:
        self.con.execute(f"DROP TABLE IF EXISTS {table}")
        if source is not None:
            for name in (source.rank_table, getattr(source, "runs_table", None)):
                if name:
                    self.con.execute(f'DROP TABLE IF EXISTS "{name}"')

    def close(self) -> None:
        for source in self.sources:
            source.close()
        self.con.close()


# ----- the benchmark -------------------------------------------------------------------------
@dataclass
class WallclockConfig:
    stores: tuple[str, ...] = ("duckdb", "postgres")
    ms: tuple[int, ...] = (10**6, 10**7)
    families: tuple[str, ...] = ("zipf", "plateau")
    k: int = 10
    epsilon: float = 1.0
    reps: int = 5
    scan_reps: int = 3  # baseline (a) is slow and steady
    pg_dsn: str = field(
        default_factory=lambda: os.environ.get("TOPK_PG_DSN", common.DEFAULT_PG_DSN)
    )
    duckdb_path: Path | None = None  # default: a file in a fresh temporary folder
    reuse: bool = False  # keep tables that already hold m rows (load time then not measured)
    keep: bool = False  # leave the tables in place afterwards
    seed: int = 0
    out: Path = common.RESULTS_DIR
    name: str = "wallclock"
    plots: bool = True
    quiet: bool = False


def _time(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def calibrate_costs(source: Any, rows: int = 20_000, seed: int = 0) -> dict[str, float]:
    """Measured store costs in microseconds: per round trip (a one-row read), per sorted row
    (a prefix read of `rows` rows) and per random row (`rows` uniform ranks in one read)."""
    with source.snapshot():
        m = source.domain_size()
        rows = max(1, min(rows, m))
        ranks = np.sort(np.random.default_rng(seed).choice(m, rows, replace=False))
        trips = []
        for _ in range(5):
            trips.append(_time(lambda: source.read_sorted(0, 1))[0])
        trip = statistics.median(trips)
        sorted_s = _time(lambda: source.read_sorted(0, rows))[0]
        random_s = _time(lambda: source.read_positions(ranks))[0]
    return {
        "round_trip": trip * 1e6,
        "sorted": max(1e-3, (sorted_s - trip) / rows * 1e6),
        "random": max(1e-3, (random_s - trip) / rows * 1e6),
    }


def _methods(
    cfg: WallclockConfig,
    store: Any,
    source: Any,
    table: str,
    oracle: str,
    costs: dict[str, float] | None,
):
    """name -> (callable returning (items, stats or None), reps)."""
    import topk_middleware
    from topk_middleware import private_top_k

    scale = gumbel_scale(cfg.k, cfg.epsilon, source.domain_size())
    counter = iter(range(10**9))

    def private(method: str, **extra: Any) -> Callable[[], Any]:
        def run() -> Any:
            seed = cfg.seed * 1_000_003 + next(counter)
            kwargs: dict[str, Any] = {"oracle": oracle} if "oneshot" not in method else {}
            result = private_top_k(
                source,
                k=cfg.k,
                epsilon=cfg.epsilon,
                noise="gumbel",
                method=method,
                seed=seed,
                **kwargs,
                **extra,
            )
            return result.items, result.accesses

        return run

    sql_run = store.oneshot_sql(table, cfg.k, scale)
    methods: dict[str, tuple[Callable[[], Any], int]] = {
        "threshold": (private("threshold"), cfg.reps),
        "auto": (private("auto"), cfg.reps),
        "oneshot_in_store": (private("oneshot_in_store"), cfg.scan_reps),
        "oneshot_scan": (private("oneshot_full_read"), cfg.scan_reps),
        "oneshot_sql": (lambda: (sql_run(), None), cfg.reps),
    }
    if costs is not None:
        model = topk_middleware.CostModel(costs["sorted"], costs["random"], costs["round_trip"])
        methods["cost_aware"] = (private("threshold", costs=model), cfg.reps)
    return methods, scale


def gumbel_scale(k: int, epsilon: float, m: int) -> float:
    """The Gumbel scale private_top_k uses for (k, epsilon, delta = 0): privacy.calibrate."""
    from topk_middleware.privacy import calibrate

    return float(calibrate("gumbel", k, m, epsilon, 0.0).scale)


def _stats_dict(stats: Any) -> dict[str, int] | None:
    if stats is None:
        return None
    return {
        "total": stats.total,
        "sorted": stats.sorted,
        "random": stats.random,
        "rows_fetched": stats.rows_fetched,
        "round_trips": stats.round_trips,
    }


def bench_table(
    cfg: WallclockConfig, store: Any, family: str, m: int, oracle: str, bar: Any
) -> dict[str, Any]:
    table = table_name(family, m)
    entry: dict[str, Any] = {
        "store": store.name,
        "family": family,
        "m": m,
        "k": cfg.k,
        "epsilon": cfg.epsilon,
        "table": table,
    }
    if cfg.reuse and store.exists(table, m):
        entry["load_seconds"] = None
        entry["loaded"] = "reused"
    else:
        scores = common.family_scores(family, m, cfg.k)
        ids = common.shuffled_ids(m, seed=cfg.seed)
        entry["load_seconds"], _ = _time(lambda: store.load(table, ids, scores))
        entry["loaded"] = "fresh"
        del scores, ids
    source = store.source(table)
    entry["prepare_seconds"], _ = _time(lambda: source.prepare(refresh=not cfg.reuse))
    costs = calibrate_costs(source) if common.has_cost_model() else None
    entry["measured_costs_us"] = costs
    methods, scale = _methods(cfg, store, source, table, oracle, costs)
    entry["gumbel_scale"] = scale
    entry["oneshot_sql_query"] = (
        f"SELECT id FROM {table} ORDER BY score - {scale!r} * ln(-ln(random())) DESC LIMIT {cfg.k}"
    )
    times: dict[str, list[float]] = {name: [] for name in methods}
    stats: dict[str, Any] = {}
    for name, (fn, _) in methods.items():  # warm-up, untimed
        _, (items, st) = _time(fn)
        if len(items) != cfg.k:
            raise AssertionError(f"{store.name} {name} returned {len(items)} items")
        stats[name] = _stats_dict(st)
    for rep in range(max(reps for _, reps in methods.values())):
        for name, (fn, reps) in methods.items():
            if rep < reps:
                seconds, (_, st) = _time(fn)
                times[name].append(seconds)
                if st is not None:
                    stats[name] = _stats_dict(st)
            bar.set_postfix_str(f"{store.name} {family} m={m:.0e} rep {rep + 1} {name}")
    # one instrumented threshold run: the store's share of the time
    timed = TimedSource(source)
    from topk_middleware import private_top_k

    wall, result = _time(
        lambda: private_top_k(timed, k=cfg.k, epsilon=cfg.epsilon, seed=cfg.seed + 7, oracle=oracle)
    )
    entry["threshold_breakdown"] = {
        "seconds": wall,
        "store_seconds": timed.seconds,
        "python_seconds": wall - timed.seconds,
        "store_calls": timed.calls,
        "accesses": _stats_dict(result.accesses),
    }
    out: dict[str, Any] = {}
    for name, values in times.items():
        st = stats.get(name)
        if name == "oneshot_sql":
            st = {"total": None, "rows_fetched": cfg.k, "rows_scanned_by_store": m}
            st["round_trips"] = 1
        out[name] = {
            "seconds": values,
            "median": statistics.median(values),
            "min": min(values),
            "reps": len(values),
            "accesses": st,
        }
    entry["methods"] = out
    base = out["threshold"]["median"]
    entry["speedup"] = {name: out[name]["median"] / base for name in out if name != "threshold"}
    # method="auto" (planner.py) against the store's own one-shot query, and what it chose
    entry["auto_vs_sql"] = out["oneshot_sql"]["median"] / out["auto"]["median"]
    entry["in_store_vs_sql"] = out["oneshot_sql"]["median"] / out["oneshot_in_store"]["median"]
    probe = private_top_k(source, k=cfg.k, epsilon=cfg.epsilon, seed=cfg.seed + 11, oracle=oracle)
    entry["auto_plan"] = probe.diagnostics.plan.get("auto")
    if not cfg.keep:
        store.drop(table, source)
    return entry


def run(cfg: WallclockConfig) -> dict[str, Any]:
    """All stores, sizes and families; writes <out>/<name>.json, a PNG and a Markdown table."""
    from tqdm import tqdm

    oracle = common.best_oracle()
    info = common.machine_info(cfg.pg_dsn if "postgres" in cfg.stores else None)
    tmpdir: str | None = None
    started = time.perf_counter()
    entries: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    stores: list[Any] = []
    for name in cfg.stores:
        try:
            if name == "duckdb":
                path = cfg.duckdb_path
                if path is None:
                    tmpdir = tempfile.mkdtemp(prefix="topk_bench_")
                    path = Path(tmpdir) / "bench.duckdb"
                stores.append(DuckDBStore(path))
            elif name == "postgres":
                stores.append(PostgresStore(cfg.pg_dsn))
            else:
                raise ValueError(f"unknown store {name!r}")
        except ImportError as error:  # an adapter not there yet
            skipped.append({"store": name, "reason": str(error)})
    plan = [(s, f, m) for s in stores for m in cfg.ms for f in cfg.families]
    bar = tqdm(plan, desc="wallclock", disable=common.bar_off(cfg.quiet), dynamic_ncols=True)
    try:
        for store, family, m in bar:
            try:
                entries.append(bench_table(cfg, store, family, m, oracle, bar))
            except ImportError as error:
                skipped.append({"store": store.name, "reason": str(error)})
    finally:
        for store in stores:
            store.close()
        if tmpdir is not None and not cfg.keep:
            shutil.rmtree(tmpdir, ignore_errors=True)
    auto_targets = []
    for (store, family), need in AUTO_TARGETS.items():
        hit = [e for e in entries if (e["store"], e["family"], e["m"]) == (store, family, TARGET_M)]
        got = hit[0]["auto_vs_sql"] if hit else None
        auto_targets.append(
            {
                "store": store,
                "family": family,
                "required": need,
                "auto_vs_sql": got,
                "met": None if got is None else got >= need,
            }
        )
    targets = []
    for (store, family), need in TARGETS.items():
        hit = [e for e in entries if (e["store"], e["family"], e["m"]) == (store, family, TARGET_M)]
        got = hit[0]["speedup"]["oneshot_sql"] if hit else None
        targets.append(
            {
                "store": store,
                "family": family,
                "m": TARGET_M,
                "required": need,
                "speedup_vs_oneshot_sql": got,
                "met": None if got is None else got >= need,
            }
        )
    payload = {
        "benchmark": "wallclock",
        "machine": info,
        "config": {
            **{k: v for k, v in asdict(cfg).items() if k not in ("out", "pg_dsn")},
            "oracle": oracle,
            "pg_dsn": cfg.pg_dsn,
            "duckdb_path": str(cfg.duckdb_path) if cfg.duckdb_path else "temporary",
        },
        "elapsed_seconds": time.perf_counter() - started,
        "results": entries,
        "skipped": skipped,
        "targets": targets,
        "auto_targets": auto_targets,
    }
    cfg.out.mkdir(parents=True, exist_ok=True)
    path = common.write_json(cfg.out / f"{cfg.name}.json", payload)
    table_path = cfg.out / f"{cfg.name}.md"
    table_path.write_text(markdown_table(payload) + "\n")
    payload["files"] = [str(path), str(table_path)]
    if cfg.plots and entries:
        payload["files"].append(str(plot(payload, cfg.out, cfg.name)))
    return payload


# ----- output --------------------------------------------------------------------------------
def _ms(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.1f} ms" if seconds >= 0.01 else f"{seconds * 1e3:.2f} ms"


def markdown_table(payload: dict[str, Any]) -> str:
    """The README table: medians, ratios, rows and round trips."""
    head = (
        "| store | data | m | threshold | (a) one-shot, full scan | (b) one-shot in SQL | "
        "(a)/thr | (b)/thr | thr accesses | thr rows fetched | thr round trips | load + prepare |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for e in payload["results"]:
        meth = e["methods"]
        thr = meth["threshold"]
        acc = thr["accesses"] or {}
        load = "reused" if e["load_seconds"] is None else _ms(e["load_seconds"])
        lines.append(
            f"| {e['store']} | {e['family']} | {e['m']:.0e} | {_ms(thr['median'])} | "
            f"{_ms(meth['oneshot_scan']['median'])} | {_ms(meth['oneshot_sql']['median'])} | "
            f"{e['speedup']['oneshot_scan']:.1f}x | {e['speedup']['oneshot_sql']:.1f}x | "
            f"{acc.get('total', '')} | {acc.get('rows_fetched', '')} | "
            f"{acc.get('round_trips', '')} | {load} + {_ms(e['prepare_seconds'])} |"
        )
    lines += [
        "",
        "| data | store | m | auto | auto chose | (b) one-shot in SQL | (b)/auto | "
        "one-shot in store (keyed SHA-256) | (b)/in store |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in payload["results"]:
        meth = e["methods"]
        if "auto" not in meth:
            continue
        chose = (e.get("auto_plan") or {}).get("chosen", "")
        lines.append(
            f"| {e['family']} | {e['store']} | {e['m']:.0e} | {_ms(meth['auto']['median'])} | "
            f"{chose} | {_ms(meth['oneshot_sql']['median'])} | {e['auto_vs_sql']:.1f}x | "
            f"{_ms(meth['oneshot_in_store']['median'])} | {e['in_store_vs_sql']:.2f}x |"
        )
    return "\n".join(lines)


def report(payload: dict[str, Any]) -> str:
    lines = [markdown_table(payload), ""]
    for e in payload["results"]:
        b = e["threshold_breakdown"]
        lines.append(
            f"{e['store']} {e['family']} m={e['m']:.0e}: threshold run {_ms(b['seconds'])} = "
            f"store {_ms(b['store_seconds'])} ({b['store_calls']} calls) + "
            f"python {_ms(b['python_seconds'])}"
        )
    for t in payload["targets"]:
        got = t["speedup_vs_oneshot_sql"]
        lines.append(
            f"target {t['store']} {t['family']} 1e7: >= {t['required']:.0f}x, got "
            + ("not run" if got is None else f"{got:.1f}x ({'met' if t['met'] else 'MISSED'})")
        )
    for s in payload["skipped"]:
        lines.append(f"skipped {s['store']}: {s['reason']}")
    lines.append(f"elapsed: {payload['elapsed_seconds']:.1f} s")
    return "\n".join(lines)


def plot(payload: dict[str, Any], out: Path, name: str) -> Path:
    """Median wall clock per method (log scale), one group of bars per store / data / m."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = payload["results"]
    methods = sorted(
        {m for e in entries for m in e["methods"]},
        key=lambda n: (
            ["threshold", "oneshot_sql", "oneshot_scan"].index(n)
            if n in ("threshold", "oneshot_sql", "oneshot_scan")
            else 9
        ),
    )
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(entries)), 4.6))
    x = np.arange(len(entries))
    for i, method in enumerate(methods):
        values = [e["methods"].get(method, {}).get("median", np.nan) for e in entries]
        ax.bar(x + (i - (len(methods) - 1) / 2) * width, values, width, label=method)
    ax.set_yscale("log")
    ax.set_xticks(x)
    labels = [f"{e['store']}\n{e['family']}\nm={e['m']:.0e}" for e in entries]
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("median seconds per release (log)")
    config = payload["config"]
    ax.set_title(f"Wall clock, k = {config['k']}, epsilon = {config['epsilon']}")
    common.legend_outside(ax)
    ax.grid(True, axis="y", which="major", alpha=0.3)
    fig.tight_layout()
    path = out / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----- profile -------------------------------------------------------------------------------
def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", choices=("duckdb", "postgres", "memory"), default="duckdb")
    parser.add_argument("--family", choices=common.FAMILIES, default="plateau")
    parser.add_argument("--m", type=float, default=1e7)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=5, help="threshold runs profiled")
    parser.add_argument("--pg-dsn", default=os.environ.get("TOPK_PG_DSN", common.DEFAULT_PG_DSN))


def profile(args: argparse.Namespace) -> dict[str, Any]:
    """pyinstrument profile of `repeat` threshold runs on one store; text and HTML reports."""
    from pyinstrument import Profiler

    from topk_middleware import private_top_k

    m, family, oracle = int(args.m), args.family, common.best_oracle()
    tmpdir = None
    store: Any = None
    table = table_name(family, m)
    if args.store == "memory":
        source = common.make_source(family, m, args.k)
    else:
        if args.store == "duckdb":
            tmpdir = tempfile.mkdtemp(prefix="topk_prof_")
            store = DuckDBStore(Path(tmpdir) / "prof.duckdb")
        else:
            store = PostgresStore(args.pg_dsn)
        store.load(table, common.shuffled_ids(m), common.family_scores(family, m, args.k))
        source = store.source(table)
        source.prepare()
    try:
        private_top_k(source, k=args.k, epsilon=args.epsilon, seed=0, oracle=oracle)  # warm-up
        profiler = Profiler(interval=0.0005)
        profiler.start()
        for seed in range(1, args.repeat + 1):
            result = private_top_k(source, k=args.k, epsilon=args.epsilon, seed=seed, oracle=oracle)
        profiler.stop()
    finally:
        if store is not None:
            store.drop(table, source)
            store.close()
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)
    text = profiler.output_text(unicode=False, color=False, show_all=False)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    stem = args.name or f"profile_{args.store}_{family}_{m:.0e}".replace("+", "")
    txt = out / f"{stem}.txt"
    txt.write_text(text)
    return {
        "store": args.store,
        "family": family,
        "m": m,
        "k": args.k,
        "oracle": oracle,
        "repeat": args.repeat,
        "last_accesses": _stats_dict(result.accesses),
        "seconds_per_run": profiler.last_session.duration / args.repeat,
        "files": [str(txt)],
        "text": text,
    }


# ----- command line --------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="m = 1e4 and 1e5, 2 reps: a smoke test"
    )
    parser.add_argument("--stores", nargs="+", choices=("duckdb", "postgres"), default=None)
    parser.add_argument("--m", type=float, nargs="+", default=None, help="sizes (1e6 1e7)")
    parser.add_argument("--max-m", type=float, default=None)
    parser.add_argument("--families", nargs="+", choices=common.FAMILIES, default=None)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=None, help="timed reps (default 5)")
    parser.add_argument("--scan-reps", type=int, default=None, help="reps of baseline (a)")
    parser.add_argument("--pg-dsn", default=None, help="default: TOPK_PG_DSN or the local server")
    parser.add_argument("--duckdb-path", type=Path, default=None)
    parser.add_argument("--reuse", action="store_true", help="reuse loaded tables")
    parser.add_argument("--keep", action="store_true", help="keep the tables afterwards")


def config_from_args(args: argparse.Namespace) -> WallclockConfig:
    cfg = WallclockConfig()
    if args.quick:
        cfg.ms, cfg.reps, cfg.scan_reps, cfg.name = (10**4, 10**5), 2, 1, "wallclock_quick"
    if args.stores:
        cfg.stores = tuple(args.stores)
    if args.m:
        cfg.ms = tuple(int(m) for m in args.m)
    if args.max_m:
        cfg.ms = tuple(m for m in cfg.ms if m <= args.max_m) or (int(args.max_m),)
    if args.families:
        cfg.families = tuple(args.families)
    cfg.k, cfg.epsilon = args.k, args.epsilon
    if args.reps is not None:
        cfg.reps = args.reps
    if args.scan_reps is not None:
        cfg.scan_reps = args.scan_reps
    if args.pg_dsn:
        cfg.pg_dsn = args.pg_dsn
    cfg.duckdb_path, cfg.reuse, cfg.keep = args.duckdb_path, args.reuse, args.keep
    return cfg
