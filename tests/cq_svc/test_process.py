"""`python -m cq_svc` as a real process beside a real commitlog_svc: flags, health, SIGTERM's
graceful stop (long polls answered, everything flushed, the abort marker removed), and kill -9
followed by a restart that agrees with the log again."""

from __future__ import annotations

import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cq_svc import checkpoint
from mqstore.launcher import ServiceProcess
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as cl_grpc
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2_grpc as pb_grpc
from mqstore.storage.disk import OsDisk
from tests.answers import records_of
from tests.cq_svc.logs import EPHEMERAL_ARGS, Stored, append, decode, start_commitlog
from tests.cq_svc.support import wait_for

LONG_MS = 20_000


@pytest.fixture
def log(tmp_path: Path) -> Iterator[ServiceProcess]:
    process = start_commitlog(tmp_path)
    yield process
    process.stop(timeout_s=15)


def start_cq(root: Path, log: ServiceProcess) -> ServiceProcess:
    process = ServiceProcess(
        "cq_svc",
        str(root / "cq"),
        args=[
            *EPHEMERAL_ARGS,
            "--commitlog-target",
            log.target,
            "--subscriber-id",
            "cq-test",
            "--flush-thorough-interval-ms",
            "200",
            "--log-format",
            "console",
        ],
        log_path=str(root / "logs" / "cq.log"),
    )
    process.start()
    process.wait_listening()
    return process


def readiness(process: ServiceProcess) -> int:
    with grpc.insecure_channel(process.health_target) as channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="readiness"), timeout=5
            )
        except grpc.RpcError:
            return -1
    return int(answer.status)


def queue_contents(stub: pb_grpc.ConsumeQueueStub, queue_id: int) -> list[bytes]:
    r = stub.Pull(
        pb.PullRequest(topic="T", queue_id=queue_id, offset=0, max_messages=1_000), timeout=30
    )
    return [decode(raw).body for raw in records_of(r)]


def long_polls_waiting(process: ServiceProcess) -> float:
    """The process's mqstore_cq_long_polls_waiting gauge, scraped from its metrics port."""
    url = f"http://127.0.0.1:{process.ports['metrics_port']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    for line in text.splitlines():
        if line.startswith("mqstore_cq_long_polls_waiting "):
            return float(line.split()[1])
    return -1.0


def confirmed(process: ServiceProcess) -> int:
    return checkpoint.load(OsDisk(), process.data_dir).confirmed_offset


def appended(stored: list[Stored], queue_id: int) -> list[bytes]:
    return [s.body for s in stored if s.queue_id == queue_id]


def test_sigterm_answers_long_polls_flushes_and_removes_the_abort_marker(
    tmp_path: Path, log: ServiceProcess, log_stub: cl_grpc.CommitLogStub
) -> None:
    cq = start_cq(tmp_path, log)
    try:
        cq.wait_ready()
        stored = append(log_stub, "T", [b"a", b"b", b"c"], queue_ids=[0, 1, 0])
        with grpc.insecure_channel(cq.target) as channel:
            stub = pb_grpc.ConsumeQueueStub(channel)
            assert wait_for(lambda: queue_contents(stub, 0) == [b"a", b"c"])
            stub.CommitOffset(pb.CommitOffsetRequest(group="g", topic="T", offset=2))
            call = stub.Pull.future(
                pb.PullRequest(topic="T", offset=2, long_poll_ms=LONG_MS), timeout=60
            )
            assert wait_for(lambda: long_polls_waiting(cq) == 1)  # nothing at offset 2 yet
            began = time.monotonic()
            cq.signal(signal.SIGTERM)
            assert call.result().status == pb.OFFSET_OVERFLOW_ONE
            assert time.monotonic() - began < LONG_MS / 1000 / 4
        assert cq.proc is not None
        assert cq.proc.wait(30) == 0
        data = Path(cq.data_dir)
        assert not (data / "cq.abort").exists()
        ckpt = checkpoint.load(OsDisk(), str(data))
        assert ckpt.confirmed_offset == stored[-1].end_offset  # all of it flushed
    finally:
        cq.stop()
    again = start_cq(tmp_path, log)
    try:
        again.wait_ready()
        with grpc.insecure_channel(again.target) as channel:
            stub = pb_grpc.ConsumeQueueStub(channel)
            assert queue_contents(stub, 0) == [b"a", b"c"]
            assert stub.FetchOffset(pb.FetchOffsetRequest(group="g", topic="T")).offset == 2
    finally:
        assert again.stop() == 0


def test_after_kill_9_a_restart_agrees_with_the_log_again(
    tmp_path: Path, log: ServiceProcess, log_stub: cl_grpc.CommitLogStub
) -> None:
    cq = start_cq(tmp_path, log)
    stored: list[Stored] = []
    try:
        cq.wait_ready()
        for round_ in range(20):
            stored += append(
                log_stub,
                "T",
                [b"r%d-%d" % (round_, i) for i in range(10)],
                queue_ids=[i % 3 for i in range(10)],
            )
            if round_ == 6:
                # A checkpoint covers part of the load: the restart keeps that and cuts the rest.
                end = stored[-1].end_offset
                assert wait_for(lambda: confirmed(cq) >= end)  # noqa: B023 (called at once)
            if round_ == 12:
                cq.kill()  # mid-load: no flush, no checkpoint
        assert (Path(cq.data_dir) / "cq.abort").exists()
    finally:
        cq.stop()
    again = start_cq(tmp_path, log)
    try:
        again.wait_ready()
        with grpc.insecure_channel(again.target) as channel:
            stub = pb_grpc.ConsumeQueueStub(channel)
            for queue_id in range(3):
                assert wait_for(
                    lambda q=queue_id: queue_contents(stub, q) == appended(stored, q)  # type: ignore[misc]
                ), queue_id
    finally:
        assert again.stop() == 0
