"""Issue 23, item 4: slow readers of server streams are bounded.

Rule: 200 Follow streams whose readers take one answer a second keep cq_svc's anonymous memory
under 256 MiB, and the other callers' Pulls are answered meanwhile: at most follow_streams_max
Follow streams run at once (the rest are refused RESOURCE_EXHAUSTED at once and counted), each
holding one answer of at most stream_answer_bytes_max, and the threads they hold leave the pool
free for unary calls. Before: each stream held a Follow round of every queue (4 MiB here) and
a thread, and the Pulls waited seconds behind them.

Real commitlog_svc and cq_svc processes; the slow readers in a process of their own. Latency is
printed (`-s`), not asserted: the figures for docs/cq.md come from the long form,
MQSTORE_SLOW_READERS_S=60.
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cq_svc.settings import CqSettings
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as cq
from mqstore.testing.cluster import Cluster
from tests.e2e.slow_readers import SlowReaders, probe_pulls, wait_for_queues

pytestmark = pytest.mark.timeout(600)

STREAMS = 200
ANON_BYTES_MAX = 256 << 20  # the bound
QUEUES = 4
# 4 queues of 4,096 messages of 1 KiB: a Follow round of max_messages 1,024 asked 4 MiB before.
MESSAGES_PER_QUEUE = 4_096
BODY = b"s" * 1_024
SECONDS = float(os.environ.get("MQSTORE_SLOW_READERS_S", "6"))
BASELINE_S = min(SECONDS / 2, 10.0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("slow-readers"), flush="async")
    try:
        c.start_commitlog()
        c.add("cq_svc", "cq")
        c.start("cq")
        log = c.commitlog_stub()
        for _ in range(MESSAGES_PER_QUEUE // 512):
            queue_ids = [q for q in range(QUEUES) for _ in range(512)]
            batch = cl.MessageBatch(
                topic="slow", queue_ids=queue_ids, bodies=[BODY] * len(queue_ids)
            )
            log.Append(cl.AppendRequest(batches=[batch]), timeout=30)
        probe = cl.MessageBatch(topic="probe", queue_ids=[0] * 32, bodies=[b"p" * 100] * 32)
        log.Append(cl.AppendRequest(batches=[probe]), timeout=30)
        stub = c.cq_stub("cq")
        wait_for_queues(stub, "slow", range(QUEUES), MESSAGES_PER_QUEUE)
        wait_for_queues(stub, "probe", [0], 32)
        yield c
    finally:
        c.stop_all()


def scrape(c: Cluster) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    url = f"http://127.0.0.1:{c.followers['cq'].ports['metrics_port']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def follow_metric(c: Cluster, name: str) -> float:
    return sum(
        v
        for (n, labels), v in scrape(c).items()
        if n == name and ("grpc_method", "Follow") in labels
    )


def test_slow_follow_readers_keep_memory_bounded_and_pulls_answered(cluster: Cluster) -> None:
    process = cluster.followers["cq"]
    assert process.proc is not None
    pid = process.proc.pid
    stub = cluster.cq_stub("cq")
    pull = cq.PullRequest(topic="probe", queue_id=0, offset=0, max_messages=32)
    baseline = probe_pulls(stub, pull, BASELINE_S, pid)
    print(baseline.figures("baseline, no slow readers"))
    refused_before = follow_metric(cluster, "mqstore_rpc_streams_refused_total")
    with SlowReaders(process.target, "slow", QUEUES, STREAMS):
        loaded = probe_pulls(stub, pull, SECONDS, pid)
        open_streams = follow_metric(cluster, "mqstore_rpc_streams_open")
    print(loaded.figures(f"{STREAMS} slow Follow readers, {SECONDS:.0f} s"))
    assert loaded.peak_anon < ANON_BYTES_MAX, loaded.figures("loaded")
    assert loaded.latencies_s and not loaded.failures, loaded.figures("loaded")
    # The cap held, and it is what turned the other readers away.
    assert 1 <= open_streams <= CqSettings.load([]).follow_streams_max  # cq_svc's default
    assert follow_metric(cluster, "mqstore_rpc_streams_refused_total") > refused_before
