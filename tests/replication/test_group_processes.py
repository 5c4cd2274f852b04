"""A broker group of three commitlog_svc processes on a real etcd, as a user runs it
(`python -m commitlog_svc --group ... --etcd ...`): one leads, the others follow; appends
acknowledged under sync flush and sync replication survive a kill -9 of the leader; another
replica leads within seconds in a new epoch; the killed one comes back as a follower, catches
up, and every replica's segment files are byte-identical."""

from __future__ import annotations

import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from mqstore.client import ClientSettings, Consumer, Producer, SendResult
from mqstore.coordination.etcd_process import EtcdProcess, free_port
from mqstore.launcher import ServiceProcess
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as pb_grpc
from mqstore.testing.cluster import EPHEMERAL
from tests.answers import records_of
from tests.e2e.support import data_files

FILE_BYTES = 64 * 1024  # several segments in a few hundred appends


def start_replica(
    root: Path, name: str, etcd: EtcdProcess, group: str, *, wait: bool = True
) -> ServiceProcess:
    process = ServiceProcess(
        "commitlog_svc",
        str(root / name),
        args=[
            *EPHEMERAL,
            "--flush",
            "sync",
            "--file-bytes",
            str(FILE_BYTES),
            "--group",
            group,
            "--replica-name",
            name,
            "--etcd",
            etcd.endpoint,
            "--min-insync",
            "2",
            "--replica-lag-max-ms",
            "1000",
        ],
        log_path=str(root / f"{name}.log"),
        env={"MQSTORE_TEST_RUN": "1"},
    )
    process.start()
    if wait:
        process.wait_listening()
        process.pin_ports()
    return process


def status(process: ServiceProcess) -> pb.GetStatusResponse | None:
    try:
        with grpc.insecure_channel(process.target) as channel:
            answer: pb.GetStatusResponse = pb_grpc.CommitLogStub(channel).GetStatus(
                pb.GetStatusRequest(), timeout=2
            )
            return answer
    except grpc.RpcError:
        return None


def answered(process: ServiceProcess, timeout_s: float = 30.0) -> pb.GetStatusResponse:
    """Its status, asking again while it does not answer (busy catching up, or just resumed)."""
    deadline = time.monotonic() + timeout_s
    while (answer := status(process)) is None:
        assert time.monotonic() < deadline, f"{process.target} did not answer GetStatus"
        time.sleep(0.05)
    return answer


def wait_until(condition: Callable[[], bool], timeout_s: float = 30.0) -> float:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, "timed out"
        time.sleep(0.02)
    return time.monotonic() - start


def roles(replicas: dict[str, ServiceProcess]) -> dict[str, str]:
    out = {}
    for name, process in replicas.items():
        answer = status(process) if process.running else None
        out[name] = answer.role if answer is not None else "down"
    return out


def leader_name(replicas: dict[str, ServiceProcess]) -> str | None:
    found = [n for n, r in roles(replicas).items() if r == "leader"]
    return found[0] if len(found) == 1 else None


def assert_read_back(
    process: ServiceProcess, results: list[SendResult], bodies: list[bytes]
) -> None:
    """Every acknowledged send stored once, in send order, and read back from `process` with
    its body."""
    offsets = [r.commit_log_offset for r in results]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)  # in order, once
    with grpc.insecure_channel(process.target) as channel:
        read = pb_grpc.CommitLogStub(channel).Read(
            pb.ReadRequest(offsets=offsets, sizes=[r.size for r in results]), timeout=30
        )
    assert list(read.statuses) == [pb.READ_OK] * len(results)
    assert all(body in record for body, record in zip(bodies, records_of(read), strict=True))


def scrape(process: ServiceProcess) -> str:
    url = f"http://127.0.0.1:{process.ports['metrics_port']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as answer:
        return str(answer.read().decode())


def append(process: ServiceProcess, i: int) -> pb.AppendResponse | None:
    request = pb.AppendRequest(
        batches=[pb.MessageBatch(topic="T", queue_ids=[i % 4], bodies=[b"m-%06d" % i])]
    )
    try:
        with grpc.insecure_channel(process.target) as channel:
            answer: pb.AppendResponse = pb_grpc.CommitLogStub(channel).Append(request, timeout=10)
            return answer
    except grpc.RpcError:
        return None


