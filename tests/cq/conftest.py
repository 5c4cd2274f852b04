"""Shared fixtures: every store test runs against both stores (file on real files in tmp_path,
RocksDB in a real directory), reopened through `reopen()` to check what survives."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cq_svc.config import StoreKind
from tests.cq.support import StoreHarness


@pytest.fixture(params=[StoreKind.FILE, StoreKind.ROCKSDB], ids=["file", "rocksdb"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreHarness]:
    h = StoreHarness(request.param, tmp_path / "cq")
    yield h
    h.close()


@pytest.fixture(params=[StoreKind.FILE, StoreKind.ROCKSDB], ids=["file", "rocksdb"])
def make_harness(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., StoreHarness]]:
    made: list[StoreHarness] = []

    def make(**overrides: object) -> StoreHarness:
        h = StoreHarness(request.param, tmp_path / f"cq{len(made)}", **overrides)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()
