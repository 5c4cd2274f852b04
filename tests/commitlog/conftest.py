"""Fixtures shared by the commit-log tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from commitlog_testlib import OPENED

from mqstore.storage import failpoints


@pytest.fixture(autouse=True)
def _close_what_the_test_left_open() -> Iterator[None]:
    """Close every store a test left running (say, when an assertion failed before its own
    close()), and disarm failpoints, so that nothing carries over into the next test."""
    yield
    failpoints.disarm_all()
    while OPENED:
        log = OPENED.pop()
        if log.running:
            log.close()
