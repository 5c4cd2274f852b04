"""The environment failing: flush errors (fsyncgate), a full disk, a busy write lock, a slow
flush; and the acknowledgement rule of sync flush, checked against the SimDisk's flush trace.
"""

from __future__ import annotations

import errno
import posixpath
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from commitlog_testlib import (
    TOPIC,
    Stored,
    append_each,
    assert_log_holds,
    message,
    on_flush_thread_of,
    open_log,
    reopen,
    segment_path,
    sim_crash,
    stored_from,
)

from commitlog_svc.commitlog import DISK_FULL_RETRY_MS, CommitLog
from commitlog_svc.config import FlushMode
from commitlog_svc.messages import PutStatus
from mqstore.storage import failpoints
from mqstore.storage.clock import ManualClock
from mqstore.storage.simdisk import SimDisk
from tests.commitlog.message_in import MessageIn, as_batches

FILE = 4096
WAIT_S = 10.0  # generous bound for a background thread to do what it was woken for


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _scan_offsets(log: CommitLog) -> list[int]:
    return [r.physical_offset for r in log.scan(log.min_offset, max_records=10_000).records]


def _wait_quietly(condition: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)


def _power_off(disk: SimDisk) -> None:
    """Power off after the process is gone: what was not durable is lost."""
    disk.crash(random.Random(0), "drop")


# -- flush failures ----------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["flush", "flush_eio"])
def test_sync_flush_failure_answers_flush_disk_failed_then_refuses_writes(fault: str) -> None:
    clock = ManualClock()
    disk = SimDisk(clock_ms=clock.now_ms)
    log = open_log("/store", disk=disk, clock=clock, flush=FlushMode.SYNC)
    acked = append_each(log, [message(i) for i in range(5)])
    disk.inject(fault, errno.EIO, path_contains="commitlog")

    result = log.append_batch(as_batches([message(5)]))
    assert result.statuses == [PutStatus.FLUSH_DISK_FAILED]  # never PUT_OK
    assert result.offsets[0] == acked[-1].end  # written, but not durable
    _wait_for(lambda: not log.writable, "writes to stop")
    refused = log.append_batch(as_batches([message(6)]))
    assert refused.statuses == [PutStatus.SERVICE_NOT_AVAILABLE]
    assert refused.offsets == [-1]
    # reads keep working; dispatch (confirm offset = flushed) never shows the failed record
    for s in acked:
        assert log.read_record(s.offset).body == s.message.body
    assert _scan_offsets(log) == [s.offset for s in acked]
    assert log.confirm_offset == acked[-1].end

    log.close()
    assert disk.exists("/store/abort"), "a failed flush must leave the next start unclean"
    _power_off(disk)
    log = reopen(log, disk=disk, clock=clock)
    report = log.recovery
    assert report is not None and not report.clean_exit
    for s in acked:
        assert log.read_record(s.offset).body == s.message.body
    assert log.append_batch(as_batches([message(7)])).ok
    log.close()


def test_async_flush_failure_stops_writes_and_leaves_the_store_unclean() -> None:
    clock = ManualClock()
    disk = SimDisk(clock_ms=clock.now_ms)
    log = open_log("/store", disk=disk, clock=clock)
    stored = append_each(log, [message(i) for i in range(5)])
    disk.inject("flush", errno.EIO, path_contains="commitlog")
    clock.advance(log.config.flush_thorough_interval_ms + 1)  # a thorough flush is due
    flusher = log._flusher
    assert flusher is not None
    flusher.wake()
    _wait_for(lambda: not log.writable, "writes to stop")
    assert log.append_batch(as_batches([message(5)])).statuses == [PutStatus.SERVICE_NOT_AVAILABLE]
    assert log.read_record(stored[0].offset).body == stored[0].message.body
    log.close()
    assert disk.exists("/store/abort")


# -- a full disk -------------------------------------------------------------------------------


