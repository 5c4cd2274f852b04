"""Columnar sends: many messages of one topic as columns, no object per message.

`Producer.send` makes a message object, a future and a properties dict per message: about
10 us of Python each, which bounded the SDK at ~50 k messages/s while the store took twice
that (docs/bench-peers.md). `Producer.send_batch` takes the bodies as a list and builds the
AppendRequest's columns directly:

    bodies ─┬─> queue ids (contiguous runs per queue), properties (one shared prefix, a
            │   UNIQ_KEY each, KEYS when given), compressed bodies where over the threshold
            └─> shares of at most batch_messages / batch_bytes ──> the producer's open batch
                                                   (sequence, window and retries as send)

A share is what one request carries of one call: a BatchShare here, or producer.py's one
message of a send(). The producer's open batch holds shares of either kind; a request's
answer is a RequestAnswer, its columns over every message of the request, from which each
share takes its own slice.

One BatchFuture answers for all shares; BatchResult holds the answer as columns. A share the
store did not take (a failed request, a refused message) is listed in `BatchResult.errors`
by message index, and `BatchFuture.result()` raises BatchNotStored carrying the result.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Generic, TypeVar

import grpc

from mqstore.client.compression import Compression, compress
from mqstore.client.errors import ClientError, FailedPrecondition, InvalidArgument, refusal
from mqstore.formats._core import (
    read_append_response,
    share_bounds,
    uniq_properties,
    widest_bytes,
)
from mqstore.formats.javahash import java_string_hash
from mqstore.formats.msgid import offset_msg_id
from mqstore.formats.properties import (
    KEY_SEPARATOR,
    KEYS,
    PRODUCER_SEQ,
    RECORD_CRC,
    TAGS,
    UNIQ_KEY,
    encode_properties,
)
from mqstore.formats.record import producer_properties_bytes_max
from mqstore.limits import MessageLimits
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb

# Fixed per-message overhead counted towards batch_bytes besides body and properties.
MESSAGE_OVERHEAD_BYTES = 16
_PUT_OK = pb.PUT_OK

T = TypeVar("T")
log = logging.getLogger(__name__)
_FUTURE_LOCK = threading.Lock()  # guards every future's waiter and callbacks
# The producer whose threads the calling thread is one of (they resolve its futures and run
# their callbacks): waiting there for that producer's results would wait forever.
_PRODUCER_THREAD = threading.local()


def mark_producer_thread(producer: object) -> None:
    """The calling thread is one of `producer`'s: it resolves its futures, runs callbacks."""
    _PRODUCER_THREAD.producer = producer


def on_own_thread(producer: object | None) -> bool:
    """The calling thread is one of `producer`'s own (False for None)."""
    return producer is not None and getattr(_PRODUCER_THREAD, "producer", None) is producer


def refuse_wait_on_own_thread(producer: object | None, what: str) -> None:
    """FailedPrecondition when called on one of `producer`'s threads (in a callback of one of
    its sends): `what` would wait for results that this very thread is to deliver. Waiting on
    another producer from there is fine: its own threads deliver."""
    if on_own_thread(producer):
        raise FailedPrecondition(
            f"{what} inside a send callback would wait forever: callbacks run on the "
            "producer's thread, which delivers its results; wait outside the callback (or "
            "chain another add_done_callback)"
        )


class ResultFuture(Generic[T]):
    """A future resolved by the producer's threads: result(), exception(), done(),
    add_done_callback(), as concurrent.futures has them. A concurrent.futures.Future costs a
    Condition each (~60% of a send's Python time measured with cProfile); this one makes a
    waiter only for a caller that actually waits."""

    __slots__ = ("_callbacks", "_done", "_error", "_event", "_owner", "_result")

    def __init__(self, owner: object | None = None) -> None:
        self._owner = owner  # the producer whose threads resolve it
        self._done = False
        self._result: T | None = None
        self._error: BaseException | None = None
        self._event: threading.Event | None = None
        self._callbacks: list[Callable[[ResultFuture[T]], object]] | None = None

    def done(self) -> bool:
        return self._done

    def _wait(self, timeout: float | None) -> None:
        if self._done:
            return
        refuse_wait_on_own_thread(self._owner, "waiting for a pending result")
        with _FUTURE_LOCK:
            if not self._done and self._event is None:
                self._event = threading.Event()
            event = self._event
        if event is not None and not event.wait(timeout):
            raise TimeoutError(f"no result within {timeout} s")

    def result(self, timeout: float | None = None) -> T:
        self._wait(timeout)
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        return self._error

    def add_done_callback(self, fn: Callable[[ResultFuture[T]], object]) -> None:
        """Call `fn(self)` once resolved (at once, in this thread, when already resolved;
        else in the producer's thread, where waiting for another pending result of the same
        producer, its flush() or close() raise FailedPrecondition instead of waiting forever;
        handing such a wait to another thread and waiting for that one still waits forever)."""
        with _FUTURE_LOCK:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        fn(self)

    def _resolve(self, result: T | None, error: BaseException | None) -> None:
        with _FUTURE_LOCK:
            self._result, self._error, self._done = result, error, True
        self._wake()

    def _wake(self) -> None:
        """Wake the waiter and run the callbacks of a future just resolved."""
        if self._event is not None:
            self._event.set()
        for fn in self._callbacks or ():
            try:
                fn(self)
            except Exception:
                log.exception("a send callback failed")


