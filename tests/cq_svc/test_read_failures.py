"""What a pull or receive does with records the real commit log will not serve: removed
(READ_OUT_OF_RANGE: its segment expired), corrupt (READ_CORRUPT), or another record than the
unit names.

The consume queue is fed directly (the real sink and engine) with the dispatch entries of real
appends, so that it keeps pointing at segments the real log has since expired (a subscribed
cq_svc would drop those units when it saw the log's minimum move: see test_with_commitlog.py),
or with entries changed to point elsewhere."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from mqstore.launcher import ServiceProcess
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl_pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as cl_grpc
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb
from tests.answers import records_of
from tests.cq_svc.logs import (
    EXPIRING_LOG_ARGS,
    EXPIRING_LOG_BYTES,
    EXPIRING_LOG_ENV,
    Stored,
    append,
    decode,
    segment_path,
    start_commitlog,
)
from tests.cq_svc.support import ApiHarness, rpc_error, wait_for

# Far beyond anything a test log will hold: the log answers READ_OUT_OF_RANGE there.
NOWHERE = 1 << 40


@pytest.fixture
def log(tmp_path: Path) -> Iterator[ServiceProcess]:
    process = start_commitlog(
        tmp_path, *EXPIRING_LOG_ARGS, env=EXPIRING_LOG_ENV, file_bytes=EXPIRING_LOG_BYTES
    )
    yield process
    process.stop(timeout_s=15)


@pytest.fixture
def api(tmp_path: Path, log: ServiceProcess) -> Iterator[ApiHarness]:
    harness = ApiHarness(tmp_path / "cq", commitlog_target=log.target)
    harness.agree_with_log()
    yield harness
    harness.stop()


def expire_some(log_stub: cl_grpc.CommitLogStub, count: int = 90) -> tuple[list[Stored], int]:
    """Append `count` messages over several segments and wait for retention to delete the
    leading ones; returns them and the log's new minimum."""
    stored: list[Stored] = []
    # A batch is written whole into one 4 KiB segment: two batches of 15 records (~120 bytes
    # each) fill one, so the log has three segments and retention deletes the first two.
    for first in range(0, count, 15):
        stored += append(log_stub, "T", [b"old-%d" % i for i in range(first, first + 15)])

    def minimum() -> int:
        return int(log_stub.GetStatus(cl_pb.GetStatusRequest(), timeout=5).min_offset)

    assert wait_for(lambda: minimum() > 2 * EXPIRING_LOG_BYTES - 1), "retention deleted nothing"
    return stored, minimum()


def fill(api: ApiHarness, stored: list[Stored], removed: set[int], queue_id: int = 0) -> None:
    """Queue `queue_id` of "T" gets the appended messages; those at the offsets in `removed`
    point where the log holds nothing."""
    api.dispatch(
        [
            s.entry("T", queue_id=queue_id, commit_log_offset=NOWHERE + 1_000 * s.queue_offset)
            if s.queue_offset in removed
            else s.entry("T", queue_id=queue_id)
            for s in stored
        ]
    )


def pull(api: ApiHarness, offset: int, **fields: object) -> pb.PullResponse:
    request = pb.PullRequest(topic="T", offset=offset, **fields)  # type: ignore[arg-type]
    response: pb.PullResponse = api.stub.Pull(request, timeout=30)
    return response


def bodies_of(response: pb.PullResponse) -> list[bytes]:
    return [decode(r).body for r in records_of(response)]


def test_removed_messages_at_the_start_are_stepped_over(
    api: ApiHarness, log_stub: cl_grpc.CommitLogStub
) -> None:
    stored, minimum = expire_some(log_stub)
    fill(api, stored, removed=set())
    gone = sum(1 for s in stored if s.commit_log_offset < minimum)
    assert 0 < gone < len(stored)
    r = pull(api, gone - 2, max_messages=4)
    assert (r.status, list(r.queue_offsets)) == (pb.FOUND, [gone, gone + 1])
    assert bodies_of(r) == [b"old-%d" % gone, b"old-%d" % (gone + 1)]
    assert r.next_begin_offset == gone + 2


def test_only_removed_messages_answer_message_was_removing_and_move_past_them(
    api: ApiHarness, log_stub: cl_grpc.CommitLogStub
) -> None:
    stored, _ = expire_some(log_stub)
    fill(api, stored, removed=set())
    r = pull(api, 0, max_messages=3)
    assert (r.status, list(records_of(r)), r.next_begin_offset) == (pb.MESSAGE_WAS_REMOVING, [], 3)


def test_a_removed_message_after_gathered_ones_ends_the_batch_there(
    api: ApiHarness, log_stub: cl_grpc.CommitLogStub
) -> None:
    # The last unit points where the log holds nothing (a tail it lost).
    stored = append(log_stub, "T", [b"m0", b"m1", b"m2"])
    fill(api, stored, removed={2})
    r = pull(api, 0)
    assert (r.status, bodies_of(r), r.next_begin_offset) == (pb.FOUND, [b"m0", b"m1"], 2)
    r = pull(api, 2)
    assert (r.status, r.next_begin_offset) == (pb.MESSAGE_WAS_REMOVING, 3)


