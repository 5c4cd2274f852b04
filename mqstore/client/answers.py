"""What the consume queues answer, as both consumer types hand it on.

read_answer(topic, queue_id, answer, method)
    a PullResponse's or ReceiveResponse's records (one blob, PullResponse.records_blob),
    decoded a batch at a time (message.decode_answer): the messages, their queue offsets,
    and every record that can never be handed out as a BadRecord in queue order (those
    that do not decode here, then the one the server reported)
PullResult      one raw Pull's answer, decoded (Consumer.pull)
ConsumerStats   the counters a consumer keeps (`Consumer.stats`, `SimpleConsumer.stats`)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from mqstore.client.errors import BadRecord
from mqstore.client.message import Message, MessageRun, Undecodable, decode_answer
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb


@dataclass(frozen=True)
class PullResult:
    """One Pull's answer, decoded. `status` is the GetMessageStatus name ("FOUND",
    "OFFSET_OVERFLOW_ONE", ...); `next_offset` where the next pull of the queue starts."""

    status: str
    messages: list[Message]
    next_offset: int
    min_offset: int
    max_offset: int
    # Records of the answer that can never be handed out, in queue order; `messages` holds the
    # others, and next_offset is past them all.
    bad_records: list[BadRecord] = field(default_factory=list)


@dataclass
class ConsumerStats:
    """Counters since the consumer was made. `skipped`: per queue, offsets the store no
    longer held when they were asked for (retention): messages lost to this consumer.
    `reconnects`: outages (every replica UNAVAILABLE) that ended in an answer; `retries`:
    calls repeated during them. `pulls` counts pulls' answers; `follows` the Follow streams
    opened (one watches every caught-up queue). `bad_records`: records stepped over because
    they can never be handed out (raised as BadRecord, or skipped)."""

    pulls: int = 0
    follows: int = 0
    messages: int = 0
    reconnects: int = 0
    retries: int = 0
    skipped: dict[int, int] = field(default_factory=dict)
    bad_records: int = 0

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())


def read_answer(
    topic: str, queue_id: int, response: pb.PullResponse | pb.ReceiveResponse, method: str
) -> tuple[MessageRun, list[int], list[BadRecord], list[Undecodable]]:
    """An answer's messages and their queue offsets, and its records that can never be
    handed out as BadRecords in queue order: those that do not decode here (`failed`, by
    their index in the answer), then the one the server reported (a Pull's ends it)."""
    run, offsets, failed = decode_answer(response.records_blob, response.record_sizes)
    bad = [
        BadRecord(
            f.reason,
            topic=topic,
            queue_id=queue_id,
            queue_offset=response.queue_offsets[f.index],
            commit_log_offset=f.commit_log_offset,
            receipt_handle=_receipt_of(response, f.index),
            method=method,
        )
        for f in failed
    ]
    reported: Sequence[pb.BadRecord]
    if isinstance(response, pb.ReceiveResponse):
        reported = response.bad_records
    else:
        reported = [response.bad_record] if response.HasField("bad_record") else []
    bad.extend(
        BadRecord(
            b.reason,
            topic=topic,
            queue_id=queue_id,
            queue_offset=b.queue_offset,
            commit_log_offset=b.commit_log_offset,
            receipt_handle=b.receipt_handle,
            method=method,
        )
        for b in reported
    )
    bad.sort(key=lambda b: b.queue_offset)
    return run, offsets, bad, failed


def _receipt_of(response: pb.PullResponse | pb.ReceiveResponse, index: int) -> str:
    """The receipt of record `index` of a Receive's answer ("" for a Pull's)."""
    if isinstance(response, pb.ReceiveResponse):
        return response.receipt_handles[index]
    return ""
