"""What every mqstore service process runs around its servicer.

    ServiceHost(name, settings, register=..., on_stop=...)
      main port     the API (thread pool server), reflection v1 and v1alpha (reflection.py),
                    grpc.health.v1 Check, interceptors: logs, metrics,
                    errors -> status codes, admission (the caller's token with a tokens file,
                    then the request's bytes parsed, then the scopes: admission.py), caps on
                    streaming calls (`stream_caps`, streams.py); TLS when
                    settings give a certificate and key, mutual TLS when they also give a CA
                    for client certificates (server_credentials below)
      health port   its own plaintext server: grpc.health.v1 (Check and Watch), and nothing else
                    (no API, no reflection, no token); separate so that an overloaded API never
                    fails a probe and probes need no TLS material; its requests' bytes are
                    parsed by admission.py too, errors mapped as on the main port
      metrics port  Prometheus /metrics
      SIGHUP        read the tokens file again now (it is also read again within
                    TOKENS_RELOAD_CHECK_S of a change; a file that does not read changes
                    nothing: auth.py, TokensFile)
      SIGTERM/INT   readiness NOT_SERVING (health.enter_graceful_shutdown), wait drain_delay_s,
                    on_drain() (waiting calls answer now), stop accepting and finish calls
                    within grace_period_s, then on_stop() (flush, checkpoint, abort marker)

Health: "startup" turns SERVING when the service says it started (recovery done), "readiness"
when it says it is ready (replay caught up) and until shutdown begins, "liveness" while the
service's `alive()` check (its work loop) holds, tested every LIVENESS_CHECK_S; "" and the full
name of each API service (mqstore.commitlog.v1.CommitLog, ...) from the API port's start until
shutdown begins. One HealthServicer answers on both ports, so they always agree.

Health on the API port is Check only, open to every caller who gets through the port's
transport (TLS, and a client certificate under mutual TLS), with no token (auth.py): so that
grpc_health_probe and load balancers can check the port the traffic goes to. Watch is not
served there (UNIMPLEMENTED, which the health protocol lets clients read as "health checking
off"): each Watch holds a server thread for as long as it stays open, and an open method must
not be able to take the threads the API's calls need. Watch stays on the health port.

With port 0 the kernel picks a port; the bound ports are logged and, with `ports_file`, written
as JSON so that a launcher or a test can find them.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from types import FrameType
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from mqstore.rpc.admission import AdmissionInterceptor
from mqstore.rpc.allocator import keep_large_blocks
from mqstore.rpc.auth import TokenGate, TokensFile, TokenTable
from mqstore.rpc.channel import http2_options
from mqstore.rpc.collector import measure_pauses
from mqstore.rpc.errors import ErrorInterceptor
from mqstore.rpc.logs import LoggingInterceptor
from mqstore.rpc.metrics import MetricsInterceptor, MetricsServer
from mqstore.rpc.reflection import enable_reflection
from mqstore.rpc.settings import ServiceSettings
from mqstore.rpc.streams import StreamCap, StreamCapsInterceptor
from mqstore.stop_request import StopRequest

log = logging.getLogger(__name__)

STARTUP = "startup"
READINESS = "readiness"
LIVENESS = "liveness"
LIVENESS_CHECK_S = 1.0
# Keepalive: clients with long-lived subscriptions and long polls ping every 30 s; the server
# accepts pings that often even without calls in flight, instead of answering "too_many_pings".
KEEPALIVE_MIN_PING_MS = 10_000


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def server_options(max_message_bytes: int) -> list[tuple[str, Any]]:
    return [
        *http2_options(),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_MIN_PING_MS),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def server_credentials(settings: ServiceSettings) -> grpc.ServerCredentials | None:
    """TLS credentials from the settings' files (read now), or None for plaintext."""
    if not settings.tls_cert_file:
        return None
    with open(settings.tls_key_file, "rb") as f:
        key = f.read()
    with open(settings.tls_cert_file, "rb") as f:
        chain = f.read()
    client_ca = None
    if settings.tls_client_ca_file:
        with open(settings.tls_client_ca_file, "rb") as f:
            client_ca = f.read()
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def describe_security(settings: ServiceSettings, tokens: TokenTable | None) -> str:
    """One line for the start-up log: what protects the API (file names, never contents)."""
    if settings.tls_client_ca_file:
        transport = "mutual TLS (client certificates required)"
    elif settings.tls_cert_file:
        transport = "TLS"
    else:
        transport = "plaintext"
    auth = (
        f"{len(tokens.grants)} tokens from {settings.tokens_file}"
        if tokens is not None
        else "no tokens (every caller is trusted)"
    )
    return f"{transport}, {auth}"


