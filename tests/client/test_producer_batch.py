"""Producer.send_batch against real services: columns in, columns out, split into shares,
in order with send(), bad input refused before anything is queued, failures reported per
message, and retries across a kill -9 of the commit log that store nothing twice."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import struct
import threading
import time
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore.client import (
    Admin,
    AsyncProducer,
    BatchNotStored,
    BatchResult,
    ClientSettings,
    Producer,
)
from mqstore.client.batch import (
    BatchFuture,
    BatchShare,
    PreparedBatch,
    RequestAnswer,
    StoreAnswer,
    _queue_runs,
)
from mqstore.client.errors import InvalidArgument, MessageRefused, ResourceExhausted, Unavailable
from mqstore.formats import sysflag
from mqstore.formats._core import uniq_properties
from mqstore.formats.javahash import java_string_hash
from mqstore.formats.msgid import UniqIdGenerator
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl
from mqstore.testing.cluster import Cluster

from .conftest import settings_for
from .test_producer import pull_queue, read_back, wait_for

pytestmark = pytest.mark.timeout(180)


def test_a_batch_is_stored_with_its_tags_keys_properties_and_a_unique_id_each(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    bodies = [b"order-%d" % i for i in range(300)]
    keys = [f"k{i}" for i in range(300)]
    with Producer(settings, queues_per_topic=4) as p:
        result = p.send_batch(
            topic, bodies, keys=keys, tags="paid", properties={"region": "eu"}
        ).result(timeout=30)
    assert isinstance(result, BatchResult) and len(result) == 300 and not result.errors
    assert result.queue_ids == [abs(java_string_hash(k)) % 4 for k in keys]
    assert len(set(result.uniq_keys)) == 300
    assert min(result.commit_log_offsets) >= 0
    stored = read_back(cluster, _as_send_results(result))
    assert [m.body for m in stored] == bodies
    for m, key, uniq, queue_id in zip(
        stored, keys, result.uniq_keys, result.queue_ids, strict=True
    ):
        assert (m.tags, m.keys, m.uniq_key, m.queue_id) == ("paid", [key], uniq, queue_id)
        assert m.properties["region"] == "eu"
    # Queue offsets are dense per queue, in the order of the bodies.
    for q in set(result.queue_ids):
        mine = [
            o for o, qid in zip(result.queue_offsets, result.queue_ids, strict=True) if qid == q
        ]
        assert mine == list(range(mine[0], mine[0] + len(mine)))
    with Admin(settings) as admin:
        found = wait_for(lambda: admin.query_by_key(topic, "k7") or None)
        assert [m.body for m in found] == [b"order-7"]
        assert admin.get_message(result.msg_ids[9]).body == b"order-9"


def _as_send_results(result: BatchResult) -> list:  # type: ignore[type-arg]
    """Just what read_back needs of each message: its offset and size."""

    class At:
        def __init__(self, offset: int, size: int) -> None:
            self.commit_log_offset, self.size = offset, size

    return [At(o, s) for o, s in zip(result.commit_log_offsets, result.sizes, strict=True)]


def test_a_large_batch_is_split_into_shares_and_queues_get_contiguous_runs(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    bodies = [b"m%04d" % i for i in range(1_050)]
    with Producer(settings, batch_messages=200, queues_per_topic=3) as p:
        result = p.send_batch(topic, bodies).result(timeout=30)
        assert p.stats.requests >= 6  # 1,050 / 200 -> 6 shares
        assert p.stats.sent == 1_050
    # Without keys or a queue id, each queue takes one contiguous run of the bodies.
    runs = [q for i, q in enumerate(result.queue_ids) if i == 0 or q != result.queue_ids[i - 1]]
    assert len(runs) == 3 and sorted(runs) == sorted(set(runs))
    got = wait_for(
        lambda: (
            queues
            if sum(map(len, queues := [pull_queue(cluster, topic, q) for q in range(3)])) == 1_050
            else None
        )
    )
    assert [m.body for queue in got for m in queue] == bodies


def test_send_batch_keeps_order_with_send_and_compresses_large_bodies(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    big = b"x" * 10_000
    with Producer(settings, linger_ms=500, compress_over_bytes=4_096) as p:
        first = p.send(topic, b"before", queue_id=0)
        batch = p.send_batch(topic, [b"a", big, b"c"], queue_id=0)
        last = p.send(topic, b"after", queue_id=0)
        p.flush()
        offsets = [first.result().queue_offset, *batch.result().queue_offsets]
        offsets.append(last.result().queue_offset)
    assert offsets == list(range(offsets[0], offsets[0] + 5))
    stored = wait_for(lambda: got if len(got := pull_queue(cluster, topic, 0)) >= 5 else None)
    assert [m.body for m in stored] == [b"before", b"a", big, b"c", b"after"]
    assert stored[2].sys_flag & sysflag.COMPRESSED
    assert not stored[1].sys_flag & sysflag.COMPRESSED


def bodies(i: int) -> list[bytes]:
    """Three bodies for share i; share 2's second is large enough to be compressed."""
    return [b"y" * 10_000 if (i, j) == (2, 1) else b"b%d-%d" % (i, j) for j in range(3)]


