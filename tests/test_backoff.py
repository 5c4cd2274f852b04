"""mqstore/backoff.py: the pauses every retry loop of the package waits between attempts."""

from __future__ import annotations

import pytest

from mqstore.backoff import BACKOFF_FIRST_S, BACKOFF_MAX_S, Backoff


def test_pauses_double_from_the_first_to_the_ceiling_and_reset_starts_over() -> None:
    b = Backoff(0.1, 0.5)
    assert [b.next_s() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    b.reset()
    assert b.pause_s == 0.1
    b.grow()  # a pause taken without next_s (the caller slept a shorter one)
    assert b.next_s() == 0.2


def test_the_default_is_the_sdk_s_pauses() -> None:
    b = Backoff()
    assert (b.pause_s, b.max_s) == (BACKOFF_FIRST_S, BACKOFF_MAX_S)


@pytest.mark.parametrize(("first_s", "max_s"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)])
def test_a_backoff_that_would_never_wait_or_shrink_is_refused(first_s: float, max_s: float) -> None:
    with pytest.raises(ValueError, match="first_s"):
        Backoff(first_s, max_s)
