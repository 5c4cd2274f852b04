"""SimpleConsumer: receive / ack, with the state on the server (RocketMQ 5's SimpleConsumer).

    with SimpleConsumer(conn, "orders", group="billing") as sc:
        received = sc.receive(queue_id=0, max_messages=16, invisible_duration_ms=30_000)
        sc.ack(received)                                  # ReceivedMessage list or receipts
        sc.change_invisible_duration(received[0], 60_000)  # the receipt to use from now on

A received message is invisible to the group for a while and comes back unless acknowledged,
so this mode is at-least-once; the group's offset moves when every message before it is
acknowledged. A Consumer with a group offers the same calls (Consumer.receive, .ack,
.change_invisible_duration): they are this type's, sharing the Consumer's connection, stats
and outage retry (retry.py).

A delivery whose record can never be handed out is acknowledged (settled for the group) and,
with on_bad_record="raise", raised as BadRecord: at once when the answer holds nothing else,
else by the next receive() of the queue, before it asks for more.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from mqstore.client.answers import ConsumerStats, read_answer
from mqstore.client.checks import (
    OnBadRecord,
    check_group,
    check_not_negative,
    check_on_bad_record,
    check_positive,
    check_queue_id,
    check_topic,
)
from mqstore.client.connection import Connection
from mqstore.client.errors import BadRecord, Cancelled, InvalidArgument
from mqstore.client.message import ReceivedMessage
from mqstore.client.positions import require_group
from mqstore.client.retry import RECONNECT_TIMEOUT_S_DEFAULT, OutageRetry
from mqstore.client.settings import ClientSettings
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb

log = logging.getLogger("mqstore.client.consumer")

# Receive: RocketMQ 5's simple consumer asks for 16 at a time, invisible for 30 s.
RECEIVE_MESSAGES_DEFAULT = 16
INVISIBLE_DURATION_MS_DEFAULT = 30_000
# The server takes at most this many receipts per Ack (its receive_messages_max).
ACK_HANDLES_MAX = 1_024

_RECEIVE = "ConsumeQueue/Receive"


@dataclass(frozen=True)
class AckResult:
    """`stale`: receipts that no longer matched (redelivered since, or acked already): not
    acked. `committed_offsets`: each queue's group offset after the acks."""

    acked: int
    stale: list[str]
    committed_offsets: dict[int, int]

    @property
    def committed_offset(self) -> int:
        """The committed offset when the acks were of one queue."""
        if len(self.committed_offsets) != 1:
            raise InvalidArgument(
                f"the acks touched {len(self.committed_offsets)} queues: see committed_offsets"
            )
        return next(iter(self.committed_offsets.values()))


