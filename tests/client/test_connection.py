"""What the Connection puts on the wire: the bearer token on every call, deadlines, typed
errors, and failover between consume-queue replicas. A real gRPC server on loopback stands in
for a service that checks tokens (the services gain theirs with security)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from mqstore.client.connection import Connection
from mqstore.client.errors import DeadlineExceeded, Unauthenticated, Unavailable
from mqstore.client.settings import ClientSettings
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as cq
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2_grpc

TOKEN = "t0ken-for-tests"


class _CheckingCommitLog(commitlog_pb2_grpc.CommitLogServicer):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def GetStatus(self, request: cl.GetStatusRequest, context: grpc.ServicerContext) -> object:
        auth = dict(context.invocation_metadata()).get("authorization", "")
        self.seen.append(str(auth))
        if auth != f"Bearer {TOKEN}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "a valid token is required")
        return cl.GetStatusResponse(flush="sync", max_offset=42)

    def Read(self, request: cl.ReadRequest, context: grpc.ServicerContext) -> cl.ReadResponse:
        time.sleep(1.0)  # slower than the caller's deadline
        return cl.ReadResponse()


class _QueueInfo(consumequeue_pb2_grpc.ConsumeQueueServicer):
    def GetQueueInfo(self, request: cq.GetQueueInfoRequest, context: object) -> cq.QueueInfo:
        return cq.QueueInfo(topic=request.topic, queue_id=request.queue_id, max_offset=7)

    def ListQueues(self, request: cq.ListQueuesRequest, context: grpc.ServicerContext) -> object:
        context.abort(grpc.StatusCode.UNAVAILABLE, "still replaying")


@pytest.fixture
def server() -> Iterator[tuple[str, _CheckingCommitLog]]:
    s = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = _CheckingCommitLog()
    commitlog_pb2_grpc.add_CommitLogServicer_to_server(servicer, s)
    consumequeue_pb2_grpc.add_ConsumeQueueServicer_to_server(_QueueInfo(), s)
    port = s.add_insecure_port("127.0.0.1:0")
    s.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        s.stop(None)


def test_the_token_travels_as_a_bearer_header_and_its_absence_is_unauthenticated(
    server: tuple[str, _CheckingCommitLog], tmp_path
) -> None:  # type: ignore[no-untyped-def]
    target, servicer = server
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with Connection(ClientSettings(commitlog=target, token_file=str(token_file))) as conn:
        status = conn.call(conn.commitlog().GetStatus, cl.GetStatusRequest(), name="GetStatus")
        assert status.max_offset == 42
    with (
        Connection(ClientSettings(commitlog=target)) as conn,
        pytest.raises(Unauthenticated) as info,
    ):
        conn.call(conn.commitlog().GetStatus, cl.GetStatusRequest(), name="CommitLog/GetStatus")
    assert info.value.details == "a valid token is required"
    assert str(info.value).startswith("CommitLog/GetStatus: UNAUTHENTICATED")
    assert servicer.seen == [f"Bearer {TOKEN}", ""]


def test_a_call_to_nothing_is_unavailable_and_a_slow_answer_is_deadline_exceeded(
    server: tuple[str, _CheckingCommitLog],
) -> None:
    with (
        Connection(ClientSettings(commitlog="127.0.0.1:1", timeout_s=2)) as conn,
        pytest.raises(Unavailable),
    ):
        conn.call(conn.commitlog().GetStatus, cl.GetStatusRequest(), name="GetStatus")
    target, _ = server
    with (
        Connection(ClientSettings(commitlog=target, token=TOKEN)) as conn,
        pytest.raises(DeadlineExceeded),
    ):
        conn.call(conn.commitlog().Read, cl.ReadRequest(), name="Read", timeout_s=0.1)


def test_consume_queue_calls_move_to_the_next_replica_when_one_is_unavailable(
    server: tuple[str, _CheckingCommitLog],
) -> None:
    target, _ = server
    settings = ClientSettings(cq=("127.0.0.1:1", target), timeout_s=2)
    with Connection(settings) as conn:
        info = conn.call_cq(
            lambda stub: stub.GetQueueInfo,
            cq.GetQueueInfoRequest(topic="T", queue_id=3),
            name="GetQueueInfo",
        )
        assert info.max_offset == 7
        with pytest.raises(Unavailable):  # no replica answers: the last one's error
            conn.call_cq(
                lambda stub: stub.ListQueues, cq.ListQueuesRequest(topic="T"), name="ListQueues"
            )
