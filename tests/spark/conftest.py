"""PySpark in local mode for the Spark tests: one SparkSession for the whole pytest run.

The session stays on loopback (SPARK_LOCAL_IP and the driver host/bind address) and its Python
workers run this interpreter (`PYSPARK_PYTHON=sys.executable`), which has mqstore installed, so
the data source classes pickled by reference import in every worker. Without Java or pyspark the
tests skip. Streams left running by a test are stopped after it.

    spark               the session (local[2], UTC), every mqstore source registered
    mqstore_cluster     commitlog_svc + cq_svc + index_svc on loopback, one for the run
    connection_options  the options that point format("mqstore") at such a cluster
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = str(Path(__file__).resolve().parents[2])
STREAM_STOP_TIMEOUT = "10s"
# Launches of the Spark JVM before the session fixture gives up (see _start).
GATEWAY_ATTEMPTS = 2


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime: PySpark needs a JRE 17+")
    from pyspark.sql import SparkSession  # noqa: PLC0415 (after the skips)

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("mqstore-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.local.dir", str(tmp_path_factory.mktemp("spark-local")))
        .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("spark-warehouse")))
        .config("spark.sql.streaming.stopTimeout", STREAM_STOP_TIMEOUT)
    )
    session = _start(builder)
    session.sparkContext.setLogLevel("ERROR")
    _register_sources(session)
    try:
        yield session
    finally:
        session.stop()


def _start(builder: Any) -> Any:
    """getOrCreate, once more if the JVM died before it answered. Seen once in a full run
    under load (JAVA_GATEWAY_EXITED after gRPC logged an epoll error in this process: the
    gateway is launched by fork + exec from a process full of gRPC threads); the same tests
    passed alone and on the next run."""
    from pyspark.errors import PySparkRuntimeError  # noqa: PLC0415 (needs pyspark)

    for attempt in range(GATEWAY_ATTEMPTS):
        # A dead gateway's pipe is left to the collector: closed as an unraisable
        # ResourceWarning (pytest's error) it failed the retry itself once (fresh-clone CI,
        # 11-22). Only pyspark's start-up runs under this filter, and the leftovers are
        # collected before it ends.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            try:
                return builder.getOrCreate()
            except PySparkRuntimeError as err:
                if err.getCondition() != "JAVA_GATEWAY_EXITED" or attempt + 1 == GATEWAY_ATTEMPTS:
                    raise
            gc.collect()
        time.sleep(1.0)
    raise AssertionError("unreachable")


def _register_sources(session: Any) -> None:
    """Every mqstore source there is: the service source always, the log source once it exists."""
    from mqstore.spark.service_source import MqstoreDataSource  # noqa: PLC0415 (needs pyspark)

    session.dataSource.register(MqstoreDataSource)
    try:
        from mqstore.spark.log_source import MqstoreLogDataSource  # noqa: PLC0415 (part B)
    except ImportError:
        return
    session.dataSource.register(MqstoreLogDataSource)


@pytest.fixture(autouse=True)
def _stop_streams(request: pytest.FixtureRequest) -> Iterator[None]:
    """Stop any streaming query a test left running (only when the test used the session)."""
    yield
    if "spark" not in request.fixturenames:
        return
    session = request.getfixturevalue("spark")
    for query in session.streams.active:
        try:
            query.stop()
        except Exception:  # a query that already failed may raise on stop; it is stopped
            pass


# -- a store for the service source's tests ---------------------------------------------------


@pytest.fixture(scope="session")
def mqstore_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """commitlog_svc, one cq_svc and one index_svc on loopback, shared by the whole run;
    tests keep apart by using topics of their own."""
    from mqstore.testing.cluster import start_store  # noqa: PLC0415 (only tests that need a store)

    c = start_store(tmp_path_factory.mktemp("mqstore"))
    try:
        yield c
    finally:
        c.stop_all()


def connection_options(c: Any) -> dict[str, str]:
    """The options that point format("mqstore") at a test cluster."""
    return {
        "commitlog": c.commitlog.target,
        "cq": c.followers["cq"].target,
        "index": c.followers["index"].target,
    }
