"""Where the records of a pull or a receive come from: sources tried in turn, one chain for
pulls and one for receives, built once at start-up (RecordSources.build, from main.py).

    ranges (commit-log offset, size): the units a pull or receive serves, a group at a time
        │
        ▼
    SegmentFiles   the commit log's segment files, mapped here (local_reads.py;
        │          --commitlog-dir). Passes when off, a file is missing or a record fails
        │          a check
        ▼
    TailSource     the newest records, as the dispatch frames brought them (tail_records.py).
        │          Pulls only: a Receive is no reader at the tail. Passes when off, nothing
        │          is held or a range is not held
        ▼
    CommitLogRead  commitlog_svc's Read over gRPC: always answers, or raises DataLoss (the Read
        │          said DATA_LOSS) or Unavailable (the log cannot be reached, or said so)
        ▼
    RecordsAnswer  per range its status (READ_OK, READ_OUT_OF_RANGE, READ_CORRUPT) and the
                   records served, back to back in `blob` with their `sizes`

A source answers every range of a group or passes the whole group to the next: an answer never
mixes sources, and what is served is what a Read would serve (the files' records are checked
as a Read checks them; the tail holds what the appends wrote). The servicer then checks that
each record is the one its unit names (RecordsAnswer.names_units, is_unit_record) and builds
its response.

CPU: the chain holds CPU_SECTION (mqstore/cpu_section.py) around the sources' computation only.
What may wait runs outside it: the copies out of the segment files (a page not in memory is a
disk read; every group's copy is made before the first group is checked) and the Read.

The tail's readers: the dispatch frames carry records only while a consumer reads at the tail
(TailSource.wanted), which Follow and long polls report as they wait there.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
import numpy as np
import numpy.typing as npt

from cq_svc import metrics
from cq_svc.local_reads import LocalReads
from cq_svc.settings import CqSettings
from cq_svc.store import UnitColumns
from cq_svc.tail_records import TailRecords
from mqstore.cpu_section import CPU_SECTION
from mqstore.errors import DataLoss, Unavailable, check
from mqstore.formats.cq_unit import Unit
from mqstore.formats.record import RECORD_PREFIX
from mqstore.formats.record_columns import (
    PHYSICAL_OFFSET,
    QUEUE_ID,
    QUEUE_OFFSET,
    check_records,
    split_records,
)
from mqstore.history import LogHistory
from mqstore.rpc.dispatch_codec import history_from_proto
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl_pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as cl_grpc

if TYPE_CHECKING:
    from cq_svc.engine import CqEngine

IntArray = npt.NDArray[np.int64]
Ranges = tuple[IntArray, IntArray]  # commit-log offsets and sizes, one entry a record


@dataclass(slots=True)
class RecordsAnswer:
    """A source's answer for a group of ranges: per range its status, and the records served
    laid end to end in `blob` (`sizes`: each range's size there as int64, 0 where not READ_OK;
    a source that served every range whole gives the column of sizes it was asked with). A
    part of an answer (`parts`) holds a view of the whole answer's bytes, not a copy."""

    statuses: Sequence[int]
    blob: bytes | memoryview
    sizes: IntArray
    # The columns of the source's own check of the records (the segment files'; formats/
    # record_columns.CheckedRecords): names_units reads them rather than check them again.
    columns: IntArray | None = None

    def as_records(self) -> list[bytes]:
        blob = self.blob
        # A part's view copied whole first: the records one by one are wanted only where a
        # record is looked at on its own (a tag filter, a record that failed a check).
        return split_records(blob if type(blob) is bytes else bytes(blob), self.sizes.tolist())

    def parts(self, counts: Sequence[int]) -> list[RecordsAnswer]:
        """The answer cut into consecutive answers of counts[i] ranges each, their records
        views of this answer's (a Follow round's answers go out without another copy)."""
        if len(counts) == 1 and counts[0] == len(self.statuses):
            return [self]  # one pull's group: the answer is its own part (no list copied)
        whole = memoryview(self.blob)
        out = []
        at = 0
        byte_at = 0
        for count in counts:
            sizes = self.sizes[at : at + count]
            end = byte_at + int(sizes.sum())
            columns = None if self.columns is None else self.columns[:, at : at + count]
            out.append(
                RecordsAnswer(self.statuses[at : at + count], whole[byte_at:end], sizes, columns)
            )
            at, byte_at = at + count, end
        return out

    def names_units(self, queue_id: int, units: UnitColumns) -> bool:
        """is_unit_record of every record at once (columns): each was served and is the one
        its unit names. False when any one is not (then each is looked at on its own)."""
        sizes = self.sizes
        if len(sizes) != len(units) or not np.array_equal(sizes, units.size):
            return False
        if not len(sizes):
            return True
        columns = self.columns
        if columns is None:  # the records' framing and fields, their CRCs not again
            checked = check_records(self.blob, units.size, units.phy, bodies=False, check_crc=False)
            if not checked.ok:
                return False
            columns = checked.columns
        return bool(
            (columns[PHYSICAL_OFFSET] == units.phy).all()
            and (columns[QUEUE_ID] == queue_id).all()
            and (columns[QUEUE_OFFSET] == units.queue_offset).all()
        )


