"""MappedFile: naming, appends, positions, flush with least pages, reads during deletion.

Mirrors RocketMQ's MappedFileTest / DefaultMappedFile*Test (rocketmq-store.md §9): writes beyond
the file size fail, positions move as documented, and a deleted file stays readable by whoever
held it.
"""

from __future__ import annotations

import os
import random

import pytest

from mqstore.errors import DataLoss, InvariantViolation, OutOfRange
from mqstore.storage.disk import Disk
from mqstore.storage.mapped_file import (
    MappedFile,
    file_name_to_offset,
    offset_to_file_name,
)
from mqstore.storage.simdisk import SimDisk

from .helpers import PAGE, pattern

FOUR_PAGES = 4 * PAGE


def new_file(disk: Disk, store_dir: str, offset: int = 0, size: int = FOUR_PAGES) -> MappedFile:
    disk.makedirs(store_dir)
    path = os.path.join(store_dir, offset_to_file_name(offset))
    disk.create(path, size)
    return MappedFile(disk, path, size)


# -- names --------------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [0, 1, 1024, 1 << 30, 6_000_000, 10**19])
def test_file_name_is_the_offset_as_20_zero_padded_digits(offset: int) -> None:
    name = offset_to_file_name(offset)
    assert len(name) == 20
    assert name == str(offset).rjust(20, "0")
    assert file_name_to_offset(name) == offset


@pytest.mark.parametrize(
    "name",
    [
        "",
        "0",
        "0" * 19,
        "0" * 21,
        "0000000000000000000a",
        "abc",
        "0000000000000000000.",
        "-" + "0" * 19,
    ],
)
def test_names_that_are_not_20_digits_are_not_segments(name: str) -> None:
    assert file_name_to_offset(name) is None


@pytest.mark.parametrize("name", ["0" * 19 + "\u00b2", "\uff10" * 20])
def test_names_with_non_ascii_digits_are_not_segments(name: str) -> None:
    assert file_name_to_offset(name) is None


def test_mapped_file_refuses_a_path_not_named_by_an_offset(disk: Disk, store_dir: str) -> None:
    disk.makedirs(store_dir)
    path = os.path.join(store_dir, "not-a-segment")
    disk.create(path, 1024)
    with pytest.raises(InvariantViolation):
        MappedFile(disk, path, 1024)


def test_file_from_offset_and_end_come_from_the_name(disk: Disk, store_dir: str) -> None:
    mf = new_file(disk, store_dir, offset=3 * FOUR_PAGES)
    assert mf.file_from_offset == 3 * FOUR_PAGES
    assert mf.file_end_offset == 4 * FOUR_PAGES
    mf.close()


# -- appends and positions ----------------------------------------------------------------------


def test_new_file_starts_empty_with_all_positions_at_zero(disk: Disk, store_dir: str) -> None:
    mf = new_file(disk, store_dir)
    assert (mf.wrote_position, mf.flushed_position) == (0, 0)
    assert mf.remaining() == FOUR_PAGES
    assert not mf.is_full()
    mf.close()


def test_append_bytes_writes_at_the_wrote_position_and_makes_them_readable(
    disk: Disk, store_dir: str
) -> None:
    mf = new_file(disk, store_dir)
    first, second = pattern(100, 1), pattern(50, 2)
    assert mf.append_bytes(first)
    assert mf.append_bytes(second)
    assert mf.wrote_position == 150
    assert mf.read(0, 150) == first + second
    assert mf.read(100, 50) == second
    assert bytes(mf.buf[0:150]) == first + second
    mf.close()


def test_append_bytes_refuses_data_that_does_not_fit_and_writes_nothing(
    disk: Disk, store_dir: str
) -> None:
    mf = new_file(disk, store_dir, size=1024)
    assert mf.append_bytes(pattern(1000))
    assert not mf.append_bytes(pattern(25, 9))
    assert mf.wrote_position == 1000
    assert bytes(mf.buf[1000:1024]) == bytes(24)
    # Exactly what remains still fits, and the file is then full.
    assert mf.append_bytes(pattern(24, 3))
    assert mf.is_full()
    assert mf.remaining() == 0
    assert not mf.append_bytes(b"x")
    assert mf.wrote_position == 1024
    mf.close()


def test_append_bytes_bigger_than_the_whole_file_is_refused(disk: Disk, store_dir: str) -> None:
    mf = new_file(disk, store_dir, size=1024)
    assert not mf.append_bytes(pattern(1025))
    assert mf.wrote_position == 0
    assert bytes(mf.buf[:1024]) == bytes(1024)
    mf.close()


@pytest.mark.parametrize(("pos", "length"), [(-1, 1), (1024, 1), (1000, 25), (0, 1025)])
def test_write_at_outside_the_file_raises_invariant_violation(
    disk: Disk, store_dir: str, pos: int, length: int
) -> None:
    mf = new_file(disk, store_dir, size=1024)
    with pytest.raises(InvariantViolation):
        mf.write_at(pos, pattern(length))
    assert bytes(mf.buf[:1024]) == bytes(1024)
    mf.close()


