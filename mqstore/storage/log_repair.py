"""Repair of a commit log whose older segment lost its tail: the log is made to end in it.

    DATA_DIR/commitlog/      S0  S1  S2(short)  S3  S4          before: commitlog_svc refuses
    DATA_DIR/commitlog/      S0  S1  S2(short)                  after: the log ends in S2
    DATA_DIR/commitlog-aside-<UTC time>/   S2 (a copy)  S3  S4  kept for the operator, never read

A segment shorter than the segment size (a file system that lost its tail, a partial copy) is
a torn tail when it is the newest: commitlog_svc extends it with zeros at start-up and recovery
cuts the log after its last whole record. An older one is lost data between records that are
not, which no restart can mend, so commitlog_svc refuses to start and names it
(mapped_file_queue.ShortSegmentError). This module makes the first such segment the newest:
every later segment moves aside, and the next start treats the damaged segment as a torn tail.
Everything after its last whole record is then lost to the store; `plan` says how much before
anything is moved.

What commitlog_svc does with it at the next start (recovery.py): the checkpoint vouched for
bytes that are gone, so the cut is logged as loss of durable bytes (the recovery report's
`durable_bytes_lost`), the queue-offset table is rebuilt from the records left, and the
followers (cq_svc, index_svc) truncate what they hold past the new end at their handshake.

Only with the store's lock (the file commitlog_svc holds while it runs): never beside a
running commitlog_svc. Used by `mqstore log repair` (mqstore/cli/log_repair.py).
"""

from __future__ import annotations

import datetime as dt
import itertools
import mmap
import os
import shutil
from dataclasses import dataclass, field
from typing import Final

from mqstore.errors import InvalidArgument
from mqstore.formats.record import Blank
from mqstore.formats.record_columns import scan_run_fast
from mqstore.storage.disk import FileLock, OsDisk
from mqstore.storage.logreader import COMMITLOG_SUBDIR, STORE_LOCK_FILE, is_segment_name

# Where the segments that no longer belong to the log go: beside the commit-log directory,
# named by the time of the repair, so that repeated repairs never mix their files.
ASIDE_PREFIX: Final = "commitlog-aside-"
_ASIDE_TIME_FORMAT: Final = "%Y%m%dT%H%M%SZ"


class RepairError(InvalidArgument):
    """The directory is not a commit log this repair can work on (missing, no segments, a
    segment longer than the others)."""


def repair_hint(data_dir: str) -> str:
    """What to tell an operator whose store refused to start on a short older segment."""
    return (
        f"To make the log end in it (everything after its last whole record is lost): stop "
        f"nothing else, run `mqstore log repair {data_dir}` to see what would move aside and "
        "what is lost, then again with --yes to do it, and start commitlog_svc"
    )


@dataclass(frozen=True, slots=True)
class SegmentFile:
    name: str
    path: str
    start_offset: int
    size: int


@dataclass(slots=True)
class RepairPlan:
    """What `repair` would do: `damaged` is the first short segment that is not the newest
    (None: nothing to repair); `moved` the segments after it."""

    data_dir: str
    commitlog_dir: str
    file_bytes: int
    damaged: SegmentFile | None = None
    moved: list[SegmentFile] = field(default_factory=list)
    # Where the log will end: after the damaged segment's last whole record (recovery decides
    # the exact point; this is what a walk of its records finds now).
    end_offset: int = 0
    # The log's end now (the end of the newest segment's records) and the records past the
    # new end, in the moved segments.
    old_end_offset: int = 0
    records_lost: int = 0

    @property
    def needed(self) -> bool:
        return self.damaged is not None

    def describe(self) -> list[str]:
        if self.damaged is None:
            return [
                f"nothing to repair in {self.commitlog_dir}: no segment but the newest is "
                "short (commitlog_svc mends a short newest segment itself)"
            ]
        d = self.damaged
        lines = [
            f"{d.path} is {d.size} bytes, shorter than the {self.file_bytes} of the others, and "
            "is not the newest segment: the bytes past its end are lost.",
            f"The log will end at offset {self.end_offset}, after the last whole record of "
            f"{d.name}; it ends at {self.old_end_offset} now.",
            f"Lost to the store: offsets [{self.end_offset}, {self.old_end_offset}), "
            f"{self.records_lost} whole records in the {len(self.moved)} later segment(s)"
            + (": " + ", ".join(f.name for f in self.moved) if self.moved else "")
            + ", and whatever the lost bytes of the damaged one held.",
            f"A copy of {d.name} and the later segments go to {aside_dir_example(self)} (kept, "
            "never read by the store); consumers will not see the lost messages, and cq_svc and "
            "index_svc drop what they hold past the new end when they reconnect.",
        ]
        return lines


def aside_dir_example(plan: RepairPlan) -> str:
    return os.path.join(plan.data_dir, ASIDE_PREFIX + "<UTC time>")