def is_unit_record(record: bytes, unit: Unit, queue_id: int) -> bool:
    """The record is the one the unit names (cheap: the fixed head only)."""
    if len(record) != unit.size or len(record) < RECORD_PREFIX.size:
        return False
    total, _, _, qid, _, queue_offset, phy, _ = RECORD_PREFIX.unpack_from(record)
    return bool(
        total == unit.size
        and qid == queue_id
        and queue_offset == unit.queue_offset
        and phy == unit.commit_log_offset
    )


class RecordSource(ABC):
    """A source that answers a group of ranges whole, or passes it (None) to the next one."""

    def copy(self, ranges: Ranges) -> bytes | None:
        """What may wait for the disk, made outside CPU_SECTION before `answer`; None: nothing
        to copy."""
        return None

    @abstractmethod
    def answer(self, ranges: Ranges, copied: bytes | None) -> RecordsAnswer | None:
        """Every range served (READ_OK each), or None: the next source's turn. Called inside
        CPU_SECTION."""


class SegmentFiles(RecordSource):
    """The commit log's segment files (local_reads.py)."""

    def __init__(self, local: LocalReads) -> None:
        self.local = local

    def copy(self, ranges: Ranges) -> bytes | None:
        return self.local.copy(*ranges)

    def answer(self, ranges: Ranges, copied: bytes | None) -> RecordsAnswer | None:
        offsets, sizes = ranges
        got = self.local.check(offsets, sizes, copied)
        if got is None:
            return None
        blob, checked = got
        return RecordsAnswer([cl_pb.READ_OK] * len(offsets), blob, sizes, checked.columns)


class TailSource(RecordSource):
    """The records the dispatch frames brought (tail_records.py), and who reads them: the
    frames need to carry records only while a consumer waits at the tail, or one waited or was
    served from it within `wanted_ms`."""

    def __init__(self, tail: TailRecords, local: LocalReads | None, wanted_ms: int) -> None:
        self.tail = tail
        self._local = local
        self._wanted_s = wanted_ms / 1000.0
        self._lock = threading.Lock()
        self.waiting = 0  # pulls and Follows waiting at a queue's end now
        self._read_at: float | None = None  # when one last waited there or was served here

    def answer(self, ranges: Ranges, copied: bytes | None) -> RecordsAnswer | None:
        tail = self.tail
        if not tail.chunks:
            return None  # off, or nothing held (not a miss: records were not asked for)
        offsets, sizes = ranges
        blob = tail.lookup(offsets, sizes)
        n = len(offsets)
        if blob is None:
            metrics.TAIL_RECORDS.labels("miss").inc(n)
            return None
        metrics.TAIL_RECORDS.labels("hit").inc(n)
        self._read_at = time.monotonic()
        return RecordsAnswer([cl_pb.READ_OK] * n, blob, sizes)

    def count_waiting(self, change: int) -> None:
        with self._lock:
            self.waiting += change
        self._read_at = time.monotonic()

    def wanted(self) -> bool:
        """Whether the dispatch frames should bring records. A consumer far behind reads the
        log, and carrying records nobody reads costs the commit log for nothing (about 1 us a
        100 B message, 2.5 us a 1 KiB one, at peak produce)."""
        if not self.tail.enabled:
            return False
        if self._local is not None and self._local.serving:
            return False  # pulls read the segment files: the frames' records would go unread
        if self.waiting:
            return True
        read_at = self._read_at
        return read_at is not None and time.monotonic() - read_at < self._wanted_s


