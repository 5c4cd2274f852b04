"""Dispatch frames straight from the segment bytes, column by column.

The reference path is `CommitLog.scan` (a `Record` per message, body copied) then
`mqstore.dispatch.entry_from_record` (a properties dict per message) then `encode_dispatch`:
about 12 us a message. This module produces the same frame (a test pins the two to equal
output, corruption and end-of-file blanks included) with the compiled core's
`dispatch_columns` (formats/_core_dispatch.pxi), which takes the records read_record accepts,
with its checks (the whole-record CRC, or without it the body CRC), and writes their entries
as DispatchBatch wire bytes: TAGS, KEYS and UNIQ_KEY as `property_value` reads them, the keys
apart; topics once per frame. The frame is those pieces put together once, with or without
the keys (`DispatchScan.wire`), so a scan with keys serves subscribers of both kinds.

Where it stops at a record it does not take, `read_record` judges that one record and the same
`skip_non_record` as `CommitLog.scan` steps over it: to the next valid record, reported as a
corrupt range, or to the next file when nothing valid follows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field

from commitlog_svc.append_frames import RunSlice
from commitlog_svc.commitlog import CommitLog, skip_non_record
from commitlog_svc.recovery import CorruptRange
from mqstore.errors import InvariantViolation, OutOfRange
from mqstore.formats._core import (
    DISPATCH_RECORD,
    dispatch_columns,
    dispatch_frame,
    dispatch_of_runs,
    dispatch_tail,
)
from mqstore.formats.record import Record, read_record
from mqstore.storage.mapped_file import MappedFile


@dataclass(frozen=True, slots=True)
class DispatchScan:
    """A scanned frame in wire pieces (DispatchBatch fields): `columns` the entries' int
    columns then the offsets, topics and corrupt ranges; `keys` their KEYS and UNIQ_KEY values
    (empty when scanned without). One scan gives the frame with keys and the frame without."""

    columns: tuple[bytes, ...]
    keys: tuple[bytes, ...]
    next_offset: int
    entries: int
    corrupt: list[CorruptRange]

    def wire(self, include_keys: bool) -> bytes:
        """The frame as SubscribeResponse wire bytes, ready to send."""
        return dispatch_frame(self.columns + self.keys if include_keys else self.columns)

    @property
    def nbytes(self) -> int:
        """The bytes the pieces hold."""
        return sum(map(len, self.columns)) + sum(map(len, self.keys))


@dataclass(frozen=True, slots=True)
class WireFrame:
    """A dispatch frame as the SubscribeResponse wire bytes the stream sends as they are
    (rpc/admission.py passes bytes through), and what the stream needs to know of it."""

    wire: bytes
    next_offset: int
    entries: int


def frame_of_runs(
    slices: Sequence[RunSlice], include_keys: bool, records_bytes_max: int = 0
) -> WireFrame:
    """The frame of entries held from the appends (append_frames.py): the same columns a scan
    of their records gives, the whole SubscribeResponse written by the compiled core's
    dispatch_of_runs in one call. Its next_offset is where the subscriber goes on.
    `records_bytes_max` > 0: with the records the appends wrote, when every slice still holds
    them and they take at most that many bytes (else none: a frame must stay under the gRPC
    message limit)."""
    first, last = slices[0], slices[-1]
    start_offset = first.run.offsets[first.lo]
    next_offset = last.run.end if last.hi == len(last.run.offsets) else last.run.offsets[last.hi]
    records: list[bytes] = []
    if records_bytes_max > 0:
        for piece in slices:
            got = piece.run.records_of(piece.lo, piece.hi)
            if got is None:
                records = []  # dropped to bound memory: the subscriber reads them when asked
                break
            records.append(got)
        if sum(map(len, records)) > records_bytes_max:
            records = []
    wire = dispatch_of_runs(slices, include_keys, start_offset, next_offset, records)
    return WireFrame(wire, next_offset, sum(s.hi - s.lo for s in slices))


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
    walk = _Walk(include_keys, max_records, max_bytes, on_corrupt)
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
    tail = dispatch_tail(
        from_offset,
        offset,
        walk.topics,
        [c.start_offset for c in walk.corrupt],
        [c.end_offset for c in walk.corrupt],
    )
    return DispatchScan((*walk.columns, tail), tuple(walk.keys), offset, walk.entries, walk.corrupt)


@dataclass(slots=True)
class _Walk:
    """One frame's walk over the files it spans, its entries' wire pieces kept in order."""

    include_keys: bool
    max_records: int
    max_bytes: int
    on_corrupt: Callable[[CorruptRange], None] | None
    entries: int = 0
    taken: int = 0  # record bytes
    columns: list[bytes] = dataclass_field(default_factory=list)
    keys: list[bytes] = dataclass_field(default_factory=list)
    topic_index: dict[bytes, int] = dataclass_field(default_factory=dict)
    topics: list[str] = dataclass_field(default_factory=list)
    corrupt: list[CorruptRange] = dataclass_field(default_factory=list)

    def file(self, mf: MappedFile, offset: int, end: int) -> int:
        """Walk `mf` from `offset` up to `end` at most: where the walk goes on."""
        base = mf.file_from_offset
        readable = mf.wrote_position
        limit = min(readable, end - base)
        pos = offset - base
        while pos < limit and self.entries < self.max_records and self.taken < self.max_bytes:
            why, pos, taken, entries, columns, keys = dispatch_columns(
                mf.buf,
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
            if entries:
                self.columns.append(columns)
                if keys:
                    self.keys.append(keys)
            self.entries += entries
            self.taken += taken
            if why != DISPATCH_RECORD:
                break  # the limit, a bound, or a record past the limit (the next call's)
            found = read_record(mf.buf, pos, readable, check_crc=True, expected_offset=base + pos)
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
