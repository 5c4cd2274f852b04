"""Issue 23, item 4, for the commit log: at most append_streams_max AppendStream calls run at
once (each holds a server thread and a reader thread for as long as it is open); one more is
refused RESOURCE_EXHAUSTED at once, unary Appends are answered meanwhile, and a slot comes back
when a stream ends. The SDK's Producer, refused, retries and stores its messages once a slot
is free. The real service in this process (support.Running)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest

from commitlog_svc.settings import CommitLogSettings
from mqstore.client import ClientSettings, Producer
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from tests.answers import records_of
from tests.commitlog_svc.support import RPC_TIMEOUT_S, WAIT_S, Running, batch

STREAMS_MAX = 2


class HeldStream:
    """An AppendStream kept open: requests go in when put, answers are read as they come."""

    def __init__(self, svc: Running) -> None:
        self.requests: queue.SimpleQueue[pb.AppendRequest | None] = queue.SimpleQueue()
        self.call = svc.stub.AppendStream(self._requests(), timeout=60)

    def _requests(self) -> Iterator[pb.AppendRequest]:
        while (request := self.requests.get()) is not None:
            yield request

    def append(self, first: int) -> pb.AppendResponse:
        self.requests.put(pb.AppendRequest(batches=[batch(first, 1)]))
        answer: pb.AppendResponse = next(self.call)
        return answer

    def end(self) -> None:
        self.requests.put(None)
        assert list(self.call) == []


def refused(call: Callable[[], object]) -> grpc.StatusCode | None:
    try:
        call()
    except grpc.RpcError as err:
        code: grpc.StatusCode = err.code()
        return code
    return None


def test_append_streams_past_the_cap_are_refused_at_once_and_appends_go_on(
    start: Callable[..., Running],
) -> None:
    svc = start(append_streams_max=STREAMS_MAX)
    held = [HeldStream(svc) for _ in range(STREAMS_MAX)]
    for i, stream in enumerate(held):
        assert list(stream.append(i).statuses) == [pb.PUT_OK]
    extra = HeldStream(svc)
    began = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        extra.append(99)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "append_streams_max" in (err.value.details() or "")
    assert time.monotonic() - began < RPC_TIMEOUT_S / 4  # refused, not queued
    svc.append_ok(batch(10, 3))  # unary appends are answered meanwhile
    held[0].end()
    deadline = time.monotonic() + WAIT_S
    while True:  # the slot comes back once the ended stream's handler returns
        again = HeldStream(svc)
        try:
            assert list(again.append(20).statuses) == [pb.PUT_OK]
            break
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert time.monotonic() < deadline, "a slot never came back"
            time.sleep(0.05)
    again.end()
    held[1].end()


def test_the_default_cap_is_a_quarter_of_the_workers_and_leaves_unary_calls_workers() -> None:
    assert CommitLogSettings.load([], max_workers=64).append_streams_cap == 16
    assert CommitLogSettings.load([], max_workers=4).append_streams_cap == 1
    with pytest.raises(ValueError, match="append_streams_max"):
        CommitLogSettings.load([], max_workers=64, append_streams_max=60)


def test_a_producer_refused_a_stream_retries_and_stores_once_a_slot_is_free(
    start: Callable[..., Running],
) -> None:
    svc = start(append_streams_max=1)
    holder = HeldStream(svc)
    assert list(holder.append(0).statuses) == [pb.PUT_OK]
    settings = ClientSettings(commitlog=svc.target)
    with Producer(settings) as producer:
        sent = producer.send("capped", b"waits for a slot")
        time.sleep(1.0)  # refused, retried with backoff: still waiting
        assert not sent.done()
        threading.Timer(0.2, holder.end).start()
        result = sent.result(timeout=WAIT_S)
    read = svc.stub.Read(pb.ReadRequest(offsets=[result.commit_log_offset], sizes=[result.size]))
    assert list(read.statuses) == [pb.READ_OK] and b"waits for a slot" in records_of(read)[0]


def test_subscriptions_past_the_cap_are_refused_and_leave_no_subscriber_behind(
    start: Callable[..., Running],
) -> None:
    """Subscribe holds a server thread a stream too: past subscribe_streams_max it is refused
    at once, registers nobody (nothing more holds retention back), and a slot comes back when
    a stream ends."""
    svc = start(subscribe_streams_max=STREAMS_MAX)
    svc.append_ok(batch(0, 3))
    held = [svc.stub.Subscribe(pb.SubscribeRequest(subscriber_id=f"s{i}")) for i in range(2)]
    for stream in held:
        assert next(stream).WhichOneof("frame") == "handshake"
    extra = svc.stub.Subscribe(pb.SubscribeRequest(subscriber_id="one-too-many"), timeout=10)
    with pytest.raises(grpc.RpcError) as err:
        next(extra)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "subscribe_streams_max" in (err.value.details() or "")
    assert svc.subscriber("one-too-many") is None
    held[0].cancel()
    deadline = time.monotonic() + WAIT_S
    while True:  # the slot comes back once the cancelled stream's handler returns
        again = svc.stub.Subscribe(pb.SubscribeRequest(subscriber_id="later"), timeout=10)
        try:
            assert next(again).WhichOneof("frame") == "handshake"
            break
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert time.monotonic() < deadline, "a slot never came back"
            time.sleep(0.05)
    again.cancel()
    held[1].cancel()
    assert CommitLogSettings.load([], max_workers=64).subscribe_streams_cap == 16
