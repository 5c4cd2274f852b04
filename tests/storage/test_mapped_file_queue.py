"""MappedFileQueue: file creation and lookup, load rules, flush, truncation and deletion.

Mirrors RocketMQ's MappedFileQueueTest (rocketmq-store.md §9 "Mapped files") and the load rules
of MappedFileQueue.doLoad (§2.3), with 1024-byte files so that a test spans many files. Every
test runs on OsDisk and on SimDisk unless it is about one of them.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import threading

import pytest

from mqstore.errors import DiskFull, InvariantViolation
from mqstore.storage.disk import Disk
from mqstore.storage.mapped_file import MappedFile, offset_to_file_name
from mqstore.storage.mapped_file_queue import MappedFileQueue, ShortSegmentError, StoreLoadError
from mqstore.storage.simdisk import SimDisk

from .helpers import PAGE, append_stream, make_full_files, pattern, queue_bytes, set_mtime_ms

FS = 1024  # file size: small, so that rollover happens every few appends
MSG = 128  # RocketMQ's testAppendMessage: fixed-size messages that divide the file size


def new_queue(disk: Disk, store_dir: str, file_size: int = FS) -> MappedFileQueue:
    queue = MappedFileQueue(disk, store_dir, file_size)
    queue.load()
    return queue


def reload(disk: Disk, store_dir: str, file_size: int = FS) -> MappedFileQueue:
    return new_queue(disk, store_dir, file_size)


def put_file(disk: Disk, store_dir: str, name: str, size: int) -> str:
    """A file placed on disk behind the queue's back (as a crash or an operator leaves it)."""
    disk.makedirs(store_dir)
    path = os.path.join(store_dir, name)
    if size > 0:
        disk.create(path, size)
    else:
        disk.write(path, b"")
        disk.fsync_dir(store_dir)
    return path


# -- creation and lookup ------------------------------------------------------------------------


def test_check_rejects_a_non_positive_file_size(disk: Disk, store_dir: str) -> None:
    with pytest.raises(InvariantViolation):
        MappedFileQueue(disk, store_dir, 0)


def test_empty_queue_has_no_files_and_zero_offsets(disk: Disk, store_dir: str) -> None:
    queue = new_queue(disk, store_dir)
    assert queue.files == []
    assert queue.first_file() is None
    assert queue.last_file() is None
    assert queue.get_last_mapped_file(0, create=False) is None
    assert queue.find_mapped_file_by_offset(0) is None
    assert queue.find_mapped_file_by_offset(0, return_first_on_not_found=True) is None
    assert (queue.min_offset(), queue.max_offset()) == (0, 0)
    assert not queue.flush(0)


def test_get_last_mapped_file_creates_files_named_by_20_digit_offsets(
    disk: Disk, store_dir: str
) -> None:
    queue = new_queue(disk, store_dir)
    first = queue.get_last_mapped_file(0)
    assert first is not None
    assert os.path.basename(first.path) == "00000000000000000000"
    assert queue.get_last_mapped_file(0) is first  # not full: the same file
    assert first.append_bytes(pattern(FS))
    second = queue.get_last_mapped_file(0)
    assert second is not None and second is not first
    assert os.path.basename(second.path) == "00000000000000001024"
    assert disk.listdir(store_dir) == ["00000000000000000000", "00000000000000001024"]
    assert disk.size(second.path) == FS


def test_get_last_mapped_file_without_create_returns_the_full_last_file(
    disk: Disk, store_dir: str
) -> None:
    queue = new_queue(disk, store_dir)
    make_full_files(queue, 1)
    last = queue.get_last_mapped_file(0, create=False)
    assert last is queue.files[0]
    assert len(queue.files) == 1


def test_first_file_of_an_empty_queue_starts_at_the_file_holding_start_offset(
    disk: Disk, store_dir: str
) -> None:
    queue = new_queue(disk, store_dir)
    mf = queue.get_last_mapped_file(5 * FS + 17)
    assert mf is not None
    assert mf.file_from_offset == 5 * FS
    assert os.path.basename(mf.path) == offset_to_file_name(5 * FS)
    assert queue.min_offset() == 5 * FS
    assert queue.max_offset() == 5 * FS


def test_concurrent_get_last_mapped_file_creates_one_file(disk: Disk, store_dir: str) -> None:
    queue = new_queue(disk, store_dir)
    barrier = threading.Barrier(4)
    got: list[MappedFile | None] = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait(timeout=30)
        mf = queue.get_last_mapped_file(0)
        with lock:
            got.append(mf)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(got) == 4
    assert len(queue.files) == 1
    assert all(mf is queue.files[0] for mf in got)
    assert disk.listdir(store_dir) == ["00000000000000000000"]


