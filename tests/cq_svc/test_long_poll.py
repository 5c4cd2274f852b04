"""Long polling's bookkeeping: waiting the time out when nothing comes, waking when the queue
changes, the bound on waiting calls, and ending promptly on cancel, deadline and shutdown.
(Waking with a message to hand out needs its bytes: test_with_commitlog.py.)

Times are asserted loosely: a lower bound where a call must have waited, and a bound far
below the long poll where it must not have."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb
from tests.answers import records_of
from tests.cq_svc.support import ApiHarness, entries, rpc_error, wait_for

LONG_MS = 20_000  # a wait that no passing test sits through


def pull_request(offset: int, long_poll_ms: int, **fields: object) -> pb.PullRequest:
    return pb.PullRequest(topic="T", offset=offset, long_poll_ms=long_poll_ms, **fields)  # type: ignore[arg-type]


def test_a_long_poll_with_nothing_dispatched_waits_its_time_then_answers(api: ApiHarness) -> None:
    api.dispatch(entries(3))
    began = time.monotonic()
    r = api.stub.Pull(pull_request(3, 300), timeout=30)
    assert time.monotonic() - began >= 0.25
    assert (r.status, r.next_begin_offset) == (pb.OFFSET_OVERFLOW_ONE, 3)


def test_dispatch_to_other_queues_or_of_other_tags_does_not_end_the_wait(api: ApiHarness) -> None:
    api.dispatch(entries(3, tags="TagA"))
    call = api.stub.Pull.future(pull_request(3, 800, tags=["TagB"]), timeout=30)
    began = time.monotonic()
    assert wait_for(lambda: api.watch.waiting == 1)
    api.dispatch(entries(2, queue_id=1, phy_base=1_000))
    api.dispatch(entries(4, start=3, phy_base=300, tags="TagA"))  # same queue, no match
    r = call.result()
    assert time.monotonic() - began >= 0.7
    # It looked again after the batch: the answer starts past the units that did not match.
    assert (r.status, r.next_begin_offset, r.max_offset) == (pb.NO_MATCHED_MESSAGE, 7, 7)


def test_a_long_poll_wakes_as_soon_as_the_queue_moves_past_it(api: ApiHarness) -> None:
    # Waiting at offset 5 of an empty queue; the first batch brings offsets 0..2, so offset 5
    # is now beyond the end: the poll answers the correction at once.
    call = api.stub.Pull.future(pull_request(5, LONG_MS), timeout=30)
    assert wait_for(lambda: api.watch.waiting == 1)
    began = time.monotonic()
    api.dispatch(entries(3))
    r = call.result()
    assert time.monotonic() - began < LONG_MS / 1000 / 4
    assert (r.status, r.next_begin_offset) == (pb.OFFSET_OVERFLOW_BADLY, 3)


def test_a_handshake_that_truncates_wakes_the_polls_waiting_at_the_old_end(
    api: ApiHarness,
) -> None:
    api.dispatch(entries(10))  # up to commit-log offset 1000
    call = api.stub.Pull.future(pull_request(10, LONG_MS), timeout=30)
    assert wait_for(lambda: api.watch.waiting == 1)
    api.handshake(min_offset=0, max_offset=600)  # the log lost its tail from 600 on
    r = call.result()
    assert (r.status, r.next_begin_offset, r.max_offset) == (pb.OFFSET_OVERFLOW_BADLY, 6, 6)


def test_the_caller_deadline_bounds_the_wait_and_still_gets_an_answer(api: ApiHarness) -> None:
    api.dispatch(entries(1))
    began = time.monotonic()
    r = api.stub.Pull(pull_request(1, LONG_MS), timeout=1.0)
    assert r.status == pb.OFFSET_OVERFLOW_ONE
    assert 0.5 <= time.monotonic() - began < 5


def test_long_polls_past_the_bound_are_refused_and_cancelled_ones_free_their_place(
    tmp_path: Path,
) -> None:
    api = ApiHarness(tmp_path / "cq", long_polls_max=2)
    try:
        api.handshake()
        api.dispatch(entries(1))
        waiting = [api.stub.Pull.future(pull_request(1, LONG_MS), timeout=30) for _ in range(2)]
        assert wait_for(lambda: api.watch.waiting == 2)
        code, _, _ = rpc_error(lambda: api.stub.Pull(pull_request(1, LONG_MS), timeout=30))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        # A pull that need not wait is answered whatever the bound.
        assert api.stub.Pull(pull_request(7, LONG_MS), timeout=30).status == (
            pb.OFFSET_OVERFLOW_BADLY
        )
        for call in waiting:
            call.cancel()
        # The server notices the clients went away and frees the waiters, long before 20 s.
        assert wait_for(lambda: api.watch.waiting == 0, timeout_s=5)
    finally:
        api.stop()


def test_shutdown_answers_waiting_long_polls_at_once(api: ApiHarness) -> None:
    api.dispatch(entries(2))
    call = api.stub.Pull.future(pull_request(2, LONG_MS), timeout=30)
    assert wait_for(lambda: api.watch.waiting == 1)
    began = time.monotonic()
    api.watch.close()  # what SIGTERM does first (main.py)
    assert call.result().status == pb.OFFSET_OVERFLOW_ONE
    assert time.monotonic() - began < LONG_MS / 1000 / 4
    # While draining, a new long poll does not wait at all.
    began = time.monotonic()
    assert api.stub.Pull(pull_request(2, LONG_MS), timeout=30).status == pb.OFFSET_OVERFLOW_ONE
    assert time.monotonic() - began < LONG_MS / 1000 / 4


def test_a_receive_long_poll_with_nothing_to_hand_out_waits_then_answers_empty(
    api: ApiHarness,
) -> None:
    began = time.monotonic()
    r = api.stub.Receive(
        pb.ReceiveRequest(group="g", topic="T", long_poll_ms=300, invisible_duration_ms=1000),
        timeout=30,
    )
    assert time.monotonic() - began >= 0.25
    assert not records_of(r) and not r.receipt_handles


@pytest.mark.parametrize(
    ("offset", "status"), [(0, pb.OFFSET_TOO_SMALL), (12, pb.OFFSET_OVERFLOW_BADLY)]
)
def test_a_pull_with_a_correction_to_report_never_waits(
    api: ApiHarness, offset: int, status: int
) -> None:
    api.dispatch(entries(10))
    api.handshake(min_offset=300, max_offset=1000)
    began = time.monotonic()
    r = api.stub.Pull(pull_request(offset, LONG_MS), timeout=30)
    assert r.status == status
    assert time.monotonic() - began < LONG_MS / 1000 / 4
