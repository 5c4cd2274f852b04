"""The three services as real processes: append, pull by offset and by time, query by key and
unique id, receive/ack with redelivery."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from mqstore.rpc.gen.common.v1 import common_pb2
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as cq
from mqstore.rpc.gen.index.v1 import index_pb2 as ix
from mqstore.testing.cluster import Cluster
from tests.answers import records_of

from .support import CALL_TIMEOUT_S, append, decode, eventually, pull_all

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One store for the module: its tests use topics of their own and restart nothing."""
    c = Cluster(tmp_path_factory.mktemp("store"))
    try:
        c.start_commitlog()
        c.add("cq_svc", "cq")
        c.add("index_svc", "index")
        c.start_many("cq", "index")
        yield c
    finally:
        c.stop_all()


def test_messages_appended_are_pulled_found_by_time_and_by_key(cluster: Cluster) -> None:
    log = cluster.commitlog_stub()
    first = append(
        log,
        "orders",
        [0, 1, 0, 1],
        [b"a0", b"b0", b"a1", b"b1"],
        keys=["k-1", "k-2", "k-3", "k-1 shared"],
        uniq_keys=["U1", "U2", "U3", "U4"],
    )
    time.sleep(0.05)  # a later store time for the second batch
    second = append(log, "payments", [2, 2], [b"p0", b"p1"], keys=["k-1", "pay"])
    cq_stub = cluster.cq_stub("cq")
    eventually(lambda: len(pull_all(cq_stub, "payments", 2)) == 2)

    # By offset: every message, in queue order, with its bytes.
    assert [body for _, _, body in pull_all(cq_stub, "orders", 0)] == [b"a0", b"a1"]
    assert [body for _, _, body in pull_all(cq_stub, "orders", 1)] == [b"b0", b"b1"]
    assert [(qo, off) for qo, off, _ in pull_all(cq_stub, "payments", 2)] == [
        (s.queue_offset, s.commit_log_offset) for s in second
    ]

    # By time: the first message stored at or after the second batch's store time.
    head = decode(
        records_of(
            cq_stub.Pull(
                cq.PullRequest(topic="payments", queue_id=2, offset=0, max_messages=1),
                timeout=CALL_TIMEOUT_S,
            )
        )[0]
    )
    lower = cq_stub.GetOffsetByTime(
        cq.GetOffsetByTimeRequest(
            topic="orders",
            queue_id=0,
            timestamp_ms=head.store_timestamp_ms,
            boundary=common_pb2.LOWER,
        ),
        timeout=CALL_TIMEOUT_S,
    )
    assert lower.offset == 2  # nothing of "orders" was stored after the payments batch

    # By key: only messages of that topic whose KEYS really hold the key.
    index = cluster.index_stub("index")
    eventually(
        lambda: (
            len(
                index.QueryByKey(
                    ix.QueryByKeyRequest(topic="payments", key="pay"), timeout=CALL_TIMEOUT_S
                ).messages
            )
            == 1
        )
    )
    found = index.QueryByKey(ix.QueryByKeyRequest(topic="orders", key="k-1"), timeout=5)
    assert sorted(m.body for m in found.messages) == [b"a0", b"b1"]
    assert {m.topic for m in found.messages} == {"orders"}
    by_uniq = index.QueryByUniqKey(ix.QueryByUniqKeyRequest(topic="orders", uniq_key="U3"))
    assert [m.commit_log_offset for m in by_uniq.messages] == [first[2].commit_log_offset]


def test_a_received_message_not_acked_is_delivered_again_after_its_deadline(
    cluster: Cluster,
) -> None:
    append(cluster.commitlog_stub(), "jobs", [0, 0, 0], [b"j0", b"j1", b"j2"])
    stub = cluster.cq_stub("cq")
    eventually(lambda: len(pull_all(stub, "jobs", 0)) == 3)
    received = stub.Receive(
        cq.ReceiveRequest(
            group="workers", topic="jobs", queue_id=0, max_messages=3, invisible_duration_ms=500
        ),
        timeout=CALL_TIMEOUT_S,
    )
    assert [decode(r).body for r in records_of(received)] == [b"j0", b"j1", b"j2"]
    assert list(received.delivery_counts) == [1, 1, 1]
    ack = stub.Ack(
        cq.AckRequest(
            group="workers",
            topic="jobs",
            queue_id=0,
            receipt_handles=[received.receipt_handles[0], received.receipt_handles[2]],
        ),
        timeout=CALL_TIMEOUT_S,
    )
    assert list(ack.stale_receipt_handles) == []
    assert ack.committed_offset == 1  # j1 is still unacknowledged
    time.sleep(0.6)  # past the invisibility deadline
    again = stub.Receive(
        cq.ReceiveRequest(
            group="workers", topic="jobs", queue_id=0, max_messages=3, invisible_duration_ms=5000
        ),
        timeout=CALL_TIMEOUT_S,
    )
    assert [decode(r).body for r in records_of(again)] == [b"j1"]
    assert list(again.delivery_counts) == [2]
    stub.Ack(
        cq.AckRequest(
            group="workers", topic="jobs", queue_id=0, receipt_handles=list(again.receipt_handles)
        ),
        timeout=CALL_TIMEOUT_S,
    )
    fetched = stub.FetchOffset(
        cq.FetchOffsetRequest(group="workers", topic="jobs", queue_id=0), timeout=CALL_TIMEOUT_S
    )
    assert fetched.offset == 3
