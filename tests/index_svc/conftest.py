"""Fixtures for the index_svc tests: real service processes on loopback (ephemeral ports)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from index_svc.main import IndexService
from index_svc.settings import IndexSettings
from mqstore.launcher import ServiceProcess
from mqstore.rpc.channel import make_channel
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc
from mqstore.rpc.gen.index.v1 import index_pb2_grpc
from mqstore.storage.disk import Disk
from mqstore.testing.cluster import TEST_SEGMENT_BYTES

EPHEMERAL = ["--port", "0", "--health-port", "0", "--metrics-port", "0"]
# A commit log's segment size here (a restart on its data must pass the same).
SEGMENT_ARGS = ["--file-bytes", str(TEST_SEGMENT_BYTES)]
# Tiny index files (63 keys each) so that a few hundred messages roll over several files.
INDEX_GEOMETRY = ["--slot-num", "16", "--entry-num", "64", "--flush-interval-ms", "50"]

Launch = Callable[..., ServiceProcess]


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launch]:
    """launch(package, name, *args, start=True): a service process with its data in
    tmp_path/name and its log in tmp_path/logs/name.log; stopped (or killed) at teardown."""
    started: list[ServiceProcess] = []
    logs = tmp_path / "logs"
    logs.mkdir()

    def make(package: str, name: str, *args: str, start: bool = True) -> ServiceProcess:
        process = ServiceProcess(
            package,
            str(tmp_path / name),
            args=[*EPHEMERAL, *args],
            log_path=str(logs / f"{name}.log"),
        )
        started.append(process)
        if start:
            process.start()
            process.wait_listening()
        return process

    yield make
    for process in reversed(started):
        if process.running:
            process.stop(timeout_s=15)


# -- a real commit log, and index replicas in this process ------------------------------------


def start_commitlog(root: Path, name: str = "commitlog", *args: str) -> ServiceProcess:
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    process = ServiceProcess(
        "commitlog_svc",
        str(root / name),
        args=[*EPHEMERAL, *SEGMENT_ARGS, *args],
        log_path=str(logs / f"{name}.log"),
    )
    process.start()
    process.wait_listening()
    return process


@pytest.fixture(scope="module")
def commitlog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """One commit log for a module's tests; they keep apart by topic."""
    process = start_commitlog(tmp_path_factory.mktemp("commitlog"))
    yield process
    process.stop(timeout_s=15)


@pytest.fixture(scope="module")
def commitlog_stub(commitlog: ServiceProcess) -> Iterator[commitlog_pb2_grpc.CommitLogStub]:
    with make_channel(commitlog.target) as channel:
        yield commitlog_pb2_grpc.CommitLogStub(channel)


@dataclass
class Replica:
    service: IndexService
    channel: grpc.Channel

    @property
    def stub(self) -> index_pb2_grpc.IndexStub:
        return index_pb2_grpc.IndexStub(self.channel)

    @property
    def health_target(self) -> str:
        return f"127.0.0.1:{self.service.host.health_port}"


def start_replica(
    data_dir: Path, commitlog_target: str, *, disk: Disk | None = None, **overrides: object
) -> Replica:
    """index_svc's IndexService in this process (its own ports, engine, subscription)."""
    settings = IndexSettings.load(
        [],
        data_dir=str(data_dir),
        port=0,
        health_port=0,
        metrics_port=0,
        commitlog_target=commitlog_target,
        subscriber_id=data_dir.name,
        slot_num=16,
        entry_num=64,
        flush_interval_ms=50,
        grace_period_s=1.0,
        **overrides,
    )
    service = IndexService(settings, disk=disk)
    service.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{service.host.port}")
    return Replica(service, channel)


def stop_replica(replica: Replica) -> None:
    replica.channel.close()
    replica.service.host.shutdown()


@pytest.fixture(scope="module")
def replica(
    commitlog: ServiceProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replica]:
    """One caught-up replica (all keys, plain mode, at most 100 answers a query) following the
    module's commit log."""
    r = start_replica(
        tmp_path_factory.mktemp("index") / "index-0", commitlog.target, max_results=100
    )
    assert r.service.subscriber.wait_caught_up(30)
    yield r
    stop_replica(r)
