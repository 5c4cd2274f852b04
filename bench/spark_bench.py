"""Spark figures: rows/s of a raw-log read (format "mqstore-log") and of the export job, each
with its ratio to a plain Python read of the same files in the same run, and the audit's time.

    python bench/spark_bench.py [--messages 200000] [--body-bytes 100] [--quick] [--no-audit]

A commit log is written directly (commitlog_svc's engine is not needed: the segments are built
with mqstore.formats.record's encoder, as the store lays them out, 64 MiB files), then:

    chunked    a plain Python read of the files in 8 MiB chunks, walking the records by their
               TOTALSIZE and MAGICCODE (no checks, no fields): the floor of any Python reader
    baseline   mqstore.spark.log_source.read_ranges over every range, one after the other,
               in this process (the same decode the Spark tasks run, without Spark)
    spark read spark.read.format("mqstore-log").load(dir) with every column, counted
    export     the export job to Parquet (partitioned by topic and date) in a temp dir
    audit      the rebuild job writes the log's consume queues and index (small index files,
               untimed), then the audit job compares them with the log (timed)

Spark runs `local[*]`; its first Python job pays the worker start-up, so one warm-up read runs
first and is not timed. `--quick` writes 5,000 messages (a smoke test, no figure to keep).
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import sys
import tempfile
import time
from typing import Any

from mqstore.formats.properties import encode_properties
from mqstore.formats.record import encode_blank, encode_record, pack_host
from mqstore.spark.jobs import audit, common, derived, export, rebuild
from mqstore.spark.log_source import LogReadOptions, plan_ranges, read_ranges

FILE_BYTES = 64 << 20
TOPICS = ("orders", "refunds", "audit-log", "clicks")
HOST = pack_host("127.0.0.1", 10911)
CHUNK_BYTES = 8 << 20
SIZE_MAGIC = struct.Struct(">ii")
RECORD_MAGICS = (-626843481, -626843477)  # record.MAGIC_V1, MAGIC_V2
# Index files of the audit's store: a few files for the default run, not 420 MB each.
AUDIT_GEOMETRY = derived.IndexGeometry(slot_num=100_000, entry_num=400_000)


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


def chunked_rows_per_s(directory: str) -> tuple[int, float]:
    """Records of every segment, walked by TOTALSIZE over 8 MiB chunks read with readinto."""
    count = 0
    unpack = SIZE_MAGIC.unpack_from
    chunk = bytearray(CHUNK_BYTES)
    view = memoryview(chunk)
    t0 = time.perf_counter()
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb", buffering=0) as f:
            kept = 0  # bytes of a record cut by the chunk's end, moved to its start
            done = False
            while not done:
                got = f.readinto(view[kept:])
                if not got:
                    break
                size, pos = kept + got, 0
                while size - pos >= 8:
                    total, magic = unpack(chunk, pos)
                    if magic not in RECORD_MAGICS or total <= 0:
                        done = True  # the blank, or the zeros after the last record
                        break
                    if pos + total > size:
                        break
                    count += 1
                    pos += total
                kept = size - pos
                chunk[:kept] = chunk[pos:size]
    return count, count / (time.perf_counter() - t0)


def baseline_rows_per_s(directory: str) -> tuple[int, float]:
    opts = LogReadOptions(directory)
    count = 0

    def sink(batch: Any) -> None:
        nonlocal count
        count += batch.num_rows

    t0 = time.perf_counter()
    read_ranges(plan_ranges(directory), opts, sink)
    return count, count / (time.perf_counter() - t0)


def main(argv: list[str] | None = None, *, spark: Any = None) -> int:
    """The figures of the module docstring. `spark`: a running session to use (and leave
    running) instead of one of its own: the smoke test's, whose JVM the Spark tests share."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--body-bytes", type=int, default=100)
    p.add_argument("--quick", action="store_true", help="5,000 messages: a smoke test")
    p.add_argument("--master", default=None)
    p.add_argument("--no-audit", action="store_true", help="skip the rebuild and audit")
    args = p.parse_args(argv)
    messages = 5_000 if args.quick else args.messages
    work = tempfile.mkdtemp(prefix="mqstore-spark-bench-")
    try:
        log_dir = os.path.join(work, "commitlog")
        written = write_log(log_dir, messages, args.body_bytes)
        n, chunked = chunked_rows_per_s(log_dir)
        assert n == messages, (n, messages)
        n, base = baseline_rows_per_s(log_dir)
        assert n == messages, (n, messages)
        own_session = spark is None
        if own_session:
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
            audit_s = None
            if not args.no_audit:
                store = os.path.join(work, "rebuilt")
                cq, index = os.path.join(store, "cq"), os.path.join(store, "index")
                rebuild.rebuild(spark, log_dir, cq_out=cq, index_out=index, geometry=AUDIT_GEOMETRY)
                t0 = time.perf_counter()
                found = audit.audit(spark, log_dir, cq_dir=cq, index_dir=index)
                audit_s = time.perf_counter() - t0
                assert found.ok and found.records == messages, audit.summary(found)
            parallelism = spark.sparkContext.defaultParallelism
        finally:
            if own_session:
                spark.stop()
        read_rate, export_rate = messages / read_s, messages / export_s
        print(f"log: {messages} records, {written / 2**20:.1f} MiB, body {args.body_bytes} B")
        print(f"plain Python chunked read: {chunked:,.0f} rows/s")
        print(
            f"sequential read (read_ranges, no Spark): {base:,.0f} rows/s "
            f"({base / chunked:.2f}x the chunked read)"
        )
        print(
            f"spark read (local, {parallelism} cores): {read_rate:,.0f} rows/s "
            f"({read_rate / chunked:.2f}x the chunked read)"
        )
        print(
            f"export to Parquet: {export_rate:,.0f} rows/s ({export_rate / chunked:.2f}x the "
            "chunked read)"
        )
        if audit_s is not None:
            print(f"audit of {messages} records: {audit_s:.1f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