def test_small_batches_linger_and_go_as_one_request_in_order(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    """A caller sending a few messages at a time (a paced producer's tick) makes one request
    per linger, not one per call: the shares join, send()'s one-message shares among them, in
    call order, and each call's result is its own slice of the answer."""
    # bodies(2) holds a body to compress: a SYSFLAG in a share joined to shares without any.
    with Producer(settings, linger_ms=60_000, compress_over_bytes=4_096) as p:
        batches = [p.send_batch(topic, bodies(i), queue_id=0) for i in range(5)]
        single = p.send(topic, b"single", queue_id=0)
        after = p.send_batch(topic, [b"after-0", b"after-1"], queue_id=0)
        assert p.stats.requests == 0 and not any(b.done() for b in batches)
        p.flush(timeout_s=30)
        # The five batches, send()'s message and the last batch: one request.
        assert p.stats.requests == 1
        results = [b.result() for b in batches]
        offsets = [o for r in results for o in r.queue_offsets]
        offsets += [single.result().queue_offset, *after.result().queue_offsets]
    assert offsets == list(range(offsets[0], offsets[0] + 18))
    assert [len(r) for r in results] == [3] * 5
    assert len({u for r in results for u in r.uniq_keys}) == 15
    stored = wait_for(lambda: got if len(got := pull_queue(cluster, topic, 0)) >= 18 else None)
    assert [m.body for m in stored] == [
        *(body for i in range(5) for body in bodies(i)),
        b"single",
        b"after-0",
        b"after-1",
    ]
    assert [bool(m.sys_flag & sysflag.COMPRESSED) for m in stored] == [i == 7 for i in range(18)]
    assert [m.uniq_key for m in stored[:15]] == [u for r in results for u in r.uniq_keys]


def test_a_lone_small_batch_goes_after_its_linger_with_nobody_waiting_for_it(
    settings: ClientSettings, topic: str
) -> None:
    """The sender wakes for the linger of a share that opens a request (only for that one:
    shares joining it wake nobody). Without the wake it would sleep out its idle wait (1 s)."""
    with Producer(settings, linger_ms=20) as p:
        for _ in range(3):
            p.send_sync(topic, b"before")  # the sender has just woken, then idles
            began = time.monotonic()
            lone = p.send_batch(topic, [b"lone"])
            joined = p.send_batch(topic, [b"joined"])
            while not (lone.done() and joined.done()) and time.monotonic() - began < 5:
                time.sleep(0.005)  # done() waits for nothing: result() would hurry it
            assert time.monotonic() - began < 0.6
            assert p.stats.requests % 2 == 0  # send_sync's request, then one for both shares


def test_waiting_for_a_lingering_batch_sends_it_and_a_full_one_never_lingers(
    settings: ClientSettings, topic: str
) -> None:
    with Producer(settings, linger_ms=60_000, batch_messages=10) as p:
        # result() sends what still lingers: no 60 s wait.
        assert len(p.send_batch(topic, [b"a", b"b"]).result(timeout=20)) == 2
        # A batch that fills a request goes at once, with nobody waiting for it.
        full = p.send_batch(topic, [b"x"] * 10)
        wait_for(lambda: full.done() or None)
        assert not full.result().errors
        # Shares join until a request is full; the one that would overfill it starts the next.
        joined = [p.send_batch(topic, [b"y"] * 4) for _ in range(3)]
        wait_for(lambda: joined[0].done() or None)
        assert joined[1].done() and not joined[2].done()
        assert p.stats.requests == 3
    assert joined[2].done()


def test_a_joined_request_s_answer_is_cut_into_each_batch_s_own() -> None:
    """RequestAnswer and BatchShare.take: each share's slice of every column, refusals
    renumbered from its first message, and an answer of the wrong length an error for every
    message of every share."""

    def share(n: int) -> BatchShare:
        empty = BatchResult("t", [0] * n, [""] * n, [-1] * n, [-1] * n, [0] * n, [0] * n)
        prepared = PreparedBatch("t", [0] * n, [b""] * n, [b""] * n, [], [""] * n, [(0, n, 0)])
        return BatchShare(BatchFuture(empty, 1), prepared, 0, n, 0)

    def answer_each(shares: list[BatchShare], answer: RequestAnswer) -> list[BatchResult]:
        at = 0
        for s in shares:
            s.take(answer, at)
            at += s.count
        out = []
        for s in shares:
            error = s.future.exception()
            out.append(error.result if isinstance(error, BatchNotStored) else s.future.result())
        return out

    ok, refused = cl.PutStatus.Value("PUT_OK"), cl.PutStatus.Value("MESSAGE_ILLEGAL")
    answer = cl.AppendResponse(
        statuses=[ok, ok, ok, refused, ok, ok],
        commit_log_offsets=[10, 20, 30, -1, 50, 60],
        sizes=[1, 2, 3, 0, 5, 6],
        queue_offsets=[0, 1, 2, -1, 3, 4],
        store_timestamp_ms=7,
        store_host=b"host",
    )
    answer.refusals.add(index=3, status=refused, reason="too long", field="topic")
    read = StoreAnswer.read(answer.SerializeToString())  # as the producer takes it
    got = answer_each([share(n) for n in (2, 3, 1)], RequestAnswer.of(read, 6))
    assert [r.commit_log_offsets for r in got] == [[10, 20], [30, -1, 50], [60]]
    assert [r.queue_offsets for r in got] == [[0, 1], [2, -1, 3], [4]]
    assert [r.sizes for r in got] == [[1, 2], [3, 0, 5], [6]]
    assert [(r.store_timestamps_ms, r.store_host) for r in got] == [
        ([7, 7], b"host"),
        ([7, 7, 7], b"host"),
        ([7], b"host"),
    ]
    assert [
        [(i, e.details, e.field) for i, e in r.errors.items() if isinstance(e, MessageRefused)]
        for r in got
    ] == [[], [(1, "too long", "topic")], []]
    assert got[1].errors[1].index == 1
    short = cl.AppendResponse(statuses=[ok] * 5, commit_log_offsets=[1] * 5)
    got = answer_each(
        [share(n) for n in (2, 3, 1)],
        RequestAnswer.of(StoreAnswer.read(short.SerializeToString()), 6),
    )
    assert [sorted(r.errors) for r in got] == [[0, 1], [0, 1, 2], [0]]
    assert all("5 results for 6" in str(e) for r in got for e in r.errors.values())


@pytest.mark.parametrize(
    ("bodies", "options", "field"),
    [
        ([], {}, "bodies"),
        (["text"], {}, "bodies"),
        ([5], {}, "bodies"),  # bytes(5) would be five zero bytes: an int is no body
        ([b"x" * (4 << 20 + 1)], {}, "bodies"),
        ([b"a", b"b"], {"keys": ["only-one"]}, "keys"),
        ([b"a"], {"keys": ["has space"]}, "keys"),
        ([b"a"], {"properties": {"UNIQ_KEY": "mine"}}, "properties"),
        ([b"a"], {"properties": {"bad": "\x01"}}, "properties"),
        ([b"a"], {"queue_id": -1}, "queue_id"),
    ],
)
def test_bad_batches_are_refused_before_anything_is_queued(
    settings: ClientSettings, topic: str, bodies: list, options: dict, field: str
) -> None:
    with Producer(settings) as p:
        with pytest.raises(InvalidArgument) as err:
            p.send_batch(topic, bodies, **options)
        assert err.value.field == field
        with pytest.raises(InvalidArgument):
            p.send_batch("bad topic!", [b"a"])
        assert p._buffered == 0 and not p._sealed
    with Admin(settings) as admin:
        assert [q.max_offset for q in admin.queues(topic)] in ([], [0] * 4)


def test_a_batch_the_store_never_takes_fails_with_every_message_listed() -> None:
    settings = ClientSettings(commitlog="127.0.0.1:1", cq=("127.0.0.1:1",), index=())
    with Producer(settings, retry_timeout_s=0.5, batch_messages=2) as p:
        future = p.send_batch("orders", [b"a", b"b", b"c"])
        with pytest.raises(BatchNotStored) as err:
            future.result(timeout=30)
        assert isinstance(err.value.result.errors[0], Unavailable)
        assert sorted(err.value.result.errors) == [0, 1, 2]
        assert err.value.result.commit_log_offsets == [-1, -1, -1]
        assert p.stats.failed == 3


def test_a_batch_the_buffer_cannot_take_fails_whole_or_lists_what_was_not_queued() -> None:
    """A full buffer (the store away) raises while nothing of the batch is queued; once shares
    are on their way, the call returns and the future lists the rest as not stored, with the
    reason, rather than raising and leaving the queued shares without a future."""
    settings = ClientSettings(commitlog="127.0.0.1:1", cq=("127.0.0.1:1",), index=())
    body = b"x" * 600
    with Producer(
        settings, buffer_bytes=1_500, block_timeout_s=0.3, retry_timeout_s=1.0, batch_messages=2
    ) as p:
        future = p.send_batch("orders", [body] * 6)  # the first 2 fit, the rest wait for room
        with pytest.raises(ResourceExhausted):  # its first share finds no room: nothing queued
            p.send_batch("orders", [body] * 2)
        with pytest.raises(BatchNotStored) as err:
            future.result(timeout=30)
        errors = err.value.result.errors
        assert sorted(errors) == list(range(6))
        assert all(isinstance(errors[i], Unavailable) for i in (0, 1))
        assert all(isinstance(errors[i], ResourceExhausted) for i in range(2, 6))
        assert p.stats.failed == 6


def test_the_asyncio_producer_sends_batches(settings: ClientSettings, topic: str) -> None:
    async def main() -> list[BatchResult]:
        async with AsyncProducer(settings) as p:
            return await asyncio.gather(
                *(p.send_batch(topic, [b"%d-%d" % (b, i) for i in range(50)]) for b in range(4))
            )

    results = asyncio.run(main())
    assert [len(r) for r in results] == [50] * 4
    assert len({o for r in results for o in r.commit_log_offsets}) == 200


@given(
    ip=st.sampled_from([b"\x7f\x00\x00\x01", bytes(range(16))]),
    instance_hash=st.integers(0, 2**31 - 1),
    now_ms=st.integers(1_600_000_000_000, 1_900_000_000_000),
    taken=st.integers(0, 70_000),
    n=st.integers(0, 300),
)
def test_unique_ids_made_in_bulk_are_the_reference_text(
    ip: bytes, instance_hash: int, now_ms: int, taken: int, n: int
) -> None:
    """The compiled ids (msgid.py) against the format written out: the prefix, the ms into
    the month and the 16-bit counter, packed and hexed, the counter wrapping at 65,536."""
    ids = UniqIdGenerator(ip, instance_hash=instance_hash, clock_ms=lambda: now_ms)
    ids.next_ids(taken)
    month = dt.datetime.fromtimestamp(now_ms / 1000, tz=dt.UTC).replace(
        day=1, hour=0, minute=0, second=0, microsecond=0
    )
    diff = now_ms - int(month.timestamp() * 1000)
    prefix = ip + struct.pack(">hi", os.getpid() & 0x7FFF, instance_hash)
    wanted = [
        (prefix + struct.pack(">IH", diff, (taken + i) & 0xFFFF)).hex().upper() for i in range(n)
    ]
    assert ids.next_ids(n) == wanted


def test_unique_ids_in_bulk_mixed_with_single_ones_are_all_distinct() -> None:
    ids = UniqIdGenerator(instance_hash=7, clock_ms=lambda: 1_700_000_000_000)
    made = [ids.next_id(), *ids.next_ids(3), ids.next_id(), *ids.next_ids(1), *ids.next_ids(0)]
    assert len(made) == 6 and len(set(made)) == 6
    assert made == UniqIdGenerator(instance_hash=7, clock_ms=lambda: 1_700_000_000_000).next_ids(6)


@given(first=st.integers(0, 40), queues=st.integers(1, 40), n=st.integers(0, 300))
def test_queue_runs_are_the_round_robin_formula(first: int, queues: int, n: int) -> None:
    expected = [(first + i * queues // max(n, 1)) % queues for i in range(n)]
    assert _queue_runs(first, queues, n) == expected


@given(prefix=st.binary(max_size=40), keys=st.lists(st.text(max_size=40), max_size=30))
def test_uniq_properties_are_those_formatted_one_by_one(prefix: bytes, keys: list[str]) -> None:
    assert uniq_properties(prefix, keys) == [b"%s%s\x02" % (prefix, u.encode()) for u in keys]


def test_uniq_properties_refuse_a_key_that_is_not_text() -> None:
    with pytest.raises(TypeError):
        uniq_properties(b"p", ["ok", b"bytes"])  # type: ignore[list-item]


def test_a_kill_9_of_the_commit_log_mid_batches_stores_every_message_once(
    fresh_cluster: Cluster, topic: str
) -> None:
    cluster = fresh_cluster
    batches, per_batch = 30, 200
    results: list[BatchResult] = []
    half = threading.Event()
    with Producer(settings_for(cluster), batch_messages=100) as p:

        def produce() -> None:
            futures = []
            for b in range(batches):
                bodies = [b"%d/%d" % (b, i) for i in range(per_batch)]
                futures.append(p.send_batch(topic, bodies, queue_id=b % 2))
                if b == batches // 3:
                    half.set()
                time.sleep(0.02)
            results.extend(f.result(timeout=90) for f in futures)

        worker = threading.Thread(target=produce)
        worker.start()
        assert half.wait(30)
        cluster.commitlog.kill()
        cluster.restart_commitlog()
        worker.join(120)
        assert not worker.is_alive()
        assert p.stats.reconnects >= 1 and p.stats.failed == 0
    total = batches * per_batch
    assert sum(map(len, results)) == total

    def stored() -> list[bytes] | None:
        bodies = [m.body for q in (0, 1) for m in pull_queue(cluster, topic, q)]
        return bodies if len(bodies) >= total else None

    counts = Counter(wait_for(stored, timeout_s=60))
    assert len(counts) == total and set(counts.values()) == {1}, "each message exactly once"
