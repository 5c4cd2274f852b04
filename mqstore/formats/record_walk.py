"""The recovery walk over a run of commit-log records, vectorised per window of the buffer.

`scan_run_fast` has `record.scan_run`'s contract to the letter (same arguments, same result,
same queue-table updates) and is pinned to it by tests/formats/test_record_walk.py. It exists
because the per-record Python walk costs ~2 us a record: 1 GiB of 100-byte messages is ~5 M
records, ten seconds of recovery. Here Python runs a few dozen numpy operations per window
instead, and one C call per record for its CRC (the whole-record CRC, or the body's).

Per window of WINDOW_BYTES (the records that start in it; they may end past it):

1. Candidates: every position p where a record magic code (V1 or V2) sits at p + 4 *and* the
   PHYSICALOFFSET field at p + 28 equals the commit-log offset of p. Every record boundary of a
   well-formed log is a candidate. A candidate inside a body needs both the magic and its own
   position written there, so it is rare; it only costs a resynchronisation below. Found by a
   byte scan for the magic's first byte, or, for a run of records of one size (fixed-size
   messages), by testing the positions pos + k * size directly (no scan).
2. Every check of `read_record`, as array comparisons over the fields gathered at all candidates
   at once (unaligned big-endian views of the buffer): sizes, header, body, topic and properties
   lengths adding up to TOTALSIZE, the properties' last byte, the topic (non-empty UTF-8 without
   NUL, checked once per distinct topic), and the CRC: the whole-record CRC property's form
   and value where a record carries it, else the body CRC (one crc32 call per record,
   formats/crc.py, in C through map, no Python frame). Records of one size laid out alike have
   their lengths checked once and their per-record fields read as strided views, with no gather.
3. The chain: from `pos`, follow TOTALSIZE while every check passed and the next position is a
   candidate. Where anything is in doubt (a check failed, the next position is not a candidate,
   fewer than a record's bytes are left), `read_record` decides that one record exactly as
   `scan_run` does: its verdict stands, so the two walks can never disagree.

Measured on the 2-core VM (in memory, records of a 100-byte body): ~0.35 us a record for fixed-
size messages, ~0.5 us for mixed ones, against ~2.2 us for scan_run; the body CRC call alone is
~0.18 us of it. (Figures from before the whole-record CRC: docs/status.md has the current.)

Pure: no I/O (recovery reads the segment ahead of the walk itself).
"""

from __future__ import annotations

import itertools
import operator
import struct
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from mqstore.formats import sysflag
from mqstore.formats.crc import crc32
from mqstore.formats.record import (
    DAMAGED_RECORD_CRC,
    HEADER_V4_V4,
    MAGIC_V1,
    MAGIC_V2,
    NO_RECORD_CRC,
    PHYSICAL_OFFSET_POS,
    PROPERTIES_END_BYTE,
    QUEUE_ID_POS,
    QUEUE_OFFSET_POS,
    RECORD_CRC_BYTES,
    SYSFLAG_POS,
    Blank,
    Buffer,
    ReadResult,
    Record,
    read_record,
    scan_run,
)
from mqstore.formats.record_columns import stored_crcs

# Records that start in one window are checked together. 16 MiB holds ~70,000 records of a
# 100-byte body: the per-window arrays stay a few MB, and numpy's per-call overhead is spread
# over enough records to vanish.
WINDOW_BYTES: Final = 16 << 20
# Below this many bytes left (about ten records), the per-record walk costs less than setting
# up the arrays.
SMALL_RUN_BYTES: Final = 1024
# A run of equal-sized records is taken without the byte scan when at least this long.
STRIDE_RUN_MIN: Final = 16
# Bodies of one length are CRC'd from a gathered block when at least this many share it.
CRC_BLOCK_GROUP_MIN: Final = 32
# Known topics compared row by row before the general (sorting) path takes over.
TOPIC_COMPARE_MAX: Final = 8

_FIXED_MIN: Final = HEADER_V4_V4.size + 3  # smallest possible record: 91 bytes
_MAGIC_FIRST_BYTE: Final = 0xDA
_BODY_LENGTH_FROM_HEADER_END: Final = 4
_IPV6_EXTRA_BYTES: Final = 12
_CRC_MASK: Final = 0x7FFFFFFF

