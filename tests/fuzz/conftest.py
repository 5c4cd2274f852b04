"""Fixtures for the short forms of the fuzz targets: one seeded stack of the three services in
this process (fuzz/services.py), shared by every test here and stopped after them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fuzz.services import Stack


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = Stack(str(tmp_path_factory.mktemp("fuzz-stack")))
    try:
        running.seed()
        yield running
    finally:
        running.stop()
