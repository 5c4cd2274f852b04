"""Ack segments and the ack meta file: the folded form of an ack journal.

    groups/acks/{group}/{topic}/{queueId}/seg_{segment number, 12 digits}
    groups/acks/{group}/{topic}/{queueId}/meta

Segment n holds the state of queue offsets [n*S, (n+1)*S), S = 16,384 (RabbitMQ's segment
size), as one CRC32C frame (mqstore.formats.framing, magic b"CQAS", version 1):

    0    8    segment number
    8    4    slot count k
    12   k x  | u16 slot | u8 state | u16 delivery count | int64 deadline ms |   (13 bytes)
              state 1 = delivered (invisible until the deadline), 2 = acked

A segment is rewritten whole (write_atomic) when the journal is folded, and deleted once every
offset in it is below the committed offset (all acked). 16,384 slots are at most 213 KB.

meta (frame magic b"CQAM", version 1): int64 committed offset (the lowest offset not acked) at
the last fold. Load order: meta, then the segments at or above it, then the journal on top.
"""

from __future__ import annotations

import struct

from mqstore.errors import CorruptFile
from mqstore.formats.framing import frame, unframe

SEGMENT_MAGIC = b"CQAS"
META_MAGIC = b"CQAM"
VERSION = 1
_HEAD = struct.Struct(">qI")
SLOT = struct.Struct(">HBHq")
assert SLOT.size == 13
_META = struct.Struct(">q")

DELIVERED = 1
ACKED = 2

# (state, delivery count, deadline ms) by queue offset
Slots = dict[int, tuple[int, int, int]]


def segment_name(segment: int) -> str:
    return f"seg_{segment:012d}"


def segment_number(name: str) -> int | None:
    if not name.startswith("seg_") or not name[4:].isdigit():
        return None
    return int(name[4:])


def encode_segment(segment: int, segment_entries: int, slots: Slots) -> bytes:
    base = segment * segment_entries
    rows = [
        SLOT.pack(off - base, state, count, deadline)
        for off, (state, count, deadline) in sorted(slots.items())
        if base <= off < base + segment_entries
    ]
    return frame(SEGMENT_MAGIC, VERSION, _HEAD.pack(segment, len(rows)) + b"".join(rows))


def decode_segment(data: bytes, segment_entries: int, *, path: str = "<buffer>") -> Slots:
    version, payload = unframe(SEGMENT_MAGIC, data, path=path)
    if version != VERSION or len(payload) < _HEAD.size:
        raise CorruptFile(path, f"segment version {version}, {len(payload)} bytes")
    segment, count = _HEAD.unpack_from(payload, 0)
    if len(payload) != _HEAD.size + count * SLOT.size:
        raise CorruptFile(path, f"segment says {count} slots in {len(payload)} bytes")
    base = segment * segment_entries
    out: Slots = {}
    for i in range(count):
        slot, state, dcount, deadline = SLOT.unpack_from(payload, _HEAD.size + i * SLOT.size)
        if slot >= segment_entries or state not in (DELIVERED, ACKED):
            raise CorruptFile(path, f"slot {slot} state {state}")
        out[base + slot] = (state, dcount, deadline)
    return out


def encode_meta(committed_offset: int) -> bytes:
    return frame(META_MAGIC, VERSION, _META.pack(committed_offset))


def decode_meta(data: bytes, *, path: str = "<buffer>") -> int:
    version, payload = unframe(META_MAGIC, data, path=path)
    if version != VERSION or len(payload) != _META.size:
        raise CorruptFile(path, f"meta version {version}, {len(payload)} bytes")
    return int(_META.unpack(payload)[0])