def add_health_check(servicer: health.HealthServicer, server: grpc.Server) -> None:
    """grpc.health.v1.Health/Check of `servicer` on `server`, and not Watch (module docstring)."""
    check = grpc.unary_unary_rpc_method_handler(
        servicer.Check,
        request_deserializer=health_pb2.HealthCheckRequest.FromString,
        response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(health.SERVICE_NAME, {"Check": check}),)
    )


class ServiceHost:
    def __init__(
        self,
        name: str,
        settings: ServiceSettings,
        *,
        register: Callable[[grpc.Server], Sequence[str]],
        on_drain: Callable[[], None] = lambda: None,
        on_stop: Callable[[], None] = lambda: None,
        alive: Callable[[], bool] = lambda: True,
        ports_file: str = "",
        stream_caps: Mapping[str, StreamCap] | None = None,
    ) -> None:
        self.name = name
        self.stream_caps = StreamCapsInterceptor(stream_caps or {})
        self.settings = settings
        if settings.keep_large_blocks:
            keep_large_blocks()  # megabyte messages reuse heap memory (allocator.py)
        measure_pauses()  # mqstore_gc_pause_seconds (collector.py)
        self._register = register
        self._on_drain = on_drain
        self._on_stop = on_stop
        self._alive = alive
        self._ports_file = ports_file
        self.health = health.HealthServicer()
        self._server: grpc.Server | None = None
        self._health_server: grpc.Server | None = None
        self._metrics: MetricsServer | None = None
        self.api_services: tuple[str, ...] = ()
        self.port = 0
        self.health_port = 0
        self.metrics_port = 0
        self._stopping = StopRequest()
        self._stopped = threading.Event()
        self._watchdog: threading.Thread | None = None
        # Secrets and certificates are read now, so that a bad file stops the process before
        # recovery work, not after it.
        self._tokens_file = TokensFile(settings.tokens_file) if settings.tokens_file else None
        self._tokens = self._tokens_file.table if self._tokens_file is not None else None
        self._credentials = server_credentials(settings)

    # -- start ----------------------------------------------------------------------------------

    def start_health(self) -> None:
        """The health port first: probes can see "startup" NOT_SERVING during recovery."""
        s = self.settings
        for service in ("", STARTUP, READINESS):
            self.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.health.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        self._health_server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"{self.name}-health"),
            interceptors=[ErrorInterceptor(), AdmissionInterceptor()],
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._health_server)
        self.health_port = self._health_server.add_insecure_port(f"{s.host}:{s.health_port}")
        self._health_server.start()
        self._metrics = MetricsServer(s.host, s.metrics_port)
        self.metrics_port = self._metrics.port

    def start(self) -> None:
        """The API port; call once the service can answer (recovery done)."""
        s = self.settings
        if self._health_server is None:
            self.start_health()
        # Outermost first: admission runs inside the error interceptor, which turns its typed
        # refusals into UNAUTHENTICATED / INVALID_ARGUMENT / PERMISSION_DENIED like every other
        # error; every handler takes its request as bytes from it. The stream caps come last:
        # only an admitted call may take a slot.
        gate = None
        if self._tokens_file is not None:
            gate = TokenGate(self._tokens_file.table)
            self._tokens_file.on_reload(gate.replace)
            self._tokens_file.watch(self._stopping)
        interceptors: list[grpc.ServerInterceptor] = [
            LoggingInterceptor(),
            MetricsInterceptor(),
            ErrorInterceptor(),
            AdmissionInterceptor(gate),
            self.stream_caps,
        ]
        server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=s.max_workers, thread_name_prefix=f"{self.name}-rpc"
            ),
            interceptors=interceptors,
            options=server_options(s.max_message_bytes),
            # Past this many calls in flight, new ones get RESOURCE_EXHAUSTED at once rather
            # than queueing without bound behind long polls and streams.
            maximum_concurrent_rpcs=s.max_workers * 4,
        )
        self.api_services = tuple(self._register(server))
        for service in self.api_services:  # known (not NOT_FOUND) from the port's first call
            self.set_serving(service, False)
        add_health_check(self.health, server)
        enable_reflection(server, [*self.api_services, health.SERVICE_NAME])
        address = f"{s.host}:{s.port}"
        if self._credentials is None:
            self.port = server.add_insecure_port(address)
        else:
            self.port = server.add_secure_port(address, self._credentials)
        log.info("API security: %s", describe_security(s, self._tokens))
        if self._tokens is not None and self._credentials is None and not _loopback(s.host):
            log.warning("tokens over plaintext on %s: anyone on the path can read them", s.host)
        server.start()
        self._server = server
        self.set_serving(STARTUP, True)
        for service in ("", *self.api_services):
            self.set_serving(service, True)
        self._watchdog = threading.Thread(target=self._watch, name="liveness", daemon=True)
        self._watchdog.start()
        self._announce()

    def _announce(self) -> None:
        ports = {
            "service": self.name,
            "host": self.settings.host,
            "port": self.port,
            "health_port": self.health_port,
            "metrics_port": self.metrics_port,
            "pid": os.getpid(),
        }
        log.info("listening %s", json.dumps(ports))
        if self._ports_file:
            tmp = self._ports_file + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(ports, f)
            os.replace(tmp, self._ports_file)

    def set_serving(self, service: str, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        self.health.set(service, status)

    def _watch(self) -> None:
        while not self._stopping.wait(LIVENESS_CHECK_S):
            try:
                alive = self._alive()
            except Exception:
                log.exception("liveness check failed")
                alive = False
            self.set_serving(LIVENESS, alive)

    # -- stop -----------------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the service (`wait`), SIGHUP reloads the tokens."""
        self._stopping.install()
        self.install_reload_signal()

    def install_reload_signal(self) -> None:
        """SIGHUP: read the tokens file again (in its watcher thread), as nginx and Prometheus
        reload their configuration; without a tokens file it is logged and ignored."""

        def reload(signum: int, _: FrameType | None) -> None:
            if self._tokens_file is None:
                log.info("signal SIGHUP: no tokens file to read again")
                return
            self._tokens_file.request_reload()

        signal.signal(signal.SIGHUP, reload)

    def request_stop(self) -> None:
        self._stopping.set()

    def wait(self) -> None:
        """Block until a stop is requested, then shut down in order."""
        while not self._stopping.wait(0.5):
            pass
        if self._stopping.signal is not None:
            log.info("signal %s: shutting down", signal.Signals(self._stopping.signal).name)
        self.shutdown()

    def shutdown(self) -> None:
        if self._stopped.is_set():
            return
        self._stopping.set()
        s = self.settings
        # Probes first: every service name NOT_SERVING, and it stays so.
        self.health.enter_graceful_shutdown()
        if s.drain_delay_s:
            self._stopped.wait(s.drain_delay_s)
        try:
            # Calls that would wait (long polls, streams) are told to answer now, so the
            # grace period is spent on work, not on waiting.
            self._on_drain()
        except Exception:
            log.exception("drain failed")
        if self._server is not None:
            self._server.stop(s.grace_period_s).wait()
        try:
            self._on_stop()
        finally:
            if self._health_server is not None:
                self._health_server.stop(0).wait()
            if self._metrics is not None:
                self._metrics.stop()
            self._stopped.set()
            log.info("stopped")
