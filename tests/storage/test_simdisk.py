"""The simulated disk's own model: what survives crash(), faults, capacity and locks.

The model (simdisk.py docstring): unflushed 512-byte sectors are dropped, kept or garbled; names
are durable only after fsync_dir (create() does it itself); append files keep their synced
length plus a torn prefix; an injected flush failure loses its pages for good (fsyncgate).
"""

from __future__ import annotations

import errno
import random

import pytest

from mqstore.errors import DiskFull, StorageError, StoreLocked
from mqstore.storage.simdisk import SECTOR_BYTES, CrashMode, SimDisk

from .helpers import PAGE, pattern

D = "/data"


def fresh() -> SimDisk:
    disk = SimDisk()
    disk.makedirs(D)
    return disk


def mapped(disk: SimDisk, name: str, size: int = 4 * PAGE) -> tuple[str, bytearray]:
    path = f"{D}/{name}"
    disk.create(path, size)
    region = disk.map(path, size)
    buf = region.buf
    assert isinstance(buf, bytearray)
    return path, buf


# -- file content ---------------------------------------------------------------------------------


def test_a_created_file_survives_a_crash_zero_filled_at_its_size() -> None:
    disk = fresh()
    disk.create(f"{D}/f", 3000)
    disk.crash(random.Random(0), mode="drop")
    assert disk.exists(f"{D}/f")
    assert disk.read(f"{D}/f") == bytes(3000)


def test_crash_drop_loses_every_unflushed_byte() -> None:
    disk = fresh()
    path, buf = mapped(disk, "f")
    buf[0:5000] = pattern(5000)
    disk.crash(random.Random(0), mode="drop")
    assert disk.read(path) == bytes(4 * PAGE)


def test_crash_keep_keeps_every_unflushed_byte() -> None:
    disk = fresh()
    path, buf = mapped(disk, "f")
    buf[0:5000] = pattern(5000)
    disk.crash(random.Random(0), mode="keep")
    assert disk.read(path) == pattern(5000) + bytes(4 * PAGE - 5000)


def test_flushed_pages_survive_crash_drop_and_later_writes_do_not() -> None:
    disk = fresh()
    path = f"{D}/f"
    disk.create(path, 4 * PAGE)
    region = disk.map(path, 4 * PAGE)
    region.buf[0:PAGE] = pattern(PAGE)
    region.flush(0, PAGE)
    region.buf[PAGE : 2 * PAGE] = pattern(PAGE, 1)
    region.buf[0:10] = b"\xee" * 10  # overwrite flushed bytes without flushing again
    disk.crash(random.Random(0), mode="drop")
    assert disk.read(path) == pattern(PAGE) + bytes(3 * PAGE)


def test_flush_is_rounded_out_to_whole_pages() -> None:
    disk = fresh()
    path = f"{D}/f"
    disk.create(path, 4 * PAGE)
    region = disk.map(path, 4 * PAGE)
    region.buf[:] = pattern(4 * PAGE)
    region.flush(PAGE + 100, PAGE + 200)  # inside page 1: the whole page becomes durable
    disk.crash(random.Random(0), mode="drop")
    assert disk.read(path) == bytes(PAGE) + pattern(4 * PAGE)[PAGE : 2 * PAGE] + bytes(2 * PAGE)


def classify(sector: bytes, live: bytes, durable: bytes) -> str:
    if sector == live:
        return "live"
    if sector == durable:
        return "durable"
    for cut in range(1, len(live)):
        if sector == live[:cut] + durable[cut:]:
            return "torn"
    return "garbage"


@pytest.mark.parametrize("seed", range(5))
def test_crash_random_decides_each_512_byte_sector_on_its_own(seed: int) -> None:
    disk = fresh()
    size = 64 * SECTOR_BYTES
    path, buf = mapped(disk, "f", size)
    old = pattern(size, 1)
    buf[:] = old
    disk.map(path, size).flush(0, size)
    new = pattern(size, 2)
    buf[:] = new
    buf[0:SECTOR_BYTES] = old[0:SECTOR_BYTES]  # sector 0 was rewritten with the same bytes
    disk.crash(random.Random(seed), mode="random")
    after = disk.read(path)
    assert after[0:SECTOR_BYTES] == old[0:SECTOR_BYTES]  # unchanged sectors are never touched
    kinds = []
    for a in range(SECTOR_BYTES, size, SECTOR_BYTES):
        b = a + SECTOR_BYTES
        kinds.append(classify(after[a:b], new[a:b], old[a:b]))
    # 63 independent sectors: both outcomes appear (a shared fate would give one kind).
    assert "live" in kinds
    assert "durable" in kinds


