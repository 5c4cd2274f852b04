"""Prometheus metrics: the gRPC server's own series, and the metrics port.

Names follow Prometheus conventions (base units, `_total` counters, bounded labels): the
`grpc_server_*` family that go-grpc-prometheus made common, and `mqstore_*` series that each
service registers for its own work (append, flush, dispatch lag, ...).
"""

from __future__ import annotations

import socketserver
import threading
import time
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import Any

import grpc
from prometheus_client import Counter, Gauge, Histogram, MetricsHandler

from mqstore.rpc.errors import WrappingInterceptor, wrap_handler

# Buckets in seconds, from 100 us (a cached read) to 10 s (a long poll).
LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                     0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # fmt: skip

HANDLED = Counter(
    "grpc_server_handled_total",
    "RPCs completed on the server, by method and status code.",
    ["grpc_service", "grpc_method", "grpc_code"],
)
HANDLING = Histogram(
    "grpc_server_handling_seconds",
    "Time to complete an RPC on the server (streams: until the stream ends).",
    ["grpc_service", "grpc_method"],
    buckets=LATENCY_BUCKETS_S,
)

MALFORMED_REQUESTS = Counter(
    "mqstore_rpc_malformed_requests_total",
    "Requests whose bytes do not parse as the method's message (answered INVALID_ARGUMENT).",
    ["grpc_service", "grpc_method"],
)
STREAMS_OPEN = Gauge(
    "mqstore_rpc_streams_open",
    "Streaming calls holding one of their method's slots now (streams.py).",
    ["grpc_service", "grpc_method"],
)
STREAMS_REFUSED = Counter(
    "mqstore_rpc_streams_refused_total",
    "Streaming calls refused RESOURCE_EXHAUSTED: every slot of their method was taken.",
    ["grpc_service", "grpc_method"],
)

# How often the HTTP server's loop looks for a stop request: what a stop waits at most.
METRICS_POLL_S = 0.05


class _QuietHandler(MetricsHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # scrapes are not worth a log line each


class _Server(ThreadingHTTPServer):
    """HTTPServer without its reverse-DNS lookup of the bound address (socket.getfqdn): where
    no DNS server answers (a network namespace, a pod whose resolver is down) that lookup
    held every service's start for 10 s. The name is only for CGI variables, unused here."""

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)


class MetricsServer:
    """/metrics over HTTP on its own thread; `port` is the bound one (free when asked for 0)."""

    def __init__(self, host: str, port: int) -> None:
        self._server = _Server((host, port), _QuietHandler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_port)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": METRICS_POLL_S},
            name="metrics-http",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def split_method(method: str) -> tuple[str, str]:
    """("mqstore.consumequeue.v1.ConsumeQueue", "Pull") of "/mqstore...ConsumeQueue/Pull"."""
    service, _, name = method.lstrip("/").partition("/")
    return service, name


def _code_of(context: grpc.ServicerContext, failed: bool) -> str:
    code = getattr(context, "code")()  # noqa: B009 - missing from the stubs
    if code is None:
        return "UNKNOWN" if failed else "OK"
    return str(code.name)


class MetricsInterceptor(WrappingInterceptor):
    def wrap(
        self, handler: grpc.RpcMethodHandler[Any, Any], method: str
    ) -> grpc.RpcMethodHandler[Any, Any]:
        service, name = split_method(method)
        timer = HANDLING.labels(service, name)
        counters: dict[str, Any] = {}  # status code -> HANDLED child (a lookup takes a lock)

        def count(context: grpc.ServicerContext, failed: bool) -> None:
            code = _code_of(context, failed)
            counter = counters.get(code)
            if counter is None:
                counter = counters[code] = HANDLED.labels(service, name, code)
            counter.inc()

        def unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
            def call(request: Any, context: grpc.ServicerContext) -> Any:
                began = time.perf_counter()
                failed = True
                try:
                    result = behavior(request, context)
                    failed = False
                    return result
                finally:
                    timer.observe(time.perf_counter() - began)
                    count(context, failed)

            return call

        def stream(behavior: Callable[..., Any]) -> Callable[..., Any]:
            def call(request: Any, context: grpc.ServicerContext) -> Any:
                began = time.perf_counter()
                failed = True
                try:
                    yield from behavior(request, context)
                    failed = False
                finally:
                    timer.observe(time.perf_counter() - began)
                    count(context, failed)

            return call

        return wrap_handler(handler, unary, stream)
