"""Two commits of the project side by side on the same tables, each against the store's query.

    python -m benchmarks engine-ab --before COMMIT [--m 1e7] [--families zipf distinct]
        [--cases duckdb-frozen postgres-copy postgres-live-writes sqlalchemy-postgres
                 postgres-oblivious] [--reps 5]

What a restructuring must not cost. The commit `--before` is checked out in a temporary git
worktree; the working tree this module runs from is "after". Each side runs in a process of
its own that imports only its own checkout (PYTHONPATH), over its own copy of the same table
(same ids, same scores, rows in the same random order): a DuckDB file copied byte for byte, or
a PostgreSQL table made by CREATE TABLE AS from one loaded base. Cases (k = 10, epsilon = 1):

- ``duckdb-frozen``: `DuckDBTable(frozen=True)`, the default method;
- ``postgres-copy``: `PostgresTable(mode="copy")`, the copy current;
- ``postgres-live-writes``: `PostgresTable(mode="live")`, 1% of the rows moved by +1..+3
  before each release (the same rows on both sides);
- ``sqlalchemy-postgres``: `SQLAlchemyTable` over psycopg, the copy current;
- ``postgres-oblivious``: `PostgresTable(mode="live")`, `oblivious=True`.

Each rep times, on each side, the store's own one-shot query (`ORDER BY score - b ln(-ln
random()) LIMIT k`, b the release's Gumbel scale), the release, and the query again; the two
sides alternate which goes first (ABBA), so load drifts hit both alike. A point reports each
side's medians and its ratio against its own query (`vs_query`, above 1 the release is faster),
and `after_vs_before`, the after ratio over the before ratio (at least 0.9: within 10%).
Results: benchmarks/results/engine_ab.json (tables built once per family: about 2 minutes per
family at 10^7 on PostgreSQL).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from . import common
from .freshness import round_scores
from .wallclock import gumbel_scale

ROOT = Path(__file__).resolve().parent.parent
CASES = (
    "duckdb-frozen",
    "postgres-copy",
    "postgres-live-writes",
    "sqlalchemy-postgres",
    "postgres-oblivious",
)
WRITE_FRACTION = 0.01

# The side's process: JSON requests on stdin, JSON answers on stdout. It names only what both
# commits share (the public constructors and private_top_k), so one text serves both.
SIDE = r"""
import json, sys, time
import numpy as np
from topk_middleware import private_top_k
tables = {}

def open_case(case, where, dsn):
    if case == "duckdb-frozen":
        import duckdb
        from adapters.duckdb import DuckDBTable
        con = duckdb.connect(where)
        source = DuckDBTable(con, "t", frozen=True)
        query = lambda text: con.execute(text.replace("{t}", "t")).fetchall()
        write = None
        close = con.close
    elif case == "sqlalchemy-postgres":
        import sqlalchemy as sa
        from adapters.sqlalchemy import SQLAlchemyTable
        parts = dict(p.split("=", 1) for p in dsn.split())
        engine = sa.create_engine(
            f"postgresql+psycopg://{parts.get('user', 'postgres')}@{parts['host']}:"
            f"{parts.get('port', 5432)}/{parts['dbname']}")
        source = SQLAlchemyTable(engine, where)
        def query(text):
            with engine.connect() as conn:
                return conn.exec_driver_sql(text.replace("{t}", where)).all()
        write = None
        close = engine.dispose
    else:
        import psycopg
        from adapters.postgres import PostgresTable
        con = psycopg.connect(dsn, autocommit=True)
        source = PostgresTable(dsn, where, mode="copy" if case == "postgres-copy" else "live")
        query = lambda text: con.execute(text.replace("{t}", where)).fetchall()
        def write(ids, steps):
            con.execute(
                f"UPDATE {where} t SET score = t.score + s.d FROM unnest(%s::bigint[], "
                "%s::bigint[]) AS s(id, d) WHERE t.id = s.id", [ids, steps])
        close = con.close
    started = time.perf_counter()
    source.prepare()
    tables[case] = (source, query, write, close)
    return {"prepare_seconds": time.perf_counter() - started}

def release(case, k, epsilon, seed):
    source = tables[case][0]
    options = {"oblivious": True} if case == "postgres-oblivious" else {}
    started = time.perf_counter()
    result = private_top_k(source, k, epsilon, seed=seed, **options)
    return {"seconds": time.perf_counter() - started,
            "rows_fetched": int(result.accesses.rows_fetched)}

