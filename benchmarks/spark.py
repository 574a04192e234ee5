"""Spark benchmark: a private top-k release from a SparkTable against Spark's own one-shot query.

    python -m benchmarks spark [--ms 10000000 100000000] [--families zipf plateau] [--reps 3]
    python -m benchmarks spark --quick [--ms 100000]     # m = 10^6 (or --ms), one repetition

For each m and family (benchmarks/common.py: zipf, plateau) a Parquet table (id, score) is
written by Spark in id order (ids a seeded permutation of the ranks), and `SparkTable.prepare()`
builds its rank-ordered copy (timed: the checks, one distributed sort and the writes). Then,
interleaved, per repetition, in an order rotated by one method each repetition (so that no
method always runs first, on the caches the previous one left):

* `release`: private_top_k(source, k, epsilon), method "auto" (the planner priced with Spark's
  costs, adapters/spark/layout.py STORE_COSTS), a fresh snapshot each time;
* `threshold`: the private threshold algorithm forced (Wu, Ohrimenko, Wirth 2023, Algorithm 3);
* `spark_oneshot`: Spark's own query over the table, `ORDER BY score - b * ln(-ln(rand()))
  DESC LIMIT k` (the one-shot mechanism with Spark's random(), b the calibrated Gumbel scale);
* `in_store`: the in-store one-shot with keyed noise (keyed_noise.py through `sha2`).

Each release records the latency of every Spark query it made (`SparkTable.query_seconds`).
At m >= 10^8 at least 3 repetitions run. Then, unless --no-stale, the table is rewritten (every
score of 1% of the items moved) without prepare(): the next releases read the table itself or
refresh the copy, as the ski-rental rule prices them (adapters/spark/direct.py), interleaved with
Spark's one-shot on the new table; the plan's choice and a prepare(refresh=True) are recorded.

One local session (local[2] unless --master) serves everything; its start is timed apart.
Results: benchmarks/results/spark.json and spark.png (a --quick run: benchmarks/scratch/);
`report()` prints the table that docs/benchmarks-spark.md quotes.
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import common

METHODS = ("release", "threshold", "spark_oneshot", "in_store")
MIN_REPS_AT_1E8 = 3
STALE_RELEASES = 3


@dataclass
class SparkConfig:
    ms: tuple[int, ...] = (10**7, 10**8)
    families: tuple[str, ...] = ("zipf", "plateau")
    k: int = 10
    epsilon: float = 1.0
    reps: int = 3
    master: str = "local[2]"
    driver_memory: str = "6g"
    data: Path = Path("/tmp/topk-spark-bench")
    reuse: bool = False  # keep tables (and copies) already written
    in_store: bool = True
    seed: int = 0
    out: Path = common.RESULTS_DIR
    name: str = "spark"
    plots: bool = True
    quiet: bool = False
    only: tuple[str, ...] = field(default_factory=tuple)  # "m:family" pairs to run, if given
    stale: bool = True  # releases after a write without prepare()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ms", type=float, nargs="+", default=None, help="default 1e7 1e8")
    parser.add_argument("--families", nargs="+", default=["zipf", "plateau"])
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--data", type=Path, default=Path("/tmp/topk-spark-bench"))
    parser.add_argument("--reuse", action="store_true", help="keep tables already written")
    parser.add_argument("--no-in-store", action="store_true", help="skip the keyed one-shot")
    parser.add_argument("--quick", action="store_true", help="m = 10^6 (or --ms), one repetition")
    parser.add_argument("--no-stale", action="store_true", help="skip the releases after a write")


def config_from_args(args: argparse.Namespace) -> SparkConfig:
    cfg = SparkConfig(
        ms=tuple(int(m) for m in (args.ms or (1e6,) if args.quick else args.ms or (1e7, 1e8))),
        families=tuple(args.families),
        k=args.k,
        epsilon=args.epsilon,
        reps=args.reps,
        master=args.master,
        driver_memory=args.driver_memory,
        data=args.data,
        reuse=args.reuse,
        in_store=not args.no_in_store,
        stale=not args.no_stale,
    )
    if args.quick:
        cfg.reps = 1
    return cfg


def start_session(cfg: SparkConfig) -> Any:
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master(cfg.master)
        .appName("topk-middleware-benchmark")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", cfg.driver_memory)
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.local.dir", str(cfg.data / "tmp"))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def score_sql(family: str, m: int, k: int, rank: str) -> str:
    """The family's count at canonical rank `rank` (benchmarks/common.py family_scores)."""
    if family == "zipf":
        return f"CAST(floor({common.ZIPF_TOP}D / ({rank} + 1)) AS BIGINT)"
    if family == "plateau":
        tau = common.plateau_size(m, k)
        high = tau - tau // k
        n = common.PLATEAU_HEIGHT
        return (
            f"CAST(CASE WHEN {rank} < {high} THEN {n} WHEN {rank} < {tau} THEN {n - 1} "
            "ELSE 0 END AS BIGINT)"
        )
    raise ValueError(f"the Spark benchmark runs zipf and plateau, not {family!r}")


