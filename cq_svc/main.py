"""`python -m cq_svc`: the consume-queue service process.

    settings (file < env < flags) -> logs -> health port ("startup" NOT_SERVING)
    -> engine.open (lock, recovery) -> API port ("startup" SERVING)
    -> subscription to commitlog_svc (handshake, replay, tail; reconnects with backoff)
    -> "readiness" SERVING once the replay caught up with the log's end at the handshake
    -> wait for SIGTERM / SIGINT

Liveness: the subscriber's loop is alive (a sink error stops it for good) and the engine's
flush thread is healthy (a failed flush stops writes until a restart).

SIGTERM: long polls answer at once (the watch closes), readiness NOT_SERVING, the API stops
accepting and finishes calls within the grace period; then flush and checkpoint, a last
Confirm, stop the subscription, close the engine (which removes the abort marker only when
everything is durable).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Sequence

import grpc

from cq_svc import metrics
from cq_svc.engine import CqEngine
from cq_svc.local_reads import LocalReads
from cq_svc.record_sources import RecordSources
from cq_svc.servicer import CqServicer
from cq_svc.settings import CqSettings, raise_open_files_limit
from cq_svc.sink import EngineSink, HeadProbe
from cq_svc.tail_records import TailRecords
from cq_svc.watch import QueueWatch
from mqstore.cpu_section import CPU_SECTION
from mqstore.rpc import logs
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2_grpc as pb_grpc
from mqstore.rpc.leader_channel import commitlog_channel
from mqstore.rpc.server import READINESS, ServiceHost
from mqstore.rpc.subscriber import Subscriber
from mqstore.storage import data_mode

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ConsumeQueue"].full_name


class CqService:
    """Everything the process runs, wired; `main` drives it, a test may too."""

    def __init__(self, settings: CqSettings) -> None:
        self.settings = settings
        self.engine = CqEngine(settings.engine_config())
        self.watch = QueueWatch(settings.long_polls_max)
        self.tail = TailRecords(settings.tail_records_mib << 20)
        self.local = LocalReads(settings.commitlog_dir) if settings.commitlog_dir else None
        self.sink = EngineSink(self.engine, self.watch, self.tail, self.local)
        # TLS and this replica's token for the subscription and for Reads and probes.
        security = settings.commitlog_security()
        # One channel to the commit log (every replica of a broker group: it follows the
        # leader) for the subscription, Reads and probes.
        self.channel: grpc.Channel = commitlog_channel(settings.commitlog_target, security)
        # Where pulls and receives find records: segment files, tail, Read (record_sources.py).
        self.sources = RecordSources.build(
            self.engine, settings, self.channel, tail=self.tail, local=self.local
        )
        self.subscriber = Subscriber(
            settings.commitlog_target,
            settings.subscriber_id,
            self.sink,
            wants_records=self.sources.tail_wanted,
            on_ready_change=self._ready_changed,
            security=security,
            section=CPU_SECTION,  # a frame's apply takes turns with the pulls (cpu_section.py)
            channel=self.channel,
        )
        self.probe = HeadProbe(self.channel, self.sink, settings.log_probe_interval_ms / 1000)
        self.servicer = CqServicer(
            self.engine,
            settings,
            watch=self.watch,
            sources=self.sources,
            caught_up=lambda: self.subscriber.caught_up,
        )
        self.host = ServiceHost(
            "cq_svc",
            settings,
            register=self._register,
            on_drain=self.drain,
            on_stop=self._on_stop,
            alive=self.alive,
            ports_file=settings.ports_file,
            stream_caps=settings.stream_caps(),
        )
        self._ready_thread: threading.Thread | None = None
        self._stopped = False

    def _register(self, server: grpc.Server) -> list[str]:
        pb_grpc.add_ConsumeQueueServicer_to_server(self.servicer, server)
        return [SERVICE_NAME]

    def alive(self) -> bool:
        return self.subscriber.alive and self.engine.healthy

    def start(self) -> None:
        self.host.start_health()
        report = self.engine.open()
        if self.engine.unclean_start:
            metrics.UNCLEAN_STARTS.inc()
        log.info(
            "consume queues recovered: %d queues, %d units cut, confirmed offset %d",
            report.queues,
            report.units_cut,
            report.confirmed_offset,
        )
        metrics.LONG_POLLS_WAITING.set_function(lambda: self.watch.waiting)
        metrics.DISPATCH_BEHIND.set_function(lambda: self.sink.dispatch_behind_bytes)
        metrics.APPLIED_OFFSET.set_function(lambda: self.engine.store.applied_offset)
        metrics.CONFIRMED_OFFSET.set_function(lambda: self.engine.store.confirmed_offset)
        metrics.TAIL_BYTES.set_function(lambda: self.tail.nbytes)
        metrics.GROUP_LAG.bind(self.engine.group_lags)
        self.host.start()
        self.subscriber.start()
        self.probe.start()
        self._ready_thread = threading.Thread(
            target=self._await_ready, name="cq-ready", daemon=True
        )
        self._ready_thread.start()

    def _ready_changed(self, ready: bool) -> None:
        if not self._stopped:
            self.host.set_serving(READINESS, ready)

    def _await_ready(self) -> None:
        # Wait in slices so that a stop during a long replay ends this thread too.
        while not self._stopped:
            if self.subscriber.wait_caught_up(0.5):
                if not self._stopped:
                    log.info("caught up with the commit log: ready")
                    self.host.set_serving(READINESS, True)
                return

    def drain(self) -> None:
        """The first step of a stop: waiting long polls answer now, new ones do not wait."""
        self.watch.close()

    def stop(self) -> None:
        """Stop without a signal (tests, embedding): the same order as SIGTERM."""
        self.drain()
        self.host.shutdown()

    def _on_stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.probe.stop()

        def flush() -> None:
            # Before the Subscriber's last Confirm, so that it carries everything applied; a
            # flush that fails leaves the abort marker (close below refuses to remove it).
            try:
                self.engine.flush()
            except Exception:
                log.exception("flush at shutdown failed")

        self.subscriber.stop(flush=flush)
        self.channel.close()
        self.engine.close()
        log.info("consume queues closed")


def main(argv: Sequence[str] | None = None) -> int:
    settings = CqSettings.load(list(sys.argv[1:] if argv is None else argv))
    logs.configure(settings.log_level, settings.log_format, service="cq_svc")
    # Before anything is created: every file of the store is born private (data_mode.py).
    data_mode.apply(settings.data_dir, settings.data_mode)
    before, after = raise_open_files_limit()  # before open_maps_max is derived from it
    service = CqService(settings)
    log.info(
        "open files limit %d -> %d; %d consume-queue files mapped at most",
        before,
        after,
        service.engine.config.open_maps_max,
    )
    service.host.install_reload_signal()  # SIGHUP during recovery must not end the process
    service.start()
    service.host.install_signal_handlers()
    service.host.wait()
    return 0