def test_crash_random_is_replayable_from_its_seed() -> None:
    results = []
    for _ in range(2):
        disk = fresh()
        path, buf = mapped(disk, "f")
        buf[:] = pattern(4 * PAGE)
        disk.crash(random.Random(42), mode="random")
        results.append(disk.read(path))
    assert results[0] == results[1]


def test_objects_from_before_a_crash_are_dead_after_it() -> None:
    disk = fresh()
    path, buf = mapped(disk, "f")
    disk.crash(random.Random(0), mode="drop")
    buf[0:4] = b"late"  # a write by the dead process
    assert disk.read(path)[:4] == bytes(4)


# -- names ------------------------------------------------------------------------------------


def test_a_written_file_whose_directory_was_not_fsynced_vanishes_on_crash_drop() -> None:
    disk = fresh()
    disk.write(f"{D}/small", b"content")
    assert disk.read(f"{D}/small") == b"content"
    disk.crash(random.Random(0), mode="drop")
    assert not disk.exists(f"{D}/small")


def test_a_written_file_survives_once_its_directory_is_fsynced() -> None:
    disk = fresh()
    disk.write(f"{D}/small", b"content")
    disk.fsync_dir(D)
    disk.crash(random.Random(0), mode="drop")
    assert disk.read(f"{D}/small") == b"content"


def test_a_written_file_survives_crash_keep_without_fsync_dir() -> None:
    disk = fresh()
    disk.write(f"{D}/small", b"content")
    disk.crash(random.Random(0), mode="keep")
    assert disk.read(f"{D}/small") == b"content"


def test_rewriting_an_existing_file_makes_its_content_durable_at_once() -> None:
    disk = fresh()
    disk.write(f"{D}/small", b"v1")
    disk.fsync_dir(D)
    disk.write(f"{D}/small", b"version 2")
    disk.crash(random.Random(0), mode="drop")
    assert disk.read(f"{D}/small") == b"version 2"


def test_rename_is_durable_only_after_fsync_dir() -> None:
    disk = fresh()
    disk.write(f"{D}/a", b"x")
    disk.fsync_dir(D)
    disk.rename(f"{D}/a", f"{D}/b")
    assert disk.listdir(D) == ["b"]
    disk.crash(random.Random(0), mode="drop")
    assert disk.listdir(D) == ["a"]
    disk.rename(f"{D}/a", f"{D}/b")
    disk.fsync_dir(D)
    disk.crash(random.Random(0), mode="drop")
    assert disk.listdir(D) == ["b"]
    assert disk.read(f"{D}/b") == b"x"


def test_remove_is_durable_only_after_fsync_dir() -> None:
    disk = fresh()
    disk.create(f"{D}/f", 10)
    disk.remove(f"{D}/f")
    assert not disk.exists(f"{D}/f")
    disk.crash(random.Random(0), mode="drop")
    assert disk.exists(f"{D}/f")
    disk.remove(f"{D}/f")
    disk.fsync_dir(D)
    disk.crash(random.Random(0), mode="drop")
    assert not disk.exists(f"{D}/f")


def test_crash_random_keeps_a_prefix_of_the_pending_name_operations() -> None:
    seen = set()
    for seed in range(40):
        disk = fresh()
        for name in "abc":
            disk.write(f"{D}/{name}", name.encode())
        disk.crash(random.Random(seed), mode="random")
        names = tuple(disk.listdir(D))
        assert names in {(), ("a",), ("a", "b"), ("a", "b", "c")}
        seen.add(names)
    assert len(seen) > 1


def test_listdir_lists_files_and_subdirectories_sorted() -> None:
    disk = fresh()
    disk.makedirs(f"{D}/sub/deeper")
    disk.create(f"{D}/z", 1)
    disk.create(f"{D}/a", 1)
    assert disk.listdir(D) == ["a", "sub", "z"]
    assert disk.isdir(f"{D}/sub")
    assert not disk.isdir(f"{D}/a")
    assert disk.listdir("/nowhere") == []


def test_create_in_a_missing_directory_raises_file_not_found() -> None:
    disk = SimDisk()
    with pytest.raises(FileNotFoundError):
        disk.create("/missing/f", 10)


def test_create_over_an_existing_file_raises_file_exists() -> None:
    disk = fresh()
    disk.create(f"{D}/f", 10)
    with pytest.raises(FileExistsError):
        disk.create(f"{D}/f", 10)


