"""The Producer against real services: batching, queue choice, compression, refusals, bad
input, the asyncio flavour, and retries that never store a message twice across a kill -9 of
the commit log."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

import grpc
import pytest

from mqstore.client import AsyncProducer, Compression, Message, Producer, SendResult
from mqstore.client.errors import (
    FailedPrecondition,
    InvalidArgument,
    MessageRefused,
    Unavailable,
)
from mqstore.client.producer import SendFuture
from mqstore.client.settings import ClientSettings
from mqstore.formats import sysflag
from mqstore.formats.javahash import java_string_hash
from mqstore.limits import MessageLimits
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as cq
from mqstore.storage.simdisk import SimDisk
from mqstore.testing.cluster import Cluster
from tests.answers import records_of
from tests.commitlog_svc.conftest import start  # noqa: F401  (fixture)
from tests.commitlog_svc.support import FILE_BYTES, Running

from .conftest import settings_for

pytestmark = pytest.mark.timeout(180)
T = TypeVar("T")


def wait_for(value: Callable[[], T | None], timeout_s: float = 30.0) -> T:
    """The first value that is not None (polled)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = value()
        if got is not None:
            return got
        time.sleep(0.05)
    raise AssertionError(f"nothing within {timeout_s} s: {value}")


def read_back(cluster: Cluster, results: list[SendResult]) -> list[Message]:
    """The stored messages of `results`, read from the commit log by offset."""
    stub = cluster.commitlog_stub()
    response = stub.Read(
        cl.ReadRequest(
            offsets=[r.commit_log_offset for r in results], sizes=[r.size for r in results]
        ),
        timeout=10,
    )
    assert list(response.statuses) == [cl.READ_OK] * len(results)
    return [Message.from_record(raw) for raw in records_of(response)]


def pull_queue(cluster: Cluster, topic: str, queue_id: int) -> list[Message]:
    stub = cluster.cq_stub("cq")
    out: list[Message] = []
    offset = 0
    while True:
        r = stub.Pull(
            cq.PullRequest(topic=topic, queue_id=queue_id, offset=offset, max_messages=1000),
            timeout=10,
        )
        if r.status != cq.FOUND:
            return out
        out.extend(Message.from_record(raw) for raw in records_of(r))
        offset = r.next_begin_offset


def test_send_stores_the_message_with_its_key_tags_properties_and_a_unique_id(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    with Producer(settings) as p:
        result = p.send_sync(
            topic, b"hello", key="order-42", tags="created", properties={"region": "eu"}
        )
    assert result.topic == topic and result.queue_offset == 0 and not result.duplicate
    assert result.queue_id == abs(java_string_hash("order-42")) % 4
    assert len(result.uniq_key) == 32 and len(result.msg_id) == 32
    (stored,) = read_back(cluster, [result])
    assert stored.body == b"hello" and stored.keys == ["order-42"] and stored.tags == "created"
    assert stored.properties["region"] == "eu" and stored.uniq_key == result.uniq_key
    assert stored.msg_id == result.msg_id and stored.queue_id == result.queue_id


def producer_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("mqstore-producer")]


def test_close_ends_the_stream_and_leaves_no_thread_of_the_producer_running(
    settings: ClientSettings, topic: str
) -> None:
    """The process may exit right after close(): a thread still reading a call while the
    channel closes (or the interpreter ends) can hang inside gRPC."""
    assert producer_threads() == []
    for _ in range(3):
        with Producer(settings) as p:
            p.send_sync(topic, b"one")
            assert set(producer_threads()) == {"mqstore-producer", "mqstore-producer-recv"}
        assert producer_threads() == []


def test_messages_are_batched_by_count_and_by_bytes(settings: ClientSettings, topic: str) -> None:
    with Producer(settings, batch_messages=1_000, linger_ms=10_000) as p:
        futures = [p.send(topic, b"m%d" % i, queue_id=0) for i in range(2_500)]
        p.flush()
        assert p.stats.requests == 3  # 1,000 + 1,000 + the 500 flushed
    results = [f.result() for f in futures]
    assert [r.queue_offset for r in results] == list(range(2_500))

    with Producer(settings, batch_bytes=10_000, linger_ms=10_000) as p:
        for _ in range(20):
            p.send(topic, b"x" * 1_000, queue_id=1)
        p.flush()
        assert p.stats.requests >= 2  # ~1,100 bytes a message: at most 10 per request


def test_a_lone_message_is_sent_after_the_linger_without_a_flush(
    settings: ClientSettings, topic: str
) -> None:
    with Producer(settings, linger_ms=20) as p:
        future = p.send(topic, b"lonely")
        assert future.result(timeout=10).queue_offset == 0


