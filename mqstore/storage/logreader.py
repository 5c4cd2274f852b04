"""Offline, read-only reader of a commit-log directory: ours or RocketMQ's.

    DIR/
      00000000000000000000      records ... [blank]        every file the same size S
      00000000001073741824      records ... [blank]        (RocketMQ: 1 GiB; ours: configured)
      00000000002147483648      records ... zeros          the last file: written data, then zeros

The segment size is taken from the files themselves (all must be equal), never from a
configuration, so a directory copied off a RocketMQ broker reads as well as one of ours. Files are
mapped read-only (mmap.ACCESS_READ), one at a time. Nothing is ever written and no lock is taken:
a running store may hold its lock, and reading beside it is safe, though the newest record may be
seen half-written.

What a scan yields, in offset order, and what it does next:

    found at offset X                            yields                          then
    a valid record                               RecordEntry                     X + size
    the end-of-file blank (size = rest of file)  BlankEntry                      next file
    a blank whose size is not the rest of file   BadEntry                        next file
    a bad record, a valid record later at Y      BadEntry(next_offset=Y)         Y
    zeros to the end of the file, and nothing    nothing: the written data ends  stop
      but zeros in later files                     here (a clean end)
    zeros to the end of the file, a valid        BadEntry(next_offset=Y)         Y
      record later at Y                            (a file lost its tail)
    any other bad bytes, nothing valid after     BadEntry(next_offset=None)      stop
      (a torn or garbage tail)
    no file holds [A, B) between two files       BadEntry(A, next_offset=B)      B
    a file vanished or changed size mid-scan     BadEntry(next_offset=its end)   next file

Deciding "zeros to the end" skips the holes of sparse or preallocated files (SEEK_DATA), so the
mostly empty 1 GiB tail of a RocketMQ file costs almost nothing to check.

"Valid" is `mqstore.formats.record.read_record` with the record's position as expected
PHYSICALOFFSET, so stale or shifted copies of records never pass; a record that carries the
whole-record CRC is checked by it, one without it by its body CRC. Resynchronising after a bad
record is `find_next_record`, as recovery does it; a run of consecutive bad records is one
BadEntry.
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from mqstore.errors import InvalidArgument
from mqstore.formats.record import Bad, Blank, Record, find_next_record, read_record
from mqstore.formats.record_damage import DamageSite, locate_damage

SEGMENT_NAME_DIGITS: Final = 20
# Where mqstore (and RocketMQ, under its store root) keep the segments; DIR may name the root.
COMMITLOG_SUBDIR: Final = "commitlog"
# commitlog_svc's store identity beside the segments (formats/commitlog_checkpoint.py StoreMeta).
STORE_META_FILE: Final = "store.meta"
# ... and the file it holds locked while it runs (store_files.py; log_repair.py takes it too).
STORE_LOCK_FILE: Final = "lock"
# Zero checks compare this much at a time: large enough to run at memory speed, small enough
# not to matter next to a 1 GiB mapping.
_ZERO_CHUNK_BYTES: Final = 1 << 20
_ZERO_CHUNK: Final = bytes(_ZERO_CHUNK_BYTES)


class LogDirError(InvalidArgument):
    """The directory cannot be read as a commit log: missing, no segments, mixed file sizes,
    overlapping segment names."""


@dataclass(frozen=True, slots=True)
class Segment:
    start_offset: int
    path: str
    file_bytes: int

    @property
    def end_offset(self) -> int:
        return self.start_offset + self.file_bytes


@dataclass(frozen=True, slots=True)
class RecordEntry:
    offset: int
    record: Record


@dataclass(frozen=True, slots=True)
class BlankEntry:
    offset: int
    total_size: int


@dataclass(frozen=True, slots=True)
class BadEntry:
    """Bytes at `offset` that are not a valid record. `next_offset` is where reading resumed
    (None: nothing valid follows). `record` holds the decoded fields when only the CRC or the
    offset check failed."""

    offset: int
    reason: str
    next_offset: int | None
    record: Record | None = None


@dataclass(frozen=True, slots=True)
class RecordRun:
    """Valid records from `offset` on, read in one call by a scan's RunReader: `records` is
    whatever that reader made of them (log_source: an Arrow batch)."""

    offset: int
    records: Any


Entry: TypeAlias = RecordEntry | BlankEntry | BadEntry

# Reads the valid records of a segment from a position in one go, for `LogDir.scan`:
# (mapped file, position, file size, the file's start offset) -> (the position after the records
# it read, a RecordRun of them or None when it kept none). It stops at any record it does not
# take (not valid, or one it leaves to read_record): the scan reads that one as it does without
# a RunReader, so the entries are the same either way, the valid records in runs.
RunReader: TypeAlias = Callable[[mmap.mmap, int, int, int], tuple[int, RecordRun | None]]


def is_segment_name(name: str) -> bool:
    return len(name) == SEGMENT_NAME_DIGITS and name.isdigit()


def list_segments(directory: str) -> list[Segment]:
    """The segment files of `directory` (or of its `commitlog/` subdirectory when it holds none
    itself), sorted by offset. Raises LogDirError when they do not form a readable log."""
    if not os.path.isdir(directory):
        raise LogDirError(f"{directory} is not a directory")
    found = segment_files(directory)
    sub = os.path.join(directory, COMMITLOG_SUBDIR)
    if not found and os.path.isdir(sub):
        directory = sub
        found = segment_files(directory)
    if not found:
        raise LogDirError(
            f"no segment files in {directory} (commit-log files are named by their start "
            "offset in 20 digits, e.g. 00000000000000000000)"
        )
    found.sort()
    # RocketMQ's loader deletes a zero-length last file (an interrupted creation); we skip it.
    if found[-1][2] == 0 and len(found) > 1:
        found.pop()
    sizes = {size for _, _, size in found}
    if len(sizes) != 1:
        detail = ", ".join(f"{os.path.basename(p)}={s}" for _, p, s in found[:8])
        raise LogDirError(
            f"segment files in {directory} differ in size ({detail}); all must be equal"
        )
    file_bytes = sizes.pop()
    if file_bytes == 0:
        raise LogDirError(f"the only segment file in {directory} is empty")
    segments = [Segment(start, path, file_bytes) for start, path, _ in found]
    for prev, nxt in itertools.pairwise(segments):
        if nxt.start_offset < prev.end_offset:
            raise LogDirError(
                f"{os.path.basename(nxt.path)} starts inside {os.path.basename(prev.path)} "
                f"(files are {file_bytes} bytes); the names do not form one log"
            )
    return segments


def segment_files(directory: str) -> list[tuple[int, str, int]]:
    """(start offset, path, size) of every segment file in `directory`, in no order."""
    out = []
    with os.scandir(directory) as it:
        for entry in it:
            if is_segment_name(entry.name) and entry.is_file():
                out.append((int(entry.name), entry.path, entry.stat().st_size))
    return out


class _SegmentUnreadable(Exception):
    pass


class _EndOfData(Exception):
    """Nothing valid follows: the scan is over."""


class _Mapped:
    """One segment, open and mapped read-only."""

    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        try:
            self._fd = os.open(segment.path, os.O_RDONLY)
        except OSError as exc:
            raise _SegmentUnreadable(f"{segment.path}: {exc.strerror or exc}") from exc
        try:
            size = os.fstat(self._fd).st_size
            if size != segment.file_bytes:
                raise _SegmentUnreadable(
                    f"{segment.path} is now {size} bytes, was {segment.file_bytes}"
                )
            self.buf = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            os.close(self._fd)
            raise _SegmentUnreadable(f"{segment.path}: {exc.strerror or exc}") from exc
        except BaseException:
            os.close(self._fd)
            raise
        if hasattr(self.buf, "madvise"):
            self.buf.madvise(mmap.MADV_SEQUENTIAL)

    def all_zero(self, start: int, end: int) -> bool:
        """Whether bytes [start, end) are all zero. Holes of a sparse or preallocated file are
        skipped without touching them (RocketMQ's 1 GiB files are mostly holes at the tail),
        so only the regions the file system reports as data are compared."""
        pos = start
        while pos < end:
            data, hole = self._next_data(pos, end)
            if data >= end:
                return True
            if not _zero_bytes(self.buf, data, hole):
                return False
            pos = hole
        return True

    def _next_data(self, pos: int, end: int) -> tuple[int, int]:
        """The next region [data, hole) at or after `pos` that may hold non-zero bytes."""
        seek_data = getattr(os, "SEEK_DATA", None)
        seek_hole = getattr(os, "SEEK_HOLE", None)
        if seek_data is None or seek_hole is None:
            return pos, end
        try:
            data = os.lseek(self._fd, pos, seek_data)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nothing but holes from pos to the end of file
                return end, end
            return pos, end  # not supported here: compare everything
        try:
            hole = os.lseek(self._fd, data, seek_hole)
        except OSError:
            hole = end
        return data, min(hole, end)

    def close(self) -> None:
        self.buf.close()
        os.close(self._fd)


class _OneMap:
    """At most one segment mapped at a time."""

    def __init__(self) -> None:
        self._open: _Mapped | None = None

    def get(self, segment: Segment) -> _Mapped:
        if self._open is not None and self._open.segment == segment:
            return self._open
        self.close()
        self._open = _Mapped(segment)
        return self._open

    def close(self) -> None:
        if self._open is not None:
            self._open.close()
        self._open = None


def _zero_bytes(buf: mmap.mmap, start: int, end: int) -> bool:
    pos = start
    while pos < end:
        n = min(_ZERO_CHUNK_BYTES, end - pos)
        if buf[pos : pos + n] != _ZERO_CHUNK[:n]:
            return False
        pos += n
    return True


class LogDir:
    """A directory of commit-log segments, read-only. `scan()` yields its entries."""

    def __init__(self, directory: str) -> None:
        self.segments = list_segments(directory)
        self.directory = os.path.dirname(self.segments[0].path)
        self.file_bytes = self.segments[0].file_bytes

    @property
    def min_offset(self) -> int:
        return self.segments[0].start_offset

    @property
    def end_offset(self) -> int:
        """End of the last file (not of the data in it)."""
        return self.segments[-1].end_offset

    def _locate(self, from_offset: int | None) -> tuple[int, int]:
        """(segment index, position) where a scan from `from_offset` starts."""
        if from_offset is None or from_offset <= self.min_offset:
            return 0, 0
        for i, seg in enumerate(self.segments):
            if from_offset < seg.start_offset:
                return i, 0  # in a gap between files: the next file
            if from_offset < seg.end_offset:
                return i, from_offset - seg.start_offset
        return len(self.segments), 0

    def locate_damage(self, offset: int) -> DamageSite | None:
        """The one changed byte that explains why the record at `offset` fails its
        whole-record CRC (formats/record_damage.py), if one does."""
        index, pos = self._locate(offset)
        if index >= len(self.segments) or self.segments[index].start_offset + pos != offset:
            return None
        maps = _OneMap()
        try:
            seg = self.segments[index]
            return locate_damage(maps.get(seg).buf, pos, seg.file_bytes)
        except _SegmentUnreadable:
            return None
        finally:
            maps.close()

    def scan(
        self, from_offset: int | None = None, *, check_crc: bool = True
    ) -> Generator[Entry, None, None]:
        """Every entry from `from_offset` (default: the first file), in offset order. A
        `from_offset` inside a record reads as bad bytes up to the next record."""
        for entry in self.scan_runs(from_offset, check_crc=check_crc, runs=None):
            assert not isinstance(entry, RecordRun)
            yield entry

    def scan_runs(
        self, from_offset: int | None = None, *, check_crc: bool = True, runs: RunReader | None
    ) -> Generator[Entry | RecordRun, None, None]:
        """scan(), the valid records that `runs` takes coming as RecordRuns instead of
        RecordEntries."""
        maps = _OneMap()
        try:
            yield from self._scan(maps, *self._locate(from_offset), check_crc=check_crc, runs=runs)
        finally:
            maps.close()

    def _scan(
        self, maps: _OneMap, index: int, pos: int, *, check_crc: bool, runs: RunReader | None
    ) -> Iterator[Entry | RecordRun]:
        segments = self.segments
        check_gap = False  # only between files read one after the other, not at the start
        while index < len(segments):
            seg = segments[index]
            if check_gap:
                prev = segments[index - 1]
                if prev.end_offset != seg.start_offset:
                    yield BadEntry(
                        prev.end_offset,
                        f"no segment file holds [{prev.end_offset}, {seg.start_offset})",
                        seg.start_offset,
                    )
            check_gap = True
            jump: tuple[int, int] | None = None
            try:
                jump = yield from self._scan_file(maps, index, pos, check_crc=check_crc, runs=runs)
            except _SegmentUnreadable as exc:
                nxt = seg.end_offset if index + 1 < len(segments) else None
                yield BadEntry(seg.start_offset + pos, f"segment unreadable: {exc}", nxt)
            except _EndOfData:
                return
            if jump is not None:
                index, pos = jump
                check_gap = False  # the bad entry before the jump covers what lies between
            else:
                index, pos = index + 1, 0

    def _scan_file(
        self, maps: _OneMap, index: int, pos: int, *, check_crc: bool, runs: RunReader | None
    ) -> Generator[Entry | RecordRun, None, tuple[int, int] | None]:
        """Entries of segments[index] from `pos`. Returns (index, pos) of a later file when a
        bad record resynchronises there, None to go on with the next file; raises _EndOfData
        when nothing valid follows."""
        segments = self.segments
        seg = segments[index]
        size = seg.file_bytes
        has_next = index + 1 < len(segments)
        buf = maps.get(seg).buf
        while pos < size:
            if runs is not None:
                after, run = runs(buf, pos, size, seg.start_offset)
                if run is not None:
                    yield run
                if after != pos:
                    pos = after
                    continue
            offset = seg.start_offset + pos
            found = read_record(buf, pos, size, check_crc=check_crc, expected_offset=offset)
            if isinstance(found, Record):
                yield RecordEntry(offset, found)
                pos += found.total_size
                continue
            if isinstance(found, Blank):
                if found.total_size == size - pos:
                    yield BlankEntry(offset, found.total_size)
                else:
                    yield BadEntry(
                        offset,
                        f"end-of-file blank claims {found.total_size} bytes but "
                        f"{size - pos} remain in the file",
                        seg.end_offset if has_next else None,
                    )
                return None
            assert isinstance(found, Bad)
            zero_tail = maps.get(seg).all_zero(pos, size)
            resume, later_all_zero = self._resync(maps, index, pos, skip_this_file=zero_tail)
            if resume is None:
                if zero_tail and later_all_zero:
                    raise _EndOfData  # the written data ends here: a clean end
                reason = (
                    "zeroed bytes to the end of the file, and later files hold no valid record"
                    if zero_tail
                    else f"{found.reason}; nothing valid follows (a torn or garbage tail)"
                )
                yield BadEntry(offset, reason, None, found.record)
                raise _EndOfData
            r_index, r_pos = resume
            if zero_tail:
                reason = "zeroed bytes to the end of the file, where records or a blank belong"
            else:
                reason = found.reason
            yield BadEntry(offset, reason, segments[r_index].start_offset + r_pos, found.record)
            if r_index != index:
                return resume
            pos = r_pos
            try:
                buf = maps.get(seg).buf  # the resync may have mapped another file meanwhile
            except _SegmentUnreadable as exc:
                nxt = seg.end_offset if has_next else None
                yield BadEntry(seg.start_offset + pos, f"segment unreadable: {exc}", nxt)
                return None
        return None

    def _resync(
        self, maps: _OneMap, index: int, pos: int, *, skip_this_file: bool
    ) -> tuple[tuple[int, int] | None, bool]:
        """Where the first valid record after a bad one at segments[index]:pos starts (None if
        nowhere), and whether every later file is all zeros (only meaningful with None)."""
        segments = self.segments
        if not skip_this_file:
            seg = segments[index]
            found = find_next_record(maps.get(seg).buf, pos, seg.file_bytes, seg.start_offset)
            if found >= 0:
                return (index, found), False
        later_all_zero = True
        for later in range(index + 1, len(segments)):
            seg = segments[later]
            try:
                mapped = maps.get(seg)
            except _SegmentUnreadable:
                continue
            # A spare file RocketMQ pre-created is all holes: skip it without reading it.
            if mapped.all_zero(0, seg.file_bytes):
                continue
            later_all_zero = False
            first = read_record(
                mapped.buf, 0, seg.file_bytes, check_crc=True, expected_offset=seg.start_offset
            )
            if isinstance(first, Record):
                return (later, 0), False
            found = find_next_record(mapped.buf, 0, seg.file_bytes, seg.start_offset)
            if found >= 0:
                return (later, found), False
        return None, later_all_zero
