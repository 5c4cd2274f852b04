"""A caught-up Consumer follows its queues on ONE cq_svc Follow stream (mqstore/client/follow.py,
Consumer._fill_once and fetchers.Follower), against real service processes.

What is observable from outside the client is cq_svc's metrics port: the gauge
mqstore_cq_long_polls_waiting (a Follow holds one waiter for as long as it is open, a unary
long poll one per queue), grpc_server_handled_total by method (a Follow is counted when it
ends) and mqstore_rpc_streams_refused_total (Follow streams past follow_streams_max). Messages
go in through the commit log's Append (tests/e2e/support.py), from a thread of their own where
the consumer is meant to be waiting when they come. Every test checks each queue's messages
arrive exactly once, in order.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mqstore.client.consumer import Consumer
from mqstore.client.follow import FollowStream
from mqstore.client.message import Message
from mqstore.client.settings import ClientSettings
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as cqpb
from mqstore.testing.cluster import Cluster, start_store
from tests.client.conftest import settings_for
from tests.e2e.support import CALL_TIMEOUT_S, append, eventually

pytestmark = pytest.mark.timeout(60)

WAITING = "mqstore_cq_long_polls_waiting"
REFUSED = "mqstore_rpc_streams_refused_total"
HANDLED = "grpc_server_handled_total"
FOLLOW_THREAD = "mqstore-follow"  # the reader thread's name (follow.py)


# -- helpers --------------------------------------------------------------------------------------


def scrape(cluster: Cluster) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """cq_svc's metrics: (sample name, sorted labels) -> value."""
    url = f"http://127.0.0.1:{cluster.followers['cq'].ports['metrics_port']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def waiting(cluster: Cluster) -> float:
    return scrape(cluster)[(WAITING, ())]


def refused(cluster: Cluster) -> float:
    """Follow streams cq_svc refused: every one was taken."""
    return sum(
        value
        for (name, labels), value in scrape(cluster).items()
        if name == REFUSED and ("grpc_method", "Follow") in labels
    )


def follows_ended(cluster: Cluster) -> float:
    """Follow calls cq_svc has finished, whatever their status."""
    return sum(
        value
        for (name, labels), value in scrape(cluster).items()
        if name == HANDLED and ("grpc_method", "Follow") in labels
    )


def follow_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == FOLLOW_THREAD and t.is_alive()]


def nobody_waits(cluster: Cluster) -> None:
    """What earlier tests opened is closed: a count taken now belongs to this test."""
    eventually(lambda: waiting(cluster) == 0, timeout_s=10)


def produce(
    cluster: Cluster, topic: str, queue_ids: list[int], prefix: str, tags: str = ""
) -> dict[int, list[bytes]]:
    """One Append of a message to each of `queue_ids` (in that order); the bodies per queue."""
    bodies = [f"{prefix}-{i}-q{q}".encode() for i, q in enumerate(queue_ids)]
    append(cluster.commitlog_stub(), topic, queue_ids, bodies, tags=tags)
    out: dict[int, list[bytes]] = {}
    for q, body in zip(queue_ids, bodies, strict=True):
        out.setdefault(q, []).append(body)
    return out


def merge(into: dict[int, list[bytes]], more: dict[int, list[bytes]]) -> None:
    for q, bodies in more.items():
        into.setdefault(q, []).extend(bodies)


def wait_dispatched(cluster: Cluster, topic: str, ends: dict[int, int]) -> None:
    stub = cluster.cq_stub("cq")

    def there() -> bool:
        listed = stub.ListQueues(cqpb.ListQueuesRequest(topic=topic), timeout=CALL_TIMEOUT_S)
        have = {i.queue_id: i.max_offset for i in listed.queues}
        return all(have.get(q, 0) >= n for q, n in ends.items())

    eventually(there)


def seed(cluster: Cluster, topic: str, queues: int, per_queue: int) -> dict[int, list[bytes]]:
    """`per_queue` messages in each of queues 0..queues-1, dispatched."""
    got: dict[int, list[bytes]] = {}
    for i in range(per_queue):
        merge(got, produce(cluster, topic, list(range(queues)), f"seed{i}"))
    wait_dispatched(cluster, topic, {q: per_queue for q in range(queues)})
    return got


