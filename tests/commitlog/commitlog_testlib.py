"""Shared helpers of the commit-log tests: messages, stores on real files or a SimDisk, crashes,
byte surgery on segment files, and checks of what survived.

Record layout (IPv4 born and store hosts, V1 magic), as mqstore/formats/record.py documents it:

    TOTALSIZE 0, MAGIC 4, BODYCRC 8, QUEUEID 12, FLAG 16, QUEUEOFFSET 20, PHYSICALOFFSET 28,
    SYSFLAG 36, BORNTIMESTAMP 40, BORNHOST 48, STORETIMESTAMP 56, STOREHOST 64,
    RECONSUMETIMES 72, PREPAREDTXOFFSET 76, BODYLENGTH 84, BODY 88, then TOPICLENGTH (1),
    TOPIC, PROPERTIESLENGTH (2), PROPERTIES.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from commitlog_svc.commitlog import CommitLog
from commitlog_svc.config import CommitLogConfig
from commitlog_svc.messages import AppendResult, PutStatus
from mqstore.errors import MqstoreError
from mqstore.formats.properties import encode_properties
from mqstore.formats.record import Record
from mqstore.formats.record_columns import split_records
from mqstore.storage.clock import Clock
from mqstore.storage.disk import Disk
from mqstore.storage.mapped_file import offset_to_file_name
from mqstore.storage.simdisk import CrashMode, SimDisk
from tests.commitlog.message_in import MessageIn, as_batches

TOPIC = "TopicTest"
BODY_POS = 88
HEADER_FIELDS: dict[str, tuple[int, int]] = {
    # name: (position, width) in an IPv4/IPv4/V1 record
    "TOTALSIZE": (0, 4),
    "MAGIC": (4, 4),
    "BODYCRC": (8, 4),
    "QUEUEID": (12, 4),
    "FLAG": (16, 4),
    "QUEUEOFFSET": (20, 8),
    "PHYSICALOFFSET": (28, 8),
    "SYSFLAG": (36, 4),
    "BORNTIMESTAMP": (40, 8),
    "BORNHOST": (48, 8),
    "STORETIMESTAMP": (56, 8),
    "STOREHOST": (64, 8),
    "RECONSUMETIMES": (72, 4),
    "PREPAREDTXOFFSET": (76, 8),
    "BODYLENGTH": (84, 4),
}

# Intervals long enough that no timer fires during a test: nothing is flushed or checkpointed
# after open() unless the test asks for it (a crash then finds the checkpoint lagging).
NEVER_MS = 600_000


def body_for(i: int, nbytes: int) -> bytes:
    """A body with no zero byte, different for every i, so that zeroing any byte changes it."""
    rng = random.Random(i)
    return bytes(rng.randrange(1, 256) for _ in range(nbytes))


def message(
    i: int,
    *,
    topic: str = TOPIC,
    queue_id: int | None = None,
    queues: int = 4,
    body_bytes: int = 100,
    with_properties: bool = True,
    sys_flag: int = 0,
) -> MessageIn:
    """Message number i; by default in queue i % queues, with KEYS/TAGS properties (so that the
    record ends in a non-zero byte)."""
    props = (
        encode_properties({"KEYS": f"key-{i}", "TAGS": f"tag{i % 3}"}) if with_properties else b""
    )
    return MessageIn(
        topic=topic,
        queue_id=i % queues if queue_id is None else queue_id,
        body=body_for(i, body_bytes),
        properties=props,
        flag=i,
        sys_flag=sys_flag,
        born_timestamp_ms=1_600_000_000_000 + i,
        reconsume_times=i % 5,
    )


@dataclass(frozen=True)
class Stored:
    """What the store said about one message, and what the message was."""

    offset: int
    size: int
    queue_offset: int
    message: MessageIn

    @property
    def end(self) -> int:
        return self.offset + self.size


def stored_from(result: AppendResult, messages: Sequence[MessageIn]) -> list[Stored]:
    out = []
    for i, m in enumerate(messages):
        if result.statuses[i] is PutStatus.PUT_OK:
            out.append(Stored(result.offsets[i], result.sizes[i], result.queue_offsets[i], m))
    return out


def append_each(log: CommitLog, messages: Sequence[MessageIn]) -> list[Stored]:
    """Append one message per call; every append must be PUT_OK."""
    out: list[Stored] = []
    for m in messages:
        result = log.append_batch(as_batches([m]))
        assert result.statuses == [PutStatus.PUT_OK], (result.statuses, result.reasons)
        out.extend(stored_from(result, [m]))
    return out


def append_batch_ok(log: CommitLog, messages: Sequence[MessageIn]) -> list[Stored]:
    result = log.append_batch(as_batches(messages))
    assert result.ok, (result.statuses, result.reasons)
    return stored_from(result, messages)


def config_for(data_dir: str | os.PathLike[str], **overrides: object) -> CommitLogConfig:
    """CommitLogConfig.for_tests (4 KiB segments, a 50 ms checkpoint interval)."""
    return CommitLogConfig.for_tests(str(data_dir), **overrides)


# Every store a test opened through these helpers; conftest.py closes those still running when
# the test ends (a failed assertion must not leave a flush thread running for the session).
OPENED: list[CommitLog] = []


def opened(log: CommitLog, *, retention: bool = False) -> CommitLog:
    """Open `log` and register it for closing at the end of the test."""
    OPENED.append(log)
    log.open(retention=retention)
    return log


def open_log(
    data_dir: str | os.PathLike[str],
    *,
    disk: Disk | None = None,
    clock: Clock | None = None,
    **overrides: object,
) -> CommitLog:
    return opened(CommitLog(config_for(data_dir, **overrides), disk=disk, clock=clock))


def reopen(log: CommitLog, *, disk: Disk | None = None, clock: Clock | None = None) -> CommitLog:
    """A new engine on the same directory and configuration (after close, kill or crash)."""
    return opened(
        CommitLog(
            log.config,
            disk=disk if disk is not None else log.disk,
            clock=clock if clock is not None else log.clock,
        )
    )


def on_flush_thread_of(log: CommitLog, action: Callable[[str], None]) -> Callable[[str], None]:
    """A failpoint action that acts only on `log`'s flush thread (failpoints are global)."""
    flusher = log._flusher
    assert flusher is not None
    thread = flusher._thread

    def act(name: str) -> None:
        if threading.current_thread() is thread:
            action(name)

    return act


