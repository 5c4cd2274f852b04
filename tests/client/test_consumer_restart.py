"""Consumer tests that need a store of their own: a service killed in the middle of a consume
(cq_svc, then commitlog_svc), and retention deleting messages before the consumer got to them.

Pull positions live in the consumer, so a restart may cost a pause but never a message or a
duplicate: each test checks every queue's offsets are exactly 0..n-1, in order, once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mqstore.client.consumer import Consumer, Offset
from mqstore.client.message import Message
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as cqpb
from mqstore.testing.cluster import Cluster, expiring_args, start_store
from tests.client.conftest import INDEX_ARGS, settings_for
from tests.e2e.support import CALL_TIMEOUT_S, append, eventually

pytestmark = pytest.mark.timeout(120)

QUEUES = 4
MESSAGES = 3_000
BATCH = 500  # messages per Append


def fill(cluster: Cluster, topic: str) -> dict[int, list[bytes]]:
    """MESSAGES spread over QUEUES, every queue dispatched; the bodies per queue, in order."""
    expected: dict[int, list[bytes]] = {q: [] for q in range(QUEUES)}
    stub = cluster.commitlog_stub()
    for first in range(0, MESSAGES, BATCH):
        queue_ids = [i % QUEUES for i in range(first, first + BATCH)]
        bodies = [f"{q}:{i}".encode() for i, q in enumerate(queue_ids, start=first)]
        append(stub, topic, queue_ids, bodies)
        for q, body in zip(queue_ids, bodies, strict=True):
            expected[q].append(body)
    cq = cluster.cq_stub("cq")

    def dispatched() -> bool:
        listed = cq.ListQueues(cqpb.ListQueuesRequest(topic=topic), timeout=CALL_TIMEOUT_S)
        return {i.queue_id: i.max_offset for i in listed.queues} == {
            q: len(b) for q, b in expected.items()
        }

    eventually(dispatched)
    return expected


class Restarter(threading.Thread):
    """Restarts the killed service once the consumer has seen the outage (a retried call), so
    that the test cannot pass by the restart winning the race."""

    def __init__(self, consumer: Consumer, restart: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self.consumer = consumer
        self.restart = restart
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            eventually(lambda: self.consumer.stats.retries >= 1, timeout_s=30)
            self.restart()
        except BaseException as exc:
            self.error = exc

    def join_ok(self) -> None:
        self.join(60)
        assert not self.is_alive()
        assert self.error is None, self.error


def consume_across(
    messages: Iterator[Message], kill_after: int, kill: Callable[[], None]
) -> list[Message]:
    got: list[Message] = []
    for m in messages:
        got.append(m)
        if len(got) == kill_after:
            kill()
    return got


def check_exactly_once_in_order(got: list[Message], expected: dict[int, list[bytes]]) -> None:
    assert len(got) == MESSAGES
    for q, bodies in expected.items():
        mine = [m for m in got if m.queue_id == q]
        assert [m.queue_offset for m in mine] == list(range(len(bodies)))
        assert [m.body for m in mine] == bodies


@pytest.fixture
def short_stream_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Pull streams of at most two answers: a stream's answers wait in its HTTP/2 window, and
    with the default 64 one stream could hold a whole queue before the kill. No tail records and
    no reads of the segment files: cq_svc would answer from them while the commit log is down,
    and the consumer must meet the commit log's outage."""
    c = start_store(
        tmp_path / "store",
        extra={"cq_svc": ["--pull-stream-batches-max", "2", "--tail-records-mib", "0"]},
        local_reads=False,
    )
    try:
        yield c
    finally:
        c.stop_all()


def test_a_cq_svc_killed_mid_consume_loses_and_duplicates_nothing(
    short_stream_cluster: Cluster, topic: str
) -> None:
    cluster = short_stream_cluster
    expected = fill(cluster, topic)
    cq = cluster.followers["cq"]
    cq.pin_ports()  # the consumer's settings name them
    with Consumer(settings_for(cluster), topic, start="earliest", max_messages=64) as c:
        restarter: list[Restarter] = []

        def kill() -> None:
            cq.kill()
            restarter.append(Restarter(c, lambda: cluster.start("cq")))

        got = consume_across(c.messages(follow=False), MESSAGES // 3, kill)
        restarter[0].join_ok()
        check_exactly_once_in_order(got, expected)
        assert c.stats.reconnects >= 1
        assert c.stats.skipped == {}


def test_a_commitlog_svc_killed_mid_consume_loses_and_duplicates_nothing(
    short_stream_cluster: Cluster, topic: str
) -> None:
    cluster = short_stream_cluster
    expected = fill(cluster, topic)
    # Small pulls and short streams: with the Consumer pulling ahead, more could hold the
    # second half before the kill (seen under load), and the outage would go unseen.
    with Consumer(
        settings_for(cluster),
        topic,
        queues=range(QUEUES),
        start="earliest",
        long_poll_ms=1_000,
        max_messages=64,
    ) as c:
        restarter: list[Restarter] = []

        def kill() -> None:
            cluster.commitlog.kill()
            restarter.append(Restarter(c, cluster.restart_commitlog))

        # Following (long polls between rounds), stopped by the count.
        got = consume_across(c.messages(follow=True, limit=MESSAGES), MESSAGES // 2, kill)
        restarter[0].join_ok()
        check_exactly_once_in_order(got, expected)
        assert c.stats.reconnects >= 1
        assert {q: c.position(q) for q in range(QUEUES)} == {q: len(b) for q, b in expected.items()}


# -- retention ------------------------------------------------------------------------------------

SEGMENT_BYTES = 64 * 1024


@pytest.fixture
def expiring_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Small segments that expire at once, and followers that confirm (and so let the log
    delete) within a fraction of a second."""
    c = Cluster(
        tmp_path / "store",
        extra=expiring_args(SEGMENT_BYTES),
    )
    try:
        c.start_commitlog()
        c.add("cq_svc", "cq")
        c.add("index_svc", "index", *INDEX_ARGS)
        c.start_many("cq", "index")
        yield c
    finally:
        c.stop_all()


def test_messages_deleted_by_retention_are_counted_as_skipped_not_looped_on(
    expiring_cluster: Cluster, topic: str
) -> None:
    cluster = expiring_cluster
    stub = cluster.commitlog_stub()
    body = b"x" * 1_900  # 30 records of ~2 KB (their topic, the whole-record CRC) fill a segment
    total = 0
    for _ in range(4):  # about 4 segments, so that the first ones may go
        append(stub, topic, [0] * 30, [body] * 30)
        total += 30
    cq = cluster.cq_stub("cq")

    def queue_min() -> int:
        info = cq.GetQueueInfo(
            cqpb.GetQueueInfoRequest(topic=topic, queue_id=0), timeout=CALL_TIMEOUT_S
        )
        assert info.max_offset <= total
        return int(info.min_offset) if info.max_offset == total else 0

    eventually(lambda: queue_min() > 0)
    lowest = queue_min()
    with Consumer(settings_for(cluster), topic, queues=[0], start=Offset(0)) as c:
        got = list(c.messages(follow=False))
        # In order, once each, to the end; every offset not handed out is counted lost
        # (retention may still be deleting while the consumer reads: more gaps, all counted).
        offsets = [m.queue_offset for m in got]
        assert offsets == sorted(set(offsets))
        assert offsets[0] >= lowest and offsets[-1] == total - 1
        assert list(c.stats.skipped) == [0]
        assert c.stats.skipped_total == total - len(got) >= lowest
        assert c.position(0) == total
