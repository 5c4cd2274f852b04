"""Resident memory of each service as the number of queues grows (10k, 50k, 100k queues).

    python -m bench.memory_bench [--rounds N] [--stores file,rocksdb] [--dir DIR] [--quick]

For each consume-queue store kind, the three services start as real processes on loopback
(mqstore/testing/cluster.py; the index service with its default, RocketMQ-sized index
files), and an SDK producer writes `--rounds` messages of 100 B into every queue of a growing
set of topics: a topic holds at most 65,536 queues (limits.queue_id_max), so 100,000 queues
are three topics of 10,000, 40,000 and 50,000. After each stage the bench waits until both
followers have applied the whole log, then reads /proc/PID/status of each service:

- RssAnon: anonymous resident memory (heap, Python objects, RocksDB caches): what must stay
  bounded;
- RssFile: resident pages of mapped files (the commit log, consume-queue and index files): page
  cache the kernel can drop, reported apart;
- RssShmem: shared memory.

Only a measurement: no figure is asserted.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.meters import status_kib
from bench.processes import INDEX_DEFAULT_ARGS, by_name, pids, settings_of, wait_caught_up
from mqstore.client import Admin, Producer
from mqstore.formats.cq_time import TIME_BYTES
from mqstore.formats.cq_unit import UNIT_BYTES
from mqstore.testing.cluster import Cluster, start_all

BODY_BYTES = 100
# (topic, its queues): cumulative 10,000 / 50,000 / 100,000 queues.
STAGES = (("mem-a", 10_000), ("mem-b", 40_000), ("mem-c", 50_000))
QUICK_STAGES = (("mem-a", 100), ("mem-b", 400), ("mem-c", 500))
# The file store preallocates each queue's unit file (20 B a unit) and time file (TIME_BYTES
# a unit): at the default 300,000 units that is ~8 MB a queue, 800 GB for 100,000 queues, far
# more than this machine's disk. The bench runs it with small files instead (and says so).
FILE_UNITS_PER_FILE = 1_000
DISK_SHARE_MAX = 0.5  # refuse to start a run whose files would take more of the free disk
CATCH_UP_TIMEOUT_S = 600.0
CATCH_UP_POLL_S = 0.2
SETTLE_S = 1.0  # after catching up, let background work (flush, checkpoint) run once
SERVICES = ("commitlog", "cq", "index")


@dataclass(frozen=True)
class Memory:
    anon_kib: int
    file_kib: int
    shmem_kib: int
    hwm_kib: int

    @classmethod
    def of(cls, pid: int) -> Memory:
        kib = status_kib(pid)
        return cls(kib["RssAnon"], kib["RssFile"], kib["RssShmem"], kib["VmHWM"])


@dataclass(frozen=True)
class Sample:
    store: str
    queues: int
    messages: int
    seconds: float  # producing plus catching up
    memory: dict[str, Memory]


def run_store(
    root: Path, store: str, rounds: int, stages: tuple[tuple[str, int], ...], units_per_file: int
) -> list[Sample]:
    cq_args = ["--cq-store", store]
    if store == "file":
        cq_args += ["--units-per-file", str(units_per_file)]
        need = sum(q for _, q in stages) * units_per_file * (UNIT_BYTES + TIME_BYTES)
        free = shutil.disk_usage(root).free
        if need > DISK_SHARE_MAX * free:
            raise SystemExit(
                f"the file store would preallocate {need / 1e9:.1f} GB of {free / 1e9:.1f} GB "
                "free: lower --units-per-file"
            )
    extra = {"cq_svc": cq_args, "index_svc": list(INDEX_DEFAULT_ARGS)}
    cluster = start_all(Cluster(root, flush="async", extra=extra, segment_bytes=None))
    samples = []
    try:
        settings = settings_of(cluster)
        ids = pids(by_name(cluster))
        if sorted(ids) != sorted(SERVICES):
            raise RuntimeError(f"expected {SERVICES} running, found {sorted(ids)}")
        body = b"m" * BODY_BYTES
        queues = messages = 0
        with Admin(settings) as admin:
            for topic, topic_queues in stages:
                began = time.monotonic()
                producer = Producer(settings, queues_per_topic=topic_queues)
                try:
                    for _ in range(rounds):
                        # One body per queue: send_batch spreads a batch as long as the topic's
                        # queue count over every queue, one message each.
                        producer.send_batch(topic, [body] * topic_queues)
                    producer.flush()
                finally:
                    producer.close()
                wait_caught_up(settings, CATCH_UP_TIMEOUT_S, CATCH_UP_POLL_S)
                took = time.monotonic() - began
                queues += topic_queues
                messages += topic_queues * rounds
                time.sleep(SETTLE_S)
                memory = {name: Memory.of(pid) for name, pid in ids.items()}
                samples.append(Sample(store, queues, messages, took, memory))
                print(f"  {store}: {queues:,} queues done in {took:.1f} s", flush=True)
            status = admin.status()
            counts = [r.queue_count for r in status.cq]
            print(f"  {store}: cq replica reports {counts} queues", flush=True)
    finally:
        cluster.stop_all()
    return samples


def print_table(samples: list[Sample], rounds: int) -> None:
    print(
        f"\nresident memory per service, {rounds} message(s) of {BODY_BYTES} B per queue "
        "(KiB from /proc/PID/status; RssFile is page cache of mapped files)"
    )
    header = f"{'cq store':<9}{'queues':>9}{'messages':>10}{'s':>7}"
    for name in SERVICES:
        header += f"{name + ' anon':>16}{'file':>9}{'shmem':>7}"
    print(header)
    for s in samples:
        line = f"{s.store:<9}{s.queues:>9,}{s.messages:>10,}{s.seconds:>7.1f}"
        for name in SERVICES:
            m = s.memory[name]
            line += f"{m.anon_kib:>16,}{m.file_kib:>9,}{m.shmem_kib:>7,}"
        print(line)
    print("peak resident (VmHWM, KiB) at the last stage:")
    for s in samples:
        if s.queues == samples[-1].queues:
            peaks = ", ".join(f"{n} {s.memory[n].hwm_kib:,}" for n in SERVICES)
            print(f"  {s.store}: {peaks}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2, help="messages per queue")
    parser.add_argument("--stores", default="file,rocksdb", help="cq store kinds to measure")
    parser.add_argument("--dir", default=None, help="where the stores go (default: a temp dir)")
    parser.add_argument(
        "--units-per-file",
        type=int,
        default=FILE_UNITS_PER_FILE,
        help="consume-queue file size (units) for the file store",
    )
    parser.add_argument("--quick", action="store_true", help="100/500/1,000 queues, 1 round")
    args = parser.parse_args(argv)
    stages = QUICK_STAGES if args.quick else STAGES
    if args.quick:
        args.rounds = 1
    directory = Path(tempfile.mkdtemp(prefix="mqstore-memory-bench-", dir=args.dir))
    samples: list[Sample] = []
    try:
        for store in args.stores.split(","):
            root = directory / store
            root.mkdir(parents=True)
            samples += run_store(root, store, args.rounds, stages, args.units_per_file)
            shutil.rmtree(root, ignore_errors=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print_table(samples, args.rounds)
    print(f"file store run with --units-per-file {args.units_per_file} (default 300,000)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
