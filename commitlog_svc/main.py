"""`python -m commitlog_svc`: the commit log as a gRPC service.

Start-up, in order:

    health port       "startup" / "readiness" NOT_SERVING, "liveness" SERVING
    engine.open()     lock, recovery (the abort marker says whether the last exit was clean),
                      checkpoint, abort marker, flush thread; retention thread if enabled
    subscribers       the registry file; the retention floor = the lowest confirmed offset
    API port          ServiceHost.start(): "startup" SERVING, ports file written
    store host        now that the port is known (port 0: the kernel's pick); appends that
                      arrived in between waited for it
    readiness         SERVING while the store is open, writable and not draining (re-checked
                      every READINESS_CHECK_S), and in a broker group while it leads or follows
                      as a member of the in-sync set; liveness = the flush thread alive, no
                      flush failed

SIGTERM / SIGINT: ServiceHost's graceful stop: every health name NOT_SERVING, drain_delay_s
for endpoints to go, then the drain (subscriptions and append streams end; subscribers
reconnect later), no new calls, in-flight calls finish within grace_period_s; then the engine
closes: a final flush and checkpoint, and the abort marker is removed only when that
succeeded. The exit code is 0 after a clean close, 1 when the store was left for recovery.

No gc tuning: measured with appends and a subscriber in one process (300 requests of 1,000
messages), the collector ran twice in the whole run, because neither path builds an object per
message (columns, not records); gc.freeze() and a higher gen-0 threshold changed nothing
measurable, so they are not here (docs/commitlog_svc.md).
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from collections.abc import Sequence

import grpc

from commitlog_svc import metrics
from commitlog_svc.append_request import add_servicer_to_server
from commitlog_svc.commitlog import CommitLog
from commitlog_svc.replica import ReplicaLog
from commitlog_svc.replication.controller import ReplicaController, ReplicationSettings
from commitlog_svc.servicer import CommitLogServicer
from commitlog_svc.settings import CommitLogSettings
from commitlog_svc.subscribers import SubscriberRegistry
from mqstore.errors import CoordinatorUnavailable, MqstoreError
from mqstore.formats.record import pack_host
from mqstore.rpc import logs
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.rpc.server import READINESS, ServiceHost
from mqstore.stop_request import StopRequest
from mqstore.storage import data_mode
from mqstore.storage.clock import Clock
from mqstore.storage.disk import Disk

log = logging.getLogger(__name__)

SERVICE_NAME = "commitlog_svc"
READINESS_CHECK_S = 0.5
# A replica waits this long at start for etcd to answer (etcd starting beside it, as on a first
# install), asking every JOIN_RETRY_S; past it the start fails, naming etcd.
JOIN_WAIT_S = 120.0
JOIN_RETRY_S = 1.0


class CommitLogService:
    """Engine, subscriber registry, servicer and ServiceHost together: what the process runs,
    and what tests run in-process (with a SimDisk or a ManualClock when they need one)."""

    def __init__(
        self,
        settings: CommitLogSettings,
        *,
        disk: Disk | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self._disk = disk
        self._clock = clock
        self.host = ServiceHost(
            SERVICE_NAME,
            settings,
            register=self._register,
            on_drain=self.drain,
            on_stop=self._on_stop,
            alive=self.alive,
            ports_file=settings.ports_file,
            stream_caps=settings.stream_caps(),
        )
        self.engine: CommitLog | None = None
        self.registry: SubscriberRegistry | None = None
        self.servicer: CommitLogServicer | None = None
        self.replication: ReplicaController | None = None
        self._readiness_stop = threading.Event()
        self._readiness: threading.Thread | None = None
        self._health_started = False
        self.clean_exit = False

    # -- start ----------------------------------------------------------------------------------

    def start_health(self) -> None:
        """The health port alone ("startup" NOT_SERVING); `start` calls it if nobody did."""
        if not self._health_started:
            self.host.start_health()
            self._health_started = True

    def start(self) -> None:
        s = self.settings
        self.start_health()
        store_ip, _ = s.store_address(s.port)
        config = s.engine_config(store_ip=store_ip, store_port=s.store_port or s.port)
        engine: CommitLog
        if s.group:
            engine = ReplicaLog(config, disk=self._disk, clock=self._clock)
        else:
            engine = CommitLog(config, disk=self._disk, clock=self._clock)
        report = engine.open(retention=s.retention)
        self.engine = engine
        metrics.RECOVERY_TRUNCATED_BYTES.inc(report.truncated_bytes)
        if report.corrupt:
            metrics.CRC_MISMATCHES.labels("recovery").inc(len(report.corrupt))
        try:
            registry = SubscriberRegistry(engine.disk, s.data_dir, engine.store_id, engine.clock)
            registry.load()
            moved = registry.clamp(engine.max_offset)
            if moved:
                log.warning(
                    "%d subscribers had confirmed past the recovered end %d; lowered to it",
                    moved,
                    engine.max_offset,
                )
            self.registry = registry
            engine.set_floor_offset(self._floor)
            engine.add_flush_observer(metrics.FLUSH_SECONDS.observe)
            self.servicer = CommitLogServicer(engine, registry, s)
            if isinstance(engine, ReplicaLog):
                self.replication = self._join_group(engine)
                self.servicer.attach_replication(self.replication)
            self.host.start()
        except BaseException:
            if self.replication is not None:
                self.replication.stop()
            engine.close()
            raise
        ip, port = s.store_address(self.host.port)
        engine.set_store_host(pack_host(ip, port))
        self.servicer.open_for_appends()
        if self.replication is not None:
            self.replication.start(address=s.advertise or f"{ip}:{self.host.port}")
        self._readiness = threading.Thread(
            target=self._watch_readiness, name="readiness", daemon=True
        )
        self._readiness.start()
        log.info(
            "commit log serving on %s:%d (%s flush), store host %s:%d, offsets [%d, %d)",
            s.host,
            self.host.port,
            s.flush,
            ip,
            port,
            engine.min_offset,
            engine.max_offset,
        )

    def _join_group(self, engine: ReplicaLog) -> ReplicaController:
        """The broker group's coordinator, and agreement on the log's identity with it."""
        # Only a broker group loads etcd's client (requests and etcd3gw: ~0.2 s of imports).
        from mqstore.coordination.etcd import EtcdCoordinator  # noqa: PLC0415

        s = self.settings
        coordinator = EtcdCoordinator(s.etcd, s.group)
        controller = ReplicaController(
            engine,
            coordinator,
            ReplicationSettings(
                group=s.group,
                name=s.replica_name or socket.gethostname(),
                address=s.advertise,
                sync=s.replication == "sync",
                min_insync=s.min_insync,
                lag_max_ms=s.replica_lag_max_ms,
                lease_ttl_s=s.lease_ttl_s,
                allow_unclean=s.allow_unclean_election,
                ack_timeout_ms=s.replication_ack_timeout_ms,
            ),
            security=s.commitlog_security(),  # how this replica reaches the others
        )
        self._join(controller, s.etcd)
        log.info(
            "replica %s of group %s (etcd %s): %s replication, min in-sync %d",
            controller.settings.name,
            s.group,
            s.etcd,
            s.replication,
            s.min_insync,
        )
        return controller

    def _join(self, controller: ReplicaController, etcd: str) -> None:
        """Join, waiting for etcd while it does not answer (it may be starting beside this
        replica, as on a first install): up to JOIN_WAIT_S, then the start fails."""
        deadline = time.monotonic() + JOIN_WAIT_S
        while True:
            try:
                controller.join()
                return
            except CoordinatorUnavailable as err:
                if time.monotonic() >= deadline:
                    raise
                log.warning("etcd at %s does not answer yet (%s); retrying", etcd, err)
                time.sleep(JOIN_RETRY_S)

    def _register(self, server: grpc.Server) -> list[str]:
        assert self.servicer is not None
        add_servicer_to_server(self.servicer, server)
        return [pb.DESCRIPTOR.services_by_name["CommitLog"].full_name]

    def _floor(self) -> int:
        """Retention's floor: the lowest confirmed offset, or no limit without subscribers."""
        assert self.engine is not None and self.registry is not None
        floor = self.registry.floor()
        return self.engine.max_offset if floor is None else floor

    # -- health ---------------------------------------------------------------------------------

    def alive(self) -> bool:
        return self.engine is not None and self.engine.flush_alive

    def ready(self) -> bool:
        engine, servicer = self.engine, self.servicer
        replication = self.replication
        return (
            engine is not None
            and servicer is not None
            and engine.running
            and engine.writable
            and not servicer.draining
            and (replication is None or replication.serving())
        )

    def _watch_readiness(self) -> None:
        while True:
            self.host.set_serving(READINESS, self.ready())
            if self._readiness_stop.wait(READINESS_CHECK_S):
                return

    # -- stop -----------------------------------------------------------------------------------

    def drain(self) -> None:
        """Readiness off, subscriptions and append streams end (their clients reconnect to
        whoever serves next); unary appends in flight still finish. ServiceHost calls it once
        every probe says NOT_SERVING and drain_delay_s has passed."""
        self._readiness_stop.set()
        self.host.set_serving(READINESS, False)
        if self.replication is not None:
            # A leader resigns first (another takes over at once) and its followers' streams
            # end: they never finish on their own, so the server's grace period would wait.
            self.replication.stop()
        if self.servicer is not None:
            self.servicer.drain()

    def stop(self) -> None:
        """Graceful (ServiceHost.shutdown): every probe NOT_SERVING, drain_delay_s, drain,
        stop the server within the grace period, then close the engine (flush, checkpoint,
        abort marker)."""
        self.host.shutdown()

    def _on_stop(self) -> None:
        self._readiness_stop.set()
        if self._readiness is not None:
            self._readiness.join()
        if self.replication is not None:
            self.replication.stop()  # a leader resigns: another takes over at once
        if self.servicer is not None:
            self.servicer.close()
        try:
            if self.registry is not None:
                self.registry.close()
        finally:
            if self.engine is not None:
                self.engine.close()
                self.clean_exit = not self.engine.disk.exists(f"{self.settings.data_dir}/abort")


def main(argv: Sequence[str] | None = None) -> int:
    settings = CommitLogSettings.load(list(argv) if argv is not None else None)
    logs.configure(settings.log_level, settings.log_format, service=SERVICE_NAME)
    # Before anything is created: every file of the store is born private (data_mode.py).
    data_mode.apply(settings.data_dir, settings.data_mode)
    stop = StopRequest()
    stop.install()
    service = CommitLogService(settings)
    service.host.install_reload_signal()
    try:
        service.start()
    except MqstoreError as err:  # expected: the lock is held, the files cannot be loaded, ...
        log.error("commitlog_svc cannot start: %s", err)
        service.host.shutdown()
        return 1
    while not stop.wait(0.5):
        pass
    if stop.signal is not None:
        log.info("signal %s: shutting down", signal.Signals(stop.signal).name)
    service.stop()
    if not service.clean_exit:
        log.error("the commit log did not close cleanly; the next start recovers its tail")
        return 1
    return 0
