"""SimpleConsumer (receive / ack on its own, RocketMQ 5's SimpleConsumer) against a real store;
a Consumer's receive / ack are the same type's (test_consumer.py has their walk through
redelivery and stale receipts)."""

from __future__ import annotations

import grpc
import pytest

from mqstore.client import ClientSettings, Consumer, SimpleConsumer
from mqstore.client.errors import ClientError, InvalidArgument
from mqstore.testing.cluster import Cluster
from tests.client.test_consumer import numbered, put, raises_invalid

pytestmark = pytest.mark.timeout(60)


def test_a_simple_consumer_receives_acks_and_gets_back_what_it_did_not_ack(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    put(cluster, topic, 0, numbered("m", 4))
    with SimpleConsumer(settings, topic, group="workers") as sc:
        got = sc.receive(0, max_messages=3, invisible_duration_ms=60_000)
        assert [r.message.body for r in got] == numbered("m", 3)
        assert sc.stats.messages == 3
        done = sc.ack(got[:2])
        assert (done.acked, done.stale, done.committed_offset) == (2, [], 2)
        # The third is shown again at once: delivered a second time, under a new receipt.
        assert sc.change_invisible_duration(got[2], 0) != ""
        again = sc.receive(0, max_messages=10, invisible_duration_ms=60_000)
        assert [(r.message.queue_offset, r.delivery_count) for r in again] == [(2, 2), (3, 1)]
        assert sc.ack(again).committed_offsets == {0: 4}
        assert sc.receive(0) == []


def test_a_simple_consumer_and_a_consumer_of_one_group_share_the_servers_state(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    put(cluster, topic, 0, numbered("m", 2))
    with (
        SimpleConsumer(settings, topic, group="shared") as sc,
        Consumer(settings, topic, group="shared", queues=[0]) as c,
    ):
        got = sc.receive(0, max_messages=1, invisible_duration_ms=60_000)
        assert [r.message.queue_offset for r in got] == [0]
        # Invisible to the group, whichever type asks; the receipt is good for either.
        assert [r.message.queue_offset for r in c.receive(0, max_messages=10)] == [1]
        assert c.ack([got[0].receipt_handle], queue_id=0).acked == 1
        assert c.committed(0) == 1


def test_a_simple_consumer_checks_its_arguments_and_refuses_calls_once_closed(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    raises_invalid(lambda: SimpleConsumer(settings, topic, group="bad group"), "group")
    raises_invalid(lambda: SimpleConsumer(settings, "bad topic!", group="g"), "topic")
    raises_invalid(
        lambda: SimpleConsumer(settings, topic, group="g", on_bad_record="drop"),  # type: ignore[arg-type]
        "on_bad_record",
    )
    sc = SimpleConsumer(settings, topic, group="g")
    try:
        raises_invalid(lambda: sc.receive(0, max_messages=0), "max_messages")
        raises_invalid(lambda: sc.receive(0, invisible_duration_ms=0), "invisible_duration_ms")
        raises_invalid(lambda: sc.ack(["handle"]), "queue_id")
        with pytest.raises(InvalidArgument):
            sc.change_invisible_duration("handle", -1, queue_id=0)
    finally:
        sc.close()
    sc.close()  # again: nothing
    with pytest.raises(ClientError) as info:
        sc.receive(0)
    assert info.value.code is grpc.StatusCode.CANCELLED
    with pytest.raises(ClientError):
        sc._retry.conn.channel(settings.cq[0])  # its own connection is closed too