@dataclass(slots=True)
class BatchResult:
    """Where the messages of one send_batch went, as columns in the order of the bodies.
    A message not stored has offsets -1 and its error in `errors`."""

    topic: str
    queue_ids: list[int]
    uniq_keys: list[str]
    queue_offsets: list[int]
    commit_log_offsets: list[int]
    sizes: list[int]
    store_timestamps_ms: list[int]
    store_host: bytes = b""
    duplicate: bool = False  # some share was answered from a retry the store had stored
    errors: dict[int, ClientError] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.queue_ids)

    @property
    def msg_ids(self) -> list[str]:
        """Offset message ids ("" for a message not stored), made on demand."""
        host = self.store_host
        return [offset_msg_id(host, o) if o >= 0 and host else "" for o in self.commit_log_offsets]


class BatchNotStored(ClientError):
    """Some messages of a send_batch were not stored; `result` says which (its `errors`) and
    where the others went. The code is that of the first error."""

    def __init__(self, result: BatchResult) -> None:
        first_index = min(result.errors)
        first = result.errors[first_index]
        super().__init__(
            f"{len(result.errors)} of {len(result)} messages not stored; the first "
            f"(index {first_index}): {first}",
            code=first.code,
            field=first.field,
            method=first.method,
        )
        self.result = result


class BatchFuture(ResultFuture[BatchResult]):
    """The result of one send_batch: resolved once every share has its answer."""

    __slots__ = ("_batch", "_hurry", "_pending")

    def __init__(
        self,
        batch: BatchResult,
        shares: int,
        hurry: Callable[[BatchFuture], None] | None = None,
        owner: object | None = None,
    ) -> None:
        super().__init__(owner)
        self._batch = batch
        self._pending = shares
        # The producer's: sends what of this batch still lingers, once someone waits for it.
        self._hurry = hurry

    def _wait(self, timeout: float | None) -> None:
        if not self._done and self._hurry is not None:
            self._hurry(self)
        super()._wait(timeout)

    def _share_done(self, share: BatchShare, answer: RequestAnswer, at: int) -> int:
        """Take one share's answer (its messages from `at` in the request); the number of its
        messages stored."""
        b = self._batch
        lo = share.first
        n = share.count
        stored = 0
        if answer.error is not None:
            for i in range(lo, lo + n):
                b.errors[i] = answer.error
        else:
            b.queue_offsets[lo : lo + n] = answer.queue_offsets[at : at + n]
            b.commit_log_offsets[lo : lo + n] = answer.commit_log_offsets[at : at + n]
            b.sizes[lo : lo + n] = answer.sizes[at : at + n]
            b.store_timestamps_ms[lo : lo + n] = [answer.store_timestamp_ms] * n
            b.store_host = answer.store_host or b.store_host
            b.duplicate = b.duplicate or answer.duplicate
            stored = n
            if not answer.all_stored:
                for i in range(n):
                    refused = answer.refused(at + i, lo + i)
                    if refused is not None:
                        b.errors[lo + i] = refused
                        b.queue_offsets[lo + i] = b.commit_log_offsets[lo + i] = -1
                        stored -= 1
        with _FUTURE_LOCK:
            self._pending -= 1
            last = self._pending == 0
        if last:
            if b.errors:
                self._resolve(None, BatchNotStored(b))
            else:
                self._resolve(b, None)
        return stored


@dataclass(slots=True)
class BatchShare:
    """What one request carries of a send_batch: messages [first, first + count)."""

    future: BatchFuture
    prepared: PreparedBatch
    first: int
    count: int
    weight: int

    @property
    def topic(self) -> str:
        return self.prepared.topic

    def add_columns(
        self, queue_ids: list[int], bodies: list[bytes], properties: list[bytes], flags: list[int]
    ) -> None:
        """This share's messages appended to a MessageBatch's columns being built."""
        p, lo, hi = self.prepared, self.first, self.first + self.count
        queue_ids.extend(p.queue_ids[lo:hi])
        bodies.extend(p.bodies[lo:hi])
        properties.extend(p.properties[lo:hi])
        flags.extend(p.sys_flags[lo:hi] if p.sys_flags else repeat(0, self.count))

    def take(self, answer: RequestAnswer, at: int) -> int:
        """Take this share's answer, its messages from `at` in the request; how many stored."""
        return self.future._share_done(self, answer, at)


