"""The ConsumeQueue API's answers that need no message bytes: pull statuses and their
corrections (rocketmq-store.md §6.2), time lookups (§3.9), queue positions, group offsets,
status, and UNAVAILABLE while the replay has not caught up."""

from __future__ import annotations

from pathlib import Path

import grpc

from mqstore.rpc.gen.common.v1 import common_pb2
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb
from tests.answers import records_of
from tests.cq_svc.support import STORE_A, ApiHarness, entries, rpc_error


def pull(api: ApiHarness, offset: int, **fields: object) -> pb.PullResponse:
    request = pb.PullRequest(topic=fields.pop("topic", "T"), offset=offset, **fields)  # type: ignore[arg-type]
    response: pb.PullResponse = api.stub.Pull(request, timeout=30)
    return response


def test_an_unknown_queue_is_an_empty_one(any_api: ApiHarness) -> None:
    r = pull(any_api, 5, queue_id=3)
    assert (r.status, r.next_begin_offset, r.min_offset, r.max_offset) == (
        pb.NO_MESSAGE_IN_QUEUE,
        0,
        0,
        0,
    )
    info = any_api.stub.GetQueueInfo(pb.GetQueueInfoRequest(topic="T", queue_id=3))
    assert (info.min_offset, info.max_offset) == (0, 0)


def test_out_of_range_offsets_get_statuses_with_the_corrected_offset(any_api: ApiHarness) -> None:
    any_api.dispatch(entries(30))  # queue offsets 0..29 at commit-log offsets 0..2900
    any_api.handshake(min_offset=1500, max_offset=3000)  # the log expired everything below 1500
    r = pull(any_api, 3)
    assert (r.status, r.next_begin_offset, r.min_offset, r.max_offset) == (
        pb.OFFSET_TOO_SMALL,
        15,
        15,
        30,
    )
    r = pull(any_api, 30)
    assert (r.status, r.next_begin_offset) == (pb.OFFSET_OVERFLOW_ONE, 30)
    r = pull(any_api, 45)
    assert (r.status, r.next_begin_offset) == (pb.OFFSET_OVERFLOW_BADLY, 30)
    assert not records_of(r)


def test_a_tag_filter_skips_units_without_reading_them_and_moves_the_next_offset(
    any_api: ApiHarness,
) -> None:
    any_api.dispatch(entries(20, tags="TagA"))
    r = pull(any_api, 4, tags=["TagB"])
    assert (r.status, r.next_begin_offset, r.max_offset) == (pb.NO_MATCHED_MESSAGE, 20, 20)
    # "*" and blank names mean every message, as in a RocketMQ subscription; unit 4 is then
    # found and its bytes would be fetched from the log, which this harness has not got.
    code, message, _ = rpc_error(lambda: pull(any_api, 4, tags=["*"]))
    assert code == grpc.StatusCode.UNAVAILABLE and "Read" in message


def test_time_lookups_land_on_either_side_of_a_timestamp(any_api: ApiHarness) -> None:
    any_api.dispatch(entries(10, time_base=1_000, time_step=10))  # unit i stored at 1000+10i

    def at(ts: int, boundary: int, queue_id: int = 0) -> int:
        request = pb.GetOffsetByTimeRequest(
            topic="T", queue_id=queue_id, timestamp_ms=ts, boundary=boundary
        )
        return int(any_api.stub.GetOffsetByTime(request).offset)

    assert at(1_045, common_pb2.LOWER) == 5  # the first stored at or after
    assert at(1_045, common_pb2.UPPER) == 4  # the last stored at or before
    assert at(1_050, common_pb2.LOWER) == at(1_050, common_pb2.UPPER) == 5
    assert at(99_999, common_pb2.LOWER) == 10  # after the newest: the queue's end
    assert at(0, common_pb2.LOWER) == 0
    assert at(1_045, common_pb2.LOWER, queue_id=9) == 0  # an unknown queue


def test_list_queues_gives_every_queue_of_a_topic_with_its_positions(
    any_api: ApiHarness,
) -> None:
    any_api.dispatch(entries(3, queue_id=0))
    any_api.dispatch(entries(5, queue_id=3, phy_base=10_000))
    any_api.dispatch(entries(2, topic="Other", phy_base=20_000))
    queues = any_api.stub.ListQueues(pb.ListQueuesRequest(topic="T")).queues
    assert [(q.topic, q.queue_id, q.min_offset, q.max_offset) for q in queues] == [
        ("T", 0, 0, 3),
        ("T", 3, 0, 5),
    ]
    assert not any_api.stub.ListQueues(pb.ListQueuesRequest(topic="Nobody")).queues


