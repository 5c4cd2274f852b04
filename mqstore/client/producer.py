"""Producers: batch messages on their own, pipeline the batches over one AppendStream, and
retry without ever storing a message twice.

    send() ───────┬─> open batch ──(count | bytes | linger)──> sealed requests ──(window)──> stream
    send_batch() ─┘   (or its shares smaller than a request)          ^                        │
                                                                      └─ unanswered, again ────┘

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
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import grpc

from mqstore import errors as domain
from mqstore.client.batch import (
    MESSAGE_OVERHEAD_BYTES,
    BatchFuture,
    BatchPart,
    BatchResult,
    PreparedBatch,
    ResultFuture,
    check_not_reserved,
    mark_producer_thread,
    on_own_thread,
    prepare_batch,
    refuse_wait_on_own_thread,
    resolve_stored,
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
    refusal,
)
from mqstore.client.settings import ClientSettings
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
BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 1.0
# With several commit-log replicas, an answer this late makes the producer ask the others
# whether one of them leads now (and again this often while it waits): a paused or cut-off
# leader answers nothing and keeps the stream open, while its group elects another within the
# lease TTL (2 s); waiting for request_timeout_s (10 s) would stall every send that long.
LEADER_PROBE_AFTER_S = 0.5
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

    __slots__ = ("_answer", "_index")

    _answer: _StoredAnswer
    _index: int

    def result(self, timeout: float | None = None) -> SendResult:
        self._wait(timeout)
        if self._error is not None:
            raise self._error
        if self._result is None:
            self._result = self._answer.result(self._index)
        return self._result


@dataclass(slots=True)
class _StoredAnswer:
    """The store's answer to one request, as columns: every message's SendResult on demand."""

    messages: list[_Message]
    queue_offsets: list[int]
    commit_log_offsets: list[int]
    sizes: list[int]
    store_host: bytes
    store_timestamp_ms: int
    duplicate: bool

    @classmethod
    def of(cls, messages: list[_Message], response: pb.AppendResponse) -> _StoredAnswer:
        return cls(
            messages,
            list(response.queue_offsets),
            list(response.commit_log_offsets),
            list(response.sizes),
            response.store_host,
            response.store_timestamp_ms,
            response.duplicate,
        )

    def result(self, i: int) -> SendResult:
        m = self.messages[i]
        offset = self.commit_log_offsets[i]
        host = self.store_host
        return SendResult(
            topic=m.topic,
            queue_id=m.queue_id,
            queue_offset=self.queue_offsets[i],
            commit_log_offset=offset,
            msg_id=offset_msg_id(host, offset) if host else "",
            uniq_key=m.uniq_key,
            size=self.sizes[i],
            store_timestamp_ms=self.store_timestamp_ms,
            duplicate=self.duplicate,
        )

    def resolve(self) -> None:
        """Resolve every message's future as stored (one take of the futures' lock)."""
        resolve_stored([m.future for m in self.messages], self)


@dataclass(slots=True)
class _Message:
    topic: str
    queue_id: int
    body: bytes  # as stored (compressed when sys_flag says so)
    properties: bytes
    sys_flag: int
    uniq_key: str
    future: SendFuture

    def weight(self) -> int:
        return len(self.body) + len(self.properties) + MESSAGE_OVERHEAD_BYTES


@dataclass(slots=True)
class _Request:
    sequence: int
    request: pb.AppendRequest
    messages: list[_Message]  # in the order of the answer (batches concatenated)
    weight: int
    # send_batch shares instead of messages: one MessageBatch each, answered in this order.
    parts: list[BatchPart] = field(default_factory=list)
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


M = TypeVar("M", bound=Appendable)


def append_request(
    producer_id: str, sequence: int, messages: Sequence[M]
) -> tuple[pb.AppendRequest, list[M]]:
    """One AppendRequest: a MessageBatch per topic, topics in order of first appearance. The
    answer lists the messages batch after batch: the messages come back in that order."""
    by_topic: dict[str, list[M]] = {}
    for m in messages:
        by_topic.setdefault(m.topic, []).append(m)
    ordered: list[M] = []
    # Batches are made inside the request: a MessageBatch built apart is copied, bodies and
    # all, when a request takes it.
    request = pb.AppendRequest(producer_id=producer_id, sequence=sequence)
    born_ms = time.time_ns() // 1_000_000
    for topic, group in by_topic.items():
        ordered.extend(group)
        flags = [m.sys_flag for m in group]
        request.batches.add(
            topic=topic,
            queue_ids=[m.queue_id for m in group],
            bodies=[m.body for m in group],
            properties=[m.properties for m in group],
            sys_flags=flags if any(flags) else [],
            born_timestamp_ms=born_ms,
        )
    return request, ordered


def build_request(producer_id: str, sequence: int, messages: list[_Message]) -> _Request:
    """The producer's request for an open batch, its messages in the order of the answer."""
    request, ordered = append_request(producer_id, sequence, messages)
    return _Request(sequence, request, ordered, sum(m.weight() for m in messages))