@dataclass(slots=True)
class StoreAnswer:
    """An AppendResponse as the compiled core reads it from the wire (formats/_core_append.pxi's
    read_append_response): its columns as lists at once, where a protobuf message handed each
    number over one Python object at a time (list() of its four columns was a tenth of the
    producer's Python time). `refusals`: (index, status, reason, field) each; `error`: the
    request refused as a whole, (code, message, field), or None."""

    statuses: list[int]
    commit_log_offsets: list[int]
    sizes: list[int]
    queue_offsets: list[int]
    store_timestamp_ms: int
    store_host: bytes
    refusals: list[tuple[int, int, str, str]]
    duplicate: bool
    sequence: int
    error: tuple[int, str, str] | None

    @classmethod
    def read(cls, data: bytes) -> StoreAnswer:
        return cls(*read_append_response(data))


@dataclass(slots=True)
class RequestAnswer:
    """The store's answer to one request, split by message: columns over every message of the
    request in the order of the answer, from which each share takes its own slice (from the
    index of its first message, `at`). A request that failed as a whole, or an answer of the
    wrong length, is `error` for every message; a message the store refused alone has its
    own error (`refused`), numbered from the first message of its call."""

    error: ClientError | None
    all_stored: bool = False  # every message PUT_OK (the usual answer: no per-message check)
    queue_offsets: list[int] = field(default_factory=list)
    commit_log_offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)  # PutStatus numbers
    # Refusals by index in the request: (index, status, reason, field).
    reasons: dict[int, tuple[int, int, str, str]] = field(default_factory=dict)
    store_host: bytes = b""
    store_timestamp_ms: int = 0
    duplicate: bool = False
    # One-message shares stored (producer.py's messages, `at` set): resolved together by
    # resolve_stored, one take of the futures' lock for them all.
    stored: list[Any] = field(default_factory=list)

    @classmethod
    def of(cls, outcome: StoreAnswer | ClientError, n: int) -> RequestAnswer:
        """The answer of a request of `n` messages (or its error)."""
        if isinstance(outcome, ClientError):
            return cls(outcome)
        columns = (outcome.statuses, outcome.commit_log_offsets, outcome.queue_offsets)
        if any(len(c) != n for c in columns) or len(outcome.sizes) != n:
            return cls(
                ClientError(
                    f"the store answered {len(outcome.statuses)} results for {n} messages",
                    code=grpc.StatusCode.INTERNAL,
                    method="CommitLog/AppendStream",
                )
            )
        statuses = outcome.statuses
        return cls(
            None,
            statuses.count(_PUT_OK) == n,
            outcome.queue_offsets,
            outcome.commit_log_offsets,
            outcome.sizes,
            statuses,
            {r[0]: r for r in outcome.refusals},
            outcome.store_host,
            outcome.store_timestamp_ms,
            outcome.duplicate,
        )

    def refused(self, i: int, index: int) -> ClientError | None:
        """The error of the request's message `i` (None: stored); a refusal says `index`, the
        message's place in its own call."""
        if self.error is not None:
            return self.error
        status = self.statuses[i]
        if status == _PUT_OK:
            return None
        r = self.reasons.get(i)
        name = pb.PutStatus.Name(status)  # type: ignore[arg-type]
        return refusal(name, r[2] if r else "", field=r[3] if r else "", index=index)

    def resolve_stored(self) -> None:
        """Resolve the futures of the one-message shares in `stored` as stored, each to its
        place in this answer (producer.py's SendFuture makes its result from it when asked),
        under one take of the futures' lock."""
        watched = []
        with _FUTURE_LOCK:
            for message in self.stored:
                future = message.future
                future._answer = self
                future._message = message
                future._done = True
                if future._event is not None or future._callbacks:
                    watched.append(future)
        for future in watched:
            future._wake()


@dataclass(slots=True)
class PreparedBatch:
    """The columns of a send_batch, checked and encoded, split into shares."""

    topic: str
    queue_ids: list[int]
    bodies: list[bytes]
    properties: list[bytes]
    sys_flags: list[int]
    uniq_keys: list[str]
    shares: list[tuple[int, int, int]]  # (first, end, weight) per share


def check_not_reserved(properties: Mapping[str, str]) -> None:
    """The store refuses a whole request that names one of its own properties (PRODUCER_SEQ,
    RECORD_CRC): refused here, it fails only its own call, not the batches a request joins
    to it."""
    if PRODUCER_SEQ in properties:
        raise InvalidArgument(
            f"the {PRODUCER_SEQ} property is reserved for the store (use producer_id)",
            field="properties",
        )
    if RECORD_CRC in properties:
        raise InvalidArgument(
            f"the {RECORD_CRC} property is reserved for the store (its whole-record CRC)",
            field="properties",
        )


