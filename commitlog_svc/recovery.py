"""Commit-log recovery: where the data ends, what to cut, what to report.

Where the scan starts. RocketMQ picks the abnormal-recovery start file by comparing store
timestamps with checkpoint timestamps, so a clock jump can make it skip or rescan data. mqstore
uses the checkpoint's `flushed_offset` F instead (every byte below F was durable when the
checkpoint was written): the scan starts at the beginning of the file holding F - 1, after a
clean exit and after a crash alike, and checks every record from there with its CRC: the
whole-record CRC, which covers every field, or for a record written without it the body CRC
(record.py). Without a checkpoint it starts at the first file.

What the scan finds at offset X, and what recovery does (a test walks every row):

    found                                     decision
    a valid record                            keep it, go on
    the end-of-file blank                     the file is full; go on at the next file
    a bad record at X >= F                    torn tail: the data ends at X; cut everything after
    a bad record at X < F, a valid record     corruption in the middle: report [X, Y) with its
      found later at Y (same file, or the     offset, keep going at Y, cut nothing
      first record of a later file)
    a bad record at X < F, nothing valid      the durable tail is damaged: the data ends at X
      after it                                (RocketMQ's testRecover rolls back the same way);
                                              logged as loss of durable bytes

"A bad record" is any record read_record refuses: a torn or zeroed tail, a changed byte in any
field of a record with the whole-record CRC (tests/commitlog/test_commitlog_corruption.py walks
each field), a stale copy at the wrong place.

"Cut" means: later files are deleted and the rest of the file holding X is zeroed, so stale bytes
can never be read as records again. Above F a bad record is taken as a write the crash tore, and
whatever follows it was written later still, so it goes too. Below F, bytes were durable: a bad
record there is corruption, never a reason to throw away the records after it (CORDS, FAST'17).

The queue-offset table is the checkpoint's snapshot (exact at F) with every record at or after F
applied on top; without a checkpoint it is rebuilt from every record scanned.

The walk is record_columns.scan_run_fast: record.scan_run's verdicts (pinned by tests), one
compiled loop (formats/_core.pyx). A thread reads the segments ahead of it
(_ReadAhead), so that a cold start reads the disk while the walk checks what is already in.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import time
from dataclasses import dataclass, field

from mqstore.formats import sysflag
from mqstore.formats.commitlog_checkpoint import Checkpoint
from mqstore.formats.record import Bad, Blank, Record, find_next_record, read_record
from mqstore.formats.record_batch import QueueTable, table_from_pairs
from mqstore.formats.record_columns import scan_run_fast
from mqstore.storage.mapped_file import MappedFile
from mqstore.storage.mapped_file_queue import MappedFileQueue

log = logging.getLogger(__name__)

# The read-ahead thread queues this much at a time (a few ms of disk reads).
READ_AHEAD_STEP_BYTES = 16 << 20


@dataclass(frozen=True, slots=True)
class CorruptRange:
    start_offset: int
    end_offset: int  # the next valid record (or the next file) starts here
    reason: str


@dataclass(slots=True)
class RecoveryReport:
    clean_exit: bool
    start_offset: int = 0
    end_offset: int = 0
    durable_offset: int = 0  # F: the checkpoint's flushed offset (0 without one)
    records_scanned: int = 0
    truncated_bytes: int = 0  # dirty tail cut (an estimate when it ran into zeroed space)
    durable_bytes_lost: int = 0  # of which below F: corruption, not a torn write
    corrupt: list[CorruptRange] = field(default_factory=list)
    checkpoint_found: bool = False
    duration_ms: float = 0.0
    # The newest segment was shorter than the segment size (a file system that lost its tail,
    # a partial copy): its path and size as found; it was extended with zeros before the scan,
    # which then met them as a torn tail.
    short_segment: str = ""
    short_segment_bytes: int = 0


@dataclass(slots=True)
class RecoveryResult:
    report: RecoveryReport
    queue_offsets: QueueTable


def _apply(table: QueueTable, record: Record) -> None:
    if not sysflag.gets_queue_offset(record.sys_flag):
        return
    queues = table.setdefault(record.topic, {})
    nxt = record.queue_offset + 1
    if queues.get(record.queue_id, 0) < nxt:
        queues[record.queue_id] = nxt


def _data_end_hint(mf: MappedFile, pos: int) -> int:
    """How far non-zero bytes may reach after `pos` (for the truncated-bytes figure)."""
    buf = mf.buf
    end = mf.file_size
    step = 4096
    last = pos
    zero = bytes(step)
    probe = pos
    while probe < end:
        chunk_end = min(end, probe + step)
        if buf[probe:chunk_end] != zero[: chunk_end - probe]:
            last = chunk_end
        elif probe > last + 16 * step:
            break  # a long run of zero pages: the written region is behind us
        probe = chunk_end
    return last


def recover(
    queue: MappedFileQueue, checkpoint: Checkpoint | None, *, clean_exit: bool
) -> RecoveryResult:
    """Scan, decide, cut. Leaves `queue` positioned at the end of the last valid record."""
    started = time.monotonic()
    report = RecoveryReport(clean_exit=clean_exit)
    files = queue.files
    if checkpoint is not None:
        report.checkpoint_found = True
        durable = checkpoint.flushed_offset
        table: QueueTable = table_from_pairs(checkpoint.queue_offsets)
        apply_from = durable
    else:
        # No checkpoint (the store always writes one when created, so it was lost or corrupt):
        # nothing says where durable data ends, so treat all of it as durable and never cut
        # valid records because an earlier one is bad.
        durable = files[-1].file_end_offset if files else 0
        table = {}
        apply_from = 0
        if files:
            log.warning("no valid checkpoint: checking the whole log from its first file")
    report.durable_offset = durable
    if not files:
        report.duration_ms = (time.monotonic() - started) * 1000
        return RecoveryResult(report, table)

    if checkpoint is None:
        start_at = files[0].file_from_offset
    else:
        start_at = max(durable - 1, files[0].file_from_offset)
    start_index = 0
    for i, mf in enumerate(files):
        if mf.file_from_offset <= start_at:
            start_index = i
    if apply_from < files[start_index].file_from_offset:
        # The checkpoint's table is older than the files we scan (files were lost or deleted
        # under it): records in between cannot be applied, so rebuild from what is there.
        log.warning(
            "checkpoint offset %d is below the scan start %d; rebuilding queue offsets",
            apply_from,
            files[start_index].file_from_offset,
        )
        table = {}
    report.start_offset = files[start_index].file_from_offset

    end = report.start_offset
    index = start_index
    cut_at = -1
    cut_durable = False
    # Not in a try: if the walk raises (a bug), the process goes down with its hint thread.
    read_ahead = _ReadAhead(files[start_index:])
    while index < len(files):
        mf = files[index]
        base = mf.file_from_offset
        buf = mf.buf
        size = mf.file_size
        pos = 0
        next_file = False
        read_ahead.walking(index - start_index)
        while pos < size:
            pos, walked, result = scan_run_fast(
                buf,
                pos,
                size,
                base,
                check_crc=True,
                queue_table=table,
                apply_from=apply_from,
            )
            report.records_scanned += walked
            end = base + pos
            offset = end
            if result is None:
                break
            assert not isinstance(result, Record)
            if isinstance(result, Blank):
                if result.total_size == size - pos:
                    end = mf.file_end_offset
                    next_file = True
                    break
                # The writer's blank always spans the rest of the file; this one does not.
                result = Bad(f"blank of {result.total_size} bytes, {size - pos} left in the file")
            if offset >= durable:
                cut_at = offset
                break
            resume = _resync(files, index, pos)
            if resume is None and checkpoint is None:
                cut_at = offset  # nothing valid after it and nothing vouched for: the end
                break
            if resume is None:
                log.error(
                    "durable bytes damaged at the end of the log: offset %d (%s); the log "
                    "now ends there",
                    offset,
                    result.reason,
                )
                cut_at = offset
                cut_durable = True
                break
            resume_index, resume_pos = resume
            resume_offset = files[resume_index].file_from_offset + resume_pos
            log.error(
                "corrupt record in the middle of the log: [%d, %d) %s; later records kept",
                offset,
                resume_offset,
                result.reason,
            )
            report.corrupt.append(CorruptRange(offset, resume_offset, result.reason))
            if result.record is not None and offset >= apply_from:
                # Its fields minus the body are still telling: never reuse its queue offset.
                _apply(table, result.record)
            if resume_index != index:
                index = resume_index - 1
                next_file = True
                end = files[resume_index].file_from_offset
                break
            pos = resume_pos
            end = base + pos
        if cut_at >= 0:
            break
        if not next_file and pos >= size:
            end = mf.file_end_offset
        index += 1
    read_ahead.stop()

    if cut_at >= 0:
        end = cut_at
        holder = queue.find_mapped_file_by_offset(cut_at)
        if holder is not None:
            tail = (
                _data_end_hint(holder, cut_at - holder.file_from_offset) + holder.file_from_offset
            )
            report.truncated_bytes = max(0, tail - cut_at)
        later = [f for f in files if f.file_from_offset > cut_at]
        report.truncated_bytes += sum(f.file_size for f in later if _has_data(f))
        if cut_durable:
            # With a checkpoint every byte of [X, F) was vouched for, whatever is there now;
            # without one, count what is visibly there.
            reach = durable if checkpoint is not None else cut_at + report.truncated_bytes
            report.durable_bytes_lost = max(0, reach - cut_at)
        if cut_at < apply_from:
            # The table counts records the cut removed; those queue offsets must be given out
            # again, or the queue gets a hole and a consume queue entry points at a stranger.
            table = _rebuild_table(files, cut_at, table)
    queue.truncate_dirty_files(end)
    report.end_offset = end
    report.duration_ms = (time.monotonic() - started) * 1000
    return RecoveryResult(report, table)


def _rebuild_table(files: list[MappedFile], end: int, snapshot: QueueTable) -> QueueTable:
    """The queue-offset table of the log as it ends at `end`, rebuilt by walking every record
    below it. Queues with no record left on disk (all expired) keep the snapshot's offset: none
    of their records can have been cut, so it is still exact."""
    table: QueueTable = {}
    for mf in files:
        if mf.file_from_offset >= end:
            break
        limit = min(mf.file_size, end - mf.file_from_offset)
        pos = 0
        while pos < limit:
            pos, _, stop = scan_run_fast(
                mf.buf, pos, limit, mf.file_from_offset, check_crc=False, queue_table=table
            )
            if stop is None or isinstance(stop, Blank):
                break
            found = find_next_record(mf.buf, pos, limit, mf.file_from_offset)
            if isinstance(stop, Bad) and stop.record is not None:
                _apply(table, stop.record)
            if found < 0:
                break
            pos = found
    for topic, queues in snapshot.items():
        seen = table.setdefault(topic, {})
        for queue_id, next_offset in queues.items():
            seen.setdefault(queue_id, next_offset)
    return table


class _ReadAhead:
    """Has the kernel read the segments the walk checks, ahead of it, from a thread (started
    on construction).

    After a cold start the walk would otherwise wait on each page fault of the map (measured:
    ~1.8 s of a 1 GiB walk, against ~0.6 s for a plain sequential read). posix_fadvise
    (WILLNEED) queues the reads and releases the GIL. It stays within the segment being walked
    and the next (`walking`), so a long log does not push the walk's own pages out of the cache,
    and goes READ_AHEAD_STEP_BYTES at a time so that `stop` (the walk is over, perhaps at a
    torn tail) ends it soon. A hint only: the walk reads the same bytes whether or not it ran."""

    def __init__(self, files: list[MappedFile]) -> None:
        # Real files only: a simulated disk's segment is a bytearray, already in memory.
        self._paths = [
            (mf.path, mf.file_size) if isinstance(mf.buf, mmap.mmap) else None for mf in files
        ]
        self._walking = 0
        self._stopped = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="recovery-read-ahead", daemon=True)
        if any(self._paths):
            self._thread.start()

    def walking(self, index: int) -> None:
        """The walk is at files[index] (of the list given)."""
        with self._cond:
            self._walking = index
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        for index, entry in enumerate(self._paths):
            with self._cond:
                while not self._stopped and index > self._walking + 1:
                    self._cond.wait()
                if self._stopped:
                    return
            if entry is None:
                continue
            path, size = entry
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                for start in range(0, size, READ_AHEAD_STEP_BYTES):
                    if self._stopped:
                        return
                    os.posix_fadvise(fd, start, READ_AHEAD_STEP_BYTES, os.POSIX_FADV_WILLNEED)
            except OSError:
                pass  # a hint only
            finally:
                os.close(fd)


def _has_data(mf: MappedFile) -> bool:
    return bool(mf.buf[0:8] != bytes(8))


def _resync(files: list[MappedFile], index: int, pos: int) -> tuple[int, int] | None:
    """Where the next valid record after a bad one at files[index]:pos starts, if anywhere."""
    mf = files[index]
    found = find_next_record(mf.buf, pos, mf.file_size, mf.file_from_offset)
    if found >= 0:
        return index, found
    for later in range(index + 1, len(files)):
        nxt = files[later]
        first = read_record(
            nxt.buf, 0, nxt.file_size, check_crc=True, expected_offset=nxt.file_from_offset
        )
        if isinstance(first, Record):
            return later, 0
        found = find_next_record(nxt.buf, 0, nxt.file_size, nxt.file_from_offset)
        if found >= 0:
            return later, found
    return None