class CommitLogRead:
    """commitlog_svc's Read: the last source, which always answers (or raises)."""

    def __init__(self, channel: grpc.Channel, engine: CqEngine, timeout_ms: int) -> None:
        self._log = cl_grpc.CommitLogStub(channel)
        self._engine = engine
        self._timeout_s = timeout_ms / 1000.0

    def read(self, ranges: Ranges, context: grpc.ServicerContext) -> RecordsAnswer:
        """The records at the ranges and their read statuses, in one Read."""
        timeout_s = self._timeout_s
        remaining = context.time_remaining()
        if remaining is not None:
            timeout_s = max(0.001, min(timeout_s, remaining))
        offsets, sizes = ranges[0].tolist(), ranges[1].tolist()
        request = cl_pb.ReadRequest(offsets=offsets, sizes=sizes)
        try:
            response = self._log.Read(request, timeout=timeout_s)
        except grpc.RpcError as err:
            code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
            details = err.details() if hasattr(err, "details") else str(err)
            if code is grpc.StatusCode.DATA_LOSS:
                raise DataLoss(f"the commit log's Read failed: {details}") from err
            raise Unavailable(f"the commit log's Read failed: {code.name}: {details}") from err
        n = len(offsets)
        statuses = list(response.statuses)
        served = np.array(response.record_sizes, dtype=np.int64)
        blob = response.records_blob
        check(
            len(statuses) == n and len(served) == n and int(served.sum()) == len(blob),
            f"Read answered {len(statuses)} statuses and a blob of {len(blob)} bytes in "
            f"{len(served)} sizes for {n} ranges",
        )
        return RecordsAnswer(statuses, blob, served)

    def raise_if_cut(self, offset: int) -> None:
        """The commit log refuses the record at `offset`, which a unit points at: damaged, or
        the log was cut since these queues last agreed with it (a restart whose recovery cut
        the tail, appends that regrew it with other records, and this replica's handshake with
        it still to come). Only the second is no damage: Unavailable then, so the consumer
        retries after the handshake instead of taking a new message for a bad one. A rare path:
        it asks the log for its history."""
        try:
            status = self._log.GetStatus(cl_pb.GetStatusRequest(), timeout=self._timeout_s)
        except grpc.RpcError as err:
            raise Unavailable(
                f"the commit log refuses the record at {offset} and its history cannot be asked "
                f"({err.code().name}): a cut log and a damaged record cannot be told apart"
            ) from err
        engine = self._engine
        if status.store_id != engine.store.store_id:
            raise Unavailable("the commit log was replaced since these queues last agreed with it")
        ours = engine.history if len(engine.history) else LogHistory.legacy()
        agreed = history_from_proto(status.history).agreed_offset(ours, offset + 1)
        if agreed <= offset:
            raise Unavailable(
                f"the commit log was cut at {agreed} since these queues last agreed with it; "
                "they agree again at the next handshake"
            )


class SourceChain:
    """Sources tried in order, the commit log's Read last."""

    def __init__(self, sources: Sequence[RecordSource], last: CommitLogRead) -> None:
        self.sources = tuple(sources)
        self.last = last

    def answers(
        self, groups: Sequence[Ranges], context: grpc.ServicerContext
    ) -> Iterator[RecordsAnswer]:
        """Each group's answer in turn, from the first source that serves it whole. Every copy
        is made before the first answer: call outside CPU_SECTION."""
        copies = [[s.copy(ranges) for ranges in groups] for s in self.sources]
        for k, ranges in enumerate(groups):
            with CPU_SECTION:
                answer = next(
                    (
                        got
                        for s, copied in zip(self.sources, copies, strict=True)
                        if (got := s.answer(ranges, copied[k])) is not None
                    ),
                    None,
                )
            yield answer if answer is not None else self.last.read(ranges, context)


@dataclass(frozen=True, slots=True)
class RecordSources:
    """The chains a servicer reads through, and the tail's reader bookkeeping."""

    pulls: SourceChain
    receives: SourceChain
    log: CommitLogRead
    tail: TailSource | None

    @staticmethod
    def build(
        engine: CqEngine,
        settings: CqSettings,
        channel: grpc.Channel,
        *,
        tail: TailRecords | None = None,
        local: LocalReads | None = None,
    ) -> RecordSources:
        files = [SegmentFiles(local)] if local is not None else []
        at_tail = TailSource(tail, local, settings.tail_wanted_ms) if tail is not None else None
        log_read = CommitLogRead(channel, engine, settings.read_timeout_ms)
        return RecordSources(
            pulls=SourceChain([*files, *([at_tail] if at_tail else [])], log_read),
            receives=SourceChain(files, log_read),
            log=log_read,
            tail=at_tail,
        )

    def tail_wanted(self) -> bool:
        return self.tail is not None and self.tail.wanted()

    def count_waiting_at_tail(self, change: int) -> None:
        if self.tail is not None:
            self.tail.count_waiting(change)
