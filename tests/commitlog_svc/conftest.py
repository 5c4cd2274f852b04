"""Fixtures for the commitlog_svc tests: the real service in this process (support.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mqstore.storage import failpoints
from tests.commitlog_svc.replica_support import close_all
from tests.commitlog_svc.support import Running


@pytest.fixture(autouse=True)
def _replicas_closed() -> Iterator[None]:
    """Close every replica a test opened through replica_support (a failed assertion must not
    leave a flush thread running), and disarm failpoints."""
    yield
    failpoints.disarm_all()
    close_all()


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Running]]:
    """start(**settings) -> a running service on tmp_path/"log" (or data_dir=...); every one
    still running is stopped when the test ends."""
    started: list[Running] = []

    def make(data_dir: Path | str | None = None, **overrides: Any) -> Running:
        running = Running(data_dir if data_dir is not None else tmp_path / "log", **overrides)
        started.append(running)
        return running

    yield make
    failpoints.disarm_all()
    for running in reversed(started):
        running.stop()


@pytest.fixture
def svc(start: Callable[..., Running]) -> Running:
    """A running service with async flush."""
    return start()
