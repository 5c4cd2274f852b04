"""Consumer: read a topic by offset (pull, iterate, commit) or per message (receive / ack).

Pull mode keeps the positions on the client: `position(q)` is the next offset to hand out of
queue q. Nothing on the server moves when a message is read, so a pull can be repeated at
will, and a restart of cq_svc or commitlog_svc costs a pause, never a message or a duplicate.

    start       where each queue's position comes from, the first time it is needed:
                  "earliest" / "latest"   the queue's min / max offset (GetQueueInfo)
                  "committed"             the group's offset (FetchOffset); where the group
                                          never committed (-1), `fallback`
                  Offset(n) / {q: n}      as given
                  Timestamp(ms, b)        GetOffsetByTime, "lower" or "upper" boundary
    pull        one queue, one batch, from a given offset (raw: positions do not move)
    poll        the next messages of every assigned queue: one batch per queue per round,
                queues taken in turn; when all are caught up, long polls (one per queue, at
                most LONG_POLLS_MAX at once) until one answers, then the others are cancelled
    messages    an iterator over poll's batches; a queue's position moves past a message
                when the message is handed out, so `commit()` after handling it covers it

poll and messages pull ahead: when an answer leaves more in its queue, the next Pull of that
queue is sent at once (at most PULLS_AHEAD_MAX in flight), so that cq_svc and commitlog_svc
fetch the next batch while this one is decoded and handed out. Answers carry their records in
one blob (PullResponse.records_blob), decoded a batch at a time (message.decode_answer).

A record that can never be handed out (the store refuses it as damaged, or its body does not
decompress) does not stall its queue: every message before it is handed out, then it is
surfaced once at its place as BadRecord (client/errors.py: topic, queue id, queue offset,
commit-log offset), and the queue's position moves past it. `on_bad_record` says how:

    "raise" (default)  messages() raises BadRecord when it reaches the record; poll() and
                       poll_batch() return the messages before it, and the next call raises
                       it. Either way once: the position is then past it, and calling again
                       goes on after it. receive() acknowledges such a delivery when it raises.
    "skip"             never raised: logged (WARNING), counted in stats.bad_records, stepped
                       over the same way.

A raw pull() never raises for one: it lists them in PullResult.bad_records. Pulls ask cq_svc
to report a damaged record (PullRequest.report_bad_records) rather than fail the call; the rest
of an answer after a record that does not decode here is pulled again after it is handed out.

A pull whose offset the store no longer holds (retention moved the queue's start: answers
OFFSET_TOO_SMALL, MESSAGE_WAS_REMOVING, OFFSET_FOUND_NULL) moves to the store's correction
and counts the offsets it stepped over in `stats.skipped` (data that cannot come back).
OFFSET_OVERFLOW_BADLY (past the end) moves back to the end; NO_MATCHED_MESSAGE (a tag filter
skipped everything scanned) moves on past what was scanned.

Every call goes through `Connection.call_cq` (which tries the next cq replica on UNAVAILABLE).
When every replica is unavailable, the consumer backs off (mqstore/backoff.py) and asks again
from its position; after `reconnect_timeout_s` of nothing but UNAVAILABLE it raises
Unavailable. `poll(timeout_s)` returns [] when its own time runs out
first (the outage keeps counting towards reconnect_timeout_s across polls).

Receive / ack (RocketMQ 5's simple consumer) keeps the state on the server instead: a received
message is invisible to the group for a while and comes back unless acknowledged, so that mode
is at-least-once.

A Consumer is used from one thread at a time (as Kafka's): auto commit happens inside poll /
messages when its interval has passed, and on close.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import grpc

from mqstore import errors as domain
from mqstore.backoff import Backoff
from mqstore.client.connection import Connection
from mqstore.client.errors import (
    BadRecord,
    Cancelled,
    ClientError,
    InvalidArgument,
    ResourceExhausted,
    StoreUnreachable,
    Unavailable,
    from_rpc_error,
)
from mqstore.client.follow import FollowStream
from mqstore.client.message import (
    Message,
    MessageRun,
    PolledBatch,
    ReceivedMessage,
    Undecodable,
    decode_answer,
)
from mqstore.client.settings import LONG_POLL_MS_DEFAULT, ClientSettings
from mqstore.formats.record import validate_topic
from mqstore.limits import MessageLimits, validate_group
from mqstore.rpc.gen.common.v1 import common_pb2
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

T = TypeVar("T")

# RocketMQ's client pulls 32 messages per request (pullBatchSize), but a Pull costs a Python
# client and server about 0.3 ms whatever its size: 32 a Pull caps a consumer near 100k msg/s,
# 256 puts the call under 1.5 us a message. A queue holds at most two batches (the one handed
# out and one pulled ahead): 512 messages, 512 KiB at 1 KiB each. The server caps at 1,024.
PULL_MESSAGES_DEFAULT = 256
PULL_MESSAGES_MAX = 1_024
# Pulls sent ahead at once (one per queue at most): enough to keep cq_svc and commitlog_svc
# busy while the client decodes, few enough to leave the server's workers to other consumers.
PULLS_AHEAD_MAX = 4
# A PullStream answers at most the server's pull_stream_batches_max (64) batches; past this
# long the stream is dropped and the next batch pulled on its own.
PULL_STREAM_TIMEOUT_S = 60.0
# A caught-up consumer follows at most this many queues on one Follow stream (cq_svc's
# follow_queues_max); a wider assignment long-polls LONG_POLLS_MAX queues at a time instead.
FOLLOW_QUEUES_MAX = 1_024
# A Follow stream ends itself after long_poll_ms with nothing to answer, or after the server's
# follow_batches_max answers; this deadline only bounds one whose server went silent.
FOLLOW_TIMEOUT_S = 300.0
# Receive: RocketMQ 5's simple consumer asks for 16 at a time, invisible for 30 s.
RECEIVE_MESSAGES_DEFAULT = 16
INVISIBLE_DURATION_MS_DEFAULT = 30_000
# The server takes at most this many receipts per Ack (its receive_messages_max).
ACK_HANDLES_MAX = 1_024
AUTO_COMMIT_INTERVAL_S_DEFAULT = 5.0
# Kafka's consumer re-reads the partition list every 5 minutes; a topic's queues appear the
# first time something is written to them, and 5 s is soon enough for a follower to notice
# while costing one ListQueues per 5 s.
QUEUE_REFRESH_INTERVAL_S_DEFAULT = 5.0
# A restart of cq_svc (replay included) or commitlog_svc takes seconds: 30 s of nothing but
# UNAVAILABLE is an outage worth telling the caller about.
RECONNECT_TIMEOUT_S_DEFAULT = 30.0
# Retry pauses while every replica is unavailable: from 50 ms (a replica failing over answers
# at once), doubling, to 1 s (a consumer costs one call a second while it waits).
# Long polls one consumer keeps waiting at once: cq_svc serves 24 at most (long_polls_max),
# so one consumer of a wide topic must not take them all.
LONG_POLLS_MAX = 8
# When more queues are caught up than are watched by long polls, the wait is cut to this, so
# that the unwatched queues are looked at again within a second.
UNWATCHED_WAIT_MS = 1_000
# With long polling off (long_poll_ms=0), a caught-up poll pauses this long between rounds
# instead of spinning on the server.
IDLE_PAUSE_S = 0.1
# After RESOURCE_EXHAUSTED on a long poll or a follow (the server's waiters or follow streams
# are all taken), pause before looking again.
BUSY_PAUSE_S = 0.2

_LIMITS = MessageLimits()
_PULL = "ConsumeQueue/Pull"
_PULL_STREAM = "ConsumeQueue/PullStream"
_FOLLOW = "ConsumeQueue/Follow"
_RECEIVE = "ConsumeQueue/Receive"

StartName = Literal["earliest", "latest", "committed"]
Fallback = Literal["earliest", "latest"]
OnBadRecord = Literal["raise", "skip"]

_BOUNDARIES = {"lower": common_pb2.LOWER, "upper": common_pb2.UPPER}
# Statuses after which the offsets stepped over are gone for good (retention, removed files).
_LOST = frozenset({pb.OFFSET_TOO_SMALL, pb.MESSAGE_WAS_REMOVING, pb.OFFSET_FOUND_NULL})
# Statuses that say "nothing more at the end of this queue right now".
_AT_END = frozenset({pb.OFFSET_OVERFLOW_ONE, pb.NO_MESSAGE_IN_QUEUE})


@dataclass(frozen=True)
class Offset:
    """A start position: offset `n` of every queue."""

    n: int

    def __post_init__(self) -> None:
        if self.n < 0:
            raise InvalidArgument(f"offset {self.n} is negative", field="offset")


@dataclass(frozen=True)
class Timestamp:
    """A store time in epoch milliseconds. boundary "lower": the first message stored at or
    after it; "upper": the last message stored at or before it (RocketMQ's BoundaryType)."""

    ms: int
    boundary: str = "lower"

    def __post_init__(self) -> None:
        if self.ms < 0:
            raise InvalidArgument(f"timestamp {self.ms} ms is negative", field="timestamp_ms")
        if self.boundary not in _BOUNDARIES:
            raise InvalidArgument(
                f"boundary {self.boundary!r} is not 'lower' or 'upper'", field="boundary"
            )

    @property
    def boundary_proto(self) -> common_pb2.Boundary.ValueType:
        return _BOUNDARIES[self.boundary]


Start = StartName | Offset | Timestamp | Mapping[int, int]


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


@dataclass
class _Queue:
    """Client-side state of one assigned queue."""

    fetch_at: int  # where the next pull starts
    position: int  # the next offset to hand out (== fetch_at when nothing is buffered)
    # The buffered batch, its messages' queue offsets, and how many of it are handed out.
    messages: MessageRun = field(default_factory=lambda: decode_answer(b"", ())[0])
    offsets: list[int] = field(default_factory=list)
    taken: int = 0
    # A record that can never be handed out, right after the buffered messages (fetch_at is
    # past it): surfaced once they are handed out.
    bad: BadRecord | None = None
    # The last pull found nothing more at the queue's end (or reached it): a hint for poll,
    # and what messages(follow=False) stops on.
    caught_up: bool = False
    # A PullStream sent ahead: the offset its next answer was pulled from, and the stream.
    stream: tuple[int, Any] | None = None

    @property
    def buffered(self) -> bool:
        return self.taken < len(self.messages) or self.bad is not None

    @property
    def has_messages(self) -> bool:
        return self.taken < len(self.messages)

    @property
    def end(self) -> int:
        """The position once every buffered message is handed out: the bad record's offset
        when one comes next, else where the next pull starts."""
        return self.bad.queue_offset if self.bad is not None else self.fetch_at

    @property
    def in_flight(self) -> bool:
        return self.stream is not None

    def cancel_ahead(self) -> None:
        if self.stream is not None:
            self.stream[1].cancel()
            self.stream = None


class Consumer:
    """Reads one topic: pull mode (client positions, optional group commits) and receive/ack
    mode (server-side invisibility, group required). See the module docstring."""

    def __init__(
        self,
        connection: Connection | ClientSettings | None,
        topic: str,
        *,
        group: str | None = None,
        queues: Iterable[int] | None = None,
        start: Start | None = None,
        fallback: Fallback = "earliest",
        tags: Sequence[str] | str = (),
        max_messages: int = PULL_MESSAGES_DEFAULT,
        long_poll_ms: int = LONG_POLL_MS_DEFAULT,
        auto_commit: bool = False,
        auto_commit_interval_s: float = AUTO_COMMIT_INTERVAL_S_DEFAULT,
        reconnect_timeout_s: float = RECONNECT_TIMEOUT_S_DEFAULT,
        queue_refresh_interval_s: float = QUEUE_REFRESH_INTERVAL_S_DEFAULT,
        on_bad_record: OnBadRecord = "raise",
    ) -> None:
        self.topic = _check_topic(topic)
        if on_bad_record not in ("raise", "skip"):
            raise InvalidArgument(
                f"on_bad_record {on_bad_record!r} is not 'raise' or 'skip'", field="on_bad_record"
            )
        self.on_bad_record: OnBadRecord = on_bad_record
        self.group = _check_group(group)
        self.start: Start = _check_start(
            ("committed" if group else "earliest") if start is None else start, self.group
        )
        if fallback not in ("earliest", "latest"):
            raise InvalidArgument(
                f"fallback {fallback!r} is not 'earliest' or 'latest'", field="fallback"
            )
        self.fallback: Fallback = fallback
        self.tags = _check_tags(tags)
        self.max_messages = _check_max_messages(max_messages)
        self._follow: FollowStream | None = None
        if long_poll_ms < 0:
            raise InvalidArgument("long_poll_ms must not be negative", field="long_poll_ms")
        self.long_poll_ms = long_poll_ms
        if auto_commit and self.group is None:
            raise InvalidArgument("auto_commit needs a group", field="group")
        if auto_commit_interval_s <= 0:
            raise InvalidArgument(
                "auto_commit_interval_s must be positive", field="auto_commit_interval_s"
            )
        self.auto_commit = auto_commit
        self.auto_commit_interval_s = auto_commit_interval_s
        if reconnect_timeout_s < 0:
            raise InvalidArgument(
                "reconnect_timeout_s must not be negative", field="reconnect_timeout_s"
            )
        self.reconnect_timeout_s = reconnect_timeout_s
        if queue_refresh_interval_s <= 0:
            raise InvalidArgument(
                "queue_refresh_interval_s must be positive", field="queue_refresh_interval_s"
            )
        self.queue_refresh_interval_s = queue_refresh_interval_s

        self._fixed: list[int] | None = None
        if queues is not None:
            self._fixed = list(dict.fromkeys(_check_queue_id(q) for q in queues))
            if not self._fixed:
                raise InvalidArgument("queues is empty (None means every queue)", field="queues")
            if isinstance(self.start, Mapping):
                extra = sorted(set(self.start) - set(self._fixed))
                if extra:
                    raise InvalidArgument(
                        f"start names queues {extra} that are not assigned", field="start"
                    )

        if isinstance(connection, Connection):
            self._conn = connection
            self._owns_connection = False
        else:
            self._conn = Connection(connection)
            self._owns_connection = True
        self._settings = self._conn.settings

        self.stats = ConsumerStats()
        self._queues: dict[int, _Queue] = {}  # resolved queues only
        self._assigned: list[int] = list(self._fixed) if self._fixed is not None else []
        self._listed_at: float | None = None  # monotonic time of the last ListQueues
        self._known: set[int] = set()  # every queue ListQueues has shown
        self._rotation = 0  # fairness: the queue a round starts with
        self._last_committed: dict[int, int] = {}
        self._next_auto_commit = time.monotonic() + auto_commit_interval_s
        self._outage_since: float | None = None
        self._backoff = Backoff()  # between attempts while every replica is unavailable
        self._closed = False
        # Receive: deliveries of damaged records not raised yet, per queue (on_bad_record=raise).
        self._bad_received: dict[int, deque[BadRecord]] = {}

    # -- life cycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Commit positions (auto_commit) and release the connection if it is this
        consumer's own. Calling it again does nothing."""
        if self._closed:
            return
        self._drop_follow()
        for state in self._queues.values():
            state.cancel_ahead()
        try:
            if self.auto_commit:
                self._commit_changed()
        finally:
            self._closed = True
            if self._owns_connection:
                self._conn.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise Cancelled("the consumer is closed")

    # -- raw pull --------------------------------------------------------------------------------

    def pull(
        self,
        queue_id: int,
        offset: int,
        *,
        max_messages: int | None = None,
        long_poll_ms: int = 0,
        tags: Sequence[str] | str | None = None,
    ) -> PullResult:
        """One Pull of `queue_id` from `offset`. Positions do not move. A record that can never
        be handed out (damaged in the store, or failing the client's own checks) is never
        returned: it is listed in PullResult.bad_records, and next_offset is past it."""
        self._check_open()
        request = self._pull_request(
            queue_id,
            offset,
            max_messages=self.max_messages if max_messages is None else max_messages,
            long_poll_ms=long_poll_ms,
            tags=self.tags if tags is None else _check_tags(tags),
        )
        response = self._retry(lambda: self._call_pull(request))
        run, _, bad, _ = self._read_answer(queue_id, response, _PULL)
        return PullResult(
            status=pb.GetMessageStatus.Name(response.status),
            messages=run[:],
            next_offset=response.next_begin_offset,
            min_offset=response.min_offset,
            max_offset=response.max_offset,
            bad_records=bad,
        )

    def _read_answer(
        self, queue_id: int, response: pb.PullResponse | pb.ReceiveResponse, method: str
    ) -> tuple[MessageRun, list[int], list[BadRecord], list[Undecodable]]:
        """An answer's messages and their queue offsets, and its records that can never be
        handed out as BadRecords in queue order: those that do not decode here (`failed`, by
        their index in the answer), then the one the server reported (a Pull's ends it)."""
        run, offsets, failed = decode_answer(response.records_blob, response.record_sizes)
        bad = [
            BadRecord(
                f.reason,
                topic=self.topic,
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
                topic=self.topic,
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

    def _pull_request(
        self,
        queue_id: int,
        offset: int,
        *,
        max_messages: int,
        long_poll_ms: int,
        tags: tuple[str, ...],
    ) -> pb.PullRequest:
        # Queue id and offset are the server's to check (INVALID_ARGUMENT naming the field),
        # so that a raw pull reports exactly what the service says.
        return pb.PullRequest(
            topic=self.topic,
            queue_id=queue_id,
            offset=offset,
            max_messages=max_messages,
            tags=tags,
            long_poll_ms=long_poll_ms,
            report_bad_records=True,
        )

    def _pull_timeout_s(self, long_poll_ms: int) -> float:
        return self._settings.timeout_s + long_poll_ms / 1000.0

    def _call_pull(self, request: pb.PullRequest) -> pb.PullResponse:
        self.stats.pulls += 1
        return self._conn.call_cq(
            lambda s: s.Pull,
            request,
            name=_PULL,
            timeout_s=self._pull_timeout_s(request.long_poll_ms),
        )

    # -- positions -------------------------------------------------------------------------------

    def assignment(self) -> list[int]:
        """The queues this consumer reads (with queues=None: every queue of the topic that
        exists, as of the last listing)."""
        self._check_open()
        return list(self._retry(lambda: self._queue_ids(refresh=False)))

    def position(self, queue_id: int) -> int:
        """The next offset of `queue_id` this consumer hands out (resolved from `start` the
        first time)."""
        self._check_open()
        return self._state(self._assigned_id(queue_id)).position

    def seek(self, queue_id: int, offset: int) -> None:
        self._check_open()
        queue_id = self._assigned_id(queue_id)
        if offset < 0:
            raise InvalidArgument(f"offset {offset} is negative", field="offset")
        self._set(queue_id, offset)

    def seek_to_time(self, ms: int, boundary: str = "lower") -> None:
        """Every assigned queue to the offset of store time `ms` (see Timestamp)."""
        self._check_open()
        at = Timestamp(ms, boundary)
        for q in self._retry(lambda: self._queue_ids(refresh=False)):
            self._set(q, self._offset_for_time(q, at))

    def seek_to_beginning(self) -> None:
        self._check_open()
        for q, (lo, _) in self._bounds(self.assignment()).items():
            self._set(q, lo)

    def seek_to_end(self) -> None:
        self._check_open()
        for q, (_, hi) in self._bounds(self.assignment()).items():
            self._set(q, hi)

    def _set(self, queue_id: int, offset: int) -> None:
        old = self._queues.get(queue_id)
        if old is not None:
            old.cancel_ahead()
            self._drop_follow()  # it pulls from the old position: its long poll freed now
        self._queues[queue_id] = _Queue(fetch_at=offset, position=offset)

    def _assigned_id(self, queue_id: int) -> int:
        _check_queue_id(queue_id)
        if queue_id in self._retry(lambda: self._queue_ids(refresh=False)):
            return queue_id
        # With queues=None it may have appeared since the last listing.
        if self._fixed is None and queue_id in self._retry(
            lambda: self._queue_ids(refresh=True, force=True)
        ):
            return queue_id
        raise InvalidArgument(
            f"queue {queue_id} of {self.topic} is not assigned to this consumer "
            f"(assigned: {self._assigned})",
            field="queue_id",
        )

    def _state(self, queue_id: int) -> _Queue:
        state = self._queues.get(queue_id)
        if state is None:
            offset = self._initial_offset(queue_id, late=False)
            state = self._queues[queue_id] = _Queue(fetch_at=offset, position=offset)
        return state

    def _initial_offset(self, queue_id: int, *, late: bool) -> int:
        """Where a queue starts. A queue that appeared after the first listing (`late`)
        holds nothing but what was written since: it starts at its beginning, unless the
        start names it or the group committed an offset for it."""
        start = self.start
        missing: Fallback = "earliest" if late else self.fallback
        if isinstance(start, Mapping):
            if queue_id in start:
                return int(start[queue_id])
            return self._end(queue_id, missing)
        if start == "committed":
            committed = self.committed(queue_id)
            if committed is None:
                return self._end(queue_id, missing)
            self._last_committed[queue_id] = committed  # auto commit: nothing to repeat
            return committed
        if late:
            return self._end(queue_id, "earliest")
        if isinstance(start, Offset):
            return start.n
        if isinstance(start, Timestamp):
            return self._offset_for_time(queue_id, start)
        return self._end(queue_id, "latest" if start == "latest" else "earliest")

    def _end(self, queue_id: int, which: str) -> int:
        lo, hi = self._bounds([queue_id])[queue_id]
        return lo if which == "earliest" else hi

    def _bounds(self, queue_ids: Iterable[int]) -> dict[int, tuple[int, int]]:
        out = {}
        for q in queue_ids:
            info = self._unary(
                lambda s: s.GetQueueInfo,
                pb.GetQueueInfoRequest(topic=self.topic, queue_id=q),
                "ConsumeQueue/GetQueueInfo",
            )
            out[q] = (info.min_offset, info.max_offset)
        return out

    def _offset_for_time(self, queue_id: int, at: Timestamp) -> int:
        request = pb.GetOffsetByTimeRequest(
            topic=self.topic, queue_id=queue_id, timestamp_ms=at.ms, boundary=at.boundary_proto
        )
        response = self._unary(lambda s: s.GetOffsetByTime, request, "ConsumeQueue/GetOffsetByTime")
        return response.offset

    # -- the queue list --------------------------------------------------------------------------

    def _queue_ids(self, *, refresh: bool, force: bool = False) -> list[int]:
        """The assignment. With queues=None: listed once, then again when `refresh` and the
        refresh interval has passed; queues that appear later start at their beginning."""
        if self._fixed is not None:
            return self._assigned
        now = time.monotonic()
        due = (
            force
            or self._listed_at is None
            or (refresh and now - self._listed_at >= self.queue_refresh_interval_s)
        )
        if due:
            # Not retried here: poll's loop rides out an outage within its own time.
            listed = self._conn.call_cq(
                lambda s: s.ListQueues,
                pb.ListQueuesRequest(topic=self.topic),
                name="ConsumeQueue/ListQueues",
            )
            first = self._listed_at is None
            for info in listed.queues:
                q = info.queue_id
                if q in self._known:
                    continue
                if q not in self._queues:  # else positioned by a seek already
                    if first:
                        offset = self._listed_offset(q, info)
                    else:
                        offset = self._initial_offset(q, late=True)
                        log.info("%s: queue %d appeared; reading it from %d", self.topic, q, offset)
                    self._queues[q] = _Queue(fetch_at=offset, position=offset)
                self._known.add(q)
                self._assigned.append(q)
            self._assigned.sort()
            self._listed_at = time.monotonic()
        return self._assigned

    def _listed_offset(self, queue_id: int, info: pb.QueueInfo) -> int:
        """The start of a queue of the first listing, without a GetQueueInfo when the listing
        already holds the answer."""
        if self.start == "earliest":
            return info.min_offset
        if self.start == "latest":
            return info.max_offset
        return self._initial_offset(queue_id, late=False)

    def _refresh_due_s(self) -> float | None:
        """Seconds until the queue list is due again (None: a fixed assignment)."""
        if self._fixed is not None or self._listed_at is None:
            return None
        return max(0.0, self._listed_at + self.queue_refresh_interval_s - time.monotonic())

    # -- poll ------------------------------------------------------------------------------------

    def poll(self, timeout_s: float | None = None) -> list[Message]:
        """The next messages of the assigned queues (one batch from each queue that has
        some, queues in turn). When every queue is caught up, long polls until something
        arrives or `timeout_s` passes (None: one long poll of `long_poll_ms`; 0: no wait).
        Positions move past everything returned."""
        self._check_open()
        wait_s = self.long_poll_ms / 1000.0 if timeout_s is None else max(0.0, timeout_s)
        self._maybe_auto_commit()
        self._fill(time.monotonic() + wait_s)
        return self._drain()

    def poll_batch(self, timeout_s: float | None = None) -> PolledBatch:
        """poll() as columns (PolledBatch: bodies, queue ids, queue offsets), no Message made
        unless one is asked for: the same messages, waits and positions as poll()."""
        self._check_open()
        wait_s = self.long_poll_ms / 1000.0 if timeout_s is None else max(0.0, timeout_s)
        self._maybe_auto_commit()
        self._fill(time.monotonic() + wait_s)
        return PolledBatch.of(self._drain_parts())

    def __iter__(self) -> Iterator[Message]:
        return self.messages(follow=True)

    def messages(self, *, follow: bool = True, limit: int | None = None) -> Iterator[Message]:
        """Messages one at a time, each queue in order. follow=True: forever (long polls when
        caught up; new queues of the topic join when queues=None). follow=False: stops when
        every queue has reached its end as of the moment it got there. `limit`: at most that
        many messages. A queue's position moves past a message as it is handed out."""
        self._check_open()
        if limit is not None and limit < 0:
            raise InvalidArgument("limit must not be negative", field="limit")
        return self._messages(follow, limit)

    def _messages(self, follow: bool, limit: int | None) -> Iterator[Message]:
        handed = 0
        if not follow:
            self._drop_follow()  # this walk pulls on its own; a follow would hold a long poll
            for state in self._queues.values():
                state.caught_up = False  # only what this walk sees counts
        # Queues that reached their end in this walk, with the state they reached it in (a
        # seek replaces the state, and the queue is read again).
        ended: dict[int, _Queue] = {}
        queues = self._queues
        stats = self.stats
        while limit is None or handed < limit:
            self._check_open()
            self._maybe_auto_commit()
            found = self._next_buffered()
            if found is not None:
                # A queue's whole batch, then the next queue's: a tight loop that stops when
                # the batch changes under it (a seek, a poll) or the consumer closes.
                q, state = found
                if not state.has_messages:
                    self._hand_out_bad(state)  # raises (on_bad_record="raise")
                    continue
                messages, offsets = state.messages, state.offsets
                last = len(messages) - 1
                expected = state.taken
                for message in messages.iter_from(state.taken):
                    i = state.taken
                    # (A poll or a seek between two messages moved the queue on: stop here.)
                    if i != expected or (limit is not None and handed >= limit):
                        break
                    state.taken = expected = i + 1
                    state.position = offsets[i] + 1 if i < last else state.end
                    stats.messages += 1
                    handed += 1
                    yield message
                    if self._closed or queues.get(q) is not state or state.messages is not messages:
                        break
                    if self.auto_commit:
                        self._maybe_auto_commit()
                continue
            if follow:
                # With long polling off, a caught-up round still pauses (IDLE_PAUSE_S).
                self._fill(time.monotonic() + max(self.long_poll_ms / 1000.0, IDLE_PAUSE_S))
                continue
            queue_ids = self._retry(lambda: self._queue_ids(refresh=False))
            for q in queue_ids:
                current = self._queues.get(q)
                if current is not None and current.caught_up:
                    ended[q] = current
            active = [q for q in queue_ids if q not in ended or ended[q] is not self._queues.get(q)]
            if not active:
                return
            self._retry(lambda: self._round(active))  # noqa: B023 - called at once

    def _fill(self, deadline: float) -> None:
        """Buffer the next batches: a round of quick pulls, then long polls while every queue
        is caught up, until something is buffered or `deadline` passes. Rides out outages."""
        while True:
            try:
                if self._fill_once(deadline):
                    self._recovered()
                    return
                self._recovered()
            except Unavailable as err:
                if not self._back_off(err, deadline):
                    return
                for state in self._queues.values():
                    state.caught_up = False  # look again with blocking calls (replica failover)
                continue
            if time.monotonic() >= deadline:
                return

    def _fill_once(self, deadline: float) -> bool:
        """One step of _fill; True when something is buffered."""
        queue_ids = self._queue_ids(refresh=True)
        if self._buffered():
            return True
        if self._follow is not None:
            if self._follow_valid(queue_ids):
                # The stream answers every queue as it gets something, caught up or not.
                self._follow_take(self._wait_ms(deadline))
                if self._buffered():
                    return True
                if self._follow is not None:
                    return False  # nothing within the time
            else:
                self._drop_follow()
        if not queue_ids:
            pause = deadline - time.monotonic()
            due = self._refresh_due_s()
            if due is not None:
                pause = min(pause, due)
            if pause > 0:
                time.sleep(pause)  # nothing to pull until the topic has a queue
            return False
        wait_ms = self._wait_ms(deadline)
        # A round of quick pulls unless every queue is known to be caught up and there is
        # time for a long poll (which answers at once when something came meanwhile).
        if (
            wait_ms <= 0
            or self.long_poll_ms == 0
            or not all(self._state(q).caught_up for q in queue_ids)
        ):
            self._round(queue_ids)
            if self._buffered():
                return True
            wait_ms = self._wait_ms(deadline)
            if wait_ms <= 0:
                return False
        if self.long_poll_ms == 0:
            time.sleep(min(IDLE_PAUSE_S, wait_ms / 1000.0))
            return False
        if len(queue_ids) <= FOLLOW_QUEUES_MAX:
            self._open_follow(queue_ids)
            self._follow_take(wait_ms)
            return self._buffered()
        self._long_poll(queue_ids, min(wait_ms, self.long_poll_ms))
        if not self._buffered():
            return False
        # The first answer cancelled the other polls: a quick pull of those queues takes what
        # they got meanwhile, so one poll hands out a batch of every queue that has one.
        others = [q for q in queue_ids if not self._state(q).buffered]
        if others:
            self._round(others)
        return True

    def _wait_ms(self, deadline: float) -> int:
        """How long a long poll may wait: until `deadline`, and back for the queue list."""
        wait_ms = int((deadline - time.monotonic()) * 1000)
        due = self._refresh_due_s()
        if due is not None:
            wait_ms = min(wait_ms, int(due * 1000))
        return wait_ms

    def _round(self, queue_ids: list[int]) -> None:
        """One quick pull of every queue with nothing buffered, starting with the next queue
        in turn: sent at once (up to PULLS_AHEAD_MAX in flight), answers taken in turn, and
        the next Pull of a queue sent as soon as an answer says there is more."""
        todo = [q for q in self._rotated(queue_ids) if not self._state(q).buffered]
        for q in todo:
            state = self._queues[q]
            self._send_ahead(q, state, state.fetch_at)
        for q in todo:
            state = self._queues[q]
            asked = state.fetch_at
            response = self._collect(q, state)
            if response.status == pb.FOUND and response.next_begin_offset < response.max_offset:
                self._send_ahead(q, state, response.next_begin_offset)
            self._apply(q, asked, response)
        self._rotation += 1

    def _send_ahead(self, queue_id: int, state: _Queue, offset: int) -> None:
        """Have the Pull of `queue_id` from `offset` under way without waiting for it, when
        the queue has none and fewer than PULLS_AHEAD_MAX queues have: a PullStream (the
        server pulls on from each answer's next offset; a batch costs both ends a third of a
        unary call)."""
        if state.stream is not None and state.stream[0] == offset:
            return  # the stream's next answer is this pull
        state.cancel_ahead()
        if sum(1 for s in self._queues.values() if s.in_flight) >= PULLS_AHEAD_MAX:
            return
        request = self._pull_request(
            queue_id, offset, max_messages=self.max_messages, long_poll_ms=0, tags=self.tags
        )
        stream = self._conn.call_cq(
            lambda s: s.PullStream,
            pb.PullStreamRequest(pull=request),
            name=_PULL_STREAM,
            timeout_s=PULL_STREAM_TIMEOUT_S,
        )
        state.stream = (offset, stream)

    def _collect(self, queue_id: int, state: _Queue) -> pb.PullResponse:
        """The answer of the Pull of the queue from its fetch_at: the stream's next, else a
        plain call. A stream that ended or failed leaves it to a plain call (which raises the
        error itself if there is one)."""
        stream, state.stream = state.stream, None
        if stream is not None:
            asked, call = stream
            if asked == state.fetch_at:
                try:
                    response: pb.PullResponse = next(call)
                except (StopIteration, grpc.RpcError):
                    pass
                else:
                    self.stats.pulls += 1  # a pull's answer, as a plain Pull's is
                    state.stream = (response.next_begin_offset, call)
                    return response
            else:
                call.cancel()
        request = self._pull_request(
            queue_id, state.fetch_at, max_messages=self.max_messages, long_poll_ms=0, tags=self.tags
        )
        return self._call_pull(request)

    # -- following caught-up queues on one stream -------------------------------------------------

    def _open_follow(self, queue_ids: list[int]) -> None:
        """One Follow call over every queue, each from its next offset (follow.py)."""
        self._drop_follow()
        pulls = []
        offsets = {}
        for q in queue_ids:
            state = self._state(q)
            state.cancel_ahead()  # the stream asks the same
            offsets[q] = state.fetch_at
            pulls.append(
                self._pull_request(
                    q,
                    state.fetch_at,
                    max_messages=self.max_messages,
                    long_poll_ms=0,
                    tags=self.tags,
                )
            )
        call = self._conn.call_cq(
            lambda s: s.Follow,
            pb.FollowRequest(pulls=pulls, long_poll_ms=self.long_poll_ms),
            name=_FOLLOW,
            timeout_s=FOLLOW_TIMEOUT_S,
        )
        self._follow = FollowStream(call, queue_ids, offsets)
        self.stats.follows += 1

    @property
    def following(self) -> bool:
        """A Follow stream is open: new messages of every assigned queue come without a new
        call (poll, iteration and messages(follow=True) open it once caught up)."""
        return self._follow is not None and not self._follow.ended

    def _follow_valid(self, queue_ids: list[int]) -> bool:
        follow = self._follow
        if follow is None:
            return False
        states = self._queues
        return follow.matches(queue_ids, {q: states[q].fetch_at for q in queue_ids if q in states})

    def _drop_follow(self) -> None:
        if self._follow is not None:
            self._follow.close()
            self._follow = None

    def _follow_take(self, wait_ms: int) -> None:
        """Apply the follow's answers: the first waited for up to `wait_ms`, then whatever
        else is already buffered. An ended stream is dropped; its error, if any, raised as a
        long poll's would be."""
        follow = self._follow
        assert follow is not None
        got = follow.next(wait_ms / 1000.0)
        while got:
            for q, asked, response in got:
                self.stats.pulls += 1  # a pull's answer, as a plain Pull's is
                self._apply(q, asked, response)
            got = follow.next(0)
        if not follow.ended:
            return
        self._follow = None
        if follow.error is None:
            return
        error = self._conn.explain(from_rpc_error(follow.error, _FOLLOW))
        if error.code is grpc.StatusCode.CANCELLED:
            pass
        elif isinstance(error, ResourceExhausted):
            # Every follow stream of the server is taken (follow_streams_max): pull until one
            # is free, a round of quick pulls first (the stream answered nothing).
            log.warning("%s: follow refused (%s); pulling instead", self.topic, error)
            time.sleep(BUSY_PAUSE_S)
            for state in self._queues.values():
                state.caught_up = False
        elif not (isinstance(error, Unavailable) and self._buffered()):
            raise error

    def _long_poll(self, queue_ids: list[int], wait_ms: int) -> None:
        """Long polls on the caught-up queues at once; the first answer cancels the others
        (a cancelled call frees its server thread at once)."""
        watched = self._rotated(queue_ids)[:LONG_POLLS_MAX]
        if len(watched) < len(queue_ids):
            wait_ms = min(wait_ms, UNWATCHED_WAIT_MS)
        woke = threading.Event()
        calls: dict[int, tuple[int, grpc.Future[pb.PullResponse]]] = {}
        try:
            for q in watched:
                self._state(q).cancel_ahead()  # the long poll asks the same
                request = self._pull_request(
                    q,
                    self._state(q).fetch_at,
                    max_messages=self.max_messages,
                    long_poll_ms=wait_ms,
                    tags=self.tags,
                )
                self.stats.pulls += 1
                future: grpc.Future[pb.PullResponse] = self._conn.call_cq(
                    lambda s: s.Pull.future,
                    request,
                    name=_PULL,
                    timeout_s=self._pull_timeout_s(wait_ms),
                )
                future.add_done_callback(lambda _: woke.set())
                calls[q] = (request.offset, future)
            woke.wait(self._pull_timeout_s(wait_ms))
        finally:
            for _, future in calls.values():
                future.cancel()  # nothing for calls that are done
        failed: ClientError | None = None
        for q, (asked, future) in calls.items():
            if future.cancelled():
                continue
            try:
                response = future.result()
            except grpc.RpcError as err:
                error = self._conn.explain(from_rpc_error(err, _PULL))
                if error.code is grpc.StatusCode.CANCELLED:
                    continue
                failed = failed or error
                continue
            self._apply(q, asked, response)
        if failed is None:
            return
        if isinstance(failed, ResourceExhausted):
            log.warning("%s: long poll refused (%s); looking again shortly", self.topic, failed)
            time.sleep(BUSY_PAUSE_S)
            return
        if isinstance(failed, Unavailable) and self._buffered():
            return  # what others answered is handed out; the next round retries the rest
        raise failed

    def _apply(self, queue_id: int, asked: int, response: pb.PullResponse) -> None:
        """A pull's answer into the queue's state (buffer, next offset, caught up)."""
        state = self._queues.get(queue_id)
        if state is None or state.fetch_at != asked:
            return  # sought elsewhere since the pull was sent
        status = response.status
        next_begin = response.next_begin_offset
        if status == pb.FOUND:
            if state.bad is not None:
                return  # after a bad record still to surface: pulled again once it is
            run, offsets, bads, failed = self._read_answer(queue_id, response, _PULL)
            messages = run
            bad = bads[0] if bads else None
            if failed:  # the answer's messages before it; the rest is pulled again after it
                messages = run.head(failed[0].index)
                offsets = offsets[: failed[0].index]
            if bad is not None:
                next_begin = bad.queue_offset + 1
            first = offsets[0] if offsets else (bad.queue_offset if bad is not None else asked)
            if not self.tags and first > asked:
                # Without a filter a gap is messages the log no longer held (the server
                # steps over them): retention got there first.
                self._skip(queue_id, asked, first, "MESSAGE_WAS_REMOVING")
            if state.buffered:  # a follow's next answer; pulls go to queues with nothing buffered
                if state.taken == 0:
                    # Nothing of it handed out yet (it came earlier in this same look), so
                    # nobody holds it: grown in place, not copied once an answer.
                    state.messages.extend(messages)
                    state.offsets.extend(offsets)
                    messages, offsets = state.messages, state.offsets
                else:
                    # The rest of the buffer, then the answer's: joined without making a
                    # Message (making the buffer's at each answer cost a consumer behind a
                    # follow stream time quadratic in its backlog).
                    messages = state.messages.after(state.taken, messages)
                    offsets = state.offsets[state.taken :] + offsets
            state.messages, state.offsets, state.taken = messages, offsets, 0
            state.bad = bad
            state.fetch_at = next_begin
            state.caught_up = next_begin >= response.max_offset
            return
        if status in _AT_END:
            state.caught_up = True
            return
        if status in _LOST and next_begin > asked:
            self._skip(queue_id, asked, next_begin, pb.GetMessageStatus.Name(status))
        elif status == pb.OFFSET_OVERFLOW_BADLY:
            log.warning(
                "%s/%d: offset %d is past the end %d: moving back to it",
                self.topic,
                queue_id,
                asked,
                next_begin,
            )
        if next_begin == asked:
            state.caught_up = True  # no progress to make: wait instead of spinning
            return
        state.fetch_at = next_begin
        if not state.buffered:
            state.position = next_begin
        state.caught_up = status == pb.NO_MATCHED_MESSAGE and next_begin >= response.max_offset

    def _skip(self, queue_id: int, begin: int, end: int, why: str) -> None:
        self.stats.skipped[queue_id] = self.stats.skipped.get(queue_id, 0) + end - begin
        log.warning(
            "%s/%d: offsets %d..%d are no longer in the store (%s): skipped",
            self.topic,
            queue_id,
            begin,
            end - 1,
            why,
        )

    def _buffered(self) -> bool:
        return any(state.buffered for state in self._queues.values())

    def _next_buffered(self) -> tuple[int, _Queue] | None:
        """The queue to hand out from next: a queue's whole batch, then the next queue's."""
        for q in self._rotated(list(self._queues)):
            state = self._queues[q]
            if state.buffered:
                return q, state
        return None

    def _drain(self) -> list[Message]:
        """Every buffered message, a queue's batch after another's; positions move past them."""
        out: list[Message] = []
        for _, messages, _ in self._drain_parts():
            out.extend(messages[:])
        return out

    def _drain_parts(self) -> list[tuple[int, Sequence[Message], list[int]]]:
        """_drain as (queue id, messages, their queue offsets) a queue, no Message made. A bad
        record a queue has reached is handed out first (raised before anything is drained,
        with on_bad_record="raise"); one after a queue's messages waits for the next call
        (or is skipped now, with "skip")."""
        order = self._rotated(list(self._queues))
        for q in order:
            state = self._queues[q]
            if state.bad is not None and not state.has_messages:
                self._hand_out_bad(state)
        parts: list[tuple[int, Sequence[Message], list[int]]] = []
        for q in order:
            state = self._queues[q]
            if state.has_messages:
                taken, messages = state.taken, state.messages
                parts.append((q, messages.tail(taken), state.offsets[taken:]))
                self.stats.messages += len(messages) - taken
                state.taken = len(messages)
                state.position = state.end
                if state.bad is not None and self.on_bad_record == "skip":
                    self._hand_out_bad(state)
        return parts

    def _hand_out_bad(self, state: _Queue) -> None:
        """The queue's bad record, reached: the position moves past it, then it is raised
        (on_bad_record="raise") or logged and skipped."""
        bad = state.bad
        assert bad is not None
        state.bad = None
        state.position = state.fetch_at
        self.stats.bad_records += 1
        if self.on_bad_record == "raise":
            raise bad
        log.warning("%s; skipped", bad)

    def _rotated(self, queue_ids: list[int]) -> list[int]:
        if not queue_ids:
            return []
        k = self._rotation % len(queue_ids)
        return queue_ids[k:] + queue_ids[:k]

    # -- group offsets ---------------------------------------------------------------------------

    def committed(self, queue_id: int) -> int | None:
        """The group's committed offset of `queue_id`; None when it never committed one."""
        self._check_open()
        group = self._require_group()
        request = pb.FetchOffsetRequest(
            group=group, topic=self.topic, queue_id=_check_queue_id(queue_id)
        )
        response = self._unary(lambda s: s.FetchOffset, request, "ConsumeQueue/FetchOffset")
        return None if response.offset < 0 else response.offset

    def commit(self, offsets: Mapping[int, int] | None = None) -> None:
        """Set the group's offsets: `offsets`, or every queue's position (the next offset to
        read) when None."""
        self._check_open()
        self._require_group()
        if offsets is None:
            offsets = {q: s.position for q, s in self._queues.items()}
        for q, offset in offsets.items():
            _check_queue_id(q)
            if offset < 0:
                raise InvalidArgument(f"offset {offset} is negative", field="offset")
        self._commit(offsets)

    def _commit(self, offsets: Mapping[int, int]) -> None:
        group = self._require_group()
        for q, offset in offsets.items():
            request = pb.CommitOffsetRequest(
                group=group, topic=self.topic, queue_id=q, offset=offset
            )
            self._unary(lambda s: s.CommitOffset, request, "ConsumeQueue/CommitOffset")
            self._last_committed[q] = offset

    def _commit_changed(self) -> None:
        changed = {
            q: s.position
            for q, s in self._queues.items()
            if self._last_committed.get(q) != s.position
        }
        if changed:
            self._commit(changed)
        self._next_auto_commit = time.monotonic() + self.auto_commit_interval_s

    def _maybe_auto_commit(self) -> None:
        if self.auto_commit and time.monotonic() >= self._next_auto_commit:
            self._commit_changed()

    def _require_group(self) -> str:
        if self.group is None:
            raise InvalidArgument(
                "this needs a consumer group: Consumer(..., group=...)", field="group"
            )
        return self.group

    # -- receive / ack ---------------------------------------------------------------------------

    def receive(
        self,
        queue_id: int,
        *,
        max_messages: int = RECEIVE_MESSAGES_DEFAULT,
        invisible_duration_ms: int = INVISIBLE_DURATION_MS_DEFAULT,
        long_poll_ms: int = 0,
    ) -> list[ReceivedMessage]:
        """Messages of `queue_id` for the group, each invisible to the group for
        `invisible_duration_ms` unless acknowledged (then it is delivered again).

        A delivery whose record can never be handed out is acknowledged (settled for the
        group) and, with on_bad_record="raise", raised as BadRecord: at once when the answer
        holds nothing else, else by the next receive() of the queue, before it asks for more
        (the messages received with it are returned first)."""
        self._check_open()
        group = self._require_group()
        queue_id = _check_queue_id(queue_id)
        pending = self._bad_received.get(queue_id)
        if pending:
            self._raise_bad_received(queue_id, pending)
        if max_messages <= 0:
            raise InvalidArgument("max_messages must be positive", field="max_messages")
        if invisible_duration_ms <= 0:
            raise InvalidArgument(
                "invisible_duration_ms must be positive", field="invisible_duration_ms"
            )
        if long_poll_ms < 0:
            raise InvalidArgument("long_poll_ms must not be negative", field="long_poll_ms")
        request = pb.ReceiveRequest(
            group=group,
            topic=self.topic,
            queue_id=queue_id,
            max_messages=max_messages,
            invisible_duration_ms=invisible_duration_ms,
            long_poll_ms=long_poll_ms,
            report_bad_records=True,
        )
        response = self._unary(
            lambda s: s.Receive,
            request,
            _RECEIVE,
            timeout_s=self._pull_timeout_s(long_poll_ms),
        )
        run, _, bad, failed = self._read_answer(queue_id, response, _RECEIVE)
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

    def ack(self, items: Iterable[ReceivedMessage | str], queue_id: int | None = None) -> AckResult:
        """Acknowledge deliveries (ReceivedMessage, or receipt handles of `queue_id`). Stale
        receipts are listed in the result, not raised: the message was delivered again (or
        acked before), and only the newer delivery can be acknowledged."""
        self._check_open()
        group = self._require_group()
        by_queue: dict[int, list[str]] = {}
        for item in items:
            handle, q = self._receipt(item, queue_id)
            by_queue.setdefault(q, []).append(handle)
        stale: list[str] = []
        committed: dict[int, int] = {}
        acked = 0
        for q, handles in by_queue.items():
            for at in range(0, len(handles), ACK_HANDLES_MAX):
                chunk = handles[at : at + ACK_HANDLES_MAX]
                request = pb.AckRequest(
                    group=group, topic=self.topic, queue_id=q, receipt_handles=chunk
                )
                response = self._unary(lambda s: s.Ack, request, "ConsumeQueue/Ack")
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
        group = self._require_group()
        if ms < 0:
            raise InvalidArgument("ms must not be negative", field="invisible_duration_ms")
        handle, q = self._receipt(item, queue_id)
        request = pb.ChangeInvisibleDurationRequest(
            group=group,
            topic=self.topic,
            queue_id=q,
            receipt_handle=handle,
            invisible_duration_ms=ms,
        )
        response = self._unary(
            lambda s: s.ChangeInvisibleDuration, request, "ConsumeQueue/ChangeInvisibleDuration"
        )
        return response.receipt_handle

    @staticmethod
    def _receipt(item: ReceivedMessage | str, queue_id: int | None) -> tuple[str, int]:
        if isinstance(item, ReceivedMessage):
            return item.receipt_handle, item.message.queue_id
        if queue_id is None:
            raise InvalidArgument(
                "a bare receipt handle needs queue_id (or pass the ReceivedMessage)",
                field="queue_id",
            )
        return item, _check_queue_id(queue_id)

    # -- outages ---------------------------------------------------------------------------------

    def _unary(
        self,
        pick: Callable[[pb_grpc.ConsumeQueueStub], Callable[..., T]],
        request: object,
        name: str,
        *,
        timeout_s: float | None = None,
    ) -> T:
        """One consume-queue call, retried through outages."""
        return self._retry(
            lambda: self._conn.call_cq(pick, request, name=name, timeout_s=timeout_s)
        )

    def _retry(self, call: Callable[[], T]) -> T:
        """`call`, again after a pause while every replica answers UNAVAILABLE, until
        reconnect_timeout_s of that."""
        while True:
            try:
                out = call()
            except Unavailable as err:
                self._back_off(err, None)
                continue
            self._recovered()
            return out

    def _back_off(self, err: Unavailable, deadline: float | None) -> bool:
        """Pause before the next attempt. False when `deadline` comes first (the caller gives
        up for now); raises Unavailable once the outage has lasted reconnect_timeout_s."""
        now = time.monotonic()
        # Never reached since the connection was made: a store still starting, or a wrong
        # address or TLS setting, told after connect_timeout_s (not a restart's allowance) and
        # once (no warning before the error).
        never_reached = isinstance(err, StoreUnreachable) and not self._conn.reached
        if self._outage_since is None:
            self._outage_since = now
            self._backoff.reset()
            if not never_reached:
                log.warning("%s: consume queues unavailable (%s); retrying", self.topic, err)
        give_up = self._outage_since + self.reconnect_timeout_s
        if never_reached:
            give_up = min(give_up, self._outage_since + self._settings.connect_timeout_s)
            if now >= give_up:
                self._outage_since = None
                raise err
        if now >= give_up:
            self._outage_since = None
            raise Unavailable(
                f"no consume-queue replica answered for {self.reconnect_timeout_s:g} s "
                f"({', '.join(self._settings.cq)}): {err.details}",
                method=err.method,
            ) from err
        pause = min(self._backoff.pause_s, give_up - now)
        # Counted whether the next attempt comes after this pause or in the caller's next
        # call: a failure that always lands near the deadline (a Follow that waits it out, then
        # fails) was never counted, and nothing watching `retries` saw the outage.
        self.stats.retries += 1
        if deadline is not None and now + pause > deadline:
            return False
        time.sleep(pause)
        self._backoff.grow()
        return True

    def _recovered(self) -> None:
        if self._outage_since is not None:
            log.info(
                "%s: consume queues answer again after %.1f s",
                self.topic,
                time.monotonic() - self._outage_since,
            )
            self._outage_since = None
            self.stats.reconnects += 1


# -- helpers -------------------------------------------------------------------------------------


def _receipt_of(response: pb.PullResponse | pb.ReceiveResponse, index: int) -> str:
    """The receipt of record `index` of a Receive's answer ("" for a Pull's)."""
    if isinstance(response, pb.ReceiveResponse):
        return response.receipt_handles[index]
    return ""


def _check_topic(topic: str) -> str:
    try:
        validate_topic(topic, _LIMITS)
    except domain.InvalidArgument as err:
        raise InvalidArgument(str(err), field="topic") from None
    return topic


def _check_group(group: str | None) -> str | None:
    if group is None:
        return None
    try:
        return validate_group(group)
    except domain.InvalidArgument as err:
        raise InvalidArgument(str(err), field="group") from None


def _check_queue_id(queue_id: int) -> int:
    if not 0 <= queue_id <= _LIMITS.queue_id_max:
        raise InvalidArgument(
            f"queue id {queue_id} is outside [0, {_LIMITS.queue_id_max}]", field="queue_id"
        )
    return queue_id


def _check_tags(tags: Sequence[str] | str) -> tuple[str, ...]:
    """A tag list, or RocketMQ's subscription expression "a || b" ("*" or empty: all)."""
    if isinstance(tags, str):
        tags = tags.split("||")
    names = tuple(t.strip() for t in tags if t.strip())
    return () if "*" in names else names


def _check_max_messages(n: int) -> int:
    if not 0 < n <= PULL_MESSAGES_MAX:
        raise InvalidArgument(
            f"max_messages {n} is outside [1, {PULL_MESSAGES_MAX}]", field="max_messages"
        )
    return n


def _check_start(start: Start, group: str | None) -> Start:
    if isinstance(start, Offset | Timestamp):
        return start
    if isinstance(start, Mapping):
        checked = {}
        for q, n in start.items():
            _check_queue_id(q)
            if n < 0:
                raise InvalidArgument(f"start offset {n} of queue {q} is negative", field="start")
            checked[q] = n
        return checked
    if start not in ("earliest", "latest", "committed"):
        raise InvalidArgument(
            f"start {start!r} is not 'earliest', 'latest', 'committed', an Offset, a "
            "Timestamp or a {queue: offset} dict",
            field="start",
        )
    if start == "committed" and group is None:
        raise InvalidArgument("start='committed' needs a group", field="start")
    return start
