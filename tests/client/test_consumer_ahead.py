"""The Consumer's pulls sent ahead (poll and messages send a queue's next Pull as soon as an
answer says there is more) and its batch decoding, against a real store: every message is
handed out once, in order, wherever the walk is cut (a seek, a limit, a poll in between)."""

from __future__ import annotations

import pytest

from mqstore.client.consumer import PULLS_AHEAD_MAX, Consumer
from mqstore.client.message import Message
from mqstore.client.settings import ClientSettings
from mqstore.testing.cluster import Cluster
from tests.client.test_consumer import numbered, offsets_of, put

pytestmark = pytest.mark.timeout(60)

QUEUES = 6  # more than PULLS_AHEAD_MAX: some queues wait for a free slot
PER_QUEUE = 40
BATCH = 7  # not a divisor of PER_QUEUE: the last batch of each queue is short


def fill(cluster: Cluster, topic: str) -> dict[int, list[bytes]]:
    assert QUEUES > PULLS_AHEAD_MAX
    return {
        q: [s.body for s in put(cluster, topic, q, numbered(f"q{q}", PER_QUEUE))]
        for q in range(QUEUES)
    }


def by_queue(messages: list[Message]) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {q: [] for q in range(QUEUES)}
    for m in messages:
        out[m.queue_id].append(m.body)
    return out


def test_a_walk_with_pulls_ahead_hands_out_every_message_once_in_order(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    expected = fill(cluster, topic)
    with Consumer(settings, topic, start="earliest", max_messages=BATCH, long_poll_ms=0) as c:
        got = list(c.messages(follow=False))
        assert by_queue(got) == expected
        for q in range(QUEUES):
            assert offsets_of(got, q) == list(range(PER_QUEUE))
            assert c.position(q) == PER_QUEUE
        assert c.stats.messages == QUEUES * PER_QUEUE
        # One Pull per batch and per queue's end, give or take the ones sent ahead past it.
        assert c.stats.pulls >= QUEUES * -(-PER_QUEUE // BATCH)


def test_a_seek_mid_batch_drops_the_batch_and_the_pull_sent_ahead(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    put(cluster, topic, 0, numbered("m", 30))
    with Consumer(settings, topic, queues=[0], max_messages=5, long_poll_ms=0) as c:
        walk = c.messages(follow=False)
        assert [next(walk).queue_offset for _ in range(7)] == list(range(7))
        c.seek(0, 2)  # in the second batch, with the third one pulled ahead
        assert [m.queue_offset for m in walk] == list(range(2, 30))
        assert c.position(0) == 30


def test_poll_between_iterations_neither_repeats_nor_skips(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    put(cluster, topic, 0, numbered("m", 50))
    with Consumer(settings, topic, queues=[0], max_messages=8, long_poll_ms=0) as c:
        walk = c.messages(follow=False)
        first = [next(walk) for _ in range(3)]
        polled = c.poll(timeout_s=0)  # the rest of the batch the walk is in
        rest = list(walk)
        offsets = [m.queue_offset for m in first + polled + rest]
        assert offsets == list(range(50))
        assert c.position(0) == 50


def test_a_limit_inside_a_batch_leaves_the_position_after_the_last_handed_out(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    put(cluster, topic, 0, numbered("m", 20))
    with Consumer(settings, topic, queues=[0], max_messages=6, long_poll_ms=0) as c:
        assert [m.queue_offset for m in c.messages(follow=False, limit=9)] == list(range(9))
        assert c.position(0) == 9
        assert [m.queue_offset for m in c.messages(follow=False)] == list(range(9, 20))
