"""send_batch lingering and joining shares into one request (producer.py, batch.py), on a real
store (the module's cluster of conftest.py): each share gets its own answer, refusals and
rebases stay within their share, and the linger never holds back a caller that waits.

The tests under "regressions" each failed before the fix they pin."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from mqstore.client import (
    AsyncProducer,
    BatchNotStored,
    BatchResult,
    ClientSettings,
    Message,
    Producer,
)
from mqstore.client.errors import InvalidArgument, ResourceExhausted
from mqstore.formats import sysflag
from mqstore.limits import MessageLimits
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl
from mqstore.testing.cluster import Cluster
from tests.answers import records_of

from .conftest import settings_for
from .test_producer import _earlier_life

pytestmark = pytest.mark.timeout(120)

LINGER_FOREVER_MS = 60_000  # a linger no passing test sits through


def read_batch(cluster: Cluster, result: BatchResult) -> list[Message]:
    """A send_batch's stored messages, read from the commit log at the offsets its result
    names (every message of it stored)."""
    assert not result.errors and min(result.commit_log_offsets) >= 0
    response = cluster.commitlog_stub().Read(
        cl.ReadRequest(offsets=result.commit_log_offsets, sizes=result.sizes), timeout=10
    )
    assert list(response.statuses) == [cl.READ_OK] * len(result)
    return [Message.from_record(raw) for raw in records_of(response)]


# -- joined requests ------------------------------------------------------------------------------


def test_shares_of_alternating_topics_join_one_request_and_each_batch_gets_its_own_answer(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    """append_request makes one MessageBatch per topic (A, B, A, B: two batches, each topic's
    shares in order), pads sys_flags for shares without compressed bodies, and RequestAnswer
    cuts the store's answer per share in that order."""
    other = f"{topic}_b"
    big = b"z" * 9_000  # compressed (over compress_over_bytes)
    shares: list[tuple[str, list[bytes]]] = [
        (topic, [b"a0", big + b"a1", b"a2"]),
        (other, [b"b0", b"b1"]),
        (topic, [b"c0", big + b"c1"]),
        (other, [big + b"d0"]),
    ]
    with Producer(settings, linger_ms=LINGER_FOREVER_MS, compress_over_bytes=4_096) as p:
        futures = [p.send_batch(t, bodies, queue_id=1) for t, bodies in shares]
        assert p.stats.requests == 0
        p.flush(timeout_s=30)
        assert p.stats.requests == 1  # every share in one request
        results = [f.result() for f in futures]
    for (t, bodies), result in zip(shares, results, strict=True):
        stored = read_batch(cluster, result)
        assert [m.body for m in stored] == bodies
        assert [m.topic for m in stored] == [t] * len(bodies)
        assert [m.uniq_key for m in stored] == result.uniq_keys
        assert [bool(m.sys_flag & sysflag.COMPRESSED) for m in stored] == [
            len(b) > 4_096 for b in bodies
        ]
        assert [m.queue_offset for m in stored] == result.queue_offsets
    # Each topic's queue offsets run on across the shares joined in between.
    mine = [o for r in (results[0], results[2]) for o in r.queue_offsets]
    assert mine == list(range(mine[0], mine[0] + 5))


