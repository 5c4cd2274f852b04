"""A request to stop, asked by a signal or by code: a `threading.Event` that a signal handler
may set.

    stop = StopRequest()
    stop.install()                 # SIGTERM and SIGINT ask it
    while not stop.wait(0.5):      # the main thread's loop
        ...
    if stop.signal is not None:
        log.info("signal %s: shutting down", signal.Signals(stop.signal).name)

Why not an Event set from the handler: Python runs a handler on the main thread between two
bytecodes, also while that thread holds the Event's own lock (inside `Event.wait` or
`Event.set`), and `Event.set()` from the handler then waits forever for a lock its own thread
holds. A service killed by its launcher's death gets SIGTERM once for each of the launcher's
threads as they die, milliseconds apart (PR_SET_PDEATHSIG follows the creating thread), so a
second SIGTERM landing in that window is not rare: cq_svc hung so in a test run. The handler
here only stores the signal's number, which takes no lock; waiting notices it within
SIGNAL_POLL_S.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterable
from types import FrameType

# How soon a waiter notices a signal (the handler cannot wake it without taking a lock).
SIGNAL_POLL_S = 0.1


class StopRequest:
    """Asked once by `set()` or by one of the installed signals; never un-asked."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal: int | None = None  # the first signal that asked, if one did

    def install(self, signums: Iterable[int] = (signal.SIGTERM, signal.SIGINT)) -> None:
        """These signals ask to stop (main thread only, as for any handler)."""
        for signum in signums:
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, _: FrameType | None) -> None:
        if self.signal is None:  # an attribute store: no lock (module docstring)
            self.signal = signum

    def set(self) -> None:
        """Ask to stop (any thread, never a signal handler)."""
        self._event.set()

    def is_set(self) -> bool:
        return self.signal is not None or self._event.is_set()

    def wait(self, timeout_s: float) -> bool:
        """True once asked, False after `timeout_s` without; a signal is seen within
        SIGNAL_POLL_S, a `set()` at once."""
        deadline = time.monotonic() + timeout_s
        while not self.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._event.wait(min(left, SIGNAL_POLL_S))
        return True
