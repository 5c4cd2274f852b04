"""A record that can never be handed out does not stall its queue (issue 23, item 3).

Two kinds, on real files behind real services:
- a body marked zlib-compressed that is not zlib, written with the commit-log engine itself
  before the services start (the append check refuses it at the door since then): the store
  serves it, the SDK cannot decode it;
- a record damaged on disk under the running store (one body byte: its CRC fails), which the
  commit log refuses as READ_CORRUPT whether cq_svc reads the segment files or the Read.

Every message before the bad record is handed out, the bad one is surfaced once as BadRecord
with its topic, queue id, queue offset and commit-log offset, and the consumer goes on after it.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqstore.client.consumer import Consumer
from mqstore.client.errors import BadRecord, DataLoss, InvalidArgument
from mqstore.client.message import Message
from tests.client.conftest import settings_for
from tests.client.test_consumer import commitlog_segment, put
from tests.e2e.poison import (
    GOOD_BODIES,
    POISON_AT,
    POISON_BODIES,
    POISONED_TOPIC,
    PoisonedStore,
    start_poisoned,
)

TOPIC = POISONED_TOPIC
BODIES = list(POISON_BODIES)
Store = PoisonedStore


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    s = start_poisoned(tmp_path_factory.mktemp("poisoned") / "store")
    try:
        yield s
    finally:
        s.cluster.stop_all()


def consumer(store: Store, **options: object) -> Consumer:
    return Consumer(settings_for(store.cluster), TOPIC, queues=[0], **options)  # type: ignore[arg-type]


def bodies(messages: list[Message]) -> list[bytes]:
    return [m.body for m in messages]


def check_bad(err: BadRecord, store: Store, queue_id: int = 0) -> None:
    assert isinstance(err, DataLoss)  # `except DataLoss` still catches it
    assert (err.topic, err.queue_id, err.queue_offset) == (TOPIC, queue_id, POISON_AT)
    assert err.commit_log_offset == store.poison_offsets[queue_id]
    assert "zlib" in err.reason and "does not decompress" in err.reason


def test_messages_hands_out_the_good_before_a_bad_record_raises_it_once_and_goes_on(
    store: Store,
) -> None:
    with consumer(store) as c:
        got: list[Message] = []
        with pytest.raises(BadRecord) as info:
            for m in c.messages(follow=False):
                got.append(m)
        assert bodies(got) == BODIES[:POISON_AT]
        check_bad(info.value, store)
        assert c.position(0) == POISON_AT + 1  # moved past it
        assert bodies(list(c.messages(follow=False))) == BODIES[POISON_AT + 1 :]
        assert c.stats.bad_records == 1


def test_poll_returns_the_good_then_raises_the_bad_record_then_the_rest(store: Store) -> None:
    with consumer(store) as c:
        assert bodies(c.poll(timeout_s=0)) == BODIES[:POISON_AT]
        with pytest.raises(BadRecord) as info:
            c.poll(timeout_s=0)
        check_bad(info.value, store)
        assert bodies(c.poll(timeout_s=0)) == BODIES[POISON_AT + 1 :]
        assert c.position(0) == len(BODIES)


def test_skip_steps_over_bad_records_counting_them(store: Store) -> None:
    """Both queues, poll_batch and messages(): never raised, every good message once."""
    with Consumer(settings_for(store.cluster), TOPIC, queues=[0, 1], on_bad_record="skip") as c:
        got: list[bytes] = []
        for _ in range(6):  # each queue: the good before, then (bad skipped) the rest
            got += c.poll_batch(timeout_s=0).bodies
        assert sorted(got) == sorted(list(GOOD_BODIES) * 2)
        assert c.stats.bad_records == 2
        assert (c.position(0), c.position(1)) == (len(BODIES), len(BODIES))
    with consumer(store, on_bad_record="skip") as c:
        assert bodies(list(c.messages(follow=False))) == list(GOOD_BODIES)


def test_a_commit_after_the_bad_record_covers_it(store: Store) -> None:
    with consumer(store, group="g-commit") as c:
        with pytest.raises(BadRecord):
            list(c.messages(follow=False))
        c.commit()
    with consumer(store, group="g-commit") as c:  # starts at the committed offset
        assert bodies(list(c.messages(follow=False))) == BODIES[POISON_AT + 1 :]


def test_a_raw_pull_lists_bad_records_and_never_raises(store: Store) -> None:
    with consumer(store) as c:
        result = c.pull(0, 0)
    assert bodies(result.messages) == list(GOOD_BODIES)
    (bad,) = result.bad_records
    check_bad(bad, store)
    assert result.next_offset == len(BODIES)


def test_receive_returns_the_good_then_raises_the_bad_delivery_settled(store: Store) -> None:
    with consumer(store, group="g-receive") as c:
        got = c.receive(0, max_messages=10, invisible_duration_ms=60_000)
        assert bodies([r.message for r in got]) == list(GOOD_BODIES)
        with pytest.raises(BadRecord) as info:
            c.receive(0, max_messages=10, invisible_duration_ms=60_000)
        check_bad(info.value, store)
        assert info.value.receipt_handle  # acknowledged when raised: never delivered again
        assert c.ack(got).committed_offsets == {0: len(BODIES)}
        assert c.receive(0, max_messages=10, invisible_duration_ms=1_000) == []


def test_bad_record_pickles_with_its_fields(store: Store) -> None:
    with consumer(store) as c:
        (bad,) = c.pull(0, 0).bad_records
    again = pickle.loads(pickle.dumps(bad))
    assert (again.queue_offset, again.commit_log_offset, str(again)) == (
        bad.queue_offset,
        bad.commit_log_offset,
        str(bad),
    )


def test_on_bad_record_takes_raise_or_skip(store: Store) -> None:
    with pytest.raises(InvalidArgument) as info:
        consumer(store, on_bad_record="ignore")
    assert info.value.field == "on_bad_record"


# -- damaged on disk: the store refuses it (READ_CORRUPT) -------------------------------------


@pytest.mark.parametrize("local_reads", [True, False], ids=["segment-files", "commit-log-read"])
def test_a_record_damaged_on_disk_is_surfaced_at_its_place_and_stepped_over(
    tmp_path: Path, local_reads: bool
) -> None:
    s = start_poisoned(tmp_path / "store", local_reads=local_reads)
    try:
        cluster = s.cluster
        sent = put(cluster, "Damaged", 0, [f"intact-{i}".encode() for i in range(5)])
        # One body byte of the third record (IPv4 hosts: the body starts at 88): its CRC fails;
        # the running commit log maps the same pages and sees it at once.
        path, at = commitlog_segment(cluster, sent[2].commit_log_offset + 90)
        with open(path, "r+b") as f:
            byte = os.pread(f.fileno(), 1, at)[0]
            os.pwrite(f.fileno(), bytes([byte ^ 0x10]), at)
        with Consumer(settings_for(cluster), "Damaged", queues=[0]) as c:
            got: list[Message] = []
            with pytest.raises(BadRecord) as info:
                got.extend(c.messages(follow=False))
            assert [m.queue_offset for m in got] == [0, 1]
            err = info.value
            assert (err.queue_offset, err.commit_log_offset) == (2, sent[2].commit_log_offset)
            assert "damaged" in err.reason
            assert [m.queue_offset for m in c.messages(follow=False)] == [3, 4]
            # poll() the same way, from the start again.
            c.seek(0, 0)
            assert [m.queue_offset for m in c.poll(timeout_s=0)] == [0, 1]
            with pytest.raises(BadRecord):
                c.poll(timeout_s=0)
            assert [m.queue_offset for m in c.poll(timeout_s=0)] == [3, 4]
    finally:
        s.cluster.stop_all()