def test_list_topics_names_every_topic_with_a_queue_sorted(any_api: ApiHarness) -> None:
    assert list(any_api.stub.ListTopics(pb.ListTopicsRequest()).topics) == []
    any_api.dispatch(entries(2, topic="Zeta"))
    any_api.dispatch(entries(2, topic="Alpha", phy_base=10_000))
    assert list(any_api.stub.ListTopics(pb.ListTopicsRequest()).topics) == ["Alpha", "Zeta"]


def test_committed_offsets_are_kept_per_group_and_queue_and_survive_a_restart(
    tmp_path: Path,
) -> None:
    api = ApiHarness(tmp_path / "cq")
    api.handshake()

    def fetch(group: str, queue_id: int) -> int:
        request = pb.FetchOffsetRequest(group=group, topic="T", queue_id=queue_id)
        return int(api.stub.FetchOffset(request).offset)

    assert fetch("g1", 0) == -1  # never committed
    api.stub.CommitOffset(pb.CommitOffsetRequest(group="g1", topic="T", queue_id=0, offset=7))
    api.stub.CommitOffset(pb.CommitOffsetRequest(group="g2", topic="T", queue_id=0, offset=3))
    api.stub.CommitOffset(pb.CommitOffsetRequest(group="g1", topic="T", queue_id=0, offset=9))
    assert (fetch("g1", 0), fetch("g2", 0), fetch("g1", 1)) == (9, 3, -1)
    api.stop()
    api = ApiHarness(tmp_path / "cq")
    try:
        assert (fetch("g1", 0), fetch("g2", 0)) == (9, 3)
    finally:
        api.stop()


def test_status_reports_what_the_consume_queues_follow_and_hold(any_api: ApiHarness) -> None:
    any_api.dispatch(entries(4, queue_id=0))
    any_api.dispatch(entries(4, queue_id=1, phy_base=400))
    status = any_api.stub.GetStatus(pb.GetStatusRequest())
    assert status.store_id == STORE_A
    assert status.applied_offset == 800
    assert status.confirmed_offset <= status.applied_offset
    assert status.caught_up
    assert status.store == any_api.settings.cq_store.value
    assert status.queue_count == 2


def test_queue_positions_are_unavailable_until_the_replay_caught_up(api: ApiHarness) -> None:
    api.dispatch(entries(3))
    api.ready = False
    for call in (
        lambda: pull(api, 0),
        lambda: api.stub.GetQueueInfo(pb.GetQueueInfoRequest(topic="T")),
        lambda: api.stub.ListQueues(pb.ListQueuesRequest(topic="T")),
        lambda: api.stub.GetOffsetByTime(pb.GetOffsetByTimeRequest(topic="T", timestamp_ms=1)),
        lambda: api.stub.Receive(pb.ReceiveRequest(group="g", topic="T")),
    ):
        assert rpc_error(call)[0] == grpc.StatusCode.UNAVAILABLE
    # Group offsets do not depend on the replay.
    api.stub.CommitOffset(pb.CommitOffsetRequest(group="g", topic="T", offset=2))
    assert api.stub.FetchOffset(pb.FetchOffsetRequest(group="g", topic="T")).offset == 2
    assert not api.stub.GetStatus(pb.GetStatusRequest()).caught_up
    api.ready = True
    assert pull(api, 3).status == pb.OFFSET_OVERFLOW_ONE


def test_following_a_replaced_log_drops_every_queue_and_group_offsets_stay(
    any_api: ApiHarness,
) -> None:
    any_api.dispatch(entries(5))
    any_api.stub.CommitOffset(pb.CommitOffsetRequest(group="g", topic="T", offset=4))
    any_api.handshake(min_offset=0, max_offset=0, store_id=b"B" * 16)
    r = pull(any_api, 4)
    assert (r.status, r.max_offset) == (pb.NO_MESSAGE_IN_QUEUE, 0)
    assert any_api.stub.GetStatus(pb.GetStatusRequest()).store_id == b"B" * 16
    # Consumer offsets are the consumers' business: kept, and corrected by the next pull.
    assert any_api.stub.FetchOffset(pb.FetchOffsetRequest(group="g", topic="T")).offset == 4
