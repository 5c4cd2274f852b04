"""The consume-queue store interface, and the pull decision both stores share.

    CqStore (ABC)       the interface, and what both share (checkpoint file, bounds, pull)
    ├── FileCqStore     file_store.py   RocketMQ's unit files + time companions (default)
    └── RocksCqStore    rocks_store.py  RocketMQ's RocksDB layout (§8) on rocksdict

A store applies whole dispatch frames as columns (`put_columns`; `put_entries` builds the
columns of an entry list) and answers a consumer's questions about positions; it never reads
message bytes. A pull answers
with the (commit-log offset, size) pairs to fetch, and the service fetches them from
commitlog_svc in one batched Read.

The confirmed offset (DESIGN.md, start-up handshake) is the commit-log offset below which every
entry the store was given is applied and durable. It only advances in `flush()`, after the data
it covers is flushed.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from cq_svc import checkpoint
from cq_svc.config import CqConfig
from mqstore.dispatch import DispatchColumns, DispatchEntry, QueueRuns
from mqstore.errors import InvalidArgument
from mqstore.formats import _core
from mqstore.formats.cq_checkpoint import CqCheckpoint
from mqstore.formats.cq_time import Boundary
from mqstore.formats.cq_unit import UNIT_BYTES, Unit
from mqstore.limits import TOPIC_PATTERN
from mqstore.storage.clock import Clock, SystemClock
from mqstore.storage.disk import Disk, OsDisk


class PullStatus(enum.StrEnum):
    """RocketMQ's GetMessageStatus (§6.1)."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"  # set by the service when a fetch fails
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    OFFSET_RESET = "OFFSET_RESET"  # set by a broker, never by the store


IntArray = npt.NDArray[np.int64]


@dataclass(slots=True)
class UnitColumns:
    """A run of units as columns, in queue order: what a pull decides over and fetches (a
    `Unit` object per unit was most of a Pull's time in cq_svc)."""

    queue_offset: IntArray
    phy: IntArray
    size: IntArray
    tags: IntArray

    def __len__(self) -> int:
        return len(self.queue_offset)

    @classmethod
    def empty(cls) -> UnitColumns:
        none = np.zeros(0, dtype=np.int64)
        return cls(none, none, none, none)

    @classmethod
    def concat(cls, parts: Sequence[UnitColumns]) -> UnitColumns:
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls.empty()
        return cls(
            np.concatenate([p.queue_offset for p in parts]),
            np.concatenate([p.phy for p in parts]),
            np.concatenate([p.size for p in parts]),
            np.concatenate([p.tags for p in parts]),
        )

    def units(self) -> list[Unit]:
        """As Unit objects (no store time: a pull does not read it)."""
        return list(
            map(
                Unit,
                self.queue_offset.tolist(),
                self.phy.tolist(),
                self.size.tolist(),
                self.tags.tolist(),
            )
        )


@dataclass(frozen=True, slots=True)
class UnitRun:
    """Consecutive units from queue offset `first` as a store holds them: `data` has them
    `stride` bytes apart, each starting with the 20-byte unit of cq_unit.py (the file store's
    unit bytes, stride 20; the rocks store's values, stride 28 with the store time after the
    unit). What a pull walks (formats/_core_pull.pxi) without decoding a unit it does not
    take."""

    first: int
    data: bytes | bytearray
    stride: int = UNIT_BYTES

    def __len__(self) -> int:
        return len(self.data) // self.stride


@dataclass(slots=True)
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    # What to fetch, in queue order: queue offset, commit-log offset, size (and tags code).
    taken: UnitColumns = field(default_factory=UnitColumns.empty)
    filtered: int = 0  # units skipped by the tag filter

    @property
    def units(self) -> list[Unit]:
        return self.taken.units()


@dataclass(slots=True)
class RecoveryReport:
    queues: int = 0
    units_cut: int = 0
    confirmed_offset: int = 0
    duration_ms: float = 0.0


log = logging.getLogger(__name__)

Key = tuple[str, int]


