"""Small helpers shared by the storage tests (no test doubles: they drive the real classes)."""

from __future__ import annotations

import os

from mqstore.storage.disk import Disk
from mqstore.storage.mapped_file_queue import MappedFileQueue
from mqstore.storage.simdisk import SimDisk

PAGE = 4096


def pattern(n: int, seed: int = 0) -> bytes:
    """`n` bytes that are never zero, so that zeroed or lost bytes are always visible."""
    return bytes((i * 31 + seed * 7) % 251 + 1 for i in range(n))


def set_mtime_ms(disk: Disk, path: str, mtime_ms: int) -> None:
    if isinstance(disk, SimDisk):
        disk.set_mtime_ms(path, mtime_ms)
    else:
        ns = mtime_ms * 1_000_000
        os.utime(path, ns=(ns, ns))


def append_stream(queue: MappedFileQueue, data: bytes) -> None:
    """Append a byte stream, filling each file to its end before the next is created."""
    view = memoryview(data)
    while view:
        mf = queue.get_last_mapped_file(0)
        assert mf is not None
        n = min(mf.remaining(), len(view))
        assert mf.append_bytes(view[:n])
        view = view[n:]


def queue_bytes(queue: MappedFileQueue) -> bytes:
    """The readable bytes of every file, concatenated in offset order."""
    return b"".join(mf.read(0, mf.wrote_position) for mf in queue.files)


def make_full_files(queue: MappedFileQueue, count: int) -> None:
    """`count` full files, file i filled with pattern(file_size, seed=i)."""
    for i in range(count):
        mf = queue.get_last_mapped_file(0)
        assert mf is not None
        assert mf.append_bytes(pattern(queue.file_size, seed=i))


def names_on_disk(disk: Disk, directory: str) -> list[str]:
    return disk.listdir(directory)
