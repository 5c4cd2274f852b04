"""The leader's in-sync bookkeeping (commitlog_svc/in_sync.py) with a clock the test moves:
the commit offset is the lowest durable offset over the set and never moves back, a member
past the lag bound is proposed for removal, a caught-up follower for addition, and waiters
wake when the commit offset passes them."""

from __future__ import annotations

import threading

import pytest

from commitlog_svc.replication.in_sync import InSyncTracker
from mqstore.storage.clock import ManualClock

LAG_MS = 1_000


def tracker(members: tuple[str, ...] = ("a", "b", "c"), min_insync: int = 2) -> InSyncTracker:
    return InSyncTracker(
        "a", members, min_insync=min_insync, lag_max_ms=LAG_MS, clock=ManualClock()
    )


def test_the_commit_offset_is_the_lowest_durable_offset_of_the_set() -> None:
    t = tracker()
    t.leader_progress(end_offset=500, durable_offset=500)
    assert t.commit_offset == 0  # b and c have said nothing yet
    t.follower_progress("b", end_offset=500, durable_offset=400)
    assert t.commit_offset == 0
    t.follower_progress("c", end_offset=300, durable_offset=300)
    assert t.commit_offset == 300
    t.follower_progress("c", end_offset=500, durable_offset=500)
    assert t.commit_offset == 400  # b's durable offset now bounds it
    t.follower_progress("d", end_offset=0, durable_offset=0)  # not a member: no say
    assert t.commit_offset == 400


def test_the_commit_offset_never_moves_back() -> None:
    t = InSyncTracker(
        "a", ("a", "b"), min_insync=1, lag_max_ms=LAG_MS, clock=ManualClock(), commit_offset=900
    )
    t.leader_progress(end_offset=1_000, durable_offset=1_000)
    t.follower_progress("b", end_offset=200, durable_offset=200)
    assert t.commit_offset == 900
    t.set_members(["a"])
    assert t.commit_offset == 1_000


def test_a_durable_offset_past_the_end_counts_only_to_the_end() -> None:
    t = tracker(("a", "b"))
    t.leader_progress(end_offset=800, durable_offset=800)
    t.follower_progress("b", end_offset=100, durable_offset=700)
    assert t.commit_offset == 100


def test_a_member_past_the_lag_bound_is_proposed_for_removal() -> None:
    clock = ManualClock()
    t = InSyncTracker("a", ("a", "b", "c"), min_insync=2, lag_max_ms=LAG_MS, clock=clock)
    t.leader_progress(end_offset=100, durable_offset=100)
    t.follower_progress("b", end_offset=100, durable_offset=100)
    t.leader_progress(end_offset=200, durable_offset=200)  # b is behind from now
    clock.advance(LAG_MS)
    assert t.lagging() == frozenset()  # exactly at the bound: not yet
    clock.advance(1)
    assert t.lagging() == {"b", "c"}  # c never reported: timed from the leader's start
    t.follower_progress("b", end_offset=200, durable_offset=200)
    assert t.lagging() == {"c"}
    t.leader_progress(end_offset=300, durable_offset=300)
    clock.advance(LAG_MS + 1)
    t.follower_progress("b", end_offset=250, durable_offset=250)  # behind: not caught up
    assert t.lagging() == {"b", "c"}


def test_an_idle_caught_up_follower_never_lags_and_a_disconnected_one_does() -> None:
    clock = ManualClock()
    t = InSyncTracker("a", ("a", "b", "c"), min_insync=2, lag_max_ms=LAG_MS, clock=clock)
    t.leader_progress(end_offset=100, durable_offset=100)
    t.follower_progress("b", end_offset=100, durable_offset=100)
    t.follower_progress("c", end_offset=100, durable_offset=100)
    clock.advance(10 * LAG_MS)  # no appends, no reports
    assert t.lagging() == frozenset()
    t.disconnected("c")
    clock.advance(LAG_MS + 1)
    assert t.lagging() == {"c"}


def test_a_caught_up_follower_outside_the_set_is_proposed_for_addition() -> None:
    t = tracker(("a", "b"))
    t.leader_progress(end_offset=100, durable_offset=100)
    t.follower_progress("b", end_offset=100, durable_offset=100)
    t.follower_progress("c", end_offset=90, durable_offset=90)
    assert t.caught_up() == frozenset()
    t.follower_progress("c", end_offset=100, durable_offset=100)
    assert t.caught_up() == {"c"}
    t.disconnected("c")
    assert t.caught_up() == frozenset()
    t.follower_progress("c", end_offset=100, durable_offset=100)
    t.set_members(["a", "b", "c"])
    assert t.caught_up() == frozenset() and t.members == {"a", "b", "c"}


