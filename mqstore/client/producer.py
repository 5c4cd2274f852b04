"""Producers: batch messages on their own, pipeline the batches over one AppendStream, and
retry without ever storing a message twice.

    send() ───────┬─> open batch ──(count | bytes | linger)──> sealed requests ──(window)──> stream
    send_batch() ─┘   (shares)                                        ^                        │
                                                                      └─ unanswered, again ────┘

The open batch is a list of shares, a share being what one request carries of one call: a
send()'s one message (`_Message`), or a send_batch()'s run of messages (batch.BatchShare, at
most a request's worth). One builder makes a request of them (`append_request_wire`: its
wire bytes, a MessageBatch per topic), one splitter reads its answer (batch.RequestAnswer:
each share takes its slice) and one path finishes it (`Producer._finish`).

One batch is one AppendRequest with this producer's id and the next sequence. Up to `window`
requests are in flight; the store answers them in order. When the stream breaks (UNAVAILABLE,
a deadline, the commit log restarting) the unanswered requests go back to the front of the
queue and are sent again, in order, with their sequences: the store answers a request it
already stored with the first result (duplicate = true) and stores nothing. `window` stays
below the 5 requests per producer the store remembers (commitlog_svc/producers.py), so every
retry is recognised.

Sequences start at the wall clock in microseconds, so a producer restarted under the same id
(a stable `producer_id`) continues above its previous life: no life sends a request per
microsecond. Should the clock have stepped back between lives, the store answers a first
attempt from the previous life's table (duplicate = true, nothing stored) or refuses it
(FAILED_PRECONDITION: not after the last sequence); such a request was not stored, so it is
sent again under sequences moved far ahead (`_rebase`), never acknowledged for what the store
did not take. Order across such a move is kept among the requests not yet answered.

A request the store refuses as a whole (INVALID_ARGUMENT, FAILED_PRECONDITION, ...) fails the
futures of its messages: a malformed one is answered in its turn on the stream
(AppendResponse.error), which goes on with the requests behind it; any other such error ends
the stream, and only that request fails. A message the store refuses alone (a PutStatus other
than PUT_OK) fails its own future with MessageRefused. Everything else resolves to a
SendResult.

Threads: `send` only touches the open batch under the lock; one sender thread seals batches
and writes them; one receiver thread per stream reads the answers. AsyncProducer puts an
asyncio face on the same machinery (its futures are the thread futures, wrapped).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

import grpc

from mqstore import errors as domain
from mqstore.backoff import Backoff
from mqstore.client.batch import (
    MESSAGE_OVERHEAD_BYTES,
    BatchFuture,
    BatchResult,
    BatchShare,
    RequestAnswer,
    ResultFuture,
    StoreAnswer,
    check_not_reserved,
    mark_producer_thread,
    on_own_thread,
    prepare_batch,
    refuse_wait_on_own_thread,
)
from mqstore.client.compression import COMPRESS_OVER_BYTES_DEFAULT, Compression, compress
from mqstore.client.connection import Connection
from mqstore.client.errors import (
    ClientError,
    InvalidArgument,
    ResourceExhausted,
    StoreUnreachable,
    Unavailable,
    error_for,
    from_rpc_error,
)
from mqstore.client.settings import ClientSettings
from mqstore.formats import _core
from mqstore.formats.javahash import java_string_hash
from mqstore.formats.msgid import UniqIdGenerator, offset_msg_id
from mqstore.formats.properties import (
    KEY_SEPARATOR,
    KEYS,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    TAGS,
    UNIQ_KEY,
    encode_properties,
)
from mqstore.formats.record import producer_properties_bytes_max, validate_topic
from mqstore.limits import MessageLimits
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb

BATCH_MESSAGES_DEFAULT = 1_000
BATCH_BYTES_DEFAULT = 1 << 20
LINGER_MS_DEFAULT = 5.0
# The store remembers the last 5 requests of each producer; a retry must find its request there.
WINDOW_MAX = 5
WINDOW_DEFAULT = 4
QUEUES_PER_TOPIC_DEFAULT = 4  # RocketMQ's defaultTopicQueueNums
RETRY_TIMEOUT_S_DEFAULT = 30.0
BUFFER_BYTES_DEFAULT = 64 << 20  # unsent bytes held before send() blocks (Kafka's buffer.memory)
BLOCK_TIMEOUT_S_DEFAULT = 60.0  # how long send() blocks on a full buffer (Kafka's max.block.ms)
# With several commit-log replicas, an answer this late makes the producer ask the others
# whether one of them leads now (and again this often while it waits): a paused or cut-off
# leader answers nothing and keeps the stream open, while its group elects another within the
# lease TTL (2 s); waiting for request_timeout_s (10 s) would stall every send that long.
LEADER_PROBE_AFTER_S = 0.5
# How long close() waits for the store to end the last stream after the producer's half-close
# (it answers what is left and returns), before cancelling it. The channel is then closed with
# no call of ours in flight, and no thread of ours is inside gRPC when the process exits.
STREAM_END_WAIT_S = 2.0
# A request's share of the 64 MiB gRPC message limit: a batch never grows past it.
REQUEST_BYTES_MAX = 32 << 20
# After a stale answer (a previous life's sequences ahead of ours), sequences jump this far
# ahead, doubling on each further stale answer, at most REBASES_MAX times per request.
REBASE_GAP_FIRST = 1 << 32
REBASES_MAX = 8
# Topic names remembered as valid, so that send() checks a topic once, not per message.
TOPICS_CHECKED_MAX = 1_024
# A message's properties when it carries only its unique id: these, the id, then the end byte.
_UNIQ_ONLY_PREFIX = f"{UNIQ_KEY}{NAME_VALUE_SEPARATOR}".encode()
_PROPERTY_END = PROPERTY_SEPARATOR.encode()

_PUT_OK = pb.PUT_OK
T = TypeVar("T")
log = logging.getLogger(__name__)
# Stream failures after which the unanswered requests are sent again. RESOURCE_EXHAUSTED ends
# an AppendStream only when the server refused it for its cap (append_streams_max) or its call
# queue, before reading a request (a full disk is a per-message status).
_RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)


@dataclass(frozen=True, slots=True)
class SendResult:
    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    msg_id: str  # the offset message id
    uniq_key: str
    size: int
    store_timestamp_ms: int
    duplicate: bool = False  # answered from a retry the store had already stored


class SendFuture(ResultFuture[SendResult]):
    """The result of one send, resolved by the producer's threads (batch.ResultFuture). A
    stored message's SendResult is made when first asked for, from its request's answer
    (a frozen dataclass per message was a tenth of a send's Python time, and a producer that
    checks only errors never asks)."""

    __slots__ = ("_answer", "_message")

    _answer: RequestAnswer
    _message: _Message

    def result(self, timeout: float | None = None) -> SendResult:
        self._wait(timeout)
        if self._error is not None:
            raise self._error
        if self._result is None:
            m, answer = self._message, self._answer
            offset = answer.commit_log_offsets[m.at]
            host = answer.store_host
            self._result = SendResult(
                topic=m.topic,
                queue_id=m.queue_id,
                queue_offset=answer.queue_offsets[m.at],
                commit_log_offset=offset,
                msg_id=offset_msg_id(host, offset) if host else "",
                uniq_key=m.uniq_key,
                size=answer.sizes[m.at],
                store_timestamp_ms=answer.store_timestamp_ms,
                duplicate=answer.duplicate,
            )
        return self._result


@dataclass(slots=True)
class _Message:
    """A send()'s message: a share of one message."""

    count: ClassVar[int] = 1
    topic: str
    queue_id: int
    body: bytes  # as stored (compressed when sys_flag says so)
    properties: bytes
    sys_flag: int
    uniq_key: str
    future: SendFuture
    weight: int
    at: int = 0  # its index in its request's answer, once answered

    def take(self, answer: RequestAnswer, at: int) -> int:
        """Take this message's answer (index `at` in the request); 1 when stored."""
        error = None if answer.all_stored else answer.refused(at, 0)
        if error is None:
            self.at = at
            answer.stored.append(self)  # resolved with the others (RequestAnswer.resolve_stored)
            return 1
        self.future._resolve(None, error)
        return 0


