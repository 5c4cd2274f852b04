"""PullStream: consecutive Pulls of one queue over one server stream. Each answer must be what
a unary Pull from the previous answer's next_begin_offset gives, byte for byte; the stream
ends where the proto says; bad input, and too many open streams, get their status; an answer
holds at most stream_answer_bytes_max of records.

Real commit log process; the consume queue is fed directly (real sink and engine) with the
dispatch entries of real appends, as in test_pull_blob.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from mqstore.launcher import ServiceProcess
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as cl_grpc
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb
from mqstore.storage import failpoints
from tests.cq_svc.logs import append, start_commitlog
from tests.cq_svc.support import ApiHarness, rpc_error

MESSAGES = 50
WAIT_S = 30.0  # the longest a held stream waits at its failpoint


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    process = start_commitlog(tmp_path_factory.mktemp("stream") / "log")
    yield process
    process.stop(timeout_s=15)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, log: ServiceProcess) -> Iterator[ApiHarness]:
    harness = ApiHarness(
        tmp_path_factory.mktemp("stream") / "cq",
        commitlog_target=log.target,
        pull_streams_max=2,
        pull_stream_batches_max=5,
    )
    harness.handshake()
    stub = cl_grpc.CommitLogStub(harness.log_channel)
    tags = ["a" if i % 3 else "b" for i in range(MESSAGES)]
    stored = append(stub, "T", [b"m%d" % i for i in range(MESSAGES)], tags=tags)
    harness.dispatch([s.entry("T") for s in stored])
    yield harness
    harness.stop()


def request(offset: int, *, max_batches: int = 0, **fields: object) -> pb.PullStreamRequest:
    pull = pb.PullRequest(topic="T", offset=offset, **fields)  # type: ignore[arg-type]
    return pb.PullStreamRequest(pull=pull, max_batches=max_batches)


def unary_walk(api: ApiHarness, first: pb.PullRequest, count: int) -> list[pb.PullResponse]:
    """What `count` unary Pulls give, each from the last answer's next_begin_offset, stopping
    where a stream stops."""
    out = []
    pull = pb.PullRequest()
    pull.CopyFrom(first)
    for _ in range(count):
        response: pb.PullResponse = api.stub.Pull(pull, timeout=30)
        out.append(response)
        if (
            response.status not in (pb.FOUND, pb.NO_MATCHED_MESSAGE)
            or response.next_begin_offset >= response.max_offset
        ):
            break
        pull.offset = response.next_begin_offset
    return out


@pytest.mark.parametrize(
    ("offset", "fields"),
    [
        (0, {"max_messages": 7}),
        (3, {"max_messages": 4, "tags": ["b"]}),
        (0, {"max_messages": 1_000}),
        (MESSAGES - 2, {"max_messages": 1}),
    ],
)
def test_each_answer_is_the_unary_pull_from_the_last_ones_next_offset(
    api: ApiHarness, offset: int, fields: dict[str, object]
) -> None:
    req = request(offset, **fields)
    streamed = list(api.stub.PullStream(req, timeout=30))
    walked = unary_walk(api, req.pull, 5)
    assert streamed == walked
    assert [r.SerializeToString() for r in streamed] == [r.SerializeToString() for r in walked]
    assert streamed[0].status == pb.FOUND


def test_a_stream_ends_after_max_batches_and_at_the_queues_end(api: ApiHarness) -> None:
    two = list(api.stub.PullStream(request(0, max_batches=2, max_messages=3), timeout=30))
    assert [list(r.queue_offsets) for r in two] == [[0, 1, 2], [3, 4, 5]]
    capped = list(api.stub.PullStream(request(0, max_batches=1_000, max_messages=3), timeout=30))
    assert len(capped) == 5  # the server's cap
    tail = list(api.stub.PullStream(request(MESSAGES - 4, max_messages=3), timeout=30))
    assert [len(r.queue_offsets) for r in tail] == [3, 1]
    assert tail[-1].next_begin_offset == tail[-1].max_offset == MESSAGES
    at_end = list(api.stub.PullStream(request(MESSAGES), timeout=30))
    assert [r.status for r in at_end] == [pb.OFFSET_OVERFLOW_ONE]
    unknown = pb.PullStreamRequest(pull=pb.PullRequest(topic="nobody", queue_id=0))
    assert [r.status for r in api.stub.PullStream(unknown, timeout=30)] == [pb.NO_MESSAGE_IN_QUEUE]


@pytest.mark.parametrize(
    ("req", "field"),
    [
        (request(0, max_batches=-1), "max_batches"),
        (request(-1), "offset"),
        (request(0, max_messages=-5), "max_messages"),
        (pb.PullStreamRequest(pull=pb.PullRequest(topic="bad/topic")), "topic"),
    ],
)
def test_bad_input_is_invalid_argument(
    api: ApiHarness, req: pb.PullStreamRequest, field: str
) -> None:
    code, message, _ = rpc_error(lambda: list(api.stub.PullStream(req, timeout=30)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert field.replace("_", " ") in message.replace("_", " ")


def test_past_the_open_streams_limit_a_stream_is_refused_until_one_ends(api: ApiHarness) -> None:
    # A stream holds its slot while its reader is slow; the caller's transport takes in several
    # MiB unread first, so the two streams are held at a failpoint after their first answer.
    gate = threading.Event()

    def hold(_: str) -> None:
        gate.wait(WAIT_S)

    with failpoints.armed("cq.pull_stream.after_answer", hold):
        open_streams = [
            api.stub.PullStream(request(0, max_messages=1), timeout=30) for _ in range(2)
        ]
        for stream in open_streams:
            next(stream)
        code, message, _ = rpc_error(lambda: list(api.stub.PullStream(request(0), timeout=30)))
        gate.set()
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "pull streams" in message
    open_streams[0].cancel()
    for answer in open_streams[1]:
        assert answer.status == pb.FOUND  # read to its end: its slot frees
    for _ in range(100):  # the cancelled stream's slot frees once its thread sees the cancel
        try:
            assert list(api.stub.PullStream(request(0, max_batches=1), timeout=30))
            break
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            time.sleep(0.05)
    else:
        raise AssertionError("a slot never came free")


def test_each_answer_carries_at_most_stream_answer_bytes_max_of_records(
    log: ServiceProcess, tmp_path: Path
) -> None:
    """Issue 23, item 4: a stream holds its answer while a slow reader takes it, so an answer
    is at most stream_answer_bytes_max of records (whatever the pull's max_bytes), at least one
    record; the stream goes on from there."""
    budget = 1_000
    small = ApiHarness(tmp_path / "cq", commitlog_target=log.target, stream_answer_bytes_max=budget)
    try:
        small.handshake()
        stub = cl_grpc.CommitLogStub(small.log_channel)
        stored = append(stub, "Big", [b"%03d" % i + b"x" * 300 for i in range(12)])
        small.dispatch([s.entry("Big") for s in stored])
        pull = pb.PullRequest(topic="Big", max_messages=1_000, max_bytes=1 << 20)
        answers = list(small.stub.PullStream(pb.PullStreamRequest(pull=pull), timeout=30))
        unary = small.stub.Pull(pull, timeout=30)  # a unary Pull keeps its own max_bytes
    finally:
        small.stop()
    assert len(unary.queue_offsets) == 12
    assert all(sum(a.record_sizes) <= budget for a in answers)
    assert [len(a.queue_offsets) for a in answers][:-1] == [budget // stored[0].size] * (
        len(answers) - 1
    )
    assert [o for a in answers for o in a.queue_offsets] == list(range(12))
    assert b"".join(a.records_blob for a in answers) == unary.records_blob
