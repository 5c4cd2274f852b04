"""The index_svc process: `python -m index_svc [flags]` (flags: index_svc/settings.py).

    health port          startup, readiness, liveness NOT_SERVING / SERVING as below
    open the engine      recovery; its checkpoint says where to resubscribe
    subscribe            Subscriber(include_keys=True): handshake, replay, tail, Confirm;
                         the idle flusher; the retention follower (retention.py)
    API port             Index service (servicer.py), reflection; startup SERVING
    caught up            readiness SERVING: queries are answered from then on (before, they
                         answer UNAVAILABLE); it stays so while the commit log is away (the
                         index still answers what it holds), and turns NOT_SERVING again when a
                         handshake shows the log was replaced, until the rebuild caught up
    SIGTERM / SIGINT     readiness NOT_SERVING, finish calls in flight, stop the subscription,
                         flush and checkpoint as a clean close (engine.close)

Liveness holds while the subscriber loop and the idle flusher run and no flush failed: a
failed flush or a full disk stops writes for good, and the process must restart into recovery.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Sequence

import grpc

from index_svc import metrics
from index_svc.engine import IndexEngine
from index_svc.records import CommitLogReader
from index_svc.retention import RetentionFollower
from index_svc.servicer import IndexServicer
from index_svc.settings import IndexSettings
from index_svc.sink import Flusher, IndexSink
from mqstore.errors import MqstoreError
from mqstore.rpc import logs
from mqstore.rpc.gen.index.v1 import index_pb2, index_pb2_grpc
from mqstore.rpc.leader_channel import commitlog_channel
from mqstore.rpc.server import READINESS, ServiceHost
from mqstore.rpc.subscriber import Subscriber
from mqstore.storage import data_mode
from mqstore.storage.disk import Disk

log = logging.getLogger(__name__)

SERVICE_NAME = "index_svc"
INDEX_SERVICE = index_pb2.DESCRIPTOR.services_by_name["Index"].full_name
# How often the readiness watcher looks at the subscriber while it catches up.
READINESS_POLL_S = 0.05


class IndexService:
    """The engine, the subscription, the flusher and the gRPC host of one replica."""

    def __init__(self, settings: IndexSettings, *, disk: Disk | None = None) -> None:
        self.settings = settings
        self.engine = IndexEngine(settings.index_config(), disk=disk)
        self.sink = IndexSink(self.engine)
        # TLS and this replica's token for the subscription and for Reads and status.
        security = settings.commitlog_security()
        # One channel to the commit log (every replica of a broker group: it follows the
        # leader) for the subscription, queries' Reads and retention's GetStatus.
        self._channel = commitlog_channel(settings.commitlog_target, security)
        self.subscriber = Subscriber(
            settings.commitlog_target,
            settings.subscriber_id,
            self.sink,
            include_keys=True,
            max_batch_entries=settings.max_batch_entries,
            linger_ms=settings.dispatch_linger_ms,
            on_ready_change=self._ready_changed,
            security=security,
            channel=self._channel,
        )
        self.flusher = Flusher(self.engine)
        self.retention = RetentionFollower(
            self.engine, self._channel, settings.retention_check_interval_s
        )
        self.host = ServiceHost(
            SERVICE_NAME,
            settings,
            register=self._register,
            on_stop=self._on_stop,
            alive=self.alive,
            ports_file=settings.ports_file,
        )
        self._ready_thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._opened = False

    # -- state ----------------------------------------------------------------------------------

    def alive(self) -> bool:
        return self.subscriber.alive and self.flusher.alive and self.engine.failure is None

    def caught_up(self) -> bool:
        return self.subscriber.caught_up

    # -- life cycle -----------------------------------------------------------------------------

    def start(self) -> None:
        s = self.settings
        self.host.start_health()
        log.info(
            "index replica %s: shard %d of %d%s, following %s",
            s.subscriber_id,
            s.shard_index,
            s.shard_count,
            ", exact" if s.exact else "",
            s.commitlog_target,
        )
        self.engine.open()
        self._opened = True
        try:
            self.subscriber.start()
            self.flusher.start()
            self.retention.start()
            self.host.start()
        except BaseException:
            self._on_stop()
            raise
        self._ready_thread = threading.Thread(
            target=self._watch_readiness, name="index-readiness", daemon=True
        )
        self._ready_thread.start()

    def _register(self, server: grpc.Server) -> Sequence[str]:
        servicer = IndexServicer(
            self.engine,
            CommitLogReader(self._channel),
            caught_up=self.caught_up,
            default_results=self.settings.default_results,
            read_timeout_s=self.settings.read_timeout_s,
        )
        index_pb2_grpc.add_IndexServicer_to_server(servicer, server)
        return [INDEX_SERVICE]

    def _ready_changed(self, ready: bool) -> None:
        metrics.CAUGHT_UP.set(1 if ready else 0)
        if not self._closing.is_set():
            self.host.set_serving(READINESS, ready)

    def _watch_readiness(self) -> None:
        while not self._closing.is_set():
            if self.subscriber.wait_caught_up(READINESS_POLL_S):
                log.info("caught up with the commit log at %d", self.engine.applied_offset)
                metrics.CAUGHT_UP.set(1)
                self.host.set_serving(READINESS, True)
                return

    def _on_stop(self) -> None:
        """After the API stopped: end the subscription, then flush and checkpoint."""
        if self._closing.is_set():
            return
        self._closing.set()
        metrics.CAUGHT_UP.set(0)
        self.subscriber.stop()
        self.flusher.stop()
        self.retention.stop()
        self._channel.close()
        if not self._opened:
            return
        self.engine.close()
        log.info(
            "index closed: confirmed offset %d, applied %d",
            self.engine.confirmed_offset,
            self.engine.applied_offset,
        )

    def run(self) -> None:
        """Start, then serve until SIGTERM or SIGINT."""
        self.host.install_signal_handlers()
        self.start()
        self.host.wait()


def main(argv: Sequence[str] | None = None) -> int:
    settings = IndexSettings.load(list(sys.argv[1:] if argv is None else argv))
    logs.configure(settings.log_level, settings.log_format, service=SERVICE_NAME)
    # Before anything is created: every file of the store is born private (data_mode.py).
    data_mode.apply(settings.data_dir, settings.data_mode)
    service = IndexService(settings)
    try:
        service.run()
    except MqstoreError as err:  # expected (another process holds the directory, ...)
        log.error("index_svc cannot run: %s", err)
        service.host.shutdown()
        return 1
    except Exception:
        log.exception("index_svc failed")
        service.host.shutdown()
        return 1
    return 0
