"""A follower's side of `Replicate`: one stream to the leader, copying its log at the same
offsets (feed.py draws the exchange).

    hello {its history and end}  ──▶
                                 ◀──  agreement: truncate there (or start afresh from the
                                      leader's first segment and tables), take its history
    for each chunk:                   append_replicated (every record checked first)
    acker thread:                ──▶  ack {end, durable} after each chunk and each flush

"Durable" follows the replica's own flush policy, as the leader's acknowledgement does: under
sync flush the flushed end, under async the written end (an async acknowledgement promises
the page cache, not the disk; docs/durability.md).

The link ends (returns) when the stream ends or `stop` is set, and raises the typed error of a
refusal (a chunk that fails its checks, a log that is not this group's). A stream silent for
LINK_IDLE_S is cancelled: the leader sends a heartbeat every 0.2 s, so silence means it is
gone or cut off; the controller then finds the group's leader again.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator

import grpc

from commitlog_svc.config import FlushMode
from commitlog_svc.replica import ReplicaLog
from commitlog_svc.replica_chunk import Chunk
from commitlog_svc.replication.feed import log_start_of
from mqstore.errors import DataLoss, FailedPrecondition, MqstoreError, Unavailable
from mqstore.history import Epoch
from mqstore.rpc.channel import PLAINTEXT, ChannelSecurity, make_channel
from mqstore.rpc.dispatch_codec import history_from_proto, history_to_proto
from mqstore.rpc.errors import error_from_rpc
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

# A stream with no message for this long is taken for dead (25 heartbeats).
LINK_IDLE_S = 5.0
# The acker sends at least this often while durable progress is pending.
ACK_WAIT_S = 0.05
# How soon the link notices `stop` (a change of leader): part of a switchover's pause.
STOP_POLL_S = 0.02


class FollowerLink:
    """Copies the leader's log into `log_` over one stream at a time (`run`)."""

    def __init__(
        self,
        log_: ReplicaLog,
        *,
        group: str,
        name: str,
        security: ChannelSecurity = PLAINTEXT,
        idle_s: float = LINK_IDLE_S,
    ) -> None:
        self._log = log_
        self.group = group
        self.name = name
        self._security = security
        self._idle_s = idle_s
        self.commit_offset = 0  # the highest the leader announced
        self._applied = threading.Condition()  # notified after each chunk: the acker sends

    def _durable(self) -> int:
        replica = self._log
        if replica.config.flush is FlushMode.SYNC:
            return replica.durable_offset
        return replica.end_offset

    def run(self, target: str, stop: threading.Event) -> None:
        """One stream to the leader at `target`, until it ends or `stop` is set."""
        replica = self._log
        outbox: queue.Queue[pb.ReplicateRequest | None] = queue.Queue()
        outbox.put(
            pb.ReplicateRequest(
                hello=pb.ReplicaHello(
                    group=self.group,
                    replica=self.name,
                    store_id=replica.store_id if replica.end_offset > replica.min_offset else b"",
                    history=history_to_proto(replica.history),
                    end_offset=replica.end_offset,
                )
            )
        )
        channel = make_channel(target, self._security)
        stub = pb_grpc.CommitLogStub(channel)
        responses = stub.Replicate(_drain(outbox))
        last_heard = [time.monotonic()]
        done = threading.Event()
        watchdog = threading.Thread(
            target=self._watch, args=(responses, last_heard, done, stop), daemon=True
        )
        watchdog.start()
        acker: threading.Thread | None = None
        try:
            for response in responses:
                last_heard[0] = time.monotonic()
                kind = response.WhichOneof("kind")
                if kind == "agreement":
                    self._agree(response.agreement)
                    acker = threading.Thread(
                        target=self._ack_loop, args=(outbox, done), daemon=True
                    )
                    acker.start()
                    continue
                if kind != "chunk" or acker is None:
                    raise MqstoreError(f"unexpected {kind} from the leader")
                self._apply(response.chunk)
                if stop.is_set():
                    break
        except grpc.RpcError as err:
            code, message, _ = error_from_rpc(err)
            if code == grpc.StatusCode.CANCELLED:
                return
            error: type[MqstoreError] = {
                grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
                grpc.StatusCode.DATA_LOSS: DataLoss,
            }.get(code, Unavailable)
            raise error(f"the leader at {target} ended the stream: {code.name}: {message}") from err
        finally:
            done.set()
            with self._applied:
                self._applied.notify_all()
            outbox.put(None)
            responses.cancel()
            channel.close()
            if acker is not None:
                acker.join(timeout=5)

    def _agree(self, agreement: pb.ReplicaAgreement) -> None:
        replica = self._log
        if replica.store_id != agreement.store_id:
            replica.adopt_store_id(agreement.store_id)
        replica.truncate(agreement.truncate_offset)
        start = log_start_of(agreement)
        if start is not None:
            replica.start_at(start)
        log.info(
            "following the leader of %s: truncated at %d, copying from %d (leader epoch %d)",
            self.group,
            agreement.truncate_offset,
            replica.end_offset,
            agreement.epoch,
        )
        history_from_proto(agreement.history)  # a malformed one is refused here

    def _apply(self, message: pb.ReplicaChunk) -> None:
        self.commit_offset = max(self.commit_offset, message.commit_offset)
        if not message.data and message.next_offset == message.offset:
            return
        epochs = history_from_proto(message.epochs)
        chunk = Chunk(
            message.offset,
            message.data,
            message.next_offset,
            tuple(Epoch(e, s) for e, s in zip(epochs.epochs, epochs.starts, strict=True)),
        )
        self._log.append_replicated(chunk)
        with self._applied:
            self._applied.notify_all()

    def _ack_loop(
        self, outbox: queue.Queue[pb.ReplicateRequest | None], done: threading.Event
    ) -> None:
        """The one sender of acks (so they leave in order): whenever the end or the durable
        offset moved, after each chunk and, under sync flush, after each flush."""
        replica = self._log
        sent = (-1, -1)
        while not done.is_set():
            progress = (replica.end_offset, self._durable())
            if progress != sent:
                outbox.put(
                    pb.ReplicateRequest(
                        ack=pb.ReplicaAck(end_offset=progress[0], durable_offset=progress[1])
                    )
                )
                sent = progress
                continue
            if progress[1] < progress[0]:
                replica.wait_durable(progress[0], ACK_WAIT_S)
                continue
            with self._applied:
                if replica.end_offset == progress[0] and not done.is_set():
                    self._applied.wait(ACK_WAIT_S)

    def _watch(
        self,
        responses: grpc.Future[pb.ReplicateResponse],
        last_heard: list[float],
        done: threading.Event,
        stop: threading.Event,
    ) -> None:
        while not done.wait(STOP_POLL_S):
            if stop.is_set() or time.monotonic() - last_heard[0] > self._idle_s:
                if not stop.is_set():
                    log.warning(
                        "the leader said nothing for %.1f s: dropping the stream", self._idle_s
                    )
                responses.cancel()
                return


def _drain(outbox: queue.Queue[pb.ReplicateRequest | None]) -> Iterator[pb.ReplicateRequest]:
    while True:
        item = outbox.get()
        if item is None:
            return
        yield item
