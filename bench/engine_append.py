"""Commit-log engine append throughput, next to a raw mmap append loop measured in the same run.

    python -m bench.engine_append [--records N] [--runs R] [--dir DIR] [--quick]

Workloads (bodies of 100 B and 1 KiB, batches of 1,000 messages, one producer thread):
- raw:        a preallocated file, mapped, each record = 24-byte header packed with pack_into +
              the payload copied in (the loop of reference/performance-limits.md §4a). No CRC.
- async:      CommitLog.append_batch with flush=async (interval flush in the background).
- sync:       flush=sync (group commit: each batch returns once its bytes are flushed).

Messages are built before the clock starts, as a producer would hand them over (topic, queue,
body, and properties carrying a UNIQ_KEY made by the producer). The figure is records per
second of wall time; MB/s counts payload bytes (10^6). The machine is shared and noisy: each
cell is the median of --runs runs, and the ratio column compares the engine to the raw loop of
the same run, never to a number from elsewhere.
"""

from __future__ import annotations

import argparse
import functools
import mmap
import os
import shutil
import statistics
import struct
import tempfile
import time
import zlib
from collections.abc import Callable

from commitlog_svc.commitlog import CommitLog
from commitlog_svc.config import CommitLogConfig, FlushMode
from mqstore.formats.msgid import UniqIdGenerator
from mqstore.formats.properties import encode_properties
from mqstore.formats.record_batch import MessageBatch

RAW_HEADER = struct.Struct("<IIqq")
BATCH = 1000
QUEUES = 8
SEGMENT_BYTES = 1 << 30


def make_batches(count: int, body_bytes: int) -> list[MessageBatch]:
    """Columnar batches, as the producer SDK hands them over (each message its own UNIQ_KEY)."""
    ids = UniqIdGenerator()
    body = os.urandom(body_bytes)
    batches = []
    for start in range(0, count, BATCH):
        indices = range(start, min(count, start + BATCH))
        batches.append(
            MessageBatch(
                topic="bench",
                queue_ids=[i % QUEUES for i in indices],
                bodies=[body for _ in indices],
                properties=[encode_properties({"UNIQ_KEY": ids.next_id()}) for _ in indices],
            )
        )
    return batches


def raw_loop(
    directory: str, count: int, body_bytes: int, *, pretouch: bool = False, crc: bool = False
) -> float:
    """The raw limit: a 24-byte header packed in place and the payload copied after it, one
    record at a time, into a preallocated mapped file (fresh pages, or pre-touched ones), with
    or without a zlib.crc32 of each payload (what any checksummed record format must pay)."""
    payload = os.urandom(body_bytes)
    record_bytes = RAW_HEADER.size + body_bytes
    size = max(1 << 20, record_bytes * count)
    size += -size % mmap.ALLOCATIONGRANULARITY
    path = os.path.join(directory, "raw")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.posix_fallocate(fd, 0, size)
    mm = mmap.mmap(fd, size)
    os.close(fd)
    if pretouch:  # one byte per page, before the clock starts
        for page in range(0, size, mmap.PAGESIZE):
            mm[page] = 0
    pack_into = RAW_HEADER.pack_into
    began = time.perf_counter()
    pos = 0
    crc32 = zlib.crc32
    for i in range(count):
        pack_into(mm, pos, record_bytes, crc32(payload) if crc else 0, i, i)
        mm[pos + 24 : pos + record_bytes] = payload
        pos += record_bytes
    took = time.perf_counter() - began
    mm.close()
    os.unlink(path)
    return count / took


def engine_loop(directory: str, batches: list[MessageBatch], **config: object) -> float:
    data_dir = tempfile.mkdtemp(dir=directory)
    cfg = CommitLogConfig(data_dir=data_dir, file_bytes=SEGMENT_BYTES, **config)  # type: ignore[arg-type]
    log = CommitLog(cfg)
    log.open()
    # Steady state: a running store's warmer is already ahead of the writes (64 MiB), so
    # give it the head start it has in service before the clock starts (at most 2 s).
    settle = time.monotonic() + 2.0
    while log.warmed_bytes < cfg.warm_ahead_bytes and time.monotonic() < settle:
        time.sleep(0.01)
    count = sum(len(b) for b in batches)
    began = time.perf_counter()
    for batch in batches:
        result = log.append_batch(batch)
        if not result.ok:
            raise SystemExit(f"append failed: {result.status.name} {result.reasons[0]}")
    took = time.perf_counter() - began
    log.close()
    shutil.rmtree(data_dir)
    return count / took


def median_of(runs: int, fn: Callable[[], float]) -> float:
    return statistics.median(fn() for _ in range(runs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the files go (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="30,000 records, 1 run")
    args = parser.parse_args(argv)
    if args.quick:
        args.records, args.runs = 30_000, 1
    directory = tempfile.mkdtemp(prefix="mqstore-bench-", dir=args.dir)
    rows = []
    try:
        for body_bytes in (100, 1024):
            batches = make_batches(args.records, body_bytes)
            loop = functools.partial(raw_loop, directory, args.records, body_bytes)
            raw = median_of(args.runs, loop)
            touched = median_of(args.runs, functools.partial(loop, pretouch=True))
            with_crc = median_of(args.runs, functools.partial(loop, crc=True))
            variants: dict[str, dict[str, object]] = {
                "async": {"flush": FlushMode.ASYNC},
                "sync": {"flush": FlushMode.SYNC},
            }
            rows.append(("raw mmap loop", body_bytes, raw, raw, touched))
            rows.append(("raw, pages pre-touched", body_bytes, touched, raw, touched))
            rows.append(("raw + crc32 per record", body_bytes, with_crc, raw, touched))
            for name, config in variants.items():
                rate = median_of(
                    args.runs, functools.partial(engine_loop, directory, batches, **config)
                )
                rows.append((f"engine {name}", body_bytes, rate, raw, touched))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    title = f"commit-log append, {args.records:,} records per run, batches of {BATCH}"
    print(f"{title}, median of {args.runs}")
    print(f"{'workload':<24}{'body':>6}{'records/s':>13}{'MB/s':>9}{'vs raw':>8}{'vs touched':>12}")
    for name, body_bytes, rate, raw, touched in rows:
        mb_s = rate * body_bytes / 1e6
        print(
            f"{name:<24}{body_bytes:>6}{rate:>13,.0f}{mb_s:>9.1f}"
            f"{rate / raw:>8.2f}{rate / touched:>12.2f}"
        )
    print(
        "raw = fresh preallocated pages, as a new segment starts; the engine warms pages ahead "
        "of its writes (warm_ahead_bytes), the touched raw loop had them faulted in beforehand."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
