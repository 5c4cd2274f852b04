"""Named crash points: inert unless armed, a crash that `except Exception` cannot swallow, and
names that must be declared (a misspelling fails instead of arming nothing)."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from mqstore.storage import failpoints

ROOT = Path(__file__).resolve().parents[2]
CODE_PACKAGES = ("mqstore", "commitlog_svc", "cq_svc", "index_svc")

POINT = failpoints.declare("test.point", "tests/storage/test_failpoints.py")
OTHER = failpoints.declare("test.other", "tests/storage/test_failpoints.py: never armed")
A = failpoints.declare("test.a", "tests/storage/test_failpoints.py")
B = failpoints.declare("test.b", "tests/storage/test_failpoints.py")


def test_hit_does_nothing_unless_armed() -> None:
    failpoints.hit(OTHER)
    failpoints.arm(POINT)
    failpoints.hit(OTHER)  # another name is armed: still nothing


def test_armed_point_raises_simulated_crash_and_is_disarmed_after_the_block() -> None:
    with failpoints.armed(POINT), pytest.raises(failpoints.SimulatedCrash) as info:
        failpoints.hit(POINT)
    assert str(info.value) == POINT
    failpoints.hit(POINT)


def test_armed_point_is_disarmed_even_when_the_block_raises() -> None:
    with pytest.raises(failpoints.SimulatedCrash), failpoints.armed(POINT):
        failpoints.hit(POINT)
    failpoints.hit(POINT)


def test_simulated_crash_is_not_caught_by_except_exception() -> None:
    assert not issubclass(failpoints.SimulatedCrash, Exception)
    assert issubclass(failpoints.SimulatedCrash, BaseException)

    def engine_step() -> str:
        try:
            failpoints.hit(POINT)
        except Exception:
            return "swallowed"
        return "passed"

    with failpoints.armed(POINT), pytest.raises(failpoints.SimulatedCrash):
        engine_step()
    assert engine_step() == "passed"


def test_a_custom_action_runs_with_the_point_name() -> None:
    seen: list[str] = []
    with failpoints.armed(POINT, seen.append):
        failpoints.hit(POINT)
        failpoints.hit(POINT)
        failpoints.hit(OTHER)
    failpoints.hit(POINT)
    assert seen == [POINT, POINT]


def test_disarm_and_disarm_all() -> None:
    failpoints.arm(A)
    failpoints.arm(B)
    failpoints.disarm(A)
    failpoints.hit(A)
    with pytest.raises(failpoints.SimulatedCrash):
        failpoints.hit(B)
    failpoints.disarm_all()
    failpoints.hit(B)
    failpoints.disarm(OTHER)  # never armed: nothing to do


# -- the registry ----------------------------------------------------------------------------


@pytest.mark.parametrize("call", [failpoints.arm, failpoints.disarm, failpoints.hits])
def test_an_undeclared_name_is_refused(call: Callable[[str], object]) -> None:
    with pytest.raises(failpoints.UnknownFailpoint, match=r"commitlog\.after_flsh"):
        call("commitlog.after_flsh")


def test_arming_an_undeclared_name_for_a_block_is_refused() -> None:
    with pytest.raises(failpoints.UnknownFailpoint), failpoints.armed("commitlog.after_flsh"):
        pass


def test_hitting_an_undeclared_name_while_anything_is_armed_is_refused() -> None:
    failpoints.hit("test.nowhere")  # nothing armed: one dict lookup, no check
    failpoints.arm(POINT)
    with pytest.raises(failpoints.UnknownFailpoint):
        failpoints.hit("test.nowhere")


def test_a_name_is_declared_once() -> None:
    with pytest.raises(ValueError, match="already declared"):
        failpoints.declare(POINT, "again")
    with pytest.raises(ValueError, match="already declared"):
        failpoints.declare("commitlog.after_flush", "a test's copy of a production point")


def test_an_armed_block_that_never_reaches_its_point_fails() -> None:
    not_hit = pytest.raises(failpoints.FailpointNotHit, match=re.escape(POINT))
    with not_hit, failpoints.armed(POINT):
        failpoints.hit(OTHER)
    failpoints.hit(POINT)  # disarmed all the same


def test_an_armed_block_keeps_its_own_exception_when_the_point_was_not_hit() -> None:
    with pytest.raises(KeyError), failpoints.armed(POINT):
        raise KeyError("the block's own failure")


def test_hits_count_since_the_point_was_last_armed() -> None:
    assert failpoints.hits(OTHER) == 0
    with failpoints.armed(POINT, lambda _: None):
        failpoints.hit(POINT)
        failpoints.hit(POINT)
        assert failpoints.hits(POINT) == 2
    failpoints.hit(POINT)  # disarmed: not counted
    assert failpoints.hits(POINT) == 2
    failpoints.arm(POINT, lambda _: None)
    assert failpoints.hits(POINT) == 0


def hit_sites() -> dict[str, list[str]]:
    """Every `failpoints.hit("...")` in the code, by name: where it is called."""
    sites: dict[str, list[str]] = {}
    for package in CODE_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "hit"
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "failpoints"
                ):
                    [arg] = node.args
                    assert isinstance(arg, ast.Constant), f"{path}: a hit names its point"
                    rel = path.relative_to(ROOT).as_posix()
                    sites.setdefault(arg.value, []).append(f"{rel}:{node.lineno}")
    return sites


def test_the_table_lists_exactly_the_points_the_code_hits() -> None:
    sites = hit_sites()
    assert "commitlog.before_flush" in sites  # the walk sees real code
    assert sorted(sites) == sorted(failpoints.POINTS)


def test_the_module_docstring_arms_a_real_point() -> None:
    doc = failpoints.__doc__
    assert doc is not None
    named = re.findall(r'(?:hit|armed)\("([^"]+)"', doc)
    assert named
    assert all(name in failpoints.POINTS for name in named), named
