"""Health on its own port (startup, readiness, liveness), graceful shutdown, a failed flush."""

from __future__ import annotations

import errno
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from commitlog_svc.main import CommitLogService
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.storage.simdisk import SimDisk
from tests.commitlog_svc.support import (
    NOT_SERVING,
    SERVING,
    Running,
    batch,
    health,
    settings_for,
    subscribe,
    wait_until,
)


def test_startup_and_readiness_turn_serving_only_once_the_store_is_open(tmp_path: Path) -> None:
    service = CommitLogService(settings_for(tmp_path / "log"))
    service.start_health()
    try:
        target = f"127.0.0.1:{service.host.health_port}"
        assert health(target, "startup") == NOT_SERVING  # recovery would run now
        assert health(target, "readiness") == NOT_SERVING
        assert health(target, "liveness") == SERVING
        service.start()
        assert health(target, "startup") == SERVING
        wait_until(lambda: health(target, "readiness") == SERVING, "readiness")
        assert health(target, "liveness") == SERVING
        assert health(target, "") == SERVING
    finally:
        service.stop()


class Watch:
    """Every status a Watch on the health port reports, collected on a thread."""

    def __init__(self, target: str, service: str) -> None:
        self.channel = grpc.insecure_channel(target)
        self.call = health_pb2_grpc.HealthStub(self.channel).Watch(
            health_pb2.HealthCheckRequest(service=service)
        )
        self.seen: list[int] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for response in self.call:
                self.seen.append(int(response.status))
        except grpc.RpcError:
            pass

    def close(self) -> None:
        self.call.cancel()
        self.thread.join(10)
        self.channel.close()


def test_a_graceful_stop_reports_not_serving_ends_streams_and_closes_cleanly(
    start: Callable[..., Running],
) -> None:
    svc = start(flush="sync", drain_delay_s=0.3)
    svc.append_ok(batch(0, 10))
    wait_until(lambda: health(svc.health_target, "readiness") == SERVING, "readiness")
    watch = Watch(svc.health_target, "readiness")
    wait_until(lambda: watch.seen == [SERVING], "the watch")
    reader = subscribe(svc, "s")
    reader.wait_reaching(svc.status().max_offset)

    outbox: queue.Queue[pb.AppendRequest | None] = queue.Queue()

    def requests() -> Iterator[pb.AppendRequest]:
        while (item := outbox.get()) is not None:
            yield item

    stream = svc.stub.AppendStream(requests())
    outbox.put(pb.AppendRequest(batches=[batch(10, 5)], sequence=1))
    first = next(stream)
    assert first.sequence == 1 and all(s == pb.PUT_OK for s in first.statuses)

    stopper = threading.Thread(target=svc.service.stop)
    stopper.start()
    try:
        assert reader.ended.wait(20), "the subscription ends at once"
        assert reader.error is None  # a normal end: the subscriber reconnects later
        try:
            next(stream)
            raise AssertionError("the append stream must end")
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.UNAVAILABLE
        stopper.join(30)
        assert not stopper.is_alive()
        assert NOT_SERVING in watch.seen
        assert watch.seen.index(NOT_SERVING) > watch.seen.index(SERVING)
    finally:
        outbox.put(None)
        watch.close()
        stopper.join(30)
    assert svc.service.clean_exit
    assert not (Path(svc.data_dir) / "abort").exists()
    svc.stopped = True


def test_a_failed_flush_turns_liveness_and_readiness_off_and_stops_writes(
    start: Callable[..., Running],
) -> None:
    disk = SimDisk()
    svc = start("/store", disk=disk)
    wait_until(lambda: health(svc.health_target, "readiness") == SERVING, "readiness")
    disk.inject("flush", errno.EIO, path_contains="commitlog")
    svc.append_ok(batch(0, 200))  # more than flush_least_pages: the next flush round fails
    wait_until(lambda: health(svc.health_target, "liveness") == NOT_SERVING, "liveness off")
    wait_until(lambda: health(svc.health_target, "readiness") == NOT_SERVING, "readiness off")
    refused = svc.append(batch(200, 3))
    assert list(refused.statuses) == [pb.SERVICE_NOT_AVAILABLE] * 3
    assert "flush failed" in refused.refusals[0].reason
    assert not svc.status().writable
    # reads keep working
    assert svc.stub.Read(pb.ReadRequest(offsets=[0], sizes=[refused_size(svc)])).statuses == [
        pb.READ_OK
    ]
    svc.stop()
    assert not svc.service.clean_exit
    assert disk.exists("/store/abort"), "the next start must check the tail"


def refused_size(svc: Running) -> int:
    size: int = svc.engine.read_record(0).total_size
    return size
