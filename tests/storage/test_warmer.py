"""The segment warmer faults pages in ahead of the writer and never changes a byte."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest

from mqstore.storage.disk import OsDisk
from mqstore.storage.mapped_file_queue import MappedFileQueue
from mqstore.storage.simdisk import SimDisk
from mqstore.storage.warmer import WARM_CHUNK_BYTES, SegmentWarmer

FILE_BYTES = 16 << 20


def _wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_populate_leaves_written_and_unwritten_bytes_as_they_were(tmp_path: object) -> None:
    queue = MappedFileQueue(OsDisk(), str(tmp_path), FILE_BYTES)
    mf = queue.get_last_mapped_file(0)
    assert mf is not None
    data = os.urandom(10_000)
    assert mf.append_bytes(data)
    if not mf.populate(0, FILE_BYTES):
        pytest.skip("this kernel has no MADV_POPULATE_WRITE")
    assert bytes(mf.buf[:10_000]) == data
    assert bytes(mf.buf[10_000:2_000_000]) == bytes(1_990_000)
    queue.shutdown()


def test_the_warmer_keeps_a_window_ahead_of_the_write_position_and_follows_new_files(
    tmp_path: object,
) -> None:
    queue = MappedFileQueue(OsDisk(), str(tmp_path), FILE_BYTES)
    first = queue.get_last_mapped_file(0)
    assert first is not None
    if not first.populate(0, 4096):
        pytest.skip("this kernel has no MADV_POPULATE_WRITE")
    ahead = 3 * WARM_CHUNK_BYTES
    warmer = SegmentWarmer(queue, ahead)
    warmer.start()
    try:
        assert _wait_for(lambda: warmer.warmed_bytes >= ahead)
        first.buf[0 : FILE_BYTES - 8] = b"\x01" * (FILE_BYTES - 8)
        first.advance(FILE_BYTES - 8)
        first.append_bytes(bytes(8))
        assert first.is_full()
        # A new file: the window moves there, and never past its end.
        queue.get_last_mapped_file(0)
        assert _wait_for(lambda: warmer.warmed_bytes >= ahead + min(ahead, FILE_BYTES))
    finally:
        warmer.stop()
    assert warmer.warmed_bytes <= 2 * FILE_BYTES
    queue.shutdown()


def test_the_warmer_stops_quietly_where_pages_cannot_be_populated() -> None:
    disk = SimDisk()
    disk.makedirs("/q")
    queue = MappedFileQueue(disk, "/q", 4096)
    queue.get_last_mapped_file(0)
    warmer = SegmentWarmer(queue, 1 << 20)
    warmer.start()
    assert _wait_for(warmer._stop.is_set)  # the thread ended itself
    warmer.stop()
    assert warmer.warmed_bytes == 0
