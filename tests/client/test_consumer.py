"""Consumer against a real store (commitlog_svc, cq_svc, index_svc as processes on loopback).

Messages go in through the commit log's Append directly (tests/e2e/support.py), so these tests
depend on nothing of the SDK but the consumer and what it builds on; each test waits until the
consume queue has them (dispatch is asynchronous) before it reads.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import grpc
import pytest

from mqstore.client.compression import Compression, compress
from mqstore.client.connection import Connection
from mqstore.client.consumer import Consumer, Offset, PullResult, Timestamp
from mqstore.client.errors import ClientError, DataLoss, InvalidArgument
from mqstore.client.message import Message
from mqstore.client.settings import ClientSettings
from mqstore.formats import sysflag
from mqstore.formats.properties import encode_properties
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as cqpb
from mqstore.testing.cluster import Cluster, start_store
from tests.client.conftest import settings_for
from tests.e2e.support import CALL_TIMEOUT_S, Sent, append, eventually

pytestmark = pytest.mark.timeout(60)


# -- helpers --------------------------------------------------------------------------------------


def put(
    cluster: Cluster, topic: str, queue_id: int, bodies: list[bytes], tags: str = ""
) -> list[Sent]:
    """Append to one queue and wait until the consume queue serves it."""
    sent = append(cluster.commitlog_stub(), topic, [queue_id] * len(bodies), bodies, tags=tags)
    wait_dispatched(cluster, topic, queue_id, sent[-1].queue_offset + 1)
    return sent


def wait_dispatched(cluster: Cluster, topic: str, queue_id: int, max_offset: int) -> None:
    stub = cluster.cq_stub("cq")

    def there() -> bool:
        info = stub.GetQueueInfo(
            cqpb.GetQueueInfoRequest(topic=topic, queue_id=queue_id), timeout=CALL_TIMEOUT_S
        )
        return info.max_offset >= max_offset

    eventually(there)


def numbered(prefix: str, n: int, first: int = 0) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(first, first + n)]


def bodies_by_queue(messages: Iterable[Message]) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {}
    for m in messages:
        out.setdefault(m.queue_id, []).append(m.body)
    return out


def offsets_of(messages: Iterable[Message], queue_id: int) -> list[int]:
    return [m.queue_offset for m in messages if m.queue_id == queue_id]


def raises_invalid(call: Callable[[], object], field: str) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as info:
        call()
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.field == field, info.value
    return info.value


# -- start positions ------------------------------------------------------------------------------


def test_earliest_reads_every_queue_in_order_and_follow_false_stops_at_the_end(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    put(cluster, topic, 0, numbered("a", 40))
    put(cluster, topic, 2, numbered("c", 7))
    with Consumer(settings, topic, start="earliest", max_messages=8) as c:
        got = list(c.messages(follow=False))
        assert bodies_by_queue(got) == {0: numbered("a", 40), 2: numbered("c", 7)}
        assert c.assignment() == [0, 2]
        assert (c.position(0), c.position(2)) == (40, 7)
        assert c.stats.messages == 47
        # A later walk hands out only what came since.
        put(cluster, topic, 2, [b"late"])
        assert [m.body for m in c.messages(follow=False)] == [b"late"]


def test_poll_takes_the_queues_in_turn(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    put(cluster, topic, 0, numbered("a", 20))
    put(cluster, topic, 1, numbered("b", 20))
    with Consumer(settings, topic, queues=[0, 1], start="earliest", max_messages=5) as c:
        first = c.poll(timeout_s=0)
        # One batch from each queue, not the whole of the first queue.
        assert bodies_by_queue(first) == {0: numbered("a", 5), 1: numbered("b", 5)}
        rest: list[Message] = []
        while len(rest) < 30:
            rest += c.poll(timeout_s=0)
        assert bodies_by_queue(first + rest) == {0: numbered("a", 20), 1: numbered("b", 20)}
        assert c.poll(timeout_s=0) == []


def test_poll_batch_hands_out_what_poll_would_as_columns(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    """The same messages, in the same order, with the same positions moved, as poll(): bodies,
    queue ids and queue offsets as lists; a Message made on demand equals poll()'s."""
    put(cluster, topic, 0, numbered("a", 12))
    put(cluster, topic, 1, numbered("b", 7))
    with (
        Consumer(settings, topic, queues=[0, 1], start="earliest", max_messages=5) as by_poll,
        Consumer(settings, topic, queues=[0, 1], start="earliest", max_messages=5) as by_batch,
    ):
        polled: list[Message] = []
        batches = []
        while len(polled) < 19:
            polled += by_poll.poll(timeout_s=0)
        while sum(map(len, batches)) < 19:
            batch = by_batch.poll_batch(timeout_s=0)
            assert len(batch.bodies) == len(batch.queue_ids) == len(batch.queue_offsets)
            batches.append(batch)
        assert by_poll.poll_batch(timeout_s=0).bodies == []
        assert len(by_batch.poll(timeout_s=0)) == 0
        assert [by_batch.position(q) for q in (0, 1)] == [12, 7]
        assert by_batch.stats.messages == 19
    bodies = [b for batch in batches for b in batch.bodies]
    assert bodies == [m.body for m in polled]
    assert [q for batch in batches for q in batch.queue_ids] == [m.queue_id for m in polled]
    assert [o for batch in batches for o in batch.queue_offsets] == [m.queue_offset for m in polled]
    made = [m for batch in batches for m in batch]
    assert made == polled  # every field, decoded from the record when asked for
    assert batches[0][-1] == made[len(batches[0]) - 1]
    assert batches[0][1:3] == made[1:3]


