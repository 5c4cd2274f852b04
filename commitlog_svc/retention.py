"""Retention: which commit-log segments to delete, RocketMQ's CleanCommitLogService rules.

    disk usage of the log's file system     effect
    > disk_warning_ratio (90 %)             disk full: appends refused; delete immediately
    > disk_clean_forcibly_ratio (85 %)      delete leading files even if not expired
    > disk_max_used_ratio (75 %)            delete expired files now, not only at delete_when
    otherwise                               delete expired files at the delete_when hours

Expired = last modified more than file_reserved_hours ago. Always: only the leading run of files,
never the last file, at most delete_files_batch_max per round, and never a file holding bytes at
or above the floor offset (the lowest offset a subscriber still needs), whatever the disk says.
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


@dataclass(frozen=True, slots=True)
class RetentionReport:
    usage_ratio: float
    disk_full: bool
    clean_immediately: bool
    triggered: bool
    deleted_files: int
    floor_offset: int


class RetentionPolicy:
    def __init__(self, config: CommitLogConfig, disk: Disk, clock: Clock) -> None:
        self._config = config
        self._disk = disk
        self._clock = clock

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
        triggered = manual or over_max or self.is_delete_hour(now_ms)
        if disk_full:
            log.warning(
                "disk usage %.1f%% is over the warning ratio: refusing appends", ratio * 100
            )
        deleted = 0
        if triggered:
            deleted = queue.delete_expired_file_by_time(
                expired_before_ms=now_ms - int(config.file_reserved_hours * _MS_PER_HOUR),
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
            ratio, disk_full, clean_immediately, triggered, deleted, floor_offset
        )
