"""`topk-middleware release` end to end, as a user times it: a process per call.

    python -m benchmarks.cli [--store duckdb|postgres] [--m 10000000] [--reps 9] [--quick]

A table of m counts (the zipf family of benchmarks/common.py, ids a seeded permutation) in a
DuckDB file (`--store duckdb`, the default) or in PostgreSQL at TOPK_PG_DSN (`--store postgres`,
a table of its own, dropped at the end), prepared once in copy mode (`topk-middleware prepare`).
The project's modules are byte-compiled first (compileall), as a pip install leaves them, so
that no run pays for parsing source. Then, interleaved rep by rep after one untimed warm-up of
each, each a new process started and waited for (wall time from spawn to exit):

* ``release``: `topk-middleware release URL --table votes --id id --score score --k 10
  --epsilon 1` (the default: an oblivious release), output to a pipe;
* ``release_adaptive``: the same with --adaptive (the threshold algorithm);
* ``release_frozen`` (DuckDB only): the default release with --frozen, which reads the
  prepared copy (without it a DuckDB table is read as it is now);
* ``store_query``: a Python process that opens the store with its driver (duckdb, psycopg) and
  runs the store's own one-shot query (`ORDER BY score - (k / epsilon) ln(-ln random()) DESC
  LIMIT k`, a full scan): what a user would run instead, started the same way;
* ``help``: `topk-middleware --help`; ``python``: `python -c pass` (the interpreter's start).

Each run records its wall time and its CPU time (user + system, from the children's rusage): on
a loaded machine a process waits for a core, which the wall time counts and the CPU time does
not. The load average is read before every rep (`load_averages`).

Once more, with `python -X importtime`, the release's imports: their total time and the
top-level packages loaded.

Results: cli.json (DuckDB) or cli_postgres.json (medians of wall and CPU time, ratios, every
rep, the imports) in benchmarks/results/ (a --quick run: m = 10^4, 1 rep, in
benchmarks/scratch/), or in --out.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import io
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np

from . import common

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("topk_middleware", "adapters", "frontends")


def _command() -> list[str]:
    """The console script beside this interpreter, else `python -m frontends`."""
    script = Path(sys.executable).parent / "topk-middleware"
    return [str(script)] if script.exists() else [sys.executable, "-m", "frontends"]


def _prepare(url: str, table: str) -> float:
    """`topk-middleware prepare URL --table TABLE` (copy mode); its seconds."""
    started = time.perf_counter()
    done = subprocess.run(
        [*_command(), "prepare", url, "--table", table, "--no-progress"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"prepare failed: {done.stderr.strip()}")
    return time.perf_counter() - started


@contextlib.contextmanager
def _duckdb_store(folder: Path, m: int, k: int) -> Iterator[dict]:
    """The zipf table of m counts in a new DuckDB file, prepared by the CLI."""
    import pyarrow as pa

    path = folder / "votes.duckdb"
    data = pa.table(  # noqa: F841 - read by DuckDB's replacement scan below
        {"id": common.shuffled_ids(m), "score": common.family_scores("zipf", m, k)}
    )
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE votes AS SELECT * FROM data")
    con.close()
    oneshot = (
        f"SELECT id FROM votes ORDER BY score - {k / 1.0!r} * ln(-ln(random())) DESC LIMIT {k}"
    )
    query = (
        f"import duckdb; con = duckdb.connect({str(path)!r}, read_only=True); "
        f"print(con.execute({oneshot!r}).fetchall())"
    )
    yield {"url": str(path), "table": "votes", "prepare": _prepare(str(path), "votes"),
           "query": query}  # fmt: skip


@contextlib.contextmanager
def _postgres_store(m: int, k: int, existing: str | None = None) -> Iterator[dict]:
    """The zipf table of m counts in PostgreSQL at TOPK_PG_DSN (COPY), prepared by the CLI in
    copy mode; unprepared and dropped at the end. `existing`: a table of those counts already
    there and prepared, timed as it is and left alone."""
    import psycopg

    dsn = os.environ.get("TOPK_PG_DSN", common.DEFAULT_PG_DSN)
    parts = psycopg.conninfo.conninfo_to_dict(dsn)
    user = f"{parts['user']}@" if parts.get("user") else ""
    url = f"postgresql://{user}{parts.get('host', '127.0.0.1')}:{parts.get('port', 5432)}/"
    url += str(parts.get("dbname", "postgres"))
    if existing is not None:
        oneshot = (
            f"SELECT id FROM {existing} ORDER BY score - {k / 1.0!r} * ln(-ln(random())) DESC "
            f"LIMIT {k}"
        )
        query = (
            f"import psycopg; con = psycopg.connect({dsn!r}); "
            f"print(con.execute({oneshot!r}).fetchall()); con.close()"
        )
        yield {"url": url, "table": existing, "prepare": None, "query": query,
               "postgresql": common.postgres_version(dsn)}  # fmt: skip
        return
    table = f"topk_cli_bench_{uuid.uuid4().hex[:8]}"
    conn = psycopg.connect(dsn, autocommit=True)
    try:
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, score bigint NOT NULL)")
        ids, scores = common.shuffled_ids(m), common.family_scores("zipf", m, k)
        with conn.cursor() as cur, cur.copy(f"COPY {table} (id, score) FROM STDIN") as copy:
            for start in range(0, m, 10**6):
                chunk = np.column_stack([ids[start : start + 10**6], scores[start : start + 10**6]])
                text = io.StringIO()
                np.savetxt(text, chunk, fmt="%d", delimiter="\t")
                copy.write(text.getvalue())
        conn.execute(f"ANALYZE {table}")
        oneshot = (
            f"SELECT id FROM {table} ORDER BY score - {k / 1.0!r} * ln(-ln(random())) DESC "
            f"LIMIT {k}"
        )
        query = (
            f"import psycopg; con = psycopg.connect({dsn!r}); "
            f"print(con.execute({oneshot!r}).fetchall()); con.close()"
        )
        yield {"url": url, "table": table, "prepare": _prepare(url, table), "query": query,
               "postgresql": common.postgres_version(dsn)}  # fmt: skip
    finally:
        subprocess.run(
            [*_command(), "unprepare", url, "--table", table], capture_output=True, text=True
        )
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.close()


def _timed(argv: list[str]) -> tuple[float, float]:
    """Wall seconds from spawn to exit, and the CPU seconds (user + system) the process used:
    on a loaded machine the wall time grows with the wait for a core, the CPU time barely."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:3]} failed: {done.stderr.strip()[-300:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, cpu


