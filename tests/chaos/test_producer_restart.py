"""A producer restarted under the same producer_id (a client process restarting with the stable
name docs/client.md shows, `Producer(conn, producer_id="orders-writer")`).

The SDK numbered each Producer's requests from 1, and the commit log answers a (producer id,
sequence) it remembers with the first result, without looking at what the request holds
(commitlog_svc/producers.py). The producer table is durable (checkpoint and MQS_PSEQ tags), so
restarting the store does not clear it. A second life of a producer id therefore meets the first
life's table:

    its sequence                              the store answers
    <= last - 5 (not remembered)              FAILED_PRECONDITION: the send fails
    one of the last 5 remembered              the FIRST life's result, duplicate=True: the send
                                              is acknowledged, nothing is stored (silent loss)
    > last                                    stored

Found by the chaos run with --producer-restarts (docs/chaos.md). Fixed in the SDK: sequences
start at the wall clock in microseconds (a new life continues above the old one), and a first
attempt answered from an earlier life's table is sent again under sequences moved ahead
(tests/client/test_producer.py covers the stale answers directly).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mqstore.client import Admin, Producer
from mqstore.client.errors import ClientError
from mqstore.testing.cluster import Cluster
from tests.client.conftest import settings_for, start_cluster

pytestmark = pytest.mark.timeout(120)

TOPIC = "orders"
PRODUCER_ID = "orders-writer"
FIRST_LIFE = 10  # requests (one message each, send_sync): sequences 1..10, 6..10 remembered
SECOND_LIFE = 12


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = start_cluster(tmp_path / "store")
    try:
        yield c
    finally:
        c.stop_all()


def _first_life(cluster: Cluster) -> None:
    with Producer(settings_for(cluster), producer_id=PRODUCER_ID) as p:
        for i in range(FIRST_LIFE):
            p.send_sync(TOPIC, b"first life %d" % i, queue_id=0)


def test_a_restarted_producer_is_never_acknowledged_for_a_message_the_store_did_not_take(
    cluster: Cluster,
) -> None:
    _first_life(cluster)
    acked_elsewhere = []
    with (
        Producer(settings_for(cluster), producer_id=PRODUCER_ID) as p,
        Admin(settings_for(cluster)) as admin,
    ):
        for i in range(SECOND_LIFE):
            body = b"second life %d" % i
            try:
                result = p.send_sync(TOPIC, body, queue_id=0)
            except ClientError:
                continue  # refused: not acknowledged, so nothing was promised
            stored = admin.get_message(result.msg_id).body
            if stored != body:
                acked_elsewhere.append((body, result.commit_log_offset, stored))
    assert acked_elsewhere == []


def test_a_restarted_producer_can_send_at_once(cluster: Cluster) -> None:
    _first_life(cluster)
    with Producer(settings_for(cluster), producer_id=PRODUCER_ID) as p:
        result = p.send_sync(TOPIC, b"second life 0", queue_id=0)
    assert not result.duplicate