@dataclass(slots=True)
class _OpenPart:
    """A send_batch share that lingers: its messages and its weight."""

    prepared: PreparedBatch
    part: BatchPart
    weight: int


def parts_request(producer_id: str, sequence: int, parts: list[_OpenPart]) -> _Request:
    """One request of the lingering send_batch shares, in order; shares of one topic in a row
    go as one MessageBatch (the store's work is per batch as well as per message)."""
    request = pb.AppendRequest(producer_id=producer_id, sequence=sequence)
    born_ms = time.time_ns() // 1_000_000  # as append_request: no message born before its call
    batch: pb.MessageBatch | None = None
    for p in parts:
        if batch is None or batch.topic != p.prepared.topic:
            batch = request.batches.add(topic=p.prepared.topic, born_timestamp_ms=born_ms)
        p.prepared.add_to(batch, p.part.first, p.part.first + p.part.count)
    weight = sum(p.weight for p in parts)
    return _Request(sequence, request, [], weight, [p.part for p in parts])


def part_answers(
    parts: list[BatchPart], outcome: pb.AppendResponse | ClientError
) -> list[pb.AppendResponse | ClientError]:
    """Each share's answer out of its request's (its slice of every column, its refusals
    numbered from its own first message); an answer of the wrong length goes to every share
    as it is, and each share reports it."""
    if isinstance(outcome, ClientError) or len(parts) == 1:
        return [outcome] * len(parts)
    n = sum(p.count for p in parts)
    if len(outcome.statuses) != n or len(outcome.commit_log_offsets) != n:
        return [outcome] * len(parts)
    answers: list[pb.AppendResponse | ClientError] = []
    lo = 0
    for part in parts:
        hi = lo + part.count
        answer = pb.AppendResponse(
            statuses=outcome.statuses[lo:hi],
            commit_log_offsets=outcome.commit_log_offsets[lo:hi],
            sizes=outcome.sizes[lo:hi],
            queue_offsets=outcome.queue_offsets[lo:hi],
            store_timestamp_ms=outcome.store_timestamp_ms,
            store_host=outcome.store_host,
            duplicate=outcome.duplicate,
            sequence=outcome.sequence,
        )
        for r in outcome.refusals:
            if lo <= r.index < hi:
                answer.refusals.add(
                    index=r.index - lo, status=r.status, reason=r.reason, field=r.field
                )
        answers.append(answer)
        lo = hi
    return answers


def _all_stored(response: pb.AppendResponse, n: int) -> bool:
    """Every one of the `n` messages answered PUT_OK, with every column whole."""
    return (
        len(response.statuses) == n
        and len(response.commit_log_offsets) == n
        and len(response.queue_offsets) == n
        and len(response.sizes) == n
        and list(response.statuses).count(_PUT_OK) == n
    )


def results_of(request: _Request, response: pb.AppendResponse) -> list[SendResult | ClientError]:
    """Each message's outcome, in the order of `request.messages`."""
    n = len(request.messages)
    if len(response.statuses) != n or len(response.commit_log_offsets) != n:
        bad = ClientError(
            f"the store answered {len(response.statuses)} results for {n} messages",
            code=grpc.StatusCode.INTERNAL,
            method="CommitLog/AppendStream",
        )
        return [bad] * n
    statuses = list(response.statuses)
    answer = _StoredAnswer.of(request.messages, response)
    refusals = {r.index: r for r in response.refusals}
    out: list[SendResult | ClientError] = []
    for i, status in enumerate(statuses):
        if status == _PUT_OK:
            out.append(answer.result(i))
            continue
        r = refusals.get(i)
        name = pb.PutStatus.Name(status)
        out.append(refusal(name, r.reason if r else "", field=r.field if r else "", index=i))
    return out


