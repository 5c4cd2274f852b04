"""Retention (commitlog_svc/retention.py, CommitLog.clean_expired), RocketMQ's
CleanCommitLogService rules: expired files by mtime, the disk-usage ratios, the floor offset,
never the last file, only the leading run; reads below the new minimum are OUT_OF_RANGE.

Most tests run on a SimDisk whose file times come from a ManualClock, so "72 hours later" is one
call. Segments are 4 KiB; 18 messages of 222 bytes fill one.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path

import pytest
from commitlog_testlib import (
    Stored,
    append_each,
    assert_log_holds,
    config_for,
    message,
    open_log,
    opened,
    read_many,
    reopen,
)

from commitlog_svc.commitlog import CommitLog
from commitlog_svc.config import FlushMode
from commitlog_svc.messages import PutStatus
from mqstore.errors import OutOfRange
from mqstore.storage.clock import ManualClock
from mqstore.storage.mapped_file import offset_to_file_name
from mqstore.storage.simdisk import SimDisk
from tests.commitlog.message_in import as_batches

FILE = 4096
PER_FILE = 18
HOUR_MS = 3_600_000
RESERVED_MS = 72 * HOUR_MS


def _fill(log: CommitLog, files: int, start: int = 0) -> list[Stored]:
    """Messages until `files` files are full and the next one is started (so every full file
    got its blank, and its last write, now)."""
    return append_each(log, [message(10 + (start + i) % 90) for i in range(files * PER_FILE + 1)])


def _store(clock: ManualClock, **overrides: object) -> tuple[CommitLog, SimDisk]:
    disk = SimDisk(clock_ms=clock.now_ms)
    values: dict[str, object] = {"flush": FlushMode.SYNC, "delete_when_hours": ()}
    values.update(overrides)
    return open_log("/store", disk=disk, clock=clock, **values), disk


def _segments(disk: SimDisk) -> list[int]:
    return [int(n) for n in disk.listdir("/store/commitlog")]


def _set_usage(disk: SimDisk, ratio: float) -> None:
    """Make the simulated file system `ratio` full."""
    disk.capacity_bytes = int(disk.used_bytes() / ratio)


def test_expired_leading_files_are_deleted_and_min_offset_advances() -> None:
    clock = ManualClock()
    log, disk = _store(clock)
    old = _fill(log, 2)  # files 0 and 1 full, file 2 started
    clock.advance(RESERVED_MS + 1)
    new = _fill(log, 2, start=len(old))
    assert _segments(disk) == [0, FILE, 2 * FILE, 3 * FILE, 4 * FILE]

    report = log.clean_expired(manual=True)
    assert report.triggered and report.deleted_files == 2
    assert _segments(disk) == [2 * FILE, 3 * FILE, 4 * FILE]
    assert log.min_offset == 2 * FILE
    kept = [s for s in old + new if s.offset >= 2 * FILE]
    assert_log_holds(log, kept, "after deletion")
    for s in old:
        if s.offset < 2 * FILE:
            with pytest.raises(OutOfRange):
                log.read_record(s.offset)
    with pytest.raises(OutOfRange):
        log.read(0, 10)
    assert isinstance(read_many(log, [(old[0].offset, old[0].size)])[0], OutOfRange)
    with pytest.raises(OutOfRange):
        log.scan(0)
    log.close()
    log = reopen(log, disk=disk, clock=clock)
    assert log.min_offset == 2 * FILE
    assert_log_holds(log, kept, "after restart")
    log.close()


def test_only_the_leading_run_of_expired_files_is_deleted() -> None:
    """RocketMQ's testDeleteExpiredFileByTime: an expired file behind a kept one stays."""
    clock = ManualClock()
    log, disk = _store(clock)
    _fill(log, 4)
    clock.advance(RESERVED_MS + 1)
    disk.set_mtime_ms(f"/store/commitlog/{offset_to_file_name(FILE)}", clock.now_ms())
    assert log.clean_expired(manual=True).deleted_files == 1
    assert _segments(disk) == [FILE, 2 * FILE, 3 * FILE, 4 * FILE]
    log.close()


def test_nothing_is_deleted_when_no_rule_triggers() -> None:
    clock = ManualClock()
    log, disk = _store(clock)
    _fill(log, 3)
    clock.advance(10 * RESERVED_MS)
    _set_usage(disk, 0.5)
    report = log.clean_expired()
    assert not report.triggered and report.deleted_files == 0
    assert len(_segments(disk)) == 4
    log.close()


