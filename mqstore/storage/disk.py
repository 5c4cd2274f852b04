"""The seam between the engines and the file system.

Every engine does its file I/O through a `Disk`: the real one here (`OsDisk`), or the simulated
one in simdisk.py that loses, keeps or garbles unflushed bytes on a simulated crash. The seam is
kept small so that the hot path costs nothing: a mapped file is a `Region` whose `buf` is the
mmap itself (or a bytearray on the simulated disk), written in place with struct.pack_into.

Durability contract, which SimDisk enforces and OsDisk implements:
- `Region.flush(start, end)` makes those bytes durable (msync); nothing else does.
- `create()` returns a preallocated file whose size and directory entry are durable.
  Preallocation matters: writing through an mmap onto a full disk is a SIGBUS that kills the
  process, while posix_fallocate answers ENOSPC, which becomes DiskFull.
- `write()` makes a small file's content durable, but its name only after `fsync_dir()`;
  `rename()` and `remove()` likewise are durable only after `fsync_dir()` of the directory.
- `AppendFile.sync()` makes everything appended so far durable.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import mmap
import os
import shutil
import sys
from typing import Any, Protocol

from mqstore.errors import DiskFull, StorageError, StoreLocked

# msync needs page-aligned offsets.
PAGE_BYTES = mmap.ALLOCATIONGRANULARITY
# Chunk for zero-filling when the file system cannot punch holes.
_ZERO_CHUNK_BYTES = 1 << 20
_ENOSPC = (errno.ENOSPC, errno.EDQUOT)


class Region(Protocol):
    """A fixed-size file mapped into memory."""

    @property
    def buf(self) -> mmap.mmap | bytearray: ...

    @property
    def size(self) -> int: ...

    def flush(self, start: int, end: int) -> None:
        """Make bytes [start, end) durable (rounded out to whole pages)."""

    def zero(self, start: int, end: int) -> None:
        """Zero [start, end); durable only after a flush covering it."""

    def populate(self, start: int, end: int) -> bool:
        """Fault [start, end) in for writing ahead of the writer, without changing a byte, so
        that appends do not pay first-touch page faults. May block for a while, but must not
        hold the GIL while it does. False if the platform cannot (then it is a no-op)."""

    def close(self) -> None: ...


class AppendFile(Protocol):
    """An append-only file (journals)."""

    @property
    def size(self) -> int: ...

    def append(self, data: bytes | memoryview) -> None: ...

    def sync(self) -> None: ...

    def close(self) -> None: ...


class FileLock(Protocol):
    def release(self) -> None: ...


class Disk(Protocol):
    def makedirs(self, path: str) -> None: ...

    def listdir(self, path: str) -> list[str]:
        """Names in a directory, sorted; [] if it does not exist."""

    def isdir(self, path: str) -> bool: ...

    def exists(self, path: str) -> bool: ...

    def size(self, path: str) -> int: ...

    def mtime_ms(self, path: str) -> int: ...

    def create(self, path: str, size: int) -> None:
        """A new zero-filled, preallocated file; its size and name are durable on return."""

    def map(self, path: str, size: int) -> Region: ...

    def read(self, path: str) -> bytes: ...

    def write(self, path: str, data: bytes | bytearray) -> None:
        """Create or replace a small file and fsync its content (not its name)."""

    def open_append(self, path: str) -> AppendFile: ...

    def truncate(self, path: str, size: int) -> None:
        """Shrink an append file (a torn journal tail); durable on return."""

    def extend(self, path: str, size: int) -> None:
        """Grow a file to `size` bytes with zeros after its content, preallocated as `create`
        does (DiskFull when there is no room); the new size is durable on return."""

    def rename(self, src: str, dst: str) -> None: ...

    def remove(self, path: str) -> None: ...

    def remove_tree(self, path: str) -> None: ...

    def fsync_dir(self, path: str) -> None: ...

    def usage(self, path: str) -> tuple[int, int]:
        """(total bytes, used bytes) of the file system holding `path`; total excludes blocks
        reserved for the superuser, so used/total is df's Use%."""

    def lock(self, path: str) -> FileLock:
        """An exclusive lock on `path` for this process; StoreLocked if someone holds it."""


