"""T18: overload must not fail the probes. With every worker of commitlog_svc held by
subscription streams and its call queue full, new API calls are refused at once
(RESOURCE_EXHAUSTED, not queued without bound), while the health port, a server of its own,
still answers liveness and readiness; once the streams end, calls are taken again."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl

from .cluster import Cluster, health_status

pytestmark = pytest.mark.timeout(120)

WORKERS = 2
# The server admits up to 4 calls per worker (mqstore/rpc/server.py), then refuses.
CALLS_ADMITTED = WORKERS * 4
PROBE_S_MAX = 2.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, extra={"commitlog_svc": ["--max-workers", str(WORKERS)]})
    try:
        c.start_commitlog()
        yield c
    finally:
        c.stop_all()


def test_a_saturated_service_refuses_new_calls_and_still_answers_its_probes(
    cluster: Cluster,
) -> None:
    stub = cluster.commitlog_stub()
    streams = [
        stub.Subscribe(cl.SubscribeRequest(subscriber_id=f"held-{i}"), timeout=60)
        for i in range(CALLS_ADMITTED)
    ]
    # WORKERS of them run (which ones is the server's choice), the others wait in its queue.

    def refused() -> bool | None:
        """True: refused at once; False: answered; None: still queued at its deadline (the
        streams are still arriving, so the bound is not reached yet)."""
        try:
            stub.GetStatus(cl.GetStatusRequest(), timeout=0.5)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return None
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
            return True
        return False

    deadline = time.monotonic() + 10
    while refused() is not True:  # the queued streams may take a moment to arrive
        assert time.monotonic() < deadline, "never refused: calls queue without bound"
        time.sleep(0.05)

    target = cluster.commitlog.health_target
    serving = health_pb2.HealthCheckResponse.SERVING
    for _ in range(5):
        started = time.monotonic()
        assert health_status(target, "liveness") == serving
        assert health_status(target, "readiness") == serving
        assert time.monotonic() - started < PROBE_S_MAX
    for s in streams:
        s.cancel()
    deadline = time.monotonic() + 10
    while refused() is not False:
        assert time.monotonic() < deadline, "still refusing after the streams ended"
        time.sleep(0.05)