def test_the_delete_hour_triggers_deletion_of_expired_files() -> None:
    at_four = int(dt.datetime(2024, 1, 10, 4, 30).timestamp() * 1000)  # local time, as RocketMQ
    clock = ManualClock(now_ms=at_four - RESERVED_MS - 60_000)
    log, _ = _store(clock, delete_when_hours=(4,))
    _fill(log, 2)
    clock.advance(RESERVED_MS + 60_000)  # 04:30
    report = log.clean_expired()
    assert report.triggered and report.deleted_files == 2
    clock.advance(2 * HOUR_MS)  # 06:30: not a delete hour
    _fill(log, 1)
    clock.advance(10 * RESERVED_MS)  # 06:30 again, 30 days later
    assert not log.clean_expired().triggered
    log.close()


def test_usage_over_max_used_ratio_deletes_expired_files_only() -> None:
    clock = ManualClock()
    log, disk = _store(clock)
    _fill(log, 2)
    clock.advance(RESERVED_MS + 1)
    _fill(log, 2, start=100)
    _set_usage(disk, 0.80)  # over 75 %, under 85 %
    report = log.clean_expired()
    assert report.triggered and not report.clean_immediately and not report.disk_full
    assert report.deleted_files == 2
    assert _segments(disk)[0] == 2 * FILE
    log.close()


def test_usage_over_clean_forcibly_ratio_deletes_unexpired_files_in_bounded_rounds() -> None:
    clock = ManualClock()
    log, disk = _store(clock, delete_files_batch_max=2)
    _fill(log, 5)  # nothing is expired
    _set_usage(disk, 0.87)
    report = log.clean_expired()
    assert report.clean_immediately and not report.disk_full
    assert report.deleted_files == 2
    assert _segments(disk)[0] == 2 * FILE
    _set_usage(disk, 0.87)
    assert log.clean_expired().deleted_files == 2
    _set_usage(disk, 0.87)
    assert log.clean_expired().deleted_files == 1  # never the last file
    assert _segments(disk) == [5 * FILE]
    assert log.min_offset == 5 * FILE
    assert log.append_batch(as_batches([message(1)])).ok
    log.close()


def test_clean_forcibly_disabled_deletes_only_expired_files() -> None:
    clock = ManualClock()
    log, disk = _store(clock, clean_forcibly_enabled=False)
    _fill(log, 3)
    _set_usage(disk, 0.87)
    assert log.clean_expired().deleted_files == 0
    log.close()


def test_usage_over_warning_ratio_refuses_appends_until_usage_drops() -> None:
    clock = ManualClock()
    log, disk = _store(clock)
    stored = _fill(log, 4)
    _set_usage(disk, 0.95)
    report = log.clean_expired()
    assert report.disk_full and report.deleted_files == 4
    assert log.disk_full and not log.writable
    end, table = log.max_offset, log.queue_offsets()
    refused = log.append_batch(as_batches([message(1)]))
    # disk full, as a status a client can tell from a closed store
    assert refused.statuses == [PutStatus.CREATE_MAPPED_FILE_FAILED]
    assert refused.reasons[0].startswith("disk full")
    assert log.max_offset == end and log.queue_offsets() == table
    assert log.read_record(stored[-1].offset).body == stored[-1].message.body  # reads go on
    report = log.clean_expired()  # the next round sees the space the deletions freed
    assert not report.disk_full
    assert not log.disk_full and log.writable
    assert log.append_batch(as_batches([message(1)])).ok
    log.close()


@pytest.mark.parametrize(
    ("floor", "deleted"),
    [(FILE - 1, 0), (FILE, 1), (2 * FILE - 1, 1), (2 * FILE, 2), (10 * FILE, 3)],
)
def test_floor_offset_keeps_every_file_holding_bytes_at_or_above_it(
    floor: int, deleted: int
) -> None:
    clock = ManualClock()
    log, disk = _store(clock)
    _fill(log, 3)
    clock.advance(10 * RESERVED_MS)
    log.set_floor_offset(lambda: floor)
    _set_usage(disk, 0.95)  # whatever the disk says, the floor holds
    report = log.clean_expired(manual=True)
    assert report.floor_offset == floor
    assert report.deleted_files == deleted
    assert log.min_offset == deleted * FILE
    assert all(start + FILE <= floor for start in range(0, deleted * FILE, FILE))
    log.close()


