"""The benchmark harness in a tiny mode: JSON fields, and numbers that must agree with each other.

Not a performance test (no wall-clock assertion): it checks that the access sweep reports what
private_top_k counted (one-shot reads exactly m rows; every sorted and every random access of
the sequential algorithm is a fetched row), that the reference lines are Theorem 4.2's formula,
and that the wall-clock harness runs every method on a real DuckDB file and the real PostgreSQL
server and reports ratios of its own medians.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path

import numpy as np
import psycopg
import pytest

from benchmarks import access, common, wallclock
from benchmarks.__main__ import main

PG_DSN = os.environ.get("TOPK_PG_DSN", common.DEFAULT_PG_DSN)
# Fixed topk_bench_* tables on the server and a module-scoped sweep: one worker runs these.
pytestmark = pytest.mark.xdist_group("bench-harness")


@pytest.fixture(scope="module")
def access_payload(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("access")
    main(
        [
            "access", "--out", str(out), "--name", "tiny", "--quiet", "--jobs", "1",
            "--min-m", "1e3", "--max-m", "1e3", "--k", "1", "10", "--runs", "6",
            "--min-runs", "6", "--oneshot-runs", "2",
        ]
    )  # fmt: skip
    payload = json.loads((out / "tiny.json").read_text())
    payload["_out"] = str(out)
    return payload


def test_access_json_has_machine_and_every_point(access_payload: dict) -> None:
    machine = access_payload["machine"]
    for key in ("cpu_count", "python", "numpy", "duckdb", "git_commit", "command"):
        assert key in machine
    points = access_payload["points"]
    combos = {(p["family"], p["k"], p["method"]) for p in points}
    for family in common.FAMILIES:
        for k in (1, 10):
            for method in ("threshold-gumbel", "threshold-laplace", "oneshot"):
                assert (family, k, method) in combos
        assert (family, 1, "exponential") in combos
        assert (family, 10, "exponential") not in combos  # the exponential mechanism is k = 1
    out = Path(access_payload["_out"])
    for family in common.FAMILIES:
        png = out / f"tiny_{family}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_access_numbers_are_consistent(access_payload: dict) -> None:
    for p in access_payload["points"]:
        m, k = p["m"], p["k"]
        assert p["runs"] == p["runs_planned"]
        assert p["bound"] == pytest.approx(2 * (math.sqrt(m * k) + math.sqrt(m / 2)))
        assert p["sqrt_mk"] == pytest.approx(math.sqrt(m * k))
        total = p["total"]
        assert total["min"] <= total["median"] <= total["p95"] <= total["max"]
        assert total["min"] <= total["mean"] <= total["max"]
        assert p["sorted"]["mean"] + p["random"]["mean"] == pytest.approx(total["mean"])
        assert p["rows_fetched_cover_accesses"]
        assert p["mean_over_bound"] == pytest.approx(total["mean"] / p["bound"])
        if p["method"] == "oneshot":
            assert p["total_equals_m"] and total["min"] == total["max"] == m
        else:
            # each seen item is at least one access, and the k released items must be seen
            assert total["min"] >= k
    fits = access_payload["plateau_slopes"]
    assert fits == []  # a single m gives no slope


def test_slope_is_the_loglog_fit() -> None:
    ms = [10**3, 10**4, 10**5]
    assert common.loglog_slope(ms, [3 * m**0.5 for m in ms]) == pytest.approx(0.5)
    points = [
        {"family": "plateau", "method": "threshold-gumbel", "k": 10, "m": m,
         "total": {"mean": 2.0 * m**0.55}}
        for m in ms
    ]  # fmt: skip
    (fit,) = access.slopes(points)
    assert fit["slope"] == pytest.approx(0.55) and fit["in_target_range"]


def test_family_histograms_match_their_definitions() -> None:
    m, k = 10_000, 10
    plateau = common.family_scores("plateau", m, k)
    tau = math.isqrt(m * k - 1) + 1  # ceil(sqrt(mk)) = 317 items on the plateau
    assert tau == 317
    assert (plateau > 0).sum() == tau
    assert (plateau == plateau.max()).sum() == tau - tau // k  # S_H; S_L = tau // k one below
    zipf = common.family_scores("zipf", m, k)
    assert zipf[0] == common.ZIPF_TOP and zipf[9] == common.ZIPF_TOP // 10
    assert np.all(np.diff(common.family_scores("uniform", m, k)) <= 0)
    assert len(set(common.family_scores("flat", m, k).tolist())) == 1


def test_pg_copy_payload_loads_rows_exactly() -> None:
    ids = np.array([5, 1, 9], dtype=np.int64)
    scores = np.array([10, 0, 2**40], dtype=np.int64)
    with psycopg.connect(PG_DSN, autocommit=True) as con:
        con.execute("CREATE TEMP TABLE copy_check (id bigint, score bigint)")
        with con.cursor() as cur, cur.copy("COPY copy_check FROM STDIN (FORMAT BINARY)") as copy:
            copy.write(wallclock.pg_copy_payload(ids, scores))
        rows = con.execute("SELECT id, score FROM copy_check ORDER BY id").fetchall()
    assert rows == [(1, 0), (5, 10), (9, 2**40)]


def test_wallclock_harness_on_duckdb_and_postgres(tmp_path: Path) -> None:
    out = tmp_path / "wall"
    main(
        [
            "wallclock", "--out", str(out), "--name", "tiny", "--quiet", "--m", "1000",
            "--reps", "2", "--scan-reps", "1", "--duckdb-path", str(tmp_path / "b.duckdb"),
            "--pg-dsn", PG_DSN,
        ]
    )  # fmt: skip
    payload = json.loads((out / "tiny.json").read_text())
    assert payload["machine"]["postgresql"]  # the server's version was recorded
    assert payload["skipped"] == []
    entries = payload["results"]
    assert {(e["store"], e["family"]) for e in entries} == {
        (s, f) for s in ("duckdb", "postgres") for f in ("zipf", "plateau")
    }
    for e in entries:
        assert e["m"] == 1000 and e["k"] == 10
        assert e["load_seconds"] > 0 and e["prepare_seconds"] > 0
        methods = e["methods"]
        assert {"threshold", "oneshot_scan", "oneshot_sql"} <= set(methods)
        thr = methods["threshold"]
        assert thr["reps"] == 2 and len(thr["seconds"]) == 2
        assert thr["median"] == pytest.approx(float(np.median(thr["seconds"])))
        for name, ratio in e["speedup"].items():
            assert ratio == pytest.approx(methods[name]["median"] / thr["median"])
        stats = thr["accesses"]
        assert stats["rows_fetched"] >= max(stats["sorted"], stats["random"])
        assert stats["total"] >= e["k"]
        assert stats["round_trips"] >= 2
        scan = methods["oneshot_scan"]["accesses"]
        assert scan["total"] == scan["sorted"] == scan["rows_fetched"] == 1000
        sql = methods["oneshot_sql"]["accesses"]
        assert sql["round_trips"] == 1 and sql["rows_scanned_by_store"] == 1000
        assert "ln(-ln(random()))" in e["oneshot_sql_query"]
        assert e["gumbel_scale"] == pytest.approx(e["k"] / e["epsilon"])  # Fact 3.3, pure DP
        b = e["threshold_breakdown"]
        assert b["store_seconds"] + b["python_seconds"] == pytest.approx(b["seconds"])
    table = (out / "tiny.md").read_text()
    assert table.count("\n| duckdb |") == 2 and table.count("\n| postgres |") == 2
    assert (out / "tiny.png").read_bytes()[:4] == b"\x89PNG"
    # the tables were dropped afterwards
    with psycopg.connect(PG_DSN) as con:
        left = con.execute("SELECT to_regclass('topk_bench_zipf_1000')").fetchone()[0]
    assert left is None


def test_freshness_harness(tmp_path: Path) -> None:
    """The freshness benchmark: after 1% writes, a refresh (DuckDB: by delta, one read of the
    table; PostgreSQL live: none) and a release, the SQL one-shot, and today's run; ratios are
    those of the medians; the PostgreSQL tables, position table and rank tables are dropped."""
    out = tmp_path / "fresh"
    args = ["--out", str(out), "--name", "tiny", "--quiet", "--m", "2000", "--reps", "2"]
    main(["freshness", "--first-release", *args])
    payload = json.loads((out / "tiny.json").read_text())
    entries = payload["results"]
    assert {(e["store"], e["family"]) for e in entries} == {
        ("duckdb", "zipf"),
        ("duckdb", "plateau"),
        ("postgres-live", "zipf"),
        ("postgres-live", "plateau"),
    }
    for e in entries:
        assert e["items_written"] == 20 and 0 < e["rows_changed"] <= 20
        if e["store"] == "postgres-live":
            assert e["refresh"]["kind"].startswith("none")
            assert e["release_unchanged_accesses"]["rows_fetched"] > 0
            continue
        assert e["refresh"]["kind"] == "delta" and e["refresh"]["table_reads"] == 1
        assert e["refresh"]["changed"] == e["rows_changed"]
        med = {name: v["median"] for name, v in e["methods"].items()}
        assert all(len(v["seconds"]) == 2 for v in e["methods"].values())
        ratio = e["ratios"]["fresh_vs_oneshot_sql"]
        assert ratio == pytest.approx(med["fresh_release"] / med["oneshot_sql"])
    assert (out / "tiny.png").read_bytes()[:4] == b"\x89PNG"
    with psycopg.connect(PG_DSN) as con:
        left = con.execute(
            "SELECT count(*) FROM pg_class WHERE relname LIKE 'topk_bench_%_2000%'"
        ).fetchone()[0]
    assert left == 0


def test_freshness_rounds_harness(tmp_path: Path) -> None:
    """The default freshness benchmark, tiny: every family on DuckDB, two rounds of 1% writes
    (the frozen copy's delta grows), each round's default release, refresh + release and the
    store's query timed rep by rep, ratios those of the medians; PostgreSQL live on zipf; the
    targets listed; the tables dropped."""
    out = tmp_path / "rounds"
    sizes = ["--m", "3000", "--reps", "2", "--rounds", "2"]
    main(["freshness", "--out", str(out), "--name", "tiny", "--quiet", *sizes])
    payload = json.loads((out / "tiny.json").read_text())
    entries = payload["results"]
    assert [(e["store"], e["family"]) for e in entries] == [
        *(("duckdb", f) for f in ("zipf", "plateau", "distinct", "uniform", "sparse", "band")),
        ("postgres-live", "zipf"),
    ]
    for e in entries:
        assert [r["round"] for r in e["rounds"]] == [1, 2]
        for r in e["rounds"]:
            assert len(r["release"]["seconds"]) == len(r["oneshot_sql"]["seconds"]) == 2
            ratio = r["oneshot_sql"]["median"] / r["release"]["median"]
            assert r["sql_vs_release"] == pytest.approx(ratio)
        if e["store"] != "duckdb":
            continue
        assert e["frozen_copy_release"]["median"] > 0 and e["sql_vs_frozen_copy"] > 0
        deltas = [r["refresh_report"]["delta_rows"] for r in e["rounds"]]
        assert e["rounds"][0]["refresh_report"]["kind"] == "delta" and 0 < deltas[0] < deltas[1]
        for r in e["rounds"]:
            whole = r["refresh_and_release"]["median"]
            assert r["sql_vs_refresh_and_release"] == pytest.approx(
                r["oneshot_sql"]["median"] / whole
            )
            # 3,000 rows are under DuckDB's crossover for reading a table whole: the release
            # reads every row in one statement and the planner picks among runs in memory (no
            # in-store one-shot on the table): the one-shot over the rows, which in Python
            # costs less than a threshold run's first block.
            assert r["plans"]["release"] == ["oneshot_full_read"]
    assert {t["what"].split(",")[0] for t in payload["targets"]} >= {
        "duckdb zipf m=3e+03",
        "postgres-live zipf m=3e+03",
    }
    assert (out / "tiny.png").read_bytes()[:4] == b"\x89PNG"
    with psycopg.connect(PG_DSN) as con:
        left = con.execute(
            "SELECT count(*) FROM pg_class WHERE relname LIKE 'topk_bench_%_3000%'"
        ).fetchone()[0]
    assert left == 0


def test_in_store_harness(tmp_path: Path) -> None:
    """The SQLAlchemy in-store benchmark: every dialect and family timed, the ratio that of the
    medians, the plain query the dialect's own random() at the release's Gumbel scale, and the
    tables (base, rank, runs) dropped afterwards."""
    from benchmarks import in_store

    out = tmp_path / "in_store"
    args = ["--m", "3000", "--reps", "2", "--families", "zipf", "uniform", "--name", "tiny"]
    in_store.main([*args, "--out", str(out)])
    payload = json.loads((out / "tiny.json").read_text())
    entries = payload["results"]
    assert {(e["dialect"], e["family"]) for e in entries} == {
        (d, f) for d in ("sqlite", "postgresql") for f in ("zipf", "uniform")
    }
    for e in entries:
        assert len(e["in_store_s"]) == len(e["oneshot_sql_s"]) == 2
        assert e["ratio"] == pytest.approx(e["oneshot_sql_median_s"] / e["in_store_median_s"])
        assert "DESC LIMIT 10" in e["oneshot_sql_query"]
    assert (out / "tiny.png").read_bytes()[:4] == b"\x89PNG"
    assert "| sqlite | zipf |" in (out / "tiny.md").read_text()
    with psycopg.connect(PG_DSN) as con:
        left = con.execute(
            "SELECT count(*) FROM pg_class WHERE relname LIKE 'topk_in_store_%_3000%'"
        ).fetchone()[0]
    assert left == 0


def test_oblivious_harness(tmp_path: Path) -> None:
    """python -m benchmarks oblivious on DuckDB (copy and table) and PostgreSQL (copy and live),
    small m: every store and family reads the same 2d rows in 3 round trips, and both timings
    are recorded."""
    from topk_middleware.mechanisms.oblivious import oblivious_depth

    out = tmp_path / "obliv"
    main(
        [
            "oblivious", "--out", str(out), "--name", "tiny", "--m", "20000", "--reps", "2",
            "--duckdb-path", str(tmp_path / "o.duckdb"), "--pg-dsn", PG_DSN,
        ]
    )  # fmt: skip
    payload = json.loads((out / "tiny.json").read_text())
    entries = payload["entries"]
    assert {(e["store"], e["family"]) for e in entries} == {
        (s, f)
        for s in ("duckdb", "duckdb-live", "postgres", "postgres-live")
        for f in ("zipf", "plateau", "distinct")
    }
    d = oblivious_depth(20000, 10, 1e-9)
    for e in entries:
        assert e["rows_and_round_trips"] == [[2 * d, 3]]
        assert len(e["seconds"]["oneshot_sql"]) == len(e["seconds"]["oblivious"]) == 2
        assert e["median"]["oblivious"] >= e["deadline"] or e["deadline_missed"] > 0


def test_work_caps_quick_writes_every_case(tmp_path: Path) -> None:
    """`python -m benchmarks work-caps --quick` (m / 100, small k): one point per case with its
    seconds and peak memory, the machine and its load (about 12 s under load: six fresh
    processes, each importing numpy)."""
    from benchmarks import work_caps

    main(["work-caps", "--quick", "--quiet", "--out", str(tmp_path)])
    payload = json.loads((tmp_path / "work_caps.json").read_text())
    assert [p["case"] for p in payload["points"]] == [c[0] for c in work_caps.CASES]
    assert all(p["seconds"] > 0 and p["peak_mib"] > 0 for p in payload["points"])
    assert len(payload["load_average"]) == 3
    assert payload["target"] == {"seconds": 10, "peak_mib": 256}


def test_sizes_harness(tmp_path: Path) -> None:
    """benchmarks/sizes.py, tiny: m = 2,000, zipf, DuckDB (frozen, default, after writes) and
    PostgreSQL copy mode after writes; each point has the release's and the query's times,
    the ratio of their medians and the floor (a full read plus an in-memory release); the
    PostgreSQL table is dropped. A few seconds."""
    out = tmp_path / "sizes"
    args = ["--ms", "2000", "--families", "zipf", "--reps", "1", "--rounds", "2", "--no-plot"]
    main(["sizes", "--out", str(out), "--quiet", "--stores", "duckdb", *args])
    pg = ["--name", "pg", "--stores", "postgres-copy", "--states", "writes"]
    main(["sizes", "--out", str(out), "--quiet", *pg, *args])
    entries = json.loads((out / "sizes.json").read_text())["results"]
    entries += json.loads((out / "pg.json").read_text())["results"]
    assert [(e["store"], e["state"]) for e in entries] == [
        ("duckdb", "frozen"),
        ("duckdb", "default"),
        ("duckdb", "writes"),
        ("postgres-copy", "writes"),
    ]
    for e in entries:
        assert e["vs_query"] == pytest.approx(
            statistics.median(e["query"]) / statistics.median(e["release"])
        )
        assert e["floor_kind"] == "full read + in memory" and len(e["floor"]) >= 1
    assert {p["read"] for p in entries[-1]["plans"]} <= {"around", "table"}
    dsn = os.environ.get("TOPK_PG_DSN", common.DEFAULT_PG_DSN)
    with psycopg.connect(dsn, autocommit=True) as con:
        left = con.execute(
            "SELECT count(*) FROM pg_class WHERE relname LIKE 'topk_sizes_%'"
        ).fetchone()[0]
    assert left == 0


def test_trending_harness(tmp_path: Path) -> None:
    """benchmarks/trending.py --quick (T = 48, one repetition, m = 10^5 on PostgreSQL): both
    mechanisms on the three streams within their total, every PostgreSQL tick on both ledgers
    with its phases, the ratios of the one-shot query's median to the median and slowest ticks,
    and nothing left on the server (the table, the ledger's database)."""
    from benchmarks import trending

    trending.main(["--quick", "--epsilons", "2", "--out", str(tmp_path)])
    precision = json.loads((tmp_path / "trending.json").read_text())["precision"]
    assert sorted(precision) == ["epsilon = 2, delta = 0", "epsilon = 2, delta = 1e-06"]
    for streams in precision.values():
        assert sorted(streams) == ["fast", "flights", "slow"]
        for result in streams.values():
            for mechanism in ("gated", "independent"):
                run = result[mechanism]
                assert len(run["precision_by_tick"]) == 48
                assert all(0.0 <= p <= 1.0 for p in run["precision_by_tick"])
                assert max(run["spent_epsilon"]) <= 2.0 * (1 + 1e-9)
    pg = json.loads((tmp_path / "trending_postgres.json").read_text())["postgres"]
    oneshot = pg["oneshot_sql_median_s"]
    assert oneshot == pytest.approx(statistics.median(pg["oneshot_sql_s"]))
    for name in ("sqlite", "postgresql"):
        for mechanism in ("gated", "independent"):
            found, ticks = pg["ledgers"][name][mechanism], pg["ledgers"][name]["ticks"][mechanism]
            assert len(ticks) == 7 and all(t["phases_ms"] for t in ticks)
            slowest = max(t["seconds"] for t in ticks)
            assert found["ratio_oneshot_over_slowest_tick"] == pytest.approx(oneshot / slowest)
            assert found["most_rows_read"] < pg["sqrt_mk"]
        gated = [t["fresh"] for t in pg["ledgers"][name]["ticks"]["gated"]]
        assert gated[0] and gated[-1]  # the first list, and the one after the jump
    # this run's own table and ledger database (another run on the server may hold its own)
    table, ledger = pg["table"], pg["ledger_database"]
    with psycopg.connect(PG_DSN, autocommit=True) as con:
        left = con.execute(
            "SELECT (SELECT count(*) FROM pg_class WHERE relname LIKE %(t)s), "
            "(SELECT count(*) FROM pg_proc WHERE prosrc LIKE %(in_t)s), "
            "(SELECT count(*) FROM pg_database WHERE datname = %(ledger)s)",
            {"t": table + "%", "in_t": "%" + table + "%", "ledger": ledger},
        ).fetchone()
    assert table.startswith("topk_trend_bench_") and left == (0, 0, 0)


def test_engine_ab_harness(tmp_path: Path) -> None:
    """benchmarks/engine_ab.py, tiny: the commit checked out against itself (HEAD on both
    sides), m = 2,000, zipf, a frozen DuckDB copy and PostgreSQL live mode after writes; each
    side ran in its own process from its own checkout, each point has both sides' times, their
    ratios against their own query and after over before; the worktree and the PostgreSQL
    tables are gone afterwards. About 10 s."""
    import subprocess

    out = tmp_path / "ab"
    cases = ["--cases", "duckdb-frozen", "postgres-live-writes"]
    args = ["--before", "HEAD", "--m", "2000", "--families", "zipf", "--reps", "2", *cases]
    main(["engine-ab", "--out", str(out), "--quiet", *args])
    payload = json.loads((out / "engine_ab.json").read_text())
    assert payload["after"].removesuffix("+dirty") == payload["before"]  # after: the tree itself
    assert [p["case"] for p in payload["points"]] == ["duckdb-frozen", "postgres-live-writes"]
    for point in payload["points"]:
        for side in ("before", "after"):
            got = point[side]
            assert len(got["release"]) == 2 and len(got["query"]) == 4
            assert got["vs_query"] == pytest.approx(
                statistics.median(got["query"]) / statistics.median(got["release"])
            )
            assert all(rows >= 10 for rows in got["rows_fetched"])
        assert point["after_vs_before"] == pytest.approx(
            point["after"]["vs_query"] / point["before"]["vs_query"]
        )
    live = payload["points"][1]["tables"]["after"]
    with psycopg.connect(PG_DSN, autocommit=True) as con:
        prefix = live.rsplit("_", 3)[0] + "_%"  # topk_ab_<run>_: every table of this run
        left = con.execute("SELECT relname FROM pg_class WHERE relname LIKE %s", [prefix])
        assert left.fetchall() == []
    worktrees = subprocess.run(
        ["git", "worktree", "list"], capture_output=True, text=True, check=True
    ).stdout
    assert payload["before_checkout"] not in worktrees
