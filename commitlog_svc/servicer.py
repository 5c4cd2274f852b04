"""The CommitLog gRPC service over the engine (commitlog.py) and the subscriber registry.

Append / AppendStream. A request's batches become the engine's columnar MessageBatch as they
are (the columns the compiled core read from the request bytes: append_request.py); an empty
born_host means the caller's address. Results go back column by column; refusals are sparse.
What is an error and what is a status:

    request-level problems (no batches, an empty batch, columns of different lengths, a
      born_host that does not parse, the reserved MQS_PSEQ or __CRC32# property, too many messages)
                                            INVALID_ARGUMENT naming the field
    one message over a limit or with a bad topic, or one that could never be read back (a
      body marked compressed that does not decompress, properties that are not key 0x01
      value 0x02 pairs: append_checks.py)
                                            its status (MESSAGE_ILLEGAL, PROPERTIES_SIZE_
                                            EXCEEDED) with reason and field; the others store
    the store refuses (closed, flush failed / disk full / lock busy)
                                            every message's status: SERVICE_NOT_AVAILABLE /
                                            CREATE_MAPPED_FILE_FAILED ("disk full") /
                                            OS_PAGE_CACHE_BUSY
    a replica that does not lead (NotLeader), or a leader whose in-sync set is below min
      in-sync (NotEnoughReplicas)         UNAVAILABLE for the request, nothing stored: the
                                            producer sends it again (ends an AppendStream)
    a retry of a stored (producer_id, sequence)
                                            the first result, duplicate = true
    a sequence older than what is remembered
                                            FAILED_PRECONDITION

AppendStream is pipelined: a reader thread writes requests in arrival order (so a producer's
sequences are stored in order) and the call answers them in the same order once durable; up to
`append_stream_window` requests are written ahead of their answers, so under sync flush one
flush covers several of them. A malformed request (INVALID_ARGUMENT) is answered in its turn
with AppendResponse.error (code, message, field), nothing of it stored, and the stream goes on
with the next request. Any other request-level error (a sequence that goes backwards:
FAILED_PRECONDITION) ends the stream with its status after the answers to the requests before
it: the requests behind it carry the producer's later sequences, and storing them past a
refused one would put them out of order.

Subscribe follows DESIGN.md's handshake: start at max(confirmed, min) when the store id
matches (at max when confirmed is beyond it), at min otherwise. Then DispatchBatch frames built
from the segment bytes (dispatch_scan.py, equal to engine.scan() + entry_from_record), which
stop at the confirm offset (the flushed end under sync flush), and then
the stream tails: it waits on the engine's progress condition (notified by appends, flushes,
close) instead of polling. Each stream reads the files at its own pace: the generator runs
only when gRPC wants the next frame (a send completes only when flow control lets it), so a
slow subscriber holds one batch at most and never slows appends or other subscribers. A
cancelled or killed subscriber wakes its waiting stream through add_callback, and the worker
thread returns at once. A subscriber that asks for a linger (the index) gets at most one frame
per linger while appends keep coming, unless the last one filled its bounds: fewer, fuller
frames, for followers that need no low latency.
"""

# ruff: noqa: N802 (gRPC method names are the proto's)
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import grpc
import numpy as np

from commitlog_svc import metrics
from commitlog_svc.append_checks import refuse_unreadable, with_refusals, without
from commitlog_svc.append_request import AppendRequestColumns
from commitlog_svc.commitlog import CommitLog
from commitlog_svc.dispatch_scan import DispatchScan, WireFrame, frame_of_runs, scan_dispatch
from commitlog_svc.frame_cache import FrameCache
from commitlog_svc.messages import AppendResult, PendingAppend, PutStatus
from commitlog_svc.recovery import CorruptRange
from commitlog_svc.replication.controller import ReplicaController, Role
from commitlog_svc.settings import CommitLogSettings
from commitlog_svc.subscribers import SubscriberRegistry
from mqstore.dispatch import DISPATCH_LINGER_MS_MAX
from mqstore.errors import (
    CorruptRecord,
    DataLoss,
    FailedPrecondition,
    InvalidArgument,
    MqstoreError,
    NotCommitted,
    NotFound,
    NotLeader,
    OutOfRange,
    ResourceExhausted,
    Unavailable,
)
from mqstore.formats._core import append_response_wire
from mqstore.formats.commitlog_checkpoint import STORE_ID_BYTES
from mqstore.formats.msgid import decode_offset_msg_id
from mqstore.formats.properties import PRODUCER_SEQ, RECORD_CRC
from mqstore.formats.record import pack_host
from mqstore.formats.record_batch import LOCALHOST_V4, MessageBatch
from mqstore.formats.record_columns import IntArray
from mqstore.history import LogHistory
from mqstore.rpc.dispatch_codec import history_from_proto, history_to_proto
from mqstore.rpc.errors import status_code
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as pb_grpc
from mqstore.rpc.gen.common.v1 import common_pb2
from mqstore.rpc.messages import record_to_message