_Share = _Message | BatchShare


@dataclass(slots=True)
class _Request:
    sequence: int
    request: bytes  # the AppendRequest's wire bytes (append_request_wire)
    shares: list[_Share]  # in the order of the answer (append_request_wire)
    count: int  # messages
    weight: int
    sent_at: float = 0.0
    attempts: int = 0  # times written to a stream under its current sequence
    rebases: int = 0


@dataclass
class ProducerStats:
    sent: int = 0  # messages with a result
    failed: int = 0  # messages whose future failed
    requests: int = 0  # requests answered
    retries: int = 0  # requests sent again after a broken stream
    duplicates: int = 0  # answers the store gave from a request it had already stored
    reconnects: int = 0  # streams opened after the first
    leader_moves: int = 0  # streams given up on because another replica led
    rebases: int = 0  # sequence moves after answers from an earlier life of the producer id


def _sequence_base() -> int:
    """The first sequence of a producer's life: the wall clock in microseconds."""
    return time.time_ns() // 1_000


class Appendable(Protocol):
    """What an AppendRequest needs of one message (the Producer's, the Spark writer's rows)."""

    @property
    def topic(self) -> str: ...
    @property
    def queue_id(self) -> int: ...
    @property
    def body(self) -> bytes: ...
    @property
    def properties(self) -> bytes: ...
    @property
    def sys_flag(self) -> int: ...


S = TypeVar("S", bound=Appendable | BatchShare)


def append_request_wire(
    producer_id: str, sequence: int, shares: Sequence[S]
) -> tuple[bytes, list[S]]:
    """The bytes of one AppendRequest of `shares` (single messages, Appendable, or send_batch
    shares): a MessageBatch per topic, topics in order of first appearance, each topic's shares
    in their order. The answer lists the messages batch after batch: the shares come back in
    that order, each with its messages in a row. The compiled core writes the bytes from the
    columns (formats/_core_append.pxi), one copy of each body: a protobuf message filled field by
    field copied every body in and again out when serialized."""
    by_topic: dict[str, list[S]] = {}
    for s in shares:
        by_topic.setdefault(s.topic, []).append(s)
    ordered: list[S] = []
    batches: list[tuple[str, list[int], list[bytes], list[bytes], list[int], int]] = []
    born_ms = time.time_ns() // 1_000_000
    for topic, group in by_topic.items():
        ordered.extend(group)
        queue_ids: list[int] = []
        bodies: list[bytes] = []
        properties: list[bytes] = []
        flags: list[int] = []
        for s in group:
            if isinstance(s, BatchShare):
                s.add_columns(queue_ids, bodies, properties, flags)
            else:
                queue_ids.append(s.queue_id)
                bodies.append(s.body)
                properties.append(s.properties)
                flags.append(s.sys_flag)
        batches.append((topic, queue_ids, bodies, properties, flags if any(flags) else [], born_ms))
    return _core.append_request_wire(producer_id, sequence, batches), ordered


