"""Checks of many whole records at once, over numpy columns (pure: no I/O).

Records laid end to end in one blob, `sizes[i]` bytes each (a Pull's answer, a Read's run of
ranges), in record.py's layout.

`check_records` applies every check `read_record` makes to a record of the V1 magic, as array
comparisons over the fields gathered at every record's start: TOTALSIZE equal to its slot, the
header, body, topic and properties lengths adding up to it, a non-empty UTF-8 topic without NUL,
properties ending in 0x02, the CRC: the whole-record CRC property's form and value where the
record carries it, else the body CRC (crc32 of formats/crc.py mapped over the records' ranges:
one C call each, no Python frame), and, when asked, PHYSICALOFFSET equal to where the record
was read from. A record it does not pass (any failed check, a V2 record, one too short to gather
from) is left for the caller to give to `read_record`, whose verdict stands: the two can never
disagree.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from mqstore.formats import sysflag
from mqstore.formats.crc import crc32
from mqstore.formats.record import (
    DAMAGED_RECORD_CRC,
    HEADER_V4_V4,
    MAGIC_V1,
    NO_RECORD_CRC,
    PROPERTIES_END_BYTE,
    RECORD_BYTES_MIN,
    RECORD_CRC_BYTES,
    RECORD_CRC_DIGITS,
    RECORD_CRC_FIXED_BYTES_KEPT_MIN,
    RECORD_CRC_HEAD,
    RECORD_PREFIX,
    RECORD_PREFIX_BYTES,
    RECORD_PREFIX_NAMES,
    V6_EXTRA_BYTES,
    stored_record_crc,
)

# record.py's 40-byte prefix (TOTALSIZE .. SYSFLAG) as a numpy record: every record's fixed
# fields, one row a record.
PREFIX_DTYPE: Final = np.dtype(
    [(n, ">" + c) for n, c in zip(RECORD_PREFIX_NAMES, RECORD_PREFIX.format[1:], strict=True)]
)
assert PREFIX_DTYPE.itemsize == RECORD_PREFIX_BYTES

# Up to this many records are checked one at a time (_check_few): the column checks cost ~70 us
# a call at any count up to ~40, one record in Python ~1.5 us on top of ~3.5 (measured on the
# VM: 32 records 49-53 us against 74-75 either way, at 100 B and at 1 KiB).
SMALL_BATCH_RECORDS_MAX: Final = 32
_I32: Final = struct.Struct(">i")
_I16: Final = struct.Struct(">h")

# Records this long on average or more have their bodies' CRC computed through memoryviews
# when the caller wants no bodies: 118 against 252 ns a record at 1 KiB, but 177 against 153
# at 100 B (measured on the 2-core VM).
VIEW_CRC_RECORD_BYTES_MIN: Final = 512

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(slots=True)
class CheckedRecords:
    """Per record: whether every check passed (`ok`), its fixed fields (`head`, PREFIX_DTYPE),
    where it starts and ends in the blob, and its body (bytes; b"" where not ok; none at all
    when not asked for)."""

    ok: BoolArray
    head: Any
    starts: IntArray
    ends: IntArray
    bodies: list[bytes]


def check_records(
    blob: bytes,
    sizes: Sequence[int] | IntArray,
    expected_offsets: Sequence[int] | IntArray | None = None,
    *,
    bodies: bool = True,
) -> CheckedRecords:
    """Check the records of `blob` (their sizes must add up to its length: ValueError
    otherwise). `expected_offsets`: each record's commit-log offset, checked against its
    PHYSICALOFFSET. `bodies=False`: a caller that only wants the verdict gets no bodies (an
    empty list), and large ones are checked through views, not copied. Sizes and offsets may
    come as lists or as int arrays (a caller holding arrays spares a list's round trip)."""
    if expected_offsets is not None and len(expected_offsets) != len(sizes):
        raise ValueError(f"{len(expected_offsets)} offsets for {len(sizes)} records")
    if len(sizes) <= SMALL_BATCH_RECORDS_MAX:
        expected = None if expected_offsets is None else _ints_of(expected_offsets)
        return _check_few(blob, _ints_of(sizes), expected, bodies)
    return _check_columns(blob, sizes, expected_offsets, bodies)


def _ints_of(values: Sequence[int] | IntArray) -> Sequence[int]:
    if isinstance(values, np.ndarray):
        ints: list[int] = values.tolist()
        return ints
    return values


def _column(values: Sequence[int] | IntArray) -> IntArray:
    if isinstance(values, np.ndarray):
        return np.asarray(values, dtype=np.int64)
    return np.fromiter(values, dtype=np.int64, count=len(values))


def _check_columns(
    blob: bytes,
    sizes: Sequence[int] | IntArray,
    expected_offsets: Sequence[int] | IntArray | None,
    bodies: bool,
) -> CheckedRecords:
    """check_records over numpy columns of every record at once."""
    size = _column(sizes)
    n = len(size)
    ends = np.cumsum(size)
    if (int(ends[-1]) if n else 0) != len(blob) or (n and int(size.min()) < 0):
        raise ValueError(f"{n} record sizes do not add up to {len(blob)} bytes")
    starts = ends - size
    if not n or int(size.min()) < RECORD_BYTES_MIN:
        # Too short to gather from: every record is left to read_record.
        return CheckedRecords(np.zeros(n, dtype=bool), None, starts, ends, [b""] * n)
    buf = np.frombuffer(blob, dtype=np.uint8)
    # Records of one size (a producer's batch of like bodies: the usual answer) are rows of a
    # matrix, and a field every record holds at the same place is a column of it: a strided
    # view instead of a gather, which copies.
    rows = buf.reshape(n, int(size[0])) if int(size.min()) == int(size.max()) else None
    head = _heads(buf, rows, starts)
    total = head["total"].astype(np.int64)
    flags = head["sys_flag"].astype(np.int64)
    header = (
        HEADER_V4_V4.size
        + V6_EXTRA_BYTES * ((flags & sysflag.BORNHOST_V6) != 0)
        + V6_EXTRA_BYTES * ((flags & sysflag.STOREHOST_V6) != 0)
    )
    # V2 records (topics over 127 characters) are left to read_record.
    ok = (total == size) & (head["magic"] == MAGIC_V1) & (total >= header + 3)
    if expected_offsets is not None:
        ok &= head["physical_offset"].astype(np.int64) == _column(expected_offsets)
    body_len = _ints(buf, rows, starts, np.where(ok, starts + header - 4, 0), ">i4")
    ok &= (body_len >= 0) & (header + body_len + 3 <= total)
    topic_at = np.where(ok, starts + header + body_len, 0)
    topic_len = buf[topic_at].astype(np.int64)
    ok &= (topic_len > 0) & (header + body_len + 3 + topic_len <= total)
    props_len = _ints(buf, rows, starts, np.where(ok, topic_at + 1 + topic_len, 0), ">i2")
    ok &= header + body_len + 3 + topic_len + props_len == total
    ok &= (props_len == 0) | (buf[np.where(ok, ends - 1, 0)] == PROPERTIES_END_BYTE)
    ok &= _topics_ok(blob, buf, rows, starts, topic_at + 1, topic_len, ok)
    # The whole-record CRC where the record carries it, the body CRC where it does not.
    tails = _fields(buf, rows, starts, ends - RECORD_CRC_BYTES, RECORD_CRC_BYTES)
    stored = np.where(ok & (props_len >= RECORD_CRC_BYTES), stored_crcs(tails), NO_RECORD_CRC)
    whole = stored >= 0
    every_whole = bool(whole.all())

    body_list: list[bytes] = []
    if bodies or not every_whole:
        body_at = np.where(ok, starts + header, 0)
        body_end = body_at + np.where(ok, body_len, 0)
        # A list comprehension of slices: faster than mapping slice objects.
        a, b = body_at.tolist(), body_end.tolist()
        if bodies:
            body_list = [blob[x:y] for x, y in zip(a, b, strict=True)]
    if every_whole and rows is not None:
        # Records of one size, each with its CRC property: copies of all but their last 20
        # bytes cut by struct in C, no Python step a record.
        cut = struct.Struct(f"{rows.shape[1] - RECORD_CRC_BYTES}s{RECORD_CRC_BYTES}x")
        crcs = map(crc32, map(_FIRST, cut.iter_unpack(blob)))
    else:
        if every_whole:
            a, b = starts.tolist(), (ends - RECORD_CRC_BYTES).tolist()
        elif whole.any():
            a = np.where(whole, starts, body_at).tolist()
            b = np.where(whole, ends - RECORD_CRC_BYTES, body_end).tolist()
        elif bodies:
            a = b = []  # the CRCs are the bodies'
        # A view costs more than copying a small range and half as much as copying 1 KiB.
        if len(blob) >= n * VIEW_CRC_RECORD_BYTES_MIN:
            view = memoryview(blob)
            crcs = map(crc32, [view[x:y] for x, y in zip(a, b, strict=True)] or body_list)
        else:
            crcs = map(crc32, [blob[x:y] for x, y in zip(a, b, strict=True)] or body_list)
    crc = np.fromiter(crcs, dtype=np.int64, count=n) & _CRC_MASK
    if every_whole:
        ok &= crc == stored
    else:
        ok &= np.where(whole, crc == stored, (crc == head["body_crc"]) | (body_len == 0))
        ok &= stored != DAMAGED_RECORD_CRC  # (after the bodies: a CRC failure keeps its body)
    return CheckedRecords(ok, head, starts, ends, body_list if bodies else [])


def _check_few(
    blob: bytes,
    sizes: Sequence[int],
    expected_offsets: Sequence[int] | None,
    bodies: bool,
) -> CheckedRecords:
    """check_records of a few records, one at a time in Python: the same checks, the same
    result (tests/formats/test_record_columns.py holds the two equal). A tail pull or a Follow
    answer brings one record or a handful: ~5 us here against ~70 us of column checks."""
    n = len(sizes)
    starts: list[int] = []
    at = 0
    for size in sizes:
        if size < 0:
            raise ValueError(f"{n} record sizes do not add up to {len(blob)} bytes")
        starts.append(at)
        at += size
    if at != len(blob):
        raise ValueError(f"{n} record sizes do not add up to {len(blob)} bytes")
    ends = [a + z for a, z in zip(starts, sizes, strict=True)]
    if not n or min(sizes) < RECORD_BYTES_MIN:
        return CheckedRecords(
            np.zeros(n, dtype=bool),
            None,
            np.array(starts, dtype=np.int64),
            np.array(ends, dtype=np.int64),
            [b""] * n,
        )
    ok_list: list[bool] = []
    body_list: list[bytes] = []
    view = memoryview(blob) if len(blob) >= n * VIEW_CRC_RECORD_BYTES_MIN else None
    for i, start in enumerate(starts):
        total, magic, crc, _, _, _, physical, flags = RECORD_PREFIX.unpack_from(blob, start)
        header = (
            HEADER_V4_V4.size
            + (V6_EXTRA_BYTES if flags & sysflag.BORNHOST_V6 else 0)
            + (V6_EXTRA_BYTES if flags & sysflag.STOREHOST_V6 else 0)
        )
        body = b""
        ok = total == sizes[i] and magic == MAGIC_V1 and total >= header + 3
        if ok and expected_offsets is not None:
            ok = physical == expected_offsets[i]
        if ok:
            (body_len,) = _I32.unpack_from(blob, start + header - 4)
            ok = body_len >= 0 and header + body_len + 3 <= total
        if ok:
            topic_at = start + header + body_len
            topic_len = blob[topic_at]
            ok = topic_len > 0 and header + body_len + 3 + topic_len <= total
        if ok:
            (props_len,) = _I16.unpack_from(blob, topic_at + 1 + topic_len)
            ok = header + body_len + 3 + topic_len + props_len == total and (
                props_len == 0 or blob[ends[i] - 1] == PROPERTIES_END_BYTE
            )
        if ok:
            ok = topic_ok(blob[topic_at + 1 : topic_at + 1 + topic_len])
        if ok:
            # The whole-record CRC where the record carries it, else the body CRC.
            body_at = start + header
            if bodies or view is None:
                body = blob[body_at : body_at + body_len]  # (kept, as the columns keep it)
            stored = stored_record_crc(blob, ends[i], props_len)
            if stored >= 0:
                end = ends[i] - RECORD_CRC_BYTES
                got = crc32(view[start:end] if view is not None else blob[start:end])
                ok = (got & _CRC_MASK) == stored
            elif stored == DAMAGED_RECORD_CRC:
                ok = False
            elif body_len:
                got = crc32(view[body_at : body_at + body_len] if view is not None else body)
                ok = (got & _CRC_MASK) == crc
        ok_list.append(ok)
        body_list.append(body)
    heads = bytearray().join(blob[a : a + RECORD_PREFIX_BYTES] for a in starts)
    return CheckedRecords(
        np.array(ok_list, dtype=bool),
        np.frombuffer(heads, dtype=PREFIX_DTYPE),
        np.array(starts, dtype=np.int64),
        np.array(ends, dtype=np.int64),
        body_list if bodies else [],
    )


def split_records(blob: bytes, sizes: Sequence[int] | IntArray) -> list[bytes]:
    """The records laid end to end in `blob`, `sizes[i]` bytes each, as one bytes each (a
    comprehension of slices: faster than mapping slice objects)."""
    bounds = [0, *np.cumsum(sizes, dtype=np.int64).tolist()]
    return [blob[a:b] for a, b in pairwise(bounds)]


def record_heads(blob: bytes, sizes: IntArray) -> Any:
    """The fixed fields (PREFIX_DTYPE) of the records laid end to end in `blob`, `sizes[i]`
    bytes each (adding up to its length); None when one is too short to hold them."""
    n = len(sizes)
    if not n:
        return np.zeros(0, dtype=PREFIX_DTYPE)
    ends = np.cumsum(sizes, dtype=np.int64)
    if int(ends[-1]) != len(blob) or int(sizes.min()) < RECORD_PREFIX_BYTES:
        return None
    return _heads(np.frombuffer(blob, dtype=np.uint8), None, ends - sizes)


def _heads(buf: npt.NDArray[np.uint8], rows: npt.NDArray[np.uint8] | None, starts: IntArray) -> Any:
    """Each record's fixed fields (PREFIX_DTYPE), through _fields."""
    return _fields(buf, rows, starts, starts, RECORD_PREFIX_BYTES).view(PREFIX_DTYPE)[:, 0]


def _fields(
    buf: npt.NDArray[np.uint8],
    rows: npt.NDArray[np.uint8] | None,
    starts: IntArray,
    at: IntArray,
    width: int,
) -> npt.NDArray[np.uint8]:
    """The `width` bytes at each position `at[i]` (record i's), as an (n, width) matrix: the
    columns of `rows` when every record holds them at the same place, else a gather."""
    if rows is not None:
        rel = at - starts
        first = int(rel[0])
        if int(rel.min()) == int(rel.max()) and 0 <= first <= rows.shape[1] - width:
            return np.ascontiguousarray(rows[:, first : first + width])
    gathered: npt.NDArray[np.uint8] = buf[at[:, None] + np.arange(width)]
    return gathered


def _ints(
    buf: npt.NDArray[np.uint8],
    rows: npt.NDArray[np.uint8] | None,
    starts: IntArray,
    at: IntArray,
    dtype: str,
) -> IntArray:
    """The big-endian integers of type `dtype` at positions `at` (record i's), as int64,
    through _fields."""
    width = np.dtype(dtype).itemsize
    got: IntArray = _fields(buf, rows, starts, at, width).view(dtype)[:, 0].astype(np.int64)
    return got


def _topics_ok(
    blob: bytes,
    buf: npt.NDArray[np.uint8],
    rows: npt.NDArray[np.uint8] | None,
    starts: IntArray,
    at: IntArray,
    length: IntArray,
    ok: BoolArray,
) -> Any:
    """Per record: its topic is UTF-8 without a NUL (read_record's torn-write check). A batch
    holds one topic or a few, so each distinct one is checked once."""
    lengths = length[ok]
    if len(lengths) and int(lengths.min()) == int(lengths.max()):
        # The usual batch: one topic name. Compare every record's to the first, byte-wise.
        first = int(np.flatnonzero(ok)[0])
        if bool(ok.all()):
            names_matrix = _fields(buf, rows, starts, at, int(lengths[0]))
        else:
            names_matrix = buf[at[ok][:, None] + np.arange(lengths[0])]
        if bool((names_matrix == names_matrix[0]).all()):
            first_name = blob[int(at[first]) : int(at[first] + length[first])]
            return True if topic_ok(first_name) else np.zeros(len(ok), dtype=bool)
    names = list(
        map(
            blob.__getitem__,
            map(slice, np.where(ok, at, 0).tolist(), np.where(ok, at + length, 0).tolist()),
        )
    )
    bad = {name for name in set(names) if not topic_ok(name)}
    if not bad:
        return True
    return np.fromiter((name not in bad for name in names), dtype=bool, count=len(names))


def topic_ok(raw: bytes) -> bool:
    """A topic as read_record accepts it: non-empty UTF-8 without a NUL."""
    try:
        topic = raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return bool(topic) and "\x00" not in topic


# ---------------------------------------------------------------------------------------------
# The whole-record CRC property (record.py), for many records at once

_CRC_MASK: Final = 0x7FFFFFFF
_HEAD_BYTES: Final = len(RECORD_CRC_HEAD)
_HEAD: Final = np.frombuffer(RECORD_CRC_HEAD, dtype=np.uint8)
_KEY_BYTES: Final = 8  # "__CRC32#", compared as one big-endian 64-bit number
_KEY: Final = int.from_bytes(RECORD_CRC_HEAD[:_KEY_BYTES], "big")
# Its halves: a damaged property (one fixed byte off) keeps one of them whole.
_KEY_HIGH: Final = _KEY >> 32
_KEY_LOW: Final = _KEY & 0xFFFFFFFF
assert _HEAD_BYTES == _KEY_BYTES + 1
_POWERS_OF_TEN: Final = 10 ** np.arange(RECORD_CRC_DIGITS, dtype=np.int64)
# The digits of every number below 10**5, least significant first: a CRC (below 2**31) is two
# rows of it, its low five digits and its high five (two gathers, no division per digit).
_HALF_DIGITS: Final = RECORD_CRC_DIGITS // 2
_HALF: Final = 10**_HALF_DIGITS
_DIGIT_ROWS: Final = (
    (np.arange(_HALF, dtype=np.int64)[:, None] // _POWERS_OF_TEN[:_HALF_DIGITS]) % 10 + ord("0")
).astype(np.uint8)
_FIRST: Final = operator.itemgetter(0)


def write_record_crcs(blob: bytearray, sizes: Sequence[int]) -> None:
    """Fill in the whole-record CRC of the records laid end to end in `blob`, `sizes[i]` bytes
    each, every one ending with the CRC property's placeholder (record.RECORD_CRC_PLACEHOLDER):
    the CRC of each record's bytes but its last 20, its ten digits written over the zeros.

    One crc32 call a record, mapped in C over the records: for records of one size (a
    producer's batch of like messages) copies cut by struct.iter_unpack, else memoryview
    slices; the digits of all are written at once over numpy columns (a strided view of the
    blob when the records are of one size)."""
    n = len(sizes)
    if not n:
        return
    size = sizes[0]
    if min(sizes) == max(sizes):
        cut = struct.Struct(f"{size - RECORD_CRC_BYTES}s{RECORD_CRC_BYTES}x")
        crcs = map(crc32, map(_FIRST, cut.iter_unpack(blob)))
        crc = np.fromiter(crcs, dtype=np.int64, count=n) & _CRC_MASK
        rows = np.frombuffer(blob, dtype=np.uint8).reshape(n, size)
        digits_at = size - 1 - RECORD_CRC_DIGITS
        high, low = np.divmod(crc, _HALF)
        # np.take: faster than indexing the table
        rows[:, digits_at : digits_at + _HALF_DIGITS] = np.take(_DIGIT_ROWS, low, axis=0)
        rows[:, digits_at + _HALF_DIGITS : size - 1] = np.take(_DIGIT_ROWS, high, axis=0)
        return
    ends = np.cumsum(np.asarray(sizes, dtype=np.int64))
    starts = (ends - np.asarray(sizes, dtype=np.int64)).tolist()
    view = memoryview(blob)
    crc_ends = (ends - RECORD_CRC_BYTES).tolist()
    ranges = [view[a:b] for a, b in zip(starts, crc_ends, strict=True)]
    crc = np.fromiter(map(crc32, ranges), dtype=np.int64, count=n) & _CRC_MASK
    del ranges  # no view of the blob outlives the call (a bytearray with one cannot resize)
    view.release()
    high, low = np.divmod(crc, _HALF)
    digits = np.concatenate(
        (np.take(_DIGIT_ROWS, low, axis=0), np.take(_DIGIT_ROWS, high, axis=0)), axis=1
    )
    at = (ends - 1 - RECORD_CRC_DIGITS)[:, None] + np.arange(RECORD_CRC_DIGITS)
    np.frombuffer(blob, dtype=np.uint8)[at] = digits


def stored_crcs(tails: npt.NDArray[np.uint8]) -> IntArray:
    """record.stored_record_crc of each record, from the last 20 bytes of each (one row each,
    its bytes contiguous; the caller sets NO_RECORD_CRC where the properties are shorter than
    20 bytes). Rows are told apart by column compares: the key, 0x01 and 0x02 in place (then
    the ten digits are checked and read), or neither half of the key in place (no property:
    at most one of its fixed bytes may differ in a damaged one); only what is left, damaged
    properties and rare look-alikes, is compared byte by byte."""
    key = tails[:, :_KEY_BYTES].view(">u8")[:, 0]
    formed = (key == _KEY) & (tails[:, _KEY_BYTES] == 0x01) & (tails[:, -1] == PROPERTIES_END_BYTE)
    if bool(formed.all()):  # the usual batch: every record has the property
        return _read_digits(tails)
    found: IntArray = np.full(len(tails), NO_RECORD_CRC, dtype=np.int64)
    rows = np.flatnonzero(formed)
    if len(rows):
        found[rows] = _read_digits(tails[rows])
    halves = tails[:, :_KEY_BYTES].view(">u4")
    near = ~formed & ((halves[:, 0] == _KEY_HIGH) | (halves[:, 1] == _KEY_LOW))
    rest = np.flatnonzero(near)
    if len(rest):
        kept = (tails[rest, :_HEAD_BYTES] == _HEAD).sum(axis=1) + (
            tails[rest, -1] == PROPERTIES_END_BYTE
        )
        found[rest] = np.where(
            kept >= RECORD_CRC_FIXED_BYTES_KEPT_MIN, DAMAGED_RECORD_CRC, NO_RECORD_CRC
        )
    return found


def _read_digits(tails: npt.NDArray[np.uint8]) -> IntArray:
    """The CRC in the ten digits of each row, or DAMAGED_RECORD_CRC where one is no digit."""
    digits = tails[:, _HEAD_BYTES:-1] - np.uint8(ord("0"))  # a non-digit wraps past 9
    digit_ok = digits[:, 0] <= 9
    for column in range(1, RECORD_CRC_DIGITS):  # column by column: faster than all(axis=1)
        digit_ok &= digits[:, column] <= 9
    value: IntArray = np.where(
        digit_ok, digits.astype(np.int64) @ _POWERS_OF_TEN, DAMAGED_RECORD_CRC
    )
    return value
