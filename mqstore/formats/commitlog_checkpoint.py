"""commitlog_svc's checkpoint, store meta and subscriber registry: mqstore's own files,
CRC32C-framed (framing.py).

checkpoint (frame magic b"MQCK", version 1, or 2 when it holds a producer table), payload:

    0    16   store_id              the commit log this checkpoint belongs to
    16   8    flushed_offset        every byte below is durable and it is a record boundary;
                                    the queue-offset table below is exact as of this offset
    24   8    min_offset            oldest byte on disk when written (informational)
    32   8    written_at_ms         wall clock when written (informational, never decided on)
    40   4    queue_count
    44   ..   queue_count times:    u16 topic length | topic (UTF-8) | i32 queue id | i64 next
                                    queue offset
    version 2 only, after the queue table: the producer table (idempotent appends)
    ..   4    producer_count
    ..   ..   producer_count times:  u16 id length | producer id (UTF-8) | u64 last sequence |
                                     u16 request_count | request_count times:
                                       u64 sequence | u32 messages in the request |
                                       i64 first stored record | i64 end of the last one |
                                       u32 refused_count | refused_count times:
                                         u32 message index | u8 put status (engine value)

    A version-1 reader cannot skip the table, so a checkpoint without producers is still
    written as version 1: nothing changes for stores that never see a producer id.

store.meta (frame magic b"MQSM", version 1), written once when the store is created:

    0    16   store_id
    16   8    created_at_ms
    24   8    file_bytes            commit-log segment size the store was created with

subscribers (frame magic b"MQSU", version 1), replaced atomically on every change:

    0    16   store_id              the commit log these offsets belong to
    16   4    subscriber_count
    20   ..   subscriber_count times: u16 id length | subscriber id (UTF-8) |
                                      i64 confirmed offset | i64 updated_at_ms

Recovery reads flushed_offset to choose where to start checking (never a timestamp), and
rebuilds the queue-offset table (and the producer table) by applying the records at and after
flushed_offset to the snapshots.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from mqstore.errors import CorruptFile
from mqstore.formats.framing import frame, unframe

CHECKPOINT_MAGIC = b"MQCK"
CHECKPOINT_VERSION = 1
CHECKPOINT_VERSION_PRODUCERS = 2
META_MAGIC = b"MQSM"
META_VERSION = 1
SUBSCRIBERS_MAGIC = b"MQSU"
SUBSCRIBERS_VERSION = 1

_CKPT_HEAD = struct.Struct(">16sqqqI")
_QUEUE_ENTRY_TAIL = struct.Struct(">iq")
_U16 = struct.Struct(">H")
_META = struct.Struct(">16sqq")
_U32 = struct.Struct(">I")
_PRODUCER_HEAD_TAIL = struct.Struct(">QH")  # last sequence, request count
_REQUEST = struct.Struct(">QIqqI")  # sequence, count, first offset, end offset, refused count
_REFUSED = struct.Struct(">IB")
_SUBSCRIBER_TAIL = struct.Struct(">qq")
STORE_ID_BYTES = 16

QueueKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ProducerRequest:
    """One stored request of an idempotent producer: enough to answer its retry (the records
    from first_offset to end_offset hold the stored messages, in order)."""

    sequence: int
    count: int  # messages in the request, stored or refused
    first_offset: int
    end_offset: int
    refused: tuple[tuple[int, int], ...] = ()  # (message index, put status value)


@dataclass(slots=True)
class ProducerEntry:
    producer_id: str
    last_sequence: int
    requests: list[ProducerRequest] = field(default_factory=list)


@dataclass(slots=True)
class Checkpoint:
    store_id: bytes
    flushed_offset: int
    min_offset: int = 0
    written_at_ms: int = 0
    queue_offsets: dict[QueueKey, int] = field(default_factory=dict)
    producers: list[ProducerEntry] = field(default_factory=list)


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
    if not ckpt.producers:
        return frame(CHECKPOINT_MAGIC, CHECKPOINT_VERSION, b"".join(parts))
    parts.append(_U32.pack(len(ckpt.producers)))
    for entry in ckpt.producers:
        raw = entry.producer_id.encode("utf-8")
        parts.append(_U16.pack(len(raw)))
        parts.append(raw)
        parts.append(_PRODUCER_HEAD_TAIL.pack(entry.last_sequence, len(entry.requests)))
        for req in entry.requests:
            parts.append(
                _REQUEST.pack(
                    req.sequence, req.count, req.first_offset, req.end_offset, len(req.refused)
                )
            )
            parts.extend(_REFUSED.pack(index, status) for index, status in req.refused)
    return frame(CHECKPOINT_MAGIC, CHECKPOINT_VERSION_PRODUCERS, b"".join(parts))


def decode_checkpoint(data: bytes, *, path: str = "checkpoint") -> Checkpoint:
    version, payload = unframe(CHECKPOINT_MAGIC, data, path=path)
    if version not in (CHECKPOINT_VERSION, CHECKPOINT_VERSION_PRODUCERS):
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
    producers: list[ProducerEntry] = []
    if version == CHECKPOINT_VERSION_PRODUCERS:
        try:
            pos = _decode_producers(payload, pos, producers)
        except (struct.error, UnicodeDecodeError) as exc:
            # "version" in the text: a version-1 payload in a version-2 frame ends up here.
            raise CorruptFile(path, f"version 2 producer table does not parse: {exc}") from exc
    if pos != len(payload):
        raise CorruptFile(path, f"{len(payload) - pos} stray bytes after the tables")
    return Checkpoint(store_id, flushed, min_offset, written_at, table, producers)


def _decode_producers(payload: bytes, pos: int, out: list[ProducerEntry]) -> int:
    (count,) = _U32.unpack_from(payload, pos)
    pos += _U32.size
    for _ in range(count):
        (id_len,) = _U16.unpack_from(payload, pos)
        pos += _U16.size
        raw = payload[pos : pos + id_len]
        if len(raw) != id_len:
            raise struct.error("producer id runs past the payload")
        producer_id = raw.decode("utf-8")
        pos += id_len
        last_sequence, request_count = _PRODUCER_HEAD_TAIL.unpack_from(payload, pos)
        pos += _PRODUCER_HEAD_TAIL.size
        requests = []
        for _ in range(request_count):
            sequence, n, first, end, refused_count = _REQUEST.unpack_from(payload, pos)
            pos += _REQUEST.size
            refused = []
            for _ in range(refused_count):
                refused.append(_REFUSED.unpack_from(payload, pos))
                pos += _REFUSED.size
            requests.append(ProducerRequest(sequence, n, first, end, tuple(refused)))
        out.append(ProducerEntry(producer_id, last_sequence, requests))
    return pos


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


# -- subscribers --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SubscriberOffset:
    subscriber_id: str
    confirmed_offset: int
    updated_at_ms: int = 0


def encode_subscribers(store_id: bytes, subscribers: list[SubscriberOffset]) -> bytes:
    _check_store_id(store_id)
    parts = [store_id, _U32.pack(len(subscribers))]
    for sub in subscribers:
        raw = sub.subscriber_id.encode("utf-8")
        parts.append(_U16.pack(len(raw)))
        parts.append(raw)
        parts.append(_SUBSCRIBER_TAIL.pack(sub.confirmed_offset, sub.updated_at_ms))
    return frame(SUBSCRIBERS_MAGIC, SUBSCRIBERS_VERSION, b"".join(parts))


def decode_subscribers(
    data: bytes, *, path: str = "subscribers"
) -> tuple[bytes, list[SubscriberOffset]]:
    version, payload = unframe(SUBSCRIBERS_MAGIC, data, path=path)
    if version != SUBSCRIBERS_VERSION:
        raise CorruptFile(path, f"unknown subscribers version {version}")
    out = []
    try:
        store_id = payload[:STORE_ID_BYTES]
        if len(store_id) != STORE_ID_BYTES:
            raise struct.error("shorter than a store id")
        (count,) = _U32.unpack_from(payload, STORE_ID_BYTES)
        pos = STORE_ID_BYTES + _U32.size
        for _ in range(count):
            (id_len,) = _U16.unpack_from(payload, pos)
            pos += _U16.size
            raw = payload[pos : pos + id_len]
            if len(raw) != id_len:
                raise struct.error("subscriber id runs past the payload")
            pos += id_len
            confirmed, updated_at = _SUBSCRIBER_TAIL.unpack_from(payload, pos)
            pos += _SUBSCRIBER_TAIL.size
            out.append(SubscriberOffset(raw.decode("utf-8"), confirmed, updated_at))
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptFile(path, f"subscriber table does not parse: {exc}") from exc
    if pos != len(payload):
        raise CorruptFile(path, f"{len(payload) - pos} stray bytes after the subscriber table")
    return store_id, out
