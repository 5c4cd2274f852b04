"""Reading candidates back from a real commit log (index_svc/records.py): intact records are
decoded into messages, damaged ones are counted and never returned, missing ones are dropped;
offsets alone (whole-record reads) and ranges of known size read the same."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from index_svc.records import CommitLogReader
from mqstore.launcher import ServiceProcess
from mqstore.rpc.channel import make_channel
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as clpb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc
from tests.index_svc.conftest import start_commitlog
from tests.index_svc.support import (
    append,
    commitlog_calls,
    flip_body_bit,
    sample,
    segment_holding,
)

TIMEOUT_S = 10.0


@pytest.fixture
def reader(commitlog: ServiceProcess) -> Iterator[CommitLogReader]:
    with make_channel(commitlog.target) as channel:
        yield CommitLogReader(channel)


def test_ranges_and_offsets_read_the_same_messages(
    commitlog_stub: commitlog_pb2_grpc.CommitLogStub, reader: CommitLogReader
) -> None:
    stored = append(commitlog_stub, "Read", [("a b", "U-1"), ("c", ""), ("", "U-3")])
    by_range = reader.read_ranges(stored.offsets, stored.sizes, TIMEOUT_S)
    by_offset = reader.read(stored.offsets, TIMEOUT_S)
    assert sorted(by_range.records) == sorted(by_offset.records) == stored.offsets
    for offset in stored.offsets:
        assert by_range.records[offset].message == by_offset.records[offset].message
        msg_id = by_range.records[offset].message.msg_id
        assert commitlog_stub.GetMessage(clpb.GetMessageRequest(msg_id=msg_id)) == (
            by_range.records[offset].message
        )
    first = by_range.records[stored.offsets[0]]
    assert (first.topic, first.keys, first.uniq_key) == ("Read", "a b", "U-1")
    assert first.message.body == b"body-0"


def test_a_damaged_record_is_counted_and_not_returned(
    commitlog: ServiceProcess,
    commitlog_stub: commitlog_pb2_grpc.CommitLogStub,
    reader: CommitLogReader,
) -> None:
    stored = append(commitlog_stub, "Torn", [("t", "")] * 3)
    flip_body_bit(commitlog.data_dir, stored.offsets[0])
    for read in (
        lambda: reader.read_ranges(stored.offsets, stored.sizes, TIMEOUT_S),
        lambda: reader.read(stored.offsets, TIMEOUT_S),
    ):
        corrupt_before = sample("mqstore_index_candidates_corrupt_total")
        outcome = read()
        assert outcome.corrupt == stored.offsets[:1]
        assert sorted(outcome.records) == stored.offsets[1:]
        assert sample("mqstore_index_candidates_corrupt_total") == corrupt_before + 1


def test_a_record_whose_key_property_changed_on_disk_is_not_confirmed(
    commitlog: ServiceProcess,
    commitlog_stub: commitlog_pb2_grpc.CommitLogStub,
    reader: CommitLogReader,
) -> None:
    """A byte of the KEYS property changed ("key-a" reads "key-`"): the body CRC does not
    cover it, the whole-record CRC does, so the candidate is corrupt, never a record carrying
    a key nobody stored."""
    stored = append(commitlog_stub, "Keyed", [("key-a", "")] * 2)
    path = segment_holding(commitlog.data_dir, stored.offsets[0])
    start = int(os.path.basename(path))
    with open(path, "r+b") as f:
        f.seek(stored.offsets[0] - start)
        raw = f.read(stored.sizes[0])
        at = stored.offsets[0] - start + raw.index(b"key-a") + 4
        f.seek(at)
        f.write(b"`")
    outcome = reader.read(stored.offsets, TIMEOUT_S)
    assert outcome.corrupt == stored.offsets[:1]
    assert sorted(outcome.records) == stored.offsets[1:]


def test_a_record_the_log_does_not_hold_is_dropped(
    commitlog_stub: commitlog_pb2_grpc.CommitLogStub, reader: CommitLogReader
) -> None:
    stored = append(commitlog_stub, "Held", [("h", "")])
    beyond = stored.end_offset + 1_000_000
    by_range = reader.read_ranges([stored.offsets[0], beyond], [stored.sizes[0], 100], TIMEOUT_S)
    assert (sorted(by_range.records), by_range.expired) == (stored.offsets, [beyond])
    by_offset = reader.read([stored.offsets[0], beyond], TIMEOUT_S)
    assert (sorted(by_offset.records), by_offset.expired) == (stored.offsets, [beyond])


def test_ranges_of_wrong_size_are_a_bug_not_an_answer(
    commitlog_stub: commitlog_pb2_grpc.CommitLogStub, reader: CommitLogReader
) -> None:
    stored = append(commitlog_stub, "Sized", [("s", "")])
    with pytest.raises(grpc.RpcError) as info:
        reader.read_ranges(stored.offsets, [-1], TIMEOUT_S)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_an_answer_over_the_message_limit_is_read_in_parts(tmp_path: Path) -> None:
    """Five records of 300 KB do not fit one 1 MiB answer: the Read is split until they do."""
    small = start_commitlog(tmp_path, "commitlog", "--max-message-bytes", str(1 << 20))
    try:
        with make_channel(small.target) as channel:
            stub = commitlog_pb2_grpc.CommitLogStub(channel)
            body = b"x" * 300_000
            offsets = [
                append(stub, "Big", [("b", "")], body_prefix=body).offsets[0] for _ in range(5)
            ]
            reads_before = commitlog_calls(small, "Read")
            outcome = CommitLogReader(channel).read(offsets, TIMEOUT_S)
            assert sorted(outcome.records) == offsets
            assert all(r.message.body.startswith(body) for r in outcome.records.values())
            assert commitlog_calls(small, "Read") > reads_before + 1
    finally:
        small.stop(timeout_s=15)
