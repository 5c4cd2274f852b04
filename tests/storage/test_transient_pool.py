"""The transient store pool: appends land in pooled buffers, readers see committed bytes only.

RocketMQ's TransientStorePool (rocketmq-store.md §2.5, §5.9): a commit copies pooled bytes into
the file, a full and fully committed file hands its buffer back, and an empty pool makes new files
write through their map instead.
"""

from __future__ import annotations

import os
import random

import pytest

from mqstore.errors import OutOfRange
from mqstore.storage.disk import Disk, OsDisk
from mqstore.storage.mapped_file_queue import MappedFileQueue
from mqstore.storage.simdisk import SimDisk
from mqstore.storage.transient_pool import TransientStorePool

from .helpers import PAGE, append_stream, pattern, queue_bytes

FS = 4 * PAGE


def pooled_queue(
    disk: Disk, store_dir: str, buffers: int
) -> tuple[MappedFileQueue, TransientStorePool]:
    pool = TransientStorePool(buffers, FS)
    queue = MappedFileQueue(disk, store_dir, FS, pool=pool)
    queue.load()
    return queue, pool


def file_bytes_on_disk(disk: Disk, path: str) -> bytes:
    """The file's content as the file system has it (a fresh read, not the queue's map)."""
    if isinstance(disk, OsDisk):
        with open(path, "rb") as f:
            return f.read()
    return disk.read(path)


def test_pool_hands_out_its_buffers_then_none() -> None:
    pool = TransientStorePool(2, 64)
    assert pool.available() == 2
    a, b = pool.borrow(), pool.borrow()
    assert a is not None and b is not None and a is not b
    assert len(a) == 64
    assert pool.borrow() is None
    assert pool.available() == 0
    pool.give_back(a)
    assert pool.available() == 1


def test_a_buffer_given_back_is_zeroed() -> None:
    pool = TransientStorePool(1, 64)
    buf = pool.borrow()
    assert buf is not None
    buf[:] = b"\xaa" * 64
    pool.give_back(buf)
    again = pool.borrow()
    assert again is buf
    assert again == bytearray(64)


def test_a_buffer_of_the_wrong_size_is_refused() -> None:
    pool = TransientStorePool(1, 64)
    with pytest.raises(ValueError):
        pool.give_back(bytearray(63))
    assert pool.available() == 1


def test_appends_go_to_the_pooled_buffer_and_stay_invisible_until_commit(
    disk: Disk, store_dir: str
) -> None:
    queue, pool = pooled_queue(disk, store_dir, 2)
    mf = queue.get_last_mapped_file(0)
    assert mf is not None
    assert mf.uses_write_buffer
    assert pool.available() == 1
    data = pattern(PAGE + 10)
    assert mf.append_bytes(data)
    assert mf.wrote_position == len(data)
    assert mf.read_position == 0
    assert queue.max_offset() == 0
    assert queue.max_wrote_offset() == len(data)
    with pytest.raises(OutOfRange):
        mf.read(0, 1)
    assert bytes(mf.read_buf[: len(data)]) == bytes(len(data))  # the map has nothing yet
    assert file_bytes_on_disk(disk, mf.path) == bytes(FS)


def test_commit_makes_pooled_bytes_readable_and_writes_them_to_the_file(
    disk: Disk, store_dir: str
) -> None:
    queue, _ = pooled_queue(disk, store_dir, 2)
    mf = queue.get_last_mapped_file(0)
    assert mf is not None
    data = pattern(PAGE + 10)
    mf.append_bytes(data)
    assert queue.commit(0)
    assert queue.committed_where == len(data)
    assert mf.read_position == len(data)
    assert mf.read(0, len(data)) == data
    assert queue.max_offset() == len(data)
    assert file_bytes_on_disk(disk, mf.path)[: len(data)] == data
    # A second, partial-page commit appends after the first.
    more = pattern(100, 1)
    mf.append_bytes(more)
    assert queue.commit(0)
    assert mf.read(0, len(data) + 100) == data + more
    assert file_bytes_on_disk(disk, mf.path)[: len(data) + 100] == data + more


def test_commit_waits_for_least_pages(disk: Disk, store_dir: str) -> None:
    queue, _ = pooled_queue(disk, store_dir, 2)
    mf = queue.get_last_mapped_file(0)
    assert mf is not None
    mf.append_bytes(pattern(PAGE + 10))
    assert not queue.commit(2)
    assert mf.read_position == 0
    mf.append_bytes(pattern(PAGE, 1))
    assert queue.commit(2)
    assert mf.read_position == 2 * PAGE + 10


def test_flush_covers_only_committed_bytes(disk: Disk, store_dir: str) -> None:
    queue, _ = pooled_queue(disk, store_dir, 2)
    append_stream(queue, pattern(1000))
    assert not queue.flush(0)  # nothing committed, nothing to flush
    queue.commit(0)
    assert queue.flush(0)
    assert queue.flushed_where == 1000