_FIRST = operator.itemgetter(0)

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

assert (MAGIC_V1 >> 24) & 0xFF == (MAGIC_V2 >> 24) & 0xFF == _MAGIC_FIRST_BYTE


class _Views:
    """Unaligned big-endian views of the buffer; `release` drops them so that the buffer (an
    mmap) can be closed afterwards."""

    def __init__(self, buf: Buffer, end: int) -> None:
        self.view = memoryview(buf)
        self.u8: npt.NDArray[np.uint8] = np.frombuffer(self.view, dtype=np.uint8, count=end)
        self.i16 = self._strided(">i2", end)
        self.i32 = self._strided(">i4", end)
        self._items: dict[int, npt.NDArray[np.void]] = {}

    def _strided(self, dtype: str, end: int) -> npt.NDArray[np.signedinteger[npt.NBitBase]]:
        width = np.dtype(dtype).itemsize
        return np.ndarray((max(0, end - width + 1),), dtype=dtype, buffer=self.view, strides=(1,))

    def column(
        self, dtype: str, offset: int, stride: int, count: int
    ) -> npt.NDArray[np.integer[Any]]:
        """`count` values of `dtype` at offset, offset + stride, ...: a view, no gather."""
        column: npt.NDArray[np.integer[Any]] = np.ndarray(
            (count,), dtype=dtype, buffer=self.view, offset=offset, strides=(stride,)
        )
        return column

    def rows(self, at: IntArray, width: int) -> npt.NDArray[np.uint8]:
        """The `width` bytes at each position of `at` (all in range), as an (n, width) copy.
        Gathered as `width`-byte void items of a stride-1 view: about twice as fast as rows of
        a 2-D strided view."""
        items = self._items.get(width)
        if items is None:
            items = np.ndarray(
                (max(0, len(self.u8) - width + 1),),
                dtype=np.dtype((np.void, width)),
                buffer=self.view,
                strides=(1,),
            )
            self._items[width] = items
        picked: npt.NDArray[np.uint8] = items[at].view(np.uint8).reshape(-1, width)
        return picked

    def release(self) -> None:
        del self.u8, self.i16, self.i32
        self._items.clear()
        self.view.release()


class _Topics:
    """Distinct topics seen by one walk: raw bytes -> id, and id -> name (None if invalid)."""

    def __init__(self) -> None:
        self.ids: dict[bytes, int] = {}
        self.names: list[str | None] = []
        self.by_length: dict[int, list[bytes]] = {}

    def id_of(self, raw: bytes) -> int:
        found = self.ids.get(raw)
        if found is not None:
            return found
        try:
            name: str | None = raw.decode("utf-8")
        except UnicodeDecodeError:
            name = None
        if not name or "\x00" in name:
            name = None  # read_record's verdict: empty or NUL-holding topics are torn writes
        self.ids[raw] = len(self.names)
        self.names.append(name)
        self.by_length.setdefault(len(raw), []).append(raw)
        return self.ids[raw]


def scan_run_fast(
    buf: Buffer,
    pos: int,
    end: int,
    base_offset: int,
    *,
    check_crc: bool = True,
    queue_table: dict[str, dict[int, int]] | None = None,
    apply_from: int = 0,
) -> tuple[int, int, ReadResult | None]:
    """`record.scan_run`, vectorised: walk the valid records of buf[pos:end] and return (position
    after the last valid record, records walked, what stopped the walk: None at `end`, a Blank
    or a Bad), updating `queue_table` for records at or after `apply_from` exactly as scan_run
    does."""
    if end - pos < SMALL_RUN_BYTES:
        return scan_run(
            buf,
            pos,
            end,
            base_offset,
            check_crc=check_crc,
            queue_table=queue_table,
            apply_from=apply_from,
        )
    count = 0
    topics = _Topics()
    views = _Views(buf, end)
    try:
        while pos < end:
            if end - pos < _FIXED_MIN:
                doubt = pos
            else:
                window_end = min(end, pos + WINDOW_BYTES)
                pos, walked, doubt = _walk_window(
                    views, pos, window_end, end, base_offset, check_crc, topics,
                    queue_table, apply_from,
                )  # fmt: skip
                count += walked
            if doubt < 0:
                continue
            # One record in doubt: read_record's verdict, exactly as scan_run takes it.
            pos = doubt
            found = read_record(
                buf, pos, end, check_crc=check_crc, expected_offset=base_offset + pos
            )
            if not isinstance(found, Record):
                return pos, count, found
            _apply_one(queue_table, found, base_offset + pos, apply_from)
            pos += found.total_size
            count += 1
    finally:
        views.release()
    return pos, count, None