class Later(threading.Thread):
    """Runs `work` on a thread of its own after `delay_s`; join_ok re-raises what it raised."""

    def __init__(self, work: Callable[[], object], delay_s: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.work = work
        self.delay_s = delay_s
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            time.sleep(self.delay_s)
            self.work()
        except BaseException as exc:
            self.error = exc

    def join_ok(self) -> None:
        self.join(30)
        assert not self.is_alive(), "the producing thread did not finish"
        if self.error is not None:
            raise self.error


def poll_until(
    c: Consumer,
    n: int,
    *,
    timeout_s: float = 15.0,
    each_s: float = 0.5,
    after: Callable[[], None] | None = None,
) -> list[Message]:
    """poll() until `n` messages came (or the time is up), then one more short poll that must
    add nothing (a duplicate would show there). `after` runs after every poll."""
    got: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got += c.poll(timeout_s=each_s)
        if after is not None:
            after()
    got += c.poll(timeout_s=0.2)
    return got


def by_queue(messages: list[Message]) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {}
    for m in messages:
        out.setdefault(m.queue_id, []).append(m.body)
    return out


def check_in_order(messages: list[Message], first: dict[int, int]) -> None:
    """Each queue's offsets are consecutive from first[q]: nothing skipped, nothing twice."""
    for q in {m.queue_id for m in messages}:
        offsets = [m.queue_offset for m in messages if m.queue_id == q]
        assert offsets == list(range(first[q], first[q] + len(offsets))), (q, offsets)


def caught_up(cluster: Cluster, c: Consumer, n: int) -> list[Message]:
    """Read the `n` seeded messages, then wait until the consumer follows (one waiter)."""
    got = poll_until(c, n)
    assert len(got) == n
    assert c.poll(timeout_s=0.3) == []
    eventually(lambda: waiting(cluster) == 1, timeout_s=10)
    return got


@pytest.fixture
def short_follow_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Follow streams of at most two answers: consumption crosses many stream ends."""
    c = start_store(tmp_path / "store", extra={"cq_svc": ["--follow-batches-max", "2"]})
    try:
        yield c
    finally:
        c.stop_all()


@pytest.fixture(scope="module")
def one_waiter_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A cq_svc that lets one follow stream run at a time: a second consumer's is refused."""
    c = start_store(
        tmp_path_factory.mktemp("one_waiter"), extra={"cq_svc": ["--follow-streams-max", "1"]}
    )
    try:
        yield c
    finally:
        c.stop_all()


# -- one stream instead of a long poll per queue --------------------------------------------------


def test_a_caught_up_consumer_waits_on_one_follow_and_gets_what_comes_once_in_order(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    nobody_waits(cluster)
    seeded = seed(cluster, topic, 4, 2)
    with Consumer(settings, topic, start="earliest") as c:
        caught_up(cluster, c, 8)
        seen_waiting: list[float] = []
        sent: dict[int, list[bytes]] = {}

        def later() -> None:
            # While poll() below waits: one waiter for the four queues (a long poll per
            # queue would be four).
            seen_waiting.append(waiting(cluster))
            for i in range(5):
                merge(sent, produce(cluster, topic, [0, 1, 2, 3, 2, 0], f"new{i}"))
                time.sleep(0.02)

        follow = c._follower.stream
        assert follow is not None and follow.queue_ids == [0, 1, 2, 3]
        producer = Later(later, delay_s=0.3)
        got = poll_until(c, 30)
        producer.join_ok()
        assert seen_waiting == [1.0]
        assert by_queue(got) == sent
        check_in_order(got, {q: len(b) for q, b in seeded.items()})
        assert c._follower.stream is follow  # nothing invalidated it
        assert waiting(cluster) == 1


def test_many_polls_over_bursts_ride_one_follow(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    nobody_waits(cluster)
    seeded = seed(cluster, topic, 3, 1)
    with Consumer(settings, topic, start="earliest") as c:
        caught_up(cluster, c, 3)
        follow = c._follower.stream
        assert follow is not None
        ended_before = follows_ended(cluster)
        sent: dict[int, list[bytes]] = {}

        def bursts() -> None:
            for burst in range(5):
                for i in range(4):
                    merge(sent, produce(cluster, topic, [0, 1, 2, 0, 2], f"b{burst}.{i}"))
                time.sleep(0.25)

        followed: set[int] = set()

        def note() -> None:
            followed.add(id(c._follower.stream))

        producer = Later(bursts, delay_s=0.1)
        got = poll_until(c, 100, each_s=0.2, after=note)
        producer.join_ok()
        assert by_queue(got) == sent
        check_in_order(got, {q: len(b) for q, b in seeded.items()})
        assert followed == {id(follow)}  # the same stream across every poll
        assert c._follower.stream is follow
        assert follows_ended(cluster) == ended_before
        assert waiting(cluster) == 1


def test_seek_while_following_reads_from_the_new_position_not_the_old_streams_buffer(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    nobody_waits(cluster)
    seed(cluster, topic, 2, 10)
    with Consumer(settings, topic, queues=[0, 1], start="earliest") as c:
        caught_up(cluster, c, 20)
        old = c._follower.stream
        assert old is not None
        sent = produce(cluster, topic, [0] * 5, "more")
        wait_dispatched(cluster, topic, {0: 15})
        # The old stream has read its answer (offsets 10..14 of queue 0) into its buffer.
        eventually(lambda: not old._answers.empty(), timeout_s=10)
        c.seek(0, 3)
        got = poll_until(c, 12)
        assert [m.queue_offset for m in got] == list(range(3, 15))
        assert {m.queue_id for m in got} == {0}
        assert [m.body for m in got][-5:] == sent[0]
        assert c.position(0) == 15
        # The old stream is closed (its thread ends); a new one follows from the new place.
        old._thread.join(5)
        assert not old._thread.is_alive()
        assert c.poll(timeout_s=0.3) == []
        new = c._follower.stream
        assert new is not None and new is not old
        assert new.expected == {0: 15, 1: 10}

        # seek_to_end: what was there is not read again; what comes after is.
        c.seek(1, 0)
        c.seek_to_end()
        assert c.poll(timeout_s=0.3) == []
        later = Later(lambda: produce(cluster, topic, [1, 1], "tail"))
        got = poll_until(c, 2)
        later.join_ok()
        assert [(m.queue_id, m.queue_offset) for m in got] == [(1, 10), (1, 11)]
        assert [m.body for m in got] == [b"tail-0-q1", b"tail-1-q1"]


def test_consumption_continues_across_many_follow_stream_ends(
    short_follow_cluster: Cluster, topic: str
) -> None:
    cluster = short_follow_cluster
    seeded = seed(cluster, topic, 4, 1)
    with Consumer(settings_for(cluster), topic, start="earliest", max_messages=16) as c:
        caught_up(cluster, c, 4)
        sent: dict[int, list[bytes]] = {}

        def trickle() -> None:
            for i in range(30):
                merge(sent, produce(cluster, topic, [i % 4, (i + 1) % 4, i % 4], f"t{i}"))
                time.sleep(0.03)

        producer = Later(trickle, delay_s=0.1)
        got = poll_until(c, 90, timeout_s=30, each_s=0.3)
        producer.join_ok()
        assert by_queue(got) == sent
        check_in_order(got, {q: len(b) for q, b in seeded.items()})
        # The streams really ended under the consumer (two answers each), many times over.
        assert follows_ended(cluster) >= 10
        assert c.stats.skipped == {}


# -- a follow refused, or not used ----------------------------------------------------------------


def _hold_the_only_waiter(cluster: Cluster, topic: str) -> Consumer:
    """A consumer of `topic`, caught up and following: it holds cq_svc's one follow stream."""
    seed(cluster, topic, 1, 1)
    holder = Consumer(settings_for(cluster), topic, start="earliest")
    try:
        caught_up(cluster, holder, 1)
    except BaseException:
        holder.close()
        raise
    return holder


def test_a_refused_follow_pulls_instead_and_follows_once_a_stream_is_free(
    one_waiter_cluster: Cluster,
) -> None:
    """Issue 23, item 4: past follow_streams_max a follow is refused before it answers
    anything; the consumer pulls instead (its messages arrive meanwhile), tries to follow
    again after a pause, and follows once a stream is free."""
    cluster = one_waiter_cluster
    nobody_waits(cluster)
    holder = _hold_the_only_waiter(cluster, "follow_holder_a")
    try:
        seeded = seed(cluster, "follow_refused_b", 2, 1)
        with Consumer(settings_for(cluster), "follow_refused_b", start="earliest") as c:
            assert len(poll_until(c, 2)) == 2
            refused_before = refused(cluster)
            sent = produce(cluster, "follow_refused_b", [0, 1, 1, 0, 1], "b")
            wait_dispatched(cluster, "follow_refused_b", {0: 3, 1: 4})
            # The follow is refused, and tried again after a pause: more than once, while
            # the messages arrive by pulls.
            got: list[Message] = []
            deadline = time.monotonic() + 10
            while refused(cluster) < refused_before + 2 and time.monotonic() < deadline:
                got += c.poll(timeout_s=0.3)
            assert refused(cluster) >= refused_before + 2
            got += poll_until(c, 5 - len(got))
            assert by_queue(got) == sent
            check_in_order(got, {q: len(b) for q, b in seeded.items()})
            holder.close()
            more = produce(cluster, "follow_refused_b", [1, 0], "c")
            assert by_queue(poll_until(c, 2)) == more
            eventually(lambda: waiting(cluster) == 1, timeout_s=5)  # now it follows itself
    finally:
        holder.close()


def test_messages_already_stored_arrive_while_another_consumer_holds_every_follow_stream(
    one_waiter_cluster: Cluster,
) -> None:
    cluster = one_waiter_cluster
    nobody_waits(cluster)
    holder = _hold_the_only_waiter(cluster, "follow_holder_c")
    try:
        seed(cluster, "follow_starved_d", 2, 1)
        with Consumer(settings_for(cluster), "follow_starved_d", start="earliest") as c:
            assert len(poll_until(c, 2)) == 2
            sent = produce(cluster, "follow_starved_d", [0, 1, 1], "d")
            wait_dispatched(cluster, "follow_starved_d", {0: 2, 1: 3})
            got = poll_until(c, 3, timeout_s=3)
            assert waiting(cluster) == 1  # the holder still follows
            assert by_queue(got) == sent
    finally:
        holder.close()


def test_without_long_polls_no_follow_is_opened_and_messages_still_arrive(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    nobody_waits(cluster)
    seeded = seed(cluster, topic, 2, 1)
    ended_before = follows_ended(cluster)
    with Consumer(settings, topic, start="earliest", long_poll_ms=0) as c:
        assert len(poll_until(c, 2)) == 2
        sent: dict[int, list[bytes]] = {}
        never: list[float] = []

        def later() -> None:
            never.append(waiting(cluster))
            merge(sent, produce(cluster, topic, [1, 0, 1], "x"))

        producer = Later(later, delay_s=0.3)
        got = poll_until(c, 3, each_s=0.5)
        producer.join_ok()
        assert never == [0.0]
        assert c._follower.stream is None
        assert by_queue(got) == sent
        check_in_order(got, {q: len(b) for q, b in seeded.items()})
    assert follows_ended(cluster) == ended_before


# -- close, new queues, tags ----------------------------------------------------------------------


def test_close_cancels_the_follow_on_the_server_and_ends_its_reader_thread(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    nobody_waits(cluster)
    seed(cluster, topic, 3, 1)
    c = Consumer(settings, topic, start="earliest")
    try:
        caught_up(cluster, c, 3)
        follow = c._follower.stream
        assert follow is not None
        reader = follow._thread
        assert reader.is_alive() and reader in follow_threads()
        ended_before = follows_ended(cluster)
    finally:
        c.close()
    # close() returns once the reader has: nothing of the consumer is left inside gRPC.
    assert not reader.is_alive() and not follow_threads()
    # The server's stream would otherwise wait out long_poll_ms (20 s) before it ends.
    eventually(lambda: waiting(cluster) == 0, timeout_s=5)
    eventually(lambda: follows_ended(cluster) == ended_before + 1, timeout_s=5)
    assert c._follower.stream is None


def test_a_queue_that_appears_while_following_is_followed_too(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    nobody_waits(cluster)
    seed(cluster, topic, 2, 1)
    with Consumer(settings, topic, start="earliest", queue_refresh_interval_s=0.2) as c:
        caught_up(cluster, c, 2)
        old = c._follower.stream
        assert old is not None and old.queue_ids == [0, 1]
        sent: dict[int, list[bytes]] = {}

        def following_queue_2() -> bool:
            current = c._follower.stream
            return current is not None and current is not old and 2 in current.queue_ids

        def later() -> None:
            merge(sent, produce(cluster, topic, [2, 2, 2], "new"))
            eventually(following_queue_2, timeout_s=10)
            merge(sent, produce(cluster, topic, [2, 0, 2, 1], "after"))

        producer = Later(later, delay_s=0.3)
        got = poll_until(c, 7, each_s=0.3)
        producer.join_ok()
        assert by_queue(got) == sent
        check_in_order(got, {0: 1, 1: 1, 2: 0})
        assert c.assignment() == [0, 1, 2]
        new = c._follower.stream
        assert isinstance(new, FollowStream) and new is not old
        assert new.queue_ids == [0, 1, 2]
        assert waiting(cluster) == 1


def test_a_consumer_with_tags_follows_and_gets_only_matching_messages(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    nobody_waits(cluster)
    append(cluster.commitlog_stub(), topic, [0, 1], [b"s0", b"s1"], tags="keep")
    wait_dispatched(cluster, topic, {0: 1, 1: 1})
    with Consumer(settings, topic, start="earliest", tags="keep || also") as c:
        caught_up(cluster, c, 2)
        assert c._follower.stream is not None
        sent: dict[int, list[bytes]] = {}

        def later() -> None:
            produce(cluster, topic, [0, 0, 1], "drop0", tags="drop")
            merge(sent, produce(cluster, topic, [0, 1, 1], "keep1", tags="keep"))
            produce(cluster, topic, [1, 1, 1, 0], "drop2", tags="other")
            time.sleep(0.1)
            produce(cluster, topic, [0, 1], "drop3", tags="drop")
            merge(sent, produce(cluster, topic, [1, 0], "also4", tags="also"))

        producer = Later(later, delay_s=0.3)
        got = poll_until(c, 5)
        producer.join_ok()
        assert by_queue(got) == sent
        assert {m.tags for m in got} == {"keep", "also"}
        for q in (0, 1):
            offsets = [m.queue_offset for m in got if m.queue_id == q]
            assert offsets == sorted(set(offsets))  # in order, none twice
        assert c._follower.stream is not None
        assert waiting(cluster) == 1
