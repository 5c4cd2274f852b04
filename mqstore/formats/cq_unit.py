"""Consume-queue unit file: where each message of one queue lives in the commit log.

    consumequeue/{topic}/{queueId}/00000000000000000000      units [0, N)
    consumequeue/{topic}/{queueId}/00000000000006000000      units [N, 2N)   N = 300,000

    0        8        12                20
    +--------+--------+-----------------+
    | phy    | size   | tags_code       |   big-endian, 20 bytes per unit
    +--------+--------+-----------------+

Byte-identical to RocketMQ's ConsumeQueue (§3.1): queue offset n lives at byte n*20 of the
queue's logical stream, files are named by their logical byte offset. A unit is valid when
phy >= 0 and size > 0; an all-zero unit marks the end. A blank unit (0, 2**31-1, 0) fills the
region before a queue's first offset when its first file starts mid-file (fillPreBlank).

Written by cq_svc when it applies a dispatch batch; read by pulls, recovery and truncation.
Derived data: after a crash it is cut back to the last trustworthy unit and rebuilt from the log.
These are pure functions over bytes; queue_files.py does the I/O.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

# A mapped file (mmap) or the simulated disk's bytearray; anything struct can unpack from.
Buffer = Any

UNIT = struct.Struct(">qiq")
UNIT_BYTES = UNIT.size
assert UNIT_BYTES == 20

BLANK_SIZE = 2**31 - 1  # Integer.MAX_VALUE, RocketMQ's fillPreBlank size
BLANK_UNIT = UNIT.pack(0, BLANK_SIZE, 0)

# The same unit as a numpy record, for packing a run of units at once.
UNIT_DTYPE = np.dtype([("phy", ">i8"), ("size", ">i4"), ("tags", ">i8")])
assert UNIT_DTYPE.itemsize == UNIT_BYTES


# Not frozen: a frozen dataclass sets each field through object.__setattr__, and a pull makes
# one Unit per unit it reads. Treat it as a value: nothing assigns to its fields; unsafe_hash
# keeps it hashable as before.
@dataclass(slots=True, unsafe_hash=True)
class Unit:
    """One decoded unit at `queue_offset`. `store_timestamp_ms` is the indexed time (the
    running maximum, see time_file.py) as stored: a bulk read does not verify the file
    store's per-entry check (time lookups do), so a damaged entry reads as what is on disk."""

    queue_offset: int
    commit_log_offset: int
    size: int
    tags_code: int
    store_timestamp_ms: int = -1

    @property
    def is_blank(self) -> bool:
        return self.size == BLANK_SIZE and self.commit_log_offset == 0

    @property
    def end_offset(self) -> int:
        return self.commit_log_offset + self.size


def is_valid(phy: int, size: int) -> bool:
    return phy >= 0 and size > 0


def count_valid(
    buf: Buffer, start: int, end: int, *, below_phy: int | None = None
) -> tuple[int, int]:
    """Walk units in [start, end) while they are valid, their phy offsets never go back, and
    (if given) their phy is below `below_phy`. Returns (bytes walked, end offset of the last
    unit walked or -1). Blank units are walked (they are valid) but not counted for phy."""
    pos = start
    last_phy = -1
    last_end = -1
    unpack = UNIT.unpack_from
    while pos + UNIT_BYTES <= end:
        phy, size, _ = unpack(buf, pos)
        if not is_valid(phy, size):
            break
        blank = size == BLANK_SIZE and phy == 0
        if not blank:
            if phy < last_phy:
                break  # units of one queue are in commit-log order: this one is garbage
            if below_phy is not None and phy >= below_phy:
                break
            last_phy = phy
            last_end = phy + size
        pos += UNIT_BYTES
    return pos - start, last_end