def kill(log: CommitLog) -> None:
    """kill -9 on real files: the threads stop without a last flush or checkpoint, the maps go
    (their bytes stay in the page cache, so the files keep them), the lock is released and the
    abort marker stays."""
    log._stop_retention()
    flusher = log._flusher
    assert flusher is not None
    flusher.stop()
    log._running = False
    log.queue.shutdown()
    lock = log._lock
    assert lock is not None
    lock.release()
    log._lock = None


def sim_crash(log: CommitLog, disk: SimDisk, rng: random.Random, mode: CrashMode) -> int:
    """Power loss under a store on a SimDisk. The engine's threads are stopped first (a dead
    process writes nothing more); returns the flushed offset at the moment of the crash."""
    log._stop_retention()
    flusher = log._flusher
    assert flusher is not None
    flusher.stop()
    flushed = log.flushed_offset
    log._running = False
    disk.crash(rng, mode)
    return flushed


# -- bytes on disk ---------------------------------------------------------------------------


def segment_path(config: CommitLogConfig, offset: int) -> str:
    """The segment file holding commit-log `offset`."""
    start = offset - offset % config.file_bytes
    return os.path.join(config.commitlog_dir, offset_to_file_name(start))


def read_at(config: CommitLogConfig, offset: int, nbytes: int) -> bytes:
    with open(segment_path(config, offset), "rb") as f:
        f.seek(offset % config.file_bytes)
        return f.read(nbytes)


def write_at(config: CommitLogConfig, offset: int, data: bytes) -> None:
    """Overwrite bytes of a real segment file in place (damage for recovery tests)."""
    pos = offset % config.file_bytes
    assert pos + len(data) <= config.file_bytes, "damage must stay inside one segment"
    with open(segment_path(config, offset), "r+b") as f:
        f.seek(pos)
        f.write(data)


def zero_range(config: CommitLogConfig, start: int, end: int) -> None:
    write_at(config, start, bytes(end - start))


def flip_bit(config: CommitLogConfig, offset: int, bit: int) -> None:
    (byte,) = read_at(config, offset, 1)
    write_at(config, offset, bytes([byte ^ (1 << bit)]))


