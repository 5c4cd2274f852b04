"""One file consume queue: its unit files and their time companions, opened on demand.

    {data_dir}/consumequeue/{topic}/{queueId}/        unit files (unit_file.py)
    {data_dir}/consumequeue_time/{topic}/{queueId}/   time entries (time_file.py)

`QueueState` is what the store keeps for every queue, open or not: a few integers. `FileQueue`
is the open form, holding the mapped files of both trees; file_store.py opens and closes it
under an LRU bound on maps. Reopening needs no scan: the state says where the data ends and how
far it was flushed. An evicted queue is unmapped without a flush (its dirty pages stay in the
page cache); the checkpoint flush reopens it and msyncs the range it had not flushed (msync on
Linux writes back a file's dirty pages however they were dirtied).

Recovery of one queue (at store open), after RocketMQ's ConsumeQueue.recover (§3.5) with one
rule of ours, the confirmed offset C of the last checkpoint (every unit pointing below C was
flushed before C was written):

    the scan of the last 3 unit files (counted back from the newest file whose first unit is
    valid and below C: a trailing file preallocated before a crash holds nothing) finds:

    found                                        decision
    a valid unit, phy < C, phy not going back    keep it, go on
    an all-zero unit                             the queue ends here
    a unit with phy >= C                         not vouched for by the checkpoint (maybe torn
                                                 or garbled by the crash): the queue ends here;
                                                 dispatch re-sends it from C
    an invalid unit (phy < 0 or size <= 0), or   garbage: the queue ends here
      phy below the previous unit's
    a time entry failing its check               replaced by the next good entry's time (or the
                                                 recovery clock for a damaged tail); units stay

Ending the queue truncates both trees there: later files are deleted, the rest of the file is
zeroed (MappedFileQueue.truncate_dirty_files), so stale units can never be read again.
"""

from __future__ import annotations

import bisect
import logging
import mmap
import os
from collections.abc import Callable

import numpy as np

from cq_svc.store import UnitRun
from mqstore.errors import check
from mqstore.formats.cq_time import (
    TIME_BYTES,
    RawBisect,
    bisect_stored_files,
    decode_time,
    encode_time,
)
from mqstore.formats.cq_unit import (
    BLANK_SIZE,
    UNIT,
    UNIT_BYTES,
    UNIT_DTYPE,
    Unit,
    count_valid,
)
from mqstore.storage.disk import Disk
from mqstore.storage.mapped_file import MappedFile
from mqstore.storage.mapped_file_queue import MappedFileQueue

log = logging.getLogger(__name__)

RECOVER_LAST_FILES = 3  # RocketMQ scans only the last 3 files of a queue


class QueueState:
    """Kept for every known queue; ~100 bytes. Offsets are queue offsets (unit indexes)."""

    __slots__ = ("flushed_offset", "last_phy_end", "last_time_ms", "max_offset", "min_offset")

    def __init__(self) -> None:
        self.min_offset = 0
        self.max_offset = 0  # next unit to write
        self.last_phy_end = -1  # maxPhysicOffset: end of the newest unit's record
        self.last_time_ms = 0  # indexed (running maximum) time of unit max_offset - 1
        self.flushed_offset = 0  # units below it are durable (both trees)


def _is_blank(phy: int, size: int) -> bool:
    return phy == 0 and size == BLANK_SIZE


