"""Dispatch frames straight from the segment bytes, column by column.

The reference path is `CommitLog.scan` (a `Record` per message, body copied) then
`mqstore.dispatch.entry_from_record` (a properties dict per message) then `encode_dispatch`:
about 12 us a message. This module produces the same frame (a test pins the two to equal
output, corruption and end-of-file blanks included) with the compiled core's
`dispatch_columns` (formats/_core_dispatch.pxi), which takes the records read_record accepts,
with its checks (the whole-record CRC, or without it the body CRC), and writes their entries
as DispatchBatch wire bytes the frame merges: TAGS, KEYS and UNIQ_KEY as `property_value`
reads them; topics once per frame.

Where it stops at a record it does not take, `read_record` judges that one record and the same
`skip_non_record` as `CommitLog.scan` steps over it: to the next valid record, reported as a
corrupt range, or to the next file when nothing valid follows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field

from commitlog_svc.append_frames import FRAME_ENTRY_BYTES, RunSlice
from commitlog_svc.commitlog import CommitLog, skip_non_record
from commitlog_svc.recovery import CorruptRange
from mqstore.errors import InvariantViolation, OutOfRange
from mqstore.formats._core import DISPATCH_RECORD, dispatch_columns, dispatch_of_runs
from mqstore.formats.record import Record, read_record
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.storage.mapped_file import MappedFile


@dataclass(slots=True)
class DispatchScan:
    response: pb.SubscribeResponse  # the frame, ready to send
    next_offset: int
    entries: int
    corrupt: list[CorruptRange]
    nbytes: int  # about what the frame takes in memory (its record bytes' metadata)

    @property
    def frame(self) -> pb.DispatchBatch:
        return self.response.batch


# SubscribeResponse's `batch` (field 2, length-delimited): the key a held frame's wire
# bytes start with.
_BATCH_FIELD_KEY = bytes([2 << 3 | 2])


@dataclass(frozen=True, slots=True)
class HeldFrame:
    """A frame of held entries as the SubscribeResponse wire bytes the stream sends as they
    are (rpc/admission.py passes bytes through), and what the stream needs to know of it."""

    wire: bytes
    next_offset: int
    entries: int


def frame_of_runs(
    slices: Sequence[RunSlice], include_keys: bool, records_bytes_max: int = 0
) -> HeldFrame:
    """The frame of entries held from the appends (append_frames.py): the same columns a scan
    of their records gives, written as DispatchBatch wire bytes by the compiled core's
    dispatch_of_runs in one call, the offsets, topics and records after them (a message's
    fields may come in any order, a repeated one in pieces). Its next_offset is where the
    subscriber goes on. `records_bytes_max` > 0: with the records the appends wrote, when
    every slice still holds them and they take at most that many bytes (else none: a frame
    must stay under the gRPC message limit)."""
    first, last = slices[0], slices[-1]
    tail = pb.DispatchBatch(start_offset=first.run.offsets[first.lo])
    if last.hi == len(last.run.offsets):
        tail.next_offset = last.run.end
    else:
        tail.next_offset = last.run.offsets[last.hi]
    topics: dict[str, int] = {}  # the frame's, in order of first use
    columns = dispatch_of_runs(slices, topics, include_keys)
    tail.topics.extend(topics)
    if records_bytes_max > 0:
        pieces: list[bytes] = []
        for piece in slices:
            got = piece.run.records_of(piece.lo, piece.hi)
            if got is None:
                break  # dropped to bound memory: the subscriber reads them when asked
            pieces.append(got)
        else:
            if sum(map(len, pieces)) <= records_bytes_max:
                tail.records = pieces[0] if len(pieces) == 1 else b"".join(pieces)
    rest = tail.SerializeToString()
    wire = b"".join((_BATCH_FIELD_KEY, _varint(len(columns) + len(rest)), columns, rest))
    return HeldFrame(wire, tail.next_offset, sum(s.hi - s.lo for s in slices))


def _varint(value: int) -> bytes:
    """`value` (>= 0) as a protobuf varint: seven bits a byte, low bits first."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def scan_dispatch(
    log: CommitLog,
    from_offset: int,
    *,
    max_records: int,
    max_bytes: int,
    include_keys: bool,
    on_corrupt: Callable[[CorruptRange], None] | None = None,
) -> DispatchScan:
    """The dispatch frame for the records from `from_offset` (a record boundary) up to the
    confirm offset, at most `max_records` / about `max_bytes` (as CommitLog.scan)."""
    end = log.confirm_offset
    if from_offset < log.min_offset:
        raise OutOfRange(f"offset {from_offset} is below the log's minimum {log.min_offset}")
    # The response is built in place: a DispatchBatch built first and then put into a
    # SubscribeResponse is copied (9.5% of the commit log's time under load).
    response = pb.SubscribeResponse()
    batch = response.batch
    walk = _Walk(batch, include_keys, max_records, max_bytes, on_corrupt)
    offset = from_offset
    while offset < end and walk.entries < max_records and walk.taken < max_bytes:
        mf = log.queue.find_mapped_file_by_offset(offset)
        if mf is None or not mf.hold():
            break
        try:
            reached = walk.file(mf, offset, end)
        finally:
            mf.release()
        if reached == offset:
            break
        offset = reached
    batch.start_offset = from_offset
    batch.next_offset = offset
    batch.topics.extend(walk.topics)
    if walk.corrupt:
        batch.corrupt_starts.extend(c.start_offset for c in walk.corrupt)
        batch.corrupt_ends.extend(c.end_offset for c in walk.corrupt)
    return DispatchScan(
        response,
        offset,
        walk.entries,
        walk.corrupt,
        walk.entries * FRAME_ENTRY_BYTES + walk.key_chars,
    )


