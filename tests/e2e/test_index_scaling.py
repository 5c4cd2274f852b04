"""The index tier scaling on its own, as Kubernetes runs it, with real processes on loopback.

commitlog_svc, cq_svc and four index_svc replicas named like StatefulSet pods (index-0 ..
index-3) with `--shard-count 2 --shard-from-ordinal true`: pod index-N serves shard N % 2, so
two shards of two replicas each. While a producer keeps sending keyed messages, a fifth pod
(index-4, so a third replica of shard 0) starts empty, replays the log, and turns ready. Then:

- each shard answers its own keys and sends the other shard's away (FAILED_PRECONDITION);
- the SDK's Admin, given every replica's address, finds every key;
- the new replica holds every shard-0 key, those sent before it existed too (replay);
- with replicas killed (kill -9), their peers keep answering through the same Admin: shard 1
  on its surviving replica, shard 0 on the new one alone once its two first replicas are gone.

Nothing else changes meanwhile: the commit log and cq_svc are never restarted or reconfigured.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from mqstore.client import Admin, ClientSettings, Producer
from mqstore.launcher import health_status
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl_pb
from mqstore.rpc.gen.index.v1 import index_pb2 as ix_pb
from mqstore.sharding import shard_of
from mqstore.testing.cluster import SMALL_INDEX_ARGS, Cluster

pytestmark = pytest.mark.slow

TOPIC = "Scaled"
SHARDS = 2
FIRST_REPLICAS = 4
INDEX_ARGS = (*SMALL_INDEX_ARGS, "--shard-count", str(SHARDS), "--shard-from-ordinal", "true")
# The producer: small batches at a steady pace, so that messages keep arriving while the fifth
# replica replays, and the whole run stays a few thousand keys (every one is queried).
BATCH_MESSAGES = 40
BATCH_PAUSE_S = 0.02
KEYS_MAX = 6_000
# After the new replica is ready, keep producing this long: keys it must index while tailing.
PRODUCE_AFTER_READY_S = 0.5
CATCH_UP_TIMEOUT_S = 60.0
SERVING = 1  # grpc.health.v1 HealthCheckResponse.SERVING


class KeyedProducer:
    """Sends `key-<n>` messages (body = the key) until stopped; records every key sent."""

    def __init__(self, settings: ClientSettings) -> None:
        self.keys: list[str] = []
        # Settings, not a Connection: the producer's own connection closes with it.
        self._producer = Producer(settings, producer_id="scaling-test")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="keyed-producer", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set() and len(self.keys) < KEYS_MAX:
                batch = [f"key-{len(self.keys) + i}" for i in range(BATCH_MESSAGES)]
                futures = [self._producer.send(TOPIC, k.encode(), key=k) for k in batch]
                for f in futures:
                    f.result(timeout=30)
                self.keys.extend(batch)
                time.sleep(BATCH_PAUSE_S)
        except BaseException as err:  # surfaced by stop()
            self.error = err

    def count(self) -> int:
        return len(self.keys)

    def stop(self) -> list[str]:
        self._stop.set()
        self._thread.join(timeout=60)
        self._producer.close()
        if self.error is not None:
            raise self.error
        assert not self._thread.is_alive()
        return list(self.keys)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        c.start_commitlog()
        c.add("cq_svc", "cq")
        c.start("cq", ready=False)
        for n in range(FIRST_REPLICAS):
            c.add("index_svc", f"index-{n}", *INDEX_ARGS)
            c.start(f"index-{n}", ready=False)  # all four start at once, as Parallel pods do
        for name in ("cq", *(f"index-{n}" for n in range(FIRST_REPLICAS))):
            c.followers[name].wait_ready()
        yield c
    finally:
        c.stop_all()


def _index_status(c: Cluster, name: str) -> ix_pb.GetStatusResponse:
    return c.index_stub(name).GetStatus(ix_pb.GetStatusRequest(), timeout=5)


def _log_end(c: Cluster) -> int:
    return int(c.commitlog_stub().GetStatus(cl_pb.GetStatusRequest(), timeout=5).max_offset)


def _wait_applied(c: Cluster, names: list[str], offset: int) -> None:
    deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
    for name in names:
        while _index_status(c, name).applied_offset < offset:
            assert time.monotonic() < deadline, f"{name} did not apply up to {offset}"
            time.sleep(0.05)


def _query(c: Cluster, name: str, key: str) -> list[bytes]:
    response = c.index_stub(name).QueryByKey(
        ix_pb.QueryByKeyRequest(topic=TOPIC, key=key, max_messages=4), timeout=10
    )
    return [m.body for m in response.messages]


def test_the_index_tier_scales_by_replicas_and_shards_alone(cluster: Cluster) -> None:
    c = cluster
    first = [f"index-{n}" for n in range(FIRST_REPLICAS)]
    for n, name in enumerate(first):
        status = _index_status(c, name)
        assert (status.shard_count, status.shard_index) == (SHARDS, n % SHARDS)

    settings = ClientSettings(
        commitlog=c.commitlog.target,
        cq=(c.followers["cq"].target,),
        index=tuple(c.followers[n].target for n in first),
    )
    producer = KeyedProducer(settings)
    producer.start()
    while producer.count() < 400:  # some history before the new replica exists
        time.sleep(0.02)

    # -- a fifth replica, added while producing ---------------------------------------------
    keys_before_new = producer.count()
    c.add("index_svc", "index-4", *INDEX_ARGS)
    new = c.start("index-4", ready=False)
    end_at_start = _log_end(c)
    new.wait_ready()  # readiness: recovered, handshake done, and caught up to the log's end
    ready_status = _index_status(c, "index-4")
    assert (ready_status.shard_count, ready_status.shard_index) == (SHARDS, 4 % SHARDS)
    assert ready_status.caught_up
    assert ready_status.applied_offset >= end_at_start
    keys_at_ready = producer.count()
    time.sleep(PRODUCE_AFTER_READY_S)
    keys = producer.stop()
    assert keys_before_new >= 400 and len(keys) > keys_at_ready, "production spanned the scaling"

    everyone = [*first, "index-4"]
    _wait_applied(c, everyone, _log_end(c))
    owner = {k: shard_of(TOPIC, k, SHARDS) for k in keys}
    assert set(owner.values()) == {0, 1}

    # -- each shard answers only its keys ----------------------------------------------------
    sample = keys[:: max(1, len(keys) // 50)]
    for name in everyone:
        shard = _index_status(c, name).shard_index
        for key in sample:
            if owner[key] == shard:
                assert _query(c, name, key) == [key.encode()], (name, key)
                continue
            with pytest.raises(grpc.RpcError) as info:
                _query(c, name, key)
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert f"shard {owner[key]} of {SHARDS}" in (info.value.details() or "")

    # -- the new replica replayed the history it never saw ----------------------------------
    for key in keys[:keys_before_new]:
        if owner[key] == 0:
            assert _query(c, "index-4", key) == [key.encode()], key

    # -- the client finds every key, through whichever replica of its shard -----------------
    settings = ClientSettings(
        commitlog=c.commitlog.target,
        cq=(c.followers["cq"].target,),
        index=tuple(c.followers[n].target for n in everyone),
    )
    with Admin(settings) as admin:
        for key in keys:
            found = admin.query_by_key(TOPIC, key)
            assert [m.body for m in found] == [key.encode()], key

        # -- a killed replica's peer keeps serving ------------------------------------------
        c.followers["index-1"].kill()  # shard 1 is left with index-3
        c.followers["index-0"].kill()  # shard 0 is left with index-2 and the new index-4
        c.followers["index-2"].kill()  # ... and then with index-4 alone
        assert health_status(c.followers["index-3"].health_target, "readiness") == SERVING
        for key in keys:
            found = admin.query_by_key(TOPIC, key)
            assert [m.body for m in found] == [key.encode()], key
        shards = {r.shard_index for r in admin.status().index if r.reachable}
        assert shards == {0, 1}
        reachable = sorted(r.address for r in admin.status().index if r.reachable)
        assert reachable == sorted(c.followers[n].target for n in ("index-3", "index-4"))
