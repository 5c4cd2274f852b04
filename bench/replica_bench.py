"""A follower replica's apply rate next to the leader's append rate, measured in the same run.

    python -m bench.replica_bench [--records N] [--runs R] [--dir DIR] [--quick]

Workload: bodies of 100 B and 1 KiB, batches of 1,000 messages from one producer with a
producer id and sequence (the SDK's idempotent appends: every request's first record carries
the MQS_PSEQ tag a follower must read), async flush, 256 MiB segments. For each run:

- leader append:  ReplicaLog.append_batch of the batches (the clock runs over the appends).
- leader read:    read_chunk of 1 MiB chunks from 0 to the end (a follower catching up: each
                  chunk's end is found by _core.chain, no Python step a record).
- leader tail:    read_chunk of what one batch appended, right after it (a follower in step:
                  the chunk ends at the leader's end, nothing is walked).
- follower apply: append_replicated of the catch-up chunks (already in memory) on a second
                  replica: every record checked as recovery checks it, the tables raised, the
                  bytes copied into its segment.
- memcpy:         the same chunks copied into a mapped file, nothing else: the floor.

And where a follower's apply spends its time: its two passes over each chunk (the recovery walk
with the CRCs and the queue table; finding the requests' tags), timed alone, as a share of it.

MB/s counts log bytes (records as stored, 10^6). Each cell is the median of --runs runs; the
ratio column compares with the leader's append of the same run, never a figure from elsewhere.
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import statistics
import tempfile
import time

from bench.engine_append import make_batches
from commitlog_svc.config import CommitLogConfig
from commitlog_svc.replica import ReplicaLog
from commitlog_svc.replica_chunk import CHUNK_BYTES_MAX, Chunk, tagged_requests
from mqstore.formats.record_batch import MessageBatch
from mqstore.formats.record_columns import scan_run_fast

SEGMENT_BYTES = 256 << 20


def _replica(directory: str) -> ReplicaLog:
    config = CommitLogConfig(data_dir=tempfile.mkdtemp(dir=directory), file_bytes=SEGMENT_BYTES)
    log = ReplicaLog(config)
    log.open()
    # Steady state: a running store's warmer is ahead of its writes (64 MiB); give it that
    # head start before a clock runs (at most 2 s), as bench/engine_append.py does.
    settle = time.monotonic() + 2.0
    while log.warmed_bytes < config.warm_ahead_bytes and time.monotonic() < settle:
        time.sleep(0.01)
    return log


def one_run(directory: str, batches: list[MessageBatch]) -> dict[str, float]:
    """Every figure of one run, in MB/s of log bytes (µs for the tail read)."""
    out: dict[str, float] = {}
    lead = _replica(directory)
    lead.become_leader(1)
    tail_s = 0.0
    began = time.perf_counter()
    for sequence, batch in enumerate(batches, start=1):
        result = lead.append_batch(batch, producer=("bench-producer", sequence))
        if not result.ok:
            raise SystemExit(f"append failed: {result.reasons[0]}")
    took = time.perf_counter() - began
    end = lead.end_offset
    out["leader append"] = end / took / 1e6

    # In step: a second leader, each batch's chunk read right after its append.
    step = _replica(directory)
    step.become_leader(1)
    at = 0
    for sequence, batch in enumerate(batches, start=1):
        step.append_batch(batch, producer=("bench-producer", sequence))
        t0 = time.perf_counter()
        chunk = step.read_chunk(at)
        tail_s += time.perf_counter() - t0
        at = chunk.next_offset
    out["leader tail"] = step.end_offset / tail_s / 1e6
    out["leader tail us/chunk"] = tail_s / len(batches) * 1e6
    step.close()
    shutil.rmtree(step.config.data_dir)

    chunks: list[Chunk] = []
    began = time.perf_counter()
    at = 0
    while at < end:
        chunk = lead.read_chunk(at, max_bytes=CHUNK_BYTES_MAX)
        chunks.append(chunk)
        at = chunk.next_offset
    out["leader read"] = end / (time.perf_counter() - began) / 1e6

    follower = _replica(directory)
    follower.adopt_store_id(lead.store_id)
    began = time.perf_counter()
    for chunk in chunks:
        follower.append_replicated(chunk)
    apply_s = time.perf_counter() - began
    out["follower apply"] = end / apply_s / 1e6
    # Where the apply's time goes: its two passes over each chunk, timed alone.
    began = time.perf_counter()
    for chunk in chunks:
        scan_run_fast(chunk.data, 0, len(chunk.data), chunk.offset, check_crc=True, queue_table={})
    out["walk share"] = (time.perf_counter() - began) / apply_s
    began = time.perf_counter()
    for chunk in chunks:
        tagged_requests(chunk.data, 0, len(chunk.data), chunk.offset)
    out["tags share"] = (time.perf_counter() - began) / apply_s
    if follower.queue_offsets() != lead.queue_offsets():
        raise SystemExit("the follower's queue table differs from the leader's")
    follower.close()
    lead.close()
    shutil.rmtree(follower.config.data_dir)
    shutil.rmtree(lead.config.data_dir)

    out["memcpy"] = end / _memcpy(directory, chunks, end) / 1e6
    return out


def _memcpy(directory: str, chunks: list[Chunk], end: int) -> float:
    """Seconds to copy the chunks' bytes into a fresh preallocated mapped file."""
    size = end + CHUNK_BYTES_MAX
    size += -size % mmap.ALLOCATIONGRANULARITY
    path = os.path.join(directory, "raw")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.posix_fallocate(fd, 0, size)
    mm = mmap.mmap(fd, size)
    os.close(fd)
    began = time.perf_counter()
    for chunk in chunks:
        mm[chunk.offset : chunk.offset + len(chunk.data)] = chunk.data
    took = time.perf_counter() - began
    mm.close()
    os.unlink(path)
    return took


def median_of(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the files go (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="20,000 records, 1 run")
    args = parser.parse_args(argv)
    if args.quick:
        args.records, args.runs = 20_000, 1
    directory = tempfile.mkdtemp(prefix="mqstore-bench-", dir=args.dir)
    rows: list[tuple[str, int, float, float]] = []
    tails: list[tuple[int, float, float, float]] = []
    try:
        for body_bytes in (100, 1024):
            batches = make_batches(args.records, body_bytes)
            runs: list[dict[str, float]] = []
            for _ in range(args.runs):
                runs.append(one_run(directory, batches))
            append = median_of(runs, "leader append")
            for key in ("leader append", "leader read", "leader tail", "follower apply", "memcpy"):
                rows.append((key, body_bytes, median_of(runs, key), append))
            tails.append(
                (
                    body_bytes,
                    median_of(runs, "leader tail us/chunk"),
                    median_of(runs, "walk share"),
                    median_of(runs, "tags share"),
                )
            )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(
        f"replication, {args.records:,} records per run, idempotent batches of 1,000, "
        f"median of {args.runs}"
    )
    print(f"{'step':<18}{'body':>6}{'MB/s':>10}{'vs append':>11}")
    for name, body_bytes, rate, append in rows:
        print(f"{name:<18}{body_bytes:>6}{rate:>10.1f}{rate / append:>11.2f}")
    for body_bytes, us, walk, tags in tails:
        print(
            f"body {body_bytes}: leader tail read {us:.0f} us a chunk (one batch); of the "
            f"follower's apply, the checked walk {walk:.0%}, finding the tagged requests {tags:.0%}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
