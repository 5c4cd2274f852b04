"""Time behind a seam, so that tests can jump it forwards and backwards."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock time in ms: store timestamps and retention ages."""

    def monotonic_ms(self) -> float:
        """A clock that never goes back: intervals and timeouts."""


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> float:
        return time.monotonic() * 1000.0


class ManualClock:
    """A clock a test moves by hand; `now_ms` may jump back, `monotonic_ms` never does."""

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = now_ms
        self._mono_ms = 0.0

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic_ms(self) -> float:
        return self._mono_ms

    def advance(self, ms: int) -> None:
        self._now_ms += ms
        self._mono_ms += max(0, ms)

    def set_wall(self, now_ms: int) -> None:
        """Jump the wall clock (either way) without moving monotonic time."""
        self._now_ms = now_ms