class SimpleConsumer:
    """Receives and acknowledges one topic's messages for a group (module docstring)."""

    def __init__(
        self,
        connection: Connection | ClientSettings | None,
        topic: str,
        *,
        group: str,
        on_bad_record: OnBadRecord = "raise",
        reconnect_timeout_s: float = RECONNECT_TIMEOUT_S_DEFAULT,
    ) -> None:
        topic = check_topic(topic)
        group = require_group(check_group(group))
        on_bad_record = check_on_bad_record(on_bad_record)
        check_not_negative(reconnect_timeout_s, "reconnect_timeout_s")
        if isinstance(connection, Connection):
            conn, owns = connection, False
        else:
            conn, owns = Connection(connection), True
        retry = OutageRetry(conn, topic, reconnect_timeout_s, ConsumerStats())
        self._setup(retry, topic, group, on_bad_record, owns_connection=owns)

    @classmethod
    def sharing(
        cls, retry: OutageRetry, topic: str, group: str, on_bad_record: OnBadRecord
    ) -> SimpleConsumer:
        """One that calls through a Consumer's retry (its connection, outage clock and
        stats), its arguments checked by the Consumer: the Consumer's receive / ack."""
        self = cls.__new__(cls)
        self._setup(retry, topic, group, on_bad_record, owns_connection=False)
        return self

    def _setup(
        self,
        retry: OutageRetry,
        topic: str,
        group: str,
        on_bad_record: OnBadRecord,
        *,
        owns_connection: bool,
    ) -> None:
        self.topic = topic
        self.group = group
        self.on_bad_record: OnBadRecord = on_bad_record
        self.stats = retry.stats
        self._retry = retry
        self._owns_connection = owns_connection
        self._closed = False
        # Deliveries of damaged records not raised yet, per queue (on_bad_record="raise").
        self._bad_received: dict[int, deque[BadRecord]] = {}

    def close(self) -> None:
        """Release the connection if it is this consumer's own. Calling it again does
        nothing. Deliveries not acknowledged come back after their invisibility."""
        if self._closed:
            return
        self._closed = True
        if self._owns_connection:
            self._retry.conn.close()

    def __enter__(self) -> SimpleConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise Cancelled("the consumer is closed")

    # -- receive -----------------------------------------------------------------------------------

    def receive(
        self,
        queue_id: int,
        *,
        max_messages: int = RECEIVE_MESSAGES_DEFAULT,
        invisible_duration_ms: int = INVISIBLE_DURATION_MS_DEFAULT,
        long_poll_ms: int = 0,
    ) -> list[ReceivedMessage]:
        """Messages of `queue_id` for the group, each invisible to the group for
        `invisible_duration_ms` unless acknowledged (then it is delivered again). A bad
        delivery: see the module docstring."""
        self._check_open()
        queue_id = check_queue_id(queue_id)
        pending = self._bad_received.get(queue_id)
        if pending:
            self._raise_bad_received(queue_id, pending)
        check_positive(max_messages, "max_messages")
        check_positive(invisible_duration_ms, "invisible_duration_ms")
        check_not_negative(long_poll_ms, "long_poll_ms")
        request = pb.ReceiveRequest(
            group=self.group,
            topic=self.topic,
            queue_id=queue_id,
            max_messages=max_messages,
            invisible_duration_ms=invisible_duration_ms,
            long_poll_ms=long_poll_ms,
            report_bad_records=True,
        )
        response = self._retry.call(
            lambda s: s.Receive,
            request,
            _RECEIVE,
            timeout_s=self._retry.timeout_s(long_poll_ms),
        )
        run, _, bad, failed = read_answer(self.topic, queue_id, response, _RECEIVE)
        undecodable = {f.index for f in failed}
        kept = [i for i in range(len(response.queue_offsets)) if i not in undecodable]
        out = [
            ReceivedMessage(message, response.receipt_handles[i], response.delivery_counts[i])
            for message, i in zip(run, kept, strict=True)
        ]
        self.stats.messages += len(out)
        if bad:
            if self.on_bad_record == "skip":
                self._settle_bad(queue_id, bad)
                for b in bad:
                    log.warning("%s; skipped", b)
            else:
                pending = self._bad_received.setdefault(queue_id, deque())
                pending.extend(bad)
                if not out:
                    self._raise_bad_received(queue_id, pending)
        return out

    def _raise_bad_received(self, queue_id: int, pending: deque[BadRecord]) -> None:
        """Acknowledge the first pending bad delivery of the queue (it can never be consumed),
        then raise it."""
        bad = pending[0]
        self._settle_bad(queue_id, [bad])
        pending.popleft()
        raise bad

    def _settle_bad(self, queue_id: int, bad: list[BadRecord]) -> None:
        self.ack([b.receipt_handle for b in bad], queue_id)
        self.stats.bad_records += len(bad)

    # -- ack ---------------------------------------------------------------------------------------

    def ack(self, items: Iterable[ReceivedMessage | str], queue_id: int | None = None) -> AckResult:
        """Acknowledge deliveries (ReceivedMessage, or receipt handles of `queue_id`). Stale
        receipts are listed in the result, not raised: the message was delivered again (or
        acked before), and only the newer delivery can be acknowledged."""
        self._check_open()
        by_queue: dict[int, list[str]] = {}
        for item in items:
            handle, q = _receipt(item, queue_id)
            by_queue.setdefault(q, []).append(handle)
        stale: list[str] = []
        committed: dict[int, int] = {}
        acked = 0
        for q, handles in by_queue.items():
            for at in range(0, len(handles), ACK_HANDLES_MAX):
                chunk = handles[at : at + ACK_HANDLES_MAX]
                request = pb.AckRequest(
                    group=self.group, topic=self.topic, queue_id=q, receipt_handles=chunk
                )
                response = self._retry.call(lambda s: s.Ack, request, "ConsumeQueue/Ack")
                stale.extend(response.stale_receipt_handles)
                acked += len(chunk) - len(response.stale_receipt_handles)
                committed[q] = response.committed_offset
        return AckResult(acked=acked, stale=stale, committed_offsets=committed)

    def change_invisible_duration(
        self, item: ReceivedMessage | str, ms: int, queue_id: int | None = None
    ) -> str:
        """Hide (or show, with 0) a delivery for `ms` from now. Returns the receipt to use
        from now on, or "" when the given one was stale (redelivered since, or acked)."""
        self._check_open()
        if ms < 0:
            raise InvalidArgument("ms must not be negative", field="invisible_duration_ms")
        handle, q = _receipt(item, queue_id)
        request = pb.ChangeInvisibleDurationRequest(
            group=self.group,
            topic=self.topic,
            queue_id=q,
            receipt_handle=handle,
            invisible_duration_ms=ms,
        )
        response = self._retry.call(
            lambda s: s.ChangeInvisibleDuration, request, "ConsumeQueue/ChangeInvisibleDuration"
        )
        return response.receipt_handle


def _receipt(item: ReceivedMessage | str, queue_id: int | None) -> tuple[str, int]:
    if isinstance(item, ReceivedMessage):
        return item.receipt_handle, item.message.queue_id
    if queue_id is None:
        raise InvalidArgument(
            "a bare receipt handle needs queue_id (or pass the ReceivedMessage)",
            field="queue_id",
        )
    return item, check_queue_id(queue_id)
