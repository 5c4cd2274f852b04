"""Broker groups in one process, on a real etcd and real gRPC on loopback
(commitlog_svc/replication/controller.py): three replicas elect one leader, the others follow
and join the in-sync set; sync appends are acknowledged only once every member holds them; a
leader that resigns or dies (its lease lapses) is replaced by an in-sync follower in a new
epoch, with every acknowledged message kept; the in-sync set shrinks by a dead follower, and
appends are refused below min-insync."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from commitlog_svc.messages import PutStatus
from commitlog_svc.replication import membership
from commitlog_svc.replication.controller import ReplicaController, ReplicationSettings, Role
from mqstore.coordination.etcd import EtcdCoordinator
from mqstore.coordination.etcd_process import EtcdProcess
from mqstore.errors import FailedPrecondition, NotEnoughReplicas, NotLeader
from mqstore.rpc.errors import ErrorInterceptor
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as pb_grpc
from tests.commitlog.message_in import MessageIn, as_batches
from tests.commitlog_svc.replica_support import assert_same_log, replica
from tests.coordination.test_etcd_coordinator import raw_client

LAG_MAX_MS = 600


class _Feeding(pb_grpc.CommitLogServicer):
    def __init__(self, node: Node) -> None:
        self.node = node

    def Replicate(
        self, request_iterator: Iterator[pb.ReplicateRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.ReplicateResponse]:
        return self.node.controller.feed.serve(request_iterator, context)


class Node:
    """One replica: its log, a gRPC server answering Replicate, its controller."""

    def __init__(
        self, root: Path, name: str, coordinator: EtcdCoordinator, group: str, **settings: object
    ) -> None:
        self.name = name
        self.log = replica(root / name)
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8), interceptors=[ErrorInterceptor()]
        )
        pb_grpc.add_CommitLogServicer_to_server(_Feeding(self), self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        self.server.start()
        self.settings = ReplicationSettings(
            group=group,
            name=name,
            address=self.address,
            min_insync=2,
            lag_max_ms=LAG_MAX_MS,
            **settings,  # type: ignore[arg-type]
        )
        self.coordinator = coordinator
        self.controller = ReplicaController(self.log, coordinator, self.settings)
        self.controller.join()
        self.controller.start()
        self.down = False

    def stop(self) -> None:
        """A clean stop: the controller resigns, the server goes."""
        if self.down:
            return
        self.down = True
        self.controller.stop()
        self.server.stop(grace=None).wait()

    def crash(self) -> None:
        """As a kill -9 looks to the others: the server goes at once and nothing resigns (the
        lease lapses on its own)."""
        self.down = True
        self.server.stop(grace=None).wait()
        self.controller.stop(resign=False)

    def restart(self) -> None:
        """A new controller and server on the same (still open) log."""
        assert self.down
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8), interceptors=[ErrorInterceptor()]
        )
        pb_grpc.add_CommitLogServicer_to_server(_Feeding(self), self.server)
        self.server.add_insecure_port(self.address)
        self.server.start()
        self.controller = ReplicaController(self.log, self.coordinator, self.settings)
        self.controller.join()
        self.controller.start()
        self.down = False


@pytest.fixture
def cluster(
    tmp_path: Path, coordinators: Callable[[], EtcdCoordinator], group: str
) -> Iterator[Callable[..., list[Node]]]:
    made: list[Node] = []

    def make(count: int = 3, **settings: object) -> list[Node]:
        nodes = [
            Node(tmp_path, name, coordinators(), group, **settings) for name in "abcde"[:count]
        ]
        made.extend(nodes)
        return nodes

    yield make
    for node in made:
        node.stop()
    for node in made:
        if node.log.running:
            node.log.close()


def wait_until(condition: Callable[[], bool], timeout_s: float = 20.0) -> float:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, "timed out"
        time.sleep(0.01)
    return time.monotonic() - start


def leader_of(nodes: list[Node]) -> Node:
    (lead,) = [n for n in nodes if not n.down and n.controller.role is Role.LEADER]
    return lead


def settled(nodes: list[Node], members: int) -> Callable[[], bool]:
    def check() -> bool:
        up = [n for n in nodes if not n.down]
        leaders = [n for n in up if n.controller.role is Role.LEADER]
        if len(leaders) != 1:
            return False
        tracker = leaders[0].controller.tracker
        followers = [n for n in up if n.controller.role is Role.FOLLOWER]
        return (
            tracker is not None
            and len(tracker.members) == members
            and len(followers) == len(up) - 1
        )

    return check


def append(node: Node, i: int) -> PutStatus:
    result = node.log.append_batch(
        as_batches([MessageIn(topic="T", queue_id=i % 4, body=b"m%d" % i)])
    )
    return result.statuses[0]


def append_if_leading(node: Node, i: int) -> PutStatus | None:
    """`append`, or None where the replica does not lead (NotLeader: the producer's cue to
    find the leader)."""
    try:
        return append(node, i)
    except NotLeader:
        return None


def test_three_replicas_elect_one_leader_and_acknowledge_only_what_all_hold(
    cluster: Callable[..., list[Node]],
) -> None:
    nodes = cluster(3)
    wait_until(settled(nodes, 3))
    lead = leader_of(nodes)
    for i in range(50):
        assert append(lead, i) is PutStatus.PUT_OK
        # acknowledged: every member of the in-sync set holds it durably
        assert all(n.log.end_offset >= lead.log.end_offset for n in nodes)
    follower = next(n for n in nodes if n is not lead)
    with pytest.raises(NotLeader):
        append(follower, 0)
    wait_until(lambda: all(n.controller.serving() for n in nodes))
    assert lead.controller.commit_offset() == lead.log.end_offset
    for n in nodes:
        if n is not lead:
            assert_same_log(lead.log, n.log)


def test_a_resigning_leader_is_replaced_in_a_new_epoch_and_catches_up_as_a_follower(
    cluster: Callable[..., list[Node]],
) -> None:
    nodes = cluster(3)
    wait_until(settled(nodes, 3))
    first = leader_of(nodes)
    epoch = first.log.history.last_epoch
    for i in range(20):
        assert append(first, i) is PutStatus.PUT_OK
    acked_end = first.log.end_offset
    first.stop()
    took = wait_until(lambda: any(n.controller.role is Role.LEADER for n in nodes if not n.down))
    second = leader_of(nodes)
    assert second.log.history.last_epoch == epoch + 1
    assert second.log.history.starts[-1] == acked_end
    print(f"a resigning leader replaced in {took:.2f} s")  # a figure, not a bound
    wait_until(lambda: append_if_leading(second, 100) is PutStatus.PUT_OK)
    first.restart()
    wait_until(settled(nodes, 3))
    assert append(second, 101) is PutStatus.PUT_OK
    for n in nodes:
        if n is not second:
            wait_until(lambda n=n: n.log.end_offset == second.log.end_offset)
            assert_same_log(second.log, n.log)


def test_a_dead_leader_is_replaced_once_its_lease_lapses_and_loses_nothing_acknowledged(
    cluster: Callable[..., list[Node]],
) -> None:
    nodes = cluster(3)
    wait_until(settled(nodes, 3))
    first = leader_of(nodes)
    for i in range(30):
        assert append(first, i) is PutStatus.PUT_OK
    acked_end = first.log.end_offset
    first.crash()
    took = wait_until(lambda: any(n.controller.role is Role.LEADER for n in nodes if not n.down))
    second = leader_of(nodes)
    assert second.log.end_offset >= acked_end
    print(f"a dead leader replaced in {took:.2f} s (its lease lapsing)")
    # the dead leader left the in-sync set at once: appends do not wait out the lag bound
    assert first.name not in second.controller.tracker.members  # type: ignore[union-attr]
    assert append(second, 200) is PutStatus.PUT_OK


def test_the_in_sync_set_shrinks_by_a_dead_follower_and_appends_stop_below_min_insync(
    cluster: Callable[..., list[Node]],
) -> None:
    nodes = cluster(3)
    wait_until(settled(nodes, 3))
    lead = leader_of(nodes)
    one, two = [n for n in nodes if n is not lead]
    one.stop()
    tracker = lead.controller.tracker
    assert tracker is not None
    wait_until(lambda: one.name not in tracker.members)
    assert append(lead, 1) is PutStatus.PUT_OK  # {lead, two}: still 2
    two.stop()
    wait_until(lambda: two.name not in tracker.members)
    end = lead.log.max_offset
    with pytest.raises(NotEnoughReplicas, match="fewer than 2 members"):
        append(lead, 2)  # the whole request refused (the SDK sends it again): nothing stored
    assert lead.log.max_offset == end
    assert lead.controller.serving()  # readiness: the leader, whatever its set
    two.restart()
    # Readiness of a follower: only as a member of the in-sync set (watched from etcd).
    wait_until(two.controller.serving)
    assert two.controller.role is Role.FOLLOWER and two.name in tracker.members
    assert append(lead, 3) is PutStatus.PUT_OK


def test_a_switchover_hands_the_lead_to_the_named_follower_losing_nothing(
    cluster: Callable[..., list[Node]],
) -> None:
    """`mqstore cluster switchover --to NAME`'s core: the named in-sync follower (not
    whichever wins a race) leads in the next epoch from exactly the old leader's end; the old
    leader follows it; appends are refused as NotLeader (the producer's cue to go to the new
    leader) from the moment the handover starts."""
    nodes = cluster(3)
    wait_until(settled(nodes, 3))
    first = leader_of(nodes)
    for i in range(40):
        assert append(first, i) is PutStatus.PUT_OK
    acked_end = first.log.end_offset
    epoch = first.log.history.last_epoch
    successor = sorted(n.name for n in nodes if n is not first)[-1]
    with pytest.raises(NotLeader, match="does not lead"):
        next(n for n in nodes if n.name == successor).controller.switchover(None, 5.0)

    done = first.controller.switchover(successor, 10.0)
    print(f"switchover: writes paused {done.paused_ms:.0f} ms")  # a figure, not a bound
    assert done.leader.name == successor and done.leader.epoch == epoch + 1
    second = next(n for n in nodes if n.name == successor)
    wait_until(lambda: second.controller.role is Role.LEADER)
    assert second.log.history.starts[-1] == acked_end
    with pytest.raises(NotLeader):
        append(first, 1000)
    wait_until(lambda: append_if_leading(second, 100) is PutStatus.PUT_OK)
    wait_until(settled(nodes, 3))
    assert first.controller.role is Role.FOLLOWER and first.controller.leader_name == successor
    assert append(second, 101) is PutStatus.PUT_OK
    for n in nodes:
        if n is not second:
            wait_until(lambda n=n: n.log.end_offset == second.log.end_offset)
            assert_same_log(second.log, n.log)


def test_a_switchover_without_an_eligible_follower_leaves_the_lead_where_it_is(
    cluster: Callable[..., list[Node]],
) -> None:
    nodes = cluster(3)
    wait_until(settled(nodes, 3))
    lead = leader_of(nodes)
    with pytest.raises(FailedPrecondition, match="no in-sync follower nosuch"):
        lead.controller.switchover("nosuch", 5.0)
    with pytest.raises(FailedPrecondition, match="no in-sync follower"):
        lead.controller.switchover(lead.name, 5.0)
    assert lead.controller.role is Role.LEADER
    assert append(lead, 1) is PutStatus.PUT_OK  # appends resumed at once

    # The pick without a name: the in-sync follower holding the most.
    done = lead.controller.switchover(None, 10.0)
    assert done.leader.name != lead.name
    assert done.leader.name in {n.name for n in nodes}


def test_replicas_that_remember_their_group_elect_nobody_from_an_emptied_etcd(
    cluster: Callable[..., list[Node]], etcd: EtcdProcess, group: str
) -> None:
    """etcd lost its data (not restored): the in-sync set is gone, and an election would count
    as the group's first, which any replica could win, one that missed acknowledged appends
    too. Replicas that remember the group (membership.py) stay out until the operator names
    one with --allow-unclean-election."""
    nodes = cluster(3)
    wait_until(settled(nodes, 3))
    lead = leader_of(nodes)
    for i in range(10):
        assert append(lead, i) is PutStatus.PUT_OK
    wait_until(lambda: all(n.controller._membership is not None for n in nodes))
    assert all(membership.load(n.log.disk, n.log.config.data_dir) for n in nodes)
    raw_client(etcd).delete_prefix(f"/mqstore/{group}/")
    wait_until(lambda: all(n.controller.role is not Role.LEADER for n in nodes))
    time.sleep(3)  # several election rounds: nobody may win one
    assert all(n.controller.role is not Role.LEADER for n in nodes)
    assert raw_client(etcd).get(f"/mqstore/{group}/leader") == []

    lead.stop()  # the operator restarts the replica it knows holds everything
    lead.settings = dataclasses.replace(lead.settings, allow_unclean=True)
    lead.restart()
    wait_until(lambda: lead.controller.role is Role.LEADER)
    wait_until(settled(nodes, 3))
    assert append(lead, 100) is PutStatus.PUT_OK