def test_write_at_overwrites_inside_the_file_without_moving_positions(
    disk: Disk, store_dir: str
) -> None:
    mf = new_file(disk, store_dir, size=1024)
    mf.append_bytes(pattern(200))
    mf.write_at(1000, b"\x07" * 24)  # the last bytes of the file are inside it
    mf.write_at(10, b"\xff" * 5)
    assert mf.wrote_position == 200
    expected = bytearray(pattern(200))
    expected[10:15] = b"\xff" * 5
    assert mf.read(0, 200) == bytes(expected)
    assert bytes(mf.buf[1000:1024]) == b"\x07" * 24
    mf.close()


def test_advance_past_the_end_of_the_file_raises_invariant_violation(
    disk: Disk, store_dir: str
) -> None:
    mf = new_file(disk, store_dir, size=1024)
    mf.advance(1000)
    with pytest.raises(InvariantViolation):
        mf.advance(25)
    assert mf.wrote_position == 1000
    mf.close()


@pytest.mark.parametrize("pos", [-1, 1025])
def test_set_positions_outside_the_file_raises_invariant_violation(
    disk: Disk, store_dir: str, pos: int
) -> None:
    mf = new_file(disk, store_dir, size=1024)
    with pytest.raises(InvariantViolation):
        mf.set_positions(pos)
    mf.close()


def test_set_positions_moves_both_positions(disk: Disk, store_dir: str) -> None:
    mf = new_file(disk, store_dir, size=1024)
    mf.append_bytes(pattern(500))
    mf.set_positions(123)
    assert (mf.wrote_position, mf.flushed_position) == (123, 123)
    mf.close()


def test_a_loaded_file_counts_as_full_until_set_positions(disk: Disk, store_dir: str) -> None:
    first = new_file(disk, store_dir, size=1024)
    first.append_bytes(pattern(300))
    first.flush(0)
    first.close()
    loaded = MappedFile(disk, first.path, 1024, loaded=True)
    assert loaded.is_full()
    assert (loaded.wrote_position, loaded.flushed_position) == (1024, 1024)
    assert loaded.read(0, 300) == pattern(300)
    loaded.set_positions(300)
    assert not loaded.is_full()
    assert loaded.remaining() == 724
    loaded.close()


# -- reads --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("pos", "size"), [(0, 101), (100, 1), (-1, 1), (0, -1), (99, 2)])
def test_read_beyond_the_readable_position_raises_out_of_range(
    disk: Disk, store_dir: str, pos: int, size: int
) -> None:
    mf = new_file(disk, store_dir, size=1024)
    mf.append_bytes(pattern(100))
    with pytest.raises(OutOfRange):
        mf.read(pos, size)
    assert mf.read(99, 1) == pattern(100)[99:]
    assert mf.read(100, 0) == b""
    mf.close()


# -- flush with least pages ---------------------------------------------------------------------