def _apply_one(
    queue_table: dict[str, dict[int, int]] | None, record: Record, offset: int, apply_from: int
) -> None:
    if queue_table is None or offset < apply_from:
        return
    if record.sys_flag & sysflag.TRANSACTION_MASK not in (
        sysflag.TRANSACTION_NOT_TYPE,
        sysflag.TRANSACTION_COMMIT_TYPE,
    ):
        return
    queues = queue_table.setdefault(record.topic, {})
    if queues.get(record.queue_id, 0) <= record.queue_offset:
        queues[record.queue_id] = record.queue_offset + 1


# TOTALSIZE .. SYSFLAG (record._PREFIX), read for every candidate with one gather.
_PREFIX = np.dtype(
    [
        ("total", ">i4"),
        ("magic", ">i4"),
        ("crc", ">i4"),
        ("queue_id", ">i4"),
        ("flag", ">i4"),
        ("queue_offset", ">i8"),
        ("physical", ">i8"),
        ("sys_flag", ">i4"),
    ]
)
assert _PREFIX.itemsize == 40 and _PREFIX.fields is not None
assert _PREFIX.fields["physical"][1] == PHYSICAL_OFFSET_POS
assert _PREFIX.fields["queue_id"][1] == QUEUE_ID_POS
assert _PREFIX.fields["queue_offset"][1] == QUEUE_OFFSET_POS
assert _PREFIX.fields["sys_flag"][1] == SYSFLAG_POS


def _candidates(
    views: _Views, pos: int, window_end: int, end: int, base_offset: int
) -> tuple[IntArray, npt.NDArray[np.void]]:
    """Positions in [pos, window_end) with a record magic at p + 4 and p's own commit-log offset
    in the PHYSICALOFFSET field (p <= end - 91, so every fixed field is in the buffer), and the
    40-byte prefix of the record at each."""
    last = min(window_end, end - _FIXED_MIN + 1)  # > pos: the caller leaves 91 bytes at least
    u8 = views.u8
    at: IntArray = np.flatnonzero(u8[pos + 4 : last + 4] == _MAGIC_FIRST_BYTE)
    at += pos + 4
    magic = views.i32[at]
    starts = at[(magic == MAGIC_V1) | (magic == MAGIC_V2)] - 4
    prefix = views.rows(starts, _PREFIX.itemsize).view(_PREFIX).reshape(-1)
    keep = prefix["physical"] == starts + base_offset
    return starts[keep], prefix[keep]


