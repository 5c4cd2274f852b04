"""Fixtures for the cq_svc tests: the API in this process over a real engine (support.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cq_svc.config import StoreKind
from mqstore.launcher import ServiceProcess
from mqstore.rpc.channel import make_channel
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as cl_grpc
from tests.cq_svc.support import ApiHarness


@pytest.fixture
def api(tmp_path: Path) -> Iterator[ApiHarness]:
    harness = ApiHarness(tmp_path / "cq")
    harness.handshake()
    yield harness
    harness.stop()


@pytest.fixture(params=[StoreKind.FILE, StoreKind.ROCKSDB], ids=["file", "rocksdb"])
def any_api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ApiHarness]:
    harness = ApiHarness(tmp_path / "cq", kind=request.param)
    harness.handshake()
    yield harness
    harness.stop()


@pytest.fixture
def log_stub(log: ServiceProcess) -> Iterator[cl_grpc.CommitLogStub]:
    """A stub of the commit log a module's `log` fixture started."""
    with make_channel(log.target) as channel:
        yield cl_grpc.CommitLogStub(channel)