@dataclass(slots=True)
class _Walk:
    """One frame's walk over the files it spans, its entries merged into `batch`."""

    batch: pb.DispatchBatch
    include_keys: bool
    max_records: int
    max_bytes: int
    on_corrupt: Callable[[CorruptRange], None] | None
    entries: int = 0
    taken: int = 0  # record bytes
    key_chars: int = 0
    topic_index: dict[bytes, int] = dataclass_field(default_factory=dict)
    topics: list[str] = dataclass_field(default_factory=list)
    corrupt: list[CorruptRange] = dataclass_field(default_factory=list)

    def file(self, mf: MappedFile, offset: int, end: int) -> int:
        """Walk `mf` from `offset` up to `end` at most: where the walk goes on."""
        base = mf.file_from_offset
        readable = mf.read_position
        limit = min(readable, end - base)
        pos = offset - base
        while pos < limit and self.entries < self.max_records and self.taken < self.max_bytes:
            why, pos, taken, entries, key_chars, frame = dispatch_columns(
                mf.read_buf,
                pos,
                limit,
                readable,
                base,
                self.topic_index,
                self.topics,
                self.include_keys,
                self.max_records - self.entries,
                self.max_bytes - self.taken,
            )
            self.batch.MergeFromString(frame)
            self.entries += entries
            self.taken += taken
            self.key_chars += key_chars
            if why != DISPATCH_RECORD:
                break  # the limit, a bound, or a record past the limit (the next call's)
            found = read_record(
                mf.read_buf, pos, readable, check_crc=True, expected_offset=base + pos
            )
            if isinstance(found, Record):  # the two disagree: a bug in the compiled core
                raise InvariantViolation(f"dispatch_columns refused the record at {base + pos}")
            corrupt, pos = skip_non_record(mf, pos, readable, found)
            if corrupt is not None:
                self.corrupt.append(corrupt)
                if self.on_corrupt is not None:
                    self.on_corrupt(corrupt)
        if pos >= mf.file_size:
            return mf.file_end_offset
        return base + pos
