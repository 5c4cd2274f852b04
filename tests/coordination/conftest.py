"""A real etcd for the coordinator's tests: one per session, a group of its own per test.

etcd runs with --unsafe-no-fsync here (no machine crash happens in these tests, and a killed
process loses nothing etcd already wrote); the fault tests start an etcd of their own.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator

import pytest

from mqstore.coordination.etcd import EtcdCoordinator
from mqstore.coordination.etcd_process import EtcdProcess

_GROUPS = itertools.count()


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    root = tmp_path_factory.mktemp("etcd")
    process = EtcdProcess(data_dir=str(root / "data"), unsafe_no_fsync=True)
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def group(request: pytest.FixtureRequest) -> str:
    """A group name no other test uses, so tests share one etcd without meeting."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", f"t{next(_GROUPS)}-{request.node.name[:60]}")


@pytest.fixture
def coordinators(etcd: EtcdProcess, group: str) -> Iterator[Callable[[], EtcdCoordinator]]:
    """Makes coordinators of the test's group (one per replica), all closed at the end."""
    made: list[EtcdCoordinator] = []

    def make() -> EtcdCoordinator:
        coordinator = EtcdCoordinator(etcd.endpoint, group)
        made.append(coordinator)
        return coordinator

    yield make
    for coordinator in made:
        coordinator.close()