def test_poll_batch_bodies_of_a_long_retry_topic_written_as_v2_records(
    cluster: Cluster, settings: ClientSettings
) -> None:
    topic = "%RETRY%" + "g" * 130  # over 127 bytes: V2 records, which read_record decodes
    put(cluster, topic, 0, numbered("a", 3))
    with Consumer(settings, topic, queues=[0], start="earliest") as c:
        batch = c.poll_batch(timeout_s=2)
    assert batch.bodies == numbered("a", 3) == [m.body for m in batch]


def test_a_poll_between_two_messages_of_the_iterator_hands_nothing_out_twice(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    """messages() makes each Message as it hands it out; a poll() that took the rest of the
    batch in between ends that batch for the iterator (which then stops: the queue reached
    its end)."""
    put(cluster, topic, 0, numbered("a", 10))
    with Consumer(settings, topic, queues=[0], start="earliest", max_messages=10) as c:
        walk = c.messages(follow=False)
        assert next(walk).queue_offset == 0
        assert [m.queue_offset for m in c.poll(timeout_s=0)] == list(range(1, 10))
        assert list(walk) == []
        assert c.position(0) == 10 and c.stats.messages == 10


def test_latest_starts_at_the_end_and_sees_only_what_comes_after(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    put(cluster, topic, 0, numbered("old", 5))
    with Consumer(settings, topic, queues=[0], start="latest") as c:
        assert c.position(0) == 5
        assert list(c.messages(follow=False)) == []
        put(cluster, topic, 0, numbered("new", 3))
        assert [m.body for m in c.messages(follow=False)] == numbered("new", 3)


@pytest.mark.parametrize(("fallback", "expected"), [("earliest", 4), ("latest", 0)])
def test_committed_without_a_committed_offset_starts_at_the_fallback(
    cluster: Cluster, settings: ClientSettings, topic: str, fallback: str, expected: int
) -> None:
    put(cluster, topic, 0, numbered("m", 4))
    with Consumer(settings, topic, group="never_committed", fallback=fallback) as c:  # type: ignore[arg-type]
        assert c.start == "committed"  # the default with a group
        assert c.committed(0) is None
        assert len(list(c.messages(follow=False))) == expected


def test_commit_and_committed_carry_positions_between_consumers_of_a_group(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    put(cluster, topic, 0, numbered("m", 10))
    put(cluster, topic, 1, numbered("n", 3))
    with Connection(settings) as conn:
        with Consumer(conn, topic, group="billing", queues=[0, 1], max_messages=2) as c1:
            got = list(c1.messages(follow=False, limit=4))
            assert len(got) == 4
            c1.commit()  # positions: the next offset to read
            assert {q: c1.committed(q) for q in (0, 1)} == {q: c1.position(q) for q in (0, 1)}
            positions = {q: c1.position(q) for q in (0, 1)}
        with Consumer(conn, topic, group="billing", queues=[0, 1]) as c2:
            rest = list(c2.messages(follow=False))
            # Exactly what the first consumer did not hand out.
            assert sorted((m.queue_id, m.queue_offset) for m in got + rest) == [
                *((0, i) for i in range(10)),
                *((1, i) for i in range(3)),
            ]
            assert min(offsets_of(rest, 0)) == positions[0]
            c2.commit({0: 7})  # explicit offsets
        with Consumer(conn, topic, group="billing", queues=[0]) as c3:
            assert c3.committed(0) == 7
            assert [m.queue_offset for m in c3.messages(follow=False)] == [7, 8, 9]
        # The shared connection outlives the consumers built on it.
        assert Consumer(conn, topic, queues=[0]).position(0) == 0


def test_offset_and_per_queue_starts(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    put(cluster, topic, 0, numbered("a", 6))
    put(cluster, topic, 1, numbered("b", 6))
    with Consumer(settings, topic, start=Offset(4)) as c:
        got = list(c.messages(follow=False))
        assert {q: offsets_of(got, q) for q in (0, 1)} == {0: [4, 5], 1: [4, 5]}
    with Consumer(settings, topic, queues=[0, 1], start={0: 1, 1: 5}) as c:
        got = list(c.messages(follow=False))
        assert {q: offsets_of(got, q) for q in (0, 1)} == {0: [1, 2, 3, 4, 5], 1: [5]}
    # A queue the dict leaves out starts at the fallback.
    with Consumer(settings, topic, queues=[0, 1], start={0: 5}, fallback="latest") as c:
        assert (c.position(0), c.position(1)) == (5, 6)


def test_timestamp_starts_at_the_lower_or_upper_boundary(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    put(cluster, topic, 0, numbered("before", 3))
    with Consumer(settings, topic, queues=[0]) as c:
        before = c.pull(0, 0).messages
    before_ms = max(m.store_timestamp_ms for m in before)
    # The next batch must carry a later store time than the first.
    eventually(lambda: time.time() * 1000 > before_ms + 2, step_s=0.001)
    put(cluster, topic, 0, numbered("after", 3))
    with Consumer(settings, topic, queues=[0]) as c:
        after_ms = min(m.store_timestamp_ms for m in c.pull(0, 3).messages)
    assert after_ms > before_ms

    def first_offset(start: Timestamp) -> int:
        with Consumer(settings, topic, queues=[0], start=start) as c:
            return next(iter(c.messages(follow=False))).queue_offset

    # lower: the first message stored at or after the time.
    assert first_offset(Timestamp(after_ms)) == 3
    assert first_offset(Timestamp(after_ms, boundary="lower")) == 3
    assert first_offset(Timestamp(before_ms - 1000)) == 0
    # upper: the last message stored at or before it.
    assert first_offset(Timestamp(after_ms - 1, boundary="upper")) == 2
    assert first_offset(Timestamp(before_ms, boundary="upper")) == 2
    # seek_to_time does the same on a consumer that already has positions.
    with Consumer(settings, topic, queues=[0], start="latest") as c:
        c.seek_to_time(after_ms)
        assert c.position(0) == 3
        c.seek_to_time(before_ms, boundary="upper")
        assert c.position(0) == 2
        c.seek_to_beginning()
        assert c.position(0) == 0
        c.seek_to_end()
        assert c.position(0) == 6
        c.seek(0, 4)
        assert [m.queue_offset for m in c.messages(follow=False)] == [4, 5]


# -- pull, long polling, iteration ----------------------------------------------------------------


def test_pull_is_raw_and_reports_the_store_status(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    put(cluster, topic, 0, numbered("m", 5))
    with Consumer(settings, topic, queues=[0]) as c:
        res = c.pull(0, 1, max_messages=2)
        assert isinstance(res, PullResult)
        assert res.status == "FOUND"
        assert [m.body for m in res.messages] == numbered("m", 2, first=1)
        assert (res.next_offset, res.min_offset, res.max_offset) == (3, 0, 5)
        assert c.pull(0, 5).status == "OFFSET_OVERFLOW_ONE"
        badly = c.pull(0, 9)
        assert (badly.status, badly.next_offset) == ("OFFSET_OVERFLOW_BADLY", 5)
        assert c.pull(3, 0).status == "NO_MESSAGE_IN_QUEUE"
        assert c.position(0) == 0  # a raw pull moves nothing


def test_a_position_past_the_end_moves_back_to_the_end_without_counting_a_loss(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    put(cluster, topic, 0, numbered("m", 3))
    with Consumer(settings, topic, queues=[0]) as c:
        c.seek(0, 50)
        assert c.poll(timeout_s=0) == []
        assert c.position(0) == 3
        put(cluster, topic, 0, [b"next"])
        # A caught-up poll without time to wait still looks once.
        assert [m.queue_offset for m in c.poll(timeout_s=0)] == [3]
        assert c.stats.skipped == {}


def append_when(
    cluster: Cluster, topic: str, queue_id: int, body: bytes, ready: Callable[[], bool]
) -> threading.Thread:
    """Append `body` from another thread once `ready()` is true."""

    def run() -> None:
        eventually(ready, timeout_s=10)
        append(cluster.commitlog_stub(), topic, [queue_id], [body])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def more_pulls_sent(c: Consumer) -> Callable[[], bool]:
    """True once the consumer watches its queues: a pull sent after this call (stats.pulls
    counts a unary pull as it is sent), or a Follow stream open (it watches every queue)."""
    before = c.stats.pulls
    return lambda: c.stats.pulls > before or c.following


def test_a_long_poll_answers_as_soon_as_a_message_arrives(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    put(cluster, topic, 0, [b"first"])
    with Consumer(settings, topic, queues=[0, 1], long_poll_ms=10_000) as c:
        assert [m.body for m in c.poll(timeout_s=0)] == [b"first"]
        # Every caught-up queue is watched: whichever gets the message answers.
        for queue_id, body in ((1, b"second"), (0, b"third"), (1, b"fourth")):
            # The append happens once the consumer has sent its long polls.
            thread = append_when(cluster, topic, queue_id, body, more_pulls_sent(c))
            began = time.monotonic()
            got = c.poll(timeout_s=10)
            waited = time.monotonic() - began
            thread.join()
            assert [(m.queue_id, m.body) for m in got] == [(queue_id, body)]
            assert waited < 5.0, waited  # well before the 10 s long poll ends

        # The raw pull long-polls the same way (a unary Pull: counted as it is sent).
        before = c.stats.pulls
        thread = append_when(cluster, topic, 0, b"fifth", lambda: c.stats.pulls > before)
        began = time.monotonic()
        res = c.pull(0, 2, long_poll_ms=10_000)
        thread.join()
        assert [m.body for m in res.messages] == [b"fifth"]
        assert time.monotonic() - began < 5.0


def test_poll_waits_for_its_timeout_when_nothing_comes(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    put(cluster, topic, 0, [b"only"])
    put(cluster, topic, 1, [b"only"])
    with Consumer(settings, topic, start="latest", long_poll_ms=10_000) as c:
        began = time.monotonic()
        assert c.poll(timeout_s=0.5) == []
        waited = time.monotonic() - began
        assert 0.45 <= waited < 3.0, waited


@pytest.mark.timeout(30)
def test_following_picks_up_new_messages_and_new_queues(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    put(cluster, topic, 0, numbered("a", 2))
    with Consumer(
        settings, topic, start="latest", long_poll_ms=2_000, queue_refresh_interval_s=0.2
    ) as c:
        assert c.assignment() == [0]
        it = iter(c)
        put(cluster, topic, 0, numbered("a", 1, first=2))
        assert next(it).body == b"a-2"
        # A queue that did not exist when the consumer started: read from its beginning.
        put(cluster, topic, 3, numbered("d", 2))
        put(cluster, topic, 0, numbered("a", 1, first=3))
        got = [next(it) for _ in range(3)]
        assert bodies_by_queue(got) == {0: [b"a-3"], 3: [b"d-0", b"d-1"]}
        assert c.assignment() == [0, 3]


def test_limit_stops_the_iterator_and_positions_follow_what_was_handed_out(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    put(cluster, topic, 0, numbered("m", 10))
    with Consumer(settings, topic, queues=[0], max_messages=8) as c:
        got = list(c.messages(follow=True, limit=3))
        assert [m.queue_offset for m in got] == [0, 1, 2]
        assert c.position(0) == 3  # not 8: the rest of the batch was not handed out
        assert [m.queue_offset for m in c.messages(follow=False)] == list(range(3, 10))


def test_a_seek_during_a_walk_to_the_end_reads_the_queue_again(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    put(cluster, topic, 0, numbered("m", 3))
    with Consumer(settings, topic, queues=[0], max_messages=1) as c:
        walk = c.messages(follow=False)
        assert [next(walk).queue_offset for _ in range(3)] == [0, 1, 2]  # at the end now
        c.seek(0, 1)
        assert [m.queue_offset for m in walk] == [1, 2]


def test_tags_filter_hands_out_only_matching_messages(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    put(cluster, topic, 0, numbered("x", 3), tags="created")
    put(cluster, topic, 0, numbered("y", 2), tags="paid")
    put(cluster, topic, 0, numbered("z", 2), tags="shipped")
    put(cluster, topic, 0, numbered("x", 1, first=3), tags="created")
    with Consumer(settings, topic, queues=[0], tags=["paid"]) as c:
        assert [m.body for m in c.messages(follow=False)] == numbered("y", 2)
        assert c.position(0) == 8  # past the filtered tail too
    with Consumer(settings, topic, queues=[0], tags="created || shipped") as c:
        got = list(c.messages(follow=False))
        assert [m.body for m in got] == numbered("x", 3) + numbered("z", 2) + [b"x-3"]
        assert {m.tags for m in got} == {"created", "shipped"}
    with Consumer(settings, topic, queues=[0], tags="*") as c:
        assert len(list(c.messages(follow=False))) == 8


# -- commits --------------------------------------------------------------------------------------


def test_auto_commit_commits_on_close_and_on_its_interval(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    put(cluster, topic, 0, numbered("m", 6))
    with Consumer(settings, topic, group="auto", queues=[0], auto_commit=True) as c:
        assert len(list(c.messages(follow=False, limit=2))) == 2
        assert c.committed(0) is None  # the 5 s interval has not passed
    with Consumer(settings, topic, group="auto", queues=[0]) as check:
        assert check.committed(0) == 2  # committed on close

        c = Consumer(
            settings,
            topic,
            group="auto",
            queues=[0],
            max_messages=1,
            auto_commit=True,
            auto_commit_interval_s=0.05,
        )
        try:
            assert [m.queue_offset for m in c.poll(timeout_s=0)] == [2]

            def committed_by_a_later_poll() -> bool:
                c.poll(timeout_s=0)
                return check.committed(0) == c.position(0) and c.position(0) > 3

            eventually(committed_by_a_later_poll)
        finally:
            c.close()


# -- receive / ack --------------------------------------------------------------------------------


def test_receive_ack_redelivery_and_stale_receipts(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    put(cluster, topic, 0, numbered("m", 3))
    with Consumer(settings, topic, group="workers") as c:
        got = c.receive(0, max_messages=10, invisible_duration_ms=60_000)
        assert [r.message.body for r in got] == numbered("m", 3)
        assert [r.delivery_count for r in got] == [1, 1, 1]

        first = c.ack([got[0]])
        assert (first.acked, first.stale, first.committed_offset) == (1, [], 1)
        assert c.receive(0) == []  # the other two are invisible

        # Visible again at once: delivered a second time, and the old receipt is stale.
        assert c.change_invisible_duration(got[1], 0) != ""
        again = c.receive(0, max_messages=10, invisible_duration_ms=60_000)
        assert [(r.message.queue_offset, r.delivery_count) for r in again] == [(1, 2)]
        stale = c.ack([got[1].receipt_handle], queue_id=0)
        assert (stale.acked, stale.stale) == (0, [got[1].receipt_handle])
        assert c.change_invisible_duration(got[1], 1_000) == ""

        # Redelivered after its invisibility runs out (the long poll wakes for it).
        assert c.change_invisible_duration(got[2], 300) != ""
        began = time.monotonic()
        back = c.receive(0, invisible_duration_ms=60_000, long_poll_ms=10_000)
        assert [(r.message.queue_offset, r.delivery_count) for r in back] == [(2, 2)]
        assert time.monotonic() - began < 5.0

        done = c.ack(again + back)
        assert (done.acked, done.stale, done.committed_offsets) == (2, [], {0: 3})
        assert c.committed(0) == 3


# -- bodies ---------------------------------------------------------------------------------------


def test_compressed_bodies_come_back_as_they_were_sent(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    originals = [(f"payload {i} " * 500).encode() for i in range(3)]
    stored = []
    flags = []
    for body, kind in zip(
        originals, (Compression.ZLIB, Compression.LZ4, Compression.ZSTD), strict=True
    ):
        packed, bits = compress(body, kind)
        assert bits & sysflag.COMPRESSED and len(packed) < len(body)
        stored.append(packed)
        flags.append(bits)
    request = cl.AppendRequest(
        batches=[
            cl.MessageBatch(
                topic=topic,
                queue_ids=[0, 0, 0],
                bodies=stored,
                properties=[encode_properties({"TAGS": "big"})] * 3,
                sys_flags=flags,
            )
        ]
    )
    response = cluster.commitlog_stub().Append(request, timeout=CALL_TIMEOUT_S)
    assert list(response.statuses) == [cl.PUT_OK] * 3
    wait_dispatched(cluster, topic, 0, 3)
    with Consumer(settings, topic, queues=[0]) as c:
        got = list(c.messages(follow=False))
    assert [m.body for m in got] == originals
    assert [m.sys_flag for m in got] == flags


def commitlog_segment(cluster: Cluster, offset: int) -> tuple[Path, int]:
    """The segment file holding commit-log `offset`, and the offset's place in it."""
    directory = Path(cluster.commitlog.data_dir) / "commitlog"
    starts = sorted(int(name) for name in os.listdir(directory) if name.isdigit())
    start = max(s for s in starts if s <= offset)
    return directory / f"{start:020d}", offset - start


@pytest.fixture(scope="module")
def untailed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A store whose cq_svc holds no tail records and reads no segment file: every pull Reads
    the commit log. (The tail holds records as their append wrote them, so damage done to a
    segment afterwards is seen by a Read only: tests/cq_svc/test_tail_serving.py; the segment
    files' damage, checked locally first: tests/cq_svc/test_local_reads.py.)"""
    c = start_store(
        tmp_path_factory.mktemp("untailed"),
        extra={"cq_svc": ["--tail-records-mib", "0"]},
        local_reads=False,
    )
    try:
        yield c
    finally:
        c.stop_all()


def test_a_corrupt_record_is_never_handed_out(untailed: Cluster, topic: str) -> None:
    cluster, settings = untailed, settings_for(untailed)
    sent = put(cluster, topic, 0, numbered("intact-body", 3))
    # Flip a bit of the second record's body on disk (IPv4 hosts: the body starts at 88);
    # the running commit log maps the same pages, so it reads the damage at once.
    path, at = commitlog_segment(cluster, sent[1].commit_log_offset + 90)
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x10]))
    with Consumer(settings, topic, queues=[0]) as c:
        # A raw pull hands out what precedes the damaged record and names it, never its bytes.
        result = c.pull(0, 0)
        assert [m.queue_offset for m in result.messages] == [0]
        assert [(b.queue_offset, b.commit_log_offset) for b in result.bad_records] == [
            (1, sent[1].commit_log_offset)
        ]
        assert result.next_offset == 2
        # poll: the good one, then the bad one raised once (DataLoss), then past it
        # (tests/client/test_bad_records.py has the rest).
        assert [m.queue_offset for m in c.poll(timeout_s=0)] == [0]
        with pytest.raises(DataLoss) as info:
            c.poll(timeout_s=0)
        assert info.value.code is grpc.StatusCode.DATA_LOSS
        assert c.position(0) == 2
        assert [m.queue_offset for m in c.poll(timeout_s=0)] == [2]


# -- bad arguments --------------------------------------------------------------------------------


def test_bad_arguments_raise_invalid_argument_naming_the_field(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    put(cluster, topic, 0, [b"m"])
    with Consumer(settings, topic, queues=[0]) as c:
        # Checked by the server: the raw pull sends what it is given.
        err = raises_invalid(lambda: c.pull(0, -1), "offset")
        assert err.method == "ConsumeQueue/Pull"
        raises_invalid(lambda: c.pull(70_000, 0), "queue_id")
        # Checked by the client.
        raises_invalid(lambda: c.seek(0, -1), "offset")
        raises_invalid(lambda: c.position(1), "queue_id")  # not assigned
        raises_invalid(c.commit, "group")
        raises_invalid(lambda: c.committed(0), "group")
        raises_invalid(lambda: c.receive(0), "group")
        raises_invalid(lambda: c.ack(["handle"]), "group")
        raises_invalid(lambda: c.seek_to_time(0, boundary="middle"), "boundary")
        raises_invalid(lambda: c.messages(limit=-1), "limit")
    raises_invalid(lambda: Consumer(settings, topic, queues=[-1]), "queue_id")
    raises_invalid(lambda: Consumer(settings, topic, queues=[]), "queues")
    raises_invalid(lambda: Consumer(settings, "bad topic!"), "topic")
    raises_invalid(lambda: Consumer(settings, topic, start="committed"), "start")
    raises_invalid(lambda: Consumer(settings, topic, start="newest"), "start")  # type: ignore[arg-type]
    raises_invalid(lambda: Consumer(settings, topic, start={0: -3}), "start")
    raises_invalid(lambda: Consumer(settings, topic, queues=[0], start={1: 0}), "start")
    raises_invalid(lambda: Consumer(settings, topic, auto_commit=True), "group")
    raises_invalid(lambda: Consumer(settings, topic, group="bad group"), "group")
    raises_invalid(lambda: Consumer(settings, topic, max_messages=0), "max_messages")
    raises_invalid(lambda: Offset(-1), "offset")
    raises_invalid(lambda: Timestamp(0, boundary="sideways"), "boundary")
    with Consumer(settings, topic, group="g", queues=[0]) as c:
        raises_invalid(lambda: c.commit({0: -1}), "offset")
        raises_invalid(lambda: c.ack(["handle"]), "queue_id")  # a bare handle needs its queue
        # A receipt the server cannot read.
        raises_invalid(lambda: c.ack(["not-a-receipt"], queue_id=0), "receipt_handles")


def test_a_closed_consumer_refuses_calls_and_closes_its_own_connection(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    c = Consumer(settings, topic, queues=[0])
    c.close()
    c.close()  # again: nothing
    with pytest.raises(ClientError) as info:
        c.poll(timeout_s=0)
    assert info.value.code is grpc.StatusCode.CANCELLED
    with pytest.raises(ClientError):
        c._conn.channel(settings.cq[0])  # its own connection is closed too