def test_disk_full_at_segment_creation_changes_nothing_and_clears_when_space_returns() -> None:
    clock = ManualClock()
    disk = SimDisk(clock_ms=clock.now_ms)
    log = open_log("/store", disk=disk, clock=clock, flush=FlushMode.SYNC)
    stored = append_each(log, [message(10 + i) for i in range(16)])  # 16 x 242: file 0 full
    # room for checkpoints, not for another segment
    disk.capacity_bytes = disk.used_bytes() + 1_000
    end, table = log.max_offset, log.queue_offsets()
    segments = disk.listdir("/store/commitlog")

    result = log.append_batch(as_batches([message(28)]))
    assert result.statuses == [PutStatus.CREATE_MAPPED_FILE_FAILED]
    assert result.offsets == [-1] and result.queue_offsets == [-1]
    assert log.disk_full and not log.writable
    # nothing partial is visible: no blank, no file, no offsets taken
    assert log.max_offset == end and log.queue_offsets() == table
    assert disk.listdir("/store/commitlog") == segments
    assert disk.read(segment_path(log.config, 0))[end:] == bytes(FILE - end)
    assert _scan_offsets(log) == [s.offset for s in stored]

    # refused outright for DISK_FULL_RETRY_MS, even a message that would fit the current file;
    # still as "disk full" (CREATE_MAPPED_FILE_FAILED), never as a closed store
    small = MessageIn(TOPIC, 0, b"s")
    refused = log.append_batch(as_batches([small]))
    assert refused.statuses == [PutStatus.CREATE_MAPPED_FILE_FAILED]
    assert refused.reasons[0].startswith("disk full")
    clock.advance(DISK_FULL_RETRY_MS)
    assert log.append_batch(as_batches([message(28)])).statuses == [
        PutStatus.CREATE_MAPPED_FILE_FAILED
    ]
    assert log.max_offset == end and log.queue_offsets() == table
    assert log.append_batch(as_batches([message(28)])).statuses == [
        PutStatus.CREATE_MAPPED_FILE_FAILED
    ]

    disk.capacity_bytes = 1 << 30
    clock.advance(DISK_FULL_RETRY_MS)
    [moved] = append_each(log, [message(28)])
    assert moved.offset == FILE
    assert moved.queue_offset == table[(TOPIC, 28 % 4)]
    assert not log.disk_full and log.writable
    assert_log_holds(log, [*stored, moved], "after space returned")
    log.close()


def test_checkpoint_write_on_a_full_disk_does_not_stop_appends_once_space_returns() -> None:
    clock = ManualClock()
    disk = SimDisk(clock_ms=clock.now_ms)
    log = open_log("/store", disk=disk, clock=clock, flush=FlushMode.SYNC)
    append_each(log, [message(0)])
    disk.capacity_bytes = disk.used_bytes()  # the open segment still has room
    append_each(log, [message(1)])
    attempted = threading.Event()
    mark = on_flush_thread_of(log, lambda name: attempted.set())
    with failpoints.armed("checkpoint.before_write", mark):
        clock.advance(log.config.checkpoint_interval_ms + 1)
        flusher = log._flusher
        assert flusher is not None
        flusher.wake()
        assert attempted.wait(WAIT_S)
    try:
        _wait_quietly(lambda: flusher.failure is not None, 1.0)  # the round's outcome
        disk.capacity_bytes = 1 << 30
        clock.advance(DISK_FULL_RETRY_MS)
        assert log.append_batch(as_batches([message(2)])).ok
    finally:
        log.close()


# -- a busy write lock -------------------------------------------------------------------------


def test_write_lock_busy_past_the_bound_is_os_page_cache_busy_and_changes_nothing(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path, put_lock_timeout_ms=50)
    stored = append_each(log, [message(i) for i in range(3)])
    end, table = log.max_offset, log.queue_offsets()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with log._put_lock:
            held.set()
            release.wait(WAIT_S)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(WAIT_S)
        result = log.append_batch(as_batches([message(3), message(4)]))
        assert result.statuses == [PutStatus.OS_PAGE_CACHE_BUSY] * 2
        assert result.offsets == [-1, -1]
    finally:
        release.set()
        holder.join()
    assert log.max_offset == end and log.queue_offsets() == table
    [after] = append_each(log, [message(3)])
    assert after.offset == end and after.queue_offset == log.queue_offset(TOPIC, 3) - 1 == 0
    assert_log_holds(log, [*stored, after], "after the lock was free again")
    log.close()


# -- sync flush: acknowledgement only after a covering flush -----------------------------------


def _covering_flush(
    trace: list[tuple[str, str, int, int]], path: str, start: int, end: int
) -> bool:
    path = posixpath.normpath(path)
    return any(op == "flush" and p == path and a <= start and b >= end for op, p, a, b in trace)


def test_every_sync_put_ok_follows_a_flush_covering_its_bytes() -> None:
    """With a ManualClock no timer flushes: every flush in the trace between an append's call
    and its return was asked for by that append, after its bytes were written."""
    clock = ManualClock()
    disk = SimDisk(clock_ms=clock.now_ms, trace=True)
    trace = disk.trace
    assert trace is not None
    log = open_log("/store", disk=disk, clock=clock, flush=FlushMode.SYNC)
    config = log.config
    rng = random.Random(5)
    acked: list[Stored] = []
    for i in range(150):
        batch = [message(i * 10 + k) for k in range(rng.randint(1, 3))]
        before = len(trace)
        result = log.append_batch(as_batches(batch))
        window = trace[before:]
        assert result.ok, result.statuses
        for s in stored_from(result, batch):
            pos = s.offset % FILE
            assert _covering_flush(window, segment_path(config, s.offset), pos, pos + s.size), (
                f"PUT_OK at {s.offset} without a flush of [{pos}, {pos + s.size}) before it"
            )
            acked.append(s)
    assert acked[-1].offset // FILE >= 5  # rollovers included
    sim_crash(log, disk, random.Random(0), "drop")
    log = reopen(log, disk=disk, clock=clock)
    assert_log_holds(log, acked, "every acknowledged message after power loss")
    log.close()


