"""Keeps the pages just ahead of an append position faulted in.

The first write to a page of a freshly preallocated file costs a page fault, and writes through
the map run several times slower over such pages than over pages faulted in ahead (figures in
docs/bench.md). RocketMQ warms whole files when they are created
(warmMapedFileEnable); this warms a window instead: a thread keeps [write position, + ahead) of
the newest file populated, a few MiB at a time, with madvise(MADV_POPULATE_WRITE), which changes
no byte and runs without the GIL. On a platform without it, the thread stops at once.
"""

from __future__ import annotations

import logging
import threading

from mqstore.storage.mapped_file_queue import MappedFileQueue

log = logging.getLogger(__name__)

# One madvise call at a time: small enough that the appender never waits long behind it on the
# file's page-table lock, large enough that the syscall cost is nothing.
WARM_CHUNK_BYTES = 4 << 20
# How often the thread looks at the write position when it is far enough ahead.
WARM_POLL_S = 0.005


class SegmentWarmer:
    def __init__(self, queue: MappedFileQueue, ahead_bytes: int) -> None:
        self._queue = queue
        self._ahead = ahead_bytes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._file_offset = -1
        self._warmed_to = 0
        self.warmed_bytes = 0

    def start(self) -> None:
        if self._ahead <= 0:
            return
        self._thread = threading.Thread(target=self._run, name="segment-warmer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._step():
                self._stop.wait(WARM_POLL_S)

    def _step(self) -> bool:
        """Warm one chunk if the newest file needs it; False when there is nothing to do."""
        mf = self._queue.last_file()
        if mf is None:
            return False
        if mf.file_from_offset != self._file_offset:
            self._file_offset = mf.file_from_offset
            self._warmed_to = 0
        start = max(self._warmed_to, mf.wrote_position)
        target = min(mf.file_size, mf.wrote_position + self._ahead)
        if start >= target:
            return False
        end = min(target, start + WARM_CHUNK_BYTES)
        if not mf.populate(start, end):
            if mf.available:
                log.info("page warming is not available here; appends fault pages in")
                self._stop.set()
            return False
        self._warmed_to = end
        self.warmed_bytes += end - start
        return True
