"""The newest records of the commit log, as the dispatch frames brought them, so that a pull of
a queue's tail is answered without a commit-log Read.

cq_svc subscribes with include_records: a frame built from the appends the commit log still
holds in memory carries their records (DispatchBatch.records, the bytes the append wrote). A
caught-up consumer asks for exactly those, a few milliseconds later, and is answered from here
without a commit-log Read: no round trip in its wait, no call's CPU on either service.

Held, oldest first, one chunk per frame that carried records:

    chunk   offsets  int64[n]    each entry's commit-log offset, ascending (the frame's order)
            sizes    int64[n]    each record's size
            starts   int64[n+1]  each record's position in `blob`, then the blob's length
            blob     bytes       the records back to back

A small frame (a caught-up log sends one per append, often of a few records) is merged into
the newest chunk while that is under CHUNK_BYTES_MIN: the chunks stay few (at most about
bytes_max / CHUNK_BYTES_MIN), so holding and publishing them stays cheap at any frame rate.

A lookup of ranges (offset, size) is all or nothing: each range must be an entry of a held
chunk, of that very size, at or above the log's minimum; the answer is the records back to back
in the order asked (consecutive entries of a chunk are one slice). Anything else is a miss and
the caller reads the commit log as before.

What is held is what was written: damage done to a segment after the append is found by a
Read, never here. Dropped whole at every handshake (the log may have lost its tail or been
replaced) and below the log's minimum once segments expire (HeadProbe). Memory: the newest
chunks up to `bytes_max`.

Threads: the subscriber's thread adds and clears, the HeadProbe's drops below a minimum (under
one lock); pull threads look up in a snapshot (one tuple swapped at once), without a lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

TAIL_RECORDS_MIB_DEFAULT: Final = 32
# A frame is merged into the newest chunk while that holds less than this.
CHUNK_BYTES_MIN: Final = 64 << 10

Offsets = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class _Chunk:
    offsets: Offsets
    sizes: Offsets
    starts: Offsets
    blob: bytes

    @property
    def end(self) -> int:
        """The commit-log offset just past the chunk's last record."""
        return int(self.offsets[-1] + self.sizes[-1])


@dataclass(frozen=True, slots=True)
class _Held:
    chunks: tuple[_Chunk, ...]
    firsts: Offsets  # each chunk's first offset, for searchsorted
    min_offset: int  # nothing below is served (the log's minimum)
    nbytes: int


_EMPTY: Final = _Held((), np.zeros(0, dtype=np.int64), 0, 0)


