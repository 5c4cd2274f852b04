"""The SDK producer follows its group's leader when the old one goes silent without closing
anything: paused (SIGSTOP, a long GC or I/O stall) or cut off the network. Its connection stays
open and no answer comes; the group elects another leader within the lease TTL. Found by
`make chaos REPLICAS=3`: the producers waited for their request timeout (10 s) or for the old
leader to wake, so a paused leader's failover took as long as the pause."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from mqstore.client import ClientSettings, Producer
from mqstore.coordination.etcd_process import EtcdProcess
from mqstore.launcher import ServiceProcess
from tests.replication.test_group_processes import (
    assert_read_back,
    leader_name,
    replicas,
    roles,
    scrape,
    start_replica,
    wait_until,
)

# Far above the failover (an election takes ~2.5 s with a 2 s lease): without looking for the
# leader, the producer would wait this long for the paused one.
REQUEST_TIMEOUT_S = 120.0
ACK_WAIT_S = 40.0  # every send acknowledged within this, the old leader still paused
# How long the leader stays alone while the sends wait, and how long they may wait in all.
ALONE_S = 2.0
ALONE_RETRY_S = 60.0

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
    bodies = [b"before-%04d" % i for i in range(200)] + [b"after-%04d" % i for i in range(200)]
    assert_read_back(replicas[second], results, bodies)


def test_sends_wait_for_the_in_sync_set_to_grow_again_instead_of_failing(
    replicas: dict[str, ServiceProcess], tmp_path: Path, etcd: EtcdProcess, group: str
) -> None:
    """Both followers lost: the leader's in-sync set is {itself}, under min in-sync 2, and it
    takes no append. The producer's sends wait (retried within retry_timeout_s) rather than
    fail, and are acknowledged once a follower is back in sync: each once, in send order.
    Before, every message was failed at once with SLAVE_NOT_AVAILABLE; a new leader briefly
    alone in its set after a failover made producers fail sends the same way."""
    wait_until(lambda: sorted(roles(replicas).values()) == ["follower", "follower", "leader"])
    first = leader_name(replicas)
    assert first is not None
    settings = ClientSettings(commitlog=",".join(p.target for p in replicas.values()))
    producer = Producer(settings, linger_ms=1, batch_messages=20, retry_timeout_s=ALONE_RETRY_S)
    try:
        before = [producer.send("T", b"before-%03d" % i) for i in range(100)]
        producer.flush()
        followers = [n for n in replicas if n != first]
        for name in followers:
            replicas[name].kill()
        wait_until(lambda: "mqstore_replica_in_sync_size 1.0" in scrape(replicas[first]))
        alone = [producer.send("T", b"alone-%03d" % i) for i in range(100)]
        time.sleep(ALONE_S)  # the leader refuses every attempt meanwhile
        assert not any(f.done() for f in alone), [f.exception() for f in alone if f.done()]
        assert producer.stats.leader_moves == 0  # the leader did not move: it was retried
        back = followers[0]
        replicas[back] = start_replica(tmp_path, back, etcd, group)
        results = [f.result(timeout=ALONE_RETRY_S) for f in before + alone]
    finally:
        producer.close(30)
    bodies = [b"before-%03d" % i for i in range(100)] + [b"alone-%03d" % i for i in range(100)]
    assert_read_back(replicas[first], results, bodies)


def test_a_producer_made_after_the_leader_died_waits_for_the_election(
    replicas: dict[str, ServiceProcess],
) -> None:
    """A new client of a group whose leader was just killed, listed first: its first stream is
    refused, but the other replicas answer (its leader probes; NotLeader on a stream until one
    is elected), so the kill is an outage ridden out within retry_timeout_s, not a store never
    reached that connect_timeout_s (here far below the ~2.5 s election) would end."""
    wait_until(lambda: sorted(roles(replicas).values()) == ["follower", "follower", "leader"])
    first = leader_name(replicas)
    assert first is not None
    order = [first, *(n for n in replicas if n != first)]
    settings = ClientSettings(
        commitlog=",".join(replicas[n].target for n in order), connect_timeout_s=0.2
    )
    replicas[first].kill()
    with Producer(settings, linger_ms=1, retry_timeout_s=ALONE_RETRY_S) as producer:
        result = producer.send("T", b"after the kill").result(timeout=ACK_WAIT_S)
    second = leader_name({n: p for n, p in replicas.items() if n != first})
    assert second is not None
    assert_read_back(replicas[second], [result], [b"after the kill"])
