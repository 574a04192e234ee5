"""Spark store: one local Spark session for the whole test run, and SparkTable sources on it.

`spark` is a classic session (local[2], two shuffle partitions, no UI) started once per test
run; `spark_connect` is a Spark Connect client of a Connect server started on that session's
JVM (a free port), so both kinds of session are tested without a second JVM.

`make_spark_source(scores, ids)` writes the histogram as a Parquet path whose columns need
quoting (a space, a keyword), runs prepare() and returns the SparkTable; a histogram already made
in this run is served by its source (read-only tests share it). `write_spark_source(source,
item, score)` is a concurrent writer: it rewrites the Parquet path with the item's new score and
refreshes the copy (a new version); it returns True (new runs see it).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from adapters.spark import SparkTable
from tests.helpers import histogram_key

# The test session's JVM (one for the run; see `spark`).
TEST_JVM_OPTIONS = [
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    "-Xms1g",
    "-Xmn512m",
    "-XX:-UseCodeCacheFlushing",
    "-XX:ReservedCodeCacheSize=256m",
    "-XX:+UnlockDiagnosticVMOptions",
    "-XX:-BytecodeVerificationRemote",
]

ID_COLUMN = "Item ID"
SCORE_COLUMN = "select"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def spark_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spark")


@pytest.fixture(scope="session")
def spark(spark_dir: Path) -> Iterator[Any]:
    """The classic local session of the whole test run (and a Connect server on its JVM)."""
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("topk-middleware-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.adaptive.enabled", "false")  # tiny tables: no re-planning per stage
        .config("spark.sql.codegen.wholeStage", "false")  # nor code generation per query
        .config("spark.default.parallelism", "2")
        .config("spark.sql.warehouse.dir", str(spark_dir / "warehouse"))
        .config("spark.connect.grpc.binding.port", str(_free_port()))
        # short jobs on small tables: the JIT's first tier only, the serial GC with a heap
        # sized up front, compiled code never flushed (the sweeper would evict it and the JIT
        # compile it again) and the jars' bytecode not verified (they are pyspark's own). The
        # JVM's CPU over tests/stores/test_spark.py: 104 s, against 141 s with the first two alone
        # (one idle run each, one process).
        .config("spark.driver.extraJavaOptions", " ".join(TEST_JVM_OPTIONS))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_connect(spark: Any) -> Iterator[Any]:
    """A Spark Connect session served by a Connect server on the test session's JVM."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    jvm = spark._jvm
    jvm.org.apache.spark.sql.connect.service.SparkConnectService.start(spark.sparkContext._jsc.sc())
    port = spark.sparkContext.getConf().get("spark.connect.grpc.binding.port")
    session = ConnectSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
    yield session
    session.stop()


def write_parquet(spark: Any, path: str, scores: Any, ids: Any) -> None:
    """(ID_COLUMN, SCORE_COLUMN): BIGINT or STRING ids, BIGINT scores if all whole, else DOUBLE
    (NaN, infinities and None kept: for the validation tests)."""
    scores = np.asarray(scores, dtype=object)
    ids = np.arange(len(scores)) if ids is None else np.asarray(ids, dtype=object)
    floats = [None if s is None else float(s) for s in scores]
    integral = all(s is None or (np.isfinite(s) and s == round(s)) for s in floats)
    text = any(isinstance(v, str) for v in ids.tolist())
    id_type, score_type = ("STRING" if text else "BIGINT"), ("BIGINT" if integral else "DOUBLE")
    rows = [
        (
            None if i is None else (str(i) if text else int(i)),
            None if s is None else (int(s) if integral else s),
        )
        for i, s in zip(ids.tolist(), floats, strict=True)
    ]
    schema = f"`{ID_COLUMN}` {id_type}, `{SCORE_COLUMN}` {score_type}"
    spark.createDataFrame(rows, schema).coalesce(1).write.mode("overwrite").parquet(path)


@pytest.fixture(scope="session")
def _spark_sources() -> dict[str, SparkTable]:
    return {}


@pytest.fixture
def make_spark_source(
    spark: Any, spark_dir: Path, _spark_sources: dict[str, SparkTable]
) -> Callable[[Any, Any], SparkTable]:
    def make(scores: Any, ids: Any = None) -> SparkTable:
        key = histogram_key(scores, ids)[:16]
        if key in _spark_sources:
            return _spark_sources[key]
        path = str(spark_dir / f"table {key}")
        write_parquet(spark, path, scores, ids)
        source = SparkTable(spark, path, id=ID_COLUMN, score=SCORE_COLUMN)
        source.prepare()
        _spark_sources[key] = source
        return source

    return make


@pytest.fixture
def write_spark_source(
    spark: Any, _spark_sources: dict[str, SparkTable]
) -> Callable[[SparkTable, Any, float], bool]:
    def write(source: SparkTable, item: Any, score: float) -> bool:
        for key in [k for k, s in _spark_sources.items() if s is source]:
            del _spark_sources[key]  # no other test shares a source written to
        rows = spark.read.parquet(source.table).toArrow()
        ids = rows.column(ID_COLUMN).to_pylist()
        scores = [float(s) for s in rows.column(SCORE_COLUMN).to_pylist()]
        scores[ids.index(item)] = float(score)
        write_parquet(spark, source.table, scores, np.asarray(ids, dtype=object))
        SparkTable(spark, source.table, id=ID_COLUMN, score=SCORE_COLUMN).prepare(refresh=True)
        return True

    return write