def _imports(argv: list[str]) -> dict:
    """Total import time (the sum of the top-level rows of -X importtime), those rows, and every
    package (first name component) a `python -X importtime -m frontends ...` run loads."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "frontends", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    top: dict[str, float] = {}
    packages: set[str] = set()
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line[len("import time:") :].split("|")
        packages.add(name.strip().split(".")[0])
        if not name.startswith("  "):  # a module imported by the command itself
            top[name.strip()] = int(cumulative) / 1e6
    return {"seconds": sum(top.values()), "top_level": top, "packages": sorted(packages)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("duckdb", "postgres"), default="duckdb")
    parser.add_argument("--m", type=int, default=10**7)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument(
        "--table",
        default=None,
        help="postgres: time this table of the zipf counts, already there and prepared (not "
        "made, not dropped)",
    )
    common.add_output_arguments(parser, "m = 10^4, 1 rep")
    args = parser.parse_args(argv)
    m, reps, k, epsilon = (10**4, 1, 10, 1.0) if args.quick else (args.m, args.reps, 10, 1.0)
    for package in PACKAGES:
        compileall.compile_dir(ROOT / package, quiet=1)
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        store = stack.enter_context(
            _duckdb_store(folder, m, k)
            if args.store == "duckdb"
            else _postgres_store(m, k, args.table)
        )
        arguments = [
            "release", store["url"], "--table", store["table"], "--id", "id", "--score",
            "score", "--k", str(k), "--epsilon", repr(epsilon),
        ]  # fmt: skip
        release = [*_command(), *arguments]
        runs = {"release": release, "release_adaptive": [*release, "--adaptive"]}
        if args.store == "duckdb":
            runs["release_frozen"] = [*release, "--frozen"]
        runs.update(
            store_query=[sys.executable, "-c", store["query"]],
            help=[*_command(), "--help"],
            python=[sys.executable, "-c", "pass"],
        )
        for run in runs.values():
            _timed(run)
        times: dict[str, list[float]] = {label: [] for label in runs}
        cpu: dict[str, list[float]] = {label: [] for label in runs}
        loads: list[list[float]] = []
        labels = list(runs)
        for rep in range(reps):
            loads.append([round(x, 2) for x in os.getloadavg()])
            for label in labels[rep % len(labels) :] + labels[: rep % len(labels)]:
                wall, used = _timed(runs[label])
                times[label].append(wall)
                cpu[label].append(used)
        loads.append([round(x, 2) for x in os.getloadavg()])
        imports = _imports(arguments)
    medians = {label: statistics.median(values) for label, values in times.items()}
    payload = {
        "benchmark": "cli",
        "store": args.store,
        "m": m,
        "k": k,
        "epsilon": epsilon,
        "reps": reps,
        "prepare_seconds": store["prepare"],
        "median_seconds": medians,
        "ratio_store_query_to_release": medians["store_query"] / medians["release"],
        "ratio_store_query_to_release_adaptive": (
            medians["store_query"] / medians["release_adaptive"]
        ),
        "median_cpu_seconds": {label: statistics.median(v) for label, v in cpu.items()},
        "load_averages": loads,
        "release_imports": imports,
        "seconds": times,
        "cpu_seconds": cpu,
        "bytecode": "compiled (compileall) before the runs",
        "pythondontwritebytecode": os.environ.get("PYTHONDONTWRITEBYTECODE"),
        "machine": common.machine_info(),
    }
    if args.store == "postgres":
        payload["machine"]["postgresql"] = store.get("postgresql")
    name = "cli.json" if args.store == "duckdb" else f"cli_{args.store}.json"
    out = common.write_json(common.output_dir(args) / name, payload)
    for label, value in medians.items():
        used = payload["median_cpu_seconds"][label]
        print(f"{label:17s} {value * 1e3:9.1f} ms wall {used * 1e3:9.1f} ms cpu")
    print(f"release imports   {imports['seconds'] * 1e3:9.1f} ms")
    print(f"store query / release {payload['ratio_store_query_to_release']:.2f}")
    print(f"load averages {loads[0]} .. {loads[-1]}")
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
