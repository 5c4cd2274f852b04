"""Index file: RocketMQ's hash index of message keys, byte for byte (rocketmq-store.md §4).

    0          40                     40 + 4*S                               40 + 4*S + 20*N
    +----------+----------------------+--------------------------------------+
    | header   | S hash slots, 4 B    | N entries, 20 B (entry 0 never used) |
    +----------+----------------------+--------------------------------------+

    header, 40 bytes, big-endian:
    0        8        16       24       32      36     40
    +--------+--------+--------+--------+-------+------+
    | begin  | end    | begin  | end    | slots | index|
    | ts ms  | ts ms  | phy    | phy    | used  | count|
    +--------+--------+--------+--------+-------+------+
      i64      i64      i64      i64      i32     i32   (index count starts at 1: next entry no.)

    slot s (i32): number of the newest entry whose key hash % S == s; 0 = empty

    entry n, 20 bytes at 40 + 4*S + 20*n:
    0        4                12       16       20
    +--------+----------------+--------+--------+
    | key    | commit-log     | time   | prev   |
    | hash   | offset         | diff s | entry  |
    +--------+----------------+--------+--------+
      i32      i64              i32      i32     (prev 0 = end of chain)

key hash = abs(Java String.hashCode of "topic#key"), Integer.MIN_VALUE -> 0; time diff =
(store time - header begin) // 1000, clamped to [0, 2**31-1]. A file holds N - 1 entries
(numbers 1 .. N-1); it is full when the index count reaches N. Files are named by creation
time, yyyyMMddHHmmssSSS (UTC here; RocketMQ uses the broker's local zone).

Two deliberate differences from RocketMQ's writer, both invisible to its reader:
- the first entry of a file gets time diff 0 (RocketMQ measures it against the previous file's
  end time before overwriting the begin time, which shifts that entry later by the gap);
- the header's end time is the largest store time seen, so a clock that steps back cannot make
  a query skip a file holding later entries.

This module is pure: it encodes and decodes over bytes, bytearrays, mmaps and memoryviews.
index_svc writes files through it (index_svc/index_file.py does the I/O), and so does the Spark
rebuild job; `put_keys` is the one batch writer both use. It runs in the compiled core
(_core.index_put_keys, one C pass per key instead of ~25 numpy calls a batch);
`put_keys_reference`, the same batch in numpy, is its specification, and the tests pin the two
together byte for byte.
"""

from __future__ import annotations

import datetime
import mmap
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from mqstore.formats import _core

HEADER = struct.Struct(">qqqqii")
HEADER_BYTES = HEADER.size
assert HEADER_BYTES == 40
SLOT = struct.Struct(">i")
SLOT_BYTES = SLOT.size
ENTRY = struct.Struct(">iqii")
ENTRY_BYTES = ENTRY.size
assert ENTRY_BYTES == 20

# The same entry as a numpy record, for batch writes and for rebuilding slots.
ENTRY_DTYPE = np.dtype([("hash", ">i4"), ("phy", ">i8"), ("tdiff", ">i4"), ("prev", ">i4")])
assert ENTRY_DTYPE.itemsize == ENTRY_BYTES
SLOT_DTYPE = np.dtype(">i4")

Buffer = bytes | bytearray | memoryview | mmap.mmap

# RocketMQ's defaults (MessageStoreConfig.maxHashSlotNum / maxIndexNum).
DEFAULT_SLOT_NUM = 5_000_000
DEFAULT_ENTRY_NUM = 20_000_000
INT32_MAX = (1 << 31) - 1
# Positions are Java ints in RocketMQ: a file must stay below 2 GiB.
FILE_BYTES_MAX = INT32_MAX

NAME_PATTERN = re.compile(r"^\d{17}$")
_NAME_FORMAT = "%Y%m%d%H%M%S"


@dataclass(slots=True)
class IndexHeader:
    begin_ts_ms: int = 0
    end_ts_ms: int = 0
    begin_phy: int = 0
    end_phy: int = 0
    slots_used: int = 0
    index_count: int = 1  # the number the next entry gets

    @property
    def entries(self) -> int:
        return self.index_count - 1


def file_bytes(slot_num: int, entry_num: int) -> int:
    return HEADER_BYTES + slot_num * SLOT_BYTES + entry_num * ENTRY_BYTES


def slot_pos(slot: int) -> int:
    return HEADER_BYTES + slot * SLOT_BYTES