def test_flush_waits_for_least_pages_whole_dirty_pages(disk: Disk, store_dir: str) -> None:
    mf = new_file(disk, store_dir)
    mf.append_bytes(pattern(PAGE + PAGE // 2))  # 1.5 pages: only one page boundary crossed
    assert mf.flush(2) == 0
    assert mf.flushed_position == 0
    mf.append_bytes(pattern(PAGE // 2 + 10, 1))  # 2 pages + 10 bytes
    assert mf.flush(2) == 2 * PAGE + 10
    mf.append_bytes(pattern(PAGE, 2))  # 3 pages + 10: one more page boundary since the flush
    assert mf.flush(2) == 2 * PAGE + 10
    assert mf.flush(1) == 3 * PAGE + 10
    mf.close()


def test_flush_with_zero_least_pages_flushes_any_dirty_byte(disk: Disk, store_dir: str) -> None:
    mf = new_file(disk, store_dir)
    mf.append_bytes(b"x")
    assert mf.flush(1) == 0
    assert mf.flush(0) == 1
    assert mf.flush(0) == 1  # nothing new: nothing to do
    mf.close()


def test_a_full_file_is_flushed_whatever_least_pages_says(disk: Disk, store_dir: str) -> None:
    mf = new_file(disk, store_dir)
    mf.append_bytes(pattern(FOUR_PAGES - 10))
    assert mf.flush(0) == FOUR_PAGES - 10
    mf.append_bytes(pattern(10, 3))
    assert mf.is_full()
    assert mf.flush(100) == FOUR_PAGES
    mf.close()


def test_after_crash_drop_exactly_the_flushed_bytes_survive() -> None:
    disk = SimDisk()
    mf = new_file(disk, "/store/q")
    data = pattern(3 * PAGE + 100)
    mf.append_bytes(data[: PAGE + 7])
    assert mf.flush(0) == PAGE + 7
    mf.append_bytes(data[PAGE + 7 :])
    assert mf.flush(3) == PAGE + 7  # only two page boundaries crossed: not flushed
    disk.crash(random.Random(0), mode="drop")
    after = MappedFile(disk, mf.path, FOUR_PAGES, loaded=True)
    survived = after.read(0, FOUR_PAGES)
    assert survived == data[: PAGE + 7] + bytes(FOUR_PAGES - PAGE - 7)
    after.close()


def test_after_crash_keep_unflushed_bytes_survive_too() -> None:
    disk = SimDisk()
    mf = new_file(disk, "/store/q")
    data = pattern(PAGE + 100)
    mf.append_bytes(data)
    disk.crash(random.Random(0), mode="keep")
    after = MappedFile(disk, mf.path, FOUR_PAGES, loaded=True)
    assert after.read(0, len(data)) == data
    after.close()


def test_write_at_below_the_flushed_position_is_made_durable_by_the_next_flush() -> None:
    disk = SimDisk()
    mf = new_file(disk, "/store/q", size=1024)
    mf.append_bytes(pattern(200))
    assert mf.flush(0) == 200
    mf.write_at(10, b"\xff" * 5)
    mf.flush(0)
    disk.crash(random.Random(0), mode="drop")
    after = MappedFile(disk, mf.path, 1024, loaded=True)
    assert after.read(10, 5) == b"\xff" * 5


# -- hold, release and deletion while read ------------------------------------------------------


def test_a_held_file_stays_readable_after_destroy(disk: Disk, store_dir: str) -> None:
    mf = new_file(disk, store_dir)
    data = pattern(2 * PAGE + 5)
    mf.append_bytes(data)
    assert mf.hold()
    mf.destroy()
    # The name is gone at once ...
    assert not disk.exists(mf.path)
    assert os.path.basename(mf.path) not in disk.listdir(store_dir)
    # ... but the holder still reads the bytes through the mapping.
    assert bytes(mf.buf[: len(data)]) == data
    assert not mf.available
    mf.release()


def test_hold_after_destroy_returns_false(disk: Disk, store_dir: str) -> None:
    mf = new_file(disk, store_dir)
    mf.append_bytes(b"abc")
    mf.destroy()
    assert not mf.hold()
    assert not mf.available


def test_read_of_a_destroyed_file_raises_data_loss(disk: Disk, store_dir: str) -> None:
    mf = new_file(disk, store_dir)
    mf.append_bytes(b"abc")
    assert mf.read(0, 3) == b"abc"
    mf.destroy()
    with pytest.raises(DataLoss):
        mf.read(0, 3)


def test_a_memoryview_of_buf_stays_valid_after_destroy(disk: Disk, store_dir: str) -> None:
    mf = new_file(disk, store_dir)
    data = pattern(PAGE + 1)
    mf.append_bytes(data)
    view = memoryview(mf.buf)
    mf.destroy()  # unmapping is refused while the view exists; the bytes stay readable
    assert not disk.exists(mf.path)
    assert bytes(view[: len(data)]) == data
    view.release()


def test_flush_of_a_destroyed_file_does_nothing(disk: Disk, store_dir: str) -> None:
    mf = new_file(disk, store_dir)
    mf.append_bytes(pattern(100))
    mf.destroy()
    assert mf.flush(0) == 0


def test_destroy_twice_and_close_after_destroy_are_harmless(disk: Disk, store_dir: str) -> None:
    mf = new_file(disk, store_dir)
    mf.destroy()
    mf.destroy()
    mf.close()
    assert not disk.exists(mf.path)


def test_close_keeps_the_file_on_disk(disk: Disk, store_dir: str) -> None:
    mf = new_file(disk, store_dir, size=1024)
    mf.append_bytes(b"kept")
    mf.flush(0)
    mf.close()
    assert not mf.hold()
    assert disk.exists(mf.path)
    assert disk.read(mf.path)[:4] == b"kept"


# -- zero_from ----------------------------------------------------------------------------------


@pytest.mark.parametrize("cut", [0, 1, 100, PAGE, PAGE + 1, 3 * PAGE - 1])
def test_zero_from_makes_the_tail_read_as_zeros(disk: Disk, store_dir: str, cut: int) -> None:
    mf = new_file(disk, store_dir)
    data = pattern(FOUR_PAGES)
    mf.append_bytes(data)
    mf.flush(0)
    mf.zero_from(cut)
    assert bytes(mf.buf[:FOUR_PAGES]) == data[:cut] + bytes(FOUR_PAGES - cut)
    assert disk.read(mf.path) == data[:cut] + bytes(FOUR_PAGES - cut)
    mf.close()


def test_zero_from_is_durable_on_the_simulated_disk() -> None:
    disk = SimDisk()
    mf = new_file(disk, "/store/q")
    data = pattern(FOUR_PAGES)
    mf.append_bytes(data)
    mf.flush(0)
    mf.zero_from(PAGE + 3)
    disk.crash(random.Random(0), mode="drop")
    assert disk.read(mf.path) == data[: PAGE + 3] + bytes(FOUR_PAGES - PAGE - 3)
