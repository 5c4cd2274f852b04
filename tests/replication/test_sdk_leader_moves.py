"""The SDK producer follows its group's leader when the old one goes silent without closing
anything: paused (SIGSTOP, a long GC or I/O stall) or cut off the network. Its connection stays
open and no answer comes; the group elects another leader within the lease TTL. Found by
`make chaos REPLICAS=3`: the producers waited for their request timeout (10 s) or for the old
leader to wake, so a paused leader's failover took as long as the pause."""

from __future__ import annotations

import signal

import grpc

from mqstore.client import ClientSettings, Producer
from mqstore.launcher import ServiceProcess
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as pb_grpc
from tests.replication.test_group_processes import leader_name, replicas, roles, wait_until

# Far above the failover (an election takes ~2.5 s with a 2 s lease): without looking for the
# leader, the producer would wait this long for the paused one.
REQUEST_TIMEOUT_S = 120.0
ACK_WAIT_S = 40.0  # every send acknowledged within this, the old leader still paused

__all__ = ["replicas"]  # the group's fixture, shared with test_group_processes


def test_the_producer_leaves_a_paused_leader_for_the_one_elected_meanwhile(
    replicas: dict[str, ServiceProcess],
) -> None:
    wait_until(lambda: sorted(roles(replicas).values()) == ["follower", "follower", "leader"])
    first = leader_name(replicas)
    assert first is not None
    settings = ClientSettings(commitlog=",".join(p.target for p in replicas.values()))
    producer = Producer(
        settings,
        linger_ms=1,
        batch_messages=50,
        request_timeout_s=REQUEST_TIMEOUT_S,
        retry_timeout_s=REQUEST_TIMEOUT_S,
    )
    try:
        before = [producer.send("T", b"before-%04d" % i) for i in range(200)]
        producer.flush()
        replicas[first].signal(signal.SIGSTOP)
        try:
            after = [producer.send("T", b"after-%04d" % i) for i in range(200)]
            # Acknowledged while the old leader sleeps: by another replica.
            results = [f.result(timeout=ACK_WAIT_S) for f in before + after]
            survivors = {n: p for n, p in replicas.items() if n != first}
            second = leader_name(survivors)
            assert second is not None
            assert producer.stats.leader_moves >= 1
        finally:
            replicas[first].signal(signal.SIGCONT)
    finally:
        producer.close(30)
    offsets = [r.commit_log_offset for r in results]
    assert len(set(offsets)) == len(offsets)  # none stored twice
    with grpc.insecure_channel(replicas[second].target) as channel:
        read = pb_grpc.CommitLogStub(channel).Read(
            pb.ReadRequest(offsets=offsets, sizes=[r.size for r in results]), timeout=30
        )
    assert list(read.statuses) == [pb.READ_OK] * len(results)
    bodies = [b"before-%04d" % i for i in range(200)] + [b"after-%04d" % i for i in range(200)]
    assert all(body in record for body, record in zip(bodies, read.records, strict=True))