def test_concurrent_sync_appends_acknowledged_are_durable() -> None:
    """Four threads appending under sync flush (group commit): every PUT_OK survives a power
    loss that drops everything unflushed."""
    disk = SimDisk()
    log = open_log("/store", disk=disk, flush=FlushMode.SYNC)
    acked: list[list[Stored]] = [[] for _ in range(4)]

    def producer(worker: int) -> None:
        rng = random.Random(worker)
        for i in range(30):
            batch = [
                MessageIn(TOPIC, worker, f"{worker}-{i}-{k}".encode())
                for k in range(rng.randint(1, 3))
            ]
            result = log.append_batch(as_batches(batch))
            assert result.ok, result.statuses
            acked[worker].extend(stored_from(result, batch))

    workers = [threading.Thread(target=producer, args=(w,)) for w in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    everything = sorted((s for a in acked for s in a), key=lambda s: s.offset)
    assert len(everything) == sum(len(a) for a in acked) >= 4 * 30
    sim_crash(log, disk, random.Random(1), "drop")
    log = reopen(log, disk=disk)
    assert_log_holds(log, everything, "concurrent sync appends after power loss")
    for worker, stored in enumerate(acked):
        assert [s.queue_offset for s in stored] == list(range(len(stored))), worker
    log.close()


def test_sync_append_not_durable_within_the_timeout_is_flush_disk_timeout() -> None:
    """A flush that hangs (a failpoint blocks the flush thread before it flushes) turns the
    waiting append into FLUSH_DISK_TIMEOUT: stored, not acknowledged. Once the flush goes
    through, the message is durable and found after a power loss."""
    disk = SimDisk()
    log = open_log("/store", disk=disk, flush=FlushMode.SYNC)
    acked = append_each(log, [message(i) for i in range(3)])
    log.close()
    # only the blocked append runs under the short timeout (a loaded machine may take longer
    # than 200 ms for an ordinary flush)
    log = open_log("/store", disk=disk, flush=FlushMode.SYNC, sync_flush_timeout_ms=200)
    gate = threading.Event()

    def hang(name: str) -> None:
        gate.wait(WAIT_S)

    with failpoints.armed("commitlog.before_flush", on_flush_thread_of(log, hang)):
        result = log.append_batch(as_batches([message(3)]))
        gate.set()
    assert result.statuses == [PutStatus.FLUSH_DISK_TIMEOUT]
    assert result.statuses[0].stored
    assert result.offsets[0] == acked[-1].end
    _wait_for(lambda: log.flushed_offset >= result.end_offset, "the late flush")
    assert log.writable  # a timeout is not a failure: writes go on
    sim_crash(log, disk, random.Random(0), "drop")
    log = open_log("/store", disk=disk, flush=FlushMode.SYNC)
    assert log.max_offset == result.end_offset
    assert log.read_record(result.offsets[0]).body == message(3).body
    assert log.append_batch(as_batches([message(4)])).ok
    log.close()


def test_sync_flush_group_commit_acknowledges_concurrent_appends(tmp_path: Path) -> None:
    """Real files: many threads appending under sync flush all get PUT_OK, each message once,
    at distinct offsets, with dense queue offsets per queue."""
    log = open_log(tmp_path, flush=FlushMode.SYNC)
    results: list[list[Stored]] = [[] for _ in range(4)]

    def producer(worker: int) -> None:
        for i in range(25):
            m = MessageIn(TOPIC, worker, f"{worker}-{i}".encode())
            r = log.append_batch(as_batches([m]))
            assert r.ok, r.statuses
            results[worker].extend(stored_from(r, [m]))

    workers = [threading.Thread(target=producer, args=(w,)) for w in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for worker, stored in enumerate(results):
        assert [s.queue_offset for s in stored] == list(range(25)), worker
    everything = sorted((s for r in results for s in r), key=lambda s: s.offset)
    assert log.flushed_offset >= everything[-1].end
    assert_log_holds(log, everything, "group commit")
    log.close()


# -- shutdown --------------------------------------------------------------------------------


def test_close_returns_while_a_flush_round_with_a_checkpoint_is_under_way() -> None:
    clock = ManualClock()
    log = open_log(
        "/store", disk=SimDisk(clock_ms=clock.now_ms), clock=clock, checkpoint_interval_ms=50
    )
    append_each(log, [message(0)])
    flusher = log._flusher
    assert flusher is not None
    in_round, gate = threading.Event(), threading.Event()

    def pause(name: str) -> None:
        in_round.set()
        gate.wait(WAIT_S)

    with failpoints.armed("commitlog.before_flush", on_flush_thread_of(log, pause)):
        clock.advance(1_000)  # a flush and a checkpoint are due in the same round
        flusher.wake()
        assert in_round.wait(WAIT_S)
        closer = threading.Thread(target=log.close, daemon=True)
        closer.start()
        _wait_for(lambda: flusher._stop, "close() to stop the flush thread")
        gate.set()  # the round goes on to its checkpoint
        closer.join(5.0)
    assert not closer.is_alive(), "close() is stuck"