log = logging.getLogger(__name__)

# Engine PutStatus -> proto PutStatus (the numbers differ: proto enums start at 1).
_PB_STATUS: dict[PutStatus, int] = {s: pb.PutStatus.Value(s.name) for s in PutStatus}
# Every refusal status exported at 0 from the start (a dashboard shows 0, not "no data").
for _status in PutStatus:
    if _status is not PutStatus.PUT_OK:
        metrics.APPEND_REFUSED.labels(_status.name)
_PB_PUT_OK: int = pb.PutStatus.Value("PUT_OK")
# A subscriber stream waiting for appends looks at its call this often even when nothing wakes
# it (a lost cancellation callback must not keep a thread for ever).
SUBSCRIBE_WAIT_S = 1.0
# How long an append waits for the store host to be set after the port opens (start-up only).
START_WAIT_S = 10.0
SUBSCRIBER_ID_BYTES_MAX = 256
# A switchover waits this long for the successor to catch up and lead, unless told otherwise;
# longer than a few lease TTLs is a wait nobody wants (the successor is not keeping up).
SWITCHOVER_TIMEOUT_DEFAULT_MS = 10_000
SWITCHOVER_TIMEOUT_MAX_MS = 120_000
# Per record of a Read answer: field tags, length prefix, status (see ReadResponse).
_READ_OVERHEAD_BYTES = 8
_PEER_CACHE_MAX = 4_096
# The reader of an AppendStream checks for the end of the call this often while the window is
# full.
_STREAM_PUT_S = 0.5


def parse_host(text: str, *, field: str) -> bytes:
    """ "ip:port" or "[ipv6]:port" -> packed host; InvalidArgument naming `field`."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise InvalidArgument(f"host {text!r} is not ip:port", field=field)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
        if not 0 <= port <= 0xFFFF:
            raise ValueError(port)
        return pack_host(host, port)
    except ValueError as exc:
        raise InvalidArgument(f"host {text!r} is not ip:port", field=field) from exc


def peer_host(peer: str) -> bytes:
    """The packed address of a gRPC peer ("ipv4:1.2.3.4:5", "ipv6:[::1]:5"); localhost for
    anything else (unix sockets)."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        try:
            return parse_host(rest, field="born_host")
        except InvalidArgument:
            pass
    return LOCALHOST_V4


@dataclass(frozen=True, slots=True)
class _Refused:
    """A request of an AppendStream refused as a whole, answered in its turn."""

    sequence: int
    error: InvalidArgument


# What the reader hands the answering generator, in request order: a request written (its
# pending answer and sequence), one refused, an error that ends the call, or None: the end.
_StreamItem = tuple[PendingAppend, int] | _Refused | BaseException | None


@dataclass(slots=True)
class _Stream:
    """One AppendStream: the reader's state, shared with the answering generator."""

    lock: threading.Lock
    busy: bool = False  # the reader is writing a request that is not queued yet
    closed: bool = False  # the call is over: the reader takes no more requests


