"""The Disk seam's contract, checked the same way on OsDisk and SimDisk, so that an engine
tested on the simulated disk meets the same answers on the real one."""

from __future__ import annotations

import os

import pytest

from mqstore.storage.disk import Disk

from .helpers import pattern


def test_write_then_read_returns_the_bytes(disk: Disk, store_dir: str) -> None:
    disk.makedirs(store_dir)
    path = os.path.join(store_dir, "small")
    disk.write(path, b"first")
    disk.write(path, b"second, longer")
    assert disk.read(path) == b"second, longer"
    assert disk.size(path) == len(b"second, longer")
    assert disk.exists(path)
    assert not disk.isdir(path)


def test_create_gives_a_zero_filled_file_of_the_size(disk: Disk, store_dir: str) -> None:
    disk.makedirs(store_dir)
    path = os.path.join(store_dir, "seg")
    disk.create(path, 3000)
    assert disk.size(path) == 3000
    assert disk.read(path) == bytes(3000)


def test_a_region_write_is_visible_to_read_and_to_a_second_map(disk: Disk, store_dir: str) -> None:
    disk.makedirs(store_dir)
    path = os.path.join(store_dir, "seg")
    disk.create(path, 4096)
    one = disk.map(path, 4096)
    one.buf[10:20] = pattern(10)
    two = disk.map(path, 4096)
    assert bytes(two.buf[10:20]) == pattern(10)
    assert disk.read(path)[10:20] == pattern(10)
    one.close()
    two.close()


def test_rename_moves_and_replaces(disk: Disk, store_dir: str) -> None:
    disk.makedirs(store_dir)
    a, b = os.path.join(store_dir, "a"), os.path.join(store_dir, "b")
    disk.write(a, b"A")
    disk.write(b, b"B")
    disk.rename(a, b)
    disk.fsync_dir(store_dir)
    assert disk.listdir(store_dir) == ["b"]
    assert disk.read(b) == b"A"


@pytest.mark.parametrize("op", ["size", "read", "mtime_ms"])
def test_asking_about_a_missing_file_raises_file_not_found(
    disk: Disk, store_dir: str, op: str
) -> None:
    disk.makedirs(store_dir)
    with pytest.raises(FileNotFoundError):
        getattr(disk, op)(os.path.join(store_dir, "missing"))


def test_removing_a_missing_file_is_harmless(disk: Disk, store_dir: str) -> None:
    disk.makedirs(store_dir)
    disk.remove(os.path.join(store_dir, "missing"))


def test_creating_in_a_missing_directory_raises_file_not_found(disk: Disk, store_dir: str) -> None:
    with pytest.raises(FileNotFoundError):
        disk.create(os.path.join(store_dir, "nowhere", "seg"), 10)
    with pytest.raises(FileNotFoundError):
        disk.write(os.path.join(store_dir, "nowhere", "small"), b"x")


@pytest.mark.parametrize(
    "disk",
    [
        "os",
        "sim",
    ],
    indirect=True,
)
def test_rename_of_a_missing_file_raises_file_not_found(disk: Disk, store_dir: str) -> None:
    disk.makedirs(store_dir)
    with pytest.raises(FileNotFoundError):
        disk.rename(os.path.join(store_dir, "missing"), os.path.join(store_dir, "b"))


def test_remove_tree_deletes_a_directory_and_everything_in_it(disk: Disk, store_dir: str) -> None:
    sub = os.path.join(store_dir, "topic", "0")
    disk.makedirs(sub)
    disk.create(os.path.join(sub, "seg"), 10)
    disk.remove_tree(os.path.join(store_dir, "topic"))
    assert not disk.exists(os.path.join(sub, "seg"))
    assert not disk.isdir(os.path.join(store_dir, "topic"))
    assert disk.listdir(store_dir) == []
