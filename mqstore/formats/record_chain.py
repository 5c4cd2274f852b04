"""Where the records of a run start: the chain of TOTALSIZE fields, followed without a Python
step per record (pure: no I/O).

    pos                                                              end
    | record 0 | record 1 | record 2 | ...             | record k-1 | rec|ord k (past end)
    ^ a record boundary                                             ^ where the chain stops

From a known record boundary `pos`, record i + 1 starts where record i ends (TOTALSIZE). Only
the framing is followed: TOTALSIZE, the magic code and the PHYSICALOFFSET field, which must
equal the record's own commit-log offset (record.py). Nothing else of a record is checked here
(no CRC): this finds boundaries, `read_record` / `record_walk.scan_run_fast` judge records.

How, per call (records starting in [pos, end) that also end by `end`):

1. A run of records of one size (fixed-size messages, the common case): the positions
   pos + k * size are tested at once through a strided view (TOTALSIZE, magic, own offset);
   also after one record of another size (an idempotent request's first, with its tag).
2. Otherwise the candidates: every p where a record magic sits at p + 4 and the PHYSICALOFFSET
   field at p + 28 holds p's own offset. Every boundary of the chain is a candidate. When each
   candidate ends where the next begins, the candidates are the chain. A candidate inside a
   body (it needs both the magic and its exact own offset there: never by chance, but a
   producer may write one) breaks that; the chain is then followed candidate to candidate,
   skipping those inside the record before them, a Python step per break only.

The chain stops at `end`, at the end-of-file blank (not a record: the caller decides), or where
the bytes do not frame a record (a damaged record: the caller's own check names it).

Used by the leader of a replicated log to cut a chunk at a record boundary, and by a follower
to find the records of a chunk whose properties it must read (commitlog_svc/replica_chunk.py).
"""

from __future__ import annotations

import struct
from typing import Final

import numpy as np
import numpy.typing as npt

from mqstore.errors import check
from mqstore.formats.record import (
    MAGIC_V1,
    MAGIC_V2,
    PHYSICAL_OFFSET_POS,
    RECORD_BYTES_MIN,
    SIZE_MAGIC,
    Buffer,
)
from mqstore.formats.record_columns import PREFIX_DTYPE

IntArray = npt.NDArray[np.int64]

# Below this many bytes the per-record walk costs less than setting up the arrays (about ten
# records of a 100-byte body).
SMALL_RUN_BYTES: Final = 2048
# The arrays of one step cover this much of the buffer at most (a few MB of arrays).
WINDOW_BYTES: Final = 16 << 20
# A run of equal-sized records is taken through the strided view when at least this long;
# shorter runs (mixed sizes) go through the candidates, all at once.
STRIDE_RUN_MIN: Final = 16
# After this many breaks in the candidates' chain (candidates inside bodies), the rest is
# walked record by record: a body full of fake headers costs no more than that walk.
CHAIN_BREAKS_MAX: Final = 64

_MAGIC_FIRST_BYTE: Final = 0xDA
assert (MAGIC_V1 >> 24) & 0xFF == (MAGIC_V2 >> 24) & 0xFF == _MAGIC_FIRST_BYTE
_FRAME = np.dtype(PREFIX_DTYPE.descr[:2])  # TOTALSIZE, MAGICCODE
_I64 = struct.Struct(">q")
_FRAME_BYTES: Final = PHYSICAL_OFFSET_POS + 8  # a candidate's framing fields end here


def record_starts(buf: Buffer, pos: int, end: int, base_offset: int) -> tuple[IntArray, int]:
    """(the starts of the chain of records from `pos` (a record boundary) whose records end by
    `end`, where the chain stops: the end of its last record, or `pos` when none fits).
    `buf[0]` sits at commit-log offset `base_offset`; `end` <= len(buf)."""
    view = memoryview(buf)
    check(0 <= pos <= end <= len(view), f"range [{pos}, {end}) outside a {len(view)}-byte buffer")
    out: list[IntArray] = []
    try:
        while _frames_record(view, pos, end, base_offset):
            # A window at a time (bounded arrays), the record at `pos` always whole in it.
            first = SIZE_MAGIC.unpack_from(view, pos)[0]
            window_end = min(end, pos + max(WINDOW_BYTES, first))
            if window_end - pos < SMALL_RUN_BYTES:
                starts, stop = _walk(view, pos, window_end, base_offset)
            else:
                starts, stop = _stride(view, pos, window_end, base_offset)
                if len(starts) < STRIDE_RUN_MIN:
                    starts, stop = _odd_then_stride(view, pos, first, window_end, base_offset)
                if len(starts) < STRIDE_RUN_MIN:
                    starts, stop = _candidates(view, pos, window_end, base_offset)
            out.append(starts)
            pos = stop
    finally:
        view.release()
    starts = np.concatenate(out) if out else np.empty(0, dtype=np.int64)
    return starts, pos


