"""Agreement through crashes: kill -9 each service in turn (and all three) while producers
append, restart, and check that the consume queues and the index answer exactly what a
from-scratch replay of the log answers, and that every acknowledged append is there."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from mqstore.testing.cluster import Cluster

from .support import Sent, append, eventually, key_snapshot, queue_snapshot

pytestmark = pytest.mark.timeout(300)

TOPICS = ["t1", "t2"]
QUEUES = 4
KEYS = [f"key-{i}" for i in range(12)]


class Load:
    """Producers appending small batches until stopped; remembers what was acknowledged."""

    def __init__(self, cluster: Cluster, seed: int) -> None:
        self.cluster = cluster
        self.rng = random.Random(seed)
        self.acked: list[Sent] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            topic = self.rng.choice(TOPICS)
            size = self.rng.randint(1, 20)
            queues = [self.rng.randrange(QUEUES) for _ in range(size)]
            keys = [self.rng.choice(KEYS) for _ in range(size)]
            bodies = [f"{topic}-{n + i}".encode() for i in range(size)]
            n += size
            try:
                self.acked += append(
                    self.cluster.commitlog_stub(), topic, queues, bodies, keys=keys
                )
            except (grpc.RpcError, AssertionError):
                self.errors += 1  # the commit log is down: not acknowledged
                self._stop.wait(0.05)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, flush="sync")
    try:
        c.start_commitlog()
        c.add("cq_svc", "cq")
        c.add("index_svc", "index")
        c.start_many("cq", "index")
        yield c
    finally:
        c.stop_all()


def _settle(load: Load, count: int = 200) -> None:
    start = len(load.acked)
    eventually(lambda: len(load.acked) >= start + count, timeout_s=60)


def _assert_agrees_with_a_fresh_replay(cluster: Cluster, acked: list[Sent]) -> None:
    fresh_cq = cluster.add("cq_svc", "cq-fresh")
    fresh_index = cluster.add("index_svc", "index-fresh")
    cluster.start_many("cq-fresh", "index-fresh")
    expected_per_queue: dict[tuple[str, int], list[tuple[int, int, bytes]]] = {}
    for s in acked:
        expected_per_queue.setdefault((s.topic, s.queue_id), []).append(
            (s.queue_offset, s.commit_log_offset, s.body)
        )

    def queues_caught_up(name: str) -> bool:
        snap = queue_snapshot(cluster.cq_stub(name), TOPICS)
        return all(
            {e[:2] for e in expected} <= {e[:2] for e in snap.get(key, [])}
            for key, expected in expected_per_queue.items()
        )

    eventually(lambda: queues_caught_up("cq"), timeout_s=60)
    eventually(lambda: queues_caught_up("cq-fresh"), timeout_s=60)
    recovered = queue_snapshot(cluster.cq_stub("cq"), TOPICS)
    rebuilt = queue_snapshot(cluster.cq_stub("cq-fresh"), TOPICS)
    assert recovered == rebuilt
    # Every acknowledged append is there once, at its offsets, with its bytes.
    for key, expected in expected_per_queue.items():
        assert set(expected) <= set(recovered[key]), key
    for key, entries in recovered.items():
        offsets = [qo for qo, _, _ in entries]
        assert offsets == list(range(len(offsets))), f"queue offsets of {key} are not dense"
        bodies = [body for _, _, body in entries]
        assert len(bodies) == len(set(bodies)), f"a message of {key} is there twice"

    def index_caught_up(name: str) -> bool:
        found = key_snapshot(cluster.index_stub(name), "t1", KEYS[:3])
        return all(
            {s.commit_log_offset for s in acked if s.topic == "t1" and s.key == k} <= set(v)
            for k, v in found.items()
        )

    eventually(lambda: index_caught_up("index"), timeout_s=60)
    eventually(lambda: index_caught_up("index-fresh"), timeout_s=60)
    for topic in TOPICS:
        assert key_snapshot(cluster.index_stub("index"), topic, KEYS) == key_snapshot(
            cluster.index_stub("index-fresh"), topic, KEYS
        )
    fresh_cq.stop()
    fresh_index.stop()


def test_kill_each_service_in_turn_then_all_three(cluster: Cluster) -> None:
    with Load(cluster, seed=5) as load:
        _settle(load)
        for name in ("cq", "index"):
            cluster.followers[name].kill()
            _settle(load)
            cluster.start(name, ready=False)
            _settle(load)
        cluster.commitlog.kill()
        cluster.restart_commitlog()
        _settle(load)
        for process in (*cluster.followers.values(), cluster.commitlog):
            process.kill()
        cluster.restart_commitlog()
        for name in ("cq", "index"):
            cluster.start(name, ready=False)
        _settle(load)
    assert load.errors >= 1  # the load really ran into the outages
    _assert_agrees_with_a_fresh_replay(cluster, load.acked)