class FileQueue:
    def __init__(
        self,
        disk: Disk,
        data_dir: str,
        topic: str,
        queue_id: int,
        units_per_file: int,
        state: QueueState,
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.units_per_file = units_per_file
        self.state = state
        self._disk = disk
        self.units = MappedFileQueue(
            disk,
            os.path.join(data_dir, "consumequeue", topic, str(queue_id)),
            units_per_file * UNIT_BYTES,
        )
        self.times = MappedFileQueue(
            disk,
            os.path.join(data_dir, "consumequeue_time", topic, str(queue_id)),
            units_per_file * TIME_BYTES,
        )
        self.dirty = False

    # -- open / close ---------------------------------------------------------------------------

    @property
    def map_count(self) -> int:
        return len(self.units.files) + len(self.times.files)

    def reopen(self) -> None:
        """Map the files of a queue recovered earlier (module docstring)."""
        self.units.load()
        self.times.load()
        st = self.state
        for mfq, width in ((self.units, UNIT_BYTES), (self.times, TIME_BYTES)):
            _set_end(mfq, st.max_offset * width, min(st.flushed_offset, st.max_offset) * width)
        self.dirty = st.flushed_offset < st.max_offset

    def close(self, *, flush: bool = True) -> None:
        """Unmap (the caller's LRU evicts this queue), flushing first unless told not to."""
        if flush:
            self.flush(0)
        self.units.shutdown()
        self.times.shutdown()

    def flush(self, least_pages: int) -> None:
        # Time entries first: a unit vouched for by the checkpoint must have its time durable.
        self.times.flush(least_pages)
        self.units.flush(least_pages)
        if least_pages == 0:
            self.dirty = False
            self.state.flushed_offset = self.state.max_offset

    # -- recovery -------------------------------------------------------------------------------

    def recover(self, confirmed_offset: int, now_ms: int) -> int:
        """Find where the trustworthy units end (see the module table), cut both trees there,
        repair time entries. Returns the number of units cut."""
        self.units.load()
        self.times.load()
        files = self.units.files
        st = self.state
        if not files:
            self.times.destroy()
            st.min_offset = st.max_offset = 0
            st.last_phy_end = -1
            return 0
        # The last 3 files are scanned, counted back from the newest file whose first unit is
        # trustworthy: trailing files that start with a zero, invalid or unconfirmed unit (a
        # file preallocated before a crash, or a long unflushed run) hold no data of their own.
        newest = len(files) - 1
        while newest > 0 and not _first_unit_ok(files[newest], confirmed_offset):
            newest -= 1
        start = max(0, newest - (RECOVER_LAST_FILES - 1))
        end_bytes = files[start].file_from_offset
        last_end = -1
        for mf in files[start:]:
            walked, file_last_end = count_valid(mf.buf, 0, mf.file_size, below_phy=confirmed_offset)
            if file_last_end >= 0:
                if file_last_end < last_end:
                    break
                last_end = file_last_end
            end_bytes = mf.file_from_offset + walked
            if walked < mf.file_size:
                break
        cut = self._valid_units_from(end_bytes)
        self.units.truncate_dirty_files(end_bytes)
        end = end_bytes // UNIT_BYTES
        first_unit = self.units.min_offset() // UNIT_BYTES if self.units.files else end
        st.max_offset = end
        st.min_offset = min(max(st.min_offset, first_unit), end)
        st.last_phy_end = last_end
        st.flushed_offset = 0  # recovery kept what the crash left in the page cache: re-flush
        self._recover_times(first_unit, files[start].file_from_offset // UNIT_BYTES, end, now_ms)
        return cut

    def _valid_units_from(self, offset_bytes: int) -> int:
        """How many valid-looking units lie at and after `offset_bytes` (what recovery cuts)."""
        n = 0
        for mf in self.units.files:
            if mf.file_end_offset <= offset_bytes:
                continue
            start = max(0, offset_bytes - mf.file_from_offset)
            walked, _ = count_valid(mf.buf, start, mf.file_size)
            n += walked // UNIT_BYTES
        return n

    def _recover_times(self, first_unit: int, scan_from: int, end: int, now_ms: int) -> None:
        """Make the time tree cover exactly the units [first_unit, end) and check the entries
        from `scan_from`, repairing failures (module docstring)."""
        times = self.times
        times.truncate_dirty_files(end * TIME_BYTES)
        front = first_unit * TIME_BYTES
        # Leading time files whose unit files were deleted (a crash inside delete_expired).
        stale = [mf for mf in times.files if mf.file_end_offset <= front]
        for mf in stale:
            mf.destroy()
        times.files = [mf for mf in times.files if mf not in stale]
        whole = bool(times.files) and times.files[0].file_from_offset == front
        if not whole or not times.check_self():
            if end > first_unit:
                log.error("%s/%d: time files missing; rebuilding them", *self._name())
            times.destroy()
            scan_from = first_unit
        while times.max_offset() < end * TIME_BYTES:
            last = times.last_file()
            start = front if last is None else last.file_end_offset
            mf = times.create_file(start)
            mf.set_positions(min(mf.file_size, end * TIME_BYTES - start))
            mf.flushed_position = 0
        times.flushed_where = min(times.flushed_where, times.max_offset())
        scan_from = max(scan_from, first_unit)
        repaired = self._check_times(scan_from, end, now_ms)
        if repaired:
            log.error(
                "%s/%d: %d time entries failed their check; repaired", *self._name(), repaired
            )
        self.times.flush(0)
        st = self.state
        st.last_time_ms = self.time_at(end - 1) if end > first_unit else 0

    def _check_times(self, lo: int, hi: int, now_ms: int) -> int:
        bad: list[int] = []
        prev = 0
        good_after: dict[int, int] = {}
        for i in range(lo, hi):
            unit = self._unit_bytes(i)
            t = decode_time(unit, self._time_bytes(i))
            if t is None:
                bad.append(i)
                continue
            if t < prev:
                bad.append(i)  # passed its check by chance but breaks the order: repair too
                continue
            prev = t
            for b in bad:
                if b not in good_after:
                    good_after[b] = t
        for b in bad:
            self._write_time(b, good_after.get(b, max(prev, now_ms)))
        return len(bad)

    # -- unit access ----------------------------------------------------------------------------

    def _name(self) -> tuple[str, int]:
        return self.topic, self.queue_id

    def _locate(self, mfq: MappedFileQueue, offset: int, width: int) -> tuple[MappedFile, int]:
        mf = mfq.find_mapped_file_by_offset(offset * width)
        check(mf is not None, f"{self.topic}/{self.queue_id}: no file holds offset {offset}")
        assert mf is not None
        return mf, offset * width - mf.file_from_offset

    def has_offset(self, offset: int) -> bool:
        return self.units.find_mapped_file_by_offset(offset * UNIT_BYTES) is not None

    def _unit_bytes(self, offset: int) -> bytes:
        mf, pos = self._locate(self.units, offset, UNIT_BYTES)
        return bytes(mf.buf[pos : pos + UNIT_BYTES])

    def _time_bytes(self, offset: int) -> bytes:
        mf, pos = self._locate(self.times, offset, TIME_BYTES)
        return bytes(mf.buf[pos : pos + TIME_BYTES])

    def _write_time(self, offset: int, t: int) -> None:
        mf, pos = self._locate(self.times, offset, TIME_BYTES)
        mf.write_at(pos, encode_time(self._unit_bytes(offset), t))

    def phy_at(self, offset: int) -> tuple[int, int]:
        mf, pos = self._locate(self.units, offset, UNIT_BYTES)
        phy, size, _ = UNIT.unpack_from(mf.buf, pos)
        return phy, size

    def time_at(self, offset: int) -> int:
        """The indexed time of `offset`; an entry failing its check is read as the next good
        entry's time (time_file.py), or the newest time when none follows."""
        t = decode_time(self._unit_bytes(offset), self._time_bytes(offset))
        if t is not None:
            return t
        log.error("%s/%d: time entry %d fails its check", self.topic, self.queue_id, offset)
        for nxt in range(offset + 1, self.state.max_offset):
            t = decode_time(self._unit_bytes(nxt), self._time_bytes(nxt))
            if t is not None:
                return t
        return self.state.last_time_ms

    def time_readers(self) -> tuple[Callable[[int], int], RawBisect]:
        """(time_at, raw bisect) for one search (a lookup's ~20 probes, mostly in one file):
        each file pair is located once, not once a probe. The first checks each entry against
        its unit (what fails goes to time_at's fallback); the second bisects the stored times
        unchecked, reading the time files' bytes (bisect_stored_files), for
        search_offset_by_time to find a candidate with."""
        per_file = self.units_per_file
        files: dict[int, tuple[MappedFile, MappedFile]] = {}

        def pair(offset: int) -> tuple[MappedFile, MappedFile]:
            found = files.get(offset // per_file)
            if found is None:
                found = files[offset // per_file] = (
                    self._locate(self.units, offset, UNIT_BYTES)[0],
                    self._locate(self.times, offset, TIME_BYTES)[0],
                )
            return found

        def checked(offset: int) -> int:
            units, times = pair(offset)
            u = offset * UNIT_BYTES - units.file_from_offset
            t = offset * TIME_BYTES - times.file_from_offset
            found = decode_time(units.buf[u : u + UNIT_BYTES], times.buf[t : t + TIME_BYTES])
            return self.time_at(offset) if found is None else found

        def time_file(n: int) -> tuple[mmap.mmap | bytearray, int]:
            times = pair(n * per_file)[1]
            return times.buf, times.file_from_offset // TIME_BYTES

        def raw_bisect(lo: int, hi: int, target_ms: int, right: bool) -> int:
            return bisect_stored_files(time_file, per_file, lo, hi, target_ms, right=right)

        return checked, raw_bisect

    def read_units(self, offset: int, max_units: int) -> list[Unit] | None:
        """Units from `offset` (below max, across files) with their indexed times; None when no
        file holds `offset` (RocketMQ's iterateFrom returning null)."""
        runs = self._unit_runs(offset, max_units, one_file=False)
        if runs is None:
            return None
        out: list[Unit] = []
        for start, raw in runs:
            units = np.frombuffer(raw, dtype=UNIT_DTYPE)
            n = len(units)
            tmf, tpos = self._locate(self.times, start, TIME_BYTES)
            # A time is the top 48 bits of its 8-byte entry.
            times = np.frombuffer(tmf.buf[tpos : tpos + n * TIME_BYTES], dtype=">u8")
            out.extend(
                map(
                    Unit,
                    range(start, start + n),
                    units["phy"].tolist(),
                    units["size"].tolist(),
                    units["tags"].tolist(),
                    (times >> 16).tolist(),
                )
            )
        return out

    def read_unit_run(self, offset: int, max_units: int) -> UnitRun | None:
        """Up to `max_units` units from `offset` (below max) as stored, in the file holding it:
        what a pull walks. None when no file holds `offset`."""
        runs = self._unit_runs(offset, max_units, one_file=True)
        if runs is None:
            return None
        return UnitRun(*runs[0]) if runs else UnitRun(offset, b"")

    def _unit_runs(
        self, offset: int, max_units: int, *, one_file: bool
    ) -> list[tuple[int, bytes | bytearray]] | None:
        """(first queue offset, its units' bytes) for each file read from; None when no file
        holds `offset`."""
        end = self.state.max_offset
        if offset >= end or max_units <= 0:
            return []
        mf = self.units.find_mapped_file_by_offset(offset * UNIT_BYTES)
        if mf is None:
            return None
        runs: list[tuple[int, bytes | bytearray]] = []
        left = max_units
        while mf is not None and left > 0 and offset < end:
            pos = offset * UNIT_BYTES - mf.file_from_offset
            stop_units = min(end - offset, left, (mf.file_size - pos) // UNIT_BYTES)
            if stop_units > 0:
                # A slice of the mapped file is a copy: the file may be unmapped once we return.
                runs.append((offset, mf.buf[pos : pos + stop_units * UNIT_BYTES]))
                left -= stop_units
            offset += stop_units
            if one_file or offset >= end:
                break
            mf = self.units.find_mapped_file_by_offset(offset * UNIT_BYTES)
        return runs

    # -- writing --------------------------------------------------------------------------------

    def _write_at(self) -> tuple[MappedFile, MappedFile, int]:
        """The unit and time files holding max_offset (created when needed) and the write
        unit position in its file; both positions must be where each file's writes ended."""
        at = self.state.max_offset
        umf = self.units.get_last_mapped_file(at * UNIT_BYTES)
        tmf = self.times.get_last_mapped_file(at * TIME_BYTES)
        check(umf is not None and tmf is not None, "file creation")
        assert umf is not None and tmf is not None
        upos = at * UNIT_BYTES - umf.file_from_offset
        tpos = at * TIME_BYTES - tmf.file_from_offset
        check(upos == umf.wrote_position, f"unit write at {upos}, file at {umf.wrote_position}")
        check(tpos == tmf.wrote_position, f"time write at {tpos}, file at {tmf.wrote_position}")
        return umf, tmf, upos

    def append(self, rows: list[tuple[int, int, int, int]]) -> None:
        """Append units (phy, size, tags, indexed time) at max_offset: packed one at a time
        (the entry-by-entry path, and blanks), then written as append_packed writes them."""
        if not rows:
            return
        units = [UNIT.pack(phy, size, tags) for phy, size, tags, _ in rows]
        times = [encode_time(u, row[3]) for u, row in zip(units, rows, strict=True)]
        last_phy, last_size, _, last_time_ms = rows[-1]
        self.append_packed(b"".join(units), b"".join(times), last_phy, last_size, last_time_ms)

    def append_packed(
        self,
        units: bytes | memoryview,
        times: bytes | memoryview,
        last_phy: int,
        last_size: int,
        last_time_ms: int,
    ) -> None:
        """Append a run of packed units and their time entries (back to back; the last unit's
        phy and size and indexed time), a file at a time: _core.pack_runs packs a plain run,
        append() any other rows."""
        n = len(units) // UNIT_BYTES
        stamps = memoryview(times)
        unit_view = memoryview(units)
        st = self.state
        i = 0
        while i < n:
            umf, tmf, upos = self._write_at()
            count = min((umf.file_size - upos) // UNIT_BYTES, n - i)
            # Time entries land before the units that they describe become visible.
            tmf.append_bytes(stamps[i * TIME_BYTES : (i + count) * TIME_BYTES])
            umf.append_bytes(unit_view[i * UNIT_BYTES : (i + count) * UNIT_BYTES])
            i += count
            st.max_offset += count
        if n:
            if not _is_blank(last_phy, last_size):
                st.last_phy_end = last_phy + last_size
            st.last_time_ms = last_time_ms
            self.dirty = True

    def fill_blanks_to(self, offset: int) -> None:
        """Blank units from max_offset up to `offset` (fillPreBlank, or a gap in dispatch)."""
        st = self.state
        rows = [(0, BLANK_SIZE, 0, st.last_time_ms)] * (offset - st.max_offset)
        last_end, last_time = st.last_phy_end, st.last_time_ms
        self.append(rows)
        st.last_phy_end, st.last_time_ms = last_end, last_time

    def start_at(self, offset: int) -> None:
        """An empty queue whose first unit is `offset`: its first file is the one holding it,
        blank before it (initializeWithOffset); min = max = offset."""
        check(not self.units.files, "start_at on a queue with files")
        st = self.state
        file_start = offset - offset % self.units_per_file
        st.min_offset = st.max_offset = file_start
        self.fill_blanks_to(offset)
        st.min_offset = offset

    # -- truncation, min offset, deletion -------------------------------------------------------

    def _phy(self, offset: int) -> int:
        """The commit-log offset the unit at `offset` points at; -1 for a blank."""
        phy, size = self.phy_at(offset)
        return -1 if _is_blank(phy, size) else phy

    def first_at_or_above(self, lo: int, hi: int, phy_floor: int) -> int:
        """Smallest offset in [lo, hi) whose unit points at or above `phy_floor` (blanks count
        as below), or hi. Units are in commit-log order, so this is a binary search."""
        return bisect.bisect_left(range(hi), phy_floor, lo, hi, key=self._phy)

    def truncate_dirty(self, phy_offset: int) -> int:
        """truncateDirtyLogicFiles: drop every unit pointing at or beyond `phy_offset`.
        Returns the number of units dropped."""
        st = self.state
        if not self.units.files:
            return 0
        lo = self.units.min_offset() // UNIT_BYTES
        if st.max_offset <= lo:
            return 0
        if 0 <= self._phy(st.max_offset - 1) < phy_offset:
            return 0
        cut = self.first_at_or_above(lo, st.max_offset, phy_offset)
        dropped = st.max_offset - cut
        if dropped == 0:
            return 0
        self.units.truncate_dirty_files(cut * UNIT_BYTES)
        self.times.truncate_dirty_files(cut * TIME_BYTES)
        st.max_offset = cut
        st.min_offset = min(st.min_offset, cut)
        st.flushed_offset = min(st.flushed_offset, cut)
        if cut > lo:
            phy, size = self.phy_at(cut - 1)
            st.last_phy_end = -1 if _is_blank(phy, size) else phy + size
            st.last_time_ms = self.time_at(cut - 1)
        else:
            # The unit before the cut was in a deleted file: the running maximum restarts
            # (every unit before the cut is below min, so no lookup reaches back there).
            st.last_phy_end = -1
            st.last_time_ms = 0
        self.dirty = True
        return dropped

    def correct_min_offset(self, min_phy: int) -> None:
        """correctMinOffset (§3.8): the first unit pointing at or above `min_phy` becomes the
        queue's minimum; a queue whose newest unit points below it becomes empty at max."""
        st = self.state
        if st.min_offset >= st.max_offset:
            return
        if not self.has_offset(st.max_offset - 1):
            st.min_offset = st.max_offset  # its file was deleted: only an empty file is left
            return
        if self._phy(st.max_offset - 1) < min_phy:
            st.min_offset = st.max_offset
            return
        lo = max(st.min_offset, self.units.min_offset() // UNIT_BYTES)
        if lo == st.min_offset and self._phy(lo) >= min_phy:
            return
        st.min_offset = self.first_at_or_above(lo, st.max_offset, min_phy)

    def delete_expired(self, min_phy: int) -> int:
        """deleteExpiredFile: files (never the last) whose last unit points below `min_phy`
        go, with their time files; then correctMinOffset. Returns files deleted."""
        deleted = self.units.delete_expired_file_by_offset(min_phy, UNIT_BYTES)
        if deleted:
            first_unit = self.units.min_offset() // UNIT_BYTES
            doomed = [
                mf for mf in self.times.files if mf.file_end_offset <= first_unit * TIME_BYTES
            ]
            for mf in doomed:
                mf.destroy()
            self.times.files = [mf for mf in self.times.files if mf not in doomed]
            self._disk.fsync_dir(self.times.store_path)
        self.correct_min_offset(min_phy)
        return deleted

    def roll_next_file(self, offset: int) -> int:
        return offset + self.units_per_file - offset % self.units_per_file


def _first_unit_ok(mf: MappedFile, confirmed_offset: int) -> bool:
    phy, size, _ = UNIT.unpack_from(mf.buf, 0)
    return _is_blank(phy, size) or (phy >= 0 and size > 0 and phy < confirmed_offset)


def _set_end(mfq: MappedFileQueue, end: int, flushed: int) -> None:
    """Positions of freshly loaded (all "full") files for data ending at `end`, durable below
    `flushed`; files wholly after `end` hold nothing of this queue and are dropped."""
    keep = []
    for mf in mfq.files:
        if mf.file_end_offset <= end:
            keep.append(mf)
        elif mf.file_from_offset <= end:
            mf.set_positions(end - mf.file_from_offset)
            keep.append(mf)
        else:
            mf.destroy()
    for mf in keep:
        if mf.file_end_offset > flushed:
            mf.flushed_position = max(0, flushed - mf.file_from_offset)
    mfq.files = keep
    mfq.flushed_where = flushed