def test_a_corrupt_record_is_never_served_and_is_data_loss_when_first(
    api: ApiHarness, log: ServiceProcess, log_stub: cl_grpc.CommitLogStub
) -> None:
    stored = append(log_stub, "T", [b"body-0", b"body-1", b"body-2", b"body-3"])
    fill(api, stored, removed=set())
    victim = stored[2]
    path = segment_path(log, victim.commit_log_offset, EXPIRING_LOG_BYTES)
    with open(path, "r+b") as f:
        f.seek(victim.commit_log_offset)
        raw = f.read(victim.size)
        at = victim.commit_log_offset + raw.index(b"body-2") + 5
        os.pwrite(f.fileno(), b"X", at)  # one body byte: the record's CRC no longer matches
    r = pull(api, 0)
    assert (r.status, bodies_of(r), r.next_begin_offset) == (pb.FOUND, [b"body-0", b"body-1"], 2)
    code, message, _ = rpc_error(lambda: pull(api, 2))
    assert code == grpc.StatusCode.DATA_LOSS
    assert str(victim.commit_log_offset) in message
    assert bodies_of(pull(api, 3)) == [b"body-3"]
    # Receive serves what it can; the corrupt one stays invisible, never handed out.
    got = api.stub.Receive(
        pb.ReceiveRequest(group="g", topic="T", max_messages=4, invisible_duration_ms=60_000)
    )
    assert [decode(r).body for r in records_of(got)] == [b"body-0", b"body-1", b"body-3"]


def test_a_unit_naming_another_record_is_not_served(
    api: ApiHarness, log_stub: cl_grpc.CommitLogStub
) -> None:
    stored = append(log_stub, "T", [b"m0", b"m1"])
    fill(api, stored, removed=set(), queue_id=1)  # queue 1's units, queue 0's records
    code, message, _ = rpc_error(lambda: pull(api, 0, queue_id=1))
    assert code == grpc.StatusCode.UNAVAILABLE and "disagree" in message


def test_received_messages_the_log_no_longer_holds_are_settled_not_redelivered(
    api: ApiHarness, log_stub: cl_grpc.CommitLogStub
) -> None:
    stored, minimum = expire_some(log_stub)
    fill(api, stored, removed=set())
    gone = sum(1 for s in stored if s.commit_log_offset < minimum)
    got = api.stub.Receive(
        pb.ReceiveRequest(group="g", topic="T", max_messages=gone + 1, invisible_duration_ms=60_000)
    )
    # Everything handed out but the last was gone: settled, never to come back.
    assert list(got.queue_offsets) == [gone]
    done = api.stub.Ack(pb.AckRequest(group="g", topic="T", receipt_handles=got.receipt_handles))
    assert done.committed_offset == gone + 1


def damage_body(log: ServiceProcess, victim: Stored, body: bytes) -> None:
    """One byte of `victim`'s body changed on disk: its CRC no longer matches (READ_CORRUPT)."""
    path = segment_path(log, victim.commit_log_offset, EXPIRING_LOG_BYTES)
    with open(path, "r+b") as f:
        f.seek(victim.commit_log_offset)
        raw = f.read(victim.size)
        os.pwrite(f.fileno(), b"X", victim.commit_log_offset + raw.index(body) + len(body) - 1)


def test_with_report_bad_records_a_corrupt_record_is_named_and_stepped_over(
    api: ApiHarness, log: ServiceProcess, log_stub: cl_grpc.CommitLogStub
) -> None:
    """Issue 23 item 3: the records before the damaged one are served, the answer names it
    with its offsets and moves past it, so no pull repeats forever on it."""
    stored = append(log_stub, "T", [b"body-0", b"body-1", b"body-2", b"body-3"])
    fill(api, stored, removed=set())
    victim = stored[2]
    damage_body(log, victim, b"body-2")

    r = pull(api, 0, report_bad_records=True)
    assert (r.status, bodies_of(r), list(r.queue_offsets)) == (
        pb.FOUND,
        [b"body-0", b"body-1"],
        [0, 1],
    )
    assert (r.bad_record.queue_offset, r.bad_record.commit_log_offset, r.bad_record.size) == (
        2,
        victim.commit_log_offset,
        victim.size,
    )
    assert "damaged" in r.bad_record.reason
    assert r.next_begin_offset == 3

    # Starting at it: FOUND with nothing served but the bad record, and past it.
    r = pull(api, 2, report_bad_records=True)
    assert (r.status, r.record_sizes, r.bad_record.queue_offset, r.next_begin_offset) == (
        pb.FOUND,
        [],
        2,
        3,
    )
    assert bodies_of(pull(api, 3, report_bad_records=True)) == [b"body-3"]

    # A PullStream goes on over it.
    answers = list(
        api.stub.PullStream(
            pb.PullStreamRequest(
                pull=pb.PullRequest(topic="T", offset=0, max_messages=2, report_bad_records=True)
            ),
            timeout=30,
        )
    )
    assert [(list(a.queue_offsets), a.HasField("bad_record")) for a in answers] == [
        ([0, 1], False),
        ([], True),
        ([3], False),
    ]


def test_with_report_bad_records_receive_hands_out_the_corrupt_delivery_to_settle(
    api: ApiHarness, log: ServiceProcess, log_stub: cl_grpc.CommitLogStub
) -> None:
    stored = append(log_stub, "T", [b"body-0", b"body-1", b"body-2"])
    fill(api, stored, removed=set())
    damage_body(log, stored[1], b"body-1")

    def receive() -> pb.ReceiveResponse:
        response: pb.ReceiveResponse = api.stub.Receive(
            pb.ReceiveRequest(
                group="g",
                topic="T",
                max_messages=3,
                invisible_duration_ms=60_000,
                report_bad_records=True,
            ),
            timeout=30,
        )
        return response

    got = receive()
    assert list(got.queue_offsets) == [0, 2]
    (bad,) = got.bad_records
    assert (bad.queue_offset, bad.commit_log_offset, bad.delivery_count) == (
        1,
        stored[1].commit_log_offset,
        1,
    )
    handles = [*got.receipt_handles, bad.receipt_handle]
    done = api.stub.Ack(pb.AckRequest(group="g", topic="T", receipt_handles=handles))
    assert (list(done.stale_receipt_handles), done.committed_offset) == ([], 3)
    assert not receive().bad_records  # settled: never delivered again