class TailRecords:
    def __init__(self, bytes_max: int, chunk_bytes_min: int = CHUNK_BYTES_MIN) -> None:
        self.bytes_max = bytes_max
        self.chunk_bytes_min = chunk_bytes_min
        self._held = _EMPTY
        self._lock = threading.Lock()  # writers only
        # The writers' copy of the held chunks and their first offsets, oldest first.
        self._chunks: list[_Chunk] = []
        self._firsts: list[int] = []
        self._nbytes = 0

    @property
    def enabled(self) -> bool:
        return self.bytes_max > 0

    @property
    def nbytes(self) -> int:
        return self._held.nbytes

    @property
    def chunks(self) -> int:
        return len(self._held.chunks)

    def add(self, offsets: Offsets, sizes: Offsets, records: bytes) -> None:
        """Hold a frame's records (`offsets`/`sizes`: its entries, in frame order). A frame
        that does not continue the held ones (it starts below their end) replaces them; one
        whose offsets do not ascend or whose records do not add up is not held."""
        n = len(offsets)
        if not self.enabled or n == 0 or len(records) > self.bytes_max:
            return
        offsets = np.asarray(offsets, dtype=np.int64)
        sizes = np.asarray(sizes, dtype=np.int64)
        starts = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(sizes, out=starts[1:])
        if int(starts[-1]) != len(records) or (n > 1 and bool((np.diff(offsets) <= 0).any())):
            return
        chunk = _Chunk(offsets, sizes, starts, records)
        with self._lock:
            chunks, firsts = self._chunks, self._firsts
            if chunks and int(offsets[0]) < chunks[-1].end:
                chunks.clear()
                firsts.clear()
                self._nbytes = 0
            self._nbytes += len(records)
            last = len(chunks[-1].blob) if chunks else 0
            if chunks and last < self.chunk_bytes_min and last + len(records) <= self.bytes_max:
                chunks[-1] = _merged(chunks[-1], chunk)
            else:
                chunks.append(chunk)
                firsts.append(int(offsets[0]))
            drop = 0
            while self._nbytes > self.bytes_max:
                self._nbytes -= len(chunks[drop].blob)
                drop += 1
            del chunks[:drop], firsts[:drop]
            self._publish(self._held.min_offset)

    def clear(self) -> None:
        with self._lock:
            self._chunks.clear()
            self._firsts.clear()
            self._nbytes = 0
            self._held = _EMPTY

    def drop_below(self, min_offset: int) -> None:
        """The log's minimum moved to `min_offset`: nothing below it is served again."""
        with self._lock:
            chunks = self._chunks
            drop = 0
            while drop < len(chunks) and chunks[drop].end <= min_offset:
                self._nbytes -= len(chunks[drop].blob)
                drop += 1
            del chunks[:drop], self._firsts[:drop]
            self._publish(max(self._held.min_offset, min_offset))

    def _publish(self, min_offset: int) -> None:
        """Under the lock: the readers' snapshot of the writers' copy."""
        firsts = np.array(self._firsts, dtype=np.int64)
        self._held = _Held(tuple(self._chunks), firsts, min_offset, self._nbytes)

    def lookup(self, offsets: Offsets, sizes: Offsets) -> bytes | None:
        """The records at (offsets[i], sizes[i]) back to back, or None unless every one is
        held (module docstring)."""
        held = self._held
        n = len(offsets)
        if n == 0 or not held.chunks:
            return None
        phy = np.asarray(offsets, dtype=np.int64)
        size = np.asarray(sizes, dtype=np.int64)
        if int(phy.min()) < held.min_offset:
            return None
        which = np.searchsorted(held.firsts, phy, side="right") - 1
        if int(which.min()) < 0:
            return None
        pieces: list[memoryview] = []
        # Runs of ranges in one chunk (a queue's ranges ascend, so usually one or two).
        cuts = np.flatnonzero(np.diff(which)) + 1
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), n], strict=True):
            chunk = held.chunks[int(which[a])]
            want = phy[a:b]
            idx = np.searchsorted(chunk.offsets, want)
            if int(idx.max()) >= len(chunk.offsets):
                return None
            if not (
                np.array_equal(chunk.offsets[idx], want)
                and np.array_equal(chunk.sizes[idx], size[a:b])
            ):
                return None
            # Consecutive entries of the chunk are consecutive bytes: one slice each run.
            breaks = np.flatnonzero(np.diff(idx) != 1) + 1
            firsts = idx[np.concatenate(([0], breaks))]
            lasts = idx[np.concatenate((breaks - 1, [len(idx) - 1]))] + 1
            view = memoryview(chunk.blob)
            starts = chunk.starts
            for lo, hi in zip(starts[firsts].tolist(), starts[lasts].tolist(), strict=True):
                pieces.append(view[lo:hi])
        return pieces[0].tobytes() if len(pieces) == 1 else b"".join(pieces)


def _merged(old: _Chunk, new: _Chunk) -> _Chunk:
    """One chunk of two, `new` after `old` (a new object: readers may hold the old one)."""
    return _Chunk(
        np.concatenate((old.offsets, new.offsets)),
        np.concatenate((old.sizes, new.sizes)),
        np.concatenate((old.starts[:-1], new.starts + len(old.blob))),
        old.blob + new.blob,
    )