@pytest.fixture
def replicas(tmp_path: Path, etcd: EtcdProcess, group: str) -> Iterator[dict[str, ServiceProcess]]:
    made = {name: start_replica(tmp_path, name, etcd, group) for name in "abc"}
    yield made
    for process in made.values():
        process.signal(signal.SIGCONT)  # a test that paused one and failed before resuming it
        if process.running:
            process.stop()


def test_acknowledged_appends_survive_a_kill_of_the_leader(
    replicas: dict[str, ServiceProcess],
) -> None:
    wait_until(lambda: sorted(roles(replicas).values()) == ["follower", "follower", "leader"])
    first = leader_name(replicas)
    assert first is not None
    acked: dict[int, tuple[int, bytes]] = {}
    for i in range(300):
        answer = append(replicas[first], i)
        assert answer is not None and answer.statuses == [pb.PUT_OK], answer
        acked[answer.commit_log_offsets[0]] = (answer.sizes[0], b"m-%06d" % i)
    epoch = answered(replicas[first]).history.epochs[-1]
    # the metrics say who leads, in which epoch, and the set (scraped as Prometheus would)
    wait_until(lambda: "mqstore_replica_in_sync_size 3.0" in scrape(replicas[first]))
    lead_metrics = scrape(replicas[first])
    assert 'mqstore_replica_role{role="leader"} 1.0' in lead_metrics
    assert f"mqstore_replica_epoch {float(epoch)}" in lead_metrics
    follower = next(p for n, p in replicas.items() if n != first)
    assert 'mqstore_replica_role{role="follower"} 1.0' in scrape(follower)
    killed_at = time.monotonic()
    replicas[first].kill()
    survivors = {n: p for n, p in replicas.items() if n != first}
    wait_until(lambda: leader_name(survivors) is not None)
    second = leader_name(survivors)
    assert second is not None
    while (answer := append(replicas[second], 1_000)) is None or answer.statuses != [pb.PUT_OK]:
        assert time.monotonic() - killed_at < 30, answer
        time.sleep(0.02)
    failover_s = time.monotonic() - killed_at
    print(f"failover: {failover_s:.2f} s from the kill to the first acknowledged append")
    new_status = status(replicas[second])
    assert new_status is not None and new_status.history.epochs[-1] > epoch
    # every acknowledged append is on the new leader
    offsets = sorted(acked)
    with grpc.insecure_channel(replicas[second].target) as channel:
        read = pb_grpc.CommitLogStub(channel).Read(
            pb.ReadRequest(offsets=offsets, sizes=[acked[o][0] for o in offsets]), timeout=20
        )
    assert list(read.statuses) == [pb.READ_OK] * len(offsets)
    assert all(acked[o][1] in r for o, r in zip(offsets, records_of(read), strict=True))
    # the killed replica comes back as a follower and catches up to byte-identity
    replicas[first].start()
    replicas[first].wait_listening()
    wait_until(lambda: roles(replicas)[first] == "follower")
    end = answered(replicas[second]).max_offset
    wait_until(lambda: all(answered(p).max_offset == end for p in replicas.values()))
    files = [data_files(str(Path(p.data_dir) / "commitlog")) for p in replicas.values()]
    assert files[0] == files[1] == files[2]


def test_the_sdk_producer_follows_the_leader_through_a_kill_and_loses_nothing(
    replicas: dict[str, ServiceProcess],
) -> None:
    """`MQSTORE_COMMITLOG=a,b,c`: the producer finds the leader, and after a kill -9 of it
    finds the next one; every send resolves acknowledged, none twice, all on the new leader."""
    wait_until(lambda: sorted(roles(replicas).values()) == ["follower", "follower", "leader"])
    first = leader_name(replicas)
    assert first is not None
    addresses = ",".join(p.target for p in replicas.values())
    settings = ClientSettings(commitlog=addresses, cq=(), index=())
    # batches of 100 (a 64 KiB segment holds a whole request)
    with Producer(settings, linger_ms=1, retry_timeout_s=30, batch_messages=100) as producer:
        futures = [producer.send("T", b"before-%05d" % i) for i in range(500)]
        producer.flush()
        replicas[first].kill()
        futures += [producer.send("T", b"after-%05d" % i) for i in range(500)]
        producer.flush()
        results = [f.result(timeout=60) for f in futures]
    second = leader_name({n: p for n, p in replicas.items() if n != first})
    assert second is not None
    bodies = [b"before-%05d" % i for i in range(500)] + [b"after-%05d" % i for i in range(500)]
    assert_read_back(replicas[second], results, bodies)