def append_request(
    producer_id: str, sequence: int, shares: Sequence[S]
) -> tuple[pb.AppendRequest, list[S]]:
    """append_request_wire's request as a message, for a caller whose stub serializes one
    (the Spark writer's unary Appends)."""
    wire, ordered = append_request_wire(producer_id, sequence, shares)
    return pb.AppendRequest.FromString(wire), ordered


def build_request(
    producer_id: str, sequence: int, shares: list[_Share], count: int, weight: int
) -> _Request:
    """The producer's request for an open batch (`count` messages, `weight` bytes)."""
    request, ordered = append_request_wire(producer_id, sequence, shares)
    return _Request(sequence, request, ordered, count, weight)


def request_error(response: StoreAnswer) -> ClientError | None:
    """The error of a request the store refused as a whole, answered in its turn on an
    AppendStream (AppendResponse.error); None for an answer with results."""
    if response.error is None:
        return None
    number, message, field = response.error
    try:
        code = _STATUS_BY_NUMBER[number]
    except KeyError:
        code = grpc.StatusCode.UNKNOWN
    return error_for(code, message, field=field, method="CommitLog/AppendStream")


_STATUS_BY_NUMBER = {c.value[0]: c for c in grpc.StatusCode}
_APPEND_STREAM = "/mqstore.commitlog.v1.CommitLog/AppendStream"


class _Stream:
    """One AppendStream call: requests go in through a queue, answers come out of `call`.
    Both stay wire bytes: requests are written by append_request_wire, answers read by the
    core (batch.StoreAnswer), the call neither serializes nor parses."""

    def __init__(self, connection: Connection) -> None:
        self.requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.cancelled_by_us = False
        self.receiver: threading.Thread | None = None  # reads `call`; started by the Producer
        self.target = connection.commitlog_target
        append_stream: Any = connection.channel(self.target).stream_stream(
            _APPEND_STREAM,
            request_serializer=None,
            response_deserializer=None,
        )
        self.call: Any = append_stream(self._requests(), metadata=connection.metadata)

    def _requests(self) -> Iterator[bytes]:
        while True:
            item = self.requests.get()
            if item is None:
                return
            yield item

    def end(self) -> None:
        self.requests.put(None)

    def cancel(self) -> None:
        self.cancelled_by_us = True
        self.end()
        self.call.cancel()

    def finish(self, timeout_s: float) -> None:
        """After end(): wait up to `timeout_s` for the store to end the call and the receiver
        to return; cancel the call if it has not ended by then."""
        if self.receiver is None:
            return
        self.receiver.join(timeout_s)
        if self.receiver.is_alive():
            self.cancel()
            self.receiver.join(timeout_s)


