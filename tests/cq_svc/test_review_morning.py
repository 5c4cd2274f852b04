"""Review of 5781cd7 (cq_svc makes a Follow round's answers inside its FollowResponse and
deletes the ones not worth sending): the answers left must be the right ones, named by the
right pull_index, on the usual path and on the path where the long poll is refused
(ResourceExhausted: the first round is answered, cut to max_batches, and the stream ends).

Real commit log process; the consume queue is fed directly (real sink and engine), as in
test_follow.py, whose helpers these tests use."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from mqstore.launcher import ServiceProcess
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb
from tests.cq_svc.logs import start_commitlog
from tests.cq_svc.support import ApiHarness, rpc_error, wait_for
from tests.cq_svc.test_follow import feed, follow, follow_call, pull, unindexed

LONG_MS = 20_000  # a wait that no passing test sits through


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiHarness]:
    root = tmp_path_factory.mktemp("review")
    log: ServiceProcess = start_commitlog(root / "log")
    harness = ApiHarness(root / "cq", commitlog_target=log.target, long_polls_max=1)
    harness.handshake()
    try:
        yield harness
    finally:
        harness.stop()
        log.stop(timeout_s=15)


def unary(api: ApiHarness, request: pb.PullRequest) -> bytes:
    return api.stub.Pull(request, timeout=30).SerializeToString()


def test_a_round_drops_the_queues_with_nothing_new_and_names_the_others_rightly(
    api: ApiHarness,
) -> None:
    feed(api, "Mixed", [1, 3, 1, 3, 3])
    pulls = [pull("Mixed", q, 0, max_messages=8, records_as_blob=True) for q in range(5)]
    messages = list(api.stub.Follow(follow(*pulls), timeout=30))
    assert [[a.pull_index for a in m.answers] for m in messages] == [[1, 3]]
    for a in messages[0].answers:
        assert unindexed(a).SerializeToString() == unary(api, pulls[a.pull_index])
    assert [len(a.queue_offsets) for a in messages[0].answers] == [2, 3]


def test_a_follow_refused_its_long_poll_answers_the_queues_with_something_cut_to_max_batches(
    api: ApiHarness,
) -> None:
    feed(api, "Busy", [0])
    feed(api, "Cut", [1, 2, 3, 1])
    holder = follow_call(api, follow(pull("Busy", 0, 1), long_poll_ms=LONG_MS), timeout=30)
    try:
        assert wait_for(lambda: api.watch.waiting == 1)
        pulls = [pull("Cut", q, 0, records_as_blob=True) for q in range(4)]  # 0: empty
        request = follow(*pulls, long_poll_ms=LONG_MS, max_batches=2)
        answers = list(follow_call(api, request, timeout=30))
        assert [a.pull_index for a in answers] == [1, 2]
        for a in answers:
            assert unindexed(a).SerializeToString() == unary(api, pulls[a.pull_index])
        # Nothing new in any of its queues: the refusal stands.
        code, _, _ = rpc_error(
            lambda: list(follow_call(api, follow(pulls[0], long_poll_ms=LONG_MS), timeout=30))
        )
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        holder.cancel()
    assert wait_for(lambda: api.watch.waiting == 0, timeout_s=5)