class CommitLogServicer(pb_grpc.CommitLogServicer):
    def __init__(
        self, engine: CommitLog, registry: SubscriberRegistry, settings: CommitLogSettings
    ) -> None:
        self.engine = engine
        self.registry = registry
        self.settings = settings
        self._frames = FrameCache(settings.dispatch_share_bytes)  # frames shared in step
        self._limits = engine.config.limits
        self._started = threading.Event()
        self._draining = threading.Event()
        self._peers: dict[str, bytes] = {}
        # Subscribers whose frames carry records (Subscribe's include_records, then Confirms).
        self._with_records: set[str] = set()
        # Records ride in a frame only while it stays well under the message limit.
        self._records_frame_bytes = settings.max_message_bytes // 2
        self._metrics_key = metrics.SCRAPE_TIME.add(self.gauges)
        # A broker group's replica (docs/replication.md); None: a single replica.
        self.replication: ReplicaController | None = None

    def attach_replication(self, controller: ReplicaController) -> None:
        self.replication = controller

    # -- life cycle -----------------------------------------------------------------------------

    def open_for_appends(self) -> None:
        """The store host is final: appends may go in."""
        self._started.set()

    def drain(self) -> None:
        """Shutdown begins: subscriptions and append streams end, new ones are refused."""
        self._draining.set()
        self.engine.wake_waiters()

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def close(self) -> None:
        metrics.SCRAPE_TIME.remove(self._metrics_key)

    def _wait_started(self) -> None:
        if not self._started.wait(START_WAIT_S):
            raise Unavailable("the commit log is starting")

    # -- append ---------------------------------------------------------------------------------

    def _peer(self, context: grpc.ServicerContext) -> bytes:
        peer = context.peer()
        host = self._peers.get(peer)
        if host is None:
            if len(self._peers) >= _PEER_CACHE_MAX:
                self._peers.clear()
            host = self._peers[peer] = peer_host(peer)
        return host

    def _batches(self, request: AppendRequestColumns, peer: bytes) -> list[MessageBatch]:
        if not request.batches:
            raise InvalidArgument("an append needs at least one batch", field="batches")
        out = []
        total = 0
        for i, b in enumerate(request.batches):
            n = len(b.bodies)
            if n == 0:
                raise InvalidArgument(f"batch {i} has no messages", field=f"batches[{i}].bodies")
            props = b.properties or None
            reserved = _reserved_in(props) if props is not None else None
            if reserved is not None:
                raise InvalidArgument(
                    f"the {reserved} property is reserved for the store{_RESERVED_WHY[reserved]}",
                    field=f"batches[{i}].properties",
                )
            born = parse_host(b.born_host, field=f"batches[{i}].born_host") if b.born_host else peer
            batch = MessageBatch(
                topic=b.topic,
                queue_ids=b.queue_ids,
                bodies=b.bodies,
                properties=props,
                sys_flags=b.sys_flags or None,
                sys_flag=b.sys_flag,
                flag=b.flag,
                born_timestamp_ms=b.born_timestamp_ms,
                born_host=born,
                reconsume_times=b.reconsume_times,
                prepared_tx_offset=b.prepared_tx_offset,
            )
            try:
                batch.check_columns()
            except InvalidArgument as exc:  # a whole-call error, naming the batch
                raise InvalidArgument(
                    f"batch {i}: {exc}", field=f"batches[{i}].{exc.field}"
                ) from exc
            total += n
            out.append(batch)
        if total > self._limits.batch_messages_max:
            raise InvalidArgument(
                f"{total} messages in one append, over the {self._limits.batch_messages_max} limit",
                field="batches",
            )
        return out

    def _start(self, request: AppendRequestColumns, peer: bytes) -> PendingAppend:
        batches = self._batches(request, peer)
        producer = (request.producer_id, request.sequence) if request.producer_id else None
        refused = refuse_unreadable(batches, self._limits.body_bytes_max)
        if not refused:
            return self.engine.start_append(batches, producer=producer)
        # Poison (append_checks.py): stored as if never sent, refused at its index.
        count = sum(map(len, batches))
        kept = without(batches, refused)
        if kept:
            pending = self.engine.start_append(kept, producer=producer)
        else:
            pending = PendingAppend(
                AppendResult(statuses=[], store_host=self.engine.store_host), -1
            )
        return PendingAppend(with_refusals(pending.result, refused, count), pending.end_offset)

    def _answer(self, result: AppendResult, sequence: int) -> bytes:
        """The AppendResponse's wire bytes, written by the compiled core from the result's
        columns (formats/_core_append.pxi; the response serializer passes bytes through,
        rpc/admission.py): filling a message's repeated fields took every number across one
        Python object at a time, then serialized them again."""
        n = len(result.statuses)
        if result.duplicate:
            metrics.APPEND_DUPLICATES.inc()
        refusals: list[tuple[int, int, str, str]] = []
        if result.ok:
            statuses = [_PB_PUT_OK] * n
            if not result.duplicate:
                metrics.APPENDED_MESSAGES.inc(n)
                metrics.APPENDED_BYTES.inc(sum(result.sizes))
        else:
            statuses = [_PB_STATUS[s] for s in result.statuses]
            stored = stored_bytes = 0
            for i, s in enumerate(result.statuses):
                if s.stored:
                    stored += 1
                    stored_bytes += result.sizes[i]
                if s is PutStatus.PUT_OK:
                    continue
                metrics.APPEND_REFUSED.labels(s.name).inc()
                reason = result.reasons[i] if i < len(result.reasons) else ""
                refusals.append((i, _PB_STATUS[s], reason, result.field_of(i)))
            if not result.duplicate:
                metrics.APPENDED_MESSAGES.inc(stored)
                metrics.APPENDED_BYTES.inc(stored_bytes)
        return append_response_wire(
            statuses,
            result.offsets,
            result.sizes,
            result.queue_offsets,
            result.store_timestamp_ms,
            result.store_host,
            refusals,
            result.duplicate,
            sequence,
        )

    def Append(  # type: ignore[override]
        self, request: AppendRequestColumns, context: grpc.ServicerContext
    ) -> bytes:
        self._wait_started()
        pending = self._start(request, self._peer(context))
        return self._answer(self.engine.finish_append(pending), request.sequence)

    def AppendStream(  # type: ignore[override]
        self, request_iterator: Iterator[AppendRequestColumns], context: grpc.ServicerContext
    ) -> Iterator[bytes | pb.AppendResponse]:
        if self._draining.is_set():
            raise Unavailable("the commit log is shutting down")
        self._wait_started()
        peer = self._peer(context)
        window: queue.Queue[_StreamItem] = queue.Queue(self.settings.append_stream_window)
        stream = _Stream(threading.Lock())
        reader = threading.Thread(
            target=self._read_stream,
            args=(request_iterator, peer, window, stream),
            name="append-stream",
            daemon=True,
        )
        reader.start()
        try:
            while True:
                try:
                    item = window.get(timeout=SUBSCRIBE_WAIT_S)
                except queue.Empty:
                    if not context.is_active():
                        return
                    if self._draining.is_set():
                        with stream.lock:
                            if not stream.busy and window.empty():
                                stream.closed = True
                                raise Unavailable("the commit log is shutting down") from None
                    continue
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, _Refused):
                    yield _refused_answer(item)
                    continue
                pending, sequence = item
                yield self._answer(self.engine.finish_append(pending), sequence)
        finally:
            with stream.lock:
                stream.closed = True

    def _read_stream(
        self,
        requests: Iterator[AppendRequestColumns],
        peer: bytes,
        window: queue.Queue[_StreamItem],
        stream: _Stream,
    ) -> None:
        """Write each request as it arrives; hand the pending answers over in order."""

        def hand_over(item: _StreamItem) -> bool:
            while True:
                try:
                    window.put(item, timeout=_STREAM_PUT_S)
                    return True
                except queue.Full:
                    with stream.lock:
                        if stream.closed:
                            return False

        try:
            for request in requests:
                with stream.lock:
                    if stream.closed:
                        return
                    if self._draining.is_set():
                        stream.closed = True
                        hand_over(Unavailable("the commit log is shutting down"))
                        return
                    stream.busy = True
                try:
                    item: _StreamItem = (self._start(request, peer), request.sequence)
                except InvalidArgument as err:
                    # Malformed: refused alone, nothing stored; the stream goes on.
                    item = _Refused(request.sequence, err)
                except MqstoreError as err:
                    item = err
                ok = hand_over(item)
                with stream.lock:
                    stream.busy = False
                if not ok or isinstance(item, BaseException):
                    return
        except grpc.RpcError:
            return  # the call ended (cancelled): nothing more to answer
        except Exception as exc:  # a bug: end the call with INTERNAL via the interceptor
            log.exception("append stream reader failed")
            hand_over(exc)
            return
        hand_over(None)

    # -- reads ----------------------------------------------------------------------------------

    def Read(self, request: pb.ReadRequest, context: grpc.ServicerContext) -> pb.ReadResponse:
        """Size 0 asks for the whole record at the offset (callers that keep offsets only, as
        RocketMQ's index does); its size counts against the answer limit as it is read. The
        answer is one bytes field and two int columns (_read_blob)."""
        offsets = request.offsets
        sizes = request.sizes
        n = len(offsets)
        if len(sizes) != n:
            raise InvalidArgument(f"{len(sizes)} sizes for {n} offsets", field="sizes")
        offset_column = np.asarray(offsets, dtype=np.int64)
        size_column = np.asarray(sizes, dtype=np.int64)
        if n and int(size_column.min()) < 0:
            raise InvalidArgument("sizes must not be negative", field="sizes")
        if n and int(offset_column.min()) < 0:
            raise InvalidArgument("offsets must not be negative", field="offsets")
        limit = self.settings.max_message_bytes
        asked = int(size_column.sum())
        needed = asked + _READ_OVERHEAD_BYTES * n
        if needed > limit:
            raise ResourceExhausted(
                f"a Read of {asked} bytes in {n} records exceeds the {limit}-byte answer "
                "limit; split it"
            )
        return self._read_blob(offset_column, size_column, needed)

    def _read_blob(self, offsets: IntArray, sizes: IntArray, needed: int) -> pb.ReadResponse:
        """Read's answer: the records served end to end in records_blob, each range's size in
        it in record_sizes (0 where not served), and each range's status. A column each, filled
        in one call; per record only what is rare (size 0, a range not served)."""
        failed: dict[int, MqstoreError] = {}
        whole = np.flatnonzero(sizes == 0)
        if len(whole):
            sizes = sizes.copy()
            for i in whole.tolist():  # the record's size first, from its header
                try:
                    record = self.engine.read_record(int(offsets[i]))
                except (CorruptRecord, InvalidArgument, OutOfRange, DataLoss) as err:
                    failed[i] = err
                    continue
                sizes[i] = record.total_size
                needed += record.total_size
            limit = self.settings.max_message_bytes
            if needed > limit:
                raise ResourceExhausted(
                    f"the records asked for pass the {limit}-byte answer limit; split the Read"
                )
        blob, served, errors = self.engine.read_blob(offsets, sizes)
        errors.update(failed)
        response = pb.ReadResponse(records_blob=blob)
        response.record_sizes.extend(served.tolist())
        if not errors:
            response.statuses.extend([pb.READ_OK] * len(offsets))
            return response
        statuses = [pb.READ_OK] * len(offsets)
        for i in sorted(errors):
            statuses[i] = _read_status(int(offsets[i]), errors[i])
        response.statuses.extend(statuses)
        return response

    def GetMessage(
        self, request: pb.GetMessageRequest, context: grpc.ServicerContext
    ) -> common_pb2.Message:
        host, offset = decode_offset_msg_id(request.msg_id)
        try:
            record = self.engine.read_record(offset)
        except CorruptRecord:
            metrics.CRC_MISMATCHES.labels("read").inc()
            raise
        except NotCommitted as exc:
            raise Unavailable(str(exc)) from exc
        except (OutOfRange, InvalidArgument, DataLoss) as exc:
            raise NotFound(f"no message {request.msg_id} in this store ({exc})") from exc
        if record.store_host != host:
            raise NotFound(
                f"no message {request.msg_id} in this store (the record at {offset} was stored "
                "by another host)"
            )
        return record_to_message(record)

    # -- dispatch -------------------------------------------------------------------------------

    def _handshake(self, request: pb.SubscribeRequest, known: bool) -> pb.Handshake:
        """Where a subscriber's view and the log agree, and where its stream starts.

            another store id        it rebuilds: start at the minimum
            the same store id       truncate at the last offset where its history and the
                                    log's agree (mqstore/history.py); start at its confirmed
                                    offset, or that offset if lower, or the minimum if higher
            the start is no record  (a confirmed offset inside a record: only a client that
            boundary                invents offsets sends one) back to its segment's start,
                                    a boundary every reader knows, and truncate there too

        Refused (nothing registered): a position this log never had, i.e. a confirmed offset
        past the end that the subscriber's history puts in the log's current epoch, or one
        from an unknown subscriber without any history."""
        engine = self.engine
        low, high = engine.min_offset, engine.max_offset
        history = engine.history
        confirmed = request.confirmed_offset
        if request.store_id != engine.store_id:
            start = truncate = low  # a new subscriber, or the log was replaced: rebuild
        else:
            sent = request.HasField("history") and len(request.history.epochs) > 0
            theirs = history_from_proto(request.history) if sent else LogHistory.legacy()
            # The log's newest epoch goes on past its end: a subscriber whose history agrees
            # all the way to a confirmed offset past the end claims bytes it cannot have.
            agreed = history.agreed_offset(theirs, max(confirmed, high))
            if confirmed > high and (agreed >= confirmed if sent else not known):
                raise OutOfRange(
                    f"confirmed offset {confirmed} is past the log's end {high}, and "
                    + (
                        "the subscriber's history says the log's current epoch wrote it"
                        if sent
                        else "an unknown subscriber sent no history"
                    )
                    + ": not a position of this log"
                )
            truncate = min(agreed, high)
            start = max(min(confirmed, truncate), low)
            if not engine.starts_record(start):
                boundary = max(engine.segment_start(start), low)
                log.warning(
                    "subscriber %s: confirmed offset %d is not a record boundary; "
                    "it truncates and replays from %d, its segment's start",
                    request.subscriber_id,
                    start,
                    boundary,
                )
                start = boundary
                truncate = min(truncate, boundary)
        return pb.Handshake(
            store_id=engine.store_id,
            min_offset=low,
            max_offset=high,
            start_offset=start,
            history=history_to_proto(history.compacted(low)),
            truncate_offset=truncate,
        )

    # The generated servicer types the stream as messages only; admission passes bytes through.
    def Subscribe(  # type: ignore[override]
        self, request: pb.SubscribeRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.SubscribeResponse | bytes]:
        """The handshake, then dispatch frames, each as its SubscribeResponse wire bytes."""
        sid = request.subscriber_id
        if not sid or len(sid.encode()) > SUBSCRIBER_ID_BYTES_MAX:
            raise InvalidArgument(
                f"subscriber id must be 1..{SUBSCRIBER_ID_BYTES_MAX} bytes", field="subscriber_id"
            )
        if request.confirmed_offset < 0:
            raise InvalidArgument("confirmed offset is negative", field="confirmed_offset")
        _check_store_id(request.store_id)
        if request.max_batch_entries < 0 or request.max_batch_bytes < 0:
            raise InvalidArgument("batch bounds must not be negative", field="max_batch_entries")
        if not 0 <= request.linger_ms <= DISPATCH_LINGER_MS_MAX:
            raise InvalidArgument(
                f"linger_ms must be 0..{DISPATCH_LINGER_MS_MAX}, not {request.linger_ms}",
                field="linger_ms",
            )
        if self._draining.is_set() or not self.engine.running:
            raise Unavailable("the commit log is shutting down")
        replication = self.replication
        if replication is not None and replication.role is not Role.LEADER:
            raise NotLeader(
                f"replica {replication.settings.name} does not lead group "
                f"{replication.settings.group}: subscribe to the leader "
                f"{replication.leader_address or '(not known yet)'}",
                leader=replication.leader_address,
            )
        s = self.settings
        entries_max = min(request.max_batch_entries or s.dispatch_batch_entries,
                          s.dispatch_batch_entries)  # fmt: skip
        bytes_max = min(request.max_batch_bytes or s.dispatch_batch_bytes, s.dispatch_batch_bytes)
        handshake = self._handshake(request, known=self.registry.get(sid) is not None)
        self.registry.connect(sid, handshake.start_offset)
        if request.include_records:
            self._with_records.add(sid)
        else:
            self._with_records.discard(sid)
        gone = threading.Event()

        def on_end() -> None:
            gone.set()
            self.engine.wake_waiters()

        context.add_callback(on_end)
        log.info(
            "subscriber %s: log [%d, %d), confirmed %d (%s store), truncate at %d, starting at %d",
            sid,
            handshake.min_offset,
            handshake.max_offset,
            request.confirmed_offset,
            "same" if request.store_id == handshake.store_id else "another",
            handshake.truncate_offset,
            handshake.start_offset,
        )
        try:
            yield pb.SubscribeResponse(handshake=handshake)
            yield from self._dispatch(
                sid, handshake.start_offset, entries_max, bytes_max, request.include_keys,
                request.linger_ms / 1000, context, gone,
            )  # fmt: skip
        finally:
            self.registry.disconnect(sid)
            # (A stream of the same id that replaced this one says so again in its next
            # Confirm: subscriber.py re-sends the wish every round or so.)
            self._with_records.discard(sid)
            log.info("subscriber %s disconnected", sid)

    def _dispatch(
        self,
        sid: str,
        offset: int,
        entries_max: int,
        bytes_max: int,
        include_keys: bool,
        linger_s: float,
        context: grpc.ServicerContext,
        gone: threading.Event,
    ) -> Iterator[bytes]:
        """The stream's dispatch frames, each as the SubscribeResponse wire bytes (held frames
        from the appends, or scanned ones shared through the frame cache)."""
        engine = self.engine
        next_frame_at = 0.0  # with a linger: when the next frame may go (unless one filled)
        while not gone.is_set() and context.is_active():
            if self._draining.is_set() or not engine.running:
                return  # the subscriber reconnects (with backoff) to whoever serves next
            replication = self.replication
            if replication is not None and replication.role is not Role.LEADER:
                # This replica stopped leading: a stream goes on only from the leader, whose
                # handshake brings the subscriber's history up to date (a stream tells no epoch).
                return
            if offset < engine.min_offset:
                raise OutOfRange(
                    f"offset {offset} expired under the stream (log minimum "
                    f"{engine.min_offset}); subscribe again"
                )
            seen = engine.confirm_offset
            if linger_s and offset < seen:
                wait_s = next_frame_at - time.monotonic()
                if wait_s > 0 and seen - offset < bytes_max:
                    gone.wait(wait_s)  # more appends join this frame
                    continue
            held = engine.appended.take(offset, seen, entries_max, bytes_max)
            frame: WireFrame | None = None  # held, not visible yet (sync flush: not durable)
            if held:  # the newest appends' own columns: no scan of the segment
                records_max = self._records_frame_bytes if sid in self._with_records else 0
                frame = frame_of_runs(held, include_keys, records_max)
                metrics.DISPATCH_FRAMES.labels("appended").inc()
            elif held is None:  # not held (behind the window, a blank, a gap): scan
                frame = self._frames.frame(
                    offset,
                    entries_max,
                    bytes_max,
                    include_keys,
                    partial(_scan, engine, offset, entries_max=entries_max, bytes_max=bytes_max),
                )
            if frame is not None:
                yield frame.wire
                offset = frame.next_offset
                self.registry.advance(sid, offset)
                next_frame_at = _next_frame_at(frame.entries, linger_s, entries_max)
                continue
            engine.wait_for_data(max(offset, seen), SUBSCRIBE_WAIT_S)

    def Confirm(
        self, request: pb.ConfirmRequest, context: grpc.ServicerContext
    ) -> pb.ConfirmResponse:
        sid = request.subscriber_id
        if not sid or len(sid.encode()) > SUBSCRIBER_ID_BYTES_MAX:
            raise InvalidArgument(
                f"subscriber id must be 1..{SUBSCRIBER_ID_BYTES_MAX} bytes", field="subscriber_id"
            )
        if request.confirmed_offset < 0:
            raise InvalidArgument("confirmed offset is negative", field="confirmed_offset")
        if request.store_id != self.engine.store_id:
            raise FailedPrecondition(
                "the subscriber confirms an offset of another store (the log was replaced); "
                "subscribe again"
            )
        high = self.engine.max_offset
        if request.confirmed_offset > high:
            raise OutOfRange(
                f"confirmed offset {request.confirmed_offset} is beyond the log's end {high}"
            )
        if request.HasField("confirmed_epoch"):
            history = self.engine.history
            if history.starts and request.confirmed_offset > history.starts[0]:
                epoch = history.epoch_before(request.confirmed_offset)
                if request.confirmed_epoch != epoch:
                    raise FailedPrecondition(
                        f"offset {request.confirmed_offset} was confirmed in epoch "
                        f"{request.confirmed_epoch}, but the log's bytes below it are epoch "
                        f"{epoch}'s: the log was cut since; subscribe again"
                    )
        floor = self.registry.confirm(sid, request.confirmed_offset)
        if request.HasField("include_records"):
            if request.include_records:
                self._with_records.add(sid)
            else:
                self._with_records.discard(sid)
        return pb.ConfirmResponse(retention_floor=floor)

    # -- status ---------------------------------------------------------------------------------

    def ForgetSubscriber(
        self, request: pb.ForgetSubscriberRequest, context: grpc.ServicerContext
    ) -> pb.ForgetSubscriberResponse:
        sid = request.subscriber_id
        state = self.registry.get(sid)
        if state is None:
            raise NotFound(f"no subscriber {sid[:256]!r} is known")
        if state.streams > 0:
            raise FailedPrecondition(
                f"subscriber {sid!r} is connected now: stop it first, or it would come back "
                "at once with the offset it holds"
            )
        self.registry.forget(sid)
        self._with_records.discard(sid)
        floor = self.registry.floor()
        log.info("subscriber %s forgotten; retention floor now %s", sid, floor)
        return pb.ForgetSubscriberResponse(retention_floor=-1 if floor is None else floor)

    # -- replication ----------------------------------------------------------------------------

    def Replicate(
        self, request_iterator: Iterator[pb.ReplicateRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.ReplicateResponse]:
        if self.replication is not None:
            return self.replication.feed.serve(request_iterator, context)
        if next(request_iterator, None) is None:
            return iter(())  # no request, or bytes that did not parse (admission answers)
        raise FailedPrecondition(
            "this commitlog_svc is a single replica, not in a broker group: "
            "there is no log to replicate from it (docs/replication.md)"
        )

    def Switchover(
        self, request: pb.SwitchoverRequest, context: grpc.ServicerContext
    ) -> pb.SwitchoverResponse:
        timeout_ms = request.timeout_ms or SWITCHOVER_TIMEOUT_DEFAULT_MS
        if not 0 < timeout_ms <= SWITCHOVER_TIMEOUT_MAX_MS:
            raise InvalidArgument(
                f"timeout_ms must be 1..{SWITCHOVER_TIMEOUT_MAX_MS}, not {request.timeout_ms}",
                field="timeout_ms",
            )
        if self.replication is None:
            raise FailedPrecondition(
                "this commitlog_svc is a single replica, not in a broker group: there is no "
                "follower to hand the lead to (docs/replication.md)"
            )
        done = self.replication.switchover(request.to or None, timeout_ms / 1000)
        return pb.SwitchoverResponse(
            leader=done.leader.name,
            leader_address=done.leader.address,
            epoch=done.leader.epoch,
            writes_paused_ms=done.paused_ms,
        )

    def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.ServicerContext
    ) -> pb.GetStatusResponse:
        engine = self.engine
        high = engine.max_offset
        newest_ts = engine.newest_store_timestamp_ms()
        response = pb.GetStatusResponse(
            store_id=engine.store_id,
            min_offset=engine.min_offset,
            max_offset=high,
            flushed_offset=engine.flushed_offset,
            confirm_offset=engine.confirm_offset,
            flush=engine.config.flush.value,
            writable=engine.writable and not self._draining.is_set(),
            store_host=engine.store_host,
            history=history_to_proto(engine.history.compacted(engine.min_offset)),
            role="single",
            commit_offset=high,
        )
        replication = self.replication
        if replication is not None:
            self._replica_status(replication, response)
        for sub in self.registry.snapshot():
            lag_bytes = max(0, high - sub.confirmed_offset)
            lag_ms = 0
            if lag_bytes and newest_ts >= 0:
                first_ts = engine.store_timestamp_at(sub.confirmed_offset)
                if first_ts >= 0:
                    lag_ms = max(0, newest_ts - first_ts)
            response.subscribers.add(
                subscriber_id=sub.subscriber_id,
                confirmed_offset=sub.confirmed_offset,
                lag_bytes=lag_bytes,
                lag_ms=lag_ms,
                connected=sub.streams > 0,
                sent_offset=sub.position if sub.streams > 0 else -1,
                updated_at_ms=sub.updated_at_ms,
            )
        return response

    def _replica_status(
        self, replication: ReplicaController, response: pb.GetStatusResponse
    ) -> None:
        settings = replication.settings
        response.role = replication.role.value
        response.group, response.replica = settings.group, settings.name
        response.leader, response.leader_address = (
            replication.leader_name,
            replication.leader_address,
        )
        response.commit_offset = replication.commit_offset()
        tracker = replication.tracker
        if tracker is None:
            return
        view = tracker.view()
        end = self.engine.max_offset
        now_ms = self.engine.clock.monotonic_ms()
        response.replicas.add(
            name=settings.name,
            end_offset=end,
            durable_offset=self.engine.flushed_offset,
            in_sync=True,
            connected=True,
            caught_up_ms_ago=0,
        )
        for replica in view.replicas:
            response.replicas.add(
                name=replica.name,
                end_offset=replica.end_offset,
                durable_offset=replica.durable_offset,
                lag_bytes=max(0, end - replica.end_offset),
                in_sync=replica.name in view.members,
                connected=replica.connected,
                caught_up_ms_ago=int(now_ms - replica.caught_up_at_ms)
                if replica.caught_up_at_ms
                else -1,
            )

    def gauges(self) -> metrics.GaugeValues:
        engine = self.engine
        high = engine.max_offset
        values = metrics.GaugeValues(
            min_offset=engine.min_offset,
            max_offset=high,
            confirm_offset=engine.confirm_offset,
            flush_behind_bytes=max(0, engine.queue.max_offset() - engine.flushed_offset),
        )
        # One statvfs a scrape: what retention's disk-full check sees (retention.py).
        values.disk_total_bytes, values.disk_used_bytes = engine.disk.usage(engine.queue.store_path)
        for sub in self.registry.snapshot():
            sent = sub.position if sub.streams > 0 else sub.confirmed_offset
            values.dispatch_behind[sub.subscriber_id] = max(0, high - sent)
            values.subscriber_lag[sub.subscriber_id] = max(0, high - sub.confirmed_offset)
        replication = self.replication
        if replication is not None:
            values.replica = self._replica_gauges(replication, high)
        return values

    def _replica_gauges(self, replication: ReplicaController, high: int) -> metrics.ReplicaGauges:
        gauges = metrics.ReplicaGauges(
            role=replication.role.value,
            epoch=self.engine.history.last_epoch,
            commit_offset=replication.commit_offset(),
            terms_won=replication.failovers,
        )
        tracker = replication.tracker
        if tracker is not None:
            view = tracker.view()
            now_ms = self.engine.clock.monotonic_ms()
            gauges.in_sync_size = len(view.members)
            for r in view.replicas:
                gauges.lag_bytes[r.name] = max(0, high - r.end_offset)
                since = now_ms - r.caught_up_at_ms if r.caught_up_at_ms else 0.0
                caught_up = r.connected and r.end_offset >= high
                gauges.lag_seconds[r.name] = 0.0 if caught_up else since / 1000
        return gauges


