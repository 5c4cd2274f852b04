"""Fixtures for the cq_svc tests: the API in this process over a real engine (support.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cq_svc.config import StoreKind
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
