"""Receive/ack across a kill -9 of cq_svc: at-least-once. Every message is acknowledged in
the end; a message can come twice (received before the crash and not yet acked, or acked
into a journal the crash cut), and such duplicates are counted, never hidden."""

from __future__ import annotations

from collections import Counter

import pytest

from mqstore.client.consumer import Consumer
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as cqpb
from mqstore.testing.cluster import Cluster
from tests.client.conftest import settings_for
from tests.client.test_consumer_restart import Restarter
from tests.e2e.support import CALL_TIMEOUT_S, append, eventually

pytestmark = pytest.mark.timeout(120)

MESSAGES = 600
INVISIBLE_MS = 1_500


def test_receive_ack_across_a_cq_svc_kill_delivers_everything_at_least_once(
    fresh_cluster: Cluster, topic: str
) -> None:
    cluster = fresh_cluster
    bodies = [b"r%d" % i for i in range(MESSAGES)]
    append(cluster.commitlog_stub(), topic, [0] * MESSAGES, bodies)
    cq_stub = cluster.cq_stub("cq")
    eventually(
        lambda: (
            cq_stub.GetQueueInfo(
                cqpb.GetQueueInfoRequest(topic=topic, queue_id=0), timeout=CALL_TIMEOUT_S
            ).max_offset
            == MESSAGES
        )
    )
    cq = cluster.followers["cq"]
    cq.pin_ports()  # the consumer's settings name them
    deliveries: Counter[int] = Counter()
    acked: set[int] = set()
    restarters: list[Restarter] = []
    with Consumer(settings_for(cluster), topic, group="workers", queues=[0]) as c:
        while len(acked) < MESSAGES:
            received = c.receive(
                0, max_messages=32, invisible_duration_ms=INVISIBLE_MS, long_poll_ms=500
            )
            for r in received:
                deliveries[r.message.queue_offset] += 1
                assert r.message.body == bodies[r.message.queue_offset]
            if received:
                result = c.ack(received)
                acked.update(
                    r.message.queue_offset
                    for r in received
                    if r.receipt_handle not in set(result.stale)
                )
            if not restarters and len(acked) >= MESSAGES // 3:
                cq.kill()
                restarters.append(Restarter(c, lambda: cluster.start("cq")))
        restarters[0].join_ok()
        assert c.stats.reconnects >= 1
        # Nothing is left for the group: everything was acknowledged.
        assert c.receive(0, max_messages=32, invisible_duration_ms=INVISIBLE_MS) == []
    assert set(deliveries) == set(range(MESSAGES)), "every message delivered"
    # Deliveries past one per message are the duplicates this mode allows; each was a
    # delivery of the same offset with the same body (checked above as it came).