class Producer:
    """A batching, pipelining, idempotent producer (thread-safe; one per process is typical).

    `connection`: a shared Connection (left open on close), or ClientSettings / None for a
    Connection of its own."""

    def __init__(
        self,
        connection: Connection | ClientSettings | None = None,
        *,
        producer_id: str | None = None,
        batch_messages: int = BATCH_MESSAGES_DEFAULT,
        batch_bytes: int = BATCH_BYTES_DEFAULT,
        linger_ms: float = LINGER_MS_DEFAULT,
        window: int = WINDOW_DEFAULT,
        queues_per_topic: int = QUEUES_PER_TOPIC_DEFAULT,
        compression: Compression = Compression.ZLIB,
        compress_over_bytes: int = COMPRESS_OVER_BYTES_DEFAULT,
        retry_timeout_s: float = RETRY_TIMEOUT_S_DEFAULT,
        request_timeout_s: float | None = None,
        buffer_bytes: int = BUFFER_BYTES_DEFAULT,
        block_timeout_s: float = BLOCK_TIMEOUT_S_DEFAULT,
        limits: MessageLimits = MessageLimits(),  # noqa: B008 - frozen, shared default
        first_sequence: int | None = None,
    ) -> None:
        if not 1 <= window <= WINDOW_MAX:
            raise InvalidArgument(f"window must be 1..{WINDOW_MAX}", field="window")
        if batch_messages < 1 or batch_messages > limits.batch_messages_max:
            raise InvalidArgument(
                f"batch_messages must be 1..{limits.batch_messages_max}", field="batch_messages"
            )
        if not 0 < batch_bytes <= REQUEST_BYTES_MAX:
            raise InvalidArgument(
                f"batch_bytes must be 1..{REQUEST_BYTES_MAX}", field="batch_bytes"
            )
        if linger_ms < 0 or queues_per_topic < 1 or retry_timeout_s <= 0 or buffer_bytes < 1:
            raise InvalidArgument(
                "linger_ms >= 0, queues_per_topic >= 1, retry_timeout_s > 0 and buffer_bytes "
                ">= 1 are required"
            )
        if isinstance(connection, Connection):
            self._conn, self._own_conn = connection, False
        else:
            self._conn, self._own_conn = Connection(connection), True
        self.producer_id = producer_id or f"mqstore-py-{uuid.uuid4().hex}"
        if not self.producer_id or len(self.producer_id.encode()) > 256:
            raise InvalidArgument("producer_id must be 1..256 bytes", field="producer_id")
        self.batch_messages = batch_messages
        self.batch_bytes = batch_bytes
        self.linger_s = linger_ms / 1000
        self.window = window
        self.queues_per_topic = queues_per_topic
        self.compression = compression
        self.compress_over_bytes = compress_over_bytes
        self.retry_timeout_s = retry_timeout_s
        self.request_timeout_s = request_timeout_s or self._conn.settings.timeout_s
        self.buffer_bytes = buffer_bytes
        self.block_timeout_s = block_timeout_s
        self.limits = limits
        self.stats = ProducerStats()

        self._ids = UniqIdGenerator()
        self._topics_checked: set[str] = set()
        self._round_robin = itertools.count()
        # `first_sequence`: for a producer that keeps its own numbering across restarts.
        self._sequences = itertools.count(
            _sequence_base() if first_sequence is None else first_sequence
        )
        self._rebase_gap = REBASE_GAP_FIRST
        # First attempts the store answered from a previous life's table: not stored, to be
        # sent again under new sequences once the stream has answered everything in flight.
        self._stale: list[_Request] = []
        self._cond = threading.Condition()
        # What lingers: the shares of the next request (send()'s messages, send_batch()'s).
        self._open: list[_Share] = []
        self._open_count = 0  # messages in _open
        self._open_weight = 0
        self._open_since = 0.0
        self._sealed: deque[_Request] = deque()
        self._inflight: deque[_Request] = deque()
        self._buffered = 0  # weight of messages without a result yet
        self._flushing = 0
        self._closing = False
        self._closed = False
        self._stream: _Stream | None = None
        self._last_stream: _Stream | None = None  # the one open when the sender stopped
        self._streams_opened = 0
        self._retry_at = 0.0
        self._failing_since: float | None = None
        self._last_error: ClientError | None = None  # of the last stream that failed
        # Asking the other replicas whether one leads (a late answer, several replicas).
        self._several_replicas = len(self._conn.settings.commitlog_targets) > 1
        self._probing = False
        self._probe_at = 0.0
        self._leader_found = False  # the next stream goes where the probe found the leader
        self._backoff = Backoff()  # between streams while the commit log fails
        self._sender = threading.Thread(target=self._run, name="mqstore-producer", daemon=True)
        self._sender.start()

    # -- sending --------------------------------------------------------------------------------

    def send(
        self,
        topic: str,
        body: bytes,
        *,
        key: str | None = None,
        keys: list[str] | None = None,
        tags: str = "",
        properties: Mapping[str, str] | None = None,
        queue_id: int | None = None,
        uniq_key: str | None = None,
    ) -> SendFuture:
        """Queue one message; the future resolves once the store answered for it. Bad input
        raises InvalidArgument here, before anything is queued."""
        message = self._prepare(topic, body, key, keys, tags, properties, queue_id, uniq_key)
        with self._cond:
            if self._buffered + message.weight > self.buffer_bytes or self._closing:
                self._wait_for_room(message.weight, time.monotonic() + self.block_timeout_s)
            self._join(message)
        return message.future

    def send_batch(
        self,
        topic: str,
        bodies: Sequence[bytes],
        *,
        keys: Sequence[str] | None = None,
        tags: str = "",
        properties: Mapping[str, str] | None = None,
        queue_id: int | None = None,
    ) -> BatchFuture:
        """Queue many messages of one topic as columns (batch.py): no object per message.
        `keys`: one key per body (or None); `tags` and `properties` apply to all; `queue_id`:
        all to one queue, else by key hash, else contiguous runs over the topic's queues.
        Each message gets its own UNIQ_KEY. Sent in order after everything sent before;
        split into requests of at most batch_messages / batch_bytes, each idempotent as send's.
        A batch smaller than a request lingers as send's messages do, joined by the batches
        that follow it (a caller sending a few messages every millisecond makes one request
        every linger, not one a call); waiting for its result sends it at once.
        Bad input raises InvalidArgument here, before anything is queued. A full buffer
        (ResourceExhausted past block_timeout_s) raises only while nothing of the batch is
        queued; later, the messages not queued fail in the future's BatchNotStored."""
        self._check_topic(topic)
        n = len(bodies)
        if n == 0:
            raise InvalidArgument("a batch needs at least one body", field="bodies")
        prepared = prepare_batch(
            topic,
            bodies,
            keys=keys,
            tags=tags,
            properties=properties,
            queue_id=queue_id,
            uniq_keys=self._ids.next_ids(n),
            first_queue=next(self._round_robin),
            queues_per_topic=self.queues_per_topic,
            compression=self.compression,
            compress_over_bytes=self.compress_over_bytes,
            limits=self.limits,
            share_messages=self.batch_messages,
            share_bytes=self.batch_bytes,
        )
        result = BatchResult(
            topic,
            prepared.queue_ids,
            prepared.uniq_keys,
            queue_offsets=[-1] * n,
            commit_log_offsets=[-1] * n,
            sizes=[0] * n,
            store_timestamps_ms=[0] * n,
        )
        future = BatchFuture(result, len(prepared.shares), self._hurry, self)
        deadline = time.monotonic() + self.block_timeout_s
        for k, (first, end, weight) in enumerate(prepared.shares):
            share = BatchShare(future, prepared, first, end - first, weight)
            try:
                with self._cond:
                    self._wait_for_room(weight, deadline)
                    self._join(share)
            except ClientError as err:
                if k == 0:
                    raise  # nothing of the batch is queued: the call fails as a whole
                # Shares are on their way: the rest fail with the reason, and the future tells
                # which messages were not stored (BatchNotStored) once the sent ones answer.
                failed = RequestAnswer(err)
                for rest_first, rest_end, rest_weight in prepared.shares[k:]:
                    rest = BatchShare(
                        future, prepared, rest_first, rest_end - rest_first, rest_weight
                    )
                    rest.take(failed, 0)
                with self._cond:
                    self.stats.failed += n - first
                break
        return future

    def _join(self, share: _Share) -> None:
        """Under the lock, with room in the buffer: `share` joins the open batch, sealed first
        when the share would overflow it and after when full. What lingers is joined by the
        shares that follow it until a request is full (a paced caller's small sends go as one
        request, not one each)."""
        wake = False
        if self._open and (
            self._open_count + share.count > self.batch_messages
            or self._open_weight + share.weight > self.batch_bytes
        ):
            self._seal()  # what was sent before goes first
            wake = True
        if not self._open:
            self._open_since = time.monotonic()
            wake = True  # the sender sets its linger wake-up
        self._open.append(share)
        self._open_count += share.count
        self._open_weight += share.weight
        self._buffered += share.weight
        if self._open_count >= self.batch_messages or self._open_weight >= self.batch_bytes:
            self._seal()
            wake = True
        # A share joining a lingering request wakes nobody: the sender already waits for that
        # request's linger to end (a paced caller's 1,000 calls a second woke it 1,000 times a
        # second).
        if wake:
            self._cond.notify_all()

    def _hurry(self, future: BatchFuture) -> None:
        """Someone waits for `future`: what of it still lingers goes now."""
        with self._cond:
            if any(s.future is future for s in self._open):
                self._seal()
                self._cond.notify_all()

    def _wait_for_room(self, weight: int, deadline: float) -> None:
        """Under the lock: block until `weight` more bytes fit the buffer (Kafka's
        buffer.memory); ResourceExhausted past the deadline, InvalidArgument once closed.
        What lingers is sent first: it may be what holds the room."""
        if self._buffered + weight > self.buffer_bytes and self._lingering:
            self._seal()
            self._cond.notify_all()
        while self._buffered + weight > self.buffer_bytes and self._buffered > 0:
            if self._closing:
                break
            if on_own_thread(self):
                raise ResourceExhausted(
                    f"the producer's buffer ({self.buffer_bytes} bytes) is full, and a send "
                    "callback cannot wait for room: the thread it runs on is the one that "
                    "frees it"
                )
            left = deadline - time.monotonic()
            if left <= 0:
                raise ResourceExhausted(
                    f"the producer's buffer ({self.buffer_bytes} bytes) stayed full for "
                    f"{self.block_timeout_s} s: the store is not keeping up or unreachable"
                )
            self._cond.wait(left)
        if self._closing:
            raise InvalidArgument("the producer is closed")

    def send_sync(self, topic: str, body: bytes, **options: Any) -> SendResult:
        """Send one message and wait for its result (lingers no longer than needed: flushes)."""
        future = self.send(topic, body, **options)
        with self._cond:
            if self._open and self._open[-1].future is future:
                self._seal()
                self._cond.notify_all()
        return future.result()

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every message sent so far has its result (success or failure)."""
        refuse_wait_on_own_thread(self, "flush()")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            self._flushing += 1
            try:
                if self._lingering:
                    self._seal()
                self._cond.notify_all()
                while self._lingering or self._sealed or self._inflight:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError(f"flush did not finish within {timeout_s} s")
                    self._cond.wait(left)
            finally:
                self._flushing -= 1

    def close(self, timeout_s: float | None = None) -> None:
        """Flush, end the stream, stop the threads; close the connection if it is ours."""
        if self._closed:
            return
        refuse_wait_on_own_thread(self, "close()")
        try:
            self.flush(timeout_s)
        finally:
            with self._cond:
                self._closing = True
                self._cond.notify_all()
            self._sender.join(timeout_s)
            last = self._last_stream
            if last is not None:
                last.finish(STREAM_END_WAIT_S if timeout_s is None else timeout_s)
            self._closed = True
            if self._own_conn:
                self._conn.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- message preparation (the caller's thread) ---------------------------------------------

    def _check_topic(self, topic: str) -> None:
        if topic not in self._topics_checked:  # a few topics, sent to again and again
            try:
                validate_topic(topic, self.limits)
            except domain.InvalidArgument as exc:
                raise InvalidArgument(str(exc), field="topic") from None
            if len(self._topics_checked) < TOPICS_CHECKED_MAX:
                self._topics_checked.add(topic)

    def _prepare(
        self,
        topic: str,
        body: bytes,
        key: str | None,
        keys: list[str] | None,
        tags: str,
        properties: Mapping[str, str] | None,
        queue_id: int | None,
        uniq_key: str | None,
    ) -> _Message:
        self._check_topic(topic)
        if not isinstance(body, bytes | bytearray | memoryview):
            raise InvalidArgument("a body is bytes", field="body")
        body = bytes(body)
        if len(body) > self.limits.body_bytes_max:
            raise InvalidArgument(
                f"body is {len(body)} bytes, over the {self.limits.body_bytes_max}-byte limit",
                field="body",
            )
        if key or keys or tags or properties or uniq_key or queue_id is not None:
            queue_id, uniq, encoded = self._route(key, keys, tags, properties, queue_id, uniq_key)
        else:
            # The usual send, a body and nothing else: the bytes encode_properties makes of
            # {UNIQ_KEY: id} (an id is hex), without the checks that cannot fail here.
            uniq = self._ids.next_id()
            encoded = _UNIQ_ONLY_PREFIX + uniq.encode("ascii") + _PROPERTY_END
            queue_id = next(self._round_robin) % self.queues_per_topic
        sys_flag = 0
        if len(body) > self.compress_over_bytes:
            body, sys_flag = compress(body, self.compression)
        weight = len(body) + len(encoded) + MESSAGE_OVERHEAD_BYTES
        return _Message(topic, queue_id, body, encoded, sys_flag, uniq, SendFuture(self), weight)

    def _route(
        self,
        key: str | None,
        keys: list[str] | None,
        tags: str,
        properties: Mapping[str, str] | None,
        queue_id: int | None,
        uniq_key: str | None,
    ) -> tuple[int, str, bytes]:
        """(queue id, unique id, encoded properties) of a send with options, checked."""
        all_keys = ([key] if key else []) + list(keys or [])
        if any(not k or KEY_SEPARATOR in k for k in all_keys):
            raise InvalidArgument("keys must be non-empty and hold no space", field="keys")
        if queue_id is None:
            if all_keys:
                queue_id = abs(java_string_hash(all_keys[0])) % self.queues_per_topic
            else:
                queue_id = next(self._round_robin) % self.queues_per_topic
        elif not 0 <= queue_id <= self.limits.queue_id_max:
            raise InvalidArgument(
                f"queue_id must be 0..{self.limits.queue_id_max}", field="queue_id"
            )
        uniq = uniq_key or self._ids.next_id()
        props: dict[str, str] = dict(properties or {})
        check_not_reserved(props)
        if tags:
            props[TAGS] = tags
        if all_keys:
            props[KEYS] = KEY_SEPARATOR.join(all_keys)
        props[UNIQ_KEY] = uniq
        try:
            encoded = encode_properties(props)
        except ValueError as exc:
            raise InvalidArgument(str(exc), field="properties") from None
        if len(encoded) > producer_properties_bytes_max(self.limits):
            raise InvalidArgument(
                f"properties are {len(encoded)} bytes encoded, over the "
                f"{producer_properties_bytes_max(self.limits)}-byte limit (the store's "
                f"{self.limits.properties_bytes_max} less its record CRC property)",
                field="properties",
            )
        return queue_id, uniq, encoded

    # -- the sender thread ----------------------------------------------------------------------

    @property
    def _lingering(self) -> bool:
        """Under the lock: messages or shares wait in the open batch."""
        return bool(self._open)

    def _seal(self) -> None:
        """Turn what lingers into a request with the next sequence (under the lock)."""
        self._sealed.append(
            build_request(
                self.producer_id,
                next(self._sequences),
                self._open,
                self._open_count,
                self._open_weight,
            )
        )
        self._open = []
        self._open_count = 0
        self._open_weight = 0

    def _run(self) -> None:
        mark_producer_thread(self)
        while True:
            to_fail: list[tuple[_Request, ClientError]] = []
            open_stream = False
            with self._cond:
                lingering = self._lingering
                if self._closing and not (lingering or self._sealed or self._inflight):
                    break
                now = time.monotonic()
                if lingering and (
                    now - self._open_since >= self.linger_s or self._flushing or self._closing
                ):
                    self._seal()
                work = self._sealed or self._inflight
                if work and self._stream is None:
                    gave_up = self._gave_up(now)
                    if gave_up is not None:
                        to_fail = [(r, gave_up) for r in (*self._inflight, *self._sealed)]
                        self._inflight.clear()
                        self._sealed.clear()
                        self._failing_since = None
                    elif now >= self._retry_at:
                        open_stream = True
                if self._stale and not self._inflight:
                    to_fail.extend(self._rebase())
                if self._stream is not None:
                    while self._sealed and not self._stale and len(self._inflight) < self.window:
                        r = self._sealed.popleft()
                        r.sent_at = now
                        r.attempts += 1
                        self._inflight.append(r)
                        self._stream.requests.put(r.request)
                    head = self._inflight[0] if self._inflight else None
                    if head is not None and now - head.sent_at > self.request_timeout_s:
                        self._stream.cancel()  # the receiver retries what is unanswered
                        head.sent_at = now
                    elif (
                        head is not None
                        and self._several_replicas
                        and not self._probing
                        and now - head.sent_at > LEADER_PROBE_AFTER_S
                        and now >= self._probe_at
                    ):
                        self._probing = True
                        self._probe_at = now + LEADER_PROBE_AFTER_S
                        threading.Thread(
                            target=self._probe_leader,
                            args=(self._stream,),
                            name="mqstore-producer-probe",
                            daemon=True,
                        ).start()
                if not (open_stream or to_fail):
                    self._cond.wait(self._next_wake(now))
            for r, failure in to_fail:
                self._finish(r, failure)
            if open_stream:
                self._open_stream()
        with self._cond:
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.end()
            self._last_stream = stream

    def _gave_up(self, now: float) -> ClientError | None:
        """Under the lock, while no stream is open: the error that ends the retries, once
        they are over; None while they go on. A store never reached since the connection was
        made is given `connect_timeout_s` (a wrong address or TLS setting does not get
        better); an outage of a store that answered before, `retry_timeout_s`."""
        if self._failing_since is None:
            return None
        last = self._last_error
        never_reached = isinstance(last, StoreUnreachable) and not self._conn.reached
        limit_s = self.retry_timeout_s
        if never_reached:
            limit_s = min(limit_s, self._conn.settings.connect_timeout_s)
        if now - self._failing_since < limit_s:
            return None
        if never_reached:
            assert last is not None
            return last
        after = f": {last}" if last is not None else ""
        return Unavailable(
            f"the commit log did not take the messages within {self.retry_timeout_s} s of "
            f"retries{after}",
            method="CommitLog/AppendStream",
        )

    def _next_wake(self, now: float) -> float:
        waits = [1.0]
        if self._lingering:
            waits.append(self._open_since + self.linger_s - now)
        if self._inflight:
            waits.append(self._inflight[0].sent_at + self.request_timeout_s - now)
            if self._several_replicas and not self._probing:
                probe_at = max(self._inflight[0].sent_at + LEADER_PROBE_AFTER_S, self._probe_at)
                waits.append(probe_at - now)
        if self._stream is None and (self._sealed or self._inflight):
            waits.append(self._retry_at - now)
        return max(0.001, min(waits))

    def _probe_leader(self, stream: _Stream) -> None:
        """An answer is late: when another replica leads, give up the stream (its unanswered
        requests go again, with their sequences, to the leader found)."""
        try:
            moved = self._conn.leader_elsewhere()
        except ClientError:  # the connection is closed
            moved = None
        with self._cond:
            self._probing = False
            if moved is not None and self._stream is stream:
                log.warning("the commit log's leader moved to %s: sending there", moved)
                self._leader_found = True
                self.stats.leader_moves += 1
                stream.cancel()
            self._cond.notify_all()

    def _open_stream(self) -> None:
        try:
            if self._leader_found:
                self._leader_found = False  # a probe just found it: go there
            elif self._streams_opened:
                # The last stream failed: with a broker group, the leader may have moved.
                self._conn.find_commitlog_leader()
            stream = _Stream(self._conn)
        except ClientError as err:  # the connection is closed
            with self._cond:
                failed = [*self._inflight, *self._sealed]
                self._inflight.clear()
                self._sealed.clear()
            for r in failed:
                self._finish(r, err)
            return
        with self._cond:
            if self._streams_opened:
                self.stats.reconnects += 1
            self._streams_opened += 1
            self._stream = stream
            # Unanswered requests of the broken stream go first, in order.
            pending = list(self._inflight)
            self._inflight.clear()
            self._sealed.extendleft(reversed(pending))
            self.stats.retries += len(pending)
            self._cond.notify_all()
        stream.receiver = threading.Thread(
            target=self._receive, args=(stream,), name="mqstore-producer-recv", daemon=True
        )
        stream.receiver.start()

    def _receive(self, stream: _Stream) -> None:
        mark_producer_thread(self)
        error: ClientError | None = None
        try:
            for raw in stream.call:
                self._conn.mark_reached()
                try:
                    answer = StoreAnswer.read(raw)
                except ValueError as exc:  # what a failed parse of the response was: INTERNAL
                    error = ClientError(
                        f"the store's answer cannot be read: {exc}",
                        code=grpc.StatusCode.INTERNAL,
                        method="CommitLog/AppendStream",
                    )
                    break
                with self._cond:
                    if self._stream is not stream or not self._inflight:
                        break
                    head = self._inflight[0]
                    if answer.sequence != head.sequence:
                        error = ClientError(
                            f"answer for sequence {answer.sequence}, expected {head.sequence}",
                            code=grpc.StatusCode.INTERNAL,
                        )
                        break
                    self._inflight.popleft()
                    self._failing_since = None
                    self._backoff.reset()
                    # A request refused alone (malformed): it fails, the stream goes on.
                    refused = request_error(answer)
                    if refused is None:
                        if answer.duplicate and head.attempts == 1:
                            # Answered from the table before this life sent it: not stored.
                            self._stale.append(head)
                            self._cond.notify_all()
                            continue
                        self.stats.requests += 1
                        if answer.duplicate:
                            self.stats.duplicates += 1
                self._finish(head, answer if refused is None else refused)
        except grpc.RpcError as err:
            error = self._conn.explain(from_rpc_error(err, "CommitLog/AppendStream"), stream.target)
        self._stream_ended(stream, error)

    def _stream_ended(self, stream: _Stream, error: ClientError | None) -> None:
        """A stream ended: retry what it left unanswered; a whole-request refusal fails the
        request it belongs to (the first unanswered: the store answers in order)."""
        failed: _Request | None = None
        with self._cond:
            if self._stream is not stream:
                return
            self._stream = None
            stream.end()
            retryable = error is None or error.code in _RETRYABLE or stream.cancelled_by_us
            if not self._inflight and error is None:
                self._cond.notify_all()
                return
            if retryable:
                self._back_off(error)
            elif (
                error is not None
                and error.code == grpc.StatusCode.FAILED_PRECONDITION
                and self._inflight
                and self._inflight[0].attempts == 1
            ):
                # Not after the last sequence the store knows for this id (a previous life):
                # refused before anything was written, and the store read nothing after it.
                self._stale.append(self._inflight.popleft())
                self._sealed.extendleft(reversed(self._inflight))
                self._inflight.clear()
            elif self._inflight:
                failed = self._inflight.popleft()
            elif self._sealed:  # refused before a request was written (no token, say)
                failed = self._sealed.popleft()
            self._cond.notify_all()
        if failed is not None and error is not None:
            self._finish(failed, error)

    def _rebase(self) -> list[tuple[_Request, ClientError]]:
        """Under the lock, with nothing in flight: move the sequences far ahead and give the
        stale requests, then every unsent one, new sequences in order. A request written
        before under its sequence (attempts > 1, outcome unknown) cannot move: it fails."""
        failed: list[tuple[_Request, ClientError]] = []
        moving: list[_Request] = []
        for r in [*self._stale, *self._sealed]:
            if r.attempts > 1 or r.rebases >= REBASES_MAX:
                failed.append(
                    (
                        r,
                        ClientError(
                            f"producer id {self.producer_id!r} is in use by another producer or "
                            "an earlier life whose sequences could not be passed; not stored",
                            code=grpc.StatusCode.FAILED_PRECONDITION,
                            method="CommitLog/AppendStream",
                        )
                        if r.attempts <= 1
                        else Unavailable(
                            "outcome unknown: the request could not be confirmed after its "
                            "producer id's sequences moved",
                            method="CommitLog/AppendStream",
                        ),
                    )
                )
                continue
            moving.append(r)
        self._stale.clear()
        self._sealed.clear()
        start = max(next(self._sequences), _sequence_base()) + self._rebase_gap
        self._rebase_gap = min(self._rebase_gap * 2, 1 << 60)
        self._sequences = itertools.count(start)
        for r in moving:
            r.sequence = next(self._sequences)
            r.request = append_request_wire(self.producer_id, r.sequence, r.shares)[0]
            r.attempts = 0
            r.rebases += 1
            self._sealed.append(r)
        self.stats.rebases += 1
        log.warning(
            "producer %r: the store knew later sequences of this id (an earlier life with a "
            "clock ahead of ours?); %d request(s) sent again from sequence %d",
            self.producer_id,
            len(moving),
            start,
        )
        return failed

    def _back_off(self, error: ClientError | None) -> None:
        """The next stream opens after the backoff's next pause (under the lock); retries end
        `retry_timeout_s` after the first failure without an answer (`_gave_up`)."""
        now = time.monotonic()
        self._last_error = error
        if self._failing_since is None:
            self._failing_since = now
        self._retry_at = now + self._backoff.next_s()

    def _finish(self, request: _Request, outcome: StoreAnswer | ClientError) -> None:
        """Resolve the futures of an answered request (or fail them with `outcome`)."""
        answer = RequestAnswer.of(outcome, request.count)
        ok = 0
        at = 0
        for share in request.shares:
            ok += share.take(answer, at)
            at += share.count
        answer.resolve_stored()
        n = request.count
        with self._cond:
            self.stats.sent += ok
            self.stats.failed += n - ok
            self._buffered -= request.weight
            self._cond.notify_all()


class AsyncProducer:
    """The asyncio flavour: the same batching, pipelining and retries (run by the producer's
    threads), with awaitable results. `send` never blocks the event loop: when the buffer is
    full it waits in an executor.

        async with AsyncProducer(settings) as p:
            result = await p.send("orders", b"...", key="order-42")
    """

    def __init__(
        self, connection: Connection | ClientSettings | None = None, **options: Any
    ) -> None:
        self.producer = Producer(connection, **options)

    @property
    def stats(self) -> ProducerStats:
        return self.producer.stats

    def send_nowait(self, topic: str, body: bytes, **options: Any) -> asyncio.Future[SendResult]:
        """Queue a message now (raises on bad input; may block briefly on a full buffer) and
        return a future for its result."""
        return _bridge(self.producer.send(topic, body, **options))

    async def send(self, topic: str, body: bytes, **options: Any) -> SendResult:
        p = self.producer
        if p._buffered >= p.buffer_bytes:  # full: wait for room off the event loop
            loop = asyncio.get_running_loop()
            future = await loop.run_in_executor(None, lambda: p.send(topic, body, **options))
            return await _bridge(future)
        return await _bridge(p.send(topic, body, **options))

    async def send_batch(self, topic: str, bodies: Sequence[bytes], **options: Any) -> BatchResult:
        """Producer.send_batch, awaited (queued off the event loop: it may block on a full
        buffer). Awaiting it is waiting for it, as result() is: what of it lingers goes once
        the tasks ready now had their turn (their batches join it)."""
        loop = asyncio.get_running_loop()
        future = await loop.run_in_executor(
            None, lambda: self.producer.send_batch(topic, bodies, **options)
        )
        loop.call_soon(self.producer._hurry, future)
        return await _bridge(future)

    async def flush(self, timeout_s: float | None = None) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.producer.flush, timeout_s)

    async def close(self, timeout_s: float | None = None) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.producer.close, timeout_s)

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _bridge(future: ResultFuture[T]) -> asyncio.Future[T]:
    """An asyncio future of the running loop that follows a producer's future."""
    loop = asyncio.get_running_loop()
    out: asyncio.Future[T] = loop.create_future()

    def settle(done: ResultFuture[T]) -> None:
        if out.cancelled():
            return
        error = done.exception()
        if error is not None:
            out.set_exception(error)
        else:
            out.set_result(done.result())

    future.add_done_callback(lambda done: loop.call_soon_threadsafe(settle, done))
    return out