def timed_query(case, text):
    started = time.perf_counter()
    tables[case][1](text)
    return {"seconds": time.perf_counter() - started}

for line in sys.stdin:
    ask = json.loads(line)
    try:
        op = ask.pop("op")
        if op == "open":
            out = open_case(**ask)
        elif op == "release":
            out = release(**ask)
        elif op == "query":
            out = timed_query(**ask)
        elif op == "write":
            tables[ask["case"]][2](ask["ids"], ask["steps"])
            out = {}
        elif op == "close":
            source, _, _, close = tables.pop(ask["case"])
            source.uninstall()
            if hasattr(source, "close"):
                source.close()
            close()
            out = {}
        print(json.dumps({"ok": out}), flush=True)
    except Exception as error:
        print(json.dumps({"error": f"{type(error).__name__}: {error}"}), flush=True)
"""


class Side:
    """One commit's process (SIDE above), run from its checkout."""

    def __init__(self, name: str, checkout: Path, dsn: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(checkout), TOPK_PG_DSN=dsn)
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, "-c", SIDE],
            cwd=checkout,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, **request: Any) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = json.loads(self.process.stdout.readline() or '{"error": "the side exited"}')
        if "error" in answer:
            raise RuntimeError(f"{self.name}: {answer['error']}")
        return answer["ok"]

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


def _load_postgres(dsn: str, name: str, ids: np.ndarray, scores: np.ndarray) -> None:
    """The base table, by COPY of CSV that pyarrow writes (C++: seconds at 10^7 rows)."""
    import io

    import psycopg
    import pyarrow as pa
    import pyarrow.csv as pacsv

    buffer = io.BytesIO()
    options = pacsv.WriteOptions(include_header=False)
    pacsv.write_csv(pa.table({"id": ids, "score": scores}), buffer, options)
    with psycopg.connect(dsn, autocommit=True) as con:
        con.execute(f"CREATE TABLE {name} (id bigint NOT NULL, score bigint NOT NULL)")
        with (
            con.cursor() as cur,
            cur.copy(f"COPY {name} (id, score) FROM STDIN (FORMAT csv)") as copy,
        ):
            view = buffer.getbuffer()
            for at in range(0, len(view), 1 << 22):
                copy.write(view[at : at + (1 << 22)])
            del view


def _clone_postgres(dsn: str, base: str, name: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as con:
        con.execute(f"CREATE TABLE {name} AS SELECT id, score FROM {base}")
        con.execute(f"ALTER TABLE {name} ADD PRIMARY KEY (id)")
        con.execute(f"ANALYZE {name}")


def _drop_postgres(dsn: str, names: list[str]) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as con:
        for name in names:
            con.execute(f"DROP TABLE IF EXISTS {name} CASCADE")


def _load_duckdb(path: Path, ids: np.ndarray, scores: np.ndarray) -> None:
    import duckdb
    import pyarrow as pa

    frame = pa.table({"id": ids, "score": scores})  # noqa: F841 - read by the statement below
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, score BIGINT NOT NULL)")
        con.execute("INSERT INTO t SELECT id, score FROM frame")


