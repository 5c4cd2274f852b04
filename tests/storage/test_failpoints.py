"""Named crash points: inert unless armed, and a crash that `except Exception` cannot swallow."""

from __future__ import annotations

import pytest

from mqstore.storage import failpoints


def test_hit_does_nothing_unless_armed() -> None:
    failpoints.hit("test.nowhere")
    failpoints.arm("test.elsewhere")
    failpoints.hit("test.nowhere")  # another name is armed: still nothing


def test_armed_point_raises_simulated_crash_and_is_disarmed_after_the_block() -> None:
    with failpoints.armed("test.point"), pytest.raises(failpoints.SimulatedCrash) as info:
        failpoints.hit("test.point")
    assert str(info.value) == "test.point"
    failpoints.hit("test.point")


def test_armed_point_is_disarmed_even_when_the_block_raises() -> None:
    with pytest.raises(failpoints.SimulatedCrash), failpoints.armed("test.point"):
        failpoints.hit("test.point")
    failpoints.hit("test.point")


def test_simulated_crash_is_not_caught_by_except_exception() -> None:
    assert not issubclass(failpoints.SimulatedCrash, Exception)
    assert issubclass(failpoints.SimulatedCrash, BaseException)

    def engine_step() -> str:
        try:
            failpoints.hit("test.engine")
        except Exception:
            return "swallowed"
        return "passed"

    with failpoints.armed("test.engine"), pytest.raises(failpoints.SimulatedCrash):
        engine_step()
    assert engine_step() == "passed"


def test_a_custom_action_runs_with_the_point_name() -> None:
    seen: list[str] = []
    with failpoints.armed("test.count", seen.append):
        failpoints.hit("test.count")
        failpoints.hit("test.count")
        failpoints.hit("test.other")
    failpoints.hit("test.count")
    assert seen == ["test.count", "test.count"]


def test_disarm_and_disarm_all() -> None:
    failpoints.arm("test.a")
    failpoints.arm("test.b")
    failpoints.disarm("test.a")
    failpoints.hit("test.a")
    with pytest.raises(failpoints.SimulatedCrash):
        failpoints.hit("test.b")
    failpoints.disarm_all()
    failpoints.hit("test.b")
    failpoints.disarm("test.never-armed")
