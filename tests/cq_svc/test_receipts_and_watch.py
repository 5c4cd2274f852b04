"""Receipt handles (receipts.py) and the long-poll watch (watch.py), on their own."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cq_svc import receipts
from cq_svc.watch import QueueWatch
from mqstore.errors import InvalidArgument, ResourceExhausted


@given(st.integers(0, 2**63 - 1), st.integers(1, 2**31 - 1), st.integers(0, 65_535))
def test_a_receipt_decodes_to_the_delivery_it_was_issued_for(
    offset: int, count: int, queue_id: int
) -> None:
    handle = receipts.encode("group", "Topic", queue_id, offset, count)
    assert handle.isascii() and len(handle) == 23
    assert receipts.decode(handle, "group", "Topic", queue_id) == (offset, count)


def test_a_receipt_changed_in_any_character_is_refused() -> None:
    handle = receipts.encode("g", "T", 0, 12345, 2)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    refused = 0
    for i, ch in enumerate(handle):
        other = alphabet[(alphabet.index(ch) + 1) % len(alphabet)]
        try:
            receipts.decode(handle[:i] + other + handle[i + 1 :], "g", "T", 0)
        except InvalidArgument as err:
            assert err.field == "receipt_handle"
            refused += 1
    # The last character carries only 2 of its 6 bits; the other 4 are padding a decoder may
    # ignore, so a change there can decode to the very same bytes.
    assert refused >= len(handle) - 1


@pytest.mark.parametrize(
    ("group", "topic", "queue_id"), [("h", "T", 0), ("g", "U", 0), ("g", "T", 1)]
)
def test_a_receipt_is_bound_to_its_group_topic_and_queue(
    group: str, topic: str, queue_id: int
) -> None:
    handle = receipts.encode("g", "T", 0, 5, 1)
    with pytest.raises(InvalidArgument):
        receipts.decode(handle, group, topic, queue_id)


def test_a_batch_applied_between_the_last_look_and_the_wait_is_not_missed() -> None:
    watch = QueueWatch(4)
    waiter = watch.register(("T", 0))
    # ... the caller looks, finds nothing; the batch lands before it starts waiting ...
    assert watch.notify({("T", 0)}) == 1
    assert waiter.wait(10.0)  # returns at once: the event was set


def test_only_the_waiters_of_the_touched_queues_wake() -> None:
    watch = QueueWatch(4)
    mine, other = watch.register(("T", 0)), watch.register(("T", 1))
    assert watch.notify({("T", 0), ("U", 1)}) == 1
    assert mine.wait(0)
    assert not other.wait(0)


def test_waiters_are_bounded_and_unregistering_frees_a_place() -> None:
    watch = QueueWatch(2)
    first = watch.register(("T", 0))
    watch.register(("T", 0))
    with pytest.raises(ResourceExhausted):
        watch.register(("T", 1))
    watch.unregister(first)
    watch.unregister(first)  # twice: harmless, counted once
    assert watch.waiting == 1
    watch.register(("T", 1))


def test_close_wakes_every_waiter_and_later_ones_at_once() -> None:
    watch = QueueWatch(8)
    waiters = [watch.register(("T", q)) for q in range(3)]
    woke: list[bool] = []
    threads = [threading.Thread(target=lambda w=w: woke.append(w.wait(30))) for w in waiters]
    for t in threads:
        t.start()
    watch.close()
    for t in threads:
        t.join(10)
    assert woke == [True, True, True]
    assert watch.register(("T", 9)).wait(30)


def test_one_waiter_over_many_queues_keeps_the_ones_woken_and_counts_once() -> None:
    watch = QueueWatch(2)
    waiter = watch.register_many([("T", 0), ("T", 1), ("U", 0)])
    assert watch.waiting == 1
    assert not waiter.wait(0)
    assert watch.notify({("T", 1), ("V", 0)}) == 1
    assert watch.notify({("U", 0)}) == 1
    assert waiter.wait(0)
    assert waiter.take() == {("T", 1), ("U", 0)}
    assert not waiter.wait(0)  # take re-armed it
    assert waiter.take() == set()
    # A wake between the take and the wait is kept, key and all.
    watch.notify({("T", 0)})
    assert waiter.wait(10.0)
    assert waiter.take() == {("T", 0)}
    # The long polls' bound is theirs: a follow's waiter takes none of it (its stream has a
    # cap of its own), and is refused none.
    watch.register(("T", 5))
    watch.register(("T", 6))
    with pytest.raises(ResourceExhausted):
        watch.register(("T", 7))
    other = watch.register_many([("W", 0)])
    assert watch.waiting == 4
    watch.unregister(other)
    watch.unregister(waiter)
    watch.unregister(waiter)  # twice: harmless
    assert watch.waiting == 2
    assert watch.notify({("T", 1)}) == 0  # no longer registered anywhere
