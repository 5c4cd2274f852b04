"""T6: a power loss at the durable steps of the commit log's file protocol that no other test
stops at: a segment created (before its directory entry is durable) and a segment deleted by
retention (before the directory is fsynced). Every crash mode of the SimDisk; the store must
reopen, hold every acknowledged record it is still supposed to hold, and take appends.

Checkpoint replace and flush are covered in test_commitlog_faults.py and the seeded
simulation; these two points are named `segment.after_create` and `segment.after_delete`
(mqstore/storage/mapped_file_queue.py).
"""

from __future__ import annotations

import random

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
from commitlog_svc.config import FlushMode
from mqstore.storage import failpoints
from mqstore.storage.clock import ManualClock
from mqstore.storage.simdisk import CrashMode, SimDisk

FILE = 4096
PER_FILE = 18  # messages of message(i) that fill one 4 KiB segment
MODES: list[CrashMode] = ["drop", "keep", "random"]
RESERVED_MS = 72 * 3_600_000


def _store(clock: ManualClock) -> tuple[CommitLog, SimDisk]:
    disk = SimDisk(clock_ms=clock.now_ms)
    log = open_log(
        "/store",
        disk=disk,
        clock=clock,
        flush=FlushMode.SYNC,
        delete_when_hours=(),
        file_bytes=FILE,
    )
    return log, disk


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(3))
def test_a_crash_right_after_a_segment_is_created_loses_no_acknowledged_record(
    mode: CrashMode, seed: int
) -> None:
    clock = ManualClock()
    log, disk = _store(clock)
    acked = append_each(log, [message(i) for i in range(PER_FILE - 2)])
    with failpoints.armed("segment.after_create"), pytest.raises(failpoints.SimulatedCrash):
        for i in range(PER_FILE - 2, 3 * PER_FILE):
            acked.extend(append_each(log, [message(i)]))  # the roll crashes inside
    sim_crash(log, disk, random.Random(seed), mode)
    log = reopen(log, disk=disk, clock=clock)
    assert_log_holds(log, acked, f"after a crash at segment creation ({mode})")
    assert_appends_resume(log, acked)
    log.close()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(3))
def test_a_crash_in_the_middle_of_a_retention_delete_keeps_the_log_whole(
    mode: CrashMode, seed: int
) -> None:
    clock = ManualClock()
    log, disk = _store(clock)
    acked = append_each(log, [message(i) for i in range(3 * PER_FILE + 1)])  # 3 full files
    clock.advance(RESERVED_MS + 1)
    newer = append_each(log, [message(i) for i in range(3 * PER_FILE + 1, 4 * PER_FILE)])
    acked += newer
    with failpoints.armed("segment.after_delete"), pytest.raises(failpoints.SimulatedCrash):
        log.clean_expired(manual=True)  # crashes after the first file is gone
    sim_crash(log, disk, random.Random(seed), mode)
    log = reopen(log, disk=disk, clock=clock)
    # The deletion may or may not have survived; either way the log is a suffix of what was
    # acknowledged, starting at a segment boundary, and nothing above it is missing.
    low = log.min_offset
    assert low % FILE == 0 and low <= FILE
    assert_log_holds(log, [s for s in acked if s.offset >= low], f"after the crash ({mode})")
    assert_appends_resume(log, acked)
    log.close()
