"""The engine as the dispatch stream's sink (mqstore.rpc.subscriber.DispatchSink), and the
commit log's end as cq_svc last saw it (for the dispatch-lag gauge).

    Subscriber ──on_handshake──▶ EngineSink ──▶ CqEngine.handshake, wake every long poll,
                                               drop the held tail records, check the commit
                                               log's files again (local_reads.py)
               ──on_batch─────▶            ──▶ hold the frame's records (TailRecords), then
                                               CqEngine.apply_columns, wake the long polls
                                               of the queues the batch touched

The sink runs on the subscriber's thread; pulls run on server threads against the same store
(its lock orders them). A long poll registered before its last look is woken by the batch
that makes a message visible to it (watch.py).

The log's bounds between handshakes: `HeadProbe` asks the commit log's GetStatus every few
seconds. Its end gives the dispatch lag (behind = the end minus the applied offset; the
handshake and every batch's next offset move it too); its minimum, when it moves up, means
segments expired while the stream ran, and the queues (and the tail records, and the segment
files read beside the log) drop what points below it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import grpc

from cq_svc import metrics
from cq_svc.engine import CqEngine
from cq_svc.local_reads import LocalReads
from cq_svc.tail_records import TailRecords
from cq_svc.watch import QueueWatch
from mqstore.dispatch import DispatchColumns, DispatchEntry
from mqstore.errors import MqstoreError
from mqstore.formats.cq_checkpoint import NO_STORE_ID
from mqstore.history import LogHistory
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl_pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as cl_grpc

log = logging.getLogger(__name__)

HEAD_PROBE_TIMEOUT_S = 2.0


class EngineSink:
    def __init__(
        self,
        engine: CqEngine,
        watch: QueueWatch,
        tail: TailRecords | None = None,
        local: LocalReads | None = None,
    ) -> None:
        self.engine = engine
        self.watch = watch
        self.tail = tail
        self.local = local
        self._log_end = 0
        self._log_min = 0
        self._log_store_id = b""

    # -- DispatchSink ------------------------------------------------------------------------------

    @property
    def store_id(self) -> bytes:
        """The log followed; empty before the first handshake (the Subscribe contract)."""
        sid = self.engine.store.store_id
        return b"" if sid == NO_STORE_ID else sid

    @property
    def confirmed_offset(self) -> int:
        return self.engine.store.confirmed_offset

    @property
    def applied_offset(self) -> int:
        return self.engine.store.applied_offset

    @property
    def history(self) -> LogHistory:
        """The epochs of what the store holds (the last handshake's history)."""
        return self.engine.history

    def on_handshake(
        self,
        store_id: bytes,
        min_offset: int,
        max_offset: int,
        truncate_offset: int,
        history: LogHistory,
    ) -> None:
        if self.tail is not None:
            self.tail.clear()  # the log may have lost its tail or been replaced
        if self.local is not None:
            self.local.on_handshake(store_id, min_offset)  # the same: check the files again
        action = self.engine.handshake(store_id, min_offset, truncate_offset, history)
        self._log_store_id = store_id
        self._log_end = max_offset
        self._log_min = min_offset
        metrics.HANDSHAKES.labels(action.action).inc()
        log.info(
            "handshake with the commit log: %s; log [%d, %d) in epoch %d, truncate at %d, "
            "applied %d, confirmed %d",
            action.action,
            min_offset,
            max_offset,
            history.last_epoch,
            truncate_offset,
            self.applied_offset,
            self.confirmed_offset,
        )
        # Truncation or a rebuild moved queue ends under waiting polls: let them look again.
        self.watch.notify_all()

    def on_batch(self, entries: Sequence[DispatchEntry], next_offset: int) -> None:
        """A frame: the Subscriber hands DispatchColumns (the DispatchSink signature)."""
        assert isinstance(entries, DispatchColumns)
        if entries.records and self.tail is not None:
            # Held before the units are applied: a pull that finds the units finds these.
            self.tail.add(entries.commit_log_offsets, entries.sizes, entries.records)
        written = self.engine.apply_columns(entries, next_offset)
        if written:
            metrics.APPLIED_ENTRIES.inc(written)
        self._log_end = max(self._log_end, next_offset)
        if self.watch.waiting:
            self.watch.notify(entries.queue_keys())

    # -- lag ---------------------------------------------------------------------------------------

    def observe_log(self, store_id: bytes, min_offset: int, max_offset: int) -> None:
        """The log's bounds from its GetStatus (ignored if it is another log than ours): the end
        for the lag gauge; a minimum that moved up means segments expired while the stream
        ran, so the queues drop what points below it (else pulls would find their first
        messages removed, over and over)."""
        if not store_id or store_id != self._log_store_id:
            return
        self._log_end = max(self._log_end, max_offset)
        if min_offset > self._log_min:
            self._log_min = min_offset
            if self.tail is not None:
                self.tail.drop_below(min_offset)
            if self.local is not None:
                self.local.drop_below(min_offset)
            deleted = self.engine.expire(min_offset)
            log.info("the commit log's minimum moved to %d: %d expired", min_offset, deleted)

    @property
    def dispatch_behind_bytes(self) -> int:
        return max(0, self._log_end - self.applied_offset)


class HeadProbe:
    """Asks the commit log for its bounds every `interval_s` (log_probe_interval_ms)."""

    def __init__(self, channel: grpc.Channel, sink: EngineSink, interval_s: float) -> None:
        self._stub = cl_grpc.CommitLogStub(channel)
        self._interval_s = interval_s
        self._sink = sink
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cq-head-probe", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=HEAD_PROBE_TIMEOUT_S + 1)

    def probe_once(self) -> bool:
        try:
            status = self._stub.GetStatus(cl_pb.GetStatusRequest(), timeout=HEAD_PROBE_TIMEOUT_S)
        except grpc.RpcError as err:
            log.debug("commit log status unavailable: %s", err)
            return False
        try:
            self._sink.observe_log(status.store_id, status.min_offset, status.max_offset)
        except MqstoreError as err:
            # A failed flush: liveness reports it already; the probe carries on regardless.
            log.warning("could not expire consume queues: %s", err)
            return False
        return True

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.probe_once()
