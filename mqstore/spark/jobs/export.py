"""Export job: a topic, or a raw commit log, to Parquet partitioned by topic and date.

    python -m mqstore.spark.jobs.export OUT --log DATA_DIR [--topics a,b] [--mode FAILFAST]
    python -m mqstore.spark.jobs.export OUT --topic orders [--option cq=host:7200 ...]
        [--write-mode error|append|overwrite] [--master URL]

    OUT/topic=orders/date=2026-11-21/part-....parquet

From a log (`--log`: the data dir `mqstore up` made, commitlog_svc's, or the segments'
directory; no service running): every record of the segment files, through
`format("mqstore-log")`, with the log's columns (commitLogOffset, queueId, queueOffset,
storeTimestampMs, tags, keys, properties, body, msgId, ...). From the services (`--topic`):
the topic's queues through `format("mqstore")`, whose options (`--option name=value`, e.g.
`startingOffsets`, `cq`, `tokenFile`) pass through unchanged; its columns are that source's.
`date` is the UTC date of the store time. The log is read once: each read task (a byte
range of the log, or a queue's range) writes one file per (topic, date) it holds, its rows
sorted by queue and queue offset. `--write-mode error` (the default) refuses an OUT
that exists and is not empty, before anything is read (exit 2); `overwrite` replaces only the
(topic, date) partitions written (spark.sql.sources.partitionOverwriteMode=dynamic); `append`
adds files beside those there.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from pyspark.sql import Observation
from pyspark.sql import functions as sf

from mqstore.spark.jobs.common import (
    add_common_args,
    log_dir_of,
    parse_pairs,
    read_log,
    require_empty_output,
    run_job,
    session_for_main,
    stop_session,
)
from mqstore.spark.jobs.progress import JobProgress
from mqstore.storage.logreader import list_segments

SERVICE_SOURCE: Final = "mqstore"
WRITE_MODES: Final = ("error", "append", "overwrite")
PARTITION_COLUMNS: Final = ("topic", "date")


@dataclass(frozen=True, slots=True)
class ExportReport:
    rows: int
    partitions: int


def log_frame(
    spark: Any, log_dir: str, *, topics: str | None, mode: str, split_bytes: int | None
) -> Any:
    """The rows of a raw log, with `date`, bad entries left out (their check is `mode`'s)."""
    df = read_log(spark, log_dir, mode=mode, split_bytes=split_bytes, topics=topics)
    df = df.filter(sf.col("badReason").isNull()).drop("badReason")
    return df.withColumn("date", sf.to_date(sf.timestamp_millis(sf.col("storeTimestampMs"))))


def service_frame(spark: Any, topic: str, options: dict[str, str]) -> Any:
    """A topic through format("mqstore"), with `date` from its store timestamp."""
    reader = spark.read.format(SERVICE_SOURCE).option("topic", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    df = reader.load()
    return df.withColumn("date", sf.to_date(sf.col("storeTimestamp")))


def write_parquet(
    df: Any, out: str, write_mode: str, progress: JobProgress, source: str
) -> ExportReport:
    """Read `df` once, writing it: the report's counts are observed on the rows as they are
    written (an Observation, aggregated with the write's own tasks), not counted by more jobs.

    Each read task writes one file per (topic, date) it holds, its rows sorted within the task
    by queue, then queue offset: a file holds each of its queues' rows in queue order. No
    shuffle: one file per (topic, date) would move every body across tasks once more, which
    cost more than the write itself (docs/spark.md, "Jobs")."""
    observed = Observation("mqstore-export")
    counted = df.observe(
        observed,
        sf.count(sf.lit(1)).alias("rows"),
        sf.collect_set(sf.struct(*PARTITION_COLUMNS)).alias("partitions"),
    )
    order = [c for c in ("queueId", "queueOffset", "commitLogOffset") if c in df.columns]
    laid_out = counted.sortWithinPartitions(*PARTITION_COLUMNS, *order)
    with progress.step(f"reading {source}, writing Parquet"):
        (
            laid_out.write.mode("errorifexists" if write_mode == "error" else write_mode)
            .option("partitionOverwriteMode", "dynamic")
            .partitionBy(*PARTITION_COLUMNS)
            .parquet(out)
        )
    metrics = observed.get
    return ExportReport(int(metrics["rows"]), len(metrics["partitions"]))


def export(
    spark: Any,
    out: str,
    *,
    log_dir: str | None = None,
    topic: str | None = None,
    topics: str | None = None,
    mode: str = "FAILFAST",
    options: dict[str, str] | None = None,
    write_mode: str = "error",
    split_bytes: int | None = None,
    progress: JobProgress | None = None,
) -> ExportReport:
    if (log_dir is None) == (topic is None):
        raise ValueError("export reads either a log (log_dir) or a topic through the services")
    progress = progress or JobProgress(spark, "export", 1, show=False)
    if log_dir is not None:
        df = log_frame(spark, log_dir, topics=topics, mode=mode, split_bytes=split_bytes)
        source = "the log"
    else:
        assert topic is not None
        df = service_frame(spark, topic, options or {})
        source = f"topic {topic}"
    return write_parquet(df, out, write_mode, progress, source)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mqstore.spark.jobs.export",
        description="Write a topic or a raw commit log as Parquet, partitioned by topic and date.",
    )
    p.add_argument("out", help="output directory (any path Spark writes: local, hdfs://, s3a://)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--log",
        dest="log_dir",
        help="read the files directly: the data dir `mqstore up` made, or the commit log's",
    )
    src.add_argument("--topic", help="topic to read through the services (format 'mqstore')")
    p.add_argument("--topics", default=None, help="with --log: only these topics (a,b,c)")
    p.add_argument(
        "--mode",
        default="FAILFAST",
        choices=("FAILFAST", "DROPMALFORMED"),
        help="with --log: fail on a bad record (default) or leave bad records out",
    )
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="with --topic: an option of format('mqstore'), repeatable",
    )
    p.add_argument("--write-mode", default="error", choices=WRITE_MODES)
    add_common_args(p)
    return p


def parse_options(pairs: Sequence[str]) -> dict[str, str]:
    return parse_pairs("--option", pairs)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return run_job("export", lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    options = parse_options(args.option)
    log_dir = None
    if args.log_dir is not None:
        log_dir = log_dir_of(args.log_dir)
        list_segments(log_dir)  # a directory without a readable log: exit 2 before Spark
    write_mode = args.write_mode
    how = (
        "give a folder that does not exist yet, or --write-mode overwrite (replaces the "
        "(topic, date) partitions this export writes) or --write-mode append"
    )
    if write_mode == "error" and require_empty_output(args.out, how):
        write_mode = "append"  # into nothing, or an empty folder Spark would refuse as existing
    spark, owned = session_for_main("mqstore-export", args)
    try:
        report = export(
            spark,
            args.out,
            log_dir=log_dir,
            topic=args.topic,
            topics=args.topics,
            mode=args.mode,
            options=options,
            write_mode=write_mode,
            split_bytes=args.split_bytes,
            progress=JobProgress(spark, "export", 1),
        )
    finally:
        stop_session(spark, owned)
    print(f"exported {report.rows} rows into {report.partitions} (topic, date) partitions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