def write_table(spark: Any, path: Path, family: str, m: int, k: int, seed: int) -> float:
    """The family's table (id, score) in id order: rank = a * (id - c) mod m, a bijection (a
    coprime to m), so ids carry no order. Returns the seconds it took."""
    a = 7_919 + 2 * seed
    while math.gcd(a, m) != 1:
        a += 2
    c = 1_234_567 % m
    rank = f"pmod((id - {c}) * {a}, {m})"
    started = time.perf_counter()
    (
        spark.range(0, m, 1, max(2, m // 2_000_000))
        .selectExpr("id", f"{score_sql(family, m, k, rank)} AS score")
        .write.mode("overwrite")
        .parquet(str(path))
    )
    return time.perf_counter() - started


def rewrite_table(spark: Any, path: Path, family: str, m: int, k: int, seed: int) -> float:
    """Move every score of 1% of the items (those with id % 100 == 7) by 1 to 3 (and to at
    least 0), writing the table anew beside it and renaming it into place. Seconds taken."""
    started = time.perf_counter()
    fresh = path.with_name(path.name + "-next")
    shutil.rmtree(fresh, ignore_errors=True)
    (
        spark.read.parquet(str(path))
        .selectExpr(
            "id",
            "CASE WHEN id % 100 = 7 THEN greatest(score + 1 + pmod(id, 3) - 2 * pmod(id, 2), 0) "
            "ELSE score END AS score",
        )
        .write.parquet(str(fresh))
    )
    old = path.with_name(path.name + "-old")
    path.rename(old)
    fresh.rename(path)
    shutil.rmtree(old, ignore_errors=True)
    return time.perf_counter() - started


def spark_oneshot(spark: Any, path: Path, k: int, scale: float) -> list[int]:
    """Spark's own one-shot: ORDER BY score + Gumbel(scale) noise from rand(), LIMIT k."""
    rows = (
        spark.read.parquet(str(path))
        .selectExpr("id", f"score - {scale!r}D * ln(-ln(rand())) AS v")
        .orderBy("v", ascending=False)
        .limit(k)
        .collect()
    )
    return [int(r["id"]) for r in rows]


def run(cfg: SparkConfig) -> dict[str, Any]:
    from adapters.spark import SparkTable
    from topk_middleware import private_top_k
    from topk_middleware.privacy import calibrate

    started = time.perf_counter()
    spark = start_session(cfg)
    session_seconds = time.perf_counter() - started
    payload: dict[str, Any] = {
        "benchmark": "spark",
        "config": {k: v for k, v in asdict(cfg).items() if k not in ("out",)},
        "machine": common.machine_info(),
        "pyspark": spark.version,
        "session_start_seconds": session_seconds,
        "cases": [],
        "files": [],
    }
    cfg.data.mkdir(parents=True, exist_ok=True)
    for m in cfg.ms:
        for family in cfg.families:
            if cfg.only and f"{m}:{family}" not in cfg.only:
                continue
            path = cfg.data / f"{family}_{m:.0e}".replace("+", "")
            source_copy = str(path) + "-copy"
            case: dict[str, Any] = {"m": m, "family": family}
            if not (cfg.reuse and path.exists()):
                shutil.rmtree(source_copy, ignore_errors=True)
                case["write_seconds"] = write_table(spark, path, family, m, cfg.k, cfg.seed)
            source = SparkTable(spark, str(path), copy=source_copy)
            t = time.perf_counter()
            case["version"] = source.prepare()
            case["prepare_seconds"] = time.perf_counter() - t
            scale = float(calibrate("gumbel", cfg.k, m, cfg.epsilon, 0.0).scale)
            case["scale"] = scale
            timings: dict[str, list[float]] = {name: [] for name in METHODS}
            details: dict[str, list[Any]] = {"release": [], "threshold": [], "in_store": []}
            spark_oneshot(spark, path, cfg.k, scale)  # warm-up: file listing, code generation
            private_top_k(source, k=cfg.k, epsilon=cfg.epsilon, seed=cfg.seed, method="threshold")
            reps = max(cfg.reps, MIN_REPS_AT_1E8) if m >= 10**8 else cfg.reps
            names = [n for n in METHODS if n != "in_store" or cfg.in_store]
            label = f"spark m={m:.0e} {family}"
            for rep in common.progress(range(reps), desc=label, quiet=cfg.quiet):
                seed = cfg.seed + 100 + rep
                order = names[rep % len(names) :] + names[: rep % len(names)]
                for name in order:
                    seconds, detail = time_method(spark, source, path, name, cfg, scale, seed)
                    timings[name].append(seconds)
                    if name in details:
                        details[name].append(detail)
            case["reps"] = reps
            case["seconds"] = {n: v for n, v in timings.items() if v}
            case["median"] = {n: statistics.median(v) for n, v in timings.items() if v}
            med = case["median"]
            case["ratio_release_vs_spark"] = med["spark_oneshot"] / med["release"]
            case["ratio_threshold_vs_spark"] = med["spark_oneshot"] / med["threshold"]
            case["details"] = details
            if cfg.stale:
                case["stale"] = stale_releases(spark, source, path, family, m, cfg, scale)
            payload["cases"].append(case)
            common.write_json(cfg.out / f"{cfg.name}.json", payload)  # after every case
            print(case_line(case), flush=True)
    spark.stop()
    payload["files"].append(str(cfg.out / f"{cfg.name}.json"))
    if cfg.plots:
        payload["files"].append(str(plot(payload, cfg.out / f"{cfg.name}.png")))
    common.write_json(cfg.out / f"{cfg.name}.json", payload)
    return payload


def time_method(
    spark: Any, source: Any, path: Path, name: str, cfg: SparkConfig, scale: float, seed: int
) -> tuple[float, dict[str, Any] | None]:
    """Seconds of one method, and for a release its plan, accesses and query latencies."""
    from topk_middleware import private_top_k

    source.query_seconds = []
    t = time.perf_counter()
    if name == "spark_oneshot":
        spark_oneshot(spark, path, cfg.k, scale)
        return time.perf_counter() - t, None
    method = {"release": "auto", "threshold": "threshold"}.get(name, "oneshot_in_store")
    result = private_top_k(source, k=cfg.k, epsilon=cfg.epsilon, seed=seed, method=method)
    seconds = time.perf_counter() - t
    a = result.accesses
    return seconds, {
        "method": result.method,
        "plan": result.diagnostics.plan.get("auto"),
        "freshness": result.diagnostics.plan.get("freshness"),
        "sorted": a.sorted,
        "random": a.random,
        "rows_fetched": a.rows_fetched,
        "round_trips": a.round_trips,
        "query_seconds": list(source.query_seconds),
    }


def stale_releases(
    spark: Any, source: Any, path: Path, family: str, m: int, cfg: SparkConfig, scale: float
) -> dict[str, Any]:
    """After a write without prepare(): STALE_RELEASES releases (auto), each followed by
    Spark's one-shot on the new table, then prepare(refresh=True) if no release refreshed."""
    out: dict[str, Any] = {"write_seconds": rewrite_table(spark, path, family, m, cfg.k, cfg.seed)}
    releases, oneshots = [], []
    for i in range(STALE_RELEASES):
        seconds, detail = time_method(spark, source, path, "release", cfg, scale, cfg.seed + i)
        releases.append({"seconds": seconds, **(detail or {})})
        t = time.perf_counter()
        spark_oneshot(spark, path, cfg.k, scale)
        oneshots.append(time.perf_counter() - t)
    out["releases"], out["spark_oneshot"] = releases, oneshots
    t = time.perf_counter()
    source.prepare(refresh=True)
    out["refresh_seconds"] = time.perf_counter() - t
    return out


def case_line(case: dict[str, Any]) -> str:
    med = case["median"]
    trips = [d["round_trips"] for d in case["details"]["release"]]  # queries a release
    in_store = f"{med['in_store']:7.2f}" if "in_store" in med else "      -"
    return (
        f"| {case['m']:.0e} | {case['family']:<7} | {med['release']:7.2f} | "
        f"{med['threshold']:7.2f} | {med['spark_oneshot']:7.2f} | {in_store} | "
        f"{case['ratio_release_vs_spark']:5.1f}x | {statistics.median(trips):4.0f} | "
        f"{case['prepare_seconds']:6.0f} |"
    )


def stale_line(case: dict[str, Any]) -> str:
    """| m | family | each release after the write (path) | Spark's one-shot | refresh |"""
    stale = case["stale"]
    shown = ", ".join(
        f"{r['seconds']:.2f} ({(r.get('freshness') or {}).get('path', '?')})"
        for r in stale["releases"]
    )
    oneshot = statistics.median(stale["spark_oneshot"])
    return (
        f"| {case['m']:.0e} | {case['family']:<7} | {shown} | {oneshot:.2f} | "
        f"{stale['refresh_seconds']:.1f} |"
    )


def report(payload: dict[str, Any]) -> str:
    lines = [
        f"Spark {payload['pyspark']}, {payload['config']['master']}, k = "
        f"{payload['config']['k']}, epsilon = {payload['config']['epsilon']}; medians of "
        f"{payload['config']['reps']} interleaved repetitions (3 at least at 1e8), seconds; "
        "session start "
        f"{payload['session_start_seconds']:.0f} s",
        "",
        "| m | family | release (auto) | threshold | Spark one-shot | in-store keyed one-shot "
        "| Spark / release | queries a release | prepare |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [case_line(c) for c in payload["cases"]]
    stale = [c for c in payload["cases"] if "stale" in c]
    if stale:
        lines += [
            "",
            "After a write without prepare(): releases in order (path taken), Spark's one-shot "
            "on the new table (median), prepare(refresh=True), seconds",
            "",
            "| m | family | releases | Spark one-shot | refresh |",
            "|---|---|---|---|---|",
        ]
        lines += [stale_line(c) for c in stale]
    return "\n".join(lines)


def plot(payload: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = payload["cases"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.2
    labels = [f"{c['family']}\nm={c['m']:.0e}" for c in cases]
    for j, name in enumerate(METHODS):
        values = [c["median"].get(name, float("nan")) for c in cases]
        ax.bar([i + (j - 1.5) * width for i in range(len(cases))], values, width, label=name)
    ax.set_xticks(range(len(cases)), labels)
    ax.set_yscale("log")
    ax.set_ylabel("seconds (median)")
    ax.set_title(f"Spark {payload['pyspark']} {payload['config']['master']}: release vs one-shot")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
