"""T18: overload must not fail the probes, and must not queue calls without bound.

Streams cannot hold every worker of a service any more (issue 23, item 4: each kind of stream
has a cap, and the caps must leave workers to unary calls). So: commitlog_svc with 4 workers,
one subscription and one append stream allowed, both held open. One more stream of either
kind is refused at once (RESOURCE_EXHAUSTED); a burst of unary calls, more than the server
admits at once (4 a worker), is answered or refused at once, never left to time out in a
queue; the health port, a server of its own, answers liveness and readiness promptly all the
while; once the streams end, new ones are taken again."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from mqstore.launcher import health_status
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl
from mqstore.testing.cluster import Cluster

pytestmark = pytest.mark.timeout(120)

WORKERS = 4
# The server admits up to 4 calls per worker (mqstore/rpc/server.py), then refuses.
CALLS_ADMITTED = WORKERS * 4
BURST_CALLS = 4 * CALLS_ADMITTED
PROBE_S_MAX = 2.0
CALL_TIMEOUT_S = 20.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    args = ["--max-workers", str(WORKERS), "--subscribe-streams-max", "1"]
    c = Cluster(tmp_path, extra={"commitlog_svc": [*args, "--append-streams-max", "1"]})
    try:
        c.start_commitlog()
        yield c
    finally:
        c.stop_all()


def probes_answer(target: str) -> None:
    serving = health_pb2.HealthCheckResponse.SERVING
    started = time.monotonic()
    assert health_status(target, "liveness") == serving
    assert health_status(target, "readiness") == serving
    assert time.monotonic() - started < PROBE_S_MAX


def code_of(call: object) -> grpc.StatusCode:
    try:
        next(iter(call))  # type: ignore[call-overload]
    except grpc.RpcError as err:
        code: grpc.StatusCode = err.code()
        return code
    return grpc.StatusCode.OK


def test_a_service_with_every_stream_slot_held_refuses_more_and_still_answers(
    cluster: Cluster,
) -> None:
    stub = cluster.commitlog_stub()
    health = cluster.commitlog.health_target
    held_subscription = stub.Subscribe(cl.SubscribeRequest(subscriber_id="held"), timeout=60)
    assert next(held_subscription).WhichOneof("frame") == "handshake"
    requests: queue.SimpleQueue[cl.AppendRequest | None] = queue.SimpleQueue()
    held_append = stub.AppendStream(iter(requests.get, None), timeout=60)
    requests.put(
        cl.AppendRequest(batches=[cl.MessageBatch(topic="T", queue_ids=[0], bodies=[b"x"])])
    )
    assert list(next(held_append).statuses) == [cl.PUT_OK]

    started = time.monotonic()
    more = stub.Subscribe(cl.SubscribeRequest(subscriber_id="more"), timeout=CALL_TIMEOUT_S)
    assert code_of(more) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert time.monotonic() - started < CALL_TIMEOUT_S / 4, "refused at once, not queued"
    probes_answer(health)

    def one_call(_: int) -> grpc.StatusCode:
        try:
            stub.GetStatus(cl.GetStatusRequest(), timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as err:
            code: grpc.StatusCode = err.code()
            return code
        return grpc.StatusCode.OK

    stop = threading.Event()
    probe_errors: list[BaseException] = []

    def probe_all_along() -> None:
        while not stop.is_set():
            try:
                probes_answer(health)
            except BaseException as exc:  # reported below
                probe_errors.append(exc)
                return
            time.sleep(0.05)

    prober = threading.Thread(target=probe_all_along, daemon=True)
    prober.start()
    with ThreadPoolExecutor(max_workers=BURST_CALLS) as pool:
        codes = list(pool.map(one_call, range(BURST_CALLS)))
    stop.set()
    prober.join()
    assert not probe_errors, probe_errors
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    assert codes.count(grpc.StatusCode.OK) >= 1

    held_subscription.cancel()
    requests.put(None)
    deadline = time.monotonic() + 10
    while True:  # the slot comes back once the ended stream's handler returns
        again = stub.Subscribe(cl.SubscribeRequest(subscriber_id="after"), timeout=10)
        code = code_of(again)
        again.cancel()
        if code == grpc.StatusCode.OK:
            break
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, code
        assert time.monotonic() < deadline, "still refusing after the streams ended"
        time.sleep(0.05)