def test_cq_svc_follows_the_leader_through_a_kill_and_holds_every_acknowledged_message(
    replicas: dict[str, ServiceProcess], tmp_path: Path
) -> None:
    """cq_svc given every replica (`--commitlog-target a,b,c`) subscribes to the leader, and
    to the next one after a kill -9: a consumer then reads every acknowledged message once, in
    queue order."""
    wait_until(lambda: sorted(roles(replicas).values()) == ["follower", "follower", "leader"])
    first = leader_name(replicas)
    assert first is not None
    addresses = ",".join(p.target for p in replicas.values())
    cq = ServiceProcess(
        "cq_svc",
        str(tmp_path / "cq"),
        args=[*EPHEMERAL, "--commitlog-target", addresses, "--subscriber-id", "cq"],
        log_path=str(tmp_path / "cq.log"),
        env={"MQSTORE_TEST_RUN": "1"},
    )
    cq.start()
    try:
        cq.wait_listening()
        cq.wait_ready()
        settings = ClientSettings(commitlog=addresses, cq=(cq.target,), index=())
        with Producer(settings, linger_ms=1, retry_timeout_s=30, batch_messages=100) as producer:
            sent = [producer.send("T", b"before-%05d" % i) for i in range(300)]
            producer.flush()
            replicas[first].kill()
            sent += [producer.send("T", b"after-%05d" % i) for i in range(300)]
            producer.flush()
            acked = {f.result(timeout=60).msg_id: f for f in sent}
        assert len(acked) == 600
        expected = {b"before-%05d" % i for i in range(300)} | {
            b"after-%05d" % i for i in range(300)
        }
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < len(expected) and time.monotonic() < deadline:
            with Consumer(settings, "T", start="earliest") as consumer:
                got = [m.body for m in consumer.messages(follow=False)]
            time.sleep(0.2)
        assert sorted(got) == sorted(expected)  # each once
    finally:
        cq.stop()


def test_a_paused_leader_acknowledges_nothing_more_and_comes_back_a_follower(
    replicas: dict[str, ServiceProcess],
) -> None:
    """SIGSTOP of the leader past its lease TTL: another leads; after SIGCONT the old one
    answers no append (its fencing deadline passed), steps down and follows the new leader."""
    wait_until(lambda: sorted(roles(replicas).values()) == ["follower", "follower", "leader"])
    first = leader_name(replicas)
    assert first is not None
    for i in range(50):
        answer = append(replicas[first], i)
        assert answer is not None and answer.statuses == [pb.PUT_OK], answer
    replicas[first].signal(signal.SIGSTOP)
    try:
        survivors = {n: p for n, p in replicas.items() if n != first}
        wait_until(lambda: leader_name(survivors) is not None)
        second = leader_name(survivors)
        assert second is not None
        answer = append(replicas[second], 100)
        assert answer is not None and answer.statuses == [pb.PUT_OK], answer
    finally:
        replicas[first].signal(signal.SIGCONT)
    # woken, the old leader takes no append as leader: refused, or it already follows
    late = append(replicas[first], 200)
    assert late is None or late.statuses != [pb.PUT_OK], late
    wait_until(lambda: roles(replicas)[first] == "follower")
    end = answered(replicas[second]).max_offset
    wait_until(lambda: answered(replicas[first]).max_offset == end)
    assert answered(replicas[first]).history == answered(replicas[second]).history


def test_a_replica_started_before_etcd_waits_for_it_and_leads(tmp_path: Path, group: str) -> None:
    """On a first install etcd and the replicas start together: a replica that finds etcd not
    answering yet keeps asking (commitlog_svc/main.py JOIN_WAIT_S) instead of exiting."""
    etcd = EtcdProcess(
        data_dir=str(tmp_path / "etcd"),
        client_port=free_port(),
        peer_port=free_port(),
        unsafe_no_fsync=True,
    )
    replica = start_replica(tmp_path, "a", etcd, group, wait=False)
    try:
        log = tmp_path / "a.log"
        waiting = "does not answer yet"
        wait_until(lambda: not replica.running or (log.exists() and waiting in log.read_text()))
        assert replica.running, "the replica exited while etcd was not answering"
        etcd.start()
        replica.wait_listening()
        wait_until(lambda: (status(replica) or pb.GetStatusResponse()).role == "leader")
    finally:
        replica.stop()
        etcd.stop()
