"""A simulated disk that forgets what was never made durable.

The engines run on it unchanged (it is a `Disk`); a test then calls `crash()` and reopens the
engine on the same SimDisk to see what a power loss would have left. The model follows
FoundationDB's AsyncFileNonDurable and LazyFS:

- File content: every 512-byte sector whose live bytes differ from the durable copy is
  unflushed. On crash each such sector is dropped (the durable bytes come back), kept, torn (a
  prefix of the new bytes over the old) or garbled (the changed bytes become noise), as the
  crash mode says. Bytes a sector held durably before the write are never damaged by it.
  An append-only file keeps its synced length plus a torn prefix of what was appended after.
- Names: create/rename/remove are durable only after `fsync_dir` of their directory; on crash a
  prefix of the pending name operations survives (metadata journals apply in order).
- fsyncgate: after an injected flush failure the affected pages are marked clean without being
  written, so a retried flush "succeeds" but the bytes stay lost, as on Linux.

`inject()` makes an operation fail (ENOSPC, EIO) and `capacity_bytes` bounds preallocation.
`trace` (when enabled) records every flush and sync, so a test can check that each
acknowledgement came after a flush that covered its bytes.
"""

from __future__ import annotations

import errno
import itertools
import posixpath
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from mqstore.errors import DiskFull, StorageError, StoreLocked
from mqstore.storage.disk import PAGE_BYTES, AppendFile, FileLock, Region

SECTOR_BYTES = 512
CrashMode = Literal["drop", "keep", "random"]


@dataclass
class _Inode:
    live: bytearray
    durable: bytearray
    mtime_ms: int
    fixed_size: bool  # mapped files never change size; append files do
    # Pages whose write-back failed: later flushes "succeed" without writing them (fsyncgate).
    lost_pages: set[int] = field(default_factory=set)


@dataclass
class _Fault:
    op: str
    error: OSError
    times: int
    path_contains: str


def _norm(path: str) -> str:
    return posixpath.normpath(path)


