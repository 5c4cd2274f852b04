"""Candidates whose records the commit log no longer holds (segments deleted by retention) are
dropped from answers; the rest are still served. Also the contract of the commit log's Read the
index builds on: size 0 reads the whole record at an offset (the index keeps no sizes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from mqstore.launcher import ServiceProcess
from mqstore.rpc.channel import make_channel
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as clpb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc
from mqstore.rpc.gen.index.v1 import index_pb2 as pb
from mqstore.rpc.subscriber import wait_until
from tests.answers import records_of
from tests.index_svc.conftest import start_commitlog, start_replica, stop_replica
from tests.index_svc.support import append, offsets_of, sample, wait_applied

# Segments of 4 KiB (about 30 messages), expired as soon as they are sealed, cleaned every
# 100 ms at any hour: retention deletes whatever every subscriber has confirmed.
SEGMENT_BYTES = 4096
SHORT_RETENTION = [
    "--file-bytes",
    str(SEGMENT_BYTES),
    "--file-reserved-hours",
    "0",
    "--delete-when-hours",
    "[" + ",".join(str(h) for h in range(24)) + "]",
    "--clean-interval-ms",
    "100",
]


@pytest.fixture
def short_lived_log(tmp_path: Path) -> Iterator[ServiceProcess]:
    process = start_commitlog(tmp_path, "commitlog", *SHORT_RETENTION)
    yield process
    process.stop(timeout_s=15)


def test_candidates_of_deleted_segments_are_dropped_and_the_rest_served(
    short_lived_log: ServiceProcess, tmp_path: Path
) -> None:
    # Answers as long as the test's whole key, so that every expired candidate is read; the
    # replica does not look at the log's minimum offset meanwhile.
    replica = start_replica(
        tmp_path / "index-0",
        short_lived_log.target,
        max_results=256,
        retention_check_interval_s=3_600,
    )
    try:
        with make_channel(short_lived_log.target) as channel:
            stub = commitlog_pb2_grpc.CommitLogStub(channel)
            # An append batch must fit one segment: 12 batches of 10 fill about 4 segments.
            stored = [append(stub, "Expiring", [("e", "")] * 10) for _ in range(12)]
            wait_applied(replica.stub, stored[-1].end_offset)
            offsets = [o for s in stored for o in s.offsets]

            def log_min() -> int:
                return stub.GetStatus(clpb.GetStatusRequest(), timeout=5).min_offset

            # The replica confirms what it flushed; retention then deletes the older segments
            # (and may go on deleting while the query runs).
            assert wait_until(lambda: log_min() > offsets[40], 30, 0.05)
            expired_before = sample("mqstore_index_candidates_expired_total")
            floor_before = log_min()
            answer = offsets_of(
                replica.stub.QueryByKey(
                    pb.QueryByKeyRequest(topic="Expiring", key="e", max_messages=256)
                )
            )
            floor_after = log_min()
            assert answer, "the last segment is never deleted"
            assert answer == sorted((o for o in offsets if o >= min(answer)), reverse=True)
            assert min(answer) >= floor_before
            assert {o for o in offsets if o >= floor_after} <= set(answer)
            expired = sample("mqstore_index_candidates_expired_total") - expired_before
            assert expired == len(offsets) - len(answer)
    finally:
        stop_replica(replica)


def test_a_replica_follows_the_log_minimum_and_deletes_index_files_below_it(
    short_lived_log: ServiceProcess, tmp_path: Path
) -> None:
    replica = start_replica(
        tmp_path / "index-0", short_lived_log.target, retention_check_interval_s=0.05
    )
    engine = replica.service.engine
    try:
        with make_channel(short_lived_log.target) as channel:
            stub = commitlog_pb2_grpc.CommitLogStub(channel)
            stored = [append(stub, "Following", [("f", "")] * 10) for _ in range(12)]
            wait_applied(replica.stub, stored[-1].end_offset)
            offsets = [o for s in stored for o in s.offsets]
            files_at_most = len(engine.file_names)  # 120 keys in files of 63
            assert files_at_most >= 2

            def log_min() -> int:
                return stub.GetStatus(clpb.GetStatusRequest(), timeout=5).min_offset

            # Once every segment but the last is gone (segments start at multiples of their
            # size), the log's minimum stays put, and the replica's follows it.
            floor = offsets[-1] // SEGMENT_BYTES * SEGMENT_BYTES
            assert floor > offsets[0]
            assert wait_until(lambda: log_min() == floor, 30, 0.05)
            assert wait_until(lambda: engine.min_offset == floor, 30, 0.05)
            assert len(engine.file_names) < files_at_most  # the file of the oldest keys went
            expired_before = sample("mqstore_index_candidates_expired_total")
            answer = offsets_of(
                replica.stub.QueryByKey(pb.QueryByKeyRequest(topic="Following", key="f"))
            )
            assert answer == sorted((o for o in offsets if o >= floor), reverse=True)
            # Nothing below the minimum was even read.
            assert sample("mqstore_index_candidates_expired_total") == expired_before
    finally:
        stop_replica(replica)


def test_the_commit_log_reads_the_whole_record_at_an_offset_given_size_zero(
    tmp_path: Path,
) -> None:
    process = start_commitlog(tmp_path)
    try:
        with make_channel(process.target) as channel:
            stub = commitlog_pb2_grpc.CommitLogStub(channel)
            stored = append(stub, "Whole", [("w", ""), ("w", "")])
            try:
                response = stub.Read(clpb.ReadRequest(offsets=stored.offsets, sizes=[0, 0]))
            except grpc.RpcError as err:
                pytest.fail(f"Read with size 0 failed: {err.code()} {err.details()}")
            assert list(response.statuses) == [clpb.READ_OK, clpb.READ_OK]
            assert [len(r) for r in records_of(response)] == stored.sizes
    finally:
        process.stop(timeout_s=15)