def _stride_run(
    views: _Views, pos: int, window_end: int, end: int, base_offset: int
) -> tuple[IntArray, npt.NDArray[np.void]] | None:
    """Guess that the records from `pos` have the size of the first (fixed-size messages, the
    common case) and test the guess: positions pos + k * size holding a record magic, their own
    offset and TOTALSIZE == size pass _candidates' test and chain to the next by construction,
    so the byte scan is not needed for them. None when fewer than STRIDE_RUN_MIN pass."""
    size = int(views.i32[pos])
    if size < _FIXED_MIN or size > end - pos:
        return None
    # Starts before window_end; each record ends by `end` (so every fixed field is readable).
    n = min(-(-(window_end - pos) // size), (end - pos) // size)
    if n < STRIDE_RUN_MIN:
        return None
    prefix = np.ndarray(
        (n,), dtype=_PREFIX, buffer=views.view, offset=pos, strides=(size,)
    )  # a view: no gather
    starts = pos + np.arange(n, dtype=np.int64) * size
    magic = prefix["magic"]
    fits = (
        (prefix["total"] == size)
        & ((magic == MAGIC_V1) | (magic == MAGIC_V2))
        & (prefix["physical"] == starts + base_offset)
    )
    run = n if fits.all() else int(np.argmin(fits))
    if run < STRIDE_RUN_MIN:
        return None
    return starts[:run], prefix[:run]


def _walk_window(
    views: _Views,
    pos: int,
    window_end: int,
    end: int,
    base_offset: int,
    check_crc: bool,
    topics: _Topics,
    queue_table: dict[str, dict[int, int]] | None,
    apply_from: int,
) -> tuple[int, int, int]:
    """Accept the chain of valid records from `pos` that start before `window_end`. Returns
    (position after them, how many, the position of a record in doubt or -1)."""
    run = _stride_run(views, pos, window_end, end, base_offset)
    guessed = run is not None
    starts, prefix = (
        run if run is not None else _candidates(views, pos, window_end, end, base_offset)
    )
    if not len(starts) or starts[0] != pos:
        return pos, 0, pos
    total = prefix["total"].astype(np.int64)
    record_end = starts + total
    uniform = _uniform_checks(views, starts, prefix, check_crc, topics) if guessed else None
    good, topic_ids = uniform or _checks(
        views, starts, prefix, total, record_end, end, check_crc, topics
    )
    # Records k with good[k] and record_end[k] == starts[k + 1] chain on without a doubt.
    chained = np.zeros(len(starts), dtype=np.bool_)
    chained[:-1] = record_end[:-1] == starts[1:]
    stops = np.flatnonzero(~(good & chained))  # never empty: the last candidate never chains
    accepted = np.zeros(len(starts), dtype=np.bool_)
    count = 0
    k = 0
    doubt = -1
    while True:
        stop = int(stops[np.searchsorted(stops, k)])
        accepted[k:stop] = True
        count += stop - k
        if not good[stop]:
            pos = int(starts[stop])
            doubt = pos
            break
        accepted[stop] = True
        count += 1
        pos = int(record_end[stop])
        if pos >= window_end or guessed:
            break  # a guessed run ends where the guess did: the caller starts a new window
        # The next record starts in this window but is not the next candidate: a candidate
        # inside the last record's body (skip it), or no candidate at all (a doubt).
        k = int(np.searchsorted(starts, pos))
        if k == len(starts) or starts[k] != pos:
            doubt = pos
            break
    if queue_table is not None and count:
        _apply_many(
            starts, prefix, accepted, topic_ids, topics, queue_table, base_offset, apply_from
        )
    return pos, count, doubt


def _checks(
    views: _Views,
    starts: IntArray,
    prefix: npt.NDArray[np.void],
    total: IntArray,
    record_end: IntArray,
    end: int,
    check_crc: bool,
    topics: _Topics,
) -> tuple[BoolArray, IntArray]:
    """read_record's checks at every candidate: (all pass, topic id or -1)."""
    u8, i16, i32 = views.u8, views.i16, views.i32
    ok: BoolArray = (total >= _FIXED_MIN) & (record_end <= end)
    flags = prefix["sys_flag"]
    header = HEADER_V4_V4.size + _IPV6_EXTRA_BYTES * (
        ((flags & sysflag.BORNHOST_V6) != 0).astype(np.int64)
        + ((flags & sysflag.STOREHOST_V6) != 0)
    )
    ok &= total >= header + 3
    body_at = starts + header
    body_len = i32[np.where(ok, body_at - _BODY_LENGTH_FROM_HEADER_END, 0)].astype(np.int64)
    v2 = prefix["magic"] == MAGIC_V2
    topic_at = body_at + body_len
    ok &= (body_len >= 0) & (topic_at + 1 + v2 <= record_end)
    # A V1 topic length is one byte and may be the record's last: read two bytes only for V2.
    topic_len = u8[np.where(ok, topic_at, 0)].astype(np.int64)
    if v2.any():
        topic_len[v2] = i16[np.where(ok[v2], topic_at[v2], 0)]
    topic_start = topic_at + 1 + v2
    props_at = topic_start + topic_len
    ok &= (topic_len >= 1) & (props_at + 2 <= record_end)  # an empty topic is never valid
    props_len = i16[np.where(ok, props_at, 0)].astype(np.int64)
    ok &= (props_len >= 0) & (props_at + 2 + props_len == record_end)
    last = u8[np.where(ok, record_end - 1, 0)]
    ok &= (props_len == 0) | (last == PROPERTIES_END_BYTE)
    topic_ids = _topic_ids(views, np.flatnonzero(ok), topic_start, topic_len, topics, len(starts))
    ok &= topic_ids >= 0
    if check_crc:
        # The whole-record CRC where a record carries it, the body CRC where it does not.
        with_props = np.flatnonzero(ok & (props_len >= RECORD_CRC_BYTES))
        stored = np.full(len(starts), NO_RECORD_CRC, dtype=np.int64)
        if len(with_props):
            tails = views.rows(record_end[with_props] - RECORD_CRC_BYTES, RECORD_CRC_BYTES)
            stored[with_props] = stored_crcs(tails)
        ok &= stored != DAMAGED_RECORD_CRC
        whole = stored >= 0
        crc_at = np.flatnonzero(ok & (whole | (body_len > 0)))
        if len(crc_at):
            first = np.where(whole, starts, body_at)[crc_at]
            length = np.where(whole, total - RECORD_CRC_BYTES, body_len)[crc_at]
            crcs = _range_crcs(views, first, length)
            expected = np.where(whole, stored, prefix["crc"])[crc_at]
            ok[crc_at] = (crcs & _CRC_MASK) == expected
    return ok, topic_ids


def _uniform_checks(
    views: _Views,
    starts: IntArray,
    prefix: npt.NDArray[np.void],
    check_crc: bool,
    topics: _Topics,
) -> tuple[BoolArray, IntArray] | None:
    """_checks for a guessed run (records of one size at a fixed stride) whose records are also
    laid out alike: same magic, host sizes, body, topic and properties lengths, and topic. Then
    every length check of _checks reads the same numbers for each record as for the first, so
    it is made once; what is left per record (the properties' last byte, the CRC property, the
    CRC) reads strided views, without a gather. None when the records differ in any of those,
    or some carry the whole-record CRC and some not: _checks then does the general work."""
    n = len(starts)
    pos = int(starts[0])
    size = int(prefix["total"][0])
    magic = prefix["magic"]
    flags = prefix["sys_flag"]
    hosts = sysflag.BORNHOST_V6 | sysflag.STOREHOST_V6
    flag0 = int(flags[0])
    if not (bool((magic == magic[0]).all()) and bool((((flags ^ flag0) & hosts) == 0).all())):
        return None
    v2 = int(magic[0]) == MAGIC_V2
    header = HEADER_V4_V4.size + _IPV6_EXTRA_BYTES * (
        bool(flag0 & sysflag.BORNHOST_V6) + bool(flag0 & sysflag.STOREHOST_V6)
    )
    if size < header + 3:
        return None
    body_len = views.column(">i4", pos + header - _BODY_LENGTH_FROM_HEADER_END, size, n)
    body0 = int(body_len[0])
    topic_at = header + body0  # from the record's start, like every offset below
    if body0 < 0 or topic_at + 1 + v2 > size or not bool((body_len == body0).all()):
        return None
    topic_len = views.column(">i2" if v2 else "u1", pos + topic_at, size, n)
    topic0 = int(topic_len[0])
    topic_start = topic_at + 1 + v2
    props_at = topic_start + topic0
    if topic0 < 1 or props_at + 2 > size or not bool((topic_len == topic0).all()):
        return None
    props_len = views.column(">i2", pos + props_at, size, n)
    props0 = int(props_len[0])
    if props0 < 0 or props_at + 2 + props0 != size or not bool((props_len == props0).all()):
        return None
    topic_ids = np.full(n, -1, dtype=np.int64)
    if not _one_topic_at_a_stride(
        views, starts + topic_start, topic0, topics, topic_ids, np.arange(n)
    ):
        return None
    ok: BoolArray = topic_ids >= 0
    if props0:
        ok &= views.column("u1", pos + size - 1, size, n) == PROPERTIES_END_BYTE
    if not check_crc:
        return ok, topic_ids
    # The whole-record CRC when the records carry it, else the body CRC (a mix: _checks).
    stored = np.full(n, NO_RECORD_CRC, dtype=np.int64)
    if props0 >= RECORD_CRC_BYTES:
        tails = np.ndarray(
            (n, RECORD_CRC_BYTES),
            dtype=np.uint8,
            buffer=views.view,
            offset=pos + size - RECORD_CRC_BYTES,
            strides=(size, 1),
        )  # a view: no gather
        stored = stored_crcs(tails)
    whole = stored >= 0
    if bool(whole.all()):
        crcs = _range_crcs(views, starts, np.full(n, size - RECORD_CRC_BYTES, dtype=np.int64))
        ok &= (crcs & _CRC_MASK) == stored
    elif bool((stored == NO_RECORD_CRC).all()):
        if body0 > 0:
            crcs = _range_crcs(views, starts + header, np.full(n, body0, dtype=np.int64))
            ok &= (crcs & _CRC_MASK) == prefix["crc"]
    else:
        return None
    return ok, topic_ids


def _range_crcs(views: _Views, first: IntArray, length: IntArray) -> IntArray:
    """crc32 (formats/crc.py) of buf[first[i] : first[i] + length[i]] for every i.

    Ranges (records or bodies) of one length, most of a window usually, are gathered into one
    block and cut into bytes by struct.iter_unpack in C; the rest are memoryview slices. Either
    way it is one crc32 call per range; the block saves the slice objects (~40% of the cost)."""
    crcs = np.empty(len(first), dtype=np.int64)
    count = len(first)
    size = int(length[0])
    stride = int(first[1] - first[0]) if count > 1 else 0
    if (
        stride >= size
        and length.min() == length.max()
        and bool((first[1:] - first[:-1] == stride).all())
    ):
        # Bodies of one size at a fixed stride (records of one size): cut them straight out of
        # the buffer, no gather. The last one apart: its stride may run past the buffer.
        head = int(first[0])
        cut = struct.Struct(f"{size}s{stride - size}x")
        pieces = cut.iter_unpack(views.view[head : head + (count - 1) * stride])
        crcs[:-1] = np.fromiter(map(crc32, map(_FIRST, pieces)), dtype=np.int64, count=count - 1)
        tail = int(first[-1])
        crcs[-1] = crc32(views.view[tail : tail + size])
        return crcs
    if length.min() == length.max():
        groups: list[tuple[int, IntArray]] = [(int(length[0]), np.arange(len(first)))]
        rest: IntArray = np.empty(0, dtype=np.int64)
    else:
        # Indices sorted by body length, cut where the length changes: one group per length.
        order = np.argsort(length, kind="stable")
        ordered = length[order]
        cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
        bounds = np.concatenate(([0], cuts, [len(order)])).tolist()
        groups = []
        small = []
        for lo, hi in itertools.pairwise(bounds):
            if hi - lo >= CRC_BLOCK_GROUP_MIN:
                groups.append((int(ordered[lo]), order[lo:hi]))
            else:
                small.append(order[lo:hi])
        rest = np.concatenate(small) if small else np.empty(0, dtype=np.int64)
    for size, members in groups:
        block = views.rows(first[members], size)
        pieces = struct.Struct(f"{size}s").iter_unpack(block.data)
        crcs[members] = np.fromiter(
            map(crc32, map(_FIRST, pieces)), dtype=np.int64, count=len(members)
        )
    if len(rest):
        view = views.view
        starts = first[rest]
        slices = map(slice, starts.tolist(), (starts + length[rest]).tolist())
        crcs[rest] = np.fromiter(
            map(crc32, map(view.__getitem__, slices)), dtype=np.int64, count=len(rest)
        )
    return crcs


def _topic_ids(
    views: _Views,
    where: IntArray,
    topic_start: IntArray,
    topic_len: IntArray,
    topics: _Topics,
    n: int,
) -> IntArray:
    """The topic id of each candidate in `where` (-1 elsewhere, and for invalid topics). Rows of
    one length are compared with the topics already seen; what is left is sorted into distinct
    rows, each decoded once."""
    ids = np.full(n, -1, dtype=np.int64)
    if not len(where):
        return ids
    lengths = topic_len[where]
    shortest = int(lengths.min())
    distinct = [shortest] if shortest == lengths.max() else np.unique(lengths).tolist()
    for length in distinct:
        members = where[lengths == length]
        if _one_topic_at_a_stride(views, topic_start[members], length, topics, ids, members):
            continue
        rows = views.rows(topic_start[members], length)
        found = np.full(len(members), -1, dtype=np.int64)
        known = topics.by_length.get(length, [])[:TOPIC_COMPARE_MAX]
        for raw in known:
            same = (rows == np.frombuffer(raw, dtype=np.uint8)).all(axis=1)
            found[same] = topics.ids[raw]
        left = np.flatnonzero(found < 0)
        # New topics: the first rows left are usually the whole story (a few topics a window).
        for _ in range(TOPIC_COMPARE_MAX - len(known)):
            if not len(left):
                break
            raw = rows[left[0]].tobytes()
            same = (rows[left] == rows[left[0]]).all(axis=1)
            found[left[same]] = topics.id_of(raw)
            left = left[~same]
        if len(left):
            distinct, inverse = np.unique(rows[left], axis=0, return_inverse=True)
            fresh = np.array([topics.id_of(row.tobytes()) for row in distinct], dtype=np.int64)
            found[left] = fresh[inverse.reshape(-1)]
        valid = np.array([name is not None for name in topics.names], dtype=np.bool_)
        found[~valid[found]] = -1
        ids[members] = found
    return ids


def _one_topic_at_a_stride(
    views: _Views,
    at: IntArray,
    length: int,
    topics: _Topics,
    ids: IntArray,
    members: IntArray,
) -> bool:
    """The common case without a gather: topics at a fixed stride (records of one size), all
    equal to the first. Sets their ids and returns True, or returns False to go the long way."""
    if len(at) < 2:
        return False
    stride = int(at[1] - at[0])
    if stride < length or not bool((at[1:] - at[:-1] == stride).all()):
        return False
    head = int(at[0])
    first = views.u8[head : head + length]
    laid = np.lib.stride_tricks.as_strided(
        views.u8[head:], shape=(len(at), length), strides=(stride, 1), writeable=False
    )
    # Column by column: a 1-D strided compare per topic byte beats one (n, length) compare.
    if not all(bool((laid[:, j] == first[j]).all()) for j in range(length)):
        return False
    topic_id = topics.id_of(first.tobytes())
    ids[members] = topic_id if topics.names[topic_id] is not None else -1
    return True


def _apply_many(
    starts: IntArray,
    prefix: npt.NDArray[np.void],
    accepted: BoolArray,
    topic_ids: IntArray,
    topics: _Topics,
    queue_table: dict[str, dict[int, int]],
    base_offset: int,
    apply_from: int,
) -> None:
    """scan_run's queue-table update for the accepted records at or after `apply_from`: each
    queue's next offset becomes at least its highest queue offset + 1."""
    tx = prefix["sys_flag"] & sysflag.TRANSACTION_MASK
    takes = (tx == sysflag.TRANSACTION_NOT_TYPE) | (tx == sysflag.TRANSACTION_COMMIT_TYPE)
    sel = np.flatnonzero(accepted & takes & (starts + base_offset >= apply_from))
    if not len(sel):
        return
    queue_ids = prefix["queue_id"][sel].astype(np.int64)
    queue_offsets = prefix["queue_offset"][sel].astype(np.int64)
    tids = topic_ids[sel]
    # Highest queue offset per (topic, queue): sort by key then offset, keep each key's last.
    order = np.lexsort((queue_offsets, queue_ids, tids))
    tids, queue_ids, queue_offsets = tids[order], queue_ids[order], queue_offsets[order]
    last = np.ones(len(order), dtype=np.bool_)
    last[:-1] = (tids[1:] != tids[:-1]) | (queue_ids[1:] != queue_ids[:-1])
    for tid, queue_id, offset in zip(
        tids[last].tolist(), queue_ids[last].tolist(), queue_offsets[last].tolist(), strict=True
    ):
        name = topics.names[tid]
        assert name is not None  # accepted records have valid topics
        queues = queue_table.setdefault(name, {})
        if queues.get(queue_id, 0) <= offset:
            queues[queue_id] = offset + 1


__all__ = ["SMALL_RUN_BYTES", "WINDOW_BYTES", "Blank", "scan_run_fast"]