def measure_family(
    family: str, cfg: argparse.Namespace, sides: dict[str, Side], dsn: str, workdir: Path
) -> list[dict[str, Any]]:
    """Every case of one family (module docstring)."""
    m, k, epsilon = cfg.m, cfg.k, 1.0
    scale = gumbel_scale(k, epsilon, m)
    scores = round_scores(family, m, k, scale).astype(np.int64)
    ids = common.shuffled_ids(m, seed=0)
    order = np.random.default_rng(1).permutation(m)
    ids, scores = ids[order], scores[order]
    text = f"SELECT id FROM {{t}} ORDER BY score - {scale!r} * ln(-ln(random())) DESC LIMIT {k}"
    tag = uuid.uuid4().hex[:6]
    points, made = [], []
    base = f"topk_ab_{tag}_base"
    needs_postgres = any(c != "duckdb-frozen" for c in cfg.cases)
    if needs_postgres:
        _load_postgres(dsn, base, ids, scores)
        made.append(base)
    if "duckdb-frozen" in cfg.cases:
        _load_duckdb(workdir / f"{tag}.duckdb", ids, scores)
    rng = np.random.default_rng(m)
    try:
        for case in cfg.cases:
            where: dict[str, str] = {}
            for name in sides:
                if case == "duckdb-frozen":
                    path = workdir / f"{tag}_{name}.duckdb"
                    shutil.copyfile(workdir / f"{tag}.duckdb", path)
                    where[name] = str(path)
                else:
                    where[name] = f"topk_ab_{tag}_{case.replace('-', '_')}_{name}"
                    _clone_postgres(dsn, base, where[name])
                    made.append(where[name])
            prepare = {
                n: s.ask(op="open", case=case, where=where[n], dsn=dsn) for n, s in sides.items()
            }
            times: dict[str, dict[str, list[float]]] = {
                n: {"release": [], "query": []} for n in sides
            }
            rows: dict[str, list[int]] = {n: [] for n in sides}
            for side in sides.values():  # warm-up, untimed
                side.ask(op="release", case=case, k=k, epsilon=epsilon, seed=0)
                side.ask(op="query", case=case, text=text)
            names = list(sides)
            for rep in range(cfg.reps):
                if case == "postgres-live-writes":
                    count = max(1, int(WRITE_FRACTION * m))
                    changed = ids[rng.choice(m, size=count, replace=False)].tolist()
                    steps = rng.integers(1, 4, size=count).tolist()
                    for side in sides.values():
                        side.ask(op="write", case=case, ids=changed, steps=steps)
                for name in names if rep % 2 == 0 else names[::-1]:
                    side = sides[name]
                    times[name]["query"].append(
                        side.ask(op="query", case=case, text=text)["seconds"]
                    )
                    got = side.ask(op="release", case=case, k=k, epsilon=epsilon, seed=rep + 1)
                    times[name]["release"].append(got["seconds"])
                    rows[name].append(got["rows_fetched"])
                    times[name]["query"].append(
                        side.ask(op="query", case=case, text=text)["seconds"]
                    )
            for side in sides.values():
                side.ask(op="close", case=case)
            point: dict[str, Any] = {"case": case, "family": family, "m": m, "k": k}
            point["tables"] = where
            for name in sides:
                release = statistics.median(times[name]["release"])
                query = statistics.median(times[name]["query"])
                point[name] = {
                    "prepare_seconds": prepare[name]["prepare_seconds"],
                    "release": times[name]["release"],
                    "query": times[name]["query"],
                    "rows_fetched": rows[name],
                    "release_median": release,
                    "query_median": query,
                    "vs_query": query / release,
                }
            point["after_vs_before"] = point["after"]["vs_query"] / point["before"]["vs_query"]
            point["load_average"] = list(os.getloadavg())
            points.append(point)
            print(
                f"{family:9s} {case:22s} before {point['before']['vs_query']:8.2f}x  "
                f"after {point['after']['vs_query']:8.2f}x  after/before "
                f"{point['after_vs_before']:.2f}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        if needs_postgres:
            _drop_postgres(dsn, made)
    return points


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--before", required=True, help="the commit measured as 'before'")
    parser.add_argument("--m", type=float, default=1e7, help="rows per table (default 1e7)")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--families", nargs="+", default=["zipf", "distinct"])
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--reps", type=int, default=5, help="releases per side and case")


def main(args: argparse.Namespace) -> Path:
    args.m = int(args.m)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # a kill still drops what was built
    dsn = os.environ.get("TOPK_PG_DSN", common.DEFAULT_PG_DSN)
    before = subprocess.run(
        ["git", "rev-parse", args.before], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="topk_engine_ab_") as scratch:
        workdir = Path(scratch)
        checkout = workdir / "before"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "--quiet", str(checkout), before],
            cwd=ROOT,
            check=True,
        )
        sides = {"before": Side("before", checkout, dsn), "after": Side("after", ROOT, dsn)}
        try:
            points = [
                p for f in args.families for p in measure_family(f, args, sides, dsn, workdir)
            ]
        finally:
            for side in sides.values():
                side.stop()
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(checkout)], cwd=ROOT, check=False
            )
    payload = {
        "machine": common.machine_info(dsn),
        "before": before,
        "before_checkout": str(checkout),
        "after": common.git_commit(),
        "m": args.m,
        "reps": args.reps,
        "seconds": time.perf_counter() - started,
        "target": "after_vs_before >= 0.9 at every point",
        "points": points,
    }
    return common.write_json(common.output_dir(args) / f"{args.name or 'engine_ab'}.json", payload)
