"""Consumer.poll hands out the messages of every queue that has some, in polls that wait out
no long poll, on a real store (found by the side-by-side benchmark, bench/peers)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqstore.client import Admin, Consumer, Offset, Producer
from mqstore.testing.cluster import Cluster, start_store

from .conftest import settings_for

QUEUES = 4
TRIALS = 3
APPLY_TIMEOUT_S = 30.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Cluster]:
    c = start_store(tmp_path / "store", flush="async")
    try:
        yield c
    finally:
        c.stop_all()


def _wait_applied(admin: Admin, topic: str, total: int) -> None:
    deadline = time.monotonic() + APPLY_TIMEOUT_S
    while sum(q.max_offset for q in admin.queues(topic)) < total:
        assert time.monotonic() < deadline, "cq_svc did not apply the messages"
        time.sleep(0.01)


def test_poll_returns_a_batch_from_every_queue_that_has_some(store: Cluster) -> None:
    settings = settings_for(store)
    topic = "fairness"
    with Producer(settings) as producer, Admin(settings) as admin:
        for q in range(QUEUES):
            producer.send_sync(topic, b"primer", queue_id=q)
        _wait_applied(admin, topic, QUEUES)
        with Consumer(settings, topic, start=Offset(1), long_poll_ms=2000) as consumer:
            assert consumer.poll(timeout_s=0) == []  # caught up on every queue
            for trial in range(TRIALS):
                for q in range(QUEUES):
                    producer.send_sync(topic, b"x", queue_id=q)
                _wait_applied(admin, topic, QUEUES * (trial + 2))
                # Every queue has one message, already applied. The Follow stream may bring a
                # queue's message a round after another's (each dispatch wakes its own
                # round), but all arrive within polls that wait for none of the 2 s long
                # polls (not one queue a poll with a long poll between).
                began = time.monotonic()
                got = consumer.poll(timeout_s=2)
                polls = 1
                while len(got) < QUEUES and time.monotonic() - began < 2:
                    got += consumer.poll(timeout_s=2)
                    polls += 1
                took = time.monotonic() - began
                assert sorted(m.queue_id for m in got) == list(range(QUEUES)), trial
                assert took < 1.0, (trial, took, polls)
                assert polls <= QUEUES, (trial, polls)
                assert consumer.poll(timeout_s=0) == []