REPORT_MS = 50  # a follower's report after each chunk: every few tens of ms under load


def test_a_follower_one_report_behind_under_a_steady_load_stays_in_the_set() -> None:
    """Each report holds what the leader had at the report before, never the leader's end at
    its own moment (the end moved on while it travelled). Such a follower keeps up; judged
    against the leader's end at the moment of each report it was removed after the lag bound,
    and the set flapped under load (make chaos REPLICAS=3: both followers removed at once, the
    leader killed next, nobody eligible until it came back, 17 s later)."""
    clock = ManualClock()
    t = InSyncTracker("a", ("a", "b"), min_insync=2, lag_max_ms=LAG_MS, clock=clock)
    end = 0
    for _ in range(3 * LAG_MS // REPORT_MS):
        end += 1_000
        t.leader_progress(end_offset=end, durable_offset=end)  # the leader appended more
        t.follower_progress("b", end_offset=end - 1_000, durable_offset=end - 1_000)
        clock.advance(REPORT_MS)
        assert t.lagging() == frozenset()
    # Reports that stop moving are lagging again after the bound.
    for _ in range(LAG_MS // REPORT_MS + 2):
        end += 1_000
        t.leader_progress(end_offset=end, durable_offset=end)
        t.follower_progress("b", end_offset=1_000, durable_offset=1_000)
        clock.advance(REPORT_MS)
    assert t.lagging() == {"b"}


def test_a_follower_holding_every_committed_append_joins_although_the_end_moved_on() -> None:
    """Kafka's rule for growing the set: the follower's end at the high watermark. Required to
    reach the leader's end at the moment of a report, a restarted follower rejoined only in a
    lull of the load (make chaos REPLICAS=3: 10-15 s after its restart)."""
    clock = ManualClock()
    t = InSyncTracker("a", ("a", "b"), min_insync=2, lag_max_ms=LAG_MS, clock=clock)
    t.leader_progress(end_offset=1_000, durable_offset=1_000)
    t.follower_progress("b", end_offset=1_000, durable_offset=1_000)
    assert t.commit_offset == 1_000
    t.leader_progress(end_offset=1_500, durable_offset=1_500)  # not acknowledged yet
    t.follower_progress("c", end_offset=900, durable_offset=900)
    assert t.caught_up() == frozenset()  # lacks committed appends
    t.follower_progress("c", end_offset=1_200, durable_offset=1_000)
    assert t.caught_up() == {"c"}
    t.set_members(["a", "b", "c"])
    clock.advance(LAG_MS // 2)
    assert t.lagging() == frozenset()  # timed from when it joined
    assert not t.wait_committed(1_500, timeout_s=0.01)  # appends now wait for c too
    t.follower_progress("b", end_offset=1_500, durable_offset=1_500)
    assert t.commit_offset == 1_000
    t.follower_progress("c", end_offset=1_500, durable_offset=1_500)
    assert t.commit_offset == 1_500


def test_appends_are_accepted_only_with_min_insync_members() -> None:
    t = tracker(("a", "b"), min_insync=2)
    assert t.accepting()
    t.set_members(["a"])
    assert not t.accepting()
    t.set_members([])  # the leader is always a member
    assert t.members == {"a"}


def test_waiters_wake_when_the_commit_offset_passes_them() -> None:
    t = tracker(("a", "b"))
    t.leader_progress(end_offset=100, durable_offset=100)
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(t.wait_committed(100, timeout_s=10)))
    waiter.start()
    t.follower_progress("b", end_offset=50, durable_offset=50)
    assert woke == []
    t.follower_progress("b", end_offset=100, durable_offset=100)
    waiter.join(timeout=10)
    assert woke == [True]
    assert not t.wait_committed(101, timeout_s=0.01)


def test_nonsense_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        InSyncTracker("a", (), min_insync=0, lag_max_ms=1, clock=ManualClock())
    with pytest.raises(ValueError):
        InSyncTracker("a", (), min_insync=1, lag_max_ms=0, clock=ManualClock())
