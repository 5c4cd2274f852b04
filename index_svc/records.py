"""Candidate records read back from commitlog_svc, for confirmation: one Read per call.

The index stores commit-log offsets but no sizes (RocketMQ's 20-byte entry has none), so every
range asks for size WHOLE_RECORD (0): the whole record that starts at the offset, its size read
from its TOTALSIZE field, as RocketMQ's queryMessage reads each candidate back. What the answer
holds per offset:

    READ_OK            decoded here again (the whole-record CRC, or a record without it its
                       body CRC, and PHYSICALOFFSET == offset): kept; bytes that do not decode
                       are counted and logged as corrupt, never served
    READ_OUT_OF_RANGE  expired below the log's minimum (or not there): dropped
    READ_CORRUPT       the commit log found the record damaged: counted, logged, never served

A query answers with what it could confirm; a damaged candidate does not fail it. A failed Read
(commit log away, the caller's deadline spent) fails the query with UNAVAILABLE. An answer over
the message limit (RESOURCE_EXHAUSTED: many large bodies) is read again in halves.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from index_svc import metrics
from mqstore.errors import Unavailable, check
from mqstore.formats.record import Record, read_record
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as pb_grpc
from mqstore.rpc.gen.common.v1 import common_pb2
from mqstore.rpc.messages import record_to_message

log = logging.getLogger(__name__)

WHOLE_RECORD = 0
# Codes of a call that failed for reasons of the moment: the query answers UNAVAILABLE and the
# client may retry. Anything else is a bug on one side and is answered INTERNAL.
_TRANSIENT = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
)


@dataclass(frozen=True, slots=True)
class FetchedRecord:
    """A candidate's message, with the fields confirmation reads (confirm.KeyedRecord)."""

    message: common_pb2.Message

    @property
    def topic(self) -> str:
        return self.message.topic

    @property
    def keys(self) -> str:
        return self.message.keys

    @property
    def uniq_key(self) -> str:
        return self.message.uniq_key

    @property
    def store_timestamp_ms(self) -> int:
        return self.message.store_timestamp_ms


@dataclass
class ReadOutcome:
    records: dict[int, FetchedRecord] = field(default_factory=dict)
    expired: list[int] = field(default_factory=list)
    corrupt: list[int] = field(default_factory=list)


def _code(err: grpc.RpcError) -> grpc.StatusCode | None:
    return err.code() if isinstance(err, grpc.Call) else None


def _unavailable(what: str, err: grpc.RpcError) -> Unavailable:
    code = _code(err)
    return Unavailable(f"{what} failed: {code.name if code is not None else err}")


class CommitLogReader:
    def __init__(self, channel: grpc.Channel) -> None:
        self._stub = pb_grpc.CommitLogStub(channel)

    def read(self, offsets: Sequence[int], timeout_s: float) -> ReadOutcome:
        """The records at `offsets` (one Read), by offset; see the module docstring."""
        out = ReadOutcome()
        if offsets:
            self._read_into(list(offsets), [WHOLE_RECORD] * len(offsets), timeout_s, out)
        return self._counted(out)

    def read_ranges(
        self, offsets: Sequence[int], sizes: Sequence[int], timeout_s: float
    ) -> ReadOutcome:
        """The records of (offset, size) ranges whose sizes are known (tools, tests): one Read,
        answered as `read` answers."""
        out = ReadOutcome()
        if offsets:
            self._read_into(list(offsets), list(sizes), timeout_s, out)
        return self._counted(out)

    @staticmethod
    def _counted(out: ReadOutcome) -> ReadOutcome:
        metrics.EXPIRED.inc(len(out.expired))
        metrics.CORRUPT.inc(len(out.corrupt))
        return out

    # -- Read -----------------------------------------------------------------------------------

    def _read_into(
        self, offsets: list[int], sizes: list[int], timeout_s: float, out: ReadOutcome
    ) -> None:
        request = pb.ReadRequest(offsets=offsets, sizes=sizes)
        try:
            response = self._stub.Read(request, timeout=max(timeout_s, 0.001))
        except grpc.RpcError as err:
            code = _code(err)
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED and len(offsets) > 1:
                half = len(offsets) // 2
                self._read_into(offsets[:half], sizes[:half], timeout_s, out)
                self._read_into(offsets[half:], sizes[half:], timeout_s, out)
                return
            if code in _TRANSIENT:
                raise _unavailable("reading candidates from the commit log", err) from err
            raise
        statuses, sizes_read, blob = response.statuses, response.record_sizes, response.records_blob
        check(
            len(statuses) == len(offsets)
            and len(sizes_read) == len(offsets)
            and sum(sizes_read) == len(blob),
            f"Read of {len(offsets)} ranges answered {len(statuses)} statuses "
            f"and {len(sizes_read)} sizes of a {len(blob)}-byte blob",
        )
        end = 0
        for offset, status, size in zip(offsets, statuses, sizes_read, strict=True):
            start, end = end, end + size
            if status == pb.READ_OK:
                found = read_record(blob, start, end, check_crc=True, expected_offset=offset)
                if isinstance(found, Record) and found.total_size == size:
                    out.records[offset] = FetchedRecord(record_to_message(found))
                    continue
                reason = getattr(found, "reason", "not one whole record")
                log.error("commit log served a bad record at %d: %s", offset, reason)
                out.corrupt.append(offset)
            elif status == pb.READ_OUT_OF_RANGE:
                out.expired.append(offset)
            else:
                log.error("index candidate at %d is corrupt in the commit log; skipped", offset)
                out.corrupt.append(offset)
