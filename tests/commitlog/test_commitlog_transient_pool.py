"""Transient store pool (async flush only): appends land in pooled buffers and become readable
when the flush thread commits them into the file; commit then flush make them durable.

A ManualClock drives the flush thread: nothing is committed until the test moves time on.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest
from commitlog_testlib import (
    append_each,
    assert_appends_resume,
    assert_log_holds,
    message,
    open_log,
    reopen,
    sim_crash,
)

from commitlog_svc.commitlog import CommitLog
from commitlog_svc.config import CommitLogConfig, FlushMode
from mqstore.errors import InvalidArgument, OutOfRange
from mqstore.storage.clock import ManualClock
from mqstore.storage.simdisk import SimDisk

FILE = 4096
WAIT_S = 10.0


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


def _pool_store() -> tuple[CommitLog, SimDisk, ManualClock]:
    clock = ManualClock()
    disk = SimDisk(clock_ms=clock.now_ms)
    log = open_log("/store", disk=disk, clock=clock, transient_pool=True)
    return log, disk, clock


def _tick(log: CommitLog, clock: ManualClock, ms: int) -> None:
    clock.advance(ms)
    flusher = log._flusher
    assert flusher is not None
    flusher.wake()


def test_transient_pool_requires_async_flush() -> None:
    with pytest.raises(InvalidArgument):
        CommitLogConfig.for_tests("/x", transient_pool=True, flush=FlushMode.SYNC)


def test_pooled_appends_are_readable_only_after_commit() -> None:
    log, _, clock = _pool_store()
    stored = append_each(log, [message(i) for i in range(3)])
    end = stored[-1].end
    assert log.max_offset == 0  # written to the pool, not yet to the file
    with pytest.raises(OutOfRange):
        log.read_record(stored[0].offset)
    assert log.scan(0).records == []

    _tick(log, clock, log.config.commit_interval_ms)  # a commit is due, a flush is not
    _wait_for(lambda: log.max_offset == end, "the commit")
    assert log.flushed_offset < end  # visible, not yet durable
    assert_log_holds(log, stored, "after commit")
    log.close()


def test_pooled_appends_all_survive_close_and_reopen() -> None:
    log, disk, clock = _pool_store()
    stored = append_each(log, [message(i) for i in range(45)])  # three files
    assert stored[-1].offset // FILE == 2
    log.close()
    log = reopen(log, disk=disk, clock=clock)
    assert log.max_offset == stored[-1].end
    assert_log_holds(log, stored, "pool after reopen")
    more = append_each(log, [message(i) for i in range(50, 60)])
    _tick(log, clock, 1_000)
    _wait_for(lambda: log.max_offset == more[-1].end, "the commit")
    assert_log_holds(log, stored + more, "pool appends after reopen")
    log.close()


@pytest.mark.parametrize("mode", ["drop", "keep"])
def test_power_loss_keeps_what_was_committed_and_flushed_and_loses_the_pool(mode: str) -> None:
    """What sits only in a pooled buffer is process memory: lost even if every dirty sector of
    the files reaches the disk ("keep")."""
    log, disk, clock = _pool_store()
    durable = append_each(log, [message(i) for i in range(10)])
    _tick(log, clock, log.config.flush_thorough_interval_ms + 1)  # commit and a full flush
    _wait_for(lambda: log.flushed_offset == durable[-1].end, "the flush")
    append_each(log, [message(i) for i in range(10, 15)])  # only in the pool
    flushed = sim_crash(log, disk, random.Random(0), mode)  # type: ignore[arg-type]
    assert flushed == durable[-1].end
    log = reopen(log, disk=disk, clock=clock)
    assert log.max_offset == durable[-1].end
    assert_log_holds(log, durable, f"pool after power loss ({mode})")
    assert_appends_resume(log, durable)
    log.close()


def test_every_offset_below_max_offset_is_readable_after_a_pooled_rollover() -> None:
    log, _, _ = _pool_store()
    try:
        stored = append_each(log, [message(i) for i in range(25)])  # rolls into file 1
        assert stored[-1].offset // FILE == 1
        below = [s for s in stored if s.end <= log.max_offset]
        for s in below:
            assert log.read_record(s.offset).body == s.message.body
    finally:
        log.close()
