"""Commit-log recovery after a crash, next to a plain sequential read of the same files.

    python -m bench.recovery_bench [--log-mib N] [--file-mib N] [--runs R] [--dir DIR] [--quick]

For each body size (100 B and 1 KiB, separate logs) a child process fills a commit log of
--log-mib MiB with the CommitLog engine (async flush, batches of 1,000, 64 queues) and then
kills itself with SIGKILL right after its last append: the abort marker stays and the checkpoint
is the last one the flush thread wrote, as after a real kill -9. Then, in this process:

- raw limits, cold and warm cache: the segment files read sequentially with 1 MiB `readinto`
  calls, and mapped and walked one byte per page (what recovery's map walk must at least pay);
  plus zlib.crc32 over the whole warm map (the CRC cost with no per-record overhead);
- walk only: the reference per-record walk (record.scan_run, what recovery used before) and the
  fast walk (record_columns.scan_run_fast) over the same segments, warm, with no file opening;
- abnormal open: `CommitLog(config).open()` on the crashed store, cold and warm (the crashed
  state, checkpoint and abort marker, is put back before each run);
- normal open: the same store after a clean close (no abort marker, checkpoint at the end).

"Cold" means the page cache was dropped first: `sync`, `/proc/sys/vm/drop_caches` (root only; not
with --quick, which spares the shared machine's cache) and `posix_fadvise(DONTNEED)` on each
file; the output says which worked. Only the guest's cache can be dropped: the host may still
cache the virtual disk, so cold figures are optimistic.
Each cell is the median of --runs runs; ratios compare with the raw read of the same run.
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from commitlog_svc.commitlog import CommitLog
from commitlog_svc.config import CommitLogConfig, FlushMode
from commitlog_svc.store_files import ABORT_FILE, CHECKPOINT_FILE
from mqstore.formats.msgid import UniqIdGenerator
from mqstore.formats.properties import encode_properties
from mqstore.formats.record import scan_run
from mqstore.formats.record_batch import MessageBatch
from mqstore.formats.record_columns import scan_run_fast

BATCH = 1000
QUEUES = 64
# Distinct prebuilt batches cycled by the builder: enough variety, little build time.
BUILD_BATCHES = 16
READ_CHUNK_BYTES = 1 << 20
MIB = 1 << 20


@dataclass(frozen=True)
class Store:
    data_dir: str
    config: CommitLogConfig
    saved_checkpoint: bytes  # the checkpoint as the crash left it

    @property
    def segment_paths(self) -> list[str]:
        names = sorted(os.listdir(self.config.commitlog_dir))
        return [os.path.join(self.config.commitlog_dir, n) for n in names]

    def restore_crash(self) -> None:
        """Put back the state a kill -9 left: the old checkpoint and the abort marker."""
        with open(os.path.join(self.data_dir, CHECKPOINT_FILE), "wb") as f:
            f.write(self.saved_checkpoint)
        with open(os.path.join(self.data_dir, ABORT_FILE), "wb") as f:
            f.write(b"0")


# -- building a crashed store (child process) ------------------------------------------------


def _batches(body_bytes: int) -> list[MessageBatch]:
    ids = UniqIdGenerator()
    body = os.urandom(body_bytes)
    out = []
    for b in range(BUILD_BATCHES):
        indices = range(b * BATCH, (b + 1) * BATCH)
        out.append(
            MessageBatch(
                topic="bench",
                queue_ids=[i % QUEUES for i in indices],
                bodies=[body for _ in indices],
                properties=[encode_properties({"UNIQ_KEY": ids.next_id()}) for _ in indices],
            )
        )
    return out


def build_and_die(data_dir: str, body_bytes: int, log_bytes: int, file_bytes: int) -> None:
    """Fill a commit log to about `log_bytes`, then SIGKILL this process (never returns)."""
    config = CommitLogConfig(data_dir=data_dir, file_bytes=file_bytes, flush=FlushMode.ASYNC)
    log = CommitLog(config)
    log.open()
    batches = _batches(body_bytes)
    i = 0
    while True:
        batch = batches[i % len(batches)]
        i += 1
        result = log.append_batch(batch)
        if not result.ok:
            raise SystemExit(f"append failed: {result.status.name}")
        # Stop before a batch could overshoot the target (and roll into an empty segment).
        batch_bytes = log.max_offset // i
        if log.max_offset + 2 * batch_bytes > log_bytes:
            break
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def build_store(directory: str, body_bytes: int, log_bytes: int, file_bytes: int) -> Store:
    data_dir = tempfile.mkdtemp(prefix=f"log-{body_bytes}-", dir=directory)
    code = (
        "import sys; from bench.recovery_bench import build_and_die; "
        f"build_and_die({data_dir!r}, {body_bytes}, {log_bytes}, {file_bytes})"
    )
    proc = subprocess.run([sys.executable, "-c", code], check=False)
    if proc.returncode != -signal.SIGKILL:
        raise SystemExit(f"builder exited with {proc.returncode}, expected SIGKILL")
    if not os.path.exists(os.path.join(data_dir, ABORT_FILE)):
        raise SystemExit("the crashed store has no abort marker")
    with open(os.path.join(data_dir, CHECKPOINT_FILE), "rb") as f:
        saved = f.read()
    config = CommitLogConfig(data_dir=data_dir, file_bytes=file_bytes, flush=FlushMode.ASYNC)
    return Store(data_dir, config, saved)


# -- the page cache ---------------------------------------------------------------------------


def drop_cache(paths: list[str], *, whole_machine: bool = True) -> str:
    """Drop the page cache of `paths`; returns how it was done. `whole_machine` also drops
    every clean page of the machine (drop_caches, root only): what a cold start sees, but it
    slows everyone else on a shared machine, so --quick leaves it out."""
    os.sync()
    how = "fadvise DONTNEED per file"
    if whole_machine:
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            how = "drop_caches=3 + fadvise DONTNEED"
        except OSError as exc:
            how = f"drop_caches refused ({exc.strerror}); fadvise DONTNEED only"
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return how


# -- raw limits -------------------------------------------------------------------------------


def read_files(paths: list[str]) -> float:
    """Seconds to read every file sequentially into one 1 MiB buffer."""
    buf = bytearray(READ_CHUNK_BYTES)
    began = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
    return time.perf_counter() - began


def touch_pages(paths: list[str]) -> float:
    """Seconds to map every file and read one byte of each page, in order."""
    page = mmap.PAGESIZE
    began = time.perf_counter()
    for path in paths:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            total = 0
            for p in range(0, len(mm), page):
                total += mm[p]
    return time.perf_counter() - began


def crc_files(paths: list[str]) -> float:
    """Seconds of zlib.crc32 over every (warm) file in 1 MiB steps: CRC with no per-record cost."""
    began = time.perf_counter()
    for path in paths:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            crc = 0
            with memoryview(mm) as view:
                for p in range(0, len(mm), READ_CHUNK_BYTES):
                    crc = zlib.crc32(view[p : p + READ_CHUNK_BYTES], crc)
    return time.perf_counter() - began


# -- walks and opens --------------------------------------------------------------------------

Walk = Callable[..., tuple[int, int, object]]


def walk_files(store: Store, walk: Walk) -> tuple[float, int]:
    """Seconds and records of a walk over every segment (warm, no engine)."""
    records = 0
    began = time.perf_counter()
    for path in store.segment_paths:
        base = int(os.path.basename(path))
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            size = len(mm)
            pos = 0
            while pos < size:
                pos, walked, stop = walk(mm, pos, size, base, check_crc=True)
                records += walked
                break  # the blank, a bad record or the end: this file is done
            del stop
    return time.perf_counter() - began, records


def open_store(store: Store) -> tuple[float, int, bool]:
    """Seconds of CommitLog.open(), records it checked, and whether it saw a clean exit."""
    log = CommitLog(store.config)
    began = time.perf_counter()
    report = log.open()
    took = time.perf_counter() - began
    log.close()
    return took, report.records_scanned, report.clean_exit


@dataclass
class Row:
    name: str
    seconds: list[float]
    nbytes: int
    records: int = 0

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def gb_s(self) -> float:
        return self.nbytes / self.median_s / 1e9


def measure(store: Store, runs: int, *, whole_machine: bool) -> tuple[list[Row], str]:
    paths = store.segment_paths
    nbytes = sum(os.path.getsize(p) for p in paths)
    rows: dict[str, Row] = {}
    how = ""

    def add(name: str, seconds: float, records: int = 0) -> None:
        row = rows.setdefault(name, Row(name, [], nbytes, records))
        row.seconds.append(seconds)
        row.records = records or row.records

    for _ in range(runs):
        how = drop_cache(paths, whole_machine=whole_machine)
        add("raw read, cold", read_files(paths))
        add("raw read, warm", read_files(paths))
        how = drop_cache(paths, whole_machine=whole_machine)
        add("raw map walk, cold", touch_pages(paths))
        add("raw map walk, warm", touch_pages(paths))
        add("zlib.crc32 of the files, warm", crc_files(paths))
        seconds, records = walk_files(store, scan_run)
        add("walk: scan_run (reference)", seconds, records)
        seconds, records = walk_files(store, scan_run_fast)
        add("walk: scan_run_fast", seconds, records)
        store.restore_crash()
        how = drop_cache(paths, whole_machine=whole_machine)
        seconds, records, clean = open_store(store)
        assert not clean, "the crashed store opened as a clean exit"
        add("abnormal open, cold", seconds, records)
        store.restore_crash()
        seconds, records, clean = open_store(store)
        add("abnormal open, warm", seconds, records)
        # The open above closed cleanly: this one is the normal (clean exit) path.
        drop_cache(paths, whole_machine=whole_machine)
        seconds, records, clean = open_store(store)
        assert clean, "a cleanly closed store opened as a crash"
        add("normal open, cold", seconds, records)
        seconds, records, clean = open_store(store)
        add("normal open, warm", seconds, records)
    store.restore_crash()
    return list(rows.values()), how


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--log-mib", type=int, default=1024, help="log size per body size")
    parser.add_argument("--file-mib", type=int, default=1024, help="segment size")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--bodies", default="100,1024", help="body sizes, comma separated")
    parser.add_argument("--dir", default=None, help="where the logs go (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="8 MiB logs of 4 MiB files, 1 run")
    args = parser.parse_args(argv)
    if args.quick:
        args.log_mib, args.file_mib, args.runs = 8, 4, 1
    bodies = [int(b) for b in args.bodies.split(",")]
    directory = tempfile.mkdtemp(prefix="mqstore-recovery-bench-", dir=args.dir)
    try:
        for body_bytes in bodies:
            began = time.monotonic()
            store = build_store(directory, body_bytes, args.log_mib * MIB, args.file_mib * MIB)
            built_s = time.monotonic() - began
            rows, how = measure(store, args.runs, whole_machine=not args.quick)
            print_table(body_bytes, rows, how, args, built_s)
            shutil.rmtree(store.data_dir, ignore_errors=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


def print_table(
    body_bytes: int, rows: list[Row], how: str, args: argparse.Namespace, built_s: float
) -> None:
    by_name = {r.name: r for r in rows}
    cold = by_name["raw read, cold"]
    warm = by_name["raw read, warm"]
    nbytes = rows[0].nbytes
    print(
        f"\nrecovery, body {body_bytes} B: {nbytes / MIB:,.0f} MiB of log in "
        f"{args.file_mib} MiB segments (built and killed in {built_s:.1f} s), "
        f"median of {args.runs}; page cache: {how}"
    )
    print(f"{'what':<32}{'seconds':>9}{'records':>12}{'GB/s':>8}{'vs cold read':>14}"
          f"{'vs warm read':>14}")  # fmt: skip
    for row in rows:
        records = f"{row.records:,}" if row.records else ""
        print(
            f"{row.name:<32}{row.median_s:>9.3f}{records:>12}{row.gb_s:>8.2f}"
            f"{row.gb_s / cold.gb_s:>14.2f}{row.gb_s / warm.gb_s:>14.2f}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
