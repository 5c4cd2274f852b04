"""Pull and Receive answers: the records laid end to end in records_blob with record_sizes,
exactly the records the commit log's Read serves for the queue offsets answered, through every
path of a pull: all read, filtered by tag, removed, corrupt, and a unit naming another record.

Real commit log process; the consume queue is fed directly (real sink and engine) with the
dispatch entries of real appends, as in test_read_failures.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from cq_svc.record_sources import RecordsAnswer, is_unit_record
from cq_svc.store import UnitColumns
from mqstore.formats.cq_unit import Unit
from mqstore.formats.record import encode_record
from mqstore.launcher import ServiceProcess
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl_pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as cl_grpc
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb
from tests.answers import records_of
from tests.cq_svc.logs import Stored, append, decode, log_read, segment_path, start_commitlog
from tests.cq_svc.support import ApiHarness, rpc_error

# Far beyond anything a test log holds: the log answers READ_OUT_OF_RANGE there.
NOWHERE = 1 << 40
LOG_FILE_BYTES = 1 << 20  # start_commitlog's segment size


@pytest.fixture
def log(tmp_path: Path) -> Iterator[ServiceProcess]:
    process = start_commitlog(tmp_path / "log")
    yield process
    process.stop(timeout_s=15)


@pytest.fixture
def api(tmp_path: Path, log: ServiceProcess) -> Iterator[ApiHarness]:
    harness = ApiHarness(tmp_path / "cq", commitlog_target=log.target)
    harness.agree_with_log()
    yield harness
    harness.stop()


def fill(api: ApiHarness, stored: list[Stored], removed: frozenset[int] = frozenset()) -> None:
    """Queue 0 of "T" gets the appended messages; those at the offsets in `removed` point
    where the log holds nothing."""
    api.dispatch(
        [
            s.entry("T", commit_log_offset=NOWHERE + 1_000 * s.queue_offset)
            if s.queue_offset in removed
            else s.entry("T")
            for s in stored
        ]
    )


def pull(api: ApiHarness, offset: int, **fields: object) -> pb.PullResponse:
    request = pb.PullRequest(topic="T", offset=offset, **fields)  # type: ignore[arg-type]
    response: pb.PullResponse = api.stub.Pull(request, timeout=30)
    return response


def assert_log_records(
    answer: pb.PullResponse, stored: list[Stored], log_stub: cl_grpc.CommitLogStub
) -> None:
    """The answer's records are the log's, those of the queue offsets it names."""
    assert records_of(answer) == log_read(log_stub, [stored[q] for q in answer.queue_offsets])


def test_a_blob_answer_holds_the_log_records_of_its_queue_offsets(
    api: ApiHarness, log_stub: cl_grpc.CommitLogStub
) -> None:
    tags = ["a", "b", "", "a", "c", "a", "b", "a", "c", "c"]
    stored = append(log_stub, "T", [b"m%d" % i * (i + 1) for i in range(len(tags))], tags=tags)
    fill(api, stored)
    cases: list[tuple[int, dict[str, object]]] = [
        (0, {}),
        (3, {"max_messages": 4}),
        (0, {"max_bytes": 3 * stored[0].size}),
        (0, {"tags": ["a"]}),
        (1, {"tags": ["b", "c"], "max_messages": 2}),
        (9, {}),
        (10, {}),  # at the end: OFFSET_OVERFLOW_ONE, no records
        (0, {"tags": ["nothing"]}),
    ]
    for offset, fields in cases:
        answer = pull(api, offset, **fields)
        assert_log_records(answer, stored, log_stub)
        wanted = fields.get("tags")
        if isinstance(wanted, list):
            assert all(stored[q].tags in wanted for q in answer.queue_offsets)
    assert not pull(api, 10).record_sizes and not pull(api, 0, tags=["nothing"]).records_blob
    everything = pull(api, 0)
    assert [decode(r).body for r in records_of(everything)] == [s.body for s in stored]


def test_a_removed_message_ends_a_blob_answer(
    api: ApiHarness, log_stub: cl_grpc.CommitLogStub
) -> None:
    # The last unit points where the log holds nothing (a tail it lost).
    stored = append(log_stub, "T", [b"m0", b"m1", b"m2"])
    fill(api, stored, removed=frozenset({2}))
    for offset in (0, 1, 2):
        assert_log_records(pull(api, offset), stored, log_stub)
    r = pull(api, 0)
    assert ([decode(x).body for x in records_of(r)], r.next_begin_offset) == ([b"m0", b"m1"], 2)
    r = pull(api, 2)
    assert (r.status, r.next_begin_offset, r.records_blob) == (pb.MESSAGE_WAS_REMOVING, 3, b"")


def test_a_corrupt_record_is_never_in_a_blob_answer(
    api: ApiHarness, log: ServiceProcess, log_stub: cl_grpc.CommitLogStub
) -> None:
    stored = append(log_stub, "T", [b"body-0", b"body-1", b"body-2", b"body-3"])
    fill(api, stored)
    victim = stored[2]
    path = segment_path(log, victim.commit_log_offset, LOG_FILE_BYTES)
    with open(path, "r+b") as f:
        f.seek(victim.commit_log_offset % LOG_FILE_BYTES)
        raw = f.read(victim.size)
        at = victim.commit_log_offset % LOG_FILE_BYTES + raw.index(b"body-2") + 5
        os.pwrite(f.fileno(), b"X", at)  # the record's CRC no longer matches
    r = pull(api, 0)
    assert [decode(x).body for x in records_of(r)] == [b"body-0", b"body-1"]
    assert_log_records(r, stored, log_stub)
    code, message, _ = rpc_error(lambda: pull(api, 2))
    assert code == grpc.StatusCode.DATA_LOSS and str(victim.commit_log_offset) in message
    got = api.stub.Receive(
        pb.ReceiveRequest(group="g", topic="T", max_messages=4, invisible_duration_ms=60_000)
    )
    assert [decode(x).body for x in records_of(got)] == [b"body-0", b"body-1", b"body-3"]
    assert list(got.queue_offsets) == [0, 1, 3] and len(got.receipt_handles) == 3


def test_a_unit_naming_another_record_is_not_served_in_blob_form(
    api: ApiHarness, log_stub: cl_grpc.CommitLogStub
) -> None:
    stored = append(log_stub, "T", [b"m0", b"m1"])
    api.dispatch([s.entry("T", queue_id=1) for s in stored])  # queue 1's units, queue 0's records
    code, message, _ = rpc_error(lambda: pull(api, 0, queue_id=1))
    assert code == grpc.StatusCode.UNAVAILABLE and "disagree" in message


def test_receive_answers_the_log_records_in_one_blob(
    api: ApiHarness, log_stub: cl_grpc.CommitLogStub
) -> None:
    stored = append(log_stub, "T", [b"r%d" % i for i in range(5)])
    fill(api, stored)

    def receive(group: str) -> pb.ReceiveResponse:
        request = pb.ReceiveRequest(
            group=group, topic="T", max_messages=4, invisible_duration_ms=60_000
        )
        response: pb.ReceiveResponse = api.stub.Receive(request, timeout=30)
        return response

    first = receive("g")
    assert list(first.queue_offsets) == [0, 1, 2, 3]
    assert records_of(first) == log_read(log_stub, stored[:4])
    assert list(receive("g").queue_offsets) == [4]
    assert not receive("g").record_sizes  # nothing left: an empty answer


# -- the column check against the record-by-record one --------------------------------------------


def test_the_column_check_of_unit_records_agrees_with_the_check_of_each() -> None:
    raws = [
        encode_record(topic="T", queue_id=2, body=b"b%d" % i, queue_offset=i, physical_offset=p)
        for i, p in enumerate([0, 200, 400, 600])
    ]
    units = [Unit(i, 200 * i, len(r), 0) for i, r in enumerate(raws)]

    def both(records: list[bytes], units: list[Unit], queue_id: int = 2) -> tuple[bool, bool]:
        """The column check of a Read's answer, and the check of each record on its own."""
        fields = ("queue_offset", "commit_log_offset", "size", "tags_code")
        columns = UnitColumns(*(np.array([getattr(u, f) for u in units]) for f in fields))
        statuses = [cl_pb.READ_OK] * len(records)
        answer = RecordsAnswer(statuses, b"".join(records), list(map(len, records)))
        as_blob = answer.names_units(queue_id, columns)
        # The segment files' answer carries its sizes as the int64 column it was asked with.
        sized = np.array(list(map(len, records)), dtype=np.int64)
        as_column = RecordsAnswer(statuses, answer.blob, sized).names_units(queue_id, columns)
        assert as_column == as_blob
        each = all(is_unit_record(r, u, queue_id) for r, u in zip(records, units, strict=True))
        return as_blob, each

    assert both(raws, units) == (True, True)
    assert both(raws, units, queue_id=1) == (False, False)
    moved = [
        Unit(u.queue_offset, u.commit_log_offset + (u.queue_offset == 2), u.size, 0) for u in units
    ]
    assert both(raws, moved) == (False, False)
    shifted = [
        Unit(u.queue_offset + (u.queue_offset == 3), u.commit_log_offset, u.size, 0) for u in units
    ]
    assert both(raws, shifted) == (False, False)
    assert both([*raws[:3], raws[3][:-1]], units) == (False, False)
    assert both([*raws[:3], raws[3][:20]], [*units[:3], Unit(3, 600, 20, 0)]) == (False, False)
    assert both([], []) == (True, True)


def test_the_parts_of_an_answer_are_views_of_its_records_and_check_as_the_whole() -> None:
    raws = [
        encode_record(topic="T", queue_id=q, body=b"b%d" % i, queue_offset=i, physical_offset=p)
        for i, (q, p) in enumerate([(1, 0), (1, 200), (2, 400), (2, 600), (2, 800)])
    ]
    sizes = np.array(list(map(len, raws)), dtype=np.int64)
    whole = RecordsAnswer([cl_pb.READ_OK] * 5, b"".join(raws), sizes)
    first, second = whole.parts([2, 3])
    assert isinstance(first.blob, memoryview) and first.blob.obj is whole.blob  # no copy
    assert first.as_records() == raws[:2] and second.as_records() == raws[2:]
    assert all(type(r) is bytes for r in second.as_records())

    def units(first: int, end: int) -> UnitColumns:
        phy = [0, 200, 400, 600, 800][first:end]
        n = len(phy)
        return UnitColumns(
            np.arange(first, end), np.array(phy), sizes[first:end], np.zeros(n, dtype=np.int64)
        )

    assert first.names_units(1, units(0, 2))
    assert second.names_units(2, units(2, 5))
    assert not second.names_units(1, units(2, 5))
