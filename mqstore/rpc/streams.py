"""Caps on streaming calls: at most `cap` calls of a method at once, RESOURCE_EXHAUSTED past it.

A sync gRPC server runs each call on a thread of its pool (max_workers) and a stream holds that
thread until it ends, also while its reader is slow: gRPC asks a handler for its next answer
only once the previous one is written out, and once the caller's transport holds what it takes
in unread (more than 5 MiB on loopback, measured), HTTP/2 flow control allows that only as
fast as the reader reads. So a stream holds one answer in memory at a time (each service
bounds an answer's bytes) and one thread. Without a cap, slow readers take every thread, calls
wait behind them and every stream holds its answer (docs/cq.md has the figures); with caps that
leave workers free (each service's settings check it), they cannot.

    StreamCapsInterceptor({"/pkg.Service/Follow": StreamCap(8, "follow streams",
                                                            "follow_streams_max", "pull instead")})

A call past its method's cap is refused before its handler runs, at once (it never waits for a
slot: a wait would hold a thread too), counted in mqstore_rpc_streams_refused_total; the calls
holding a slot are mqstore_rpc_streams_open. A slot is given back when the handler's stream
ends, however it ends (answered, cancelled, failed).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from mqstore.errors import ResourceExhausted
from mqstore.rpc.errors import WrappingInterceptor, wrap_handler
from mqstore.rpc.metrics import STREAMS_OPEN, STREAMS_REFUSED, split_method


@dataclass(frozen=True)
class StreamCap:
    """At most `cap` calls at once. The refusal says "`cap` `what` are open, the bound
    (`setting`); `advice`"."""

    cap: int
    what: str
    setting: str
    advice: str = "try again later"


class StreamSlots:
    """The slots of one method: taken without waiting, given back once."""

    def __init__(self, method: str, limit: StreamCap) -> None:
        self.method = method
        self.limit = limit
        self._lock = threading.Lock()
        self._held = 0
        labels = split_method(method)
        self._open = STREAMS_OPEN.labels(*labels)
        self._refused = STREAMS_REFUSED.labels(*labels)

    @property
    def held(self) -> int:
        return self._held

    def take(self) -> None:
        """A slot, or ResourceExhausted when all are held."""
        with self._lock:
            if self._held < self.limit.cap:
                self._held += 1
                self._open.inc()
                return
        self._refused.inc()
        limit = self.limit
        raise ResourceExhausted(
            f"{limit.cap} {limit.what} are open, the bound ({limit.setting}); {limit.advice}"
        )

    def give_back(self) -> None:
        with self._lock:
            self._held -= 1
            self._open.dec()


class StreamCapsInterceptor(WrappingInterceptor):
    """Caps the methods named in `caps` (module docstring); others pass as they are."""

    def __init__(self, caps: Mapping[str, StreamCap]) -> None:
        super().__init__()
        self.slots = {method: StreamSlots(method, cap) for method, cap in caps.items()}

    def wrap(
        self, handler: grpc.RpcMethodHandler[Any, Any], method: str
    ) -> grpc.RpcMethodHandler[Any, Any]:
        slots = self.slots.get(method)
        if slots is None:
            return handler

        def unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
            def call(request: Any, context: grpc.ServicerContext) -> Any:
                slots.take()
                try:
                    return behavior(request, context)
                finally:
                    slots.give_back()

            return call

        def stream(behavior: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
            def call(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                slots.take()
                try:
                    yield from behavior(request, context)
                finally:
                    slots.give_back()

            return call

        return wrap_handler(handler, unary, stream)