def test_append_fixed_messages_across_many_files(disk: Disk, store_dir: str) -> None:
    """RocketMQ testAppendMessage: 1024 x 128-byte messages into 1024-byte files."""
    queue = new_queue(disk, store_dir)
    count = 128  # 16 files; enough to cross many boundaries and stay fast
    for i in range(count):
        mf = queue.get_last_mapped_file(0)
        assert mf is not None
        assert mf.append_bytes(pattern(MSG, seed=i))
    assert len(queue.files) == count * MSG // FS
    assert queue.max_offset() == count * MSG
    assert queue.min_offset() == 0
    assert queue.flush(0)
    assert queue.flushed_where == count * MSG
    for i in range(count):
        offset = i * MSG
        mf = queue.find_mapped_file_by_offset(offset)
        assert mf is not None
        assert mf.file_from_offset == offset - offset % FS
        assert mf.read(offset - mf.file_from_offset, MSG) == pattern(MSG, seed=i)


def test_append_stream_across_files_reads_back_whole(disk: Disk, store_dir: str) -> None:
    queue = new_queue(disk, store_dir)
    data = pattern(5 * FS + 300)
    append_stream(queue, data)
    assert [mf.file_from_offset for mf in queue.files] == [i * FS for i in range(6)]
    assert queue_bytes(queue) == data
    assert queue.max_offset() == len(data)


def test_find_mapped_file_by_offset_maps_every_offset_to_its_file(
    disk: Disk, store_dir: str
) -> None:
    queue = new_queue(disk, store_dir)
    make_full_files(queue, 4)
    for offset in [0, 1, FS - 1, FS, 2 * FS + 500, 4 * FS - 1]:
        mf = queue.find_mapped_file_by_offset(offset)
        assert mf is not None
        assert mf.file_from_offset <= offset < mf.file_end_offset
    assert queue.find_mapped_file_by_offset(4 * FS) is None
    assert queue.find_mapped_file_by_offset(10**12) is None
    assert queue.find_mapped_file_by_offset(-1) is None


def test_find_mapped_file_by_offset_in_a_queue_starting_at_a_non_zero_offset(
    disk: Disk, store_dir: str
) -> None:
    queue = new_queue(disk, store_dir)
    start = 7 * FS
    first = queue.get_last_mapped_file(start)
    assert first is not None
    first.append_bytes(pattern(FS))
    for _ in range(2):
        mf = queue.get_last_mapped_file(0)
        assert mf is not None
        mf.append_bytes(pattern(FS))
    assert [mf.file_from_offset for mf in queue.files] == [7 * FS, 8 * FS, 9 * FS]
    for offset in [start, start + 1, 8 * FS, 9 * FS + FS - 1]:
        mf = queue.find_mapped_file_by_offset(offset)
        assert mf is not None
        assert mf.file_from_offset == offset - offset % FS
    # Below the first file and past the last one: nothing, or the first file when asked.
    for offset in [0, start - 1, 10 * FS]:
        assert queue.find_mapped_file_by_offset(offset) is None
        assert queue.find_mapped_file_by_offset(offset, return_first_on_not_found=True) is first


def test_min_and_max_offsets_follow_appends_and_leading_deletes(disk: Disk, store_dir: str) -> None:
    queue = new_queue(disk, store_dir)
    append_stream(queue, pattern(3 * FS + 10))
    assert queue.min_offset() == 0
    assert queue.max_offset() == 3 * FS + 10
    deleted = queue.delete_expired_file_by_time(
        expired_before_ms=0, floor_offset=10**12, clean_immediately=True, max_files=2
    )
    assert deleted == 2
    assert queue.min_offset() == 2 * FS
    assert queue.max_offset() == 3 * FS + 10


def test_roll_next_file_gives_the_start_of_the_next_file(disk: Disk, store_dir: str) -> None:
    queue = new_queue(disk, store_dir)
    assert queue.roll_next_file(0) == FS
    assert queue.roll_next_file(FS - 1) == FS
    assert queue.roll_next_file(FS) == 2 * FS
    assert queue.roll_next_file(3 * FS + 5) == 4 * FS