def test_map_with_the_wrong_size_raises_storage_error() -> None:
    disk = fresh()
    disk.create(f"{D}/f", 10)
    with pytest.raises(StorageError):
        disk.map(f"{D}/f", 11)


def test_remove_tree_then_crash_leaves_no_file_inside_a_missing_directory() -> None:
    disk = fresh()
    disk.makedirs(f"{D}/topic/0")
    disk.create(f"{D}/topic/0/f", 10)
    disk.remove_tree(f"{D}/topic")
    disk.crash(random.Random(0), mode="drop")
    assert not disk.exists(f"{D}/topic/0/f") or disk.isdir(f"{D}/topic/0")


# -- append files -------------------------------------------------------------------------------


def journal(disk: SimDisk, synced: bytes, unsynced: bytes) -> str:
    path = f"{D}/journal"
    f = disk.open_append(path)
    disk.fsync_dir(D)
    f.append(synced)
    f.sync()
    f.append(unsynced)
    assert f.size == len(synced) + len(unsynced)
    return path


def test_append_file_keeps_exactly_its_synced_prefix_on_crash_drop() -> None:
    disk = fresh()
    path = journal(disk, pattern(700), pattern(2000, 1))
    disk.crash(random.Random(0), mode="drop")
    assert disk.read(path) == pattern(700)


def test_append_file_keeps_everything_on_crash_keep() -> None:
    disk = fresh()
    path = journal(disk, pattern(700), pattern(2000, 1))
    disk.crash(random.Random(0), mode="keep")
    assert disk.read(path) == pattern(700) + pattern(2000, 1)


def test_append_file_keeps_its_synced_prefix_plus_a_torn_prefix_on_crash_random() -> None:
    synced, unsynced = pattern(700), pattern(5000, 1)
    lengths = set()
    for seed in range(30):
        disk = fresh()
        path = journal(disk, synced, unsynced)
        disk.crash(random.Random(seed), mode="random")
        after = disk.read(path)
        assert after[: len(synced)] == synced
        assert len(synced) <= len(after) <= len(synced) + len(unsynced)
        lengths.add(len(after))
    assert len(lengths) > 5  # the torn point varies with the seed


def test_truncate_shrinks_an_append_file_durably() -> None:
    disk = fresh()
    path = journal(disk, pattern(700), b"")
    disk.truncate(path, 300)
    disk.crash(random.Random(0), mode="keep")
    assert disk.read(path) == pattern(300)


# -- faults and capacity ------------------------------------------------------------------------


def test_injected_enospc_on_create_raises_disk_full_once() -> None:
    disk = fresh()
    disk.inject("create", errno.ENOSPC)
    with pytest.raises(DiskFull):
        disk.create(f"{D}/f", 100)
    assert not disk.exists(f"{D}/f")
    disk.create(f"{D}/f", 100)
    assert disk.size(f"{D}/f") == 100


def test_injected_eio_raises_oserror_with_that_errno() -> None:
    disk = fresh()
    disk.inject("write", errno.EIO, times=2)
    for _ in range(2):
        with pytest.raises(OSError) as info:
            disk.write(f"{D}/f", b"x")
        assert info.value.errno == errno.EIO
    disk.write(f"{D}/f", b"x")


def test_injected_faults_match_on_the_path() -> None:
    disk = fresh()
    disk.inject("create", errno.ENOSPC, path_contains="commitlog")
    disk.create(f"{D}/other", 10)
    disk.makedirs(f"{D}/commitlog")
    with pytest.raises(DiskFull):
        disk.create(f"{D}/commitlog/f", 10)


def test_clear_faults_and_crash_drop_pending_faults() -> None:
    disk = fresh()
    disk.inject("create", errno.ENOSPC)
    disk.clear_faults()
    disk.create(f"{D}/a", 1)
    disk.inject("create", errno.ENOSPC)
    disk.crash(random.Random(0), mode="drop")
    disk.create(f"{D}/b", 1)


def test_capacity_bounds_create_and_frees_on_remove() -> None:
    disk = SimDisk(capacity_bytes=3000)
    disk.makedirs(D)
    disk.create(f"{D}/a", 1000)
    disk.create(f"{D}/b", 2000)
    assert disk.free_bytes() == 0
    assert disk.usage(D) == (3000, 3000)
    with pytest.raises(DiskFull):
        disk.create(f"{D}/c", 1)
    assert not disk.exists(f"{D}/c")
    disk.remove(f"{D}/a")
    disk.create(f"{D}/c", 1000)


