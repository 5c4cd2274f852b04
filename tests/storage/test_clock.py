"""The clock seam: a manual clock whose wall time may jump back while monotonic time never does."""

from __future__ import annotations

import time

from mqstore.storage.clock import Clock, ManualClock, SystemClock


def test_manual_clock_advance_moves_wall_and_monotonic_time() -> None:
    clock = ManualClock(now_ms=1000)
    assert (clock.now_ms(), clock.monotonic_ms()) == (1000, 0.0)
    clock.advance(250)
    assert (clock.now_ms(), clock.monotonic_ms()) == (1250, 250.0)


def test_manual_clock_wall_time_may_go_back_but_monotonic_time_never_does() -> None:
    clock = ManualClock(now_ms=10_000)
    clock.advance(100)
    clock.advance(-5000)
    assert clock.now_ms() == 5100
    assert clock.monotonic_ms() == 100.0
    clock.set_wall(1)
    assert clock.now_ms() == 1
    assert clock.monotonic_ms() == 100.0


def test_system_clock_tells_wall_time_in_ms_and_a_non_decreasing_monotonic_time() -> None:
    clock: Clock = SystemClock()
    before = time.time_ns() // 1_000_000
    now = clock.now_ms()
    after = time.time_ns() // 1_000_000
    assert before <= now <= after
    readings = [clock.monotonic_ms() for _ in range(100)]
    assert readings == sorted(readings)


def test_both_clocks_satisfy_the_clock_protocol() -> None:
    clocks: list[Clock] = [SystemClock(), ManualClock()]
    assert all(isinstance(c.now_ms(), int) for c in clocks)
