"""Typed errors become their status codes over a real gRPC server; bugs become INTERNAL."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from mqstore.errors import (
    CoordinatorUnavailable,
    CorruptCoordinatorValue,
    CorruptRecord,
    DiskFull,
    FailedPrecondition,
    InSyncSetConflict,
    InvalidArgument,
    LeadershipLost,
    NotEligible,
    NotFound,
    OutOfRange,
    Unavailable,
)
from mqstore.rpc.errors import ErrorInterceptor, error_from_rpc
from mqstore.rpc.logs import LoggingInterceptor
from mqstore.rpc.metrics import HANDLED, MetricsInterceptor

ERRORS: dict[bytes, Exception] = {
    b"bad": InvalidArgument("offset must not be negative", field="offset"),
    b"range": OutOfRange("offset 9 is beyond the end 3"),
    b"missing": NotFound("no such message"),
    b"shard": FailedPrecondition("key belongs to shard 2"),
    b"full": DiskFull("no space"),
    b"down": Unavailable("recovering"),
    b"crc": CorruptRecord(4096, "body CRC mismatch"),
    b"etcd": CoordinatorUnavailable("renew", "connection refused"),
    b"deposed": LeadershipLost("lease 1f of epoch 3 expired"),
    b"unclean": NotEligible("c is not in the in-sync set"),
    b"isr": InSyncSetConflict("in-sync set changed"),
    b"etcd-value": CorruptCoordinatorValue("/mqstore/g/leader", "not JSON"),
    b"bug": ValueError("a bug's private details"),
}


def _unary(request: bytes, context: grpc.ServicerContext) -> bytes:
    if request in ERRORS:
        raise ERRORS[request]
    if request == b"abort":
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "chosen by the handler")
    return request


def _stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
    yield b"first"
    if request in ERRORS:
        raise ERRORS[request]
    yield b"second"


@pytest.fixture(scope="module")
def channel() -> Iterator[grpc.Channel]:
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        interceptors=[LoggingInterceptor(), MetricsInterceptor(), ErrorInterceptor()],
    )
    identity = {"request_deserializer": None, "response_serializer": None}
    handlers = {
        "Call": grpc.unary_unary_rpc_method_handler(_unary, **identity),
        "Stream": grpc.unary_stream_rpc_method_handler(_stream, **identity),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        yield ch
    server.stop(0).wait()


@pytest.mark.parametrize(
    ("request_bytes", "code", "field"),
    [
        (b"bad", grpc.StatusCode.INVALID_ARGUMENT, "offset"),
        (b"range", grpc.StatusCode.OUT_OF_RANGE, ""),
        (b"missing", grpc.StatusCode.NOT_FOUND, ""),
        (b"shard", grpc.StatusCode.FAILED_PRECONDITION, ""),
        (b"full", grpc.StatusCode.RESOURCE_EXHAUSTED, ""),
        (b"down", grpc.StatusCode.UNAVAILABLE, ""),
        (b"crc", grpc.StatusCode.DATA_LOSS, ""),
        (b"etcd", grpc.StatusCode.UNAVAILABLE, ""),
        (b"deposed", grpc.StatusCode.UNAVAILABLE, ""),
        (b"unclean", grpc.StatusCode.FAILED_PRECONDITION, ""),
        (b"isr", grpc.StatusCode.ABORTED, ""),
        (b"etcd-value", grpc.StatusCode.DATA_LOSS, ""),
    ],
)
def test_a_typed_error_becomes_its_status_with_the_field(
    channel: grpc.Channel, request_bytes: bytes, code: grpc.StatusCode, field: str
) -> None:
    call = channel.unary_unary("/test.Echo/Call")
    with pytest.raises(grpc.RpcError) as raised:
        call(request_bytes, timeout=5)
    got_code, message, got_field = error_from_rpc(raised.value)
    assert got_code == code
    assert got_field == field
    assert message == str(ERRORS[request_bytes])


def test_a_bug_is_internal_and_does_not_leak_its_message(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        channel.unary_unary("/test.Echo/Call")(b"bug", timeout=5)
    code, message, _ = error_from_rpc(raised.value)
    assert code == grpc.StatusCode.INTERNAL
    assert "private" not in message


def test_a_handler_that_aborts_keeps_its_own_status(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        channel.unary_unary("/test.Echo/Call")(b"abort", timeout=5)
    assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]


def test_a_stream_ends_with_the_errors_status_after_what_it_sent(channel: grpc.Channel) -> None:
    stream = channel.unary_stream("/test.Echo/Stream")(b"range", timeout=5)
    got = []
    with pytest.raises(grpc.RpcError) as raised:
        got.extend(stream)
    assert got == [b"first"]
    assert raised.value.code() == grpc.StatusCode.OUT_OF_RANGE  # type: ignore[attr-defined]


def test_the_metrics_count_each_call_by_its_code(channel: grpc.Channel) -> None:
    ok = HANDLED.labels("test.Echo", "Call", "OK")
    missing = HANDLED.labels("test.Echo", "Call", "NOT_FOUND")
    before_ok, before_missing = ok._value.get(), missing._value.get()
    channel.unary_unary("/test.Echo/Call")(b"hello", timeout=5)
    with pytest.raises(grpc.RpcError):
        channel.unary_unary("/test.Echo/Call")(b"missing", timeout=5)
    assert ok._value.get() == before_ok + 1
    assert missing._value.get() == before_missing + 1