def test_capacity_bounds_appends() -> None:
    disk = SimDisk(capacity_bytes=100)
    disk.makedirs(D)
    f = disk.open_append(f"{D}/j")
    f.append(pattern(100))
    with pytest.raises(DiskFull):
        f.append(b"x")
    assert f.size == 100


@pytest.mark.parametrize("mode", ["drop", "keep"])
def test_failed_flush_then_a_flush_that_succeeds_still_loses_the_bytes(mode: CrashMode) -> None:
    """fsyncgate: the pages were marked clean without being written, so even crash(keep),
    which keeps every dirty sector, has nothing of them to keep."""
    disk = fresh()
    path, buf = mapped(disk, "f")
    region = disk.map(path, 4 * PAGE)
    buf[0:100] = pattern(100)
    disk.inject("flush_eio", errno.EIO)
    with pytest.raises(OSError):
        region.flush(0, 100)
    region.flush(0, 100)  # "succeeds"
    disk.crash(random.Random(0), mode=mode)
    assert disk.read(path)[:100] == bytes(100)


def test_failed_flush_loses_only_its_own_pages() -> None:
    disk = fresh()
    path, buf = mapped(disk, "f")
    region = disk.map(path, 4 * PAGE)
    buf[:] = pattern(4 * PAGE)
    disk.inject("flush_eio", errno.EIO)
    with pytest.raises(OSError):
        region.flush(PAGE, 2 * PAGE)
    region.flush(0, 4 * PAGE)
    disk.crash(random.Random(0), mode="drop")
    data = pattern(4 * PAGE)
    assert disk.read(path) == data[:PAGE] + bytes(PAGE) + data[2 * PAGE :]


def test_a_plain_flush_fault_writes_nothing_and_a_retry_succeeds() -> None:
    disk = fresh()
    path, buf = mapped(disk, "f")
    region = disk.map(path, 4 * PAGE)
    buf[0:100] = pattern(100)
    disk.inject("flush", errno.EIO)
    with pytest.raises(OSError):
        region.flush(0, 100)
    region.flush(0, 100)
    disk.crash(random.Random(0), mode="drop")
    assert disk.read(path)[:100] == pattern(100)


def test_trace_records_each_flush_and_sync() -> None:
    disk = SimDisk(trace=True)
    disk.makedirs(D)
    path = f"{D}/f"
    disk.create(path, 2 * PAGE)
    disk.map(path, 2 * PAGE).flush(10, PAGE + 1)
    j = disk.open_append(f"{D}/j")
    j.append(b"abc")
    j.sync()
    assert disk.trace == [("flush", path, 0, 2 * PAGE), ("sync", f"{D}/j", 0, 3)]


def test_mtime_follows_the_clock_on_create_and_flush() -> None:
    now = [1000]
    disk = SimDisk(clock_ms=lambda: now[0])
    disk.makedirs(D)
    disk.create(f"{D}/f", PAGE)
    assert disk.mtime_ms(f"{D}/f") == 1000
    now[0] = 5000
    disk.map(f"{D}/f", PAGE).flush(0, 1)
    assert disk.mtime_ms(f"{D}/f") == 5000
    disk.set_mtime_ms(f"{D}/f", 7)
    assert disk.mtime_ms(f"{D}/f") == 7


# -- locks --------------------------------------------------------------------------------------


def test_a_second_lock_raises_store_locked_until_release() -> None:
    disk = fresh()
    lock = disk.lock(f"{D}/lock")
    with pytest.raises(StoreLocked):
        disk.lock(f"{D}/lock")
    disk.lock(f"{D}/other-lock")  # another path is another lock
    lock.release()
    disk.lock(f"{D}/lock")


def test_a_crash_releases_every_lock() -> None:
    disk = fresh()
    disk.lock(f"{D}/lock")
    disk.crash(random.Random(0), mode="drop")
    disk.lock(f"{D}/lock")


def test_a_stale_lock_handle_cannot_release_a_lock_taken_after_it() -> None:
    disk = fresh()
    dead = disk.lock(f"{D}/lock")
    disk.crash(random.Random(0), mode="drop")  # the process holding `dead` is gone
    disk.lock(f"{D}/lock")  # the restarted store
    dead.release()  # a late close from the dead instance
    with pytest.raises(StoreLocked):
        disk.lock(f"{D}/lock")
