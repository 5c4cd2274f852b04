"""What a call passes before its handler runs: who calls, the request's bytes, what it may do.

    a call      -> the caller (a Gate: auth.py's bearer tokens; without one, anyone)
                     no or a bad token                     UNAUTHENTICATED, before any parsing
                -> the request's bytes parsed as the method's message, here
                     bytes that do not parse               INVALID_ARGUMENT (MalformedRequest,
                                                           field "request"), counted, logged a
                                                           few times at most
                -> the caller's scopes checked against the request
                     not covered                           PERMISSION_DENIED
                -> the handler, with `caller` bound to its log lines

    a stream of requests: each request parsed and checked as it arrives; the first that fails
    ends the stream for the handler (it never sees it nor anything after it), and once the
    handler has answered the requests before it the call ends with that request's status.

    a response: serialized by the method's serializer, unless the handler made it bytes
    already (its wire bytes).

    a stream of responses: the caller checked again before each (Caller.revalidate: after a
    reload of the tokens file, a removed token or narrowed scopes end the stream with
    UNAUTHENTICATED / PERMISSION_DENIED; otherwise one attribute compared).

Why the bytes are parsed here and not by grpcio: every handler is handed to grpcio with no
request deserializer (grpcio passes the bytes through as they came). When grpcio's own
deserializer fails (grpc/_server.py, `_receive_message`), it logs the exception with its
traceback (an ERROR of ~500 B a call), answers INTERNAL, and then `_unary_request`, finding no
request once the client half-closes, aborts the call a second time: a second
SendStatusFromServer batch on a call whose status was sent, which never completes, so the call
and its batch tag are never freed. Measured on grpcio 1.85.1 (a bare server, 3,000 calls of
`ff ff ff ff 01`): +56 MiB of anonymous memory, ~19 KB a call, for good; none once the
bytes are parsed in the handler. It happened before authentication too (a deserializer runs
before any handler or interceptor does), so a caller without a token could grow the process
without bound and was answered INTERNAL, not UNAUTHENTICATED.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import grpc
import structlog

from mqstore.errors import MalformedRequest, MqstoreError
from mqstore.rpc.errors import WrappingInterceptor
from mqstore.rpc.logs import RateLimitedLog
from mqstore.rpc.metrics import MALFORMED_REQUESTS, split_method

log = logging.getLogger(__name__)
# Bad bytes can come as fast as a caller sends them: a few lines, then one a minute.
_MALFORMED_LOG = RateLimitedLog(log)

Metadata = tuple[tuple[str, str | bytes], ...] | None
# The BadRequest field of a MalformedRequest: no field of it could be read, the request is bad.
REQUEST = "request"


class Caller(Protocol):
    """Who a Gate let in: `name` for the logs ("" for anyone) and what it may do."""

    @property
    def name(self) -> str: ...

    def check(self, request: Any) -> None:
        """Raises PermissionDenied unless the caller may make this request."""

    def revalidate(self) -> None:
        """Between a stream's responses: raises if the caller may no longer make its call
        (its token removed or its scopes narrowed by a reload of the tokens file)."""


class Gate(Protocol):
    def door(self, method: str) -> Callable[[Metadata], Caller]:
        """For `method`, what admits a call by its metadata (raises Unauthenticated)."""


class _Anyone:
    name = ""

    def check(self, request: Any) -> None:
        pass

    def revalidate(self) -> None:
        pass


ANYONE: Caller = _Anyone()


def _anyone(_: Metadata) -> Caller:
    return ANYONE


class Decoder:
    """One method's request bytes -> its message; MalformedRequest when they do not parse."""

    def __init__(self, method: str, deserializer: Callable[[bytes], Any]) -> None:
        self.method = method
        self._parse = deserializer
        message = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
        self.message = getattr(message, "full_name", "the method's request message")
        self._malformed = MALFORMED_REQUESTS.labels(*split_method(method))

    def __call__(self, raw: bytes) -> Any:
        try:
            return self._parse(raw)
        except Exception as err:  # whatever the parser raises, the bytes are the caller's
            reason = type(err).__name__
        self._malformed.inc()
        _MALFORMED_LOG.warning(
            "%s: %d request bytes do not parse as %s (%s)",
            self.method,
            len(raw),
            self.message,
            reason,
        )
        raise MalformedRequest(f"the request bytes do not parse as {self.message}", field=REQUEST)


class _Stop:
    """The request that ended a stream of requests early, raised once the handler is done."""

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: MqstoreError | None = None

    def raise_if_any(self) -> None:
        if self.error is not None:
            raise self.error


