"""Configuration of the index engine. Geometry defaults are RocketMQ's (rocketmq-store.md §4)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from mqstore.errors import InvalidArgument
from mqstore.formats import index_file as fmt


@dataclass(frozen=True)
class IndexConfig:
    data_dir: str
    # maxHashSlotNum / maxIndexNum: a file of 40 + 4*S + 20*N bytes (420 MB) holding N - 1 keys.
    slot_num: int = fmt.DEFAULT_SLOT_NUM
    entry_num: int = fmt.DEFAULT_ENTRY_NUM
    # Keep a 64-bit hash per entry in a companion file (8 bytes per entry, +38 % disk) so that
    # 32-bit hash collisions are dropped before any commit-log read.
    exact: bool = False
    # Index only keys whose mqstore.sharding shard under shard_count is shard_index.
    shard_count: int = 1
    shard_index: int = 0
    # Flush and checkpoint at least this often while entries arrive: the confirmed offset lags
    # the applied one by at most this, which is the replay after a crash.
    flush_interval_ms: int = 1_000
    # RocketMQ's maxMsgsNumBatch: the most messages one key query returns.
    max_results: int = 64
    # The broker's defaultQueryMaxNum for unique-id queries.
    uniq_max_results: int = 32
    # Candidates one query may walk to and hand to a batched read: bounds the work and the read
    # whatever maximum a caller asks for (RocketMQ #7948 allocated the maximum up front).
    max_candidates: int = 1_024
    # Check every sealed file's CRCs at open (reads every index file once; RocketMQ #1258 is
    # about slow start-up, so off by default). The active file is always checked after an
    # unclean exit, and a sealed file's size and header always.
    verify_sealed_on_open: bool = False

    def __post_init__(self) -> None:
        if self.slot_num < 1:
            raise InvalidArgument("slot_num must be at least 1")
        if self.entry_num < 2:
            raise InvalidArgument("entry_num must be at least 2 (entry 0 is never used)")
        if fmt.file_bytes(self.slot_num, self.entry_num) > fmt.FILE_BYTES_MAX:
            raise InvalidArgument("an index file must stay below 2 GiB (Java int positions)")
        if self.shard_count < 1 or not 0 <= self.shard_index < self.shard_count:
            raise InvalidArgument("shards need 0 <= shard_index < shard_count")
        if self.flush_interval_ms <= 0:
            raise InvalidArgument("flush_interval_ms must be positive")
        if not 0 < self.uniq_max_results <= self.max_candidates:
            raise InvalidArgument("uniq_max_results must be in (0, max_candidates]")
        if not 0 < self.max_results <= self.max_candidates:
            raise InvalidArgument("max_results must be in (0, max_candidates]")

    @property
    def index_dir(self) -> str:
        return os.path.join(self.data_dir, "index")

    @property
    def file_bytes(self) -> int:
        return fmt.file_bytes(self.slot_num, self.entry_num)

    @classmethod
    def for_tests(cls, data_dir: str, **overrides: object) -> IndexConfig:
        """Tiny files (4 slots, 8 entries: 7 keys a file) so that chains collide and files roll
        over within a few messages."""
        values: dict[str, object] = {"slot_num": 4, "entry_num": 8, "flush_interval_ms": 50}
        values.update(overrides)
        return cls(data_dir=data_dir, **values)  # type: ignore[arg-type]
