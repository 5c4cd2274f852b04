"""The coordinator's elections, fenced writes and set-once writes against a real etcd.

Each rule named in docs/replication.md, "Coordinator", has a test here: one winner per race,
the epoch raised by exactly one, a lapsed lease letting another win (never before the old
holder's fencing deadline), resignation, the in-sync set fenced by the leader record, the
election restricted to the in-sync set, and the store id set once.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import etcd3gw
import pytest

from mqstore.coordination.coordinator import GroupState, InSyncSet, Term
from mqstore.coordination.etcd import EtcdCoordinator, parse_endpoint
from mqstore.coordination.etcd_process import EtcdProcess, min_lease_ttl_s
from mqstore.coordination.lease import FencingClock
from mqstore.errors import (
    CorruptCoordinatorValue,
    InSyncSetConflict,
    InvalidArgument,
    LeadershipLost,
    NotEligible,
)

TTL_S = 2  # the smallest lease etcd grants with etcd_process's flags
Make = Callable[[], EtcdCoordinator]


def raw_client(etcd: EtcdProcess) -> etcd3gw.Etcd3Client:
    """Writes that no mqstore replica makes: an operator's, or another program's."""
    _, host, port = parse_endpoint(etcd.endpoint)
    return etcd3gw.client(host=host, port=port, timeout=5)


def lead(coordinator: EtcdCoordinator, name: str, **kwargs: object) -> Term:
    term = coordinator.campaign(name, f"{name}:7100", TTL_S, **kwargs)  # type: ignore[arg-type]
    assert term is not None, f"{name} did not win"
    return term


def test_the_first_leader_begins_epoch_one_alone_in_sync(coordinators: Make) -> None:
    a = coordinators()
    before = a.read()
    assert before.leader is None and before.epoch == 0 and before.in_sync == InSyncSet()
    term = lead(a, "a")
    state = a.read()
    assert term.epoch == 1 and term.ttl_s == TTL_S and term.fence > 0
    assert state.leader == term.leader
    assert state.leader.address == "a:7100"
    assert state.epoch == 1
    assert state.in_sync.members == ("a",) and state.in_sync.version == 1
    assert state.in_sync.epoch == 1


def test_nobody_wins_while_a_leader_holds_the_key(coordinators: Make) -> None:
    a, b = coordinators(), coordinators()
    lead(a, "a")
    assert b.campaign("b", "b:7100", TTL_S, allow_unclean=True) is None
    assert a.read().epoch == 1


def test_a_race_has_exactly_one_winner_and_raises_the_epoch_by_one(coordinators: Make) -> None:
    """Three candidates campaign at the same instant, five times over (the winner resigns
    between rounds): one term each round, epochs 1, 2, 3, 4, 5."""
    names = ("a", "b", "c")
    replicas = {name: coordinators() for name in names}
    for round_number in range(1, 6):
        start = threading.Barrier(len(names))
        won: dict[str, Term | None] = {}

        def run(name: str, start: threading.Barrier, won: dict[str, Term | None]) -> None:
            start.wait()
            won[name] = replicas[name].campaign(name, f"{name}:7100", TTL_S, allow_unclean=True)

        threads = [threading.Thread(target=run, args=(name, start, won)) for name in names]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        winners = [term for term in won.values() if term is not None]
        assert len(won) == 3 and len(winners) == 1, won
        assert winners[0].epoch == round_number
        state = replicas["a"].read()
        assert state.epoch == round_number and state.leader == winners[0].leader
        assert replicas[winners[0].name].resign(winners[0])


def test_a_new_epoch_is_above_the_candidates_own_last_epoch(coordinators: Make) -> None:
    """An upgraded single-node store already began epochs 1..7 in its log: its first term in a
    group is 8, so no epoch number is used twice for different bytes."""
    a = coordinators()
    assert lead(a, "a", last_log_epoch=7).epoch == 8
    assert a.read().epoch == 8


def test_a_lapsed_lease_lets_another_win_not_before_the_fence(coordinators: Make) -> None:
    """A wins and never renews. B wins once etcd expires A's lease: never before A's grant was
    sent + TTL (so never while A's fencing clock allowed it to acknowledge). A's renewal and
    fenced write then fail as LeadershipLost."""
    a, b = coordinators(), coordinators()
    term_a = lead(a, "a")
    a.update_in_sync(term_a, a.read().in_sync, ["a", "b"])
    fence_a = FencingClock(term_a.ttl_s, term_a.acquired_sent_at_s)
    won: Term | None = None
    give_up = time.monotonic() + 3 * TTL_S + 2
    while won is None and time.monotonic() < give_up:
        won = b.campaign("b", "b:7100", TTL_S)
        if won is None:
            time.sleep(0.02)
    won_at = time.monotonic()
    assert won is not None and won.epoch == term_a.epoch + 1
    assert won_at >= term_a.acquired_sent_at_s + term_a.ttl_s
    assert won_at > fence_a.deadline_s and not fence_a.may_acknowledge(won_at)
    print(f"\nB won {won_at - term_a.acquired_sent_at_s:.3f} s after A's grant (TTL {TTL_S} s)")
    with pytest.raises(LeadershipLost):
        a.renew(term_a)
    with pytest.raises(LeadershipLost):
        a.update_in_sync(term_a, b.read().in_sync, ["a"])
    assert b.read().in_sync.members == ("a", "b")


def test_renewing_keeps_the_term_past_its_ttl(coordinators: Make) -> None:
    a, b = coordinators(), coordinators()
    term = lead(a, "a")
    for _ in range(4):  # 4 x 0.7 s = 1.4 TTLs
        time.sleep(0.7)
        a.renew(term)
        assert b.campaign("b", "b:7100", TTL_S, allow_unclean=True) is None
    assert a.read().leader == term.leader


def test_resigning_frees_the_key_but_never_a_successors(coordinators: Make) -> None:
    a, b = coordinators(), coordinators()
    term_a = lead(a, "a")
    a.update_in_sync(term_a, a.read().in_sync, ["a", "b"])
    assert a.resign(term_a) is True
    assert a.read().leader is None
    term_b = lead(b, "b")
    assert a.resign(term_a) is False  # a late retry of A's resignation
    assert b.read().leader == term_b.leader
    b.renew(term_b)
    with pytest.raises(LeadershipLost):
        a.renew(term_a)


def test_a_deposed_leaders_in_sync_write_is_refused(coordinators: Make) -> None:
    """A leads, the in-sync set is {a, b}; A's lease is revoked (as etcd does at expiry); B
    takes over. A, not knowing, tries to drop B from the set: refused, set unchanged."""
    a, b = coordinators(), coordinators()
    term_a = lead(a, "a")
    in_sync = a.update_in_sync(term_a, a.read().in_sync, ["a", "b"])
    assert in_sync.members == ("a", "b") and in_sync.version == 2 and in_sync.epoch == 1
    assert a.read().in_sync == in_sync
    etcd3gw.lease.Lease(term_a.lease_id, a._client).revoke()
    term_b = lead(b, "b")
    with pytest.raises(LeadershipLost):
        a.update_in_sync(term_a, in_sync, ["a"])
    state = b.read()
    assert state.in_sync == in_sync and state.leader == term_b.leader


def test_an_in_sync_write_from_a_stale_read_is_a_conflict(coordinators: Make) -> None:
    a = coordinators()
    term = lead(a, "a")
    stale = a.read().in_sync
    newer = a.update_in_sync(term, stale, ["a", "b"])
    with pytest.raises(InSyncSetConflict, match="version 2"):
        a.update_in_sync(term, stale, ["a", "c"])
    assert a.read().in_sync == newer
    assert a.update_in_sync(term, newer, ["a", "c"]).version == 3


@pytest.mark.parametrize("members", [["b"], ["a", "a"], [], ["a", "b/c"]])
def test_an_in_sync_set_names_its_leader_once_and_only_valid_names(
    coordinators: Make, members: list[str]
) -> None:
    a = coordinators()
    term = lead(a, "a")
    with pytest.raises(InvalidArgument):
        a.update_in_sync(term, a.read().in_sync, members)


def test_only_an_in_sync_replica_may_lead_unless_unclean_is_allowed(coordinators: Make) -> None:
    a, b, c = coordinators(), coordinators(), coordinators()
    term_a = lead(a, "a")
    a.update_in_sync(term_a, a.read().in_sync, ["a", "b"])
    a.resign(term_a)
    with pytest.raises(NotEligible, match="c is not in the in-sync set"):
        c.campaign("c", "c:7100", TTL_S)
    assert c.read().leader is None and c.read().epoch == 1
    term_c = lead(c, "c", allow_unclean=True)
    state = c.read()
    assert term_c.epoch == 2 and state.leader == term_c.leader
    # An unclean leader alone holds what it will acknowledge: the set restarts with it.
    assert state.in_sync.members == ("c",) and state.in_sync.version == 3
    c.resign(term_c)
    with pytest.raises(NotEligible):
        b.campaign("b", "b:7100", TTL_S)


def test_an_in_sync_replica_takes_over_with_the_set_unchanged(coordinators: Make) -> None:
    a, b = coordinators(), coordinators()
    term_a = lead(a, "a")
    in_sync = a.update_in_sync(term_a, a.read().in_sync, ["a", "b"])
    a.resign(term_a)
    term_b = lead(b, "b")
    assert term_b.epoch == 2
    assert b.read().in_sync == in_sync  # b's to change, as leader, through update_in_sync


def test_a_handover_ends_the_term_and_only_the_successor_may_lead_until_it_lapses(
    coordinators: Make,
) -> None:
    """A switchover's step (docs/replication.md): the leader record goes and the successor is
    named in the same transaction, so no other in-sync replica can win the race; the
    successor's win removes the handover; an unused handover lapses with its lease."""
    a, b, c = coordinators(), coordinators(), coordinators()
    term_a = lead(a, "a")
    a.update_in_sync(term_a, a.read().in_sync, ["a", "b", "c"])
    assert a.hand_over(term_a, "b", ttl_s=TTL_S) is True
    state = c.read()
    assert state.leader is None and state.handover == "b"
    with pytest.raises(NotEligible, match=r"handed group .* to b"):
        c.campaign("c", "c:7100", TTL_S)
    with pytest.raises(LeadershipLost):
        a.renew(term_a)  # the old term's lease went with it
    assert a.hand_over(term_a, "c", ttl_s=TTL_S) is False  # an old term hands nothing over
    term_b = lead(b, "b")
    assert term_b.epoch == term_a.epoch + 1
    assert b.read().handover is None

    # Unused: once its lease lapses, any in-sync replica may lead again.
    assert b.hand_over(term_b, "a", ttl_s=TTL_S) is True
    assert c.read().handover == "a"
    deadline = time.monotonic() + 10 * TTL_S
    while c.read().handover is not None:
        assert time.monotonic() < deadline, "the handover did not lapse"
        time.sleep(0.1)
    lead(c, "c")


class InterferingCoordinator(EtcdCoordinator):
    """Runs `between` once, right after the next read: a write by someone else lands between
    an election's read and its transaction (a real write to the real etcd)."""

    between: Callable[[], None] | None = None

    def read(self) -> GroupState:
        state = super().read()
        between, self.between = self.between, None
        if between is not None:
            between()
        return state


def test_an_election_fails_when_the_in_sync_set_changed_since_its_read(
    etcd: EtcdProcess, group: str, coordinators: Make
) -> None:
    a = coordinators()
    term_a = lead(a, "a")
    a.update_in_sync(term_a, a.read().in_sync, ["a", "b"])
    a.resign(term_a)
    b = InterferingCoordinator(etcd.endpoint, group)
    try:
        isr = json.dumps({"members": ["a"], "epoch": 1, "version": 3})
        b.between = lambda: raw_client(etcd).put(b.isr_key, isr)
        assert b.campaign("b", "b:7100", TTL_S) is None
        state = b.read()
        assert state.leader is None and state.epoch == 1 and state.in_sync.members == ("a",)
    finally:
        b.close()


def test_the_store_id_is_set_once(coordinators: Make) -> None:
    a, b = coordinators(), coordinators()
    assert a.read().store_id is None
    assert a.ensure_store_id("9f2c00aa") == "9f2c00aa"
    assert b.ensure_store_id("1234abcd") == "9f2c00aa"
    assert b.read().store_id == "9f2c00aa"
    with pytest.raises(InvalidArgument):
        a.ensure_store_id("NOT-HEX")


def test_a_value_mqstore_did_not_write_is_named_corrupt(
    etcd: EtcdProcess, coordinators: Make
) -> None:
    a = coordinators()
    raw_client(etcd).put(a.leader_key, "not json")
    with pytest.raises(CorruptCoordinatorValue, match="leader"):
        a.read()


@pytest.mark.parametrize("group", ["", "a/b", "-x", "x" * 200])
def test_a_group_name_must_be_one_plain_path_element(etcd: EtcdProcess, group: str) -> None:
    with pytest.raises(InvalidArgument):
        EtcdCoordinator(etcd.endpoint, group)


@pytest.mark.parametrize("endpoint", ["localhost", "ftp://h:1", "h:port", ":2379"])
def test_an_endpoint_is_host_and_port(endpoint: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_endpoint(endpoint)


def test_etcd_grants_two_seconds_and_raises_one_to_two(etcd: EtcdProcess) -> None:
    """etcd's minimum TTL is ceil((3 * election_ticks // 2) * heartbeat): 2 s with the flags
    etcd_process sets (100 ms, 1,000 ms); 1 s with a 500 ms election timeout."""
    assert etcd.min_lease_ttl_s == min_lease_ttl_s(100, 1_000) == 2
    assert min_lease_ttl_s(100, 500) == 1
    client = raw_client(etcd)
    for asked, granted in ((1, 2), (2, 2), (3, 3)):
        answer = client.post(client.get_url("/lease/grant"), json={"TTL": asked, "ID": 0})
        assert int(answer["TTL"]) == granted
        etcd3gw.lease.Lease(int(answer["ID"]), client).revoke()