def test_a_callback_that_waits_for_a_result_or_flushes_is_refused_not_left_hanging(
    settings: ClientSettings, topic: str
) -> None:
    """Callbacks run on the producer's thread, which delivers the results: waiting there for
    a pending one, flush() or close() would never end. They raise FailedPrecondition, and
    the producer goes on."""
    seen: list[BaseException] = []
    later: list[SendFuture] = []
    finished = threading.Event()

    def callback(_: object) -> None:
        pending = producer.send(topic, b"sent by the callback")
        later.append(pending)
        for wait in (pending.result, producer.flush, producer.close):
            try:
                wait()
            except FailedPrecondition as err:
                seen.append(err)
        finished.set()

    with Producer(settings, linger_ms=50) as producer:
        first = producer.send(topic, b"first")
        first.add_done_callback(callback)
        producer.flush()
        assert finished.wait(60)  # flush() may return while the callback still runs
        assert first.result().commit_log_offset >= 0
        assert len(seen) == 3 and "inside a send callback" in str(seen[0])
        assert later[0].result(timeout=20).commit_log_offset > first.result().commit_log_offset
        assert producer.send_sync(topic, b"after").commit_log_offset >= 0
    # outside the producer's threads the same calls wait as before
    assert first.result() is not None


def test_a_callback_may_wait_on_another_producer_whose_threads_deliver(
    settings: ClientSettings, topic: str
) -> None:
    """Only a wait on the callback's own producer is refused: another producer's results,
    flush and room in its buffer come from that producer's threads (found by a review)."""
    outcome: dict[str, object] = {}
    finished = threading.Event()

    def callback(_: object) -> None:
        try:
            outcome["result"] = other.send(topic, b"to the other").result(timeout=20)
            other.flush(timeout_s=20)
            outcome["sync"] = other.send_sync(topic, b"sync")
            # more than the other's buffer holds: these wait for its room, as anywhere else
            outcome["sent"] = [other_small.send(topic, b"y" * 500) for _ in range(10)]
        except Exception as err:
            outcome["error"] = err
        finished.set()

    with (
        Producer(settings, linger_ms=5) as producer,
        Producer(settings, linger_ms=5) as other,
        Producer(settings, linger_ms=200, buffer_bytes=2_000, block_timeout_s=20) as other_small,
    ):
        producer.send(topic, b"first").add_done_callback(callback)
        producer.flush()
        assert finished.wait(60)
        other_small.flush()
    assert "error" not in outcome, outcome
    assert isinstance(outcome["result"], SendResult) and isinstance(outcome["sync"], SendResult)
    assert len(outcome["sent"]) == 10  # type: ignore[arg-type]


def test_queues_by_key_hash_round_robin_or_given(settings: ClientSettings, topic: str) -> None:
    with Producer(settings, queues_per_topic=3) as p:
        keyed = [p.send(topic, b"k", key="same-key") for _ in range(5)]
        spread = [p.send(topic, b"r") for _ in range(6)]
        given = p.send(topic, b"g", queue_id=7)
        p.flush()
    assert {f.result().queue_id for f in keyed} == {abs(java_string_hash("same-key")) % 3}
    assert sorted(f.result().queue_id for f in spread) == [0, 0, 1, 1, 2, 2]
    assert given.result().queue_id == 7


@pytest.mark.parametrize(
    ("kind", "bits"),
    [
        (Compression.ZLIB, sysflag.COMPRESSION_ZLIB),
        (Compression.LZ4, sysflag.COMPRESSION_LZ4),
        (Compression.ZSTD, sysflag.COMPRESSION_ZSTD),
    ],
)
def test_large_bodies_are_compressed_marked_in_sysflag_and_read_back_whole(
    cluster: Cluster, settings: ClientSettings, topic: str, kind: Compression, bits: int
) -> None:
    big = b"compressible text " * 1_000
    random = os.urandom(8_000)  # compression would not help: stored as it is
    small = b"short"
    with Producer(settings, compression=kind) as p:
        futures = [p.send(topic, body, queue_id=0) for body in (big, random, small)]
        p.flush()
    results = [f.result() for f in futures]
    assert results[0].size < len(big) // 4
    stored = read_back(cluster, results)
    assert [m.body for m in stored] == [big, random, small]
    flags = [m.sys_flag for m in stored]
    assert flags[0] & sysflag.COMPRESSED and flags[0] & sysflag.COMPRESSION_TYPE_MASK == bits
    assert not flags[1] & sysflag.COMPRESSED and not flags[2] & sysflag.COMPRESSED
    # the consume-queue path hands the original body out too
    pulled = wait_for(lambda: pull_queue(cluster, topic, 0) or None)
    assert [m.body for m in pulled] == [big, random, small]


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda p: p.send("bad topic!", b"x"), "topic"),
        (lambda p: p.send("T", b"x" * (4 * 1024 * 1024 + 1)), "body"),
        (lambda p: p.send("T", b"x", key="has space"), "keys"),
        (lambda p: p.send("T", b"x", properties={"a": "b\x01c"}), "properties"),
        (lambda p: p.send("T", b"x", queue_id=-1), "queue_id"),
        (lambda p: p.send("T", "not bytes"), "body"),
    ],
)
def test_bad_input_is_refused_at_send_before_anything_is_queued(
    settings: ClientSettings, call: Callable[[Producer], object], field: str
) -> None:
    with Producer(settings) as p:
        with pytest.raises(InvalidArgument) as info:
            call(p)
        assert info.value.field == field and info.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert p.stats.requests == 0


