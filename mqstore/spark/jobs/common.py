"""What every job shares: its SparkSession and reading the log.

A job runs three ways, with the same code:

    python -m mqstore.spark.jobs.export ...            local[*] on this machine
    mqstore spark export ...                           the same, from the CLI
    spark-submit --master ... mqstore/spark/jobs/export.py ...   a cluster (deploy/spark/)

Under spark-submit the master and every setting come from spark-submit; run any other way, the
session is `local[*]` unless `--master` says otherwise. Files are read and written by executors:
on a cluster, the commit-log directory and the output directories must be on storage every
executor mounts at the same path (a shared volume, NFS), as deploy/spark/README.md describes.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Final

from pyspark import SparkConf
from pyspark.sql import SparkSession

from mqstore.spark import register
from mqstore.spark.log_source import SOURCE_NAME

LOCAL_MASTER: Final = "local[*]"
# Spark's default of 200 shuffle partitions is for clusters; a local run of a job over one log
# has far fewer groups (queues, index files) than that.
LOCAL_SHUFFLE_PARTITIONS: Final = "8"


def session(app_name: str, master: str | None = None) -> Any:
    """The SparkSession of a job, with the mqstore data sources registered."""
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    elif not SparkConf().contains("spark.master"):
        builder = builder.master(LOCAL_MASTER)
        builder = builder.config("spark.sql.shuffle.partitions", LOCAL_SHUFFLE_PARTITIONS)
        builder = builder.config("spark.ui.showConsoleProgress", "false")
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    spark = builder.getOrCreate()
    register(spark)
    return spark


def session_for_main(app_name: str, master: str | None) -> tuple[Any, bool]:
    """The session of a job's main(), and whether main() owns it (and must stop it): a job run
    from a program that already has a session (a notebook, the tests) uses that one."""
    owned = SparkSession.getActiveSession() is None
    return session(app_name, master), owned


def stop_session(spark: Any, owned: bool) -> None:
    if owned:
        spark.stop()


def read_log(
    spark: Any,
    log_dir: str,
    *,
    mode: str = "FAILFAST",
    include_body: bool = True,
    split_bytes: int | None = None,
    topics: str | None = None,
) -> Any:
    reader = spark.read.format(SOURCE_NAME).option("mode", mode)
    reader = reader.option("includeBody", "true" if include_body else "false")
    if split_bytes is not None:
        reader = reader.option("splitBytes", str(split_bytes))
    if topics:
        reader = reader.option("topics", topics)
    return reader.load(os.path.abspath(log_dir))


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--master", default=None, help="Spark master (default: local[*])")
    parser.add_argument(
        "--split-bytes",
        type=int,
        default=None,
        help="largest byte range of the log read by one task (default 64 MiB)",
    )


def now_ms() -> int:
    return time.time_ns() // 1_000_000
