"""index_svc processes against a real commit log: a replica stopped by SIGTERM or killed with
kill -9 mid-load comes back, catches up from its checkpoint, and answers exactly what the log
holds; until a replica has caught up it answers UNAVAILABLE and is not ready."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from mqstore.formats.index_checkpoint import IndexCheckpoint, decode_checkpoint
from mqstore.launcher import ServiceProcess
from mqstore.rpc.channel import make_channel
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc
from mqstore.rpc.gen.index.v1 import index_pb2 as pb
from mqstore.rpc.gen.index.v1 import index_pb2_grpc
from tests.index_svc.conftest import (
    EPHEMERAL,
    INDEX_GEOMETRY,
    SEGMENT_ARGS,
    Launch,
    start_commitlog,
)
from tests.index_svc.support import Appended, append, health_status, offsets_of, wait_applied

KEYS = 7  # keys r-0 .. r-6, spread over every batch
MAX = 64


class Workload:
    """Batches of messages with keys and unique ids, and what a query for each must answer."""

    def __init__(self, stub: commitlog_pb2_grpc.CommitLogStub, topic: str) -> None:
        self.stub, self.topic = stub, topic
        self.by_key: dict[str, list[int]] = defaultdict(list)
        self.by_uniq: dict[str, int] = {}
        self.count = 0
        self.last: Appended | None = None

    def batch(self, n: int) -> Appended:
        messages = [(f"r-{(self.count + i) % KEYS} all", f"U-{self.count + i}") for i in range(n)]
        stored = append(self.stub, self.topic, messages)
        for (keys, uniq), offset in zip(messages, stored.offsets, strict=True):
            for key in keys.split():
                self.by_key[key].append(offset)
            self.by_uniq[uniq] = offset
        self.count += n
        self.last = stored
        return stored

    def check(self, stub: index_pb2_grpc.IndexStub) -> None:
        for key, offsets in self.by_key.items():
            answer = stub.QueryByKey(pb.QueryByKeyRequest(topic=self.topic, key=key), timeout=30)
            assert offsets_of(answer) == sorted(offsets, reverse=True)[:MAX], key
        for uniq in ("U-0", f"U-{self.count // 2}", f"U-{self.count - 1}"):
            answer = stub.QueryByUniqKey(
                pb.QueryByUniqKeyRequest(topic=self.topic, uniq_key=uniq), timeout=30
            )
            assert offsets_of(answer) == [self.by_uniq[uniq]]


def start_index(launch: Launch, commitlog: ServiceProcess, name: str) -> ServiceProcess:
    return launch("index_svc", name, *INDEX_GEOMETRY, "--commitlog-target", commitlog.target)


@pytest.mark.parametrize("how", ["sigterm", "kill"])
def test_a_restarted_replica_catches_up_and_answers_what_the_log_holds(
    how: str, launch: Launch, tmp_path: Path
) -> None:
    commitlog = start_commitlog(tmp_path)
    try:
        with make_channel(commitlog.target) as channel:
            work = Workload(commitlog_pb2_grpc.CommitLogStub(channel), f"Restart{how}")
            index = start_index(launch, commitlog, "index-0")
            for _ in range(3):
                work.batch(40)  # 80 keys a batch: files of 63 keys roll over
            if how == "sigterm":
                assert work.last is not None
                with index_stub(index) as stub:
                    wait_applied(stub, work.last.end_offset)
                assert index.stop() == 0
                checkpoint = read_checkpoint(index)
                assert checkpoint.clean_close
                assert checkpoint.confirmed_offset == work.last.end_offset
            else:
                index.kill()  # mid-load: whatever it had applied or flushed, or not
            for _ in range(2):
                work.batch(25)  # appended while the replica is down
            index.start()
            index.wait_listening()
            index.wait_ready()
            with index_stub(index) as stub:
                assert work.last is not None
                wait_applied(stub, work.last.end_offset)
                work.check(stub)
                work.batch(10)  # and it follows the log again
                wait_applied(stub, work.last.end_offset)
                work.check(stub)
    finally:
        commitlog.stop()


def test_queries_are_unavailable_until_the_replica_caught_up(
    launch: Launch, tmp_path: Path
) -> None:
    commitlog = start_commitlog(tmp_path)
    with make_channel(commitlog.target) as channel:
        work = Workload(commitlog_pb2_grpc.CommitLogStub(channel), "Late")
        for _ in range(3):
            work.batch(30)
    port = commitlog.ports["port"]
    assert commitlog.stop() == 0  # the replica starts while the log is away
    index = start_index(launch, commitlog, "index-0")
    with index_stub(index) as stub:
        check_unavailable_then_answers(stub, index, commitlog, port, work)


def check_unavailable_then_answers(
    stub: index_pb2_grpc.IndexStub,
    index: ServiceProcess,
    commitlog: ServiceProcess,
    port: int,
    work: Workload,
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.QueryByKey(pb.QueryByKeyRequest(topic="Late", key="r-1"), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert not stub.GetStatus(pb.GetStatusRequest(), timeout=10).caught_up
    assert health_status(index.health_target, "readiness") == "NOT_SERVING"
    assert health_status(index.health_target, "liveness") == "SERVING"

    again = ServiceProcess(
        "commitlog_svc",
        commitlog.data_dir,
        args=[*EPHEMERAL[:1], str(port), *EPHEMERAL[2:], *SEGMENT_ARGS],
        log_path=commitlog.log_path,
    )
    again.start()
    try:
        again.wait_listening()
        index.wait_ready()
        status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
        assert status.caught_up
        assert work.last is not None and status.applied_offset >= work.last.end_offset
        work.check(stub)
    finally:
        again.stop()


@contextmanager
def index_stub(process: ServiceProcess) -> Iterator[index_pb2_grpc.IndexStub]:
    with make_channel(process.target) as channel:
        yield index_pb2_grpc.IndexStub(channel)


def read_checkpoint(process: ServiceProcess) -> IndexCheckpoint:
    with open(f"{process.data_dir}/index/checkpoint", "rb") as f:
        return decode_checkpoint(f.read(), path="checkpoint")