def prepare_batch(
    topic: str,
    bodies: Sequence[bytes],
    *,
    keys: Sequence[str] | None,
    tags: str,
    properties: Mapping[str, str] | None,
    queue_id: int | None,
    uniq_keys: list[str],
    first_queue: int,
    queues_per_topic: int,
    compression: Compression,
    compress_over_bytes: int,
    limits: MessageLimits,
    share_messages: int,
    share_bytes: int,
) -> PreparedBatch:
    """Check and encode a send_batch's columns (the caller checked the topic). Bad input
    raises InvalidArgument before anything is queued."""
    n = len(bodies)
    body_list = list(bodies)
    # Checked and measured in one C pass; bytes-like bodies are copied to bytes first.
    longest = widest_bytes(body_list)
    if longest < 0:
        try:
            body_list = [bytes(memoryview(b)) for b in body_list]
        except TypeError:
            raise InvalidArgument("bodies are bytes", field="bodies") from None
        longest = widest_bytes(body_list)
    if longest > limits.body_bytes_max:
        raise InvalidArgument(
            f"a body is {longest} bytes, over the {limits.body_bytes_max}-byte limit",
            field="bodies",
        )
    # Properties: everything shared encoded once, then KEYS and UNIQ_KEY per message.
    common: dict[str, str] = dict(properties or {})
    for reserved in (KEYS, UNIQ_KEY):
        if reserved in common:
            raise InvalidArgument(
                f"{reserved} is set per message (keys=, uniq keys are made)", field="properties"
            )
    check_not_reserved(common)
    if tags:
        common[TAGS] = tags
    try:
        prefix = encode_properties(common) + UNIQ_KEY.encode() + b"\x01"
    except ValueError as exc:
        raise InvalidArgument(str(exc), field="properties") from None
    if keys is not None:
        if len(keys) != n:
            raise InvalidArgument(f"{len(keys)} keys for {n} bodies", field="keys")
        if any(not k or KEY_SEPARATOR in k or "\x01" in k or "\x02" in k for k in keys):
            raise InvalidArgument("keys must be non-empty and hold no space", field="keys")
        props = [
            b"%s%s\x02KEYS\x01%s\x02" % (prefix, u.encode(), k.encode())
            for u, k in zip(uniq_keys, keys, strict=True)
        ]
    else:
        props = uniq_properties(prefix, uniq_keys)
    widest = widest_bytes(props)
    if widest > producer_properties_bytes_max(limits):
        raise InvalidArgument(
            f"properties are {widest} bytes encoded, over the "
            f"{producer_properties_bytes_max(limits)}-byte limit (the store's "
            f"{limits.properties_bytes_max} less its record CRC property)",
            field="properties",
        )
    # Queues: given; by key hash; else contiguous runs, one per queue, so that a queue's
    # messages of one batch sit next to each other in the log.
    if queue_id is not None:
        if not 0 <= queue_id <= limits.queue_id_max:
            raise InvalidArgument(f"queue_id must be 0..{limits.queue_id_max}", field="queue_id")
        queue_ids = [queue_id] * n
    elif keys is not None:
        queue_ids = [abs(java_string_hash(k)) % queues_per_topic for k in keys]
    else:
        queue_ids = _queue_runs(first_queue, queues_per_topic, n)
    sys_flags: list[int] = []
    if longest > compress_over_bytes:
        sys_flags = [0] * n
        for i, body in enumerate(body_list):
            if len(body) > compress_over_bytes:
                body_list[i], sys_flags[i] = compress(body, compression)
    # The shares, each message weighing its body (as sent), properties and overhead: one C
    # pass of the core (a map per term and a Python search were a tenth of send_batch).
    shares = share_bounds(body_list, props, MESSAGE_OVERHEAD_BYTES, share_messages, share_bytes)
    return PreparedBatch(topic, queue_ids, body_list, props, sys_flags, uniq_keys, shares)


def _queue_runs(first_queue: int, queues_per_topic: int, n: int) -> list[int]:
    """Message i goes to queue (first_queue + i * queues_per_topic // n) % queues_per_topic:
    contiguous runs, one per queue, built a run at a time."""
    if n < queues_per_topic:  # runs of one, some queues skipped
        return [(first_queue + i * queues_per_topic // n) % queues_per_topic for i in range(n)]
    out: list[int] = []
    for k in range(queues_per_topic):
        lo = -(-k * n // queues_per_topic)  # the first i with i * queues_per_topic // n == k
        hi = -(-(k + 1) * n // queues_per_topic)
        out.extend([(first_queue + k) % queues_per_topic] * (hi - lo))
    return out