def test_create_file_replaces_a_stray_file_not_vouched_for_by_load(
    disk: Disk, store_dir: str
) -> None:
    queue = new_queue(disk, store_dir)
    make_full_files(queue, 1)
    # A file at the next offset appears after load (an allocator's spare, a leftover).
    stray = os.path.join(store_dir, offset_to_file_name(FS))
    disk.create(stray, FS)
    region = disk.map(stray, FS)
    region.buf[0:4] = b"old!"
    region.flush(0, 4)
    region.close()
    mf = queue.get_last_mapped_file(0)
    assert mf is not None and mf.path == stray
    assert bytes(mf.buf[0:4]) == bytes(4)


def test_disk_full_on_create_leaves_the_queue_unchanged() -> None:
    disk = SimDisk()
    queue = new_queue(disk, "/store/q")
    make_full_files(queue, 2)
    disk.inject("create", errno.ENOSPC)
    with pytest.raises(DiskFull):
        queue.get_last_mapped_file(0)
    assert len(queue.files) == 2
    assert disk.listdir("/store/q") == [offset_to_file_name(0), offset_to_file_name(FS)]
    mf = queue.get_last_mapped_file(0)  # the fault was one-shot: space came back
    assert mf is not None and mf.file_from_offset == 2 * FS


def test_capacity_bounds_how_many_files_the_queue_can_create() -> None:
    disk = SimDisk(capacity_bytes=3 * FS)
    queue = new_queue(disk, "/store/q")
    make_full_files(queue, 3)
    with pytest.raises(DiskFull):
        queue.get_last_mapped_file(0)
    assert len(queue.files) == 3


# -- load ---------------------------------------------------------------------------------------


def test_load_maps_files_sorted_by_name(disk: Disk, store_dir: str) -> None:
    for i in reversed(range(4)):
        put_file(disk, store_dir, offset_to_file_name(i * FS), FS)
    queue = new_queue(disk, store_dir)
    assert [mf.file_from_offset for mf in queue.files] == [0, FS, 2 * FS, 3 * FS]
    assert queue.check_self()


def test_load_skips_directories_and_names_that_are_not_segments(disk: Disk, store_dir: str) -> None:
    put_file(disk, store_dir, offset_to_file_name(0), FS)
    put_file(disk, store_dir, offset_to_file_name(FS), FS)
    disk.makedirs(os.path.join(store_dir, offset_to_file_name(2 * FS)))  # a directory
    put_file(disk, store_dir, "checkpoint", 77)
    put_file(disk, store_dir, offset_to_file_name(0) + ".tmp", 5)
    put_file(disk, store_dir, "1024", FS)
    queue = new_queue(disk, store_dir)
    assert [mf.file_from_offset for mf in queue.files] == [0, FS]
    assert disk.exists(os.path.join(store_dir, "checkpoint"))


def test_load_deletes_a_zero_length_last_file(disk: Disk, store_dir: str) -> None:
    put_file(disk, store_dir, offset_to_file_name(0), FS)
    empty = put_file(disk, store_dir, offset_to_file_name(FS), 0)
    queue = new_queue(disk, store_dir)
    assert [mf.file_from_offset for mf in queue.files] == [0]
    assert not disk.exists(empty)
    assert disk.listdir(store_dir) == [offset_to_file_name(0)]


def test_load_of_only_a_zero_length_file_gives_an_empty_queue(disk: Disk, store_dir: str) -> None:
    empty = put_file(disk, store_dir, offset_to_file_name(0), 0)
    queue = new_queue(disk, store_dir)
    assert queue.files == []
    assert not disk.exists(empty)