def write_atomic(disk: Disk, path: str, data: bytes | bytearray) -> None:
    """Replace a file so that a crash leaves either the old or the new content, whole:
    write a temporary file, fsync it, rename over the target, fsync the directory. `data` may
    be a bytearray (a rebuilt index file is hundreds of MB, built in place): it is not copied."""
    tmp = path + ".tmp"
    disk.write(tmp, data)
    disk.rename(tmp, path)
    disk.fsync_dir(os.path.dirname(path) or ".")


# ---------------------------------------------------------------------------------------------
# The real file system


def _load_fallocate() -> Any:
    libc_name = ctypes.util.find_library("c")
    if not libc_name:
        return None
    try:
        libc = ctypes.CDLL(libc_name, use_errno=True)
        fn = libc.fallocate
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return fn


_FALLOCATE = _load_fallocate()


def _preallocate(fd: int, path: str, size: int) -> None:
    """`size` bytes allocated to the file and durable (DiskFull when the space is not there);
    a file system without fallocate gets the size only, best effort."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in _ENOSPC:
            raise DiskFull(f"no space to preallocate {size} bytes for {path}") from exc
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.ftruncate(fd, size)
    os.fsync(fd)


_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


def _load_madvise() -> Any:
    libc_name = ctypes.util.find_library("c")
    if not libc_name:
        return None
    try:
        fn = ctypes.CDLL(libc_name, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


# madvise through ctypes, not mmap.madvise: a ctypes call releases the GIL, so a warming thread
# faults pages in while the appender keeps running. MADV_POPULATE_WRITE is Linux 5.14+.
_MADVISE = _load_madvise()
_MADV_POPULATE_WRITE = 23


def _load_msync() -> Any:
    libc_name = ctypes.util.find_library("c")
    if not libc_name:
        return None
    try:
        fn = ctypes.CDLL(libc_name, use_errno=True).msync
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


# msync through ctypes too: CPython's mmap.flush holds the GIL for the whole msync, which would
# stop every other thread of the process for each group commit; a ctypes call releases it
# (figures in docs/bench.md).
# MS_SYNC is 4 on Linux (other systems number it differently and keep mmap.flush).
_MSYNC = _load_msync() if sys.platform.startswith("linux") else None
_MS_SYNC = 4


def _punch_hole(fd: int, start: int, length: int) -> bool:
    """Deallocate [start, start+length) so it reads as zeros; False if unsupported."""
    if _FALLOCATE is None or length <= 0:
        return False
    rc = _FALLOCATE(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, start, length)
    return bool(rc == 0)


class _OsRegion:
    def __init__(self, path: str, size: int) -> None:
        self._path = path
        self._size = size
        fd = os.open(path, os.O_RDWR)
        try:
            actual = os.fstat(fd).st_size
            if actual != size:
                raise StorageError(f"{path} is {actual} bytes, expected {size}")
            self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._fd = -1  # opened on the first zero
        # The mapping's address, for madvise. The ctypes view is dropped at once so that it
        # does not pin the map; callers only populate while they hold the file open.
        view = ctypes.c_char.from_buffer(self._mm)
        self._address = ctypes.addressof(view)
        del view

    @property
    def buf(self) -> mmap.mmap:
        return self._mm

    @property
    def size(self) -> int:
        return self._size

    def _file(self) -> int:
        if self._fd < 0:
            self._fd = os.open(self._path, os.O_RDWR)
        return self._fd

    def flush(self, start: int, end: int) -> None:
        start = max(0, start - start % PAGE_BYTES)
        end = min(self._size, end)
        if end <= start:
            return
        # msync(MS_SYNC) is fsync of the range on Linux: it writes back the dirty pages.
        if _MSYNC is None:
            self._mm.flush(start, end - start)
            return
        if self._mm.closed:
            raise ValueError("mmap closed or invalid")  # what mmap.flush raises
        if _MSYNC(self._address + start, end - start, _MS_SYNC) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"msync of {self._path}: {os.strerror(err)}")

    def zero(self, start: int, end: int) -> None:
        end = min(end, self._size)
        if end <= start:
            return
        # Zero the partial pages by hand, punch out the whole pages in between, then reserve
        # the blocks again so that a later write through the map cannot hit ENOSPC (SIGBUS).
        first_page = -(-start // PAGE_BYTES) * PAGE_BYTES
        last_page = end - end % PAGE_BYTES
        if first_page < last_page:
            self._mm[start:first_page] = bytes(first_page - start)
            self._mm[last_page:end] = bytes(end - last_page)
            fd = self._file()
            if _punch_hole(fd, first_page, last_page - first_page):
                try:
                    os.posix_fallocate(fd, first_page, last_page - first_page)
                except OSError as exc:
                    if exc.errno in _ENOSPC:
                        raise DiskFull(f"no space to re-reserve {self._path}") from exc
                    raise
                return
        for pos in range(start, end, _ZERO_CHUNK_BYTES):
            stop = min(end, pos + _ZERO_CHUNK_BYTES)
            self._mm[pos:stop] = bytes(stop - pos)

    def populate(self, start: int, end: int) -> bool:
        end = min(end, self._size)
        start -= start % PAGE_BYTES
        if _MADVISE is None or end <= start or self._mm.closed:
            return False
        return bool(_MADVISE(self._address + start, end - start, _MADV_POPULATE_WRITE) == 0)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        try:
            self._mm.close()
        except BufferError:
            # A reader still holds a memoryview of the map: the mapping is released when the
            # last view goes (the mmap object stays alive until then). Reads stay valid.
            pass


class _OsAppendFile:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._size = os.fstat(self._fd).st_size

    @property
    def size(self) -> int:
        return self._size

    def append(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._fd, view)
            except OSError as exc:
                if exc.errno in _ENOSPC:
                    raise DiskFull(str(exc)) from exc
                raise
            self._size += n
            view = view[n:]

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class _OsLock:
    def __init__(self, fd: int) -> None:
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


class OsDisk:
    """The real file system."""

    def makedirs(self, path: str) -> None:
        missing = []
        current = os.path.abspath(path)
        while not os.path.isdir(current):
            missing.append(current)
            current = os.path.dirname(current)
        for directory in reversed(missing):
            try:
                os.mkdir(directory)
            except FileExistsError:
                pass
            # A new directory's name must be durable before files inside it are relied on.
            self.fsync_dir(os.path.dirname(directory))

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def size(self, path: str) -> int:
        return os.path.getsize(path)

    def mtime_ms(self, path: str) -> int:
        return os.stat(path).st_mtime_ns // 1_000_000

    def create(self, path: str, size: int) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _preallocate(fd, path, size)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)
        self.fsync_dir(os.path.dirname(path) or ".")

    def map(self, path: str, size: int) -> Region:
        return _OsRegion(path, size)

    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def write(self, path: str, data: bytes | bytearray) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                try:
                    n = os.write(fd, view)
                except OSError as exc:
                    if exc.errno in _ENOSPC:
                        raise DiskFull(str(exc)) from exc
                    raise
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)

    def open_append(self, path: str) -> AppendFile:
        return _OsAppendFile(path)

    def truncate(self, path: str, size: int) -> None:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)

    def extend(self, path: str, size: int) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            _preallocate(fd, path, size)
        finally:
            os.close(fd)

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def remove(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def remove_tree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)
        self.fsync_dir(os.path.dirname(os.path.abspath(path)))

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def usage(self, path: str) -> tuple[int, int]:
        # As df and RocketMQ count: used = blocks in use; the total is what this user can ever
        # have (used + available), so blocks reserved for root do not read as "used".
        st = os.statvfs(path)
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        available = st.f_bavail * st.f_frsize
        return used + available, used

    def lock(self, path: str) -> FileLock:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            # flock locks belong to the open file description: a second open of the same store
            # in this process conflicts too, as RocketMQ's FileLock does.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            holder = _lock_holder(fd)
            os.close(fd)
            raise StoreLocked(f"{path} is held by {holder}") from exc
        # Who holds it, for the next one that tries (informational: the flock is the lock).
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return _OsLock(fd)


# How much of a lock holder's command line an error quotes.
_HOLDER_COMMAND_CHARS_MAX = 160


def _lock_holder(fd: int) -> str:
    """The process a lock file names (its pid, written by the holder) and its command line,
    or a general description when it names none (an older store) or that process is gone."""
    try:
        pid = int(os.pread(fd, 32, 0).decode("ascii").strip())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (ValueError, OSError):
        return "another process or store instance"
    if len(command) > _HOLDER_COMMAND_CHARS_MAX:
        command = command[: _HOLDER_COMMAND_CHARS_MAX - 3] + "..."
    return f"process {pid} ({command})" if command else f"process {pid}"
