"""The subscriber side of the dispatch stream, shared by cq_svc and index_svc.

    Subscriber(target, subscriber_id, sink)
      connect -> Subscribe(subscriber_id, sink.store_id, sink.confirmed_offset, sink.history)
      handshake frame -> sink.on_handshake(store_id, min, max, truncate_offset, history)
                         (agreement before anything: drop what is at or past truncate_offset,
                         take the log's history as the sink's own)
      batches         -> sink.on_batch(columns, next_offset)      (replays are expected)
      every CONFIRM_INTERVAL_S, if sink.confirmed_offset moved (or wants_records() changed)
                      -> Confirm(confirmed offset, the epoch of its last byte in sink.history)
      stream ends or fails -> reconnect after a backoff (gRPC never retries a stream for us)

The channel is built with the follower's `ChannelSecurity` (TLS, client certificate, its
token): the stream and the Confirms carry the token like any client call.

`caught_up` turns true once the sink has applied everything the log held at the handshake
(the services' readiness), and false again when a handshake shows the log was replaced
(`on_ready_change` hears both). The sink's confirmed offset must only cover entries that are
applied and flushed: the commit log keeps every byte above the lowest confirmed offset.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import grpc

from mqstore.backoff import Backoff
from mqstore.dispatch import DispatchColumns, DispatchEntry
from mqstore.errors import InvalidArgument, MalformedFrame
from mqstore.history import LogHistory
from mqstore.rpc.channel import PLAINTEXT, ChannelSecurity
from mqstore.rpc.dispatch_codec import (
    decode_response,
    history_from_proto,
    history_to_proto,
)
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as pb_grpc
from mqstore.rpc.leader_channel import LeaderChannel, commitlog_channel

log = logging.getLogger(__name__)

SUBSCRIBE_METHOD = "/mqstore.commitlog.v1.CommitLog/Subscribe"

# Reconnect backoff (mqstore/backoff.py): doubling from the first pause to the ceiling (a
# commit log restarting takes seconds).
SUBSCRIBE_BACKOFF_FIRST_S = 0.1
SUBSCRIBE_BACKOFF_MAX_S = 5.0
# In a broker group the backoff stops lower: a new leader is elected within the lease TTL (2 s)
# and every probe of the replicas' roles is cheap, so the dispatch stream resumes within this of
# the election instead of up to SUBSCRIBE_BACKOFF_MAX_S later (which held consumers back after
# failovers).
GROUP_SUBSCRIBE_BACKOFF_MAX_S = 0.5
CONFIRM_INTERVAL_S = 0.2
# With wants_records, a Confirm says whether the frames should carry records at least this
# often even when nothing moved (a reconnect may have left the commit log told otherwise).
RECORDS_RESEND_S = 1.0
# A Confirm must not hang the loop when the commit log is away.
CONFIRM_TIMEOUT_S = 5.0


class DispatchSink(Protocol):
    """What a service's engine offers the subscriber loop."""

    @property
    def store_id(self) -> bytes: ...

    @property
    def confirmed_offset(self) -> int: ...

    @property
    def applied_offset(self) -> int: ...

    @property
    def history(self) -> LogHistory:
        """The epochs of what the sink holds (empty: none known)."""
        ...

    def on_handshake(
        self,
        store_id: bytes,
        min_offset: int,
        max_offset: int,
        truncate_offset: int,
        history: LogHistory,
    ) -> None: ...

    def on_batch(self, entries: Sequence[DispatchEntry], next_offset: int) -> None:
        """Apply a batch: a DispatchColumns from the loop (entry lists from other callers)."""