class CqStore(ABC):
    """The store interface, and what both stores share: their settings, checkpoint file and
    applied offset, and the reads answered from a queue's bounds and its PullSource."""

    def __init__(
        self, config: CqConfig, *, disk: Disk | None = None, clock: Clock | None = None
    ) -> None:
        self.config = config
        self.disk: Disk = disk if disk is not None else OsDisk()
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._lock = threading.RLock()
        self._ckpt = CqCheckpoint()
        self._applied = 0  # end of the newest frame given to put_columns
        self._min_phy = 0  # the commit log's minimum, as last told

    # -- life cycle --
    @abstractmethod
    def open(self) -> RecoveryReport:
        """Load and recover (for the file store: each queue's last 3 files)."""

    @abstractmethod
    def close(self, *, flush: bool = True) -> None:
        """Flush everything, write the checkpoint, release files. With flush=False (a flush
        failed before: retrying it could vouch for pages the kernel dropped) only release."""

    # -- the start-up handshake --
    @property
    def store_id(self) -> bytes:
        """The commit log this store follows (empty until the first handshake)."""
        return self._ckpt.store_id

    @abstractmethod
    def reset(self, store_id: bytes) -> None:
        """The commit log was replaced: drop every queue, follow `store_id` from scratch."""

    @property
    @abstractmethod
    def confirmed_offset(self) -> int:
        """Everything below this commit-log offset is applied and durable."""

    @property
    def applied_offset(self) -> int:
        """End of the newest entry given to put_columns (not necessarily durable yet): at least
        the confirmed offset, and what the start-up handshake compares with the log's end."""
        return self._applied

    @abstractmethod
    def advance_applied(self, offset: int) -> None:
        """Count everything below `offset` as applied (nothing below it will be dispatched)."""

    def _save_checkpoint(self, confirmed_offset: int) -> None:
        self._ckpt = dataclasses.replace(
            self._ckpt,
            confirmed_offset=confirmed_offset,
            min_commit_log_offset=self._min_phy,
            written_at_ms=self.clock.now_ms(),
        )
        checkpoint.save(self.disk, self.config.data_dir, self._ckpt)

    # -- writes --
    @abstractmethod
    def put_columns(self, columns: DispatchColumns, batch_end_offset: int = -1) -> int:
        """Apply a dispatch frame (in commit-log order); entries already applied are skipped.
        `batch_end_offset` is where the frame ends in the log (default: the last entry's end).
        Returns the number of units written."""

    @staticmethod
    def _pack_runs(
        columns: DispatchColumns,
        runs: QueueRuns,
        states: Sequence[_core.RunState],
        prefixes: list[bytes] | None = None,
    ) -> tuple[list[_core.RunEnd], list[bytes], list[bytes]]:
        """What put_columns writes, packed for every queue's run of the frame in one compiled
        call (_core.pack_runs) from the states of the runs' queues: where each run starts and
        ends, and its units and time entries (the file store) or its RocksDB rows (`prefixes`,
        each queue's key prefix)."""
        return _core.pack_runs(
            runs.rows,
            runs.bounds,
            columns.queue_offsets,
            columns.commit_log_offsets,
            columns.sizes,
            columns.tags_codes,
            columns.store_timestamps_ms,
            states,
            prefixes,
        )

    @abstractmethod
    def truncate_dirty(self, phy_offset: int) -> int:
        """Drop every unit pointing at or beyond `phy_offset`; returns units dropped."""

    @abstractmethod
    def correct_min_offset(self, min_commit_log_offset: int) -> None: ...

    @abstractmethod
    def delete_expired(self, min_commit_log_offset: int) -> int:
        """Delete what only points below the commit log's minimum; returns files/ranges."""

    @abstractmethod
    def flush(self, least_pages: int = 0) -> int:
        """Flush; with least_pages 0 also advance the checkpoint. Returns the confirmed
        offset."""

    # -- reads --
    @abstractmethod
    def _bounds(self, key: Key) -> tuple[int, int, int] | None:
        """The queue's (min offset, max offset, newest unit's end in the log); None when the
        store does not know it."""

    @abstractmethod
    def _pull_source(self, key: Key) -> PullSource: ...

    def min_offset(self, topic: str, queue_id: int) -> int:
        bounds = self._bounds((topic, queue_id))
        return bounds[0] if bounds is not None else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        bounds = self._bounds((topic, queue_id))
        return bounds[1] if bounds is not None else 0

    @abstractmethod
    def read_units(self, topic: str, queue_id: int, offset: int, max_units: int) -> list[Unit]:
        """Units from `offset` (possibly spanning files); [] beyond what is stored."""

    @abstractmethod
    def get_offset_by_time(
        self, topic: str, queue_id: int, timestamp_ms: int, boundary: Boundary = Boundary.LOWER
    ) -> int: ...

    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int,
        max_bytes: int,
        tags_codes: Iterable[int] = (),
    ) -> PullResult:
        with self._lock:
            return decide_pull(
                self._pull_source((topic, queue_id)),
                offset,
                max_messages,
                max_bytes,
                tags_codes,
                max_filter_bytes=self.config.max_filter_bytes,
                pull_bytes_cap=self.config.pull_bytes_cap,
            )

    @abstractmethod
    def list_queues(self, topic: str) -> list[int]: ...

    @abstractmethod
    def list_topics(self) -> list[str]: ...


def check_queue_name(key: Key) -> None:
    topic, qid = key
    # Topics become directory names: the limits module's pattern keeps "../" out.
    if not TOPIC_PATTERN.match(topic) or qid < 0:
        raise InvalidArgument(f"bad topic or queue id {topic!r}/{qid}", field="topic")