def entries_pos(slot_num: int) -> int:
    """Where entry 0 would start (it is never written)."""
    return HEADER_BYTES + slot_num * SLOT_BYTES


def entry_pos(slot_num: int, number: int) -> int:
    return HEADER_BYTES + slot_num * SLOT_BYTES + number * ENTRY_BYTES


def encode_header(h: IndexHeader) -> bytes:
    return HEADER.pack(
        h.begin_ts_ms, h.end_ts_ms, h.begin_phy, h.end_phy, h.slots_used, h.index_count
    )


def decode_header(buf: Buffer) -> IndexHeader:
    """The header as stored. RocketMQ's load treats an index count <= 0 as 1; so does this."""
    begin_ts, end_ts, begin_phy, end_phy, used, count = HEADER.unpack_from(buf, 0)
    return IndexHeader(begin_ts, end_ts, begin_phy, end_phy, used, max(1, count))


def encode_entry(key_hash: int, phy: int, time_diff_s: int, prev: int) -> bytes:
    return ENTRY.pack(key_hash, phy, time_diff_s, prev)


def time_diff_s(store_ts_ms: int, begin_ts_ms: int) -> int:
    """RocketMQ's timeDiff in seconds; 0 when the file has no begin time yet."""
    if begin_ts_ms <= 0:
        return 0
    diff = store_ts_ms - begin_ts_ms
    if diff <= 0:
        return 0
    return min(diff // 1000, INT32_MAX)


def name_of(created_ms: int) -> str:
    """yyyyMMddHHmmssSSS of a UTC time in ms."""
    dt = datetime.datetime.fromtimestamp(created_ms // 1000, tz=datetime.UTC)
    return dt.strftime(_NAME_FORMAT) + f"{created_ms % 1000:03d}"


def is_time_matched(h: IndexHeader, begin_ms: int, end_ms: int) -> bool:
    """RocketMQ's isTimeMatched: [begin, end] overlaps [header begin, header end]."""
    return (
        (begin_ms < h.begin_ts_ms and end_ms > h.end_ts_ms)
        or h.begin_ts_ms <= begin_ms <= h.end_ts_ms
        or h.begin_ts_ms <= end_ms <= h.end_ts_ms
    )


def chain_matches(
    buf: Buffer,
    slot_num: int,
    header: IndexHeader,
    key_hash: int,
    begin_ms: int,
    end_ms: int,
) -> Iterator[tuple[int, int]]:
    """(entry number, commit-log offset) of each entry on `key_hash`'s chain whose stored hash
    equals it and whose time (header begin + diff seconds) lies in [begin_ms, end_ms], newest
    first. A generator: the caller stops it when it has enough, so nothing is allocated for a
    maximum it never reaches.

    The stop conditions are RocketMQ's selectPhyOffset: index count <= 1, slot value <= 0 or
    beyond the count, a time diff < 0, prev <= 0, prev beyond the count, prev == current, or an
    entry older than `begin_ms` (the chain runs newest to oldest). One addition: prev must be
    below the current number, which every writer guarantees and which bounds a walk over a
    damaged file to the entries it has.
    """
    count = header.index_count
    if count <= 1:
        return
    (number,) = SLOT.unpack_from(buf, slot_pos(key_hash % slot_num))
    if number <= 0 or number > count:
        return
    base = entries_pos(slot_num)
    begin_ts = header.begin_ts_ms
    unpack = ENTRY.unpack_from
    while True:
        stored_hash, phy, diff, prev = unpack(buf, base + number * ENTRY_BYTES)
        if diff < 0:
            return
        time_read = begin_ts + diff * 1000
        if stored_hash == key_hash and begin_ms <= time_read <= end_ms:
            yield number, phy
        if prev <= 0 or prev > count or prev >= number or time_read < begin_ms:
            return
        number = prev


def rebuild_slots(entries: np.ndarray, slot_num: int, count: int) -> tuple[np.ndarray, int]:
    """Slots as the writer leaves them after entries 1 .. count-1: each slot holds the highest
    entry number that hashes to it. Returns (slots as int32, number of non-empty slots)."""
    slots = np.zeros(slot_num, dtype=np.int64)
    if count > 1:
        hashes = entries["hash"][1:count].astype(np.int64)
        numbers = np.arange(1, count, dtype=np.int64)
        np.maximum.at(slots, hashes % slot_num, numbers)
    return slots.astype(np.int32), int(np.count_nonzero(slots))


def put_keys(
    buf: bytearray | memoryview | mmap.mmap,
    slot_num: int,
    header: IndexHeader,
    key_hashes: np.ndarray,
    phys: np.ndarray,
    store_ts_ms: np.ndarray,
) -> None:
    """Append keys (int64 index hashes, commit-log offsets, store times; at least one) as
    entries c, c+1, ... of the file in `buf`, c being `header.index_count`: slots and entries
    written in place, `header` updated (the caller writes it back with `encode_header`). They
    must fit. The bytes are put_keys_reference's: RocketMQ's putKey once per key, in order."""
    h = header
    c = h.index_count
    if c == 1:
        # This fixes RocketMQ's first-entry offset: begin is set before the time diff.
        h.begin_ts_ms = int(store_ts_ms[0])
        h.begin_phy = int(phys[0])
    newly_used, latest_ts_ms = _core.index_put_keys(
        buf,
        slot_num,
        c,
        h.begin_ts_ms,
        np.ascontiguousarray(key_hashes, dtype=np.int64),
        np.ascontiguousarray(phys, dtype=np.int64),
        np.ascontiguousarray(store_ts_ms, dtype=np.int64),
    )
    h.end_ts_ms = latest_ts_ms if c == 1 else max(h.end_ts_ms, latest_ts_ms)
    h.end_phy = int(phys[-1])
    h.slots_used += newly_used
    h.index_count = c + len(key_hashes)


def put_keys_reference(
    buf: bytearray | memoryview | mmap.mmap,
    slot_num: int,
    header: IndexHeader,
    key_hashes: np.ndarray,
    phys: np.ndarray,
    store_ts_ms: np.ndarray,
) -> None:
    """Append keys (int64 index hashes, commit-log offsets, store times) as entries c, c+1, ...
    of the file in `buf`, c being `header.index_count`: slots and entries written in place,
    `header` updated (the caller writes it back with `encode_header`). They must fit.

    Batch put: an entry's `prev` is the newest earlier key of the batch in the same slot, or,
    for the first of its slot, what the slot held. A stable sort by slot gives both: within a
    run of equal slots the predecessor is the previous element, and the run's last element is
    the slot's new value. The bytes are exactly those of RocketMQ's putKey called once per key
    in the same order. The specification of put_keys (the compiled core), which tests pin to
    it byte for byte."""
    m = len(key_hashes)
    c = header.index_count
    numbers = np.arange(c, c + m, dtype=np.int64)
    slot_of = key_hashes % slot_num
    slots = np.frombuffer(buf, dtype=SLOT_DTYPE, count=slot_num, offset=HEADER_BYTES)
    old = slots[slot_of].astype(np.int64)
    # RocketMQ treats a slot value <= 0 or beyond the count as empty.
    old[(old <= 0) | (old >= c)] = 0
    order = np.argsort(slot_of, kind="stable")
    slot_sorted = slot_of[order]
    number_sorted = numbers[order]
    first = np.ones(m, dtype=bool)
    first[1:] = slot_sorted[1:] != slot_sorted[:-1]
    last = np.ones(m, dtype=bool)
    last[:-1] = first[1:]
    previous_in_run = np.zeros(m, dtype=np.int64)
    previous_in_run[1:] = number_sorted[:-1]
    prev = np.empty(m, dtype=np.int64)
    prev[order] = np.where(first, old[order], previous_in_run)
    slots[slot_sorted[last]] = number_sorted[last]
    newly_used = int(np.count_nonzero(old[order][first] == 0))
    del slots

    h = header
    if c == 1:
        # This fixes RocketMQ's first-entry offset: begin is set before the time diff.
        h.begin_ts_ms = int(store_ts_ms[0])
        h.begin_phy = int(phys[0])
        h.end_ts_ms = int(store_ts_ms.max())
    else:
        h.end_ts_ms = max(h.end_ts_ms, int(store_ts_ms.max()))
    if h.begin_ts_ms <= 0:
        tdiff = np.zeros(m, dtype=np.int64)
    else:
        tdiff = np.clip((store_ts_ms - h.begin_ts_ms) // 1000, 0, INT32_MAX)
    entries = np.empty(m, dtype=ENTRY_DTYPE)
    entries["hash"] = key_hashes
    entries["phy"] = phys
    entries["tdiff"] = tdiff
    entries["prev"] = prev
    start = entry_pos(slot_num, c)
    buf[start : start + m * ENTRY_BYTES] = entries.tobytes()
    h.end_phy = int(phys[-1])
    h.slots_used += newly_used
    h.index_count = c + m
