"""Committed offsets of consumer groups, per (group, topic, queueId).

    groups/offsets.log    append-only records, each guarded by its own CRC32C
    groups/offsets.snap   every offset at the last compaction (one CRC32C frame, magic b"CQGO")

    record:  0       4       6         6+n
             +-------+-------+---------+
             | crc32c| len n | payload |      CRC32C over len and payload
             +-------+-------+---------+
    payload: u16 group length | group | u16 topic length | topic | i32 queueId | i64 offset
    (the snapshot payload is u32 count followed by that many payloads)

A commit appends one record (and, under `ack_flush: sync`, fsyncs before returning). Load reads
the snapshot, then replays the log up to the first short or failing record (a torn tail, cut
off). When the log passes `offsets_log_records_max` records it is compacted: the snapshot is
rewritten atomically, then the log truncated; a crash in between replays records the snapshot
already holds, which sets the same values again.
"""

from __future__ import annotations

import logging
import os
import struct
import threading

import crc32c

from mqstore.errors import CorruptFile
from mqstore.formats.framing import frame, unframe
from mqstore.storage.disk import AppendFile, Disk, write_atomic

log = logging.getLogger(__name__)

SNAP_MAGIC = b"CQGO"
_REC_HEAD = struct.Struct(">IH")
_U16 = struct.Struct(">H")
_TAIL = struct.Struct(">iq")
_U32 = struct.Struct(">I")
GroupKey = tuple[str, str, int]


def encode_payload(key: GroupKey, offset: int) -> bytes:
    group, topic, qid = key
    g, t = group.encode(), topic.encode()
    return _U16.pack(len(g)) + g + _U16.pack(len(t)) + t + _TAIL.pack(qid, offset)


def decode_payload(data: bytes, pos: int) -> tuple[GroupKey, int, int]:
    (n,) = _U16.unpack_from(data, pos)
    group = data[pos + 2 : pos + 2 + n].decode()
    pos += 2 + n
    (n,) = _U16.unpack_from(data, pos)
    topic = data[pos + 2 : pos + 2 + n].decode()
    pos += 2 + n
    qid, offset = _TAIL.unpack_from(data, pos)
    return (group, topic, qid), offset, pos + _TAIL.size


def encode_record(key: GroupKey, offset: int) -> bytes:
    payload = encode_payload(key, offset)
    head_len = _U16.pack(len(payload))
    return struct.pack(">I", crc32c.crc32c(head_len + payload)) + head_len + payload


def decode_records(data: bytes) -> tuple[list[tuple[GroupKey, int]], int]:
    """Records of the valid prefix and its length."""
    out = []
    pos = 0
    while pos + _REC_HEAD.size <= len(data):
        crc, n = _REC_HEAD.unpack_from(data, pos)
        end = pos + _REC_HEAD.size + n
        if end > len(data) or crc32c.crc32c(data[pos + 4 : end]) != crc:
            break
        try:
            key, offset, used = decode_payload(data, pos + _REC_HEAD.size)
        except (struct.error, UnicodeDecodeError):
            break
        if used != end:
            break
        out.append((key, offset))
        pos = end
    return out, pos


def encode_snapshot(offsets: dict[GroupKey, int]) -> bytes:
    body = _U32.pack(len(offsets)) + b"".join(encode_payload(k, v) for k, v in offsets.items())
    return frame(SNAP_MAGIC, 1, body)


def decode_snapshot(data: bytes, *, path: str) -> dict[GroupKey, int]:
    _, payload = unframe(SNAP_MAGIC, data, path=path)
    out: dict[GroupKey, int] = {}
    try:  # the CRC held, yet the payload must parse too: a writer's bug is still corruption
        (count,) = _U32.unpack_from(payload, 0)
        pos = _U32.size
        for _ in range(count):
            key, offset, pos = decode_payload(payload, pos)
            out[key] = offset
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise CorruptFile(path, f"the snapshot does not parse: {exc}") from None
    if pos != len(payload):
        raise CorruptFile(path, "trailing bytes after the last offset")
    return out


class GroupOffsets:
    def __init__(self, disk: Disk, root: str, *, sync: bool, records_max: int) -> None:
        self._disk = disk
        self._root = root
        self._sync = sync
        self._records_max = records_max
        self._log_path = os.path.join(root, "offsets.log")
        self._snap_path = os.path.join(root, "offsets.snap")
        self._offsets: dict[GroupKey, int] = {}
        self._log: AppendFile | None = None
        self._records = 0
        self._lock = threading.Lock()

    def open(self) -> None:
        self._disk.makedirs(self._root)
        if self._disk.exists(self._snap_path):
            self._offsets = decode_snapshot(self._disk.read(self._snap_path), path=self._snap_path)
        if self._disk.exists(self._log_path):
            data = self._disk.read(self._log_path)
            records, good = decode_records(data)
            if good < len(data):
                log.warning("offsets log: torn tail of %d bytes dropped", len(data) - good)
                self._disk.truncate(self._log_path, good)
            for key, offset in records:
                self._offsets[key] = offset
            self._records = len(records)
        self._log = self._disk.open_append(self._log_path)
        self._disk.fsync_dir(self._root)

    def close(self) -> None:
        with self._lock:
            if self._log is not None:
                self._log.sync()
                self._log.close()
                self._log = None

    def get(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group never committed in that queue."""
        return self._offsets.get((group, topic, queue_id), -1)

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.commit_many([((group, topic, queue_id), offset)])

    def commit_many(self, items: list[tuple[GroupKey, int]]) -> None:
        with self._lock:
            assert self._log is not None
            self._log.append(b"".join(encode_record(k, v) for k, v in items))
            if self._sync:
                self._log.sync()
            for k, v in items:
                self._offsets[k] = v
            self._records += len(items)
            if self._records > self._records_max:
                self._compact()

    def sync(self) -> None:
        with self._lock:
            if self._log is not None:
                self._log.sync()

    def _compact(self) -> None:
        assert self._log is not None
        self._log.sync()
        write_atomic(self._disk, self._snap_path, encode_snapshot(self._offsets))
        self._log.close()
        self._disk.truncate(self._log_path, 0)
        self._log = self._disk.open_append(self._log_path)
        self._records = 0

    def items(self) -> dict[GroupKey, int]:
        with self._lock:
            return dict(self._offsets)
