"""The dispatch columns of the newest appends, kept by the appends themselves.

A subscriber that keeps up asks for the records the last appends wrote. Scanning them back out
of the segment (dispatch_scan.py: header checks, the body CRC, properties per record) was ~65%
of the commit log's time under load. But the append had every column of those entries in hand:
topic and queue ids from the request, positions, sizes, queue offsets and SYSFLAGs from the
encoder, one store time, and the three properties dispatch needs (TAGS -> tagsCode, KEYS,
UNIQ_KEY), which `dispatch_properties` finds before the put lock. So each append leaves a run
of those columns here, and a subscriber asking at an entry of a held run gets its frame from
the runs, never touching the segment.

What is held is exactly what the scan of the same bytes would produce (a test pins the two):
a run is only kept for an append that stored every message (a refusal is rare and leaves a gap,
which the subscriber crosses by scanning), and a run is only handed out up to the confirm
offset the caller passes (under sync flush, what is durable). A subscriber at an offset no run
starts an entry at (behind the window, at an end-of-file blank, in a gap) scans as before.

The records too, for the newest runs: each run keeps the bytes its append wrote (the encoder's
blob, no copy) until the runs holding records pass `records_bytes_max`, and a subscriber that
asks (include_records, cq_svc) gets them in its frame, so a consume queue serves a caught-up
consumer without a Read. They are the bytes as written: damage done to the segment afterwards
is seen by a Read or a scan, never by a frame.

Memory: the newest runs up to `bytes_max` (about FRAME_ENTRY_BYTES per entry plus its keys),
and the records of the newest up to `records_bytes_max`.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from mqstore.formats._core import property_columns
from mqstore.formats.record_batch import MessageBatch

APPEND_FRAMES_BYTES_MAX = 32 << 20
# The records held with the newest runs, for subscribers that ask for them (config's
# append_records_bytes).
APPEND_RECORDS_BYTES_MAX = 16 << 20
# What one entry's fixed columns take in memory and in a frame, about (8 numbers).
FRAME_ENTRY_BYTES = 40


@dataclass(slots=True)
class DispatchProperties:
    """TAGS codes, KEYS and UNIQ_KEY of each message of an append, in order."""

    tags_codes: list[int]
    keys: list[str]
    uniq_keys: list[str]


def dispatch_properties(batches: Sequence[MessageBatch]) -> DispatchProperties:
    """What dispatch needs from each message's properties (the compiled core's
    property_columns, which dispatch_columns reads records with)."""
    return DispatchProperties(
        *property_columns(
            itertools.chain.from_iterable(b.properties or [b""] * len(b.bodies) for b in batches)
        )
    )


@dataclass(slots=True)
class AppendedRun:
    """The dispatch entries of one append: records at `offsets`, back to back, ending at `end`.
    Entry i is (topics[topic_indexes[i]], queue_ids[i], ...), `topic_indexes` None when the
    append had one topic. `records`: the bytes the append wrote at offsets[0], until dropped
    (None) to bound memory; nothing else changes once held."""

    offsets: list[int]
    end: int
    topics: list[str]
    topic_indexes: list[int] | None
    queue_ids: list[int]
    queue_offsets: list[int]
    sizes: list[int]
    store_timestamp_ms: int
    sys_flags: list[int]
    props: DispatchProperties
    records: bytes | None = None

    @property
    def start(self) -> int:
        return self.offsets[0]

    def records_of(self, lo: int, hi: int) -> bytes | None:
        """The records of entries [lo, hi), or None once dropped."""
        records = self.records
        if records is None:
            return None
        start = self.offsets[0]
        end = self.offsets[hi] if hi < len(self.offsets) else self.end
        return records[self.offsets[lo] - start : end - start]

    def nbytes(self) -> int:
        """About what the run takes in memory: its entries and the characters of its keys
        (counted by joining them: one C pass, where a len() per key was 3 % of the commit
        log's Python time)."""
        keys = len("".join(self.props.keys)) + len("".join(self.props.uniq_keys))
        return len(self.offsets) * FRAME_ENTRY_BYTES + keys


@dataclass(slots=True)
class RunSlice:
    """Entries [lo, hi) of a run."""

    run: AppendedRun
    lo: int
    hi: int


class AppendFrames:
    def __init__(
        self,
        bytes_max: int = APPEND_FRAMES_BYTES_MAX,
        records_bytes_max: int = APPEND_RECORDS_BYTES_MAX,
    ) -> None:
        self._lock = threading.Lock()
        self._runs: list[AppendedRun] = []
        self._starts: list[int] = []
        self._sizes: list[int] = []  # each run's nbytes(), counted once when it is added
        self._bytes_max = bytes_max
        self._bytes = 0
        self._records_bytes_max = records_bytes_max
        self._with_records: deque[AppendedRun] = deque()  # oldest first
        self._records_bytes = 0

    @property
    def enabled(self) -> bool:
        return self._bytes_max > 0

    def add(self, run: AppendedRun) -> None:
        """Hold an append's run (called under the put lock, so in offset order)."""
        size = run.nbytes()
        with self._lock:
            if self._runs and run.start < self._runs[-1].end:
                self._clear()  # the log went back (cannot happen while appends only grow)
            self._runs.append(run)
            self._starts.append(run.start)
            self._sizes.append(size)
            self._bytes += size
            if self._bytes > self._bytes_max:
                self._evict()
            if run.records is not None:
                if len(run.records) > self._records_bytes_max:
                    run.records = None
                else:
                    self._with_records.append(run)
                    self._records_bytes += len(run.records)
                    self._drop_records()

    def _drop_records(self) -> None:
        """Forget the records of the oldest runs down to the records bound."""
        held = self._with_records
        while held and (self._records_bytes > self._records_bytes_max or held[0].records is None):
            old = held.popleft()
            if old.records is not None:
                self._records_bytes -= len(old.records)
                old.records = None

    def clear(self) -> None:
        with self._lock:
            self._clear()

    def _clear(self) -> None:
        self._runs.clear()
        self._starts.clear()
        self._sizes.clear()
        self._bytes = 0
        for run in self._with_records:
            run.records = None
        self._with_records.clear()
        self._records_bytes = 0

    def _evict(self) -> None:
        """Drop the oldest runs down to three quarters of the bound, in one list operation."""
        goal = self._bytes_max * 3 // 4
        drop = 0
        while drop < len(self._runs) - 1 and self._bytes > goal:
            self._bytes -= self._sizes[drop]
            drop += 1
        for run in self._runs[:drop]:
            if run.records is not None:
                self._records_bytes -= len(run.records)
                run.records = None
        del self._runs[:drop]
        del self._starts[:drop]
        del self._sizes[:drop]

    def take(
        self, offset: int, visible_end: int, entries_max: int, bytes_max: int
    ) -> list[RunSlice] | None:
        """The held entries from `offset` (an entry's start) on, as the scan of the same range
        would bound them: entries whose records end at or below `visible_end`, at most
        `entries_max`, and each starting less than `bytes_max` past `offset`; following runs
        are taken while they continue the previous one. [] when the entry at `offset` is held
        but not visible yet; None when no held run has an entry starting at `offset`."""
        with self._lock:
            i = bisect.bisect_right(self._starts, offset) - 1
            if i < 0:
                return None
            run = self._runs[i]
            if offset >= run.end:
                return None
            lo = bisect.bisect_left(run.offsets, offset)
            if lo == len(run.offsets) or run.offsets[lo] != offset:
                return None  # inside the run's last record, not at an entry's start
            taken: list[RunSlice] = []
            room = entries_max
            bytes_end = offset + bytes_max
            for run in itertools.islice(self._runs, i, None):
                if taken and run.start != taken[-1].run.end:
                    break  # a gap (an end-of-file blank, an append not held): scan from there
                hi = min(
                    _visible(run, lo, visible_end),
                    lo + room,
                    bisect.bisect_left(run.offsets, bytes_end, lo),
                )
                if hi <= lo:
                    break
                taken.append(RunSlice(run, lo, hi))
                room -= hi - lo
                if hi < len(run.offsets):
                    break
                lo = 0
            return taken


def _visible(run: AppendedRun, lo: int, visible_end: int) -> int:
    """The end index of the entries from `lo` whose records end at or below `visible_end`."""
    if run.end <= visible_end:
        return len(run.offsets)
    hi = bisect.bisect_left(run.offsets, visible_end, lo)
    if hi > lo and run.offsets[hi - 1] + run.sizes[hi - 1] > visible_end:
        hi -= 1
    return hi
