"""A Consumer of more queues than one Follow stream takes (FOLLOW_QUEUES_MAX) waits with long
polls on LONG_POLLS_MAX of them at a time (fetchers.LongPolls), against a real store: a
message in any queue arrives, watched or not."""

from __future__ import annotations

import time

import pytest

from mqstore.client.consumer import FOLLOW_QUEUES_MAX, LONG_POLLS_MAX, Consumer, Offset
from mqstore.client.settings import ClientSettings
from mqstore.testing.cluster import Cluster
from tests.client.test_consumer import put

pytestmark = pytest.mark.timeout(60)

QUEUES = FOLLOW_QUEUES_MAX + 1
# Where poll's first round starts: queue 0; the long polls then watch the next queues in
# turn (1 .. LONG_POLLS_MAX), so this one is unwatched.
UNWATCHED = QUEUES - 1
POLL_S = 10.0
# The unwatched queues are pulled again after each wait of at most UNWATCHED_WAIT_MS (1 s): a
# round of a thousand quick pulls on a loaded 2-core machine, with room to spare.
WITHIN_S = 8.0


def test_a_message_in_a_queue_no_long_poll_watches_arrives_within_seconds(
    cluster: Cluster, settings: ClientSettings, topic: str
) -> None:
    assert UNWATCHED > LONG_POLLS_MAX
    with Consumer(settings, topic, queues=range(QUEUES), start=Offset(0), long_poll_ms=5_000) as c:
        assert c.poll(timeout_s=0) == []  # every queue pulled once: all caught up
        put(cluster, topic, UNWATCHED, [b"far"])
        began = time.monotonic()
        got = c.poll(timeout_s=POLL_S)  # returns once something came
        took = time.monotonic() - began
        assert [(m.queue_id, m.body) for m in got] == [(UNWATCHED, b"far")], took
        assert not c.following and c.stats.follows == 0  # long polls, never a Follow
        assert took < WITHIN_S, took