@pytest.mark.parametrize(
    "sizes",
    [
        [FS, 0, FS],  # zero length but not last
        [FS, FS - 1],  # short last file
        [FS, FS + 1],  # long last file
        [FS // 2, FS],  # short first file
        [2 * FS],  # written with another file size configuration
    ],
)
def test_load_refuses_any_other_wrong_sized_file(
    disk: Disk, store_dir: str, sizes: list[int]
) -> None:
    for i, size in enumerate(sizes):
        put_file(disk, store_dir, offset_to_file_name(i * FS), size)
    names_before = disk.listdir(store_dir)
    queue = MappedFileQueue(disk, store_dir, FS)
    with pytest.raises(StoreLoadError):
        queue.load()
    assert queue.files == []
    assert disk.listdir(store_dir) == names_before  # nothing deleted on a refused load


def put_short_file(disk: Disk, store_dir: str, name: str, content: bytes) -> str:
    """A segment that lost its tail: `content`, nothing after it."""
    disk.makedirs(store_dir)
    path = os.path.join(store_dir, name)
    disk.write(path, content)
    disk.fsync_dir(store_dir)
    return path


@pytest.mark.parametrize("trailing_empty", [False, True])
def test_a_short_newest_file_is_extended_with_zeros_when_asked(
    disk: Disk, store_dir: str, trailing_empty: bool
) -> None:
    """restore_short_last (the commit log's load): the newest file with data, short, is
    extended to the file size with zeros after what it held, and returned; a zero-length file
    after it is still an interrupted creation, deleted."""
    put_file(disk, store_dir, offset_to_file_name(0), FS)
    content = bytes(range(1, 201))
    short = put_short_file(disk, store_dir, offset_to_file_name(FS), content)
    if trailing_empty:
        put_file(disk, store_dir, offset_to_file_name(2 * FS), 0)
    queue = MappedFileQueue(disk, store_dir, FS)
    found = queue.load(restore_short_last=True)
    assert found is not None
    assert (found.path, found.found_bytes, found.file_bytes) == (short, 200, FS)
    assert [mf.file_from_offset for mf in queue.files] == [0, FS]
    assert disk.size(short) == FS
    assert disk.read(short) == content + bytes(FS - 200)
    assert disk.listdir(store_dir) == [offset_to_file_name(0), offset_to_file_name(FS)]
    queue.shutdown()
    again = MappedFileQueue(disk, store_dir, FS)
    assert again.load(restore_short_last=True) is None
    again.shutdown()


@pytest.mark.parametrize("size", [0, 1, FS // 2, FS - 1])
def test_a_short_older_file_refuses_naming_it_and_changes_nothing(
    disk: Disk, store_dir: str, size: int
) -> None:
    put_file(disk, store_dir, offset_to_file_name(0), FS)
    older = put_short_file(disk, store_dir, offset_to_file_name(FS), bytes(size))
    put_short_file(disk, store_dir, offset_to_file_name(2 * FS), b"\x01" * 10)  # short too
    names = disk.listdir(store_dir)
    queue = MappedFileQueue(disk, store_dir, FS)
    with pytest.raises(ShortSegmentError) as refused:
        queue.load(restore_short_last=True)
    assert refused.value.path == older and refused.value.found_bytes == size
    assert older in str(refused.value) and "not the newest" in str(refused.value)
    assert queue.files == []
    assert disk.listdir(store_dir) == names
    assert disk.size(os.path.join(store_dir, offset_to_file_name(2 * FS))) == 10


def test_loaded_files_count_as_full_until_set_positions(disk: Disk, store_dir: str) -> None:
    queue = new_queue(disk, store_dir)
    append_stream(queue, pattern(2 * FS + 100))
    queue.flush(0)
    queue.shutdown()
    loaded = reload(disk, store_dir)
    assert len(loaded.files) == 3
    assert all(mf.is_full() and mf.wrote_position == FS for mf in loaded.files)
    assert loaded.max_offset() == 3 * FS
    # Recovery then says where the data ends.
    last = loaded.files[-1]
    last.set_positions(100)
    assert loaded.max_offset() == 2 * FS + 100
    assert queue_bytes(loaded) == pattern(2 * FS + 100)
    assert loaded.get_last_mapped_file(0) is last


def test_get_last_mapped_file_after_load_creates_the_next_file(disk: Disk, store_dir: str) -> None:
    put_file(disk, store_dir, offset_to_file_name(3 * FS), FS)
    queue = new_queue(disk, store_dir)
    mf = queue.get_last_mapped_file(0)
    assert mf is not None and mf.file_from_offset == 4 * FS


def test_check_self_reports_a_gap_between_files(
    disk: Disk, store_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    put_file(disk, store_dir, offset_to_file_name(0), FS)
    put_file(disk, store_dir, offset_to_file_name(2 * FS), FS)
    with caplog.at_level(logging.ERROR, logger="mqstore.storage.mapped_file_queue"):
        queue = new_queue(disk, store_dir)
    assert any("[BUG]" in r.getMessage() for r in caplog.records)
    assert not queue.check_self()
    # Lookup falls back to a scan over the hole.
    mf = queue.find_mapped_file_by_offset(2 * FS + 3)
    assert mf is not None and mf.file_from_offset == 2 * FS
    assert queue.find_mapped_file_by_offset(FS + 3) is None
    assert (
        queue.find_mapped_file_by_offset(FS + 3, return_first_on_not_found=True) is (queue.files[0])
    )


def test_check_self_is_silent_for_adjacent_files(
    disk: Disk, store_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    queue = new_queue(disk, store_dir)
    with caplog.at_level(logging.ERROR, logger="mqstore.storage.mapped_file_queue"):
        make_full_files(queue, 3)
        assert queue.check_self()
    assert not any("[BUG]" in r.getMessage() for r in caplog.records)


def test_load_skips_a_name_of_20_non_ascii_digit_characters(disk: Disk, store_dir: str) -> None:
    put_file(disk, store_dir, offset_to_file_name(0), FS)
    put_file(disk, store_dir, "0" * 19 + "\u00b2", 3)
    queue = new_queue(disk, store_dir)
    assert [mf.file_from_offset for mf in queue.files] == [0]


# -- flush and commit ---------------------------------------------------------------------------


def test_flush_moves_flushed_where_across_file_boundaries_in_one_call(
    disk: Disk, store_dir: str
) -> None:
    queue = new_queue(disk, store_dir)
    append_stream(queue, pattern(3 * FS + 200))
    assert queue.flushed_where == 0
    assert queue.flush(0)
    assert queue.flushed_where == 3 * FS + 200
    assert [mf.flushed_position for mf in queue.files] == [FS, FS, FS, 200]
    assert not queue.flush(0)  # nothing new


def test_flush_with_least_pages_flushes_full_files_and_stops_at_a_short_tail(
    disk: Disk, store_dir: str
) -> None:
    fs = 4 * PAGE
    queue = new_queue(disk, store_dir, fs)
    append_stream(queue, pattern(2 * fs + PAGE + 10))
    assert queue.flush(2)  # two full files flush; the tail has one dirty page only
    assert queue.flushed_where == 2 * fs
    assert not queue.flush(2)
    append_stream(queue, pattern(PAGE, 1))
    assert queue.flush(2)
    assert queue.flushed_where == 2 * fs + 2 * PAGE + 10


def test_flush_of_loaded_full_files_moves_flushed_where_to_their_end(
    disk: Disk, store_dir: str
) -> None:
    for i in range(2):
        put_file(disk, store_dir, offset_to_file_name((5 + i) * FS), FS)
    queue = new_queue(disk, store_dir)
    queue.flush(0)
    assert queue.flushed_where == 7 * FS


def test_after_crash_drop_the_queue_reloads_exactly_the_flushed_bytes() -> None:
    disk = SimDisk()
    queue = new_queue(disk, "/store/q")
    data = pattern(5 * FS + 700)
    append_stream(queue, data[: 2 * FS + 300])
    queue.flush(0)
    append_stream(queue, data[2 * FS + 300 :])
    disk.crash(random.Random(0), mode="drop")
    after = reload(disk, "/store/q")
    assert len(after.files) == 6  # create() made every name durable
    assert queue_bytes(after) == data[: 2 * FS + 300] + bytes(6 * FS - 2 * FS - 300)


def test_flush_error_leaves_flushed_where_and_propagates() -> None:
    disk = SimDisk()
    queue = new_queue(disk, "/store/q")
    append_stream(queue, pattern(FS + 10))
    disk.inject("flush", errno.EIO)
    with pytest.raises(OSError):
        queue.flush(0)
    assert queue.flushed_where == 0
    assert queue.flush(0)
    assert queue.flushed_where == FS + 10


# -- truncation ---------------------------------------------------------------------------------


def test_truncate_dirty_files_deletes_later_files_and_zeroes_the_cut_file(
    disk: Disk, store_dir: str
) -> None:
    queue = new_queue(disk, store_dir)
    data = pattern(4 * FS + 500)
    append_stream(queue, data)
    queue.flush(0)
    cut = FS + 100
    queue.truncate_dirty_files(cut)
    assert [mf.file_from_offset for mf in queue.files] == [0, FS]
    assert disk.listdir(store_dir) == [offset_to_file_name(0), offset_to_file_name(FS)]
    held = queue.files[1]
    assert (held.wrote_position, held.flushed_position) == (100, 100)
    assert queue.files[0].wrote_position == FS
    assert queue.max_offset() == cut
    assert queue.flushed_where == cut
    # The bytes after the cut read as zeros, in memory and on disk.
    assert bytes(held.buf[:FS]) == data[FS:cut] + bytes(FS - 100)
    assert disk.read(held.path) == data[FS:cut] + bytes(FS - 100)
    # The next append continues at the cut, into the same file.
    mf = queue.get_last_mapped_file(0)
    assert mf is held


def test_truncate_then_reload_sees_the_cut_file_zeroed(disk: Disk, store_dir: str) -> None:
    queue = new_queue(disk, store_dir)
    data = pattern(3 * FS)
    append_stream(queue, data)
    queue.flush(0)
    queue.truncate_dirty_files(FS + 1)
    queue.shutdown()
    after = reload(disk, store_dir)
    assert [mf.file_from_offset for mf in after.files] == [0, FS]
    assert queue_bytes(after) == data[: FS + 1] + bytes(FS - 1)


def test_truncate_at_a_file_boundary_keeps_the_file_starting_there_empty(
    disk: Disk, store_dir: str
) -> None:
    queue = new_queue(disk, store_dir)
    data = pattern(3 * FS + 10)
    append_stream(queue, data)
    queue.truncate_dirty_files(2 * FS)
    # RocketMQ's truncateDirtyFiles: a file is destroyed only if it starts after the offset.
    assert [mf.file_from_offset for mf in queue.files] == [0, FS, 2 * FS]
    assert queue.files[1].wrote_position == FS
    assert queue.files[2].wrote_position == 0
    assert disk.read(queue.files[2].path) == bytes(FS)
    assert queue.max_offset() == 2 * FS


def test_truncate_below_the_first_file_deletes_every_file(disk: Disk, store_dir: str) -> None:
    queue = new_queue(disk, store_dir)
    first = queue.get_last_mapped_file(4 * FS)
    assert first is not None
    append_stream(queue, pattern(2 * FS))
    queue.truncate_dirty_files(FS)
    assert queue.files == []
    assert disk.listdir(store_dir) == []


def test_truncate_of_loaded_files_zeroes_the_stale_tail(disk: Disk, store_dir: str) -> None:
    """Recovery's case: loaded files count as full, so the tail past the cut is stale."""
    queue = new_queue(disk, store_dir)
    data = pattern(2 * FS)
    append_stream(queue, data)
    queue.flush(0)
    queue.shutdown()
    loaded = reload(disk, store_dir)
    loaded.truncate_dirty_files(FS + 30)
    assert queue_bytes(loaded) == data[: FS + 30]
    assert bytes(loaded.files[1].buf[:FS]) == data[FS : FS + 30] + bytes(FS - 30)


def test_truncation_survives_crash_drop_on_the_simulated_disk() -> None:
    disk = SimDisk()
    queue = new_queue(disk, "/store/q")
    data = pattern(4 * FS)
    append_stream(queue, data)
    queue.flush(0)
    queue.truncate_dirty_files(FS + 200)
    disk.crash(random.Random(0), mode="drop")
    after = reload(disk, "/store/q")
    assert [mf.file_from_offset for mf in after.files] == [0, FS]
    assert queue_bytes(after) == data[: FS + 200] + bytes(FS - 200)


def test_truncate_does_not_mark_unflushed_bytes_below_the_cut_as_flushed() -> None:
    disk = SimDisk()
    fs = 4 * PAGE
    queue = new_queue(disk, "/store/q", fs)
    data = pattern(3 * PAGE)
    append_stream(queue, data)  # nothing flushed yet
    queue.truncate_dirty_files(2 * PAGE + 100)
    queue.flush(0)
    assert queue.flushed_where == 2 * PAGE + 100
    disk.crash(random.Random(0), mode="drop")
    after = reload(disk, "/store/q", fs)
    assert queue_bytes(after)[: 2 * PAGE + 100] == data[: 2 * PAGE + 100]


def test_delete_last_mapped_file_removes_it_from_list_and_disk(disk: Disk, store_dir: str) -> None:
    queue = new_queue(disk, store_dir)
    make_full_files(queue, 3)
    last_path = queue.files[-1].path
    queue.delete_last_mapped_file()
    assert len(queue.files) == 2
    assert not disk.exists(last_path)
    queue.delete_last_mapped_file()
    queue.delete_last_mapped_file()
    queue.delete_last_mapped_file()  # empty: nothing to do
    assert queue.files == []
    assert disk.listdir(store_dir) == []


def test_destroy_deletes_every_file_and_resets_positions(disk: Disk, store_dir: str) -> None:
    queue = new_queue(disk, store_dir)
    append_stream(queue, pattern(3 * FS))
    queue.flush(0)
    queue.destroy()
    assert queue.files == []
    assert queue.flushed_where == 0
    assert disk.listdir(store_dir) == []


# -- deletion by time ---------------------------------------------------------------------------

OLD_MS = 1_000_000_000_000
NEW_MS = 2_000_000_000_000
EXPIRE_BEFORE_MS = 1_500_000_000_000


def fifty_files(disk: Disk, store_dir: str, expired: set[int]) -> MappedFileQueue:
    queue = new_queue(disk, store_dir)
    make_full_files(queue, 50)
    for i, mf in enumerate(queue.files):
        set_mtime_ms(disk, mf.path, OLD_MS if i in expired else NEW_MS)
    return queue


def delete_by_time(
    queue: MappedFileQueue,
    *,
    floor_offset: int = 10**15,
    clean_immediately: bool = False,
    max_files: int = 1000,
    on_delete: list[MappedFile] | None = None,
) -> int:
    return queue.delete_expired_file_by_time(
        expired_before_ms=EXPIRE_BEFORE_MS,
        floor_offset=floor_offset,
        clean_immediately=clean_immediately,
        max_files=max_files,
        on_delete=on_delete.append if on_delete is not None else None,
    )


def test_delete_by_time_deletes_only_the_leading_run_of_expired_files(
    disk: Disk, store_dir: str
) -> None:
    """RocketMQ testDeleteExpiredFileByTime: expired files after a fresh one are kept."""
    expired = {0, 1, 2, 3, 4, 6, 7, 8, 20, 30}
    queue = fifty_files(disk, store_dir, expired)
    paths = [mf.path for mf in queue.files]
    deleted: list[MappedFile] = []
    assert delete_by_time(queue, on_delete=deleted) == 5
    assert [mf.path for mf in deleted] == paths[:5]
    assert [mf.path for mf in queue.files] == paths[5:]
    assert all(not disk.exists(p) for p in paths[:5])
    assert all(disk.exists(p) for p in paths[5:])
    assert queue.min_offset() == 5 * FS
    # File 5 is fresh: a second round deletes nothing, expired files 6.. stay.
    assert delete_by_time(queue) == 0
    assert len(queue.files) == 45


def test_delete_by_time_never_deletes_the_last_file(disk: Disk, store_dir: str) -> None:
    queue = fifty_files(disk, store_dir, set(range(50)))
    assert delete_by_time(queue) == 49
    assert len(queue.files) == 1
    assert queue.files[0].file_from_offset == 49 * FS
    assert disk.listdir(store_dir) == [offset_to_file_name(49 * FS)]
    assert delete_by_time(queue, clean_immediately=True) == 0


def test_delete_by_time_deletes_at_most_max_files_per_round(disk: Disk, store_dir: str) -> None:
    queue = fifty_files(disk, store_dir, set(range(50)))
    assert delete_by_time(queue, max_files=10) == 10
    assert queue.min_offset() == 10 * FS
    assert delete_by_time(queue, max_files=10) == 10
    assert queue.min_offset() == 20 * FS


def test_clean_immediately_deletes_leading_files_that_are_not_expired(
    disk: Disk, store_dir: str
) -> None:
    queue = fifty_files(disk, store_dir, set())
    assert delete_by_time(queue) == 0
    assert delete_by_time(queue, clean_immediately=True, max_files=7) == 7
    assert queue.min_offset() == 7 * FS


def test_floor_offset_stops_deletion_at_the_first_file_reaching_above_it(
    disk: Disk, store_dir: str
) -> None:
    queue = fifty_files(disk, store_dir, set(range(50)))
    # Files 0..2 end at or below 3*FS+1; file 3 ends at 4*FS, above the floor.
    assert delete_by_time(queue, floor_offset=3 * FS + 1) == 3
    assert queue.min_offset() == 3 * FS
    assert delete_by_time(queue, floor_offset=4 * FS) == 1  # end == floor is deletable
    assert delete_by_time(queue, floor_offset=0, clean_immediately=True) == 0


def test_delete_by_time_uses_the_simulated_clock_for_new_files() -> None:
    now = [OLD_MS]
    disk = SimDisk(clock_ms=lambda: now[0])
    queue = new_queue(disk, "/store/q")
    make_full_files(queue, 3)
    now[0] = NEW_MS
    make_full_files(queue, 2)
    assert delete_by_time(queue) == 3
    assert queue.min_offset() == 3 * FS


# -- deletion by offset (consume-queue units) ---------------------------------------------------

UNIT = 20
CQ_FS = 50 * UNIT  # 1000 bytes: 50 units


def unit_files(disk: Disk, store_dir: str, last_unit_values: list[int]) -> MappedFileQueue:
    """One full file per value; the int64 at file_size-20 (the last unit's offset) is it."""
    queue = new_queue(disk, store_dir, CQ_FS)
    for value in last_unit_values:
        mf = queue.get_last_mapped_file(0)
        assert mf is not None
        body = bytearray(pattern(CQ_FS))
        body[CQ_FS - UNIT : CQ_FS - UNIT + 8] = value.to_bytes(8, "big", signed=True)
        # A decoy where a wrong reader would look: the last 8 bytes of the file.
        body[CQ_FS - 8 :] = (10**15).to_bytes(8, "big", signed=True)
        assert mf.append_bytes(bytes(body))
    return queue


def test_delete_by_offset_deletes_files_whose_last_unit_points_below(
    disk: Disk, store_dir: str
) -> None:
    queue = unit_files(disk, store_dir, [100, 200, 300, 400, 500])
    paths = [mf.path for mf in queue.files]
    assert queue.delete_expired_file_by_offset(350, UNIT) == 3
    assert [mf.path for mf in queue.files] == paths[3:]
    assert all(not disk.exists(p) for p in paths[:3])
    assert queue.min_offset() == 3 * CQ_FS


def test_delete_by_offset_compares_strictly_below(disk: Disk, store_dir: str) -> None:
    queue = unit_files(disk, store_dir, [100, 200, 300])
    assert queue.delete_expired_file_by_offset(200, UNIT) == 1
    assert queue.min_offset() == CQ_FS


def test_delete_by_offset_stops_at_the_first_file_it_keeps(disk: Disk, store_dir: str) -> None:
    queue = unit_files(disk, store_dir, [100, 900, 200, 300, 400])
    assert queue.delete_expired_file_by_offset(350, UNIT) == 1
    assert len(queue.files) == 4


def test_delete_by_offset_never_deletes_the_last_file(disk: Disk, store_dir: str) -> None:
    queue = unit_files(disk, store_dir, [1, 2, 3])
    assert queue.delete_expired_file_by_offset(10**12, UNIT) == 2
    assert len(queue.files) == 1
    assert queue.files[0].file_from_offset == 2 * CQ_FS


def test_delete_by_offset_reads_a_signed_big_endian_int64(disk: Disk, store_dir: str) -> None:
    queue = unit_files(disk, store_dir, [-1, 1 << 40, 7])
    assert queue.delete_expired_file_by_offset(0, UNIT) == 1
    assert queue.delete_expired_file_by_offset(1 << 40, UNIT) == 0
    assert queue.delete_expired_file_by_offset((1 << 40) + 1, UNIT) == 1


def test_delete_by_offset_also_destroys_files_no_longer_available(
    disk: Disk, store_dir: str
) -> None:
    queue = unit_files(disk, store_dir, [100, 10**9, 300])
    queue.files[1].shutdown()  # unavailable: its unit cannot be read, nothing to lose
    assert queue.delete_expired_file_by_offset(150, UNIT) == 2
    assert queue.min_offset() == 2 * CQ_FS


# -- deletion while read ------------------------------------------------------------------------


def test_a_held_file_stays_readable_while_retention_deletes_it(disk: Disk, store_dir: str) -> None:
    queue = new_queue(disk, store_dir)
    make_full_files(queue, 3)
    reader_file = queue.find_mapped_file_by_offset(0)
    assert reader_file is not None and reader_file.hold()
    assert delete_by_time(queue, clean_immediately=True) == 2
    assert not disk.exists(reader_file.path)
    assert queue.find_mapped_file_by_offset(0) is None
    assert bytes(reader_file.buf[:FS]) == pattern(FS, seed=0)
    assert not reader_file.hold()
    reader_file.release()


def test_delete_by_offset_of_a_held_file_unlinks_it_and_the_holder_keeps_reading(
    disk: Disk, store_dir: str
) -> None:
    """RocketMQ defers destroying a referenced file; here the name goes at once and the mapping
    lives until the holder releases it (mapped_file.py docstring)."""
    queue = unit_files(disk, store_dir, [100, 200, 300])
    held = queue.files[0]
    expected = bytes(held.buf[:CQ_FS])
    assert held.hold()
    assert queue.delete_expired_file_by_offset(150, UNIT) == 1
    assert not disk.exists(held.path)
    assert bytes(held.buf[:CQ_FS]) == expected
    held.release()
    assert queue.min_offset() == CQ_FS
