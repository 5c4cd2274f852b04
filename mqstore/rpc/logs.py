"""Structured logs: JSON lines on stdout (console format on a terminal), per-RPC context.

Every log line of the process goes through structlog, and the standard `logging` module (which
the engines use) is routed into it, so one format covers both. `LoggingInterceptor` binds the
method and peer of each call to the context, so every line logged while serving it carries
them. Message bodies are never logged, and neither is call metadata: it carries the bearer
token (auth.py binds the token's *name*, `caller`, instead), and tests/security checks every
service log for every token.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import grpc
import orjson
import structlog

from mqstore.rpc.errors import WrappingInterceptor, wrap_handler

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


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
