"""The coordinator when etcd is killed -9, paused (SIGSTOP) and restarted.

Every call is bounded: while etcd is down or silent each fails as CoordinatorUnavailable
(gRPC UNAVAILABLE) within REQUEST_TIMEOUT_S plus scheduling slack, and works again once etcd
is back, with every key as it was. A leader's renewal thread ends its term at once when etcd
cannot be reached. An etcd of this module's own (fsync on), so the others' stays up.
"""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Callable, Iterator

import pytest

from mqstore.coordination.coordinator import GroupState, Term
from mqstore.coordination.etcd import REQUEST_TIMEOUT_S, EtcdCoordinator
from mqstore.coordination.etcd_process import EtcdProcess
from mqstore.coordination.lease import TermKeeper
from mqstore.errors import CoordinatorUnavailable
from mqstore.rpc.errors import status_code

from .test_etcd_coordinator import TTL_S, lead
from .test_term_keeper_and_watch import EVENTUALLY_S, Losses

# A loaded 2-core machine may run a thread late by this much; the bound itself is the point.
SLACK_S = 1.0


@pytest.fixture(scope="module")
def own_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    process = EtcdProcess(data_dir=str(tmp_path_factory.mktemp("etcd-faults") / "data"))
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def coordinator_of(own_etcd: EtcdProcess, group: str) -> Iterator[Callable[[], EtcdCoordinator]]:
    made: list[EtcdCoordinator] = []

    def make() -> EtcdCoordinator:
        made.append(EtcdCoordinator(own_etcd.endpoint, group))
        return made[-1]

    yield make
    for coordinator in made:
        coordinator.close()
    if not own_etcd.running:
        own_etcd.restart()
    own_etcd.resume()


def every_call(a: EtcdCoordinator, b: EtcdCoordinator, term: Term, state: GroupState) -> dict:
    return {
        "read": b.read,
        "campaign": lambda: b.campaign("b", "b:7100", TTL_S),
        "renew": lambda: a.renew(term),
        "update_in_sync": lambda: a.update_in_sync(term, state.in_sync, ["a"]),
        "ensure_store_id": lambda: b.ensure_store_id("abcd"),
        "resign": lambda: a.resign(term),
    }


def assert_unavailable_within_bound(calls: dict) -> dict[str, float]:
    took: dict[str, float] = {}
    for name, call in calls.items():
        started = time.monotonic()
        with pytest.raises(CoordinatorUnavailable) as raised:
            call()
        took[name] = time.monotonic() - started
        assert status_code(raised.value).name == "UNAVAILABLE"
        # campaign and resign make two calls (grant or txn, then revoke): two bounds.
        calls_made = 2 if name in ("campaign", "resign") else 1
        assert took[name] < calls_made * REQUEST_TIMEOUT_S + SLACK_S, (name, took[name])
    return took


def test_calls_fail_typed_within_the_bound_while_etcd_is_killed_then_work_again(
    own_etcd: EtcdProcess, coordinator_of: Callable[[], EtcdCoordinator]
) -> None:
    a, b = coordinator_of(), coordinator_of()
    term = lead(a, "a")
    in_sync = a.update_in_sync(term, a.read().in_sync, ["a", "b"])
    a.ensure_store_id("5eed")
    before = a.read()
    own_etcd.kill()
    took = assert_unavailable_within_bound(every_call(a, b, term, before))
    print("\nkilled etcd, each call failed after (s):", {k: round(v, 3) for k, v in took.items()})
    own_etcd.restart()
    after = b.read()
    assert after == before and after.in_sync == in_sync and after.store_id == "5eed"
    # A's lease survived the restart (etcd renews every lease when it becomes leader): it
    # lapses a TTL later, and B, in sync, takes over.
    won = None
    give_up = time.monotonic() + 3 * TTL_S + EVENTUALLY_S
    while won is None and time.monotonic() < give_up:
        won = b.campaign("b", "b:7100", TTL_S)
        time.sleep(0.05)
    assert won is not None and won.epoch == term.epoch + 1


def test_calls_fail_typed_within_the_bound_while_etcd_is_paused(
    own_etcd: EtcdProcess, coordinator_of: Callable[[], EtcdCoordinator]
) -> None:
    """SIGSTOP: the kernel still accepts connections, nothing answers; each call times out."""
    a, b = coordinator_of(), coordinator_of()
    term = lead(a, "a")
    state = a.read()
    own_etcd.pause()
    try:
        calls = every_call(a, b, term, state)
        took = assert_unavailable_within_bound({"read": calls["read"], "renew": calls["renew"]})
        assert took["read"] >= REQUEST_TIMEOUT_S * 0.9  # it waited for its bound, no longer
    finally:
        own_etcd.resume()
    # Back: reads answer again. (The lease itself lapsed during the ~2 s pause: etcd's clock
    # ran on, and the term is over; test_etcd_coordinator covers what follows.)
    assert b.read().epoch == state.epoch == term.epoch


def test_a_keeper_ends_the_term_when_etcd_is_killed(
    own_etcd: EtcdProcess, coordinator_of: Callable[[], EtcdCoordinator]
) -> None:
    a = coordinator_of()
    term = lead(a, "a")
    lost = Losses()
    keeper = TermKeeper(a, term, lost).start()
    try:
        time.sleep(0.3)
        assert keeper.may_acknowledge()
        killed_at = time.monotonic()
        own_etcd.kill()
        assert lost.event.wait(EVENTUALLY_S)
        at, reason = lost.reasons[0]
        assert "coordinator unavailable" in reason
        assert not keeper.may_acknowledge()
        # The first renewal after the kill fails at once (connection refused): the term ends
        # before its fencing deadline rather than at it.
        assert at < keeper.fence.deadline_s + SLACK_S
        print(f"\nterm ended {at - killed_at:.3f} s after etcd was killed: {reason[:80]}")
    finally:
        keeper.stop()


def test_the_watch_carries_on_after_etcd_restarts(
    own_etcd: EtcdProcess, coordinator_of: Callable[[], EtcdCoordinator]
) -> None:
    a, follower = coordinator_of(), coordinator_of()
    seen: queue.Queue[GroupState] = queue.Queue()
    feed = follower.watch(seen.put)
    try:
        assert seen.get(timeout=EVENTUALLY_S).leader is None
        own_etcd.kill()
        time.sleep(0.3)
        own_etcd.restart()
        term = lead(a, "a")
        state = seen.get(timeout=EVENTUALLY_S)
        assert state.leader == term.leader
        assert json.loads(json.dumps(state.in_sync.members)) == ["a"]
    finally:
        feed.close()  # type: ignore[attr-defined]
