"""Configuration of the commit-log engine. Defaults are RocketMQ's (rocketmq-store.md §2.5)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from mqstore.errors import InvalidArgument
from mqstore.formats.record import pack_host
from mqstore.limits import MessageLimits


class FlushMode(enum.StrEnum):
    SYNC = "sync"  # group commit: an append returns once its bytes are durable
    ASYNC = "async"  # interval flush: the loss window is flush_interval_ms


@dataclass(frozen=True)
class CommitLogConfig:
    data_dir: str
    flush: FlushMode = FlushMode.ASYNC
    # mappedFileSizeCommitLog
    file_bytes: int = 1 << 30
    limits: MessageLimits = field(default_factory=MessageLimits)

    # Where msg ids say the message is stored (store host of the record).
    store_ip: str = "127.0.0.1"
    store_port: int = 10911

    # Async flush (FlushRealTimeService).
    flush_interval_ms: int = 500
    flush_least_pages: int = 4
    flush_thorough_interval_ms: int = 10_000
    # Sync flush: an append not durable within this is answered FLUSH_DISK_TIMEOUT.
    sync_flush_timeout_ms: int = 5_000

    # OS_PAGE_CACHE_BUSY: an append that waited this long for the write lock is refused, so a
    # stalled disk turns into back-pressure rather than an unbounded queue of waiting threads.
    put_lock_timeout_ms: int = 1_000

    # Keep this much of the segment ahead of the write position faulted in by a background
    # thread (storage/warmer.py): first-touch page faults were the largest cost of appends
    # through the map on this kind of VM. 0 turns it off.
    warm_ahead_bytes: int = 64 << 20

    # Dispatch columns of the newest appends held for subscribers in step (append_frames.py):
    # their frames come from memory instead of a scan of the segment. 0 turns it off.
    append_frames_bytes: int = 32 << 20
    # Of those, the newest appends' records too, for subscribers that ask (include_records).
    append_records_bytes: int = 16 << 20

    # Every record ends with RocketMQ's whole-record CRC property (__CRC32#, its
    # enabledAppendPropCRC, off by default there): a changed byte anywhere in a record is found,
    # not only in its body. Off: the body CRC alone, as RocketMQ writes by default.
    record_crc: bool = True

    # The checkpoint (flushed offset + queue-offset table) is rewritten at most this often;
    # recovery checks everything written after it, so this bounds the scan after a crash.
    checkpoint_interval_ms: int = 1_000

    # Producer idempotence (producers.py): producers remembered (least recently used forgotten
    # first) and stored requests remembered per producer.
    producers_max: int = 10_000
    producer_requests_max: int = 5

    # Retention (CleanCommitLogService).
    file_reserved_hours: float = 72.0
    delete_when_hours: tuple[int, ...] = (4,)
    disk_max_used_ratio: float = 0.75
    disk_clean_forcibly_ratio: float = 0.85
    disk_warning_ratio: float = 0.90
    clean_forcibly_enabled: bool = True
    delete_files_batch_max: int = 10
    clean_interval_ms: int = 10_000

    def __post_init__(self) -> None:
        if self.file_bytes < 4096 or self.file_bytes % 4096:
            raise InvalidArgument("file_bytes must be a positive multiple of 4096")
        for name in (
            "flush_interval_ms",
            "sync_flush_timeout_ms",
            "put_lock_timeout_ms",
            "producers_max",
            "producer_requests_max",
        ):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive")
        if not 0 < self.disk_max_used_ratio <= self.disk_clean_forcibly_ratio <= 1:
            raise InvalidArgument("disk ratios must satisfy 0 < max_used <= forcibly <= 1")
        pack_host(self.store_ip, self.store_port)  # validates the address

    @property
    def store_host(self) -> bytes:
        return pack_host(self.store_ip, self.store_port)

    @property
    def commitlog_dir(self) -> str:
        return f"{self.data_dir}/commitlog"

    @classmethod
    def for_tests(cls, data_dir: str, **overrides: object) -> CommitLogConfig:
        """Tiny segments (4 KiB) so that rollover happens within a few messages."""
        values: dict[str, object] = {
            "file_bytes": 4096,
            "flush_interval_ms": 20,
            "flush_thorough_interval_ms": 100,
            "checkpoint_interval_ms": 50,
            "sync_flush_timeout_ms": 2_000,
            "warm_ahead_bytes": 0,
        }
        values.update(overrides)
        return cls(data_dir=data_dir, **values)  # type: ignore[arg-type]