def _check_store_id(store_id: bytes) -> None:
    """Empty (never subscribed) or a store id; anything else is no store's."""
    if store_id and len(store_id) != STORE_ID_BYTES:
        raise InvalidArgument(
            f"a store id is {STORE_ID_BYTES} bytes (or empty), not {len(store_id)}",
            field="store_id",
        )


def _refused_answer(refused: _Refused) -> pb.AppendResponse:
    """An AppendStream's answer to a request refused as a whole: its sequence and error only."""
    err = refused.error
    return pb.AppendResponse(
        sequence=refused.sequence,
        error=pb.RequestError(
            code=status_code(err).value[0], message=str(err), field=err.field or ""
        ),
    )


def _read_status(offset: int, error: MqstoreError) -> pb.ReadStatus.ValueType:
    """The ReadStatus of a range a Read does not serve. A damaged record, or no record starting
    there, is READ_CORRUPT (never served; counted and logged); the others (expired, not written
    yet, past readable data, its segment deleted under the read) READ_OUT_OF_RANGE."""
    if not isinstance(error, CorruptRecord | InvalidArgument):
        return pb.READ_OUT_OF_RANGE
    if isinstance(error, CorruptRecord):
        metrics.CRC_MISMATCHES.labels("read").inc()
    log.error("Read at %d: %s", offset, error)
    return pb.READ_CORRUPT


