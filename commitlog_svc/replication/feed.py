"""The leader's side of `Replicate`: its log, sent to one follower at the same offsets.

    follower                                  leader (this module)
    hello {group, replica, store id,    ──▶   agree: the follower truncates at the agreed
           history, end}                      offset, or (holding nothing the leader still
                                              has) starts afresh at the first segment
                                        ◀──   agreement {truncate, start, history, tables}
    ack {end, durable}  (any time)      ──▶   in-sync tracker: the follower's progress
                                        ◀──   chunk {offset, data, next_offset, epochs,
                                                     commit offset}   whole records
                                        ◀──   empty chunk every HEARTBEAT_S when idle

The leader sends at most WINDOW_BYTES past what the follower acknowledged having written, so a
slow follower holds no more than that in the stream's buffers. The stream ends when the
follower goes, when this replica stops leading, or when the service stops.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from commitlog_svc.replica import ReplicaLog
from commitlog_svc.replica_chunk import CHUNK_BYTES_MAX, Chunk, LogStart
from commitlog_svc.replication.in_sync import InSyncTracker
from mqstore.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotLeader,
    OutOfRange,
    StoreIdMismatch,
)
from mqstore.formats.commitlog_checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint
from mqstore.history import LogHistory
from mqstore.rpc.dispatch_codec import history_from_proto, history_to_proto
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb

log = logging.getLogger(__name__)

# An idle stream carries an empty chunk this often: the follower learns the commit offset, and
# that the leader lives (it gives up on a stream silent for LINK_IDLE_S, link.py).
HEARTBEAT_S = 0.2
# Bytes sent past the follower's acknowledged end at most: 8 chunks keep a follower busy while
# its acks travel back, and bound what a stalled one holds in buffers.
WINDOW_BYTES = 8 * CHUNK_BYTES_MAX
# A replica's name: what etcd's in-sync set and the status name it by.
REPLICA_NAME_BYTES_MAX = 64


class LeaderFeed:
    """Serves Replicate streams from the leader's log. `tracker()` is the current term's
    in-sync tracker (None while this replica does not lead)."""

    def __init__(
        self,
        log_: ReplicaLog,
        *,
        group: str,
        name: str,
        tracker: Callable[[], InSyncTracker | None],
        heartbeat_s: float = HEARTBEAT_S,
        window_bytes: int = WINDOW_BYTES,
    ) -> None:
        self._log = log_
        self.group = group
        self.name = name
        self._tracker = tracker
        self._heartbeat_s = heartbeat_s
        self._window_bytes = window_bytes
        self._stopping = threading.Event()

    def stop(self) -> None:
        """End every stream (the service stops)."""
        self._stopping.set()
        self._log.wake_waiters()

    def serve(
        self, requests: Iterator[pb.ReplicateRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.ReplicateResponse]:
        first = next(requests, None)
        if first is None:
            return  # no request, or bytes that did not parse (admission answers)
        if first.WhichOneof("kind") != "hello":
            raise InvalidArgument("a Replicate stream begins with a hello", field="hello")
        hello = first.hello
        follower = self._check_hello(hello)
        tracker = self._tracker()
        if tracker is None or not self._log.leads:
            raise NotLeader(f"replica {self.name} does not lead group {self.group}")
        agreement, position = self._agree(hello)
        log.info(
            "follower %s connected: its end %d, truncate at %d, copies from %d",
            follower,
            hello.end_offset,
            agreement.truncate_offset,
            position,
        )
        yield pb.ReplicateResponse(agreement=agreement)
        acked = _Acks(position)
        reader = threading.Thread(
            target=self._read_acks,
            args=(requests, follower, tracker, acked),
            name=f"replicate-acks-{follower}",
            daemon=True,
        )
        reader.start()
        try:
            yield from self._send(position, tracker, acked, context)
        finally:
            acked.close()
            tracker.disconnected(follower)
            log.info("follower %s disconnected", follower)

    # -- the hello ---------------------------------------------------------------------------

    def _check_hello(self, hello: pb.ReplicaHello) -> str:
        if hello.group != self.group:
            raise FailedPrecondition(
                f"this leader serves group {self.group!r}, not {hello.group[:64]!r}"
            )
        name = hello.replica
        if not name or len(name.encode()) > REPLICA_NAME_BYTES_MAX or not name.isprintable():
            raise InvalidArgument(
                f"a replica name is 1-{REPLICA_NAME_BYTES_MAX} printable bytes", field="replica"
            )
        if name == self.name:
            raise FailedPrecondition(f"replica {name!r} is this leader's own name")
        if hello.end_offset < 0:
            raise InvalidArgument("end_offset is not negative", field="end_offset")
        return name

    def _agree(self, hello: pb.ReplicaHello) -> tuple[pb.ReplicaAgreement, int]:
        """The agreement for this follower and where its copy begins."""
        leader = self._log
        history = history_from_proto(hello.history)
        if hello.store_id and hello.store_id != leader.store_id:
            raise StoreIdMismatch(
                f"replica {hello.replica!r} holds the log {hello.store_id.hex()}, this group's "
                f"is {leader.store_id.hex()}: it can join only empty"
            )
        agreed = 0 if not hello.store_id else leader.agreed_offset(history, hello.end_offset)
        answer = pb.ReplicaAgreement(
            store_id=leader.store_id,
            epoch=leader.history.last_epoch,
            truncate_offset=agreed,
            start_offset=agreed,
        )
        if agreed < leader.min_offset or (agreed == 0 and leader.min_offset > 0):
            start = leader.log_start()
            answer.start_offset = start.offset
            answer.start_tables = encode_checkpoint(
                Checkpoint(
                    store_id=leader.store_id,
                    flushed_offset=start.taken_at,
                    min_offset=start.offset,
                    queue_offsets=start.queue_offsets,
                    producers=start.producers,
                )
            )
        answer.history.CopyFrom(history_to_proto(_up_to(leader.history, answer.start_offset)))
        return answer, answer.start_offset

    # -- sending -----------------------------------------------------------------------------

    def _send(
        self,
        position: int,
        tracker: InSyncTracker,
        acked: _Acks,
        context: grpc.ServicerContext,
    ) -> Iterator[pb.ReplicateResponse]:
        leader = self._log
        last_sent = time.monotonic()
        while context.is_active() and not self._stopping.is_set() and not acked.closed:
            if not leader.leads or self._tracker() is not tracker:
                raise NotLeader(f"replica {self.name} stopped leading group {self.group}")
            if position - acked.end > self._window_bytes:
                acked.wait_beyond(position - self._window_bytes, self._heartbeat_s)
                if position - acked.end > self._window_bytes:
                    if time.monotonic() - last_sent >= self._heartbeat_s:
                        yield self._chunk(Chunk(position, b"", position), tracker)
                        last_sent = time.monotonic()
                    continue
            try:
                chunk = leader.read_chunk(position)
            except OutOfRange as err:
                # Retention took the segment this follower needed next: it starts again.
                raise FailedPrecondition(f"the follower must connect again: {err}") from err
            if chunk.data:
                yield self._chunk(chunk, tracker)
                position = chunk.next_offset
                last_sent = time.monotonic()
                continue
            if time.monotonic() - last_sent >= self._heartbeat_s:
                yield self._chunk(chunk, tracker)
                last_sent = time.monotonic()
            leader.wait_for_written(position, self._heartbeat_s)

    @staticmethod
    def _chunk(chunk: Chunk, tracker: InSyncTracker) -> pb.ReplicateResponse:
        epochs = LogHistory((e.epoch, e.start_offset) for e in chunk.epochs)
        return pb.ReplicateResponse(
            chunk=pb.ReplicaChunk(
                offset=chunk.offset,
                data=chunk.data,
                next_offset=chunk.next_offset,
                epochs=history_to_proto(epochs),
                commit_offset=tracker.commit_offset,
            )
        )

    def _read_acks(
        self,
        requests: Iterator[pb.ReplicateRequest],
        follower: str,
        tracker: InSyncTracker,
        acked: _Acks,
    ) -> None:
        try:
            for request in requests:
                if request.WhichOneof("kind") != "ack":
                    log.warning("follower %s sent a second hello; ending its stream", follower)
                    break
                ack = request.ack
                end, durable = ack.end_offset, ack.durable_offset
                if end < 0 or durable < 0:
                    log.warning("follower %s acked negative offsets; ending its stream", follower)
                    break
                acked.moved(end)
                tracker.follower_progress(follower, end, durable)
        except grpc.RpcError:
            pass  # the stream ended under us
        except Exception:
            log.exception("reading follower %s's acks failed", follower)
        finally:
            acked.close()
            self._log.wake_waiters()


class _Acks:
    """The follower's acknowledged end, for the send window."""

    def __init__(self, end: int) -> None:
        self.end = end
        self.closed = False
        self._cond = threading.Condition()

    def moved(self, end: int) -> None:
        with self._cond:
            self.end = max(self.end, end)
            self._cond.notify_all()

    def wait_beyond(self, offset: int, timeout_s: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.end > offset or self.closed, timeout=timeout_s)

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()


def _up_to(history: LogHistory, offset: int) -> LogHistory:
    """The epochs that began at or before `offset` (those a follower starting there holds)."""
    return LogHistory(
        (e, s) for e, s in zip(history.epochs, history.starts, strict=True) if s <= offset
    )


def log_start_of(agreement: pb.ReplicaAgreement) -> LogStart | None:
    """The LogStart a follower begins from, when the agreement says it starts afresh."""
    if agreement.start_offset == agreement.truncate_offset and not agreement.start_tables:
        return None
    tables = decode_checkpoint(agreement.start_tables, path="replica agreement")
    return LogStart(
        offset=agreement.start_offset,
        taken_at=tables.flushed_offset,
        queue_offsets=tables.queue_offsets,
        producers=tables.producers,
    )