def resolve_dirs(directory: str) -> tuple[str, str]:
    """(data dir, commit-log dir) of DIR, which names either: a store's data dir (with a
    commitlog/ subdirectory) or its commitlog/ directory itself."""
    directory = os.path.abspath(directory)
    if not os.path.isdir(directory):
        raise RepairError(f"{directory} is not a directory")
    sub = os.path.join(directory, COMMITLOG_SUBDIR)
    if os.path.isdir(sub):
        return directory, sub
    if any(is_segment_name(n) for n in os.listdir(directory)):
        return os.path.dirname(directory), directory
    raise RepairError(
        f"{directory} holds neither segment files nor a {COMMITLOG_SUBDIR}/ directory: "
        "give commitlog_svc's data dir"
    )


def segment_files(commitlog_dir: str) -> list[SegmentFile]:
    out = []
    for name in sorted(os.listdir(commitlog_dir)):
        path = os.path.join(commitlog_dir, name)
        if is_segment_name(name) and os.path.isfile(path):
            out.append(SegmentFile(name, path, int(name), os.path.getsize(path)))
    return out


def _records_end(path: str, start_offset: int, size: int, file_bytes: int) -> tuple[int, int]:
    """(records, end position) of the whole records at the start of a segment, walked as
    recovery walks them (each record's offset checked; CRCs not: a count for the plan). The
    end-of-file blank counts as reaching the file's end."""
    if size == 0:
        return 0, 0
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        pos, records, stop = scan_run_fast(buf, 0, size, start_offset, check_crc=False)
    if isinstance(stop, Blank) and stop.total_size == file_bytes - pos:
        pos = file_bytes
    return records, pos


def plan(directory: str) -> RepairPlan:
    """What `repair` would do to the commit log in DIR (nothing is changed)."""
    data_dir, commitlog_dir = resolve_dirs(directory)
    segments = segment_files(commitlog_dir)
    if not segments:
        raise RepairError(f"no segment files in {commitlog_dir}")
    # The segment size, from the names (start offsets), not the sizes: a short segment must
    # not pass for the norm, nor a longer one (a changed configuration) make the rest short.
    spacings = [b.start_offset - a.start_offset for a, b in itertools.pairwise(segments)]
    file_bytes = min(spacings, default=max(s.size for s in segments))
    if file_bytes <= 0:
        raise RepairError(f"the segments of {commitlog_dir} are empty")
    longer = [s.name for s in segments if s.size > file_bytes]
    if longer:
        raise RepairError(
            f"segments {', '.join(longer[:4])} are longer than the {file_bytes} bytes between "
            "segment names (a changed file size configuration?): not a short segment to repair"
        )
    out = RepairPlan(data_dir, commitlog_dir, file_bytes)
    newest = segments[-1]
    _, newest_end = _records_end(newest.path, newest.start_offset, newest.size, file_bytes)
    out.old_end_offset = newest.start_offset + min(newest_end, file_bytes)
    # The newest segment (or, when it is empty, the one before it) is a torn tail that
    # commitlog_svc mends itself; only an older short one needs this repair.
    last_data = len(segments) - 1
    if newest.size == 0 and last_data > 0:
        last_data -= 1
    for i, seg in enumerate(segments[:last_data]):
        if seg.size < file_bytes:
            out.damaged = seg
            out.moved = segments[i + 1 :]
            _, end = _records_end(seg.path, seg.start_offset, seg.size, file_bytes)
            out.end_offset = seg.start_offset + min(end, seg.size)
            break
    if out.damaged is None:
        out.end_offset = out.old_end_offset
        return out
    for seg in out.moved:
        records, _ = _records_end(seg.path, seg.start_offset, seg.size, file_bytes)
        out.records_lost += records
    return out


def lock_store(data_dir: str) -> FileLock:
    """The store's lock, as commitlog_svc takes it: StoreLocked while it runs."""
    return OsDisk().lock(os.path.join(data_dir, STORE_LOCK_FILE))


def repair(directory: str, *, now: dt.datetime | None = None) -> tuple[RepairPlan, str]:
    """Carry out `plan(directory)` under the store's lock; returns the plan and the directory
    the segments went to ("" when nothing needed repair). A copy of the damaged segment goes
    aside too; it stays in place, short, for commitlog_svc's next start to mend as a torn
    tail."""
    data_dir, _ = resolve_dirs(directory)
    disk = OsDisk()
    lock = lock_store(data_dir)
    try:
        p = plan(directory)
        if p.damaged is None:
            return p, ""
        stamp = (now or dt.datetime.now(dt.UTC)).strftime(_ASIDE_TIME_FORMAT)
        aside = os.path.join(data_dir, ASIDE_PREFIX + stamp)
        os.makedirs(aside)
        shutil.copyfile(p.damaged.path, os.path.join(aside, p.damaged.name))
        copy = os.open(os.path.join(aside, p.damaged.name), os.O_RDONLY)
        try:
            os.fsync(copy)
        finally:
            os.close(copy)
        disk.fsync_dir(aside)
        disk.fsync_dir(data_dir)
        # Newest first: a crash half-way leaves a log whose newest segments are gone, which
        # this repair (run again) finishes; never a hole with later segments still in place.
        for seg in reversed(p.moved):
            os.rename(seg.path, os.path.join(aside, seg.name))
            disk.fsync_dir(p.commitlog_dir)
        disk.fsync_dir(aside)
        return p, aside
    finally:
        lock.release()