def _scan(
    engine: CommitLog, start: int, include_keys: bool, *, entries_max: int, bytes_max: int
) -> DispatchScan:
    return scan_dispatch(
        engine,
        start,
        max_records=entries_max,
        max_bytes=bytes_max,
        include_keys=include_keys,
        on_corrupt=_report_corrupt,
    )


def _report_corrupt(corrupt: CorruptRange) -> None:
    metrics.CRC_MISMATCHES.labels("dispatch").inc()
    log.error(
        "dispatch skips corrupt bytes [%d, %d): %s",
        corrupt.start_offset,
        corrupt.end_offset,
        corrupt.reason,
    )


# Property keys only the store writes, and why.
_RESERVED_WHY = {
    PRODUCER_SEQ: " (use producer_id and sequence)",
    RECORD_CRC: " (the whole-record CRC it ends every record with)",
}
_RESERVED_KEYS = tuple(b"\x02" + key.encode() + b"\x01" for key in _RESERVED_WHY)


def _reserved_in(props: list[bytes]) -> str | None:
    """The reserved key some properties blob names (at its start or after a 0x02), if any: a
    C-speed search per key over the blobs joined by 0x02, so each one's start is covered too."""
    joined = b"\x02" + b"\x02".join(props)
    for key in _RESERVED_KEYS:
        if joined.find(key) >= 0:
            return key[1:-1].decode()
    return None


def _next_frame_at(entries: int, linger_s: float, entries_max: int) -> float:
    """When a lingering subscriber's next frame (of `entries`) may go: at once after a full
    frame (it is behind), else a linger after this one."""
    if not linger_s or entries >= entries_max:
        return 0.0
    return time.monotonic() + linger_s
