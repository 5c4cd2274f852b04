"""Checks of many whole records at once, over numpy columns (pure: no I/O).

Records laid end to end in one blob, `sizes[i]` bytes each (a Pull's answer, a Read's run of
ranges):

    TOTALSIZE MAGIC BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSICALOFFSET SYSFLAG ...   (record.py)
    0         4     8       12      16   20          28             36      40

`check_records` applies every check `read_record` makes to a record of the V1 magic, as array
comparisons over the fields gathered at every record's start: TOTALSIZE equal to its slot, the
header, body, topic and properties lengths adding up to it, a non-empty UTF-8 topic without NUL,
properties ending in 0x02, the body CRC (crc32 of formats/crc.py mapped over the bodies: one C
call each, no Python frame), and, when asked, PHYSICALOFFSET equal to where the record was
read from. A record it does not pass (any failed check, a V2 record, one too short to gather
from) is left for the caller to give to `read_record`, whose verdict stands: the two can never
disagree.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from mqstore.formats import sysflag
from mqstore.formats.crc import crc32
from mqstore.formats.record import HEADER_V4_V4, MAGIC_V1, PROPERTIES_END_BYTE

# The smallest whole record: the IPv4/IPv4 header, a topic length byte, a properties length.
RECORD_BYTES_MIN: Final = HEADER_V4_V4.size + 3
# Bytes that an IPv6 born or store host adds to the 88-byte IPv4/IPv4 header.
_V6_EXTRA_BYTES: Final = 12
_PREFIX_BYTES: Final = 40  # TOTALSIZE .. SYSFLAG: where every record's fixed fields sit
PREFIX_DTYPE: Final = np.dtype(
    [
        ("total", ">i4"),
        ("magic", ">i4"),
        ("body_crc", ">i4"),
        ("queue_id", ">i4"),
        ("flag", ">i4"),
        ("queue_offset", ">i8"),
        ("physical_offset", ">i8"),
        ("sys_flag", ">i4"),
    ]
)

# Up to this many records are checked one at a time (_check_few): the column checks cost ~70 us
# a call at any count up to ~40, one record in Python ~1.5 us on top of ~3.5 (measured on the
# VM: 32 records 49-53 us against 74-75 either way, at 100 B and at 1 KiB).
SMALL_BATCH_RECORDS_MAX: Final = 32
_PREFIX: Final = struct.Struct(">iiiiiqqi")  # PREFIX_DTYPE, for one record
assert _PREFIX.size == _PREFIX_BYTES
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
    # view instead of a gather (1,000 records of 100 B: ~380 -> ~250 ns a record).
    rows = buf.reshape(n, int(size[0])) if int(size.min()) == int(size.max()) else None
    head = _heads(buf, rows, starts)
    total = head["total"].astype(np.int64)
    flags = head["sys_flag"].astype(np.int64)
    header = (
        HEADER_V4_V4.size
        + _V6_EXTRA_BYTES * ((flags & sysflag.BORNHOST_V6) != 0)
        + _V6_EXTRA_BYTES * ((flags & sysflag.STOREHOST_V6) != 0)
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

    body_at = np.where(ok, starts + header, 0)
    body_end = body_at + np.where(ok, body_len, 0)
    # A list comprehension of slices: twice as fast as mapping slice objects (measured). A
    # view costs more than copying a small body and half as much as copying a 1 KiB one.
    a, b = body_at.tolist(), body_end.tolist()
    body_list: list[bytes] = []
    if not bodies and len(blob) >= n * VIEW_CRC_RECORD_BYTES_MIN:
        view = memoryview(blob)
        crcs = map(crc32, [view[x:y] for x, y in zip(a, b, strict=True)])
    else:
        body_list = [blob[x:y] for x, y in zip(a, b, strict=True)]
        crcs = map(crc32, body_list)
    crc = np.fromiter(crcs, dtype=np.int64, count=n) & 0x7FFFFFFF
    ok &= (crc == head["body_crc"]) | (body_len == 0)
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
    view = memoryview(blob) if not bodies and len(blob) >= n * VIEW_CRC_RECORD_BYTES_MIN else None
    for i, start in enumerate(starts):
        total, magic, crc, _, _, _, physical, flags = _PREFIX.unpack_from(blob, start)
        header = (
            HEADER_V4_V4.size
            + (_V6_EXTRA_BYTES if flags & sysflag.BORNHOST_V6 else 0)
            + (_V6_EXTRA_BYTES if flags & sysflag.STOREHOST_V6 else 0)
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
            body_at = start + header
            if view is not None:
                got = crc32(view[body_at : body_at + body_len])
            else:
                body = blob[body_at : body_at + body_len]
                got = crc32(body)
            ok = body_len == 0 or (got & 0x7FFFFFFF) == crc  # (its body kept, as the columns do)
        ok_list.append(ok)
        body_list.append(body)
    heads = bytearray().join(blob[a : a + _PREFIX_BYTES] for a in starts)
    return CheckedRecords(
        np.array(ok_list, dtype=bool),
        np.frombuffer(heads, dtype=PREFIX_DTYPE),
        np.array(starts, dtype=np.int64),
        np.array(ends, dtype=np.int64),
        body_list if bodies else [],
    )


def split_records(blob: bytes, sizes: Sequence[int] | IntArray) -> list[bytes]:
    """The records laid end to end in `blob`, `sizes[i]` bytes each, as one bytes each (a
    comprehension of slices: twice as fast as mapping slice objects, measured)."""
    bounds = [0, *np.cumsum(sizes, dtype=np.int64).tolist()]
    return [blob[a:b] for a, b in pairwise(bounds)]


def record_heads(blob: bytes, sizes: IntArray) -> Any:
    """The fixed fields (PREFIX_DTYPE) of the records laid end to end in `blob`, `sizes[i]`
    bytes each (adding up to its length); None when one is too short to hold them."""
    n = len(sizes)
    if not n:
        return np.zeros(0, dtype=PREFIX_DTYPE)
    ends = np.cumsum(sizes, dtype=np.int64)
    if int(ends[-1]) != len(blob) or int(sizes.min()) < _PREFIX_BYTES:
        return None
    return _heads(np.frombuffer(blob, dtype=np.uint8), None, ends - sizes)


def _heads(buf: npt.NDArray[np.uint8], rows: npt.NDArray[np.uint8] | None, starts: IntArray) -> Any:
    """Each record's fixed fields (PREFIX_DTYPE), through _fields."""
    return _fields(buf, rows, starts, starts, _PREFIX_BYTES).view(PREFIX_DTYPE)[:, 0]


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
