"""Fixtures for the storage tests: every mapped-file test runs on the real file system
(files under tmp_path) and on the simulated disk."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mqstore.storage import failpoints
from mqstore.storage.disk import Disk, OsDisk
from mqstore.storage.simdisk import SimDisk


@pytest.fixture(params=["os", "sim"])
def disk(request: pytest.FixtureRequest) -> Disk:
    if request.param == "os":
        return OsDisk()
    return SimDisk()


@pytest.fixture
def store_dir(disk: Disk, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The queue directory: a fresh real directory on OsDisk, an absolute path on SimDisk."""
    if isinstance(disk, SimDisk):
        return "/store/queue"
    return str(tmp_path_factory.mktemp("store") / "queue")


@pytest.fixture(autouse=True)
def _no_armed_failpoints() -> Iterator[None]:
    """Failpoints are process-global: no test may leak an armed point into the next."""
    failpoints.disarm_all()
    yield
    failpoints.disarm_all()