def test_a_message_the_store_refuses_in_a_joined_request_fails_only_its_own_batch(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    """The store numbers refusals over the whole request (every batch); each share takes its
    own (RequestAnswer.refused), numbered from its first message. A topic longer than the
    store takes (the client was told a looser limit) is refused message by message."""
    long_topic = "L" * 150  # over the store's 127 bytes for an ordinary topic
    loose = MessageLimits(topic_bytes_max=200)
    with Producer(settings, linger_ms=LINGER_FOREVER_MS, limits=loose) as p:
        before = p.send_batch(topic, [b"ok-0", b"ok-1"], queue_id=0)
        refused = p.send_batch(long_topic, [b"no-0", b"no-1", b"no-2"], queue_id=0)
        after = p.send_batch(topic, [b"ok-2"], queue_id=0)
        p.flush(timeout_s=30)
        assert p.stats.requests == 1
    with pytest.raises(BatchNotStored) as err:
        refused.result()
    assert sorted(err.value.result.errors) == [0, 1, 2]
    assert err.value.result.commit_log_offsets == [-1, -1, -1]
    ok = before.result(), after.result()
    assert [m.body for r in ok for m in read_batch(cluster, r)] == [b"ok-0", b"ok-1", b"ok-2"]
    offsets = [o for r in ok for o in r.queue_offsets]
    assert offsets == list(range(offsets[0], offsets[0] + 3))


def test_batches_lingering_and_send_sync_keep_the_order_of_the_calls(
    settings: ClientSettings, topic: str
) -> None:
    """send_sync seals what lingers before its own message; result() of a lingering batch
    (BatchFuture._wait -> Producer._hurry) sends it without the linger."""
    with Producer(settings, linger_ms=LINGER_FOREVER_MS) as p:
        first = p.send_batch(topic, [b"1", b"2"], queue_id=2)
        middle = p.send_sync(topic, b"3", queue_id=2)
        last = p.send_batch(topic, [b"4"], queue_id=2)
        assert first.done() and not last.done()
        got = last.result(timeout=20).queue_offsets
        offsets = [*first.result().queue_offsets, middle.queue_offset, *got]
    assert offsets == list(range(offsets[0], offsets[0] + 4))


def test_a_done_callback_in_the_receiver_thread_may_wait_for_a_done_batch_and_send_more(
    settings: ClientSettings, topic: str
) -> None:
    """_finish resolves futures outside the producer's lock: a callback (the receiver's
    thread) that calls result() (BatchFuture._wait -> _hurry takes the lock) and sends again
    does not deadlock."""
    seen: list[object] = []
    done = threading.Event()
    with Producer(settings, linger_ms=LINGER_FOREVER_MS) as p:

        def callback(future: object) -> None:
            assert isinstance(future, type(first))
            seen.append(len(future.result(timeout=5)))
            seen.append(p.send_batch(topic, [b"from the callback"]))
            done.set()

        first = p.send_batch(topic, [b"a", b"b"])
        first.add_done_callback(callback)
        p.flush(timeout_s=30)
        assert done.wait(20)
        again = seen[1]
        assert isinstance(again, type(first))
        assert len(again.result(timeout=20)) == 1
    assert seen[0] == 2


def test_a_joined_request_answered_from_an_earlier_life_is_moved_ahead_and_stored_once(
    cluster: Cluster, topic: str
) -> None:
    """_stale / _rebase with a request of several shares: the first attempt is answered from
    the earlier life's table (nothing stored), so it goes again under a new sequence, and
    every share's result is where its messages are."""
    pid = f"stale-joined-{topic}"
    _earlier_life(cluster, pid, topic, range(2_000, 2_010))  # 2,005..2,009 remembered
    with Producer(
        settings_for(cluster),
        producer_id=pid,
        first_sequence=2_007,
        linger_ms=LINGER_FOREVER_MS,
        batch_messages=6,
    ) as p:
        futures = [p.send_batch(topic, [b"s%d-%d" % (s, i) for i in range(2)]) for s in range(6)]
        p.flush(timeout_s=30)
        results = [f.result() for f in futures]
        assert p.stats.rebases >= 1 and p.stats.failed == 0
    stored = [m.body for r in results for m in read_batch(cluster, r)]
    assert stored == [b"s%d-%d" % (s, i) for s in range(6) for i in range(2)]
    assert not any(r.duplicate for r in results)


# -- regressions: refused at the call, and no wait on the linger ---------------------------


def test_a_batch_the_store_refuses_whole_does_not_fail_the_batches_joined_to_it(
    settings: ClientSettings, topic: str
) -> None:
    """The one request-level refusal a caller's input could cause (the reserved MQS_PSEQ
    property) is refused at the call, so it never reaches a request other batches joined."""
    with Producer(settings, linger_ms=LINGER_FOREVER_MS) as p:
        good = p.send_batch(topic, [b"good"])
        with pytest.raises(InvalidArgument) as refused:
            p.send_batch(topic, [b"bad"], properties={"MQS_PSEQ": "forged"})
        with pytest.raises(InvalidArgument):
            p.send(topic, b"bad too", properties={"MQS_PSEQ": "forged"})
        p.flush(timeout_s=30)
    assert refused.value.field == "properties"
    assert len(good.result()) == 1 and not good.result().errors


def test_the_stores_record_crc_property_is_refused_at_the_call_too(
    settings: ClientSettings, topic: str
) -> None:
    """__CRC32# (the whole-record CRC the store ends each record with) is the store's as
    MQS_PSEQ is: refused at the call, before a request other batches join."""
    with Producer(settings, linger_ms=LINGER_FOREVER_MS) as p:
        good = p.send_batch(topic, [b"good"])
        with pytest.raises(InvalidArgument) as refused:
            p.send_batch(topic, [b"bad"], properties={"__CRC32#": "1234567890"})
        with pytest.raises(InvalidArgument):
            p.send(topic, b"bad too", properties={"__CRC32#": "1234567890"})
        p.flush(timeout_s=30)
    assert refused.value.field == "properties" and "__CRC32#" in str(refused.value)
    assert len(good.result()) == 1 and not good.result().errors


def test_a_send_batch_blocked_on_a_full_buffer_does_not_wait_out_the_linger(
    settings: ClientSettings, topic: str
) -> None:
    with Producer(
        settings, linger_ms=LINGER_FOREVER_MS, buffer_bytes=1_500, block_timeout_s=1.0
    ) as p:
        first = p.send_batch(topic, [b"x" * 1_000])  # lingers, holding 1,000+ of 1,500 bytes
        try:
            second = p.send_batch(topic, [b"y" * 1_000])  # needs the first's room
        except ResourceExhausted:
            pytest.fail("the buffer was held by a lingering batch nobody would send")
        assert len(second.result(timeout=20)) == 1 and len(first.result(timeout=20)) == 1


def test_a_joined_batch_s_messages_are_not_born_before_their_send_batch_call(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    with Producer(settings, linger_ms=LINGER_FOREVER_MS) as p:
        p.send_batch(topic, [b"early"], queue_id=3)
        time.sleep(0.5)
        called_ms = time.time_ns() // 1_000_000
        late = p.send_batch(topic, [b"late"], queue_id=3)
        p.flush(timeout_s=30)
    (stored,) = read_batch(cluster, late.result())
    assert stored.born_timestamp_ms >= called_ms  # ~500 ms before it: the first share's


def test_awaiting_an_async_send_batch_sends_it_without_the_linger(
    settings: ClientSettings, topic: str
) -> None:
    async def main() -> BatchResult | None:
        async with AsyncProducer(settings, linger_ms=LINGER_FOREVER_MS) as p:
            try:
                return await asyncio.wait_for(p.send_batch(topic, [b"awaited"]), 3)
            except TimeoutError:
                return None  # still lingering; the close flushes it

    result = asyncio.run(main())
    assert result is not None and len(result) == 1