def test_a_full_committed_file_returns_its_buffer_to_the_pool(disk: Disk, store_dir: str) -> None:
    queue, pool = pooled_queue(disk, store_dir, 2)
    data = pattern(FS + 300)
    append_stream(queue, data)
    first, second = queue.files
    assert first.uses_write_buffer and second.uses_write_buffer
    assert pool.available() == 0
    assert queue.commit(0)  # one call commits across the file boundary
    assert queue.committed_where == FS + 300
    assert not first.uses_write_buffer
    assert second.uses_write_buffer
    assert pool.available() == 1
    assert queue_bytes(queue) == data
    # The returned buffer serves the next file, zeroed: no byte of the old file leaks in.
    append_stream(queue, pattern(FS - 300 + 50, 3))
    third = queue.files[2]
    assert third.uses_write_buffer
    assert bytes(third.write_buf[50:]) == bytes(FS - 50)


def test_when_the_pool_is_empty_new_files_write_through_their_map(
    disk: Disk, store_dir: str
) -> None:
    queue, pool = pooled_queue(disk, store_dir, 1)
    append_stream(queue, pattern(FS))
    second = queue.get_last_mapped_file(0)
    assert second is not None
    assert pool.available() == 0
    assert not second.uses_write_buffer
    data = pattern(500, 7)
    second.append_bytes(data)
    assert second.read_position == 500  # visible at once: no commit needed
    assert second.read(0, 500) == data
    assert queue.commit(0)
    assert queue.committed_where == FS + 500
    assert pool.available() == 1
    assert queue_bytes(queue) == pattern(FS) + data


def test_truncate_of_a_pooled_file_zeroes_its_buffer_too(disk: Disk, store_dir: str) -> None:
    queue, _ = pooled_queue(disk, store_dir, 2)
    data = pattern(3000)
    append_stream(queue, data)
    queue.commit(0)
    queue.truncate_dirty_files(1000)
    mf = queue.files[0]
    assert bytes(mf.write_buf[1000:3000]) == bytes(2000)
    mf.append_bytes(b"new")
    queue.commit(0)
    assert mf.read(0, 1003) == data[:1000] + b"new"
    assert file_bytes_on_disk(disk, mf.path)[:3000] == data[:1000] + b"new" + bytes(1997)


def test_truncate_above_the_committed_position_keeps_uncommitted_bytes_out_of_reads(
    disk: Disk, store_dir: str
) -> None:
    queue, _ = pooled_queue(disk, store_dir, 2)
    data = pattern(6000)
    append_stream(queue, data[:3000])
    queue.commit(0)
    append_stream(queue, data[3000:])  # appended, not committed
    queue.truncate_dirty_files(5000)
    mf = queue.files[0]
    readable = mf.read(0, mf.read_position)
    assert readable == data[: len(readable)]
    queue.commit(0)
    assert mf.read(0, 5000) == data[:5000]


def test_committed_but_unflushed_bytes_are_lost_on_crash_drop() -> None:
    disk = SimDisk()
    queue, _ = pooled_queue(disk, "/store/q", 2)
    data = pattern(2000)
    append_stream(queue, data[:1000])
    queue.commit(0)
    queue.flush(0)
    append_stream(queue, data[1000:1500])
    queue.commit(0)  # visible, not durable
    append_stream(queue, data[1500:])  # not even committed
    disk.crash(random.Random(0), mode="drop")
    after = MappedFileQueue(disk, "/store/q", FS)
    after.load()
    assert queue_bytes(after) == data[:1000] + bytes(FS - 1000)


def test_destroying_a_pooled_file_returns_its_buffer_to_the_pool(
    disk: Disk, store_dir: str
) -> None:
    queue, pool = pooled_queue(disk, store_dir, 2)
    append_stream(queue, pattern(FS + 10))
    assert pool.available() == 0
    queue.truncate_dirty_files(FS - 10)  # destroys the second, still pooled, file
    queue.delete_last_mapped_file()  # and the first, pooled too
    assert queue.files == []
    assert pool.available() == 2


def test_write_at_into_committed_bytes_of_a_pooled_file_reaches_the_file_on_commit(
    disk: Disk, store_dir: str
) -> None:
    queue, _ = pooled_queue(disk, store_dir, 2)
    mf = queue.get_last_mapped_file(0)
    assert mf is not None
    mf.append_bytes(pattern(2 * PAGE))
    queue.commit(0)
    mf.write_at(10, b"\xff" * 4)
    mf.append_bytes(b"tail")
    queue.commit(0)
    assert mf.read(10, 4) == b"\xff" * 4


def test_queue_file_names_are_unchanged_by_the_pool(disk: Disk, store_dir: str) -> None:
    queue, _ = pooled_queue(disk, store_dir, 1)
    append_stream(queue, pattern(2 * FS + 1))
    assert [os.path.basename(mf.path) for mf in queue.files] == [f"{i * FS:020d}" for i in range(3)]