def _admitted(
    raw_requests: Iterator[bytes],
    decode: Callable[[bytes], Any],
    caller: Caller,
    stop: _Stop,
) -> Iterator[Any]:
    """The requests of a stream, each parsed and checked as it arrives (module docstring)."""
    for raw in raw_requests:
        try:
            request = decode(raw)
            caller.check(request)
        except MqstoreError as err:
            stop.error = err
            return
        yield request


def _revalidated(responses: Iterator[Any], caller: Caller) -> Iterator[Any]:
    """A stream's responses, the caller checked again before each (a reload of the tokens
    file may have removed its token); a refusal ends the handler's generator too."""
    try:
        for response in responses:
            caller.revalidate()
            yield response
    finally:
        close = getattr(responses, "close", None)
        if close is not None:
            close()


_UNBOUND: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()  # reusable


def _bound(caller: Caller) -> contextlib.AbstractContextManager[Any]:
    """`caller=<name>` on the log lines of the call; nothing for anyone."""
    if not caller.name:
        return _UNBOUND
    return structlog.contextvars.bound_contextvars(caller=caller.name)


def _bytes_as_they_are(
    serialize: Callable[[Any], bytes] | None,
) -> Callable[[Any], bytes] | None:
    """The method's response serializer, passing a response that is bytes already (a frame
    whose wire bytes a handler wrote itself: commitlog_svc's dispatch frames and append
    answers) through."""
    if serialize is None:
        return None

    def serialized(response: Any) -> bytes:
        return response if type(response) is bytes else serialize(response)

    return serialized


def admit_handler(
    handler: grpc.RpcMethodHandler[Any, Any],
    method: str,
    door: Callable[[Metadata], Caller] = _anyone,
) -> grpc.RpcMethodHandler[Any, Any]:
    """`handler` taking its request as bytes, admitted as the module docstring says."""
    deserializer = handler.request_deserializer
    if deserializer is None:
        return handler  # takes bytes already: nothing to parse (tests' echo handlers)
    decode = Decoder(method, deserializer)
    serializer = {
        "request_deserializer": None,
        "response_serializer": _bytes_as_they_are(handler.response_serializer),
    }

    if handler.unary_unary is not None:
        unary_unary = handler.unary_unary

        def unary_unary_call(raw: bytes, context: grpc.ServicerContext) -> Any:
            caller = door(context.invocation_metadata())
            request = decode(raw)
            caller.check(request)
            with _bound(caller):
                return unary_unary(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary_call, **serializer)

    if handler.unary_stream is not None:
        unary_stream = handler.unary_stream

        def unary_stream_call(raw: bytes, context: grpc.ServicerContext) -> Iterator[Any]:
            caller = door(context.invocation_metadata())
            request = decode(raw)
            caller.check(request)
            with _bound(caller):
                yield from _revalidated(unary_stream(request, context), caller)

        return grpc.unary_stream_rpc_method_handler(unary_stream_call, **serializer)

    if handler.stream_unary is not None:
        stream_unary = handler.stream_unary

        def stream_unary_call(raws: Iterator[bytes], context: grpc.ServicerContext) -> Any:
            caller = door(context.invocation_metadata())
            stop = _Stop()
            with _bound(caller):
                response = stream_unary(_admitted(raws, decode, caller, stop), context)
            stop.raise_if_any()
            return response

        return grpc.stream_unary_rpc_method_handler(stream_unary_call, **serializer)

    stream_stream = handler.stream_stream
    assert stream_stream is not None

    def stream_stream_call(raws: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[Any]:
        caller = door(context.invocation_metadata())
        stop = _Stop()
        with _bound(caller):
            responses = stream_stream(_admitted(raws, decode, caller, stop), context)
            yield from _revalidated(responses, caller)
        stop.raise_if_any()

    return grpc.stream_stream_rpc_method_handler(stream_stream_call, **serializer)


class AdmissionInterceptor(WrappingInterceptor):
    """The innermost interceptor of every mqstore server (the health server's only one): the
    requests reach it as bytes, and it admits them (module docstring) with `gate`'s callers,
    or anyone's without a gate."""

    def __init__(self, gate: Gate | None = None) -> None:
        super().__init__()
        self.gate = gate

    def wrap(
        self, handler: grpc.RpcMethodHandler[Any, Any], method: str
    ) -> grpc.RpcMethodHandler[Any, Any]:
        door = self.gate.door(method) if self.gate is not None else _anyone
        return admit_handler(handler, method, door)
