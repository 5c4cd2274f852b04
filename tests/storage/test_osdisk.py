"""OsDisk, the real file system behind the Disk seam: locks, preallocation, zeroing, usage."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mqstore.errors import StorageError, StoreLocked
from mqstore.storage.disk import PAGE_BYTES, OsDisk

from .helpers import pattern


def test_lock_twice_in_one_process_raises_store_locked(tmp_path: Path) -> None:
    """flock belongs to the open file description: a second open in the same process
    conflicts, as two store instances on one directory must."""
    disk = OsDisk()
    path = str(tmp_path / "lock")
    lock = disk.lock(path)
    assert os.path.exists(path)
    with pytest.raises(StoreLocked):
        disk.lock(path)
    lock.release()
    again = disk.lock(path)
    again.release()
    again.release()  # a second release is harmless


def test_lock_is_held_against_another_process(tmp_path: Path) -> None:
    disk = OsDisk()
    path = str(tmp_path / "lock")
    lock = disk.lock(path)
    probe = textwrap.dedent(
        f"""
        from mqstore.errors import StoreLocked
        from mqstore.storage.disk import OsDisk
        try:
            OsDisk().lock({path!r})
        except StoreLocked as err:
            print("locked", err)
        else:
            print("free")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    # The refusal names the holder: this process (pid and command line), as a console can.
    assert out.stdout.startswith(f"locked {path} is held by process {os.getpid()} ("), out.stdout
    lock.release()
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "free"


@pytest.mark.parametrize("size", [1024, 4 * PAGE_BYTES, 1 << 20])
def test_create_preallocates_the_whole_file(tmp_path: Path, size: int) -> None:
    disk = OsDisk()
    path = str(tmp_path / "00000000000000000000")
    disk.create(path, size)
    st = os.stat(path)
    assert st.st_size == size
    assert st.st_blocks * 512 >= size
    assert disk.read(path) == bytes(size)


def test_create_refuses_an_existing_file(tmp_path: Path) -> None:
    disk = OsDisk()
    path = str(tmp_path / "f")
    disk.create(path, 10)
    with pytest.raises(FileExistsError):
        disk.create(path, 10)


def test_map_refuses_a_file_of_another_size(tmp_path: Path) -> None:
    disk = OsDisk()
    path = str(tmp_path / "f")
    disk.create(path, 100)
    with pytest.raises(StorageError):
        disk.map(path, 200)


@pytest.mark.parametrize(
    ("start", "end"),
    [
        (0, 4 * PAGE_BYTES),  # whole pages only: punched out
        (100, 3 * PAGE_BYTES + 5),  # partial pages around whole ones
        (10, 20),  # inside one page
        (PAGE_BYTES - 3, PAGE_BYTES + 3),  # across one boundary, no whole page
        (2 * PAGE_BYTES, 10 * PAGE_BYTES),  # end clipped to the file size
    ],
)
def test_zero_on_a_mapped_region_reads_as_zeros(tmp_path: Path, start: int, end: int) -> None:
    disk = OsDisk()
    size = 4 * PAGE_BYTES
    path = str(tmp_path / "f")
    disk.create(path, size)
    region = disk.map(path, size)
    data = pattern(size)
    region.buf[:] = data
    region.flush(0, size)
    region.zero(start, end)
    stop = min(end, size)
    expected = data[:start] + bytes(stop - start) + data[stop:]
    assert bytes(region.buf[:size]) == expected
    region.flush(0, size)
    with open(path, "rb") as f:
        assert f.read() == expected
    # Still preallocated: a later write through the map cannot meet ENOSPC (SIGBUS).
    assert os.stat(path).st_blocks * 512 >= size
    region.close()


def test_usage_counts_as_df_does_reserved_blocks_excluded(tmp_path: Path) -> None:
    # df's Use% (and RocketMQ's ratio): used / (used + available to this user).
    total, used = OsDisk().usage(str(tmp_path))
    ref = shutil.disk_usage(str(tmp_path))
    slack = 64 << 20  # other processes write between the two calls
    assert abs(used - ref.used) < slack
    assert abs(total - (ref.used + ref.free)) < slack
    assert 0 < used <= total <= ref.total


def test_listdir_is_sorted_and_empty_for_a_missing_directory(tmp_path: Path) -> None:
    disk = OsDisk()
    for name in ["b", "c", "a"]:
        (tmp_path / name).write_bytes(b"")
    assert disk.listdir(str(tmp_path)) == ["a", "b", "c"]
    assert disk.listdir(str(tmp_path / "missing")) == []


def test_makedirs_creates_every_missing_level(tmp_path: Path) -> None:
    disk = OsDisk()
    path = str(tmp_path / "a" / "b" / "c")
    disk.makedirs(path)
    disk.makedirs(path)
    assert disk.isdir(path)


def test_append_file_appends_syncs_and_truncates(tmp_path: Path) -> None:
    disk = OsDisk()
    path = str(tmp_path / "journal")
    f = disk.open_append(path)
    f.append(b"abc")
    f.append(memoryview(b"def"))
    f.sync()
    assert f.size == 6
    f.close()
    reopened = disk.open_append(path)
    assert reopened.size == 6
    reopened.close()
    disk.truncate(path, 2)
    assert disk.read(path) == b"ab"


def test_mtime_ms_reads_the_file_mtime(tmp_path: Path) -> None:
    disk = OsDisk()
    path = str(tmp_path / "f")
    disk.create(path, 10)
    os.utime(path, ns=(1_234_567_000_000, 1_234_567_000_000))
    assert disk.mtime_ms(path) == 1_234_567


def test_remove_of_a_missing_file_is_harmless(tmp_path: Path) -> None:
    OsDisk().remove(str(tmp_path / "missing"))


_ENOSPC_PROBE = """
import os, sys
from mqstore.errors import DiskFull
from mqstore.storage.disk import OsDisk
from mqstore.storage.mapped_file_queue import MappedFileQueue
mnt = sys.argv[1]
disk = OsDisk()
try:
    disk.create(os.path.join(mnt, "big"), 1 << 20)
except DiskFull:
    print("create:DiskFull", sorted(os.listdir(mnt)))
queue = MappedFileQueue(disk, os.path.join(mnt, "q"), 24 * 1024)
queue.load()
try:
    for _ in range(10):  # 64 KiB hold two 24 KiB files; the third must be refused
        assert queue.get_last_mapped_file(0).append_bytes(b"x" * (24 * 1024))
except DiskFull:
    print("queue:DiskFull", len(queue.files), sorted(os.listdir(os.path.join(mnt, "q"))))
"""


def test_preallocation_on_a_full_file_system_raises_disk_full_not_sigbus(tmp_path: Path) -> None:
    """A 64 KiB tmpfs in a private mount namespace (needs root; skipped elsewhere)."""
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for a private tmpfs")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = tmp_path / "probe.py"
    script.write_text(_ENOSPC_PROBE)
    shell = f"mount -t tmpfs -o size=64k none {mnt} && exec {sys.executable} {script} {mnt}"
    out = subprocess.run(
        [unshare, "-m", "sh", "-c", shell],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if out.returncode != 0 and "mount" in out.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "create:DiskFull []"  # the half-made file is removed
    assert lines[1] == (
        "queue:DiskFull 2 ['00000000000000000000', '00000000000000024576']"
    )  # full files stay readable; the refused one leaves no name behind
