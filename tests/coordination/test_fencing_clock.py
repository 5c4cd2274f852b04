"""The leader's fencing clock with a clock the test controls (mqstore/coordination/lease.py).

Rule: a term may acknowledge while now < last successful renewal's SEND time + TTL - margin;
once that passes, a renewal fails, or an answer comes too late, the term is over for good.
"""

from __future__ import annotations

import math

import pytest

from mqstore.coordination.lease import MARGIN_FRACTION, RENEW_FRACTION, FencingClock
from mqstore.errors import InvalidArgument

TTL_S = 2.0


class ManualClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def fence_at(sent: float, clock: ManualClock | None = None) -> FencingClock:
    return FencingClock(TTL_S, sent, clock=clock or ManualClock(sent))


def test_acknowledging_stops_exactly_at_send_plus_ttl_minus_margin() -> None:
    fence = fence_at(100.0)
    deadline = 100.0 + TTL_S - TTL_S * MARGIN_FRACTION
    assert fence.deadline_s == deadline == 101.5
    assert fence.may_acknowledge(100.0)
    assert fence.may_acknowledge(math.nextafter(deadline, 0.0))
    assert not fence.may_acknowledge(deadline)
    assert fence.over_reason is not None and "deadline" in fence.over_reason


def test_a_passed_deadline_ends_the_term_for_good() -> None:
    """An earlier time asked after the deadline was seen, and a renewal afterwards, revive
    nothing: the replica has begun stepping down."""
    clock = ManualClock(100.0)
    fence = fence_at(100.0, clock)
    assert not fence.may_acknowledge(101.6)
    assert not fence.may_acknowledge(100.1)
    assert not fence.renewed(sent_at_s=100.5, answered_at_s=100.6)
    assert not fence.may_acknowledge(100.7)


def test_a_renewal_counts_from_when_it_was_sent_not_answered() -> None:
    clock = ManualClock(100.0)
    fence = fence_at(100.0, clock)
    assert fence.next_renewal_s == pytest.approx(100.0 + TTL_S * RENEW_FRACTION)
    assert fence.renewed(sent_at_s=100.7, answered_at_s=101.2)
    assert fence.deadline_s == pytest.approx(100.7 + 1.5)
    assert fence.may_acknowledge(math.nextafter(102.2, 0.0))
    assert not fence.may_acknowledge(102.2)


def test_a_failed_renewal_does_not_extend_the_deadline() -> None:
    """The renewal thread sends at 100.7 and etcd does not answer: nothing moves, and the
    deadline set by the grant at 100.0 still ends the term at 101.5."""
    clock = ManualClock(100.0)
    fence = fence_at(100.0, clock)
    clock.now = 100.7  # a renewal is sent ... and fails: `renewed` is never called
    assert fence.deadline_s == 101.5
    assert fence.may_acknowledge(101.4)
    assert not fence.may_acknowledge(101.5)


def test_a_failed_renewal_reported_ends_the_term_before_the_deadline() -> None:
    fence = fence_at(100.0)
    fence.end("renewal failed: coordinator unavailable")
    assert not fence.may_acknowledge(100.1)
    fence.end("a later reason")
    assert fence.over_reason == "renewal failed: coordinator unavailable"


def test_a_renewal_answered_past_the_deadline_ends_the_term() -> None:
    """Sent in time (100.7) but answered at 101.5, the deadline: too late, the replica may
    already have been told to step down."""
    fence = fence_at(100.0)
    assert not fence.renewed(sent_at_s=100.7, answered_at_s=101.5)
    assert not fence.may_acknowledge(100.8)


def test_an_older_renewal_never_moves_the_deadline_back() -> None:
    fence = fence_at(100.0)
    assert fence.renewed(sent_at_s=100.9, answered_at_s=101.0)
    assert fence.renewed(sent_at_s=100.5, answered_at_s=101.1)
    assert fence.deadline_s == pytest.approx(100.9 + 1.5)


def test_the_clock_is_read_when_no_time_is_given() -> None:
    clock = ManualClock(100.0)
    fence = fence_at(100.0, clock)
    clock.now = 101.49
    assert fence.may_acknowledge()
    clock.now = 101.5
    assert not fence.may_acknowledge()


@pytest.mark.parametrize(
    ("ttl_s", "renew_fraction", "margin_fraction"),
    [(0.0, 1 / 3, 0.25), (2.0, 0.8, 0.25), (2.0, 1 / 3, 0.0), (2.0, 0.0, 0.25)],
)
def test_timings_that_cannot_renew_in_time_are_refused(
    ttl_s: float, renew_fraction: float, margin_fraction: float
) -> None:
    with pytest.raises(InvalidArgument):
        FencingClock(ttl_s, 0.0, renew_fraction=renew_fraction, margin_fraction=margin_fraction)