def _frames_record(view: memoryview, pos: int, end: int, base_offset: int) -> bool:
    """A record's framing at `pos`, the record whole by `end`."""
    if end - pos < RECORD_BYTES_MIN:
        return False
    total, magic = SIZE_MAGIC.unpack_from(view, pos)
    return (
        magic in (MAGIC_V1, MAGIC_V2)
        and RECORD_BYTES_MIN <= total <= end - pos
        and _I64.unpack_from(view, pos + PHYSICAL_OFFSET_POS)[0] == base_offset + pos
    )


def _walk(view: memoryview, pos: int, end: int, base_offset: int) -> tuple[IntArray, int]:
    """The reference: one record at a time (small runs, and chains broken too often)."""
    starts = []
    while _frames_record(view, pos, end, base_offset):
        starts.append(pos)
        pos += SIZE_MAGIC.unpack_from(view, pos)[0]
    return np.asarray(starts, dtype=np.int64), pos


def _stride(view: memoryview, pos: int, end: int, base_offset: int) -> tuple[IntArray, int]:
    """Records of the first one's size at a fixed stride from `pos`, tested at once."""
    size = SIZE_MAGIC.unpack_from(view, pos)[0]
    n = (end - pos) // size
    frames = np.ndarray((n,), dtype=_FRAME, buffer=view, offset=pos, strides=(size,))
    own = np.ndarray(
        (n,), dtype=">i8", buffer=view, offset=pos + PHYSICAL_OFFSET_POS, strides=(size,)
    )
    starts = pos + np.arange(n, dtype=np.int64) * size
    magic = frames["magic"]
    fits = (
        (frames["total"] == size)
        & ((magic == MAGIC_V1) | (magic == MAGIC_V2))
        & (own == starts + base_offset)
    )
    del frames, own, magic
    run = n if bool(fits.all()) else int(np.argmin(fits))
    return starts[:run], pos + run * size


def _odd_then_stride(
    view: memoryview, pos: int, first: int, end: int, base_offset: int
) -> tuple[IntArray, int]:
    """One record of its own size, then a run of equal ones from the next (an idempotent
    request: its first record carries the MQS_PSEQ tag, the others are alike)."""
    after = pos + first
    if not _frames_record(view, after, end, base_offset):
        return np.empty(0, dtype=np.int64), pos
    run, stop = _stride(view, after, end, base_offset)
    return np.concatenate(([pos], run)).astype(np.int64), stop


def _candidates(view: memoryview, pos: int, end: int, base_offset: int) -> tuple[IntArray, int]:
    """The chain from `pos` through the candidates in [pos, end) (see the module docstring);
    the record at `pos` frames one (the caller checked)."""
    last = end - _FRAME_BYTES  # a candidate's framing fields lie before `end`
    u8 = np.frombuffer(view, dtype=np.uint8, count=end)
    at = np.flatnonzero(u8[pos + 4 : last + 5] == _MAGIC_FIRST_BYTE) + (pos + 4)
    del u8
    magic = _gather(view, at, ">i4")
    at = at[(magic == MAGIC_V1) | (magic == MAGIC_V2)] - 4
    starts = at[_gather(view, at + PHYSICAL_OFFSET_POS, ">i8") == at + base_offset]
    ends = starts + _gather(view, starts, ">i4")
    ok = (ends - starts >= RECORD_BYTES_MIN) & (ends <= end)
    good = ok.copy()
    good[:-1] &= ends[:-1] == starts[1:]
    good[-1] = False  # the last candidate chains to nothing here
    breaks = np.flatnonzero(~good)
    pieces: list[IntArray] = []
    k = 0  # starts[0] == pos: the caller checked that a record frames there
    for _ in range(CHAIN_BREAKS_MAX):
        b = int(breaks[np.searchsorted(breaks, k)])
        if not ok[b]:
            pieces.append(starts[k:b])
            return np.concatenate(pieces), int(starts[b])
        pieces.append(starts[k : b + 1])
        nxt = int(ends[b])
        j = int(np.searchsorted(starts, nxt))
        if j == len(starts) or starts[j] != nxt or not ok[j]:
            return np.concatenate(pieces), nxt
        k = j  # candidates inside record b's body were skipped
    rest, stop = _walk(view, int(starts[k]), end, base_offset)
    pieces.append(rest)
    return np.concatenate(pieces), stop


def _gather(view: memoryview, at: IntArray, dtype: str) -> IntArray:
    """The big-endian integers of `dtype` at each position of `at` (all inside the view)."""
    width = np.dtype(dtype).itemsize
    items = np.ndarray((len(view) - width + 1,), dtype=dtype, buffer=view, strides=(1,))
    try:
        return items[at].astype(np.int64)
    finally:
        del items