def test_retention_thread_deletes_expired_files_in_the_background() -> None:
    clock = ManualClock()
    disk = SimDisk(clock_ms=clock.now_ms)
    config = config_for(
        "/store", flush=FlushMode.SYNC, clean_interval_ms=10, delete_when_hours=()
    )  # sync: each file's last flush (its mtime) happens before the clock jumps
    log = opened(CommitLog(config, disk=disk, clock=clock), retention=True)
    _fill(log, 2)
    _set_usage(disk, 0.8)  # over the max-used ratio: expired files go without a manual call
    clock.advance(RESERVED_MS + 1)
    deadline = time.monotonic() + 10
    while log.min_offset < 2 * FILE:
        assert time.monotonic() < deadline, "the retention thread deleted nothing"
        time.sleep(0.01)
    log.close()


def test_real_files_expire_by_their_mtime(tmp_path: Path) -> None:
    log = open_log(tmp_path, delete_when_hours=())
    stored = _fill(log, 2)
    log.close()
    old = time.time() - 100 * 3600
    for start in (0, FILE):
        path = os.path.join(log.config.commitlog_dir, offset_to_file_name(start))
        os.utime(path, (old, old))
    log = reopen(log)
    report = log.clean_expired(manual=True)
    assert report.deleted_files == 2
    assert sorted(os.listdir(log.config.commitlog_dir)) == [offset_to_file_name(2 * FILE)]
    assert_log_holds(log, [s for s in stored if s.offset >= 2 * FILE], "real files")
    log.close()


# -- clock leaps (T12) ---------------------------------------------------------------------------

YEAR_MS = 365 * 24 * HOUR_MS


def test_a_wall_clock_leaping_a_year_ahead_expires_nothing_until_files_really_age() -> None:
    clock = ManualClock()
    log, _disk = _store(clock)
    stored = _fill(log, 2)
    clock.set_wall(clock.now_ms() + YEAR_MS)  # the wall clock alone: monotonic time stands
    report = log.clean_expired(manual=True)
    assert report.age_paused and report.deleted_files == 0
    assert_log_holds(log, stored, "after the leap")
    clock.advance(RESERVED_MS - HOUR_MS)  # not yet file_reserved_hours of real time
    assert log.clean_expired(manual=True).deleted_files == 0
    clock.advance(HOUR_MS + 1)
    report = log.clean_expired(manual=True)
    assert not report.age_paused and report.deleted_files == 2
    log.close()


def test_disk_pressure_still_deletes_while_age_is_paused_by_a_leap() -> None:
    clock = ManualClock()
    log, disk = _store(clock, delete_files_batch_max=1)
    _fill(log, 3)
    clock.set_wall(clock.now_ms() + YEAR_MS)
    _set_usage(disk, 0.87)  # over the clean-forcibly ratio
    report = log.clean_expired()
    assert report.age_paused and report.clean_immediately and report.deleted_files == 1
    log.close()


def test_a_backward_step_keeps_files_longer_and_normal_ticks_are_no_leap() -> None:
    clock = ManualClock()
    log, _disk = _store(clock)
    _fill(log, 2)
    clock.set_wall(clock.now_ms() - HOUR_MS)  # NTP stepping back
    clock.advance(RESERVED_MS + 1)  # real time passes: the files are 72 h - 1 h "old"
    report = log.clean_expired(manual=True)
    assert not report.age_paused and report.deleted_files == 0
    clock.advance(HOUR_MS)
    assert log.clean_expired(manual=True).deleted_files == 2
    log.close()


def test_offsets_and_records_are_unaffected_by_clock_steps_and_survive_a_restart() -> None:
    """The log orders by offset, never by time: store timestamps follow the clock wherever it
    goes (the time index takes the running maximum), and recovery reads offsets only."""
    clock = ManualClock()
    log, disk = _store(clock)
    before = append_each(log, [message(i) for i in range(10)])
    clock.set_wall(clock.now_ms() - HOUR_MS)
    back = append_each(log, [message(i) for i in range(10, 20)])
    clock.set_wall(clock.now_ms() + YEAR_MS)
    ahead = append_each(log, [message(i) for i in range(20, 30)])
    everything = before + back + ahead
    offsets = [s.offset for s in everything]
    assert offsets == sorted(offsets) and len(set(offsets)) == 30
    times = [log.read_record(s.offset).store_timestamp_ms for s in everything]
    assert times[10] < times[9] < times[20]  # stored as the clock said
    log.close()
    log = reopen(log, disk=disk, clock=clock)
    assert_log_holds(log, everything, "after the restart")
    log.close()