def request_error(response: pb.AppendResponse) -> ClientError | None:
    """The error of a request the store refused as a whole, answered in its turn on an
    AppendStream (AppendResponse.error); None for an answer with results."""
    if not response.HasField("error"):
        return None
    err = response.error
    try:
        code = _STATUS_BY_NUMBER[err.code]
    except KeyError:
        code = grpc.StatusCode.UNKNOWN
    return error_for(code, err.message, field=err.field, method="CommitLog/AppendStream")


_STATUS_BY_NUMBER = {c.value[0]: c for c in grpc.StatusCode}


class _Stream:
    """One AppendStream call: requests go in through a queue, answers come out of `call`."""

    def __init__(self, connection: Connection) -> None:
        self.requests: queue.SimpleQueue[pb.AppendRequest | None] = queue.SimpleQueue()
        self.cancelled_by_us = False
        self.target = connection.commitlog_target
        self.call: Any = connection.commitlog().AppendStream(
            self._requests(), metadata=connection.metadata
        )

    def _requests(self) -> Iterator[pb.AppendRequest]:
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
        # What lingers: messages of send(), or else shares of send_batch() calls smaller than
        # a request (never both: whichever comes second seals the other, to keep the order).
        self._open: list[_Message] = []
        self._open_parts: list[_OpenPart] = []
        self._open_count = 0  # messages in _open_parts
        self._open_weight = 0
        self._open_since = 0.0
        self._sealed: deque[_Request] = deque()
        self._inflight: deque[_Request] = deque()
        self._buffered = 0  # weight of messages without a result yet
        self._flushing = 0
        self._closing = False
        self._closed = False
        self._stream: _Stream | None = None
        self._streams_opened = 0
        self._retry_at = 0.0
        self._failing_since: float | None = None
        self._last_error: ClientError | None = None  # of the last stream that failed
        # Asking the other replicas whether one leads (a late answer, several replicas).
        self._several_replicas = len(self._conn.settings.commitlog_targets) > 1
        self._probing = False
        self._probe_at = 0.0
        self._leader_found = False  # the next stream goes where the probe found the leader
        self._backoff_s = BACKOFF_FIRST_S
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
        weight = message.weight()
        with self._cond:
            if self._buffered + weight > self.buffer_bytes or self._closing:
                self._wait_for_room(weight, time.monotonic() + self.block_timeout_s)
            if self._open_parts:
                self._seal()  # the batches sent before go first
            if not self._open:
                self._open_since = time.monotonic()
            self._open.append(message)
            self._open_weight += weight
            self._buffered += weight
            if len(self._open) >= self.batch_messages or self._open_weight >= self.batch_bytes:
                self._seal()
                self._cond.notify_all()
            elif len(self._open) == 1:
                self._cond.notify_all()
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
            part_messages=min(self.batch_messages, self.limits.batch_messages_max),
            part_bytes=self.batch_bytes,
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
        future = BatchFuture(result, len(prepared.cuts), self._hurry, self)
        deadline = time.monotonic() + self.block_timeout_s
        for k, (first, end, weight) in enumerate(prepared.cuts):
            try:
                self._queue_part(prepared, BatchPart(future, first, end - first), weight, deadline)
            except ClientError as err:
                if k == 0:
                    raise  # nothing of the batch is queued: the call fails as a whole
                # Parts are on their way: the rest fail with the reason, and the future tells
                # which messages were not stored (BatchNotStored) once the sent ones answer.
                for rest_first, rest_end, _ in prepared.cuts[k:]:
                    future._part_done(BatchPart(future, rest_first, rest_end - rest_first), err)
                with self._cond:
                    self.stats.failed += n - prepared.cuts[k][0]
                break
        return future

    def _queue_part(
        self, prepared: PreparedBatch, part: BatchPart, weight: int, deadline: float
    ) -> None:
        """A share lingers like send()'s messages, joined by the shares that follow it until a
        request is full (a paced caller's small batches go as one request, not one each); a
        full share goes at once."""
        share = _OpenPart(prepared, part, weight)
        messages_max = min(self.batch_messages, self.limits.batch_messages_max)
        with self._cond:
            self._wait_for_room(weight, deadline)
            wake = False
            if self._open or (
                self._open_parts
                and (
                    self._open_count + part.count > messages_max
                    or self._open_weight + weight > self.batch_bytes
                )
            ):
                self._seal()  # what was sent before goes first
                wake = True
            if not self._open_parts:
                self._open_since = time.monotonic()
                wake = True  # the sender sets its linger wake-up
            self._open_parts.append(share)
            self._open_count += part.count
            self._open_weight += weight
            self._buffered += weight
            if self._open_count >= messages_max or self._open_weight >= self.batch_bytes:
                self._seal()
                wake = True
            # A share joining a lingering request wakes nobody: the sender already waits for
            # that request's linger to end (a paced caller's 1,000 calls a second woke it 1,000
            # times a second).
            if wake:
                self._cond.notify_all()

    def _hurry(self, future: BatchFuture) -> None:
        """Someone waits for `future`: what of it still lingers goes now."""
        with self._cond:
            if any(p.part.future is future for p in self._open_parts):
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
        return _Message(topic, queue_id, body, encoded, sys_flag, uniq, SendFuture(self))

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
        return bool(self._open or self._open_parts)

    def _seal(self) -> None:
        """Turn what lingers into a request with the next sequence (under the lock)."""
        if self._open_parts:
            request = parts_request(self.producer_id, next(self._sequences), self._open_parts)
            self._open_parts = []
            self._open_count = 0
        else:
            request = build_request(self.producer_id, next(self._sequences), self._open)
            self._open = []
        self._sealed.append(request)
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
        threading.Thread(
            target=self._receive, args=(stream,), name="mqstore-producer-recv", daemon=True
        ).start()

    def _receive(self, stream: _Stream) -> None:
        mark_producer_thread(self)
        error: ClientError | None = None
        try:
            for response in stream.call:
                self._conn.mark_reached()
                with self._cond:
                    if self._stream is not stream or not self._inflight:
                        break
                    head = self._inflight[0]
                    if response.sequence != head.sequence:
                        error = ClientError(
                            f"answer for sequence {response.sequence}, expected {head.sequence}",
                            code=grpc.StatusCode.INTERNAL,
                        )
                        break
                    self._inflight.popleft()
                    self._failing_since = None
                    self._backoff_s = BACKOFF_FIRST_S
                    # A request refused alone (malformed): it fails, the stream goes on.
                    answer: pb.AppendResponse = response
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
            r.request.sequence = r.sequence
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
        """The next stream opens after a pause that doubles up to BACKOFF_MAX_S (under the
        lock); retries end `retry_timeout_s` after the first failure without an answer
        (`_gave_up`)."""
        now = time.monotonic()
        self._last_error = error
        if self._failing_since is None:
            self._failing_since = now
        self._retry_at = now + self._backoff_s
        self._backoff_s = min(self._backoff_s * 2, BACKOFF_MAX_S)

    def _finish(self, request: _Request, outcome: pb.AppendResponse | ClientError) -> None:
        """Resolve the futures of an answered request (or fail them with `outcome`)."""
        n = sum(p.count for p in request.parts) if request.parts else len(request.messages)
        ok = 0
        if request.parts:
            for part, answer in zip(
                request.parts, part_answers(request.parts, outcome), strict=True
            ):
                ok += part.future._part_done(part, answer)
        elif isinstance(outcome, pb.AppendResponse) and _all_stored(outcome, n):
            _StoredAnswer.of(request.messages, outcome).resolve()
            ok = n
        else:
            outcomes = (
                results_of(request, outcome)
                if isinstance(outcome, pb.AppendResponse)
                else [outcome] * n
            )
            for m, result in zip(request.messages, outcomes, strict=True):
                if isinstance(result, SendResult):
                    m.future._resolve(result, None)
                    ok += 1
                else:
                    m.future._resolve(None, result)
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
