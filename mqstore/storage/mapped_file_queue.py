"""A directory of equal-size segment files forming one logical byte stream.

    dir/
      00000000000000000000   [0, S)
      00000000000000001024   [S, 2S)         S = file_size; names are start offsets
      ...

Used by the commit log (1 GiB files), consume queues (6,000,000-byte files) and anything else
that appends fixed-size segments. Load rules are RocketMQ's (MappedFileQueue.doLoad): files
sorted by name, directories skipped, a zero-length last file deleted, any other size mismatch
refuses the load. The file list is copy-on-write: readers take `self.files` without a lock.

One addition, asked for by the caller (`load(restore_short_last=True)`: the commit log):

    the newest file is shorter than the file size   extended with zeros back to its size (and
      (a file system that lost its tail, a partial   preallocated); returned as a ShortSegment,
      copy), but not empty                           so that recovery treats the zeros as a
                                                     torn tail and the caller can say so
    an older file is shorter                         ShortSegmentError naming it: its tail is
                                                     lost data between records that are not,
                                                     which no restart can mend

Without it a short file refuses the load like any other size mismatch.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from mqstore.errors import StorageError, check
from mqstore.storage import failpoints
from mqstore.storage.disk import Disk
from mqstore.storage.mapped_file import MappedFile, file_name_to_offset, offset_to_file_name

log = logging.getLogger(__name__)

_I64_BYTES = 8


class StoreLoadError(StorageError):
    """The files on disk do not form a queue this code can open (sizes, names)."""


class ShortSegmentError(StoreLoadError):
    """A segment other than the newest is shorter than the file size: lost data."""

    def __init__(self, message: str, *, path: str, found_bytes: int, file_bytes: int) -> None:
        super().__init__(message)
        self.path = path
        self.found_bytes = found_bytes
        self.file_bytes = file_bytes


@dataclass(frozen=True, slots=True)
class ShortSegment:
    """The newest segment as `load` found it (`found_bytes`) before extending it with zeros to
    `file_bytes`."""

    path: str
    found_bytes: int
    file_bytes: int


class MappedFileQueue:
    def __init__(self, disk: Disk, store_path: str, file_size: int) -> None:
        check(file_size > 0, "file_size must be positive")
        self.disk = disk
        self.store_path = store_path
        self.file_size = file_size
        self.files: list[MappedFile] = []
        self.flushed_where = 0
        self._mutate = threading.Lock()

    # -- load -----------------------------------------------------------------------------------

    def load(self, *, restore_short_last: bool = False) -> ShortSegment | None:
        """Map every segment on disk, each counted as full until recovery sets positions.
        With `restore_short_last`, a newest file shorter than the file size is extended with
        zeros to it and returned (see the module docstring); nothing is changed on disk before
        every file has passed its size check."""
        self.disk.makedirs(self.store_path)
        names = [
            n
            for n in self.disk.listdir(self.store_path)
            if not self.disk.isdir(os.path.join(self.store_path, n))
        ]
        segments = [n for n in names if file_name_to_offset(n) is not None]
        sizes = [self.disk.size(os.path.join(self.store_path, n)) for n in segments]
        newest = len(segments) - 1
        # A zero-length newest file is an interrupted creation (deleted below): the newest
        # file with data is the one before it.
        newest_data = newest - 1 if sizes and sizes[newest] == 0 else newest
        short: ShortSegment | None = None
        for i, (name, size) in enumerate(zip(segments, sizes, strict=True)):
            path = os.path.join(self.store_path, name)
            if size == self.file_size or (size == 0 and i == newest):
                continue
            if size < self.file_size and restore_short_last:
                if i == newest_data:
                    short = ShortSegment(path, size, self.file_size)
                    continue
                raise ShortSegmentError(
                    f"{path} is {size} bytes, shorter than the {self.file_size} of this "
                    f"queue's files, and it is not the newest: the {self.file_size - size} "
                    "bytes past its end are lost, between records that are not; refusing to "
                    "load",
                    path=path,
                    found_bytes=size,
                    file_bytes=self.file_size,
                )
            raise StoreLoadError(
                f"{path} is {size} bytes but this queue's files are {self.file_size}; "
                "refusing to load (was the file size configuration changed?)"
            )
        if sizes and sizes[newest] == 0:
            log.warning("deleting zero-length last file %s", segments[newest])
            self.disk.remove(os.path.join(self.store_path, segments[newest]))
            self.disk.fsync_dir(self.store_path)
            segments.pop()
        if short is not None:
            log.warning(
                "the newest segment %s is %d bytes, shorter than %d (a file system that lost "
                "its tail, a partial copy): extended with zeros to its size; recovery cuts the "
                "log after its last whole record",
                short.path,
                short.found_bytes,
                short.file_bytes,
            )
            self.disk.extend(short.path, self.file_size)
        files: list[MappedFile] = []
        for name in segments:
            path = os.path.join(self.store_path, name)
            try:
                files.append(MappedFile(self.disk, path, self.file_size, loaded=True))
            except BaseException:
                for mf in files:
                    mf.close()
                raise
        self.files = files
        self.check_self()
        return short

    def check_self(self) -> bool:
        """True if neighbouring files are exactly one file size apart (logged if not)."""
        ok = True
        files = self.files
        for prev, cur in itertools.pairwise(files):
            if cur.file_from_offset - prev.file_from_offset != self.file_size:
                log.error(
                    "[BUG] files %s and %s are not %d bytes apart",
                    prev.path,
                    cur.path,
                    self.file_size,
                )
                ok = False
        return ok

    # -- lookup ---------------------------------------------------------------------------------

    def first_file(self) -> MappedFile | None:
        files = self.files
        return files[0] if files else None

    def last_file(self) -> MappedFile | None:
        files = self.files
        return files[-1] if files else None

    def get_last_mapped_file(
        self, start_offset: int = 0, *, create: bool = True
    ) -> MappedFile | None:
        """The file to append to: the last one, or a new one when there is none or it is full.
        `start_offset` places the first file of an empty queue (rounded down to a file start).
        Raises DiskFull when the new file cannot be preallocated."""
        last = self.last_file()
        if last is not None and not last.is_full():
            return last
        if not create:
            return last
        if last is None:
            create_offset = start_offset - start_offset % self.file_size
        else:
            create_offset = last.file_from_offset + self.file_size
        return self.create_file(create_offset)

    def create_file(self, offset: int) -> MappedFile:
        path = os.path.join(self.store_path, offset_to_file_name(offset))
        with self._mutate:
            last = self.last_file()
            if last is not None and last.file_from_offset >= offset:
                return last  # created by a racing caller
            self.disk.makedirs(self.store_path)
            if self.disk.exists(path):
                # Not loaded, so not vouched for by recovery: start it afresh.
                self.disk.remove(path)
                self.disk.fsync_dir(self.store_path)
            self.disk.create(path, self.file_size)
            failpoints.hit("segment.after_create")
            mf = MappedFile(self.disk, path, self.file_size)
            self.files = [*self.files, mf]
            return mf

    def find_mapped_file_by_offset(
        self, offset: int, *, return_first_on_not_found: bool = False
    ) -> MappedFile | None:
        files = self.files
        if not files:
            return None
        first = files[0]
        last = files[-1]
        if offset < first.file_from_offset or offset >= last.file_from_offset + self.file_size:
            return first if return_first_on_not_found else None
        index = offset // self.file_size - first.file_from_offset // self.file_size
        if 0 <= index < len(files):
            mf = files[index]
            if mf.file_from_offset <= offset < mf.file_end_offset:
                return mf
        for mf in files:  # holes after a failed deletion: fall back to a scan
            if mf.file_from_offset <= offset < mf.file_end_offset:
                return mf
        return first if return_first_on_not_found else None

    # -- offsets --------------------------------------------------------------------------------

    def min_offset(self) -> int:
        first = self.first_file()
        return first.file_from_offset if first is not None else 0

    def max_offset(self) -> int:
        """End of readable data: the end of what the last file holds."""
        last = self.last_file()
        return last.file_from_offset + last.wrote_position if last is not None else 0

    def roll_next_file(self, offset: int) -> int:
        return offset + self.file_size - offset % self.file_size

    # -- flush --------------------------------------------------------------------------------

    def flush(self, least_pages: int) -> bool:
        """Flush every file from `flushed_where` to the readable end; True if it advanced.
        An OSError from the disk propagates and `flushed_where` stays where it was."""
        before = self.flushed_where
        for mf in self._files_from(before):
            flushed = mf.flush(least_pages)
            self.flushed_where = mf.file_from_offset + flushed
            if flushed < mf.file_size:
                break
        return self.flushed_where > before

    def _files_from(self, offset: int) -> list[MappedFile]:
        files = self.files
        for i, mf in enumerate(files):
            if offset < mf.file_end_offset:
                return files[i:]
        return []

    # -- truncation and deletion ----------------------------------------------------------------

    def truncate_dirty_files(self, offset: int) -> None:
        """Data ends at `offset`: files starting after it go; the file holding it is cut there
        and its tail zeroed so stale bytes can never be mistaken for records."""
        with self._mutate:
            keep: list[MappedFile] = []
            removed = False
            for mf in self.files:
                if mf.file_end_offset <= offset:
                    keep.append(mf)
                elif mf.file_from_offset <= offset:
                    pos = offset - mf.file_from_offset
                    if pos < mf.wrote_position:
                        mf.zero_from(pos)
                    mf.truncate_to(pos)
                    keep.append(mf)
                else:
                    mf.destroy()
                    removed = True
            self.files = keep
            if removed:
                self.disk.fsync_dir(self.store_path)
            self.flushed_where = min(self.flushed_where, offset)

    def delete_last_mapped_file(self) -> None:
        with self._mutate:
            last = self.last_file()
            if last is None:
                return
            last.destroy()
            self.files = self.files[:-1]
            self.disk.fsync_dir(self.store_path)

    def delete_expired_file_by_time(
        self,
        *,
        expired_before_ms: int,
        floor_offset: int,
        clean_immediately: bool,
        max_files: int,
        on_delete: Callable[[MappedFile], None] | None = None,
    ) -> int:
        """Delete the leading run of files last modified before `expired_before_ms` (or all
        leading files with `clean_immediately`), never the last file and never a file whose
        data reaches above `floor_offset`. Stops at the first file it keeps."""
        files = self.files
        doomed: list[MappedFile] = []
        for mf in files[:-1]:
            if len(doomed) >= max_files:
                break
            if mf.file_end_offset > floor_offset:
                break
            expired = self.disk.mtime_ms(mf.path) < expired_before_ms
            if not (expired or clean_immediately):
                break
            doomed.append(mf)
        return self._delete_leading(doomed, on_delete)

    def delete_expired_file_by_offset(self, offset: int, unit_size: int) -> int:
        """RocketMQ's deleteExpiredFileByOffset for unit files: destroy each file but the last
        whose last unit (an int64 at file_size - unit_size) points below `offset`."""
        files = self.files
        doomed: list[MappedFile] = []
        for mf in files[:-1]:
            if not mf.hold():
                doomed.append(mf)  # no longer available: nothing to lose
                continue
            if mf.wrote_position < self.file_size:
                mf.release()
                break  # not full: its last unit is not written yet (RocketMQ stops too)
            try:
                pos = self.file_size - unit_size
                value = int.from_bytes(mf.buf[pos : pos + _I64_BYTES], "big", signed=True)
            finally:
                mf.release()
            if value >= offset:
                break
            doomed.append(mf)
        return self._delete_leading(doomed, None)

    def _delete_leading(
        self, doomed: list[MappedFile], on_delete: Callable[[MappedFile], None] | None
    ) -> int:
        if not doomed:
            return 0
        with self._mutate:
            for mf in doomed:
                mf.destroy()
                failpoints.hit("segment.after_delete")
                if on_delete is not None:
                    on_delete(mf)
            gone = {id(mf) for mf in doomed}
            self.files = [mf for mf in self.files if id(mf) not in gone]
            self.disk.fsync_dir(self.store_path)
        return len(doomed)

    # -- lifecycle ------------------------------------------------------------------------------

    def shutdown(self) -> None:
        with self._mutate:
            for mf in self.files:
                mf.close()

    def destroy(self) -> None:
        """Delete every file (a store being wiped)."""
        with self._mutate:
            for mf in self.files:
                mf.destroy()
            self.files = []
            self.flushed_where = 0
            if self.disk.isdir(self.store_path):
                self.disk.fsync_dir(self.store_path)
