"""Structured logs: JSON lines on stdout (console format on a terminal), per-RPC context.

Every log line of the process goes through structlog, and the standard `logging` module (which
the engines use) is routed into it, so one format covers both. `LoggingInterceptor` binds the
method and peer of each call to the context, so every line logged while serving it carries
them. Message bodies are never logged, and neither is call metadata: it carries the bearer
token (admission.py binds the token's *name*, `caller`, instead), and tests/security checks
every service log for every token.

What callers do wrong (bytes that do not parse, a missing or unknown token) is logged through a
`RateLimitedLog`: a flood of such calls costs the log a few lines, not one a call; the count of
every one of them is in the metrics (mqstore_rpc_malformed_requests_total,
grpc_server_handled_total by code).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import grpc
import orjson
import structlog

from mqstore.rpc.errors import WrappingInterceptor, wrap_handler

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}

# Lines a RateLimitedLog writes at once, then one per interval: a burst shows what is going on
# (which method, which peer), and a line a minute while it lasts says it still is (with the
# count held back): at ~350 B a line, 21 KB a flood-hour whatever the rate of bad calls.
BURST_LINES: Final = 3
INTERVAL_S: Final = 60.0


def configure(level: str = "info", fmt: str = "json", *, service: str = "") -> None:
    numeric = _LEVELS.get(level, logging.ERROR if level == "error" else logging.INFO)

    def add_service(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
        # A processor, not a context variable: threads start with an empty context.
        event.setdefault("service", service)
        return event

    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if service:
        shared.append(add_service)
    if fmt == "console" or (fmt == "auto" and sys.stdout.isatty()):
        renderer: Any = structlog.dev.ConsoleRenderer()
    else:
        renderer = structlog.processors.JSONRenderer(
            serializer=lambda o, **_: orjson.dumps(o).decode()
        )
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.dict_tracebacks,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)


class LoggingInterceptor(WrappingInterceptor):
    """Binds `rpc` (the method) and `peer` for the duration of each call."""

    def wrap(
        self, handler: grpc.RpcMethodHandler[Any, Any], method: str
    ) -> grpc.RpcMethodHandler[Any, Any]:

        def unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
            def call(request: Any, context: grpc.ServicerContext) -> Any:
                with structlog.contextvars.bound_contextvars(rpc=method, peer=context.peer()):
                    return behavior(request, context)

            return call

        def stream(behavior: Callable[..., Any]) -> Callable[..., Any]:
            def call(request: Any, context: grpc.ServicerContext) -> Any:
                with structlog.contextvars.bound_contextvars(rpc=method, peer=context.peer()):
                    yield from behavior(request, context)

            return call

        return wrap_handler(handler, unary, stream)


class RateLimitedLog:
    """Warnings at most `burst` at once and then one every `interval_s` (a token bucket); the
    lines held back are counted, and the next line written says how many there were.

    For lines a caller can cause at will: each one written is a few hundred bytes, and a
    caller sending bad calls as fast as it can must not be able to fill the disk with them."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = BURST_LINES,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._burst = float(burst)
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens = float(burst)
        self._at = clock()
        self._held = 0

    def warning(self, message: str, *args: object) -> bool:
        """Log `message % args` unless over the rate; True when it was written."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self._burst, self._tokens + (now - self._at) / self._interval_s)
            self._at = now
            if self._tokens < 1.0:
                self._held += 1
                return False
            self._tokens -= 1.0
            held, self._held = self._held, 0
        if held:
            message += " (and %d more like it since the last such line)"
            args = (*args, held)
        self._logger.warning(message, *args)
        return True
