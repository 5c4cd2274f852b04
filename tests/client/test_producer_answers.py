"""What the producer does with answers it cannot use: the SDK reads AppendStream answers with the
compiled core (batch.StoreAnswer), not protobuf, so an answer that does not parse must still end
the request with INTERNAL and nothing resolved as stored. A real gRPC server on loopback stands
in for a commit log that answers wrong bytes (the real one cannot be made to)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest

from mqstore.client import Producer
from mqstore.client.errors import ClientError
from mqstore.client.settings import ClientSettings
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl

_APPEND_STREAM = "AppendStream"


def _server(answer: Callable[[cl.AppendRequest], bytes]) -> tuple[grpc.Server, str]:
    """A CommitLog whose AppendStream answers each request with `answer(request)`'s bytes."""

    def append_stream(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        for raw in requests:
            yield answer(cl.AppendRequest.FromString(raw))

    handler = grpc.method_handlers_generic_handler(
        "mqstore.commitlog.v1.CommitLog",
        {_APPEND_STREAM: grpc.stream_stream_rpc_method_handler(append_stream)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(lambda request: b"\x0a\x05\x01", id="a truncated packed column"),
        pytest.param(lambda request: b"\x3a\x03\x1a\x01\xff", id="a refusal reason not UTF-8"),
        pytest.param(lambda request: b"\x08" + b"\xff" * 11, id="an 11-byte varint"),
    ],
)
def test_an_answer_that_does_not_parse_fails_the_request_with_internal(
    answer: Callable[[cl.AppendRequest], bytes],
) -> None:
    server, target = _server(answer)
    try:
        with Producer(ClientSettings(commitlog=target, timeout_s=5), retry_timeout_s=5) as p:
            future = p.send("orders", b"x", queue_id=0)
            with pytest.raises(ClientError) as caught:
                future.result(timeout=10)
        assert caught.value.code == grpc.StatusCode.INTERNAL
        assert "cannot be read" in str(caught.value)
    finally:
        server.stop(None)


def test_a_well_formed_answer_from_the_same_server_resolves_the_send() -> None:
    """The stand-in itself is sound: an answer protobuf writes resolves the send."""

    def ok(request: cl.AppendRequest) -> bytes:
        return cl.AppendResponse(
            statuses=[cl.PUT_OK],
            commit_log_offsets=[0],
            sizes=[100],
            queue_offsets=[0],
            store_host=b"\x7f\x00\x00\x01\x00\x00\x1b\x58",
            sequence=request.sequence,
        ).SerializeToString()

    server, target = _server(ok)
    try:
        with Producer(ClientSettings(commitlog=target, timeout_s=5), retry_timeout_s=5) as p:
            result = p.send("orders", b"x", queue_id=0).result(timeout=10)
        assert result.queue_offset == 0
    finally:
        server.stop(None)
