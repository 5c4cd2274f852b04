"""Spark figures: rows/s of a raw-log read (format "mqstore-log") and of the export job, each
with its ratio to a plain Python sequential read of the same files in the same run.

    python bench/spark_bench.py [--messages 200000] [--body-bytes 100] [--quick]

A commit log is written directly (commitlog_svc's engine is not needed: the segments are built
with mqstore.formats.record's encoder, as the store lays them out, 64 MiB files), then:

    baseline   mqstore.spark.log_source.read_ranges over every range, one after the other,
               in this process (the same decode the Spark tasks run, without Spark)
    spark read spark.read.format("mqstore-log").load(dir) with every column, counted
    export     the export job to Parquet (partitioned by topic and date) in a temp dir

Spark runs `local[*]`; its first Python job pays the worker start-up, so one warm-up read runs
first and is not timed. `--quick` writes 5,000 messages (a smoke test, no figure to keep).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from mqstore.formats.properties import encode_properties
from mqstore.formats.record import encode_blank, encode_record, pack_host
from mqstore.spark.jobs import common, export
from mqstore.spark.log_source import LogReadOptions, plan_ranges, read_ranges

FILE_BYTES = 64 << 20
TOPICS = ("orders", "refunds", "audit-log", "clicks")
HOST = pack_host("127.0.0.1", 10911)


def write_log(directory: str, messages: int, body_bytes: int) -> int:
    """Segments of FILE_BYTES with `messages` records; returns the bytes written."""
    os.makedirs(directory, exist_ok=True)
    body = b"x" * body_bytes
    queue_offsets: dict[tuple[str, int], int] = {}
    start = 0
    buf = bytearray()
    now = 1_795_000_000_000
    for i in range(messages):
        topic, qid = TOPICS[i % len(TOPICS)], i % 4
        qo = queue_offsets.get((topic, qid), 0)
        queue_offsets[(topic, qid)] = qo + 1
        props = encode_properties({"KEYS": f"k{i}", "TAGS": f"t{i % 8}", "UNIQ_KEY": f"U{i:024d}"})
        rec = encode_record(
            topic=topic,
            queue_id=qid,
            body=body,
            properties=props,
            queue_offset=qo,
            physical_offset=start + len(buf),
            born_timestamp_ms=now + i,
            store_timestamp_ms=now + i,
            born_host=HOST,
            store_host=HOST,
        )
        if len(buf) + len(rec) + 8 > FILE_BYTES:
            buf += encode_blank(FILE_BYTES - len(buf))
            _flush(directory, start, buf)
            start += FILE_BYTES
            buf = bytearray()
            rec = encode_record(
                topic=topic, queue_id=qid, body=body, properties=props, queue_offset=qo,
                physical_offset=start, born_timestamp_ms=now + i, store_timestamp_ms=now + i,
                born_host=HOST, store_host=HOST,
            )  # fmt: skip
        buf += rec
    _flush(directory, start, buf)
    return start + len(buf)


def _flush(directory: str, start: int, buf: bytearray) -> None:
    with open(os.path.join(directory, f"{start:020d}"), "wb") as f:
        f.write(buf)
        f.truncate(FILE_BYTES)


def baseline_rows_per_s(directory: str) -> tuple[int, float]:
    opts = LogReadOptions(directory)
    count = 0

    def sink(batch: Any) -> None:
        nonlocal count
        count += batch.num_rows

    t0 = time.perf_counter()
    read_ranges(plan_ranges(directory), opts, sink)
    return count, count / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--body-bytes", type=int, default=100)
    p.add_argument("--quick", action="store_true", help="5,000 messages: a smoke test")
    p.add_argument("--master", default=None)
    args = p.parse_args(argv)
    messages = 5_000 if args.quick else args.messages
    work = tempfile.mkdtemp(prefix="mqstore-spark-bench-")
    try:
        log_dir = os.path.join(work, "commitlog")
        written = write_log(log_dir, messages, args.body_bytes)
        n, base = baseline_rows_per_s(log_dir)
        assert n == messages, (n, messages)
        spark = common.session("mqstore-spark-bench", args.master)
        spark.sparkContext.setLogLevel("ERROR")
        try:
            df = spark.read.format("mqstore-log").load(log_dir)
            df.limit(1).collect()  # warm-up: starts the Python workers
            t0 = time.perf_counter()
            got = df.count()
            read_s = time.perf_counter() - t0
            assert got == messages, (got, messages)
            t0 = time.perf_counter()
            report = export.export(spark, os.path.join(work, "lake"), log_dir=log_dir)
            export_s = time.perf_counter() - t0
            assert report.rows == messages
            parallelism = spark.sparkContext.defaultParallelism
        finally:
            spark.stop()
        read_rate, export_rate = messages / read_s, messages / export_s
        print(f"log: {messages} records, {written / 2**20:.1f} MiB, body {args.body_bytes} B")
        print(f"plain Python sequential read: {base:,.0f} rows/s")
        print(
            f"spark read (local, {parallelism} cores): {read_rate:,.0f} rows/s "
            f"({read_rate / base:.2f}x the sequential read)"
        )
        print(
            f"export to Parquet: {export_rate:,.0f} rows/s ({export_rate / base:.2f}x the "
            "sequential read)"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
