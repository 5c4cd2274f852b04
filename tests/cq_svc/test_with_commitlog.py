"""cq_svc in this process, following a real commitlog_svc process: appends flow through the
dispatch stream into the consume queues, and message bytes come back through the log's Read.

One commit log serves the module; each test writes its own topic (and subscribes with its own
subscriber id), so the tests stay apart while sharing it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from cq_svc.watch import Waiter
from mqstore.launcher import ServiceProcess
from mqstore.rpc.channel import make_channel
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl_pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as cl_grpc
from mqstore.rpc.gen.common.v1 import common_pb2
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb
from tests.answers import records_of
from tests.cq_svc.logs import (
    EXPIRING_LOG_ARGS,
    EXPIRING_LOG_BYTES,
    EXPIRING_LOG_ENV,
    append,
    decode,
    start_commitlog,
)
from tests.cq_svc.support import WholeCq as Cq
from tests.cq_svc.support import wait_for

LONG_MS = 20_000  # a long poll no passing test sits through


@pytest.fixture(scope="module")
def commitlog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    process = start_commitlog(tmp_path_factory.mktemp("log"))
    yield process
    process.stop(timeout_s=15)


@pytest.fixture(scope="module")
def log_stub(commitlog: ServiceProcess) -> Iterator[cl_grpc.CommitLogStub]:
    with make_channel(commitlog.target) as channel:
        yield cl_grpc.CommitLogStub(channel)


@pytest.fixture
def cq(tmp_path: Path, commitlog: ServiceProcess) -> Iterator[Cq]:
    service = Cq(tmp_path / "cq", commitlog.target)
    yield service
    service.stop()


@pytest.fixture
def topic() -> str:
    return f"T{uuid.uuid4().hex[:12]}"


def bodies(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def pulled(response: pb.PullResponse) -> list[tuple[int, bytes]]:
    return [
        (qo, decode(raw).body)
        for qo, raw in zip(response.queue_offsets, records_of(response), strict=True)
    ]


# -- pulls ----------------------------------------------------------------------------------------


def test_appended_batches_are_pulled_back_per_queue_in_order(
    cq: Cq, log_stub: cl_grpc.CommitLogStub, topic: str
) -> None:
    stored = append(log_stub, topic, bodies(6), queue_ids=[0, 1, 0, 2, 1, 0])
    stored += append(log_stub, topic, bodies(3, "n"), queue_ids=[2, 2, 0])
    other = append(log_stub, topic + "x", bodies(2))
    cq.wait_applied(max(s.end_offset for s in stored + other))
    for queue_id in (0, 1, 2):
        mine = [s for s in stored if s.queue_id == queue_id]
        r = cq.pull(topic, 0, queue_id=queue_id)
        assert r.status == pb.FOUND
        assert pulled(r) == [(s.queue_offset, s.body) for s in mine]
        assert [s.queue_offset for s in mine] == list(range(len(mine)))
        assert (r.next_begin_offset, r.min_offset, r.max_offset) == (len(mine), 0, len(mine))
        for raw, s in zip(records_of(r), mine, strict=True):
            record = decode(raw)
            assert (record.topic, record.queue_id, record.physical_offset) == (
                topic,
                queue_id,
                s.commit_log_offset,
            )
    queues = cq.stub.ListQueues(pb.ListQueuesRequest(topic=topic)).queues
    assert [(q.queue_id, q.max_offset) for q in queues] == [(0, 4), (1, 2), (2, 3)]


def test_count_and_byte_limits_cut_the_batch_and_the_next_offset_follows(
    tmp_path: Path, commitlog: ServiceProcess, log_stub: cl_grpc.CommitLogStub, topic: str
) -> None:
    stored = append(log_stub, topic, [b"x" * 100] * 10)
    size = stored[0].size
    cq = Cq(tmp_path / "cq", commitlog.target, pull_messages_max=4, pull_messages_default=2)
    try:
        cq.wait_applied(stored[-1].end_offset)
        r = cq.pull(topic, 0, max_messages=3)
        assert (len(records_of(r)), r.next_begin_offset) == (3, 3)
        r = cq.pull(topic, 3, max_bytes=size * 2 + size // 2)
        assert (len(records_of(r)), r.next_begin_offset) == (2, 5)
        r = cq.pull(topic, 5, max_bytes=1)  # smaller than one message: still one
        assert (len(records_of(r)), r.next_begin_offset) == (1, 6)
        r = cq.pull(topic, 0, max_messages=1_000)  # over the server's maximum: capped
        assert (len(records_of(r)), r.next_begin_offset) == (4, 4)
        r = cq.pull(topic, 0)  # 0: the server's default
        assert len(records_of(r)) == 2
    finally:
        cq.stop()


def test_a_tag_filter_returns_only_messages_whose_tags_match_exactly(
    cq: Cq, log_stub: cl_grpc.CommitLogStub, topic: str
) -> None:
    # "Aa" and "BB" share a Java hash code: the unit filter lets "BB" through, the record's
    # TAGS property then refuses it.
    tags = ["Aa", "BB", "", "C", "Aa", "BB", "C", "Aa"]
    stored = append(log_stub, topic, bodies(len(tags)), tags=tags)
    cq.wait_applied(stored[-1].end_offset)
    r = cq.pull(topic, 0, tags=["Aa"])
    assert r.status == pb.FOUND
    assert [qo for qo, _ in pulled(r)] == [0, 4, 7]
    assert r.next_begin_offset == 8
    r = cq.pull(topic, 0, tags=["C", "Aa"], max_messages=3)
    assert [qo for qo, _ in pulled(r)] == [0, 3]
    assert r.next_begin_offset == 4  # the batch was full with 0, 1 (a collision) and 3
    # A batch of collisions only: nothing to hand out, and the next pull starts past them.
    r = cq.pull(topic, 1, tags=["Aa"], max_messages=1)
    assert (r.status, list(records_of(r)), r.next_begin_offset) == (pb.NO_MATCHED_MESSAGE, [], 2)
    r = cq.pull(topic, 5, tags=["BB"], max_messages=1)
    assert pulled(r) == [(5, b"m-5")]
    r = cq.pull(topic, 6, tags=["BB"])
    assert (r.status, r.next_begin_offset) == (pb.NO_MATCHED_MESSAGE, 8)


def test_offsets_are_found_by_store_time_on_either_side(
    cq: Cq, log_stub: cl_grpc.CommitLogStub, topic: str
) -> None:
    first = append(log_stub, topic, bodies(3))
    time.sleep(0.02)  # the next batch is stored at a later millisecond
    second = append(log_stub, topic, bodies(2, "n"))
    cq.wait_applied(second[-1].end_offset)
    t1, t2 = first[0].store_timestamp_ms, second[0].store_timestamp_ms
    assert t1 < t2

    def at(ts: int, boundary: int) -> int:
        request = pb.GetOffsetByTimeRequest(topic=topic, timestamp_ms=ts, boundary=boundary)
        return int(cq.stub.GetOffsetByTime(request, timeout=10).offset)

    assert at(t1, common_pb2.LOWER) == 0
    assert at(t1, common_pb2.UPPER) == 2  # the last of the messages stored at t1
    assert at(t1 + 1, common_pb2.LOWER) == 3  # between the batches: the first after
    assert at(t2, common_pb2.LOWER) == 3
    assert at(t2 + 10_000, common_pb2.LOWER) == 5


# -- long polling ---------------------------------------------------------------------------------


def test_a_long_poll_returns_as_soon_as_a_matching_message_is_appended(
    cq: Cq, log_stub: cl_grpc.CommitLogStub, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits = 0  # Waiter.wait calls of this topic's long poll: each one a look that found nothing
    real_wait = Waiter.wait

    def counted_wait(waiter: Waiter, timeout_s: float) -> bool:
        nonlocal waits
        if any(key[0] == topic for key in waiter.keys):
            waits += 1
        return real_wait(waiter, timeout_s)

    monkeypatch.setattr(Waiter, "wait", counted_wait)
    first = append(log_stub, topic, bodies(2))
    cq.wait_applied(first[-1].end_offset)
    call = cq.stub.Pull.future(
        pb.PullRequest(topic=topic, offset=2, long_poll_ms=LONG_MS, tags=["Wanted"]), timeout=60
    )
    assert wait_for(lambda: cq.service.watch.waiting == 1 and waits == 1)
    append(log_stub, topic, [b"not this"], tags=["Other"])
    # A dispatched message the filter refuses does not end the wait: woken, the poll looks
    # again and waits on.
    assert wait_for(lambda: waits == 2 or call.done())
    assert not call.done()
    began = time.monotonic()
    append(log_stub, topic, [b"this"], tags=["Wanted"])
    r = call.result()
    assert time.monotonic() - began < LONG_MS / 1000 / 4
    assert r.status == pb.FOUND
    assert pulled(r) == [(3, b"this")]
    assert r.next_begin_offset == 4


def test_a_long_poll_on_an_empty_queue_returns_the_first_message(
    cq: Cq, log_stub: cl_grpc.CommitLogStub, topic: str
) -> None:
    call = cq.stub.Pull.future(
        pb.PullRequest(topic=topic, offset=0, long_poll_ms=LONG_MS), timeout=60
    )
    assert wait_for(lambda: cq.service.watch.waiting == 1)
    append(log_stub, topic, [b"first"])
    r = call.result()
    assert (r.status, pulled(r)) == (pb.FOUND, [(0, b"first")])


# -- receive / ack --------------------------------------------------------------------------------


def receive(cq: Cq, topic: str, n: int, invisible_ms: int, **fields: object) -> pb.ReceiveResponse:
    request = pb.ReceiveRequest(
        group="g",
        topic=topic,
        max_messages=n,
        invisible_duration_ms=invisible_ms,
        **fields,  # type: ignore[arg-type]
    )
    response: pb.ReceiveResponse = cq.stub.Receive(request, timeout=60)
    return response


def ack(cq: Cq, topic: str, *handles: str) -> pb.AckResponse:
    request = pb.AckRequest(group="g", topic=topic, receipt_handles=list(handles))
    response: pb.AckResponse = cq.stub.Ack(request, timeout=30)
    return response


def test_received_messages_not_acked_in_time_are_delivered_again(
    cq: Cq, log_stub: cl_grpc.CommitLogStub, topic: str
) -> None:
    stored = append(log_stub, topic, bodies(4))
    cq.wait_applied(stored[-1].end_offset)
    got = receive(cq, topic, 3, 300)
    assert [decode(r).body for r in records_of(got)] == bodies(3)
    assert list(got.queue_offsets) == [0, 1, 2]
    assert list(got.delivery_counts) == [1, 1, 1]
    done = ack(cq, topic, got.receipt_handles[0], got.receipt_handles[2])
    assert (list(done.stale_receipt_handles), done.committed_offset) == ([], 1)
    # Offset 1 is invisible for 300 ms: meanwhile the next (and last) one is handed out.
    assert list(receive(cq, topic, 5, 60_000).queue_offsets) == [3]
    # Nothing new: a long-polling receive waits, and once the deadline of offset 1 passed it
    # gets it again, counted twice (woken by the deadline, not by the end of its long poll).
    began = time.monotonic()
    again = receive(cq, topic, 1, 60_000, long_poll_ms=LONG_MS)
    assert time.monotonic() - began < LONG_MS / 1000 / 4
    assert (list(again.queue_offsets), list(again.delivery_counts)) == ([1], [2])
    # The first receipt of offset 1 is stale now: reported, not an error, and not acked.
    late = ack(cq, topic, got.receipt_handles[1])
    assert list(late.stale_receipt_handles) == [got.receipt_handles[1]]
    assert late.committed_offset == 1
    assert ack(cq, topic, again.receipt_handles[0]).committed_offset == 3
    fetched = cq.stub.FetchOffset(pb.FetchOffsetRequest(group="g", topic=topic))
    assert fetched.offset == 3


def test_changing_the_invisible_duration_moves_the_redelivery(
    cq: Cq, log_stub: cl_grpc.CommitLogStub, topic: str
) -> None:
    stored = append(log_stub, topic, bodies(3))
    cq.wait_applied(stored[-1].end_offset)
    got = receive(cq, topic, 1, 200)
    handle = got.receipt_handles[0]
    change = pb.ChangeInvisibleDurationRequest(
        group="g", topic=topic, receipt_handle=handle, invisible_duration_ms=60_000
    )
    assert cq.stub.ChangeInvisibleDuration(change).receipt_handle
    time.sleep(0.4)  # past the first deadline: not redelivered, it was pushed back
    assert list(receive(cq, topic, 5, 60_000).queue_offsets) == [1, 2]
    change.invisible_duration_ms = 0  # visible again now (a nack)
    assert cq.stub.ChangeInvisibleDuration(change).receipt_handle
    again = receive(cq, topic, 5, 60_000)
    assert (list(again.queue_offsets), list(again.delivery_counts)) == ([0], [2])
    # The receipt of the first delivery is stale now: nothing changes, and it says so.
    assert cq.stub.ChangeInvisibleDuration(change).receipt_handle == ""


def test_a_receive_long_poll_returns_when_a_message_is_appended(
    cq: Cq, log_stub: cl_grpc.CommitLogStub, topic: str
) -> None:
    request = pb.ReceiveRequest(
        group="g", topic=topic, max_messages=4, invisible_duration_ms=60_000, long_poll_ms=LONG_MS
    )
    call = cq.stub.Receive.future(request, timeout=60)
    assert wait_for(lambda: cq.service.watch.waiting == 1)
    began = time.monotonic()
    append(log_stub, topic, [b"hello"])
    got = call.result()
    assert time.monotonic() - began < LONG_MS / 1000 / 4
    assert [decode(r).body for r in records_of(got)] == [b"hello"]


# -- the service --------------------------------------------------------------------------------


def health(target: str, service: str) -> int:
    with grpc.insecure_channel(target) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
    return int(answer.status)


def sample(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_segments_expiring_under_a_running_subscription_move_the_queue_minimum(
    tmp_path: Path,
) -> None:
    log = start_commitlog(
        tmp_path / "expiring",
        *EXPIRING_LOG_ARGS,
        env=EXPIRING_LOG_ENV,
        file_bytes=EXPIRING_LOG_BYTES,
    )
    cq = Cq(tmp_path / "cq", log.target, log_probe_interval_ms=100)
    try:
        with make_channel(log.target) as channel:
            stub = cl_grpc.CommitLogStub(channel)
            stored = []
            for first in range(0, 120, 20):  # a batch is written whole into one segment
                stored += append(stub, "T", bodies(20, f"b{first}"))
            cq.wait_applied(stored[-1].end_offset)

            def log_min() -> int:
                return int(stub.GetStatus(cl_pb.GetStatusRequest(), timeout=5).min_offset)

            # The log deletes what our confirmed offset lets it (every segment but the last,
            # once the whole log is confirmed); the probe then sees its new minimum and the
            # queue stops pointing below it.
            last = stored[-1].commit_log_offset
            assert wait_for(lambda: log_min() == last - last % EXPIRING_LOG_BYTES > 0)
            gone = sum(1 for s_ in stored if s_.commit_log_offset < log_min())

            def queue_min() -> int:
                info = cq.stub.GetQueueInfo(pb.GetQueueInfoRequest(topic="T"), timeout=5)
                return int(info.min_offset)

            assert wait_for(lambda: queue_min() >= gone)
            r = cq.pull("T", 0)
            assert (r.status, r.next_begin_offset) == (pb.OFFSET_TOO_SMALL, queue_min())
            r = cq.pull("T", r.next_begin_offset, max_messages=1)
            assert r.status == pb.FOUND
    finally:
        cq.stop()
        log.stop(timeout_s=15)


def test_readiness_follows_the_replay_and_status_the_subscription(
    cq: Cq, log_stub: cl_grpc.CommitLogStub, topic: str
) -> None:
    stored = append(log_stub, topic, bodies(2))
    cq.wait_applied(stored[-1].end_offset)
    target = f"127.0.0.1:{cq.service.host.health_port}"
    serving = health_pb2.HealthCheckResponse.SERVING
    assert wait_for(lambda: health(target, "readiness") == serving)
    assert health(target, "startup") == serving
    assert wait_for(lambda: health(target, "liveness") == serving)
    status = cq.stub.GetStatus(pb.GetStatusRequest())
    log_status = log_stub.GetStatus(cl_pb.GetStatusRequest())
    assert status.store_id == log_status.store_id
    assert status.applied_offset >= stored[-1].end_offset
    found_before = sample("mqstore_cq_pulls_total", status="FOUND")
    cq.pull(topic, 0)
    assert sample("mqstore_cq_pulls_total", status="FOUND") == found_before + 1
    assert sample("mqstore_cq_applied_entries_total") >= 2
    assert sample("mqstore_cq_handshakes_total", action="rebuild+correct_min") >= 1
    assert cq.service.probe.probe_once()
    log_end = log_stub.GetStatus(cl_pb.GetStatusRequest()).max_offset
    cq.wait_applied(log_end)
    assert sample("mqstore_cq_dispatch_behind_bytes") == 0
    assert sample("mqstore_cq_applied_offset") == cq.service.engine.store.applied_offset
