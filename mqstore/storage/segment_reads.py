"""Ranges of commit-log segments copied out, by the log's owner and by a reader beside it.

    {data_dir}/store.meta                  store id, segment size (formats/commitlog_checkpoint)
    {data_dir}/commitlog/00000000000000000000      segment: records ... [blank] [zeros]
    {data_dir}/commitlog/00000000001073741824      named by its start offset (20 digits)

`copy_runs` copies ranges out of one mapped segment, a slice per run of ranges that follow each
other (commitlog_svc's Read); `LiveLog.read` cuts its runs with the same walk
(`_core.segment_runs`), which also cuts where the segment changes.

`LiveLog` reads those files while commitlog_svc writes them: a follower on the same host or in
the same pod (cq_svc with `--commitlog-dir`) answers a pull from the segment files instead of a
commit-log Read, which spares both services a gRPC hop of every record's bytes. It only copies;
whether the bytes are the records wanted is the caller's check (each record's CRC and fixed
fields, formats/record_columns.py), and anything it cannot answer is None: the caller reads the
commit log as before.

Why reading beside the writer is safe:
- The writer maps its segments shared (or writes them), so a record it has written is in the
  page cache, where this reader's read-only mapping sees it; a follower only asks for records
  the dispatch stream named, which were whole before they were dispatched.
- Segments are preallocated to their full size and never shrunk (a cut tail is zeroed), so a
  mapping never runs past its file's end. A file of any other size is not mapped, and one that
  grew since it was mapped is mapped again. The one hazard left: a segment cut short by hand
  (or a media error) under a mapping faults the process (SIGBUS), as it would commitlog_svc.
- A deleted segment (retention) or one replaced under the same name (recovery removed it and
  the log wrote it again) is found by its inode on every read: the old mapping is dropped and
  the ranges in it are not answered.
- `forget` drops every mapping (the follower calls it at each handshake: the log may have been
  replaced); `drop_below` those below a moved minimum. Mappings are bounded (`maps_max`,
  oldest use dropped first); a reader in flight keeps its own reference.

Threads: any number of readers; a lock guards the table of mappings, never a copy.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from mqstore.errors import CorruptFile
from mqstore.formats import _core
from mqstore.formats.commitlog_checkpoint import decode_meta
from mqstore.storage.logreader import COMMITLOG_SUBDIR, STORE_META_FILE, segment_files
from mqstore.storage.mapped_file import offset_to_file_name

log = logging.getLogger(__name__)

IntArray = npt.NDArray[np.int64]

# Open mappings at once: each holds a file descriptor (Python's mmap keeps a dup of it); a
# pull touches one or two segments, so a few dozen cover every reader of a 1 GiB-segment log.
LIVE_LOG_MAPS_MAX: Final = 64


def copy_runs(buf: mmap.mmap | bytes | bytearray, begin: IntArray, end: IntArray) -> list[bytes]:
    """Copies of buf[begin[i]:end[i]] for every i, where a range that starts at the end of the
    one before is copied with it (one slice per run, cut by _core.segment_runs over the one
    segment `buf`). `begin`, `end`: non-empty ranges within buf, len >= 1."""
    begin = np.ascontiguousarray(begin, dtype=np.int64)
    sizes = np.ascontiguousarray(end, dtype=np.int64) - begin
    runs = _core.segment_runs(begin, sizes, np.array([0, len(buf)], dtype=np.int64))
    if runs is None:
        raise ValueError("copy_runs: a range that is empty or outside the buffer")
    _, firsts, lasts = runs
    return list(map(buf.__getitem__, map(slice, firsts, lasts)))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class _Mapped:
    start: int
    size: int
    inode: tuple[int, int]
    buf: mmap.mmap


class LiveLog:
    """Read-only copies of ranges of the commit log in `data_dir`, which another process is
    writing (module docstring)."""

    def __init__(self, data_dir: str, *, maps_max: int = LIVE_LOG_MAPS_MAX) -> None:
        self.data_dir = data_dir
        self.segment_dir = os.path.join(data_dir, COMMITLOG_SUBDIR)
        self._maps_max = maps_max
        self._lock = threading.Lock()
        self._maps: OrderedDict[int, _Mapped] = OrderedDict()
        # Segment start offsets as last listed, ascending, then the newest one's end.
        self._starts: IntArray | None = None
        self._min_offset = 0

    def store_id(self) -> bytes | None:
        """The store id of the log in `data_dir` (its store.meta); None when there is none to
        read (no such file, or a damaged one)."""
        path = os.path.join(self.data_dir, STORE_META_FILE)
        try:
            with open(path, "rb") as f:
                return decode_meta(f.read(), path=path).store_id
        except (OSError, CorruptFile):
            return None

    def forget(self, min_offset: int = 0) -> None:
        """Drop every mapping and the segment list: the log may be another one now."""
        with self._lock:
            self._maps.clear()
            self._starts = None
            self._min_offset = min_offset

    def drop_below(self, min_offset: int) -> None:
        """Ranges below `min_offset` are the log's no more: not answered, their segments
        unmapped."""
        with self._lock:
            self._min_offset = max(self._min_offset, min_offset)
            for start in [s for s, m in self._maps.items() if s + m.size <= min_offset]:
                del self._maps[start]

    @property
    def mapped(self) -> int:
        return len(self._maps)

    def read(self, offsets: IntArray, sizes: IntArray) -> bytes | None:
        """The bytes of every range (offsets[i], sizes[i]) back to back, in the order given
        (any order: a pull of several queues asks for theirs one queue after the other); None
        unless every range lies whole in one segment that is there, sized to reach the next
        one, at or above the minimum."""
        if not len(offsets) or int(offsets.min()) < self._min_offset:
            return None
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        sizes = np.ascontiguousarray(sizes, dtype=np.int64)
        starts = self._listing(int((offsets + sizes).max()))
        if starts is None:
            return None
        # A slice per run: ranges of one segment that follow each other (the usual pull: one
        # run, or a few of a queue whose records lie between other queues').
        runs = _core.segment_runs(offsets, sizes, starts)
        if runs is None:
            return None
        segments, begins, ends = runs
        bufs: dict[int, memoryview] = {}
        for i in segments:
            if i not in bufs:
                mapped = self._segment(int(starts[i]), int(starts[i + 1] - starts[i]))
                if mapped is None:
                    return None
                bufs[i] = memoryview(mapped.buf)
        # Views, joined: the records' bytes are copied once (a slice of an mmap is a copy).
        views = [bufs[i][b:e] for i, b, e in zip(segments, begins, ends, strict=True)]
        try:
            return b"".join(views)
        finally:
            for view in views:
                view.release()
            for buf in bufs.values():
                buf.release()

    # -- segments --------------------------------------------------------------------------------

    def _listing(self, reach: int) -> IntArray | None:
        """Segment starts, ascending, then the newest segment's end: listed again when `reach`
        (an end offset asked for) lies past what the last listing saw."""
        starts = self._starts
        if starts is not None and reach <= int(starts[-1]):
            return starts
        listed = self._list_starts()
        with self._lock:
            self._starts = listed
        return listed

    def _list_starts(self) -> IntArray | None:
        try:
            found = sorted(segment_files(self.segment_dir))
        except OSError:
            return None
        if not found:
            return None
        newest, _, newest_bytes = found[-1]
        return np.asarray(
            [*(start for start, _, _ in found), newest + newest_bytes], dtype=np.int64
        )

    def _segment(self, start: int, size: int) -> _Mapped | None:
        """The mapping of the segment starting at `start`, `size` bytes long, checked to still
        be the file of that name; None when there is none of that size."""
        with self._lock:
            mapped = self._maps.get(start)
            if mapped is not None:
                self._maps.move_to_end(start)
        path = os.path.join(self.segment_dir, offset_to_file_name(start))
        try:
            st = os.stat(path)
        except OSError:
            self._drop(start)
            return None
        inode = (st.st_dev, st.st_ino)
        if st.st_size != size:
            # Still being preallocated, or cut short by hand: never mapped (a mapping past a
            # file's end would fault).
            self._drop(start)
            return None
        if mapped is not None and mapped.inode == inode and mapped.size == size:
            return mapped  # (a file that grew since it was mapped is mapped again)
        return self._map(start, path, inode, size)

    def _map(self, start: int, path: str, inode: tuple[int, int], size: int) -> _Mapped | None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            self._drop(start)
            return None
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != inode or st.st_size != size:
                return None
            buf = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        mapped = _Mapped(start, size, inode, buf)
        with self._lock:
            if start + size <= self._min_offset:
                return None  # the minimum moved past it meanwhile (drop_below): never kept
            self._maps[start] = mapped
            self._maps.move_to_end(start)
            while len(self._maps) > self._maps_max:
                self._maps.popitem(last=False)
        return mapped

    def _drop(self, start: int) -> None:
        with self._lock:
            self._maps.pop(start, None)
            self._starts = None
