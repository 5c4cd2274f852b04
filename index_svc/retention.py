"""Following the commit log's retention: index files wholly below its minimum offset go.

The handshake tells a replica the log's minimum offset only when it (re)subscribes; a replica
that stays subscribed for weeks would otherwise keep every index file forever and walk chains
into deleted segments. RocketMQ's clean service calls deleteExpiredFile(minOffset) on its own
index after deleting commit-log files; here a thread asks the commit log for its minimum offset
(GetStatus) every `interval_s` and hands it to `engine.delete_expired`, which stops returning
candidates below it and deletes the leading files whose last entry lies below it (never the
newest file). A failed GetStatus is retried at the next tick; a status of another store (the
log was replaced; the next handshake rebuilds the index) is ignored.
"""

from __future__ import annotations

import logging
import threading

import grpc

from index_svc.engine import IndexEngine
from mqstore.errors import Unavailable
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

STATUS_TIMEOUT_S = 5.0


class RetentionFollower:
    def __init__(self, engine: IndexEngine, channel: grpc.Channel, interval_s: float) -> None:
        self.engine = engine
        self._stub = pb_grpc.CommitLogStub(channel)
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="index-retention", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.follow_once()
            except Unavailable:
                return  # the engine stopped writing; liveness reports it
            except Exception:
                log.exception("following the commit log's retention failed; will retry")

    def follow_once(self) -> list[str]:
        """One round: the log's minimum offset to the engine. Returns the files deleted."""
        try:
            status = self._stub.GetStatus(pb.GetStatusRequest(), timeout=STATUS_TIMEOUT_S)
        except grpc.RpcError as err:
            log.debug("commit log status unavailable for retention: %s", err)
            return []
        self.rounds += 1
        if status.store_id != self.engine.store_id or status.min_offset <= self.engine.min_offset:
            return []
        deleted = self.engine.delete_expired(status.min_offset)
        if deleted:
            log.info(
                "the commit log's minimum is now %d: deleted index files %s",
                status.min_offset,
                ", ".join(deleted),
            )
        return deleted
