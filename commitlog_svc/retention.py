"""Retention: which commit-log segments to delete, RocketMQ's CleanCommitLogService rules.

    disk usage of the log's file system     effect
    > disk_warning_ratio (90 %)             disk full: appends refused; delete immediately
    > disk_clean_forcibly_ratio (85 %)      delete leading files even if not expired
    > disk_max_used_ratio (75 %)            delete expired files now, not only at delete_when
    otherwise                               delete expired files at the delete_when hours

Expired = last modified more than file_reserved_hours ago. Always: only the leading run of files,
never the last file, at most delete_files_batch_max per round, and never a file holding bytes at
or above the floor offset (the lowest offset a subscriber still needs), whatever the disk says.

Clock leaps. "Expired" reads the wall clock, so a wall clock that leaps forward (NTP correcting
a wrong clock, an operator's typo: a year ahead) would make every file look expired at once.
Each round compares how far the wall clock moved with how far monotonic time did; a leap of
more than CLOCK_LEAP_TOLERANCE_MS pauses deletion by age until file_reserved_hours of monotonic
time have passed, when the files written before the leap really are that old. Deletion for
disk pressure (the ratios above) goes on during the pause. A backward step only makes files
look younger (kept longer). A leap while the process was down cannot be seen.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from commitlog_svc.config import CommitLogConfig
from mqstore.storage.clock import Clock
from mqstore.storage.disk import Disk
from mqstore.storage.mapped_file_queue import MappedFileQueue

log = logging.getLogger(__name__)

_MS_PER_HOUR = 3_600_000
# Wall-clock movement beyond monotonic time's, per retention round, that counts as a leap.
CLOCK_LEAP_TOLERANCE_MS = 10 * 60_000


@dataclass(frozen=True, slots=True)
class RetentionReport:
    disk_full: bool
    clean_immediately: bool
    triggered: bool
    deleted_files: int
    floor_offset: int
    age_paused: bool = False  # deletion by age paused after a wall-clock leap


class RetentionPolicy:
    def __init__(self, config: CommitLogConfig, disk: Disk, clock: Clock) -> None:
        self._config = config
        self._disk = disk
        self._clock = clock
        self._last_wall_ms = clock.now_ms()
        self._last_mono_ms = clock.monotonic_ms()
        self._age_paused_until_mono_ms = -1.0

    def _age_paused(self, now_ms: int) -> bool:
        """Whether deletion by age is paused by a wall-clock leap (see the module's doc)."""
        mono_ms = self._clock.monotonic_ms()
        leap_ms = (now_ms - self._last_wall_ms) - (mono_ms - self._last_mono_ms)
        self._last_wall_ms, self._last_mono_ms = now_ms, mono_ms
        if leap_ms > CLOCK_LEAP_TOLERANCE_MS:
            reserved_ms = self._config.file_reserved_hours * _MS_PER_HOUR
            self._age_paused_until_mono_ms = mono_ms + reserved_ms
            log.warning(
                "the wall clock leapt %d s ahead of monotonic time: retention by age paused "
                "for %.1f hours (deletion for disk pressure goes on)",
                leap_ms // 1000,
                self._config.file_reserved_hours,
            )
        return mono_ms < self._age_paused_until_mono_ms

    def is_delete_hour(self, now_ms: int) -> bool:
        hour = dt.datetime.fromtimestamp(now_ms / 1000).hour  # local time, as RocketMQ
        return hour in self._config.delete_when_hours

    def run_once(
        self, queue: MappedFileQueue, *, floor_offset: int, manual: bool = False
    ) -> RetentionReport:
        config = self._config
        total, used = self._disk.usage(queue.store_path)
        ratio = used / total if total > 0 else 0.0
        disk_full = ratio > config.disk_warning_ratio
        clean_immediately = ratio > config.disk_clean_forcibly_ratio
        over_max = ratio > config.disk_max_used_ratio
        now_ms = self._clock.now_ms()
        age_paused = self._age_paused(now_ms)
        triggered = manual or over_max or self.is_delete_hour(now_ms)
        if disk_full:
            log.warning(
                "disk usage %.1f%% is over the warning ratio: refusing appends", ratio * 100
            )
        deleted = 0
        if triggered:
            expired_before_ms = now_ms - int(config.file_reserved_hours * _MS_PER_HOUR)
            deleted = queue.delete_expired_file_by_time(
                expired_before_ms=-1 if age_paused else expired_before_ms,
                floor_offset=floor_offset,
                clean_immediately=clean_immediately and config.clean_forcibly_enabled,
                max_files=config.delete_files_batch_max,
            )
            if deleted:
                log.info(
                    "retention deleted %d segment(s); min offset now %d",
                    deleted,
                    queue.min_offset(),
                )
        return RetentionReport(
            disk_full, clean_immediately, triggered, deleted, floor_offset, age_paused
        )
