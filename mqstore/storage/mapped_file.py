"""One fixed-size segment file, memory-mapped, named by its start offset.

    {dir}/00000000000000000000      bytes [0, file_size) of the queue's logical stream
    {dir}/00000000001073741824      bytes [file_size, 2*file_size) ...

Names are the start offset as 20 zero-padded decimal digits (RocketMQ's offset2FileName). A file
is preallocated before it is mapped (see disk.py). Two positions move forward through it:

    0 ........ flushed ........ wrote ........ file_size
               durable          written by the appender (into the map) and visible to readers

Deletion while read: a reader `hold()`s the file; `destroy()` unlinks it at once (a mapping
outlives its name) and unmaps only when the last holder has released it.
"""

from __future__ import annotations

import mmap
import os
import threading

from mqstore.errors import DataLoss, OutOfRange, check
from mqstore.storage.disk import PAGE_BYTES, Disk, Region

OFFSET_NAME_DIGITS = 20


def offset_to_file_name(offset: int) -> str:
    return f"{offset:0{OFFSET_NAME_DIGITS}d}"


def file_name_to_offset(name: str) -> int | None:
    """The start offset a segment name encodes, or None if the name is not one."""
    if len(name) != OFFSET_NAME_DIGITS or not (name.isascii() and name.isdigit()):
        return None
    return int(name)


class MappedFile:
    def __init__(
        self,
        disk: Disk,
        path: str,
        file_size: int,
        *,
        loaded: bool = False,
    ) -> None:
        offset = file_name_to_offset(os.path.basename(path))
        check(offset is not None, f"{path} is not named by a 20-digit offset")
        assert offset is not None
        self.path = path
        self.file_size = file_size
        self.file_from_offset = offset
        self._disk = disk
        self._region: Region = disk.map(path, file_size)
        # A loaded file counts as full until recovery says where its data ends (RocketMQ does
        # the same, and recovery then truncates).
        start = file_size if loaded else 0
        self.wrote_position = start
        self.flushed_position = start
        # Store time of the newest record appended; RocketMQ keeps it for its checkpoint.
        self.store_timestamp_ms = 0
        # Lowest position rewritten below the flushed mark (write_at): the flush starts there,
        # so a rewrite of old bytes is made durable too.
        self._rewritten_from = file_size
        self._refs = 1
        self._available = True
        self._cleaned = False
        self._ref_lock = threading.Lock()

    # -- buffers --------------------------------------------------------------------------------

    @property
    def buf(self) -> mmap.mmap | bytearray:
        """The map: the appender writes into it, readers read it below `wrote_position`."""
        return self._region.buf

    @property
    def file_end_offset(self) -> int:
        return self.file_from_offset + self.file_size

    def is_full(self) -> bool:
        return self.wrote_position >= self.file_size

    def remaining(self) -> int:
        return self.file_size - self.wrote_position

    # -- writing --------------------------------------------------------------------------------

    def advance(self, nbytes: int) -> None:
        """The appender wrote `nbytes` at `wrote_position` of `buf`: publish them."""
        check(self.wrote_position + nbytes <= self.file_size, "append past the end of file")
        self.wrote_position += nbytes

    def append_bytes(self, data: bytes | bytearray | memoryview) -> bool:
        """Append raw bytes; False (and nothing written) if they do not fit."""
        pos = self.wrote_position
        if pos + len(data) > self.file_size:
            return False
        self.buf[pos : pos + len(data)] = data
        self.advance(len(data))
        return True

    def write_at(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        """Overwrite bytes already inside the written region (consume-queue blanks); the next
        flush covers them even when they lie below the flushed mark."""
        check(pos >= 0 and pos + len(data) <= self.file_size, "write outside the file")
        self.buf[pos : pos + len(data)] = data
        self._rewritten_from = min(self._rewritten_from, pos)

    def set_positions(self, pos: int) -> None:
        """A loaded file's data ends at `pos` (recovery): every mark moves there."""
        check(0 <= pos <= self.file_size, f"position {pos} outside the file")
        self.wrote_position = pos
        self.flushed_position = pos

    def truncate_to(self, pos: int) -> None:
        """Cut the data at `pos`: what was not yet flushed below it stays so."""
        check(0 <= pos <= self.file_size, f"position {pos} outside the file")
        self.wrote_position = pos
        self.flushed_position = min(self.flushed_position, pos)

    def zero_from(self, pos: int) -> None:
        """Destroy everything at and after `pos` (a truncated tail must never be read again)."""
        self._region.zero(pos, self.file_size)
        self._region.flush(pos, self.file_size)

    # -- flush --------------------------------------------------------------------------------

    def _able(self, done: int, target: int, least_pages: int) -> bool:
        if target <= done:
            return False
        if self.is_full() or least_pages <= 0:
            return True
        return (target // PAGE_BYTES) - (done // PAGE_BYTES) >= least_pages

    def flush(self, least_pages: int) -> int:
        """Make the readable bytes durable; returns the flushed position. Raises OSError when
        the disk refuses (the caller must then stop acknowledging writes)."""
        target = self.wrote_position
        rewritten = self._rewritten_from < self.flushed_position
        if (rewritten or self._able(self.flushed_position, target, least_pages)) and self.hold():
            try:
                start = min(self.flushed_position, self._rewritten_from)
                self._rewritten_from = self.file_size
                self._region.flush(start, target)
                self.flushed_position = target
            finally:
                self.release()
        return self.flushed_position

    def populate(self, start: int, end: int) -> bool:
        """Fault [start, end) in ahead of the writer (see Region.populate)."""
        if not self.hold():
            return False
        try:
            return self._region.populate(start, end)
        finally:
            self.release()

    # -- reading --------------------------------------------------------------------------------

    def read(self, pos: int, size: int) -> bytes:
        """A copy of `size` bytes at `pos`; OutOfRange beyond the readable position, DataLoss if
        the file was deleted before the hold."""
        if pos < 0 or size < 0 or pos + size > self.wrote_position:
            raise OutOfRange(
                f"read [{pos}, {pos + size}) beyond readable {self.wrote_position} in {self.path}"
            )
        if not self.hold():
            raise DataLoss(f"{self.path} was deleted")
        try:
            return bytes(self._region.buf[pos : pos + size])
        finally:
            self.release()

    def hold(self) -> bool:
        with self._ref_lock:
            if not self._available:
                return False
            self._refs += 1
            return True

    def release(self) -> None:
        with self._ref_lock:
            self._refs -= 1
            if self._refs > 0 or self._cleaned:
                return
            self._cleaned = True
        self._region.close()

    @property
    def available(self) -> bool:
        return self._available

    # -- lifecycle ------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop new holds and drop this object's own reference."""
        with self._ref_lock:
            if not self._available:
                return
            self._available = False
        self.release()

    def destroy(self) -> None:
        """Unlink the file now; unmap when the last reader lets go."""
        self.shutdown()
        self._disk.remove(self.path)

    def close(self) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return (
            f"MappedFile({os.path.basename(self.path)}, wrote={self.wrote_position}, "
            f"flushed={self.flushed_position})"
        )
