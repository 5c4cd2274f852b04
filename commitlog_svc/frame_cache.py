"""Dispatch frames scanned once and sent to every subscriber that asks for the same range.

Each subscriber stream scans the log from its own position (dispatch_scan.py). Subscribers
that keep up (a cq_svc and an index_svc tailing the log) ask for the same ranges, one after
the other: with two of them, the profile of the commit log under load showed ~72% of its
Python time in those scans, each range scanned twice. A frame here is keyed by

    (start offset, entries bound, bytes bound)

and scanned with keys; a subscriber that does not want keys (consume queues) gets a copy
without them, made once. Frames describe bytes that never change while the process lives
(records are only appended; retention removes whole segments from the front, and callers
check the minimum before asking), so a cached frame is as good as a new scan of the same
range. A frame scanned when less was written ends earlier than a later scan would; the
subscriber that takes it simply asks again from its end, where the other one asks too, so
the two stay in step. Only the newest frames are kept, FRAME_CACHE_BYTES_MAX of them: enough
for a subscriber to lag the other by a burst (an index applies slower than consume queues)
and still find its frames.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from commitlog_svc import metrics
from commitlog_svc.dispatch_scan import DispatchScan
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb

FRAME_CACHE_BYTES_MAX = 32 << 20
# How long a subscriber waits for another's scan of the same range before scanning itself.
SCAN_WAIT_S = 5.0

_Key = tuple[int, int, int]


@dataclass(slots=True)
class _Frames:
    with_keys: pb.SubscribeResponse
    without_keys: pb.SubscribeResponse | None
    next_offset: int
    nbytes: int


class FrameCache:
    def __init__(self, bytes_max: int = FRAME_CACHE_BYTES_MAX) -> None:
        self._frames: OrderedDict[_Key, _Frames] = OrderedDict()
        self._lock = threading.Lock()
        self._bytes_max = bytes_max
        self._bytes = 0
        self._scanning: dict[_Key, threading.Event] = {}
        self.hits = 0
        self.scans = 0

    def frame(
        self,
        start_offset: int,
        entries_max: int,
        bytes_max: int,
        include_keys: bool,
        scan: Callable[[bool], DispatchScan],
    ) -> tuple[pb.SubscribeResponse | None, int]:
        """(the response to send, its next offset); (None, start_offset) when nothing new is
        readable yet. `scan(include_keys)` runs (with keys) only when no subscriber asked for
        this range; one asking while another scans it waits for that scan (subscribers woken
        by the same append ask at the same moment)."""
        if self._bytes_max == 0:  # sharing off: scan as this subscriber wants it
            found = scan(include_keys)
            if found.next_offset <= start_offset:
                return None, start_offset
            metrics.DISPATCH_FRAMES.labels("scan").inc()
            return found.response, found.next_offset
        key = (start_offset, entries_max, bytes_max)
        while True:
            with self._lock:
                cached = self._frames.get(key)
                if cached is not None:
                    self.hits += 1
                    metrics.DISPATCH_FRAMES.labels("shared").inc()
                    return self._pick(cached, include_keys), cached.next_offset
                scanning = self._scanning.get(key)
                if scanning is None:
                    scanning = self._scanning[key] = threading.Event()
                    break
            if not scanning.wait(SCAN_WAIT_S):
                break  # the scanner is stuck or gone: scan for ourselves
        try:
            found = scan(True)
        finally:
            with self._lock:
                if self._scanning.get(key) is scanning:
                    del self._scanning[key]
            scanning.set()
        if found.next_offset <= start_offset:
            return None, start_offset
        metrics.DISPATCH_FRAMES.labels("scan").inc()
        frames = _Frames(found.response, None, found.next_offset, found.nbytes)
        with self._lock:
            self.scans += 1
            old = self._frames.pop(key, None)
            if old is not None:  # scanned by a subscriber that gave up waiting
                self._bytes -= old.nbytes
            self._frames[key] = frames
            self._bytes += frames.nbytes
            while self._bytes > self._bytes_max and len(self._frames) > 1:
                _, gone = self._frames.popitem(last=False)
                self._bytes -= gone.nbytes
            return self._pick(frames, include_keys), frames.next_offset

    @staticmethod
    def _pick(frames: _Frames, include_keys: bool) -> pb.SubscribeResponse:
        """Under the lock: the frame as this subscriber wants it."""
        if include_keys:
            return frames.with_keys
        if frames.without_keys is None:
            stripped = pb.SubscribeResponse()
            stripped.CopyFrom(frames.with_keys)
            stripped.batch.ClearField("keys")
            stripped.batch.ClearField("uniq_keys")
            frames.without_keys = stripped
        return frames.without_keys