def sim_write_at(disk: SimDisk, config: CommitLogConfig, offset: int, data: bytes) -> None:
    """Overwrite bytes of a segment on a SimDisk, durably (damage that survives a crash)."""
    path = segment_path(config, offset)
    region = disk.map(path, config.file_bytes)
    pos = offset % config.file_bytes
    region.buf[pos : pos + len(data)] = data
    region.flush(pos, pos + len(data))


def segment_names(config: CommitLogConfig) -> list[str]:
    return sorted(os.listdir(config.commitlog_dir))


# -- checks ------------------------------------------------------------------------------------


def scan_all(log: CommitLog, *, check_crc: bool = True) -> list[Record]:
    """Every record from the log's minimum to its readable end, in order."""
    records: list[Record] = []
    offset = log.min_offset
    end = log.max_offset
    while offset < end:
        batch = log.scan(offset, end_offset=end, check_crc=check_crc)
        assert not batch.corrupt, f"unexpected corruption: {batch.corrupt}"
        assert batch.next_offset > offset, "scan made no progress"
        records.extend(batch.records)
        offset = batch.next_offset
    return records


def matches(record: Record, stored: Stored) -> bool:
    m = stored.message
    return (
        record.physical_offset == stored.offset
        and record.total_size == stored.size
        and record.queue_offset == stored.queue_offset
        and record.topic == m.topic
        and record.queue_id == m.queue_id
        and record.body == bytes(m.body)
        and record.properties == m.properties
        and record.flag == m.flag
        and record.born_timestamp_ms == m.born_timestamp_ms
        and record.reconsume_times == m.reconsume_times
    )


def assert_log_holds(log: CommitLog, expected: Sequence[Stored], context: str = "") -> None:
    """The log holds exactly `expected`, in order, each readable by offset with its bytes."""
    records = scan_all(log)
    got = [(r.physical_offset, r.queue_offset, r.topic, r.queue_id) for r in records]
    want = [(s.offset, s.queue_offset, s.message.topic, s.message.queue_id) for s in expected]
    assert got == want, f"{context}: records differ from the expected ones"
    for record, stored in zip(records, expected, strict=True):
        assert matches(record, stored), f"{context}: record at {stored.offset} differs"
        assert matches(log.read_record(stored.offset), stored), context


def next_queue_offsets(stored: Sequence[Stored]) -> dict[tuple[str, int], int]:
    """Per queue, the last queue offset stored plus one (messages that take one)."""
    table: dict[tuple[str, int], int] = {}
    for s in stored:
        if s.message.sys_flag & 0xC in (0x4, 0xC):  # PREPARED / ROLLBACK take no queue offset
            continue
        key = (s.message.topic, s.message.queue_id)
        table[key] = max(table.get(key, 0), s.queue_offset + 1)
    return table


def placed_at(end: int, size: int, file_bytes: int) -> int:
    """Where a record of `size` bytes appended at log end `end` goes: there, or at the next
    file's start when it does not fit with 8 bytes to spare (the end-of-file blank)."""
    room = file_bytes - end % file_bytes
    return end if size + 8 <= room else end + room


def assert_appends_resume(log: CommitLog, survivors: Sequence[Stored], seed: int = 10_000) -> None:
    """A new append lands exactly at the log's end with the next queue offset, and reads back."""
    end = log.max_offset
    expected_next = next_queue_offsets(survivors)
    new = message(seed)
    key = (new.topic, new.queue_id)
    assert log.queue_offset(*key) == expected_next.get(key, 0)
    [stored] = append_each(log, [new])
    assert stored.offset == placed_at(end, stored.size, log.config.file_bytes)
    assert stored.queue_offset == expected_next.get(key, 0)
    assert matches(log.read_record(stored.offset), stored)


def read_many(log: CommitLog, ranges: Sequence[tuple[int, int]]) -> list[bytes | MqstoreError]:
    """CommitLog.read_blob's answer to (offset, size) ranges, cut into one answer a range: the
    raw record or its error."""
    blob, served, errors = log.read_blob([o for o, _ in ranges], [z for _, z in ranges])
    out: list[bytes | MqstoreError] = list(split_records(blob, served))
    for i, error in errors.items():
        out[i] = error
    return out
