"""Configuration of the consume-queue engine. Defaults are RocketMQ's (rocketmq-store.md §2.5)
unless a comment gives another reason."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from mqstore.errors import InvalidArgument


class StoreKind(enum.StrEnum):
    FILE = "file"  # RocketMQ's file consume queue, byte-identical, plus our time companion
    ROCKSDB = "rocksdb"  # RocketMQ's RocksDB consume queue layout (§8) on rocksdict


class AckFlush(enum.StrEnum):
    SYNC = "sync"  # an ack returns only after its journal entry is fsynced
    ASYNC = "async"  # journal synced by the flush thread every flush_interval_ms


@dataclass(frozen=True)
class CqConfig:
    data_dir: str
    cq_store: StoreKind = StoreKind.FILE
    # 300,000 units a file (mappedFileSizeConsumeQueue); rounded up to a multiple of 20.
    units_per_file: int = 300_000
    # Each open mapped file holds a file descriptor (Python's mmap keeps a dup of it), so open
    # maps are bounded: 1,024 maps is a quarter of a typical 4,096 fd limit. The service
    # derives it from its own limit (settings.open_maps_for_fd_limit).
    open_maps_max: int = 1024
    # flushIntervalConsumeQueue, flushConsumeQueueLeastPages, flushConsumeQueueThoroughInterval
    flush_interval_ms: int = 1_000
    flush_least_pages: int = 2
    flush_thorough_interval_ms: int = 60_000
    # maxFilterMessageSize: bytes of units scanned by one pull (800 units).
    max_filter_bytes: int = 16_000
    # maxPullSize's cap (128 MiB) in getMessage.
    pull_bytes_cap: int = 128 << 20

    # -- RocksDB store --
    # Per-queue (min, max, last time) cached in memory: an LRU, so that a million queues do not
    # mean a million heap entries. 65,536 entries is ~10 MiB of Python objects.
    rocksdb_queue_cache_max: int = 65_536
    rocksdb_write_buffer_bytes: int = 64 << 20

    # -- consumer groups and acks --
    ack_flush: AckFlush = AckFlush.SYNC
    # RabbitMQ's queue_index_max_journal_entries and its segment size (not configurable there).
    ack_journal_entries_max: int = 65_536
    ack_segment_entries: int = 16_384
    # A queue with no ack activity for this long is folded into segments and its state dropped
    # from memory (RabbitMQ folds when the queue process hibernates).
    ack_idle_ms: int = 10_000
    # Offsets between a group's committed offset and the newest delivered one: bounds the state
    # kept per (group, queue). Receive hands out no new offsets past it (redeliveries go on).
    ack_window_max: int = 65_536
    # Committed-offset log records before it is compacted into a snapshot.
    offsets_log_records_max: int = 100_000

    def __post_init__(self) -> None:
        if self.units_per_file <= 0:
            raise InvalidArgument("units_per_file must be positive")
        if self.open_maps_max < 2:
            raise InvalidArgument("open_maps_max must be at least 2 (a unit and a time file)")
        if self.ack_segment_entries <= 0 or self.ack_journal_entries_max <= 0:
            raise InvalidArgument("ack segment and journal bounds must be positive")
        if self.ack_window_max <= 0:
            raise InvalidArgument("ack_window_max must be positive")
        if self.flush_interval_ms <= 0:
            raise InvalidArgument("flush_interval_ms must be positive")

    @classmethod
    def for_tests(cls, data_dir: str, **overrides: object) -> CqConfig:
        """Tiny files (50 units) so that rollover happens within a few dozen entries."""
        values: dict[str, object] = {
            "units_per_file": 50,
            "open_maps_max": 64,
            "flush_interval_ms": 20,
            "flush_thorough_interval_ms": 100,
            "ack_journal_entries_max": 64,
            "ack_segment_entries": 16,
            "ack_idle_ms": 200,
            "ack_window_max": 256,
            "offsets_log_records_max": 32,
            "rocksdb_write_buffer_bytes": 4 << 20,
        }
        values.update(overrides)
        return cls(data_dir=data_dir, **values)  # type: ignore[arg-type]