def check_gap(key: Key, expect: int, offset: int, units_per_file: int) -> None:
    """An entry at `offset` past the queue's next offset `expect`: the caller fills the gap
    with blank units, after this logs it; more than a file of blanks is refused."""
    gap = offset - expect
    if gap > units_per_file:
        raise InvalidArgument(
            f"{key[0]}/{key[1]}: entry at queue offset {offset} leaves a gap of {gap} units "
            "after the queue's end; refusing to fill more than a file of blanks",
            field="queue_offset",
        )
    log.error(
        "[BUG] %s/%d: logic queue order maybe wrong: expected %d, got %d; %d blank units",
        *key,
        expect,
        offset,
        gap,
    )


def put_entries(
    store: CqStore, entries: Sequence[DispatchEntry], batch_end_offset: int = -1
) -> int:
    """put_columns for an entry list (tests and benchmarks build entries)."""
    return store.put_columns(DispatchColumns.from_entries(entries), batch_end_offset)


class PullSource(Protocol):
    """What the shared pull decision needs of a store, for one queue."""

    def bounds(self) -> tuple[int, int]:
        """(min, max) offsets of the queue; (0, 0) for an unknown queue."""

    def scan(self, offset: int, max_units: int) -> UnitRun | None:
        """Units from `offset` within the store's travel bound, at most `max_units`; None when
        nothing holds `offset`."""

    def roll_next(self, offset: int) -> int:
        """Where to go on after OFFSET_FOUND_NULL at `offset`."""

    @property
    def one_file_per_pull(self) -> bool:
        """A file store stops a pull's scan at the end of a file (RocketMQ's travel bound)."""

    @property
    def units_per_file(self) -> int: ...


def decide_pull(
    source: PullSource,
    offset: int,
    max_messages: int,
    max_bytes: int,
    tags_codes: Iterable[int],
    *,
    max_filter_bytes: int,
    pull_bytes_cap: int,
) -> PullResult:
    """DefaultMessageStore.getMessage's range checks and CQ scan (§6.2), without the message
    reads. The in-memory / on-disk transfer caps (32 / 8 messages) are the broker's business
    and are left to the caller's max_messages / max_bytes.

    RocketMQ walks unit by unit: a blank unit is stepped over; before any other unit the batch
    is full when it holds max_messages, or the unit would take it past the byte cap, or it is
    at the cap already; a unit the tag filter refuses is counted and skipped; the rest are
    taken. Each run of units the source scans is walked so by the compiled core
    (formats/_core_pull.pxi), over the units as stored; tests/cq/test_pull_decision.py pins
    it to the unit-by-unit walk."""
    lo, hi = source.bounds()
    if hi == 0:
        return PullResult(PullStatus.NO_MESSAGE_IN_QUEUE, 0, lo, hi)
    if offset < lo:
        return PullResult(PullStatus.OFFSET_TOO_SMALL, lo, lo, hi)
    if offset == hi:
        return PullResult(PullStatus.OFFSET_OVERFLOW_ONE, offset, lo, hi)
    if offset > hi:
        return PullResult(PullStatus.OFFSET_OVERFLOW_BADLY, hi, lo, hi)
    wanted = np.array(sorted(frozenset(tags_codes)), dtype=np.int64)
    max_pull_bytes = min(max(max_bytes, 100), pull_bytes_cap)
    # Units scanned: max(maxFilterMessageSize, maxMsgNums * 20) bytes of consume queue, read in
    # chunks so that a pull of 32 does not read the whole window.
    window = min(max(max_filter_bytes, max_messages * UNIT_BYTES) // UNIT_BYTES, hi - offset)
    # Without a filter the batch fills from the first units (one extra shows the batch full).
    chunk = max(2 * max_messages, _SCAN_CHUNK_MIN) if len(wanted) else max_messages + 1
    result = PullResult(PullStatus.NO_MATCHED_MESSAGE, offset, lo, hi)
    parts: list[UnitColumns] = []
    count = 0  # units taken so far
    total = 0  # their bytes
    at = offset
    while at < offset + window:
        run = source.scan(at, min(chunk, offset + window - at))
        if run is None:
            if at == offset:
                return PullResult(PullStatus.OFFSET_FOUND_NULL, source.roll_next(offset), lo, hi)
            break
        n = len(run)
        if not n:
            break
        out = np.empty((4, n), dtype=np.int64)
        stop, taken, filtered, total = _core.pull_walk(
            run.data, run.stride, run.first, wanted, count, total, max_messages, max_pull_bytes, out
        )
        if stop:
            result.next_begin_offset = run.first + stop  # refused and blank units too
        if taken:
            parts.append(
                UnitColumns(out[0, :taken], out[1, :taken], out[2, :taken], out[3, :taken])
            )
            count += taken
        result.filtered += filtered
        if stop < n:
            break  # isTheBatchFull
        at = run.first + n
        if source.one_file_per_pull and at % source.units_per_file == 0:
            break  # travelCqFileNumWhenGetMessage = 1: one file per pull
    result.taken = UnitColumns.concat(parts)
    if count:
        result.status = PullStatus.FOUND
    return result


_SCAN_CHUNK_MIN = 64
