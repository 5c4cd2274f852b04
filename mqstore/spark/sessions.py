"""A SparkSession that works with mqstore as run from a venv, on this machine by default.

    spark = mqstore.spark.session()                          local[*], loopback only, no UI
    spark = mqstore.spark.session(ui_port=4040)              ... with the UI on 127.0.0.1:4040
    spark = mqstore.spark.session(conf={"spark.driver.memory": "4g"})
    spark = mqstore.spark.session(master="spark://host:7077")

With no master given (and none from spark-submit), the session is `local[*]`. In local mode it
sets, each only where the caller, spark-submit or the environment did not:

    PYSPARK_PYTHON, PYSPARK_DRIVER_PYTHON   this interpreter (sys.executable): the Python
                                            workers import mqstore whether or not its venv is
                                            activated (otherwise they run `python3` from PATH)
    SPARK_LOCAL_IP, spark.driver.host,      127.0.0.1: the driver's and block manager's ports,
    spark.driver.bindAddress                and the UI's, are on loopback, not the network
    spark.ui.enabled                        false, unless `ui_port` (0: any free port)
    spark.python.daemon.module              mqstore.spark.worker_daemon (no BrokenPipeError
                                            traceback after show(); see that module; an
                                            interpreter set in PYSPARK_PYTHON must import
                                            mqstore, as the sources need anyway)

and always `spark.sql.session.timeZone=UTC`, with the mqstore sources registered. On a cluster
(another master) only the last two: the cluster's interpreter and addresses are its own.

The environment variables are read when the JVM starts, which is at the first session of a
process: a session that already exists is returned as it is, with the sources registered.
`stop(spark)` ends one in order (the session, then the JVM gateway).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any, Final

from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

from mqstore.spark import register

LOCAL_MASTER: Final = "local[*]"
LOOPBACK: Final = "127.0.0.1"
WORKER_DAEMON_MODULE: Final = "mqstore.spark.worker_daemon"
# Interpreter of the Python workers and of the driver's planner: the variable wins over the
# config in PySpark, so both are looked at.
PYTHON_ENV: Final = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
PYTHON_CONFS: Final = ("spark.pyspark.python", "spark.pyspark.driver.python")


def is_local(master: str) -> bool:
    return master.startswith("local")


def session(
    app_name: str = "mqstore",
    *,
    master: str | None = None,
    ui_port: int | None = None,
    conf: Mapping[str, str] | None = None,
    local_defaults: Mapping[str, str] | None = None,
) -> Any:
    """A SparkSession with the mqstore sources registered (module docstring). `conf` wins over
    everything; `local_defaults` apply in local mode where nothing else set them."""
    active = SparkSession.getActiveSession()
    if active is not None:
        register(active)
        return active
    given = dict(conf or {})
    submitted = SparkConf()  # under spark-submit: its settings; otherwise empty
    master = master or given.get("spark.master") or submitted.get("spark.master") or LOCAL_MASTER

    def unset(key: str) -> bool:
        return key not in given and not submitted.contains(key)

    settings: dict[str, str] = {"spark.sql.session.timeZone": "UTC"}
    if is_local(master):
        settings.update(local_defaults or {})
        if all(unset(k) for k in PYTHON_CONFS):
            for name in PYTHON_ENV:
                os.environ.setdefault(name, sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
        settings["spark.driver.host"] = LOOPBACK
        settings["spark.driver.bindAddress"] = LOOPBACK
        settings["spark.python.daemon.module"] = WORKER_DAEMON_MODULE
        if ui_port is None:
            settings["spark.ui.enabled"] = "false"
        else:
            settings["spark.ui.enabled"] = "true"
            settings["spark.ui.port"] = str(ui_port)
    elif ui_port is not None:
        settings["spark.ui.port"] = str(ui_port)
    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in settings.items():
        if unset(key):
            builder = builder.config(key, value)
    for key, value in given.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark


def stop(spark: Any) -> None:
    """Stop the session, then the py4j gateway to its JVM and the JVM itself, so that the
    process ends with nothing left to fail on the way out."""
    spark.stop()
    gateway = SparkContext._gateway
    if gateway is not None:
        gateway.shutdown()
        SparkContext._gateway = None
        SparkContext._jvm = None