def test_bad_options_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="window"):
        Producer(ClientSettings(), window=6)
    with pytest.raises(InvalidArgument, match="batch_messages"):
        Producer(ClientSettings(), batch_messages=10_001)


def test_a_request_the_store_refuses_fails_its_messages_and_the_producer_goes_on(
    settings: ClientSettings, topic: str
) -> None:
    """A producer whose limits are wider than the store's (12,000 messages a request against
    its 10,000): the store refuses the request whole, answering it in its turn on the stream,
    which goes on: the sends after it travel on the same stream (no reconnect, no retry).
    (The reserved MQS_PSEQ property, the other way a caller's input could cause that, is
    refused at the call now.)"""
    wide = MessageLimits(batch_messages_max=20_000)
    with Producer(settings, linger_ms=10_000, batch_messages=12_000, limits=wide) as p:
        before = p.send_sync(topic, b"before")
        bad = [p.send(topic, b"x") for _ in range(12_000)]  # one request, sealed when full
        p.flush()
        good = p.send_sync(topic, b"after")
        assert (p.stats.reconnects, p.stats.retries) == (0, 0)
    with pytest.raises(InvalidArgument) as info:
        bad[0].result()
    assert "over the 10000 limit" in info.value.details and info.value.field == "batches"
    assert all(f.exception() is not None for f in bad)
    # Nothing of the refused request was stored between the two good ones.
    assert good.commit_log_offset == before.commit_log_offset + before.size
    assert p.stats.failed == 12_000


def test_a_full_disk_fails_sends_with_resource_exhausted_and_sends_resume_after(
    start: Callable[..., Running],  # noqa: F811 - the fixture imported above
) -> None:
    disk = SimDisk()
    svc = start("/store", disk=disk)
    settings = ClientSettings(commitlog=svc.target, cq=(), index=())
    with Producer(settings) as p:
        last = 0
        while last < FILE_BYTES - 2_000:
            last = p.send_sync("T", b"x" * 500, queue_id=0).commit_log_offset
        disk.capacity_bytes = disk.used_bytes() + 1_000  # room for small files, not a segment
        with pytest.raises(MessageRefused) as info:
            for _ in range(500):
                p.send_sync("T", b"x" * 500, queue_id=0)
        assert info.value.put_status == "CREATE_MAPPED_FILE_FAILED"
        assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "disk full" in str(info.value)
        disk.capacity_bytes = 1 << 40
        svc.engine._disk_full_until_ms = 0.0  # skip the rest of the store's retry window
        again = p.send_sync("T", b"x" * 500, queue_id=0)
        assert again.commit_log_offset == FILE_BYTES  # the next segment, created now


def test_sends_fail_with_unavailable_once_the_retry_timeout_passes() -> None:
    settings = ClientSettings(commitlog="127.0.0.1:1", timeout_s=1.0)  # nothing listens
    with Producer(settings, retry_timeout_s=0.5) as p:
        future = p.send("T", b"x")
        with pytest.raises(Unavailable):
            future.result(timeout=30)
        assert p.stats.failed == 1