class Subscriber:
    def __init__(
        self,
        target: str,
        subscriber_id: str,
        sink: DispatchSink,
        *,
        include_keys: bool = False,
        wants_records: Callable[[], bool] | None = None,
        max_batch_entries: int = 0,
        linger_ms: int = 0,
        on_ready_change: Callable[[bool], None] | None = None,
        security: ChannelSecurity = PLAINTEXT,
        section: AbstractContextManager[object] | None = None,
        channel: grpc.Channel | None = None,
    ) -> None:
        self.target = target
        # The channel to the commit log (leader_channel.commitlog_channel: with a broker
        # group's addresses, one that follows the leader); made at start when not given.
        self._given_channel = channel
        # Held while a frame is decoded and applied (cq_svc: mqstore/cpu_section.py, shared
        # with its pull handlers); none by default.
        self._section: AbstractContextManager[object] = section or nullcontext()
        self.security = security
        self.subscriber_id = subscriber_id
        self.sink = sink
        self.include_keys = include_keys
        # Whether the frames should carry records (cq_svc's tail): asked at each Subscribe and
        # each confirm round; a change goes to the commit log with the next Confirm.
        self.wants_records = wants_records
        self._records_asked: bool | None = None
        self._records_told_at = 0.0
        self.max_batch_entries = max_batch_entries
        # At most one frame per linger while appends keep coming (SubscribeRequest.linger_ms).
        self.linger_ms = linger_ms
        self._on_ready_change = on_ready_change
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._connected = False
        self._call: grpc.Future[object] | None = None
        self._lock = threading.Lock()
        # Held while a handshake brings the sink into agreement, and while a Confirm reads the
        # sink's confirmed offset and history: the two must describe one log.
        self._agree_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._confirm_thread: threading.Thread | None = None
        self._catch_up_to = -1
        self._last_confirmed = -1
        self._channel: grpc.Channel | None = None
        self.failure: BaseException | None = None  # a sink error: the loop stopped for good
        self.batches = 0
        self.reconnects = 0

    # -- state ----------------------------------------------------------------------------------

    @property
    def caught_up(self) -> bool:
        return self._caught_up.is_set()

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.failure is None

    def wait_caught_up(self, timeout_s: float) -> bool:
        return self._caught_up.wait(timeout_s)

    # -- life cycle -----------------------------------------------------------------------------

    def start(self) -> None:
        self._channel = self._given_channel or commitlog_channel(self.target, self.security)
        self._thread = threading.Thread(target=self._run, name="subscriber", daemon=True)
        self._thread.start()
        self._confirm_thread = threading.Thread(
            target=self._confirm_loop, name="confirm", daemon=True
        )
        self._confirm_thread.start()

    def stop(self, flush: Callable[[], None] | None = None) -> None:
        """End the stream; then `flush` (the sink makes what it applied durable) and a last
        Confirm, so the commit log learns the final confirmed offset."""
        self._stop.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()
        for thread in (self._thread, self._confirm_thread):
            if thread is not None:
                thread.join(timeout=10)
        if flush is not None:
            flush()
        self.confirm_now()
        if self._channel is not None and self._given_channel is None:
            self._channel.close()  # a given channel is its owner's to close

    # -- the stream -----------------------------------------------------------------------------

    def _run(self) -> None:
        assert self._channel is not None
        backoff = Backoff(
            SUBSCRIBE_BACKOFF_FIRST_S,
            GROUP_SUBSCRIBE_BACKOFF_MAX_S
            if isinstance(self._channel, LeaderChannel)
            else SUBSCRIBE_BACKOFF_MAX_S,
        )
        while not self._stop.is_set():
            try:
                got_frames = self._follow()
            except grpc.RpcError as err:
                got_frames = False
                if not self._stop.is_set():
                    log.warning(
                        "subscription to %s broke: %s; reconnecting in %.1f s",
                        self.target,
                        _describe(err),
                        backoff.pause_s,
                    )
            except MalformedFrame as err:  # a malformed frame: nothing of it applied; ask again
                got_frames = False
                log.error(
                    "the commit log at %s sent a malformed frame: %s; reconnecting in %.1f s",
                    self.target,
                    err,
                    backoff.pause_s,
                )
            except Exception as err:  # the sink failed: stop, the service goes not-alive
                log.exception("applying dispatch failed; the subscription stops")
                self.failure = err
                return
            finally:
                self._connected = False
                with self._lock:
                    self._call = None
            if self._stop.is_set():
                return
            self.reconnects += 1
            if isinstance(self._channel, LeaderChannel):
                # A broker group: the leader may have moved (a follower refuses Subscribe).
                self.target = self._channel.find_leader()
            if got_frames:
                backoff.reset()
            self._stop.wait(backoff.next_s())

    def _follow(self) -> bool:
        with self._agree_lock:
            request = pb.SubscribeRequest(
                subscriber_id=self.subscriber_id,
                store_id=self.sink.store_id,
                confirmed_offset=self.sink.confirmed_offset,
                include_keys=self.include_keys,
                include_records=self._ask_records(),
                max_batch_entries=self.max_batch_entries,
                linger_ms=self.linger_ms,
                history=history_to_proto(self.sink.history),
            )
        # The stream's messages as bytes: a batch is decoded straight into columns (compiled).
        assert self._channel is not None
        call: Any = self._channel.unary_stream(
            SUBSCRIBE_METHOD, request_serializer=pb.SubscribeRequest.SerializeToString
        )(request)
        with self._lock:
            self._call = call
        if self._stop.is_set():
            call.cancel()
        got = False
        for raw in call:
            got = True
            frame = decode_response(raw)
            if isinstance(frame, DispatchColumns):
                with self._section:
                    self.sink.on_batch(frame, frame.next_offset)
                self.batches += 1
                if not self._caught_up.is_set() and frame.next_offset >= self._catch_up_to:
                    self._set_caught_up(True)
            elif frame.WhichOneof("frame") == "handshake":
                hs = frame.handshake
                try:
                    history = history_from_proto(hs.history)
                except InvalidArgument as err:
                    raise MalformedFrame(f"the handshake's history: {err}") from err
                if self.sink.store_id and hs.store_id != self.sink.store_id:
                    # The log was replaced: the sink drops everything and rebuilds, and is not
                    # caught up again until it has replayed the new log.
                    self._set_caught_up(False)
                with self._agree_lock:
                    self.sink.on_handshake(
                        hs.store_id, hs.min_offset, hs.max_offset, hs.truncate_offset, history
                    )
                self._connected = True
                self._catch_up_to = hs.max_offset
                log.info(
                    "subscribed to %s: log [%d, %d), starting at %d",
                    self.target,
                    hs.min_offset,
                    hs.max_offset,
                    hs.start_offset,
                )
                if self.sink.applied_offset >= self._catch_up_to:
                    self._set_caught_up(True)
        return got

    def _set_caught_up(self, value: bool) -> None:
        if value == self._caught_up.is_set():
            return
        if value:
            self._caught_up.set()
        else:
            self._caught_up.clear()
        if self._on_ready_change is not None:
            self._on_ready_change(value)

    # -- confirmations --------------------------------------------------------------------------

    def _confirm_loop(self) -> None:
        while not self._stop.wait(CONFIRM_INTERVAL_S):
            self.confirm_now()

    @property
    def records_included(self) -> bool:
        """The commit log was last told to send this stream's frames with their records."""
        return self._records_asked is True

    def _ask_records(self) -> bool:
        self._records_asked = self.wants_records is not None and self.wants_records()
        return self._records_asked

    def confirm_now(self) -> None:
        """Tell the commit log the sink's confirmed offset, if it moved, and, with
        wants_records, whether the frames should carry records (when that changed, and at
        least every RECORDS_RESEND_S: idempotent, and it mends a reconnect that raced a
        Confirm)."""
        with self._agree_lock:
            confirmed = self.sink.confirmed_offset
            history = self.sink.history
            store_id = self.sink.store_id
        if self._channel is None or not store_id or confirmed < 0:
            return
        now = time.monotonic()
        wanted: bool | None = None
        if self.wants_records is not None:
            wanted = self.wants_records()
            if wanted != self._records_asked or now - self._records_told_at >= RECORDS_RESEND_S:
                self._records_told_at = now
            else:
                wanted = None  # nothing to say
        if confirmed <= self._last_confirmed and wanted is None:
            return
        request = pb.ConfirmRequest(
            subscriber_id=self.subscriber_id,
            store_id=store_id,
            confirmed_offset=confirmed,
        )
        if len(history):
            # A Confirm read before a handshake that cut the sink and sent after it names the
            # old epoch: the log refuses it rather than count bytes the sink no longer holds.
            request.confirmed_epoch = history.epoch_before(confirmed)
        if wanted is not None:
            request.include_records = wanted
        stub = pb_grpc.CommitLogStub(self._channel)
        try:
            stub.Confirm(request, timeout=CONFIRM_TIMEOUT_S)
            self._last_confirmed = max(self._last_confirmed, confirmed)
            if wanted is not None:
                self._records_asked = wanted
        except grpc.RpcError as err:
            log.debug("confirm failed (will retry): %s", err)


def _describe(err: grpc.RpcError) -> str:
    code = getattr(err, "code", None)
    return str(code()) if callable(code) else repr(err)


def wait_until(predicate: object, timeout_s: float, step_s: float = 0.01) -> bool:
    """Poll `predicate()` until it is true or `timeout_s` passes (tests, launchers)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(step_s)
    return False
