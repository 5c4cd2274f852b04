"""The lease-renewing thread and the followers' change feed, against a real etcd.

Figures: the watch's notification delay (printed with -s; docs/replication.md quotes them).
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from collections.abc import Callable

import pytest

from mqstore.coordination.coordinator import GroupState
from mqstore.coordination.etcd import EtcdCoordinator
from mqstore.coordination.etcd_process import EtcdProcess
from mqstore.coordination.lease import TermKeeper

from .test_etcd_coordinator import TTL_S, lead, raw_client

Make = Callable[[], EtcdCoordinator]
# How long a test waits for something that should come in milliseconds: a bound on a hang,
# not a speed claim.
EVENTUALLY_S = 5.0


class Losses:
    def __init__(self) -> None:
        self.reasons: list[tuple[float, str]] = []
        self.event = threading.Event()

    def __call__(self, reason: str) -> None:
        self.reasons.append((time.monotonic(), reason))
        self.event.set()


def test_a_keeper_holds_the_term_across_several_ttls(coordinators: Make) -> None:
    a, b = coordinators(), coordinators()
    term = lead(a, "a")
    lost = Losses()
    keeper = TermKeeper(a, term, lost).start()
    try:
        time.sleep(1.25 * TTL_S)
        assert keeper.may_acknowledge()
        assert b.campaign("b", "b:7100", TTL_S, allow_unclean=True) is None
        assert keeper.renewals >= 3
    finally:
        keeper.stop()
    assert not keeper.may_acknowledge()
    assert keeper.fence.over_reason == "stopped by its holder"
    assert lost.reasons == []  # stopping is not losing
    assert a.resign(term)


def test_a_keeper_calls_back_once_when_its_leader_record_is_gone(
    etcd: EtcdProcess, coordinators: Make
) -> None:
    """An operator deletes the leader key while the lease lives on: the next renewal sees the
    record is not the term's, the term ends, and the callback runs once."""
    a = coordinators()
    term = lead(a, "a")
    lost = Losses()
    keeper = TermKeeper(a, term, lost).start()
    try:
        raw_client(etcd).delete(a.leader_key)
        assert lost.event.wait(EVENTUALLY_S)
        time.sleep(0.8)  # a renewal interval more: no second call
        assert len(lost.reasons) == 1
        assert "leader record" in lost.reasons[0][1]
        assert not keeper.may_acknowledge()
    finally:
        keeper.stop()


def _watch(coordinator: EtcdCoordinator) -> tuple[queue.Queue[tuple[float, GroupState]], object]:
    seen: queue.Queue[tuple[float, GroupState]] = queue.Queue()
    feed = coordinator.watch(lambda state: seen.put((time.monotonic(), state)))
    return seen, feed


def _next(seen: queue.Queue[tuple[float, GroupState]]) -> tuple[float, GroupState]:
    return seen.get(timeout=EVENTUALLY_S)


def test_a_follower_learns_of_each_leader_change_from_the_watch(coordinators: Make) -> None:
    """20 elections and resignations; each reaches the follower's callback. The delay from the
    writer's call returning to the callback is printed (median and max)."""
    a, follower = coordinators(), coordinators()
    seen, feed = _watch(follower)
    try:
        _, first = _next(seen)
        assert first.leader is None
        delays_ms: list[float] = []
        for round_number in range(1, 21):
            term = lead(a, "a")
            written = time.monotonic()
            at, state = _next(seen)
            assert state.leader == term.leader and state.epoch == round_number
            delays_ms.append((at - written) * 1000)
            assert a.resign(term)
            written = time.monotonic()
            at, state = _next(seen)
            assert state.leader is None
            delays_ms.append((at - written) * 1000)
        assert seen.empty()  # one delivery per change, no repeats
        print(
            f"\nwatch delay over {len(delays_ms)} changes: median "
            f"{statistics.median(delays_ms):.1f} ms, max {max(delays_ms):.1f} ms"
        )
    finally:
        feed.close()  # type: ignore[attr-defined]


def test_a_lapsed_lease_reaches_the_watch(coordinators: Make) -> None:
    """No renewal: etcd deletes the record when the lease expires (its expiry check runs every
    500 ms), and the follower hears of it; the delay after grant + TTL is printed."""
    a, follower = coordinators(), coordinators()
    seen, feed = _watch(follower)
    try:
        _next(seen)
        term = lead(a, "a")
        assert _next(seen)[1].leader == term.leader
        at, state = seen.get(timeout=TTL_S + EVENTUALLY_S)
        assert state.leader is None
        assert at >= term.acquired_sent_at_s + term.ttl_s
        late_ms = (at - term.acquired_sent_at_s - term.ttl_s) * 1000
        print(f"\nlapsed leader seen {late_ms:.0f} ms after grant sent + TTL")
    finally:
        feed.close()  # type: ignore[attr-defined]


def test_a_closed_watch_calls_back_no_more(coordinators: Make) -> None:
    a, follower = coordinators(), coordinators()
    seen, feed = _watch(follower)
    _next(seen)
    feed.close()  # type: ignore[attr-defined]
    lead(a, "a")
    with pytest.raises(queue.Empty):
        seen.get(timeout=0.5)
