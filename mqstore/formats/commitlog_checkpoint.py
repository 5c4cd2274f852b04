"""commitlog_svc's checkpoint and store meta: mqstore's own files, CRC32C-framed (framing.py).

checkpoint (frame magic b"MQCK", version 1), payload:

    0    16   store_id              the commit log this checkpoint belongs to
    16   8    flushed_offset        every byte below is durable and it is a record boundary;
                                    the queue-offset table below is exact as of this offset
    24   8    min_offset            oldest byte on disk when written (informational)
    32   8    written_at_ms         wall clock when written (informational, never decided on)
    40   4    queue_count
    44   ..   queue_count times:    u16 topic length | topic (UTF-8) | i32 queue id | i64 next
                                    queue offset

store.meta (frame magic b"MQSM", version 1), written once when the store is created:

    0    16   store_id
    16   8    created_at_ms
    24   8    file_bytes            commit-log segment size the store was created with

Recovery reads flushed_offset to choose where to start checking (never a timestamp), and
rebuilds the queue-offset table by applying the records at and after flushed_offset.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from mqstore.errors import CorruptFile
from mqstore.formats.framing import frame, unframe

CHECKPOINT_MAGIC = b"MQCK"
CHECKPOINT_VERSION = 1
META_MAGIC = b"MQSM"
META_VERSION = 1

_CKPT_HEAD = struct.Struct(">16sqqqI")
_QUEUE_ENTRY_TAIL = struct.Struct(">iq")
_U16 = struct.Struct(">H")
_META = struct.Struct(">16sqq")
STORE_ID_BYTES = 16

QueueKey = tuple[str, int]


@dataclass(slots=True)
class Checkpoint:
    store_id: bytes
    flushed_offset: int
    min_offset: int = 0
    written_at_ms: int = 0
    queue_offsets: dict[QueueKey, int] = field(default_factory=dict)


def _check_store_id(store_id: bytes) -> None:
    if len(store_id) != STORE_ID_BYTES:
        raise ValueError(f"a store id is {STORE_ID_BYTES} bytes, got {len(store_id)}")


def encode_checkpoint(ckpt: Checkpoint) -> bytes:
    _check_store_id(ckpt.store_id)
    parts = [
        _CKPT_HEAD.pack(
            ckpt.store_id,
            ckpt.flushed_offset,
            ckpt.min_offset,
            ckpt.written_at_ms,
            len(ckpt.queue_offsets),
        )
    ]
    for (topic, queue_id), next_offset in ckpt.queue_offsets.items():
        raw = topic.encode("utf-8")
        parts.append(_U16.pack(len(raw)))
        parts.append(raw)
        parts.append(_QUEUE_ENTRY_TAIL.pack(queue_id, next_offset))
    return frame(CHECKPOINT_MAGIC, CHECKPOINT_VERSION, b"".join(parts))


def decode_checkpoint(data: bytes, *, path: str = "checkpoint") -> Checkpoint:
    version, payload = unframe(CHECKPOINT_MAGIC, data, path=path)
    if version != CHECKPOINT_VERSION:
        raise CorruptFile(path, f"unknown checkpoint version {version}")
    if len(payload) < _CKPT_HEAD.size:
        raise CorruptFile(path, "checkpoint payload too short")
    store_id, flushed, min_offset, written_at, count = _CKPT_HEAD.unpack_from(payload, 0)
    pos = _CKPT_HEAD.size
    table: dict[QueueKey, int] = {}
    try:
        for _ in range(count):
            (tlen,) = _U16.unpack_from(payload, pos)
            pos += 2
            topic = payload[pos : pos + tlen].decode("utf-8")
            pos += tlen
            queue_id, next_offset = _QUEUE_ENTRY_TAIL.unpack_from(payload, pos)
            pos += _QUEUE_ENTRY_TAIL.size
            table[(topic, queue_id)] = next_offset
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptFile(path, f"queue table does not parse: {exc}") from exc
    if pos != len(payload):
        raise CorruptFile(path, f"{len(payload) - pos} stray bytes after the queue table")
    return Checkpoint(store_id, flushed, min_offset, written_at, table)


@dataclass(frozen=True, slots=True)
class StoreMeta:
    store_id: bytes
    created_at_ms: int
    file_bytes: int


def encode_meta(meta: StoreMeta) -> bytes:
    _check_store_id(meta.store_id)
    return frame(
        META_MAGIC, META_VERSION, _META.pack(meta.store_id, meta.created_at_ms, meta.file_bytes)
    )


def decode_meta(data: bytes, *, path: str = "store.meta") -> StoreMeta:
    version, payload = unframe(META_MAGIC, data, path=path)
    if version != META_VERSION or len(payload) != _META.size:
        raise CorruptFile(path, f"unknown store meta version {version} or size {len(payload)}")
    return StoreMeta(*_META.unpack(payload))
