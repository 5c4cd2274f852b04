"""Ack journal: the append-only log of delivery state changes of one (group, topic, queue).

    groups/acks/{group}/{topic}/{queueId}/journal

One fixed-size entry per change (RabbitMQ's queue-index journal, with a CRC of ours):

    0        4      5      6          8              16             24
    +--------+------+------+----------+--------------+--------------+
    | crc32c | kind | 0    | delivery | queue offset | deadline ms  |   big-endian
    +--------+------+------+----------+--------------+--------------+
      CRC32C of bytes 4..24           u16 count      int64          int64

    kind  DELIVER  the offset was handed out (delivery count, invisible until deadline)
          ACK      the offset is acknowledged (terminal)
          CHANGE   a new deadline for the delivery with that count
          SKIP     everything below `queue offset` is settled (expired from the queue, or the
                   group was reset there); the committed offset jumps to it

An entry that fails its CRC with good entries after it is skipped (media corruption: that one
change is lost, which at worst redelivers one message); failing bytes after the last good
entry are the torn tail of a crash, and the file is cut back to the last good entry before
appending. Entries are absolute states and replay applies them monotonically (acks win, counts
never go back), so replaying a journal over segments already folded from it changes nothing.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

import crc32c

ENTRY = struct.Struct(">IBBHqq")
ENTRY_BYTES = ENTRY.size
assert ENTRY_BYTES == 24
_BODY = struct.Struct(">BBHqq")


class Kind(enum.IntEnum):
    DELIVER = 1
    ACK = 2
    CHANGE = 3
    SKIP = 4


@dataclass(frozen=True, slots=True)
class JournalEntry:
    kind: Kind
    queue_offset: int
    delivery_count: int = 0
    deadline_ms: int = 0


def encode_entry(e: JournalEntry) -> bytes:
    body = _BODY.pack(int(e.kind), 0, e.delivery_count, e.queue_offset, e.deadline_ms)
    return struct.pack(">I", crc32c.crc32c(body)) + body


def encode_entries(entries: list[JournalEntry]) -> bytes:
    return b"".join(encode_entry(e) for e in entries)


def decode_entries(data: bytes) -> tuple[list[JournalEntry], int, int]:
    """(entries, length of the part to keep, bad entries skipped). Entries are fixed-size, so
    a bad entry with good ones after it (media corruption) is skipped and the rest still
    apply; bad bytes after the last good entry are the torn tail, and the length kept ends
    before them."""
    out: list[JournalEntry] = []
    pos = 0
    keep = 0
    bad = 0
    n = len(data)
    while pos + ENTRY_BYTES <= n:
        crc, kind, _, count, offset, deadline = ENTRY.unpack_from(data, pos)
        pos += ENTRY_BYTES
        if crc32c.crc32c(data[pos - ENTRY_BYTES + 4 : pos]) != crc or kind not in _KINDS:
            bad += 1
            continue
        out.append(JournalEntry(Kind(kind), offset, count, deadline))
        keep = pos
    bad -= (pos - keep) // ENTRY_BYTES  # the torn tail is not counted as skipped
    return out, keep, bad


_KINDS = frozenset(int(k) for k in Kind)
