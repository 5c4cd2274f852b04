"""A Follow round's answers: cq_svc makes them inside its FollowResponse and deletes the ones
not worth sending; the answers left must be the right ones, named by the right pull_index, also
when a round is cut to max_batches. A follow past follow_streams_max is refused before it looks.

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
    root = tmp_path_factory.mktemp("follow-rounds")
    log: ServiceProcess = start_commitlog(root / "log")
    harness = ApiHarness(
        root / "cq", commitlog_target=log.target, long_polls_max=1, follow_streams_max=1
    )
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
    pulls = [pull("Mixed", q, 0, max_messages=8) for q in range(5)]
    messages = list(api.stub.Follow(follow(*pulls), timeout=30))
    assert [[a.pull_index for a in m.answers] for m in messages] == [[1, 3]]
    for a in messages[0].answers:
        assert unindexed(a).SerializeToString() == unary(api, pulls[a.pull_index])
    assert [len(a.queue_offsets) for a in messages[0].answers] == [2, 3]


def test_a_follow_past_the_cap_answers_nothing_and_a_round_is_cut_to_max_batches(
    api: ApiHarness,
) -> None:
    feed(api, "Busy", [0])
    feed(api, "Cut", [1, 2, 3, 1])
    pulls = [pull("Cut", q, 0) for q in range(4)]  # 0: empty
    request = follow(*pulls, long_poll_ms=LONG_MS, max_batches=2)
    holder = follow_call(api, follow(pull("Busy", 0, 1), long_poll_ms=LONG_MS), timeout=30)
    try:
        assert wait_for(lambda: api.watch.waiting == 1)
        # Its queues hold something new: refused all the same, nothing answered.
        code, _, _ = rpc_error(lambda: list(follow_call(api, request, timeout=30)))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        holder.cancel()
    assert wait_for(lambda: api.watch.waiting == 0, timeout_s=5)
    got: list[pb.PullResponse] = []

    def answered() -> bool:
        try:
            got.extend(follow_call(api, request, timeout=30))
        except grpc.RpcError as err:  # the holder's slot comes back once its thread ends
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            return False
        return True

    assert wait_for(answered, timeout_s=5)
    # Two answers (max_batches), of two of the queues with something, in turn.
    assert len(got) == 2 and len({a.pull_index for a in got}) == 2
    assert {a.pull_index for a in got} <= {1, 2, 3}
    for a in got:
        assert unindexed(a).SerializeToString() == unary(api, pulls[a.pull_index])
