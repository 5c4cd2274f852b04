"""Admission (mqstore/rpc/admission.py) over a real gRPC server: request bytes are parsed inside
the call, so bytes that do not parse are INVALID_ARGUMENT naming the message, on unary calls
and on each request of a stream (the requests before it answered, the call ended after them);
and RateLimitedLog (mqstore/rpc/logs.py) writes a burst, then a line per interval saying how
many it held back."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from mqstore.rpc.admission import AdmissionInterceptor
from mqstore.rpc.errors import ErrorInterceptor, error_from_rpc
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl
from mqstore.rpc.logs import RateLimitedLog

SERVICE = "test.Admitted"
GOOD = cl.ConfirmRequest(subscriber_id="s", confirmed_offset=7).SerializeToString()
BAD = b"\xff\xff\xff\xff\x01"


def _echo(request: cl.ConfirmRequest, context: grpc.ServicerContext) -> cl.ConfirmResponse:
    return cl.ConfirmResponse(retention_floor=request.confirmed_offset)


def _each(
    requests: Iterator[cl.ConfirmRequest], context: grpc.ServicerContext
) -> Iterator[cl.ConfirmResponse]:
    for request in requests:
        yield cl.ConfirmResponse(retention_floor=request.confirmed_offset)


@pytest.fixture(scope="module")
def channel() -> Iterator[grpc.Channel]:
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        interceptors=[ErrorInterceptor(), AdmissionInterceptor()],
    )
    typed = {
        "request_deserializer": cl.ConfirmRequest.FromString,
        "response_serializer": cl.ConfirmResponse.SerializeToString,
    }
    handlers = {
        "Echo": grpc.unary_unary_rpc_method_handler(_echo, **typed),
        "Each": grpc.stream_stream_rpc_method_handler(_each, **typed),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        yield ch
    server.stop(0).wait()


def test_a_unary_request_that_does_not_parse_is_invalid_argument_naming_its_message(
    channel: grpc.Channel,
) -> None:
    call = channel.unary_unary(f"/{SERVICE}/Echo")
    assert cl.ConfirmResponse.FromString(call(GOOD, timeout=5)).retention_floor == 7
    with pytest.raises(grpc.RpcError) as err:
        call(BAD, timeout=5)
    code, message, field = error_from_rpc(err.value)
    assert (code, field) == (grpc.StatusCode.INVALID_ARGUMENT, "request")
    assert "mqstore.commitlog.v1.ConfirmRequest" in message


def test_a_stream_answers_the_requests_before_one_that_does_not_parse_then_ends(
    channel: grpc.Channel,
) -> None:
    call = channel.stream_stream(f"/{SERVICE}/Each")
    answers = []
    with pytest.raises(grpc.RpcError) as err:
        for answer in call(iter([GOOD, GOOD, BAD, GOOD]), timeout=5):
            answers.append(cl.ConfirmResponse.FromString(answer).retention_floor)
    assert answers == [7, 7]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_rate_limited_log_writes_a_burst_then_one_line_an_interval_with_what_it_held(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = _Clock()
    limited = RateLimitedLog(
        logging.getLogger("test.limited"), burst=3, interval_s=10.0, clock=clock
    )
    with caplog.at_level(logging.WARNING, logger="test.limited"):
        written = [limited.warning("bad call %d", i) for i in range(100)]
        assert written == [True] * 3 + [False] * 97
        clock.now += 9.9
        assert not limited.warning("bad call %d", 100)
        clock.now += 0.1
        assert limited.warning("bad call %d", 101)
        assert not limited.warning("bad call %d", 102)
        clock.now += 1_000.0  # quiet for long: a burst again, never more than `burst`
        assert [limited.warning("quiet %d", i) for i in range(4)] == [True] * 3 + [False]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "bad call 0",
        "bad call 1",
        "bad call 2",
        "bad call 101 (and 98 more like it since the last such line)",
        "quiet 0 (and 1 more like it since the last such line)",
        "quiet 1",
        "quiet 2",
    ]
