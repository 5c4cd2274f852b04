"""Wake-ups for long polls: who waits on which queue, and the dispatch that wakes them.

    waiter = watch.register((topic, queue_id))   # before the last look: no lost wake-up
    ... look; nothing there ...
    waiter.wait(timeout_s)                        # woken by notify, cancel, close or the time
    watch.unregister(waiter)

The sink calls `notify` with the queues of every applied dispatch batch: only waiters of the queues
the batch touched wake (an event each, no shared condition, so a batch for one queue does not
stir every waiting call). A waiter registered before its caller's last look cannot miss a
batch applied after that look: the batch sets its event, and `wait` returns at once.

A Follow stream waits on several queues with one waiter (`register_many`): the waiter keeps
the keys that woke it, so the stream looks again only at those (`take` hands them over and
re-arms the waiter in one step: a wake after it is never lost).

Every waiting call holds a server thread, so long polls (`register`) are bounded by
`max_waiters`; one more is refused with ResourceExhausted. A Follow's waiter (`register_many`)
is not counted there: Follow streams have a cap of their own (follow_streams_max, taken before
the stream starts, mqstore/rpc/streams.py). `waiting` counts both. `close()` (shutdown) wakes
every waiter and makes later waits return at once, so long polls answer promptly when the
service drains.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import TypeVar

from mqstore.errors import ResourceExhausted

Key = tuple[str, int]
W = TypeVar("W", bound="Waiter")


class Waiter:
    __slots__ = ("_event", "keys")

    def __init__(self, keys: Sequence[Key]) -> None:
        self.keys = tuple(keys)
        self._event = threading.Event()

    def wait(self, timeout_s: float) -> bool:
        """Block until woken or `timeout_s` passes; True when woken. Re-arms itself."""
        woken = self._event.wait(max(0.0, timeout_s))
        self._event.clear()
        return woken

    def wake(self, key: Key | None = None) -> None:
        """Woken by a dispatch to `key`, or for another reason (None: cancel, shutdown)."""
        self._event.set()


class KeysWaiter(Waiter):
    """One waiter for several queues that remembers which of them were woken."""

    __slots__ = ("_lock", "_woken")

    def __init__(self, keys: Sequence[Key]) -> None:
        super().__init__(keys)
        self._lock = threading.Lock()
        self._woken: set[Key] = set()

    def wait(self, timeout_s: float) -> bool:
        """Block until woken or `timeout_s` passes; True when woken. `take` re-arms it."""
        return self._event.wait(max(0.0, timeout_s))

    def wake(self, key: Key | None = None) -> None:
        with self._lock:
            if key is not None:
                self._woken.add(key)
            self._event.set()

    def take(self) -> set[Key]:
        """The keys woken since the last take; re-armed (a wake from now on is kept)."""
        with self._lock:
            woken, self._woken = self._woken, set()
            self._event.clear()
        return woken


class QueueWatch:
    def __init__(self, max_waiters: int) -> None:
        self.max_waiters = max_waiters
        self._lock = threading.Lock()
        self._by_key: dict[Key, set[Waiter]] = {}
        self._count = 0  # every waiter
        self._bounded: set[Waiter] = set()  # the long polls', counted against max_waiters
        self._closed = False

    @property
    def waiting(self) -> int:
        return self._count

    @property
    def closed(self) -> bool:
        return self._closed

    def register(self, key: Key) -> Waiter:
        """A long poll's waiter, one of max_waiters."""
        return self._add(Waiter((key,)), bounded=True)

    def register_many(self, keys: Sequence[Key]) -> KeysWaiter:
        """One waiter for every key in `keys` (distinct): a Follow's, bounded by its caller."""
        waiter = KeysWaiter(keys)
        self._add(waiter, bounded=False)
        return waiter

    def _add(self, waiter: W, *, bounded: bool) -> W:
        with self._lock:
            if bounded:
                if len(self._bounded) >= self.max_waiters:
                    raise ResourceExhausted(
                        f"{len(self._bounded)} long polls are waiting already (the bound); "
                        "poll again later or without long_poll_ms"
                    )
                self._bounded.add(waiter)
            for key in waiter.keys:
                self._by_key.setdefault(key, set()).add(waiter)
            self._count += 1
            if self._closed:
                waiter.wake()
        return waiter

    def unregister(self, waiter: Waiter) -> None:
        with self._lock:
            found = False
            for key in waiter.keys:
                waiters = self._by_key.get(key)
                if waiters is None or waiter not in waiters:
                    continue
                found = True
                waiters.discard(waiter)
                if not waiters:
                    del self._by_key[key]
            if found:
                self._count -= 1
                self._bounded.discard(waiter)

    def notify(self, keys: Iterable[Key]) -> int:
        """Wake the waiters of `keys`; returns how many were woken."""
        woken = 0
        with self._lock:
            for key in keys:
                for waiter in self._by_key.get(key, ()):
                    waiter.wake(key)
                    woken += 1
        return woken

    def notify_all(self) -> int:
        """Wake every waiter (the handshake changed queues under them)."""
        with self._lock:
            keys = list(self._by_key)
        return self.notify(keys)

    def close(self) -> None:
        """Shutdown: wake everyone now, and every later waiter at once."""
        with self._lock:
            self._closed = True
            for waiters in self._by_key.values():
                for waiter in waiters:
                    waiter.wake()
