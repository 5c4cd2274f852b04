"""A chunk of a replicated commit log: what the leader sends a follower, and the follower's
checks of it. Pure: buffers in, results out, no files (replica.py does the I/O).

    offset                                               next_offset
    | record | record | ... | record | blank(8) |  zeros ...  |   the blank only at a segment's
    +----------------- data ------------------+                 end; next_offset is then the
                                                                 next segment's start

A chunk is raw bytes of the leader's log at `offset`, in one segment: whole records only, and
possibly the 8-byte end-of-segment blank (the leader's zeros after it are not sent: a follower's
segment is zeros there too, so the files stay byte-identical). Its `epochs` are the entries of
the leader's history covering [offset, next_offset], so that a follower adopts each epoch
before the bytes it wrote become visible.

Rules the leader keeps when it cuts a chunk (chunk_end):

    the range left [offset, limit)          the chunk
    fits max_bytes, limit in this segment   all of it, without a walk (the limit, the written
                                            or flushed end, is always a record boundary)
    longer than max_bytes                   the records whose chain ends by offset + max_bytes
                                            (_core.chain: no Python step per record)
    ... ends inside an idempotent request   cut where the request begins; or, when it begins
                                            the chunk, extended to its end: a follower never
                                            holds part of a request (producers.py: a promoted
                                            follower would store its retry's messages twice)
    reaches this segment's blank            the blank's 8 bytes too; next_offset moves on
    a first record longer than max_bytes    that record alone (max_bytes is soft by one record)
    a record whose framing is damaged       CorruptRecord (DATA_LOSS): no follower can copy it

The follower's check (check_chunk) is recovery's: scan_run_fast over the chunk with the CRCs
(the whole-record CRC where a record carries it, else the body CRC), every record's
PHYSICALOFFSET equal to where it lands, and a blank only last, sized to the segment's end;
and no idempotent request may run past the chunk's end.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass, field
from typing import Final

from commitlog_svc.producers import TAG_PREFIX, Tag, decode_tag
from mqstore.errors import ChunkRefused, CorruptRecord
from mqstore.formats import _core
from mqstore.formats.commitlog_checkpoint import ProducerEntry, ProducerRequest, QueueKey
from mqstore.formats.properties import PRODUCER_SEQ
from mqstore.formats.record import (
    BLANK_MAGIC,
    END_FILE_MIN_BLANK_BYTES,
    Bad,
    Blank,
    Buffer,
    Record,
    Searchable,
    read_record,
)
from mqstore.formats.record_batch import QueueTable
from mqstore.formats.record_columns import scan_run_fast
from mqstore.history import Epoch, LogHistory

# What a chunk holds at most by default: 1 MiB is ~4,000 records of a 100-byte body, enough to
# spread a gRPC call's fixed cost and small enough for gRPC's default 4 MiB
# message limit with room for one whole record of the largest size.
CHUNK_BYTES_MAX: Final = 1 << 20

_BLANK = struct.Struct(">ii")
_I32 = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class Chunk:
    """Bytes of the leader's log at `offset` (see the module docstring)."""

    offset: int
    data: bytes
    next_offset: int
    epochs: tuple[Epoch, ...] = ()


@dataclass(frozen=True, slots=True)
class LogStart:
    """Where a follower with nothing of the leader's log begins (the leader's first segment),
    and the leader's tables at the moment it was taken: the follower starts from them, and
    after copying up to `taken_at` its tables equal the leader's (each queue's next offset is
    the highest of the snapshot's and its records'; producers' requests are re-applied)."""

    offset: int
    taken_at: int
    queue_offsets: dict[QueueKey, int] = field(default_factory=dict)
    producers: list[ProducerEntry] = field(default_factory=list)