def test_the_asyncio_producer_awaits_results_in_order(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    async def main() -> list[SendResult]:
        async with AsyncProducer(settings, linger_ms=1) as p:
            first = await p.send(topic, b"first", queue_id=0)
            rest = [p.send_nowait(topic, b"m%d" % i, queue_id=0) for i in range(100)]
            await p.flush()
            return [first, *await asyncio.gather(*rest)]

    results = asyncio.run(main())
    assert [r.queue_offset for r in results] == list(range(101))
    assert [m.body for m in read_back(cluster, results[:3])] == [b"first", b"m0", b"m1"]


@pytest.mark.slow
def test_a_kill_9_of_the_commit_log_mid_produce_loses_nothing_and_duplicates_nothing(
    fresh_cluster: Cluster, topic: str
) -> None:
    """Acknowledged under flush: sync, so every result survives; retries carry the request's
    sequence, so a request stored before the kill is answered as a duplicate, not stored
    again."""
    cluster = fresh_cluster
    total = 6_000
    results: list[SendResult] = []
    sent = threading.Event()
    with Producer(settings_for(cluster), batch_messages=200, linger_ms=1) as p:

        def produce() -> None:
            futures = []
            for i in range(total):
                futures.append(p.send(topic, b"body-%d" % i, queue_id=i % 2))
                if i == total // 3:
                    sent.set()
                if i % 200 == 0:
                    time.sleep(0.01)  # spread the sends over the restart
            results.extend(f.result(timeout=60) for f in futures)

        worker = threading.Thread(target=produce)
        worker.start()
        assert sent.wait(30)
        cluster.commitlog.kill()
        cluster.restart_commitlog()
        worker.join(90)
        assert not worker.is_alive()
        assert p.stats.reconnects >= 1 and p.stats.failed == 0

    assert len(results) == total

    def both_queues() -> list[list[Message]] | None:
        queues = [pull_queue(cluster, topic, q) for q in (0, 1)]
        return queues if sum(map(len, queues)) >= total else None

    stored = wait_for(both_queues, timeout_s=60)
    bodies = Counter(msg.body for queue in stored for msg in queue)
    assert len(bodies) == total and set(bodies.values()) == {1}, "each message exactly once"
    for q, queue in enumerate(stored):
        assert [m.body for m in queue] == [b"body-%d" % i for i in range(q, total, 2)]
    assert {r.commit_log_offset for r in results} == {
        m.commit_log_offset for queue in stored for m in queue
    }


# -- a producer id with an earlier life ---------------------------------------------------------


def _earlier_life(cluster: Cluster, producer_id: str, topic: str, sequences: range) -> None:
    """Another client (or an earlier life whose clock was ahead) stored these sequences."""
    stub = cluster.commitlog_stub()
    for seq in sequences:
        request = cl.AppendRequest(
            batches=[cl.MessageBatch(topic=topic, queue_ids=[0], bodies=[b"earlier %d" % seq])],
            producer_id=producer_id,
            sequence=seq,
        )
        assert not stub.Append(request, timeout=10).duplicate


def _acked_bodies_are_stored(cluster: Cluster, sent: list[tuple[bytes, SendResult]]) -> None:
    stored = read_back(cluster, [r for _, r in sent])
    assert [m.body for m in stored] == [body for body, _ in sent]


def test_answers_from_an_earlier_life_of_the_id_are_not_taken_as_acks(
    cluster: Cluster, topic: str
) -> None:
    """A clock stepped back between lives: the new life's first sequences are ones the store
    remembers from the earlier life. It answers them from its table (nothing stored); the
    producer sees a first attempt answered as a duplicate and sends it again, moved ahead."""
    pid = f"stale-{topic}"
    _earlier_life(cluster, pid, topic, range(1_000, 1_010))  # 1,005..1,009 remembered
    with Producer(settings_for(cluster), producer_id=pid, first_sequence=1_006) as p:
        sent = [(b"new %d" % i, p.send(topic, b"new %d" % i, queue_id=0)) for i in range(6)]
        p.flush()
        results = [(body, f.result()) for body, f in sent]
        assert p.stats.rebases >= 1 and p.stats.duplicates == 0
    _acked_bodies_are_stored(cluster, results)
    assert not any(r.duplicate for _, r in results)


def test_a_first_attempt_refused_as_behind_the_ids_last_sequence_is_moved_ahead(
    cluster: Cluster, topic: str
) -> None:
    pid = f"behind-{topic}"
    ahead = int(time.time_ns() // 1_000) + 1_000_000_000  # an earlier life 17 minutes ahead
    _earlier_life(cluster, pid, topic, range(ahead, ahead + 3))
    with Producer(settings_for(cluster), producer_id=pid) as p:
        results = [(b"m%d" % i, p.send_sync(topic, b"m%d" % i, queue_id=0)) for i in range(3)]
        assert p.stats.rebases == 1 and p.stats.failed == 0
    _acked_bodies_are_stored(cluster, results)
    queue_offsets = [r.queue_offset for _, r in results]
    assert queue_offsets == sorted(queue_offsets), "in the order sent"
