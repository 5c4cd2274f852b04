"""Fixtures for the index tests: engines on the simulated disk (crashes) or on real files."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from index_svc.config import IndexConfig
from index_svc.engine import IndexEngine
from mqstore.storage import failpoints
from mqstore.storage.clock import ManualClock
from mqstore.storage.disk import Disk, OsDisk
from mqstore.storage.simdisk import SimDisk


@pytest.fixture(autouse=True)
def _disarm_failpoints() -> Iterator[None]:
    yield
    failpoints.disarm_all()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=["sim", "os"])
def disk_dir(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Disk, str]:
    """Both disks: a SimDisk at an absolute path, or real files in tmp_path."""
    if request.param == "sim":
        return SimDisk(), "/data/index-svc"
    return OsDisk(), str(tmp_path / "index-svc")


EngineFactory = Callable[..., IndexEngine]


@pytest.fixture
def sim() -> SimDisk:
    return SimDisk()


@pytest.fixture
def make_engine(sim: SimDisk, clock: ManualClock) -> Iterator[EngineFactory]:
    """Open an engine on the shared SimDisk with tiny files; config overrides as keywords."""
    opened: list[IndexEngine] = []

    def make(data_dir: str = "/data/idx", **overrides: object) -> IndexEngine:
        engine = IndexEngine(IndexConfig.for_tests(data_dir, **overrides), disk=sim, clock=clock)
        engine.open()
        opened.append(engine)
        return engine

    yield make
    for engine in opened:
        engine.close()