def epochs_covering(history: LogHistory, start: int, end: int) -> tuple[Epoch, ...]:
    """The entries of `history` that cover bytes in [start, end], or begin at `end`."""
    starts = history.starts
    first = max(bisect.bisect_right(starts, start) - 1, 0)
    last = bisect.bisect_right(starts, end)
    return tuple(
        Epoch(e, s) for e, s in zip(history.epochs[first:last], starts[first:last], strict=True)
    )


# -- the leader's cut ---------------------------------------------------------------------------


def is_blank_at(buf: Buffer, pos: int, file_size: int) -> bool:
    """The end-of-segment blank starts at `pos` (its size is the rest of the segment)."""
    if file_size - pos < END_FILE_MIN_BLANK_BYTES:
        return False
    total, magic = _BLANK.unpack_from(buf, pos)
    return bool(magic == BLANK_MAGIC and total == file_size - pos)


def chunk_end(
    buf: Searchable,
    pos: int,
    data_end: int,
    base_offset: int,
    file_size: int,
    max_bytes: int,
    *,
    closed: bool,
) -> tuple[int, bool]:
    """Where a chunk from `pos` ends in one segment, and whether it ends with the blank.
    `data_end`: the position of the limit in the segment (a record boundary), or the segment's
    size when the segment is `closed` (full: its records end with the blank)."""
    if not closed and data_end - pos <= max_bytes:
        return data_end, False
    if closed and is_blank_at(buf, pos, file_size):
        return pos + END_FILE_MIN_BLANK_BYTES, True
    bound = min(data_end, pos + max_bytes)
    starts, stop = _core.chain(buf, pos, bound, base_offset)
    if stop == pos:  # the first record is longer than max_bytes: it goes alone
        (size,) = _I32.unpack_from(buf, pos)
        starts, stop = _core.chain(buf, pos, min(data_end, pos + max(size, 0)), base_offset)
        if stop == pos:
            raise CorruptRecord(
                base_offset + pos, "no record frames there: no follower can copy it"
            )
    if stop < data_end:
        stop = _request_aligned(buf, pos, stop, data_end, base_offset, starts)
    blank_fits = stop + END_FILE_MIN_BLANK_BYTES - pos <= max_bytes
    if closed and blank_fits and is_blank_at(buf, stop, file_size):
        return stop + END_FILE_MIN_BLANK_BYTES, True
    return stop, False


def _request_aligned(
    buf: Searchable, pos: int, stop: int, data_end: int, base_offset: int, starts: memoryview
) -> int:
    """`stop`, unless it falls inside an idempotent request (its records follow the one tagged
    MQS_PSEQ): then where the request begins, or its end when it begins at `pos`. Only the last
    tagged record before `stop` can begin such a request (a request is one write)."""
    hi = stop
    while True:
        hit = buf.rfind(TAG_PREFIX, pos, hi)
        if hit < 0:
            return stop
        k = bisect.bisect_right(starts, hit) - 1
        first = int(starts[k])
        tag = _tag_at(buf, first, stop, check_crc=False)
        if tag is None:
            hi = first  # a body holding the key's bytes, not a tag: look before this record
            continue
        stored = tag.count - len(tag.refused)
        if k + stored <= len(starts):
            return stop  # the request ends by `stop`
        if first > pos:
            return first
        # The request begins the chunk: all of it goes (it lies in one segment).
        return _records_end(buf, first, stored, data_end, base_offset, stop - first)


def _tag_at(buf: Searchable, pos: int, end: int, *, check_crc: bool) -> Tag | None:
    """The MQS_PSEQ tag of the record at `pos`; None when it has none, or it does not parse."""
    found = read_record(buf, pos, end, check_crc=check_crc)
    if not isinstance(found, Record):
        return None
    return decode_tag(found.properties_dict().get(PRODUCER_SEQ, ""))


