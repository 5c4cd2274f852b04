"""RocketMQ's transient store pool: reusable in-memory write buffers for segment files.

With the pool on (async flush only), appends land in a pooled buffer the size of a segment, a
commit task copies them into the file every `commit_interval_ms`, and the flush task makes them
durable. Readers see data up to the committed position. RocketMQ mlocks its buffers; Python has
no portable mlock, so these are plain bytearrays allocated once and reused.
"""

from __future__ import annotations

import collections
import ctypes
import threading


class TransientStorePool:
    def __init__(self, pool_size: int, file_size: int) -> None:
        self.pool_size = pool_size
        self.file_size = file_size
        self._free: collections.deque[bytearray] = collections.deque(
            bytearray(file_size) for _ in range(pool_size)
        )
        self._lock = threading.Lock()

    def borrow(self) -> bytearray | None:
        """A free buffer, or None (the file is then written through its map instead)."""
        with self._lock:
            return self._free.popleft() if self._free else None

    def give_back(self, buffer: bytearray) -> None:
        if len(buffer) != self.file_size:
            raise ValueError("buffer of the wrong size returned to the pool")
        # Zeroed so that bytes of the previous file can never be committed into the next.
        ctypes.memset((ctypes.c_char * len(buffer)).from_buffer(buffer), 0, len(buffer))
        with self._lock:
            self._free.append(buffer)

    def available(self) -> int:
        with self._lock:
            return len(self._free)