class _SimRegion:
    def __init__(self, disk: SimDisk, path: str, inode: _Inode) -> None:
        self._disk = disk
        self._path = path
        self._inode = inode
        self._closed = False

    @property
    def buf(self) -> bytearray:
        return self._inode.live

    @property
    def size(self) -> int:
        return len(self._inode.live)

    def flush(self, start: int, end: int) -> None:
        self._disk._maybe_fail("flush", self._path)
        ino = self._inode
        start = max(0, start - start % PAGE_BYTES)
        end = min(len(ino.live), -(-end // PAGE_BYTES) * PAGE_BYTES)
        if end <= start:
            return
        fault = self._disk._take_fault("flush_eio", self._path)
        if fault is not None:
            ino.lost_pages.update(range(start // PAGE_BYTES, -(-end // PAGE_BYTES)))
            raise fault
        for page in range(start // PAGE_BYTES, -(-end // PAGE_BYTES)):
            if page in ino.lost_pages:
                continue
            a = page * PAGE_BYTES
            b = min(a + PAGE_BYTES, end)
            ino.durable[a:b] = ino.live[a:b]
        ino.mtime_ms = self._disk.clock_ms()
        self._disk._record("flush", self._path, start, end)

    def zero(self, start: int, end: int) -> None:
        end = min(end, len(self._inode.live))
        if end > start:
            self._inode.live[start:end] = bytes(end - start)

    def populate(self, start: int, end: int) -> bool:
        return False  # nothing to fault in: the bytes are a bytearray

    def close(self) -> None:
        self._closed = True


class _SimAppendFile:
    def __init__(self, disk: SimDisk, path: str, inode: _Inode) -> None:
        self._disk = disk
        self._path = path
        self._inode = inode

    @property
    def size(self) -> int:
        return len(self._inode.live)

    def append(self, data: bytes | memoryview) -> None:
        self._disk._maybe_fail("append", self._path)
        if self._disk.free_bytes() < len(data):
            raise DiskFull(f"simulated disk full appending to {self._path}")
        self._inode.live += data

    def sync(self) -> None:
        self._disk._maybe_fail("sync", self._path)
        self._inode.durable = bytearray(self._inode.live)
        self._inode.mtime_ms = self._disk.clock_ms()
        self._disk._record("sync", self._path, 0, len(self._inode.live))

    def close(self) -> None:
        pass


class _SimLock:
    def __init__(self, disk: SimDisk, path: str, token: int) -> None:
        self._disk = disk
        self._path = path
        self._token = token

    def release(self) -> None:
        # Only the holder's own token frees the lock: a handle from before a crash must not
        # release the lock of the store that opened after it.
        if self._disk._locks.get(self._path) == self._token:
            del self._disk._locks[self._path]


class SimDisk:
    """An in-memory `Disk` with crash semantics. Not thread-safe beyond the GIL."""

    def __init__(
        self,
        *,
        capacity_bytes: int = 1 << 40,
        clock_ms: Callable[[], int] | None = None,
        trace: bool = False,
    ) -> None:
        self.capacity_bytes = capacity_bytes
        self.clock_ms: Callable[[], int] = clock_ms or (lambda: 0)
        self.trace: list[tuple[str, str, int, int]] | None = [] if trace else None
        self._inodes: dict[int, _Inode] = {}
        self._next_ino = 1
        self._live: dict[str, int] = {}
        self._durable: dict[str, int] = {}
        self._dirs: set[str] = {"/", "."}
        self._pending: list[tuple[str, str, str, int]] = []  # (op, dir, path, ino or 0)
        self._locks: dict[str, int] = {}
        self._lock_tokens = itertools.count(1)
        self._faults: list[_Fault] = []
        self.crashes = 0

    # -- fault injection ------------------------------------------------------------------------

    def inject(
        self, op: str, err: int = errno.EIO, *, times: int = 1, path_contains: str = ""
    ) -> None:
        """Make the next `times` calls of `op` fail with OSError(err). Ops: create, flush
        (raises before anything is written), flush_eio (fsyncgate: pages marked clean unwritten),
        write, append, sync, rename, remove, fsync_dir."""
        self._faults.append(
            _Fault(op, OSError(err, errno.errorcode.get(err, "error")), times, path_contains)
        )

    def clear_faults(self) -> None:
        self._faults.clear()

    def _take_fault(self, op: str, path: str) -> OSError | None:
        for fault in self._faults:
            if fault.op == op and fault.path_contains in path and fault.times > 0:
                fault.times -= 1
                if fault.times == 0:
                    self._faults.remove(fault)
                return OSError(fault.error.errno, fault.error.strerror)
        return None

    def _maybe_fail(self, op: str, path: str) -> None:
        fault = self._take_fault(op, path)
        if fault is None:
            return
        if fault.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull(f"simulated {op} ENOSPC on {path}") from fault
        raise fault

    def _record(self, op: str, path: str, start: int, end: int) -> None:
        if self.trace is not None:
            self.trace.append((op, path, start, end))

    # -- Disk -----------------------------------------------------------------------------------

    def used_bytes(self) -> int:
        return sum(len(self._inodes[i].live) for i in set(self._live.values()))

    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes()

    def makedirs(self, path: str) -> None:
        path = _norm(path)
        while path not in self._dirs:
            self._dirs.add(path)
            path = posixpath.dirname(path)

    def listdir(self, path: str) -> list[str]:
        path = _norm(path)
        names = {posixpath.basename(p) for p in self._live if posixpath.dirname(p) == path}
        names |= {
            posixpath.basename(d) for d in self._dirs if posixpath.dirname(d) == path and d != path
        }
        return sorted(names)

    def isdir(self, path: str) -> bool:
        return _norm(path) in self._dirs

    def exists(self, path: str) -> bool:
        path = _norm(path)
        return path in self._live or path in self._dirs

    def _inode(self, path: str) -> _Inode:
        try:
            return self._inodes[self._live[_norm(path)]]
        except KeyError:
            raise FileNotFoundError(errno.ENOENT, "no such simulated file", path) from None

    def size(self, path: str) -> int:
        return len(self._inode(path).live)

    def mtime_ms(self, path: str) -> int:
        return self._inode(path).mtime_ms

    def set_mtime_ms(self, path: str, mtime_ms: int) -> None:
        self._inode(path).mtime_ms = mtime_ms

    def _new_inode(self, content: bytearray, durable: bytearray, *, fixed: bool) -> int:
        ino = self._next_ino
        self._next_ino += 1
        self._inodes[ino] = _Inode(content, durable, self.clock_ms(), fixed)
        return ino

    def _check_parent(self, path: str) -> None:
        if posixpath.dirname(path) not in self._dirs:
            raise FileNotFoundError(errno.ENOENT, "no such simulated directory", path)

    def create(self, path: str, size: int) -> None:
        path = _norm(path)
        self._check_parent(path)
        if path in self._live:
            raise FileExistsError(errno.EEXIST, "simulated file exists", path)
        self._maybe_fail("create", path)
        if self.free_bytes() < size:
            raise DiskFull(f"simulated disk full: cannot preallocate {size} bytes for {path}")
        ino = self._new_inode(bytearray(size), bytearray(size), fixed=True)
        self._live[path] = ino
        self._pending.append(("create", posixpath.dirname(path), path, ino))
        self.fsync_dir(posixpath.dirname(path))

    def map(self, path: str, size: int) -> Region:
        path = _norm(path)
        ino = self._inode(path)
        if len(ino.live) != size:
            raise StorageError(f"{path} is {len(ino.live)} bytes, expected {size}")
        return _SimRegion(self, path, ino)

    def read(self, path: str) -> bytes:
        return bytes(self._inode(path).live)

    def write(self, path: str, data: bytes | bytearray) -> None:
        path = _norm(path)
        self._check_parent(path)
        self._maybe_fail("write", path)
        if path in self._live:
            ino = self._inodes[self._live[path]]
            ino.live = bytearray(data)
            ino.durable = bytearray(data)
            ino.mtime_ms = self.clock_ms()
        else:
            if self.free_bytes() < len(data):
                raise DiskFull(f"simulated disk full writing {path}")
            new = self._new_inode(bytearray(data), bytearray(data), fixed=False)
            self._live[path] = new
            self._pending.append(("create", posixpath.dirname(path), path, new))
        self._record("sync", path, 0, len(data))

    def open_append(self, path: str) -> AppendFile:
        path = _norm(path)
        self._check_parent(path)
        if path not in self._live:
            ino = self._new_inode(bytearray(), bytearray(), fixed=False)
            self._live[path] = ino
            self._pending.append(("create", posixpath.dirname(path), path, ino))
        return _SimAppendFile(self, path, self._inode(path))

    def truncate(self, path: str, size: int) -> None:
        ino = self._inode(path)
        del ino.live[size:]
        del ino.durable[size:]

    def extend(self, path: str, size: int) -> None:
        ino = self._inode(path)
        self._maybe_fail("extend", _norm(path))
        grow = size - len(ino.live)
        if grow <= 0:
            return
        if self.free_bytes() < grow:
            raise DiskFull(f"simulated disk full: cannot preallocate {size} bytes for {path}")
        ino.live += bytes(grow)
        # Durable on return: the durable copy is what was durable, zeros to the new size.
        ino.durable += bytes(size - len(ino.durable))

    def rename(self, src: str, dst: str) -> None:
        src, dst = _norm(src), _norm(dst)
        self._maybe_fail("rename", src)
        if src not in self._live:
            raise FileNotFoundError(errno.ENOENT, "no such simulated file", src)
        ino = self._live.pop(src)
        self._live[dst] = ino
        self._pending.append(("rename", posixpath.dirname(dst), src + "\0" + dst, ino))

    def remove(self, path: str) -> None:
        path = _norm(path)
        self._maybe_fail("remove", path)
        if self._live.pop(path, None) is not None:
            self._pending.append(("remove", posixpath.dirname(path), path, 0))

    def remove_tree(self, path: str) -> None:
        path = _norm(path)
        inside = path + "/"
        for p in [p for p in self._live if p == path or p.startswith(inside)]:
            self.remove(p)
        for d in [d for d in self._dirs if d == path or d.startswith(inside)]:
            self._dirs.discard(d)
        # Removing a directory is durable only once it is empty, so the removals inside it are
        # made durable with it (as rmtree followed by an fsync of each level would).
        keep = []
        for op in self._pending:
            if op[2] == path or op[2].startswith(inside):
                self._apply(op)
            else:
                keep.append(op)
        self._pending = keep
        self.fsync_dir(posixpath.dirname(path))

    def fsync_dir(self, path: str) -> None:
        path = _norm(path)
        self._maybe_fail("fsync_dir", path)
        keep = []
        for op in self._pending:
            if op[1] == path:
                self._apply(op)
            else:
                keep.append(op)
        self._pending = keep

    def _apply(self, op: tuple[str, str, str, int]) -> None:
        kind, _, path, ino = op
        if kind == "create":
            self._durable[path] = ino
        elif kind == "remove":
            self._durable.pop(path, None)
        else:
            src, dst = path.split("\0")
            moved = self._durable.pop(src, None)
            if moved is not None:
                self._durable[dst] = moved

    def usage(self, path: str) -> tuple[int, int]:
        return self.capacity_bytes, self.used_bytes()

    def lock(self, path: str) -> FileLock:
        path = _norm(path)
        if path in self._locks:
            raise StoreLocked(f"{path} is held by another store instance")
        token = next(self._lock_tokens)
        self._locks[path] = token
        return _SimLock(self, path, token)

    # -- crash ----------------------------------------------------------------------------------

    def crash(self, rng: random.Random, mode: CrashMode = "drop") -> None:
        """Power loss: what survives is what was durable, plus what `mode` lets through.
        Every object handed out before (regions, append files, locks) is dead afterwards."""
        self.crashes += 1
        pending = self._pending
        if mode == "keep":
            survive = len(pending)
        elif mode == "drop":
            survive = 0
        else:
            survive = rng.randint(0, len(pending))
        for op in pending[:survive]:
            self._apply(op)
        self._pending = []
        new_inodes: dict[int, _Inode] = {}
        for ino_id in set(self._durable.values()):
            old = self._inodes[ino_id]
            content = self._settle(old, rng, mode)
            new_inodes[ino_id] = _Inode(content, bytearray(content), old.mtime_ms, old.fixed_size)
        self._inodes = new_inodes
        self._live = dict(self._durable)
        self._locks.clear()
        self._faults.clear()

    @staticmethod
    def _settle(ino: _Inode, rng: random.Random, mode: CrashMode) -> bytearray:
        live, durable = ino.live, ino.durable
        out = bytearray(durable)
        common = min(len(live), len(durable))
        for a in range(0, common, SECTOR_BYTES):
            b = min(a + SECTOR_BYTES, common)
            if live[a:b] == durable[a:b]:
                continue
            if a // PAGE_BYTES in ino.lost_pages:
                continue  # write-back failed: the old bytes stay
            out[a:b] = _sector_outcome(live[a:b], durable[a:b], rng, mode)
        if len(live) > len(durable) and not ino.fixed_size:
            # Appended but unsynced: a prefix of it may have reached the disk, torn at a sector.
            extra = live[len(durable) :]
            if mode == "keep":
                keep = len(extra)
            elif mode == "drop":
                keep = 0
            else:
                keep = rng.randint(0, len(extra))
            for a in range(0, keep, SECTOR_BYTES):
                chunk = extra[a : min(a + SECTOR_BYTES, keep)]
                out += _sector_outcome(chunk, bytes(len(chunk)), rng, mode)
        return out


def _sector_outcome(
    live: bytes | bytearray, durable: bytes | bytearray, rng: random.Random, mode: CrashMode
) -> bytes:
    if mode == "keep":
        return bytes(live)
    if mode == "drop":
        return bytes(durable)
    choice = rng.random()
    if choice < 0.4:
        return bytes(live)
    if choice < 0.8:
        return bytes(durable)
    if choice < 0.9:
        # A torn sector: a prefix of the new bytes over the old.
        cut = rng.randint(1, max(1, len(live) - 1))
        return bytes(live[:cut]) + bytes(durable[cut:])
    # The new bytes arrived as garbage. Bytes the write did not change stay as they were:
    # sectors are written whole, so a write can damage what it writes, not what was durable
    # before it in the same sector.
    noise = rng.randbytes(len(live))
    return bytes(
        old if new == old else junk for new, old, junk in zip(live, durable, noise, strict=True)
    )
