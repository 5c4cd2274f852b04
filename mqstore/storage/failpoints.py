"""Named crash points.

Production code calls `hit("commitlog.after_flush")` at each durable step. Nothing happens
unless a test armed that name, so the cost is one dict lookup. A test arms a point with an
action, usually raising `SimulatedCrash` so that the engine stops exactly there, and then
crashes the SimDisk underneath to see what a power loss at that step leaves behind.

    with failpoints.armed("checkpoint.after_write_tmp", failpoints.crash):
        ...
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_armed: dict[str, Callable[[str], None]] = {}
_lock = threading.Lock()


class SimulatedCrash(BaseException):
    """Raised by an armed crash point. A BaseException so that `except Exception` in the
    engine cannot swallow it: the process is meant to be dead at this point."""


def crash(name: str) -> None:
    raise SimulatedCrash(name)


def hit(name: str) -> None:
    if _armed:
        action = _armed.get(name)
        if action is not None:
            action(name)


def arm(name: str, action: Callable[[str], None] = crash) -> None:
    with _lock:
        _armed[name] = action


def disarm(name: str) -> None:
    with _lock:
        _armed.pop(name, None)


def disarm_all() -> None:
    with _lock:
        _armed.clear()


@contextmanager
def armed(name: str, action: Callable[[str], None] = crash) -> Iterator[None]:
    arm(name, action)
    try:
        yield
    finally:
        disarm(name)
