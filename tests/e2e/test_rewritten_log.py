"""A log that recovery cut and appends regrew past where the followers were (issue 23, item 1),
step by step as it was reported, with the three services as real processes:

1. produce (async flush); the followers apply and confirm everything; SIGSTOP them;
2. kill -9 commitlog_svc; zero the last 300 bytes of written data in the newest segment;
3. restart commitlog_svc: recovery cuts the log; 200 more messages, acknowledged, regrow it
   past where it was cut and past what the followers confirmed;
4. SIGCONT the followers.

Before the log had a history, the followers' confirmed offsets still lay inside the regrown
log, so their handshakes saw nothing wrong: cq_svc kept units of the old tail (answering
DATA_LOSS) and both lost acknowledged messages appended after the restart. Now cq_svc holds
exactly the log's messages (every one of the 200 among them) and index_svc finds each of the
200 by key and none of the cut ones. (tests/e2e/test_history_simulation.py compares both with
a from-scratch replay after random cuts, regrowth, pauses and reconnects.)
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl
from mqstore.testing.cluster import SMALL_INDEX_ARGS, Cluster

from .support import Sent, append, eventually, key_snapshot, queue_snapshot

pytestmark = pytest.mark.timeout(300)

TOPIC = "orders"
QUEUES = 4
ZEROED_BYTES = 300
REGROW_MESSAGES = 200
# Followers confirm within a fraction of a second, so that they confirm past the cut.
FAST_CONFIRMS = {
    "cq_svc": ["--flush-thorough-interval-ms", "100"],
    "index_svc": ["--flush-interval-ms", "100"],
}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, flush="async", extra=FAST_CONFIRMS)
    try:
        c.start_commitlog()
        c.add("cq_svc", "cq")
        c.add("index_svc", "index", *SMALL_INDEX_ARGS)
        c.start("cq")
        c.start("index")
        yield c
    finally:
        for process in c.followers.values():
            process.signal(signal.SIGCONT)
        c.stop_all()


def produce(cluster: Cluster, first: int, count: int) -> list[Sent]:
    sent: list[Sent] = []
    for start in range(first, first + count, 20):
        n = min(20, first + count - start)
        sent += append(
            cluster.commitlog_stub(),
            TOPIC,
            [i % QUEUES for i in range(start, start + n)],
            [b"message-%06d" % i for i in range(start, start + n)],
            keys=[f"k{i}" for i in range(start, start + n)],
        )
    return sent


def status(cluster: Cluster) -> cl.GetStatusResponse:
    response: cl.GetStatusResponse = cluster.commitlog_stub().GetStatus(
        cl.GetStatusRequest(), timeout=10
    )
    return response


def zero_the_tail(data_dir: str, end: int, nbytes: int) -> None:
    segments = os.path.join(data_dir, "commitlog")
    newest = max(os.listdir(segments))
    with open(os.path.join(segments, newest), "r+b") as f:
        f.seek(end - int(newest) - nbytes)
        f.write(bytes(nbytes))


def test_followers_of_a_log_cut_and_regrown_past_them_lose_nothing_and_keep_nothing_stale(
    cluster: Cluster,
) -> None:
    before = produce(cluster, 0, 600)
    end = status(cluster).max_offset
    eventually(
        lambda: (
            {s.subscriber_id: s.confirmed_offset for s in status(cluster).subscribers}
            == {"cq": end, "index": end}
        ),
        timeout_s=60,
    )
    for process in cluster.followers.values():
        process.signal(signal.SIGSTOP)

    cluster.commitlog.kill()
    zero_the_tail(cluster.commitlog.data_dir, end, ZEROED_BYTES)
    cluster.restart_commitlog()
    cut = status(cluster).max_offset
    assert cut <= end - ZEROED_BYTES, "recovery cut the zeroed tail"
    after = produce(cluster, 10_000, REGROW_MESSAGES)
    assert status(cluster).max_offset > end, "the log regrew past what the followers confirmed"

    for process in cluster.followers.values():
        process.signal(signal.SIGCONT)

    kept = [s for s in before if s.commit_log_offset < cut]
    acked = kept + after
    expected = {(s.queue_id, s.queue_offset, s.commit_log_offset, s.body) for s in acked}

    def cq_holds_exactly_the_log() -> bool:
        try:
            got = queue_snapshot(cluster.cq_stub("cq"), [TOPIC])
        except grpc.RpcError as err:
            # Until cq_svc's handshake with the restarted log its units of the cut tail are
            # stale: a pull that meets one is told to come back, never DATA_LOSS.
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                return False
            raise
        held = {(q, qo, o, b) for (_, q), entries in got.items() for qo, o, b in entries}
        return held == expected

    eventually(cq_holds_exactly_the_log, timeout_s=60)
    keys = [s.key for s in after]
    eventually(
        lambda: (
            key_snapshot(cluster.index_stub("index"), TOPIC, keys)
            == {s.key: [s.commit_log_offset] for s in after}
        ),
        timeout_s=60,
    )
    # What the cut took is gone from both: no stale unit, no key found in the old tail.
    lost = [s for s in before if s.commit_log_offset >= cut]
    assert lost, "the zeroed tail held messages"
    assert key_snapshot(cluster.index_stub("index"), TOPIC, [s.key for s in lost]) == {
        s.key: [] for s in lost
    }