def _records_end(
    buf: Searchable, first: int, count: int, data_end: int, base_offset: int, guess: int
) -> int:
    """The end of `count` records chained from `first` (at most `data_end`), found a window
    at a time, the first twice `guess` long."""
    window = max(2 * guess, 1 << 16)
    while True:
        hi = min(data_end, first + window)
        starts, stop = _core.chain(buf, first, hi, base_offset)
        if len(starts) > count:
            return int(starts[count])
        if len(starts) == count or hi == data_end:
            return stop
        window *= 2


# -- the follower's check -----------------------------------------------------------------------


@dataclass(slots=True)
class CheckedChunk:
    """What a chunk holds, once it passed every check."""

    next_offset: int  # the follower's end once it is stored
    blank: bool
    queue_offsets: QueueTable  # each queue's next offset as its records raise it
    # The idempotent requests of its records, in log order: (producer id, request).
    requests: list[tuple[str, ProducerRequest]]


def check_chunk(data: bytes, offset: int, file_bytes: int) -> CheckedChunk:
    """Every check recovery makes of each record in `data`, to be stored at `offset`: raises
    ChunkRefused naming the first failure, else what the chunk holds."""
    pos_in_file = offset % file_bytes
    if pos_in_file + len(data) > file_bytes:
        raise ChunkRefused(
            offset,
            f"{len(data)} bytes run past the segment's end at {offset - pos_in_file + file_bytes}",
        )
    table: QueueTable = {}
    end, _, stop = scan_run_fast(data, 0, len(data), offset, check_crc=True, queue_table=table)
    blank = False
    if isinstance(stop, Blank):
        left = file_bytes - (pos_in_file + end)
        if stop.total_size != left:
            raise ChunkRefused(
                offset + end, f"a blank of {stop.total_size} bytes with {left} left in the segment"
            )
        if end + END_FILE_MIN_BLANK_BYTES != len(data):
            raise ChunkRefused(offset + end, "bytes after the end-of-segment blank")
        blank = True
    elif isinstance(stop, Bad):
        raise ChunkRefused(offset + end, stop.reason)
    requests, partial, _ = tagged_requests(data, 0, end, offset)
    if partial >= 0:
        raise ChunkRefused(
            partial,
            "the records of the idempotent request beginning here run past the chunk's end "
            "(a chunk ends between requests)",
        )
    return CheckedChunk(
        next_offset=offset - pos_in_file + file_bytes if blank else offset + len(data),
        blank=blank,
        queue_offsets=table,
        requests=requests,
    )


def tagged_requests(
    buf: Searchable, pos: int, end: int, base_offset: int, *, check_crc: bool = False
) -> tuple[list[tuple[str, ProducerRequest]], int, int]:
    """The idempotent requests among the records chained from buf[pos] up to `end` (buf[0] at
    commit-log offset `base_offset`): each the tagged record, then its `stored` records, in log
    order; where one begins whose records go on past the chain (-1: none); and where the chain
    stops (`end` when no tag lies in [pos, end): nothing to follow). With `check_crc` a tagged
    record failing its CRC is no request (recovery's rule, producer_recovery.py). A C-speed
    search finds the tags; only their records are read."""
    out: list[tuple[str, ProducerRequest]] = []
    hit = buf.find(TAG_PREFIX, pos, end)
    if hit < 0:
        return out, -1, end
    starts, stop = _core.chain(buf, pos, end, base_offset)
    count = len(starts)
    while 0 <= hit < stop:
        k = bisect.bisect_right(starts, hit) - 1
        first = int(starts[k])
        after = int(starts[k + 1]) if k + 1 < count else stop
        tag = _tag_at(buf, first, stop, check_crc=check_crc)
        if tag is not None:
            last = k + tag.count - len(tag.refused)
            if last > count:
                return out, base_offset + first, stop
            request_end = int(starts[last]) if last < count else stop
            request = ProducerRequest(
                tag.sequence, tag.count, base_offset + first, base_offset + request_end, tag.refused
            )
            out.append((tag.producer_id, request))
        hit = buf.find(TAG_PREFIX, after, end)
    return out, -1, stop
