"""write_atomic (disk.py): a crash at any point leaves the old content or the new, whole.

The process is stopped before each step in turn (write tmp, rename, fsync_dir) by making that
step fail, or by an armed failpoint in the caller, and the simulated disk then crashes in every
mode; with random mode over many seeds.
"""

from __future__ import annotations

import errno
import random
from pathlib import Path

import pytest

from mqstore.storage import failpoints
from mqstore.storage.disk import OsDisk, write_atomic
from mqstore.storage.simdisk import CrashMode, SimDisk

from .helpers import pattern

D = "/data"
PATH = f"{D}/checkpoint"
OLD = pattern(300, 1)
NEW = pattern(500, 2)

# The step a fault stops write_atomic before; None: it ran to the end.
STEPS = ["write", "rename", "fsync_dir", None]
BEFORE_WRITE_ATOMIC = failpoints.declare("test.before_write_atomic", "a caller of write_atomic")


def attempt(disk: SimDisk, stop_before: str | None) -> None:
    if stop_before is not None:
        disk.inject(stop_before, errno.EIO)
    try:
        write_atomic(disk, PATH, NEW)
    except OSError:
        assert stop_before is not None
    else:
        assert stop_before is None


def disk_with(old: bytes | None) -> SimDisk:
    disk = SimDisk()
    disk.makedirs(D)
    if old is not None:
        write_atomic(disk, PATH, old)
    return disk


def content(disk: SimDisk) -> bytes | None:
    return disk.read(PATH) if disk.exists(PATH) else None


@pytest.mark.parametrize("old", [OLD, None], ids=["replace", "first-write"])
@pytest.mark.parametrize("stop_before", STEPS)
@pytest.mark.parametrize("mode", ["drop", "keep", "random"])
def test_crash_at_any_step_leaves_old_or_new_content_whole(
    old: bytes | None, stop_before: str | None, mode: CrashMode
) -> None:
    seeds = range(20) if mode == "random" else range(1)
    for seed in seeds:
        disk = disk_with(old)
        attempt(disk, stop_before)
        disk.crash(random.Random(seed), mode=mode)
        assert content(disk) in (old, NEW), f"seed {seed}"


@pytest.mark.parametrize("mode", ["drop", "keep", "random"])
def test_a_completed_write_atomic_is_durable(mode: CrashMode) -> None:
    for seed in range(10):
        disk = disk_with(OLD)
        write_atomic(disk, PATH, NEW)
        disk.crash(random.Random(seed), mode=mode)
        assert content(disk) == NEW


def test_crash_before_the_directory_fsync_can_lose_the_new_content() -> None:
    """The rename is the commit point only once the directory is fsynced: the model must be
    able to drop it, or the test above proves nothing about the fsync_dir step."""
    disk = disk_with(OLD)
    attempt(disk, "fsync_dir")
    assert disk.read(PATH) == NEW  # visible before the crash
    disk.crash(random.Random(0), mode="drop")
    assert content(disk) == OLD


def test_a_failpoint_stops_the_caller_between_steps_and_the_old_content_survives() -> None:
    disk = disk_with(OLD)

    def save() -> None:
        failpoints.hit(BEFORE_WRITE_ATOMIC)
        write_atomic(disk, PATH, NEW)

    with (
        failpoints.armed(BEFORE_WRITE_ATOMIC),
        pytest.raises(failpoints.SimulatedCrash),
    ):
        save()
    disk.crash(random.Random(0), mode="random")
    assert content(disk) == OLD
    save()  # disarmed after the block
    disk.crash(random.Random(0), mode="drop")
    assert content(disk) == NEW


def test_write_atomic_on_the_real_disk_replaces_the_file_and_leaves_no_tmp(tmp_path: Path) -> None:
    disk = OsDisk()
    path = f"{tmp_path}/checkpoint"
    write_atomic(disk, path, OLD)
    write_atomic(disk, path, NEW)
    assert disk.read(path) == NEW
    assert disk.listdir(str(tmp_path)) == ["checkpoint"]
