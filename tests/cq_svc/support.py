"""Helpers for the cq_svc tests.

`ApiHarness` runs the real ConsumeQueue servicer in this process (ServiceHost, port 0, its
interceptors) over a real engine, fed through the real dispatch sink by the test itself: the
positions, statuses, validation and long-poll bookkeeping need no commit log. Anything that
fetches message bytes runs against a real commitlog_svc (conftest.py); `WholeCq` is the whole
service (CqService: subscriber, engine, tail, API) following one, and a client of it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from cq_svc.config import StoreKind
from cq_svc.engine import CqEngine
from cq_svc.main import SERVICE_NAME, CqService
from cq_svc.record_sources import RecordSources
from cq_svc.servicer import CqServicer
from cq_svc.settings import CqSettings
from cq_svc.sink import EngineSink
from cq_svc.watch import QueueWatch
from mqstore.dispatch import DispatchColumns, DispatchEntry
from mqstore.formats.javahash import tags_code
from mqstore.history import LogHistory
from mqstore.rpc.channel import make_channel
from mqstore.rpc.dispatch_codec import history_from_proto
from mqstore.rpc.errors import error_from_rpc
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl_pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as cl_grpc
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as cq_pb
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2_grpc as pb_grpc
from mqstore.rpc.server import ServiceHost

STORE_A = b"A" * 16
# Nothing listens here: a harness that must not fetch message bytes points its log at it.
NO_LOG = "127.0.0.1:1"
EPHEMERAL = {"port": 0, "health_port": 0, "metrics_port": 0}
# Tiny files and a fast flush, so rollover and checkpoints happen within a test.
SMALL = {
    "units_per_file": 50,
    "flush_interval_ms": 20,
    "flush_thorough_interval_ms": 100,
    "grace_period_s": 2.0,
}


def settings_for(data_dir: Path, **overrides: Any) -> CqSettings:
    values: dict[str, Any] = {
        **EPHEMERAL,
        **SMALL,
        "data_dir": str(data_dir),
        "commitlog_target": NO_LOG,
        "log_format": "console",
    }
    values.update(overrides)
    return CqSettings.load([], **values)


class ApiHarness:
    def __init__(self, data_dir: Path, *, kind: StoreKind = StoreKind.FILE, **overrides: Any):
        self.settings = settings_for(data_dir, cq_store=kind, **overrides)
        self.engine = CqEngine(self.settings.engine_config())
        self.engine.open()
        self.watch = QueueWatch(self.settings.long_polls_max)
        self.sink = EngineSink(self.engine, self.watch)
        self.ready = True
        self.log_channel = make_channel(self.settings.commitlog_target)
        self.servicer = CqServicer(
            self.engine,
            self.settings,
            watch=self.watch,
            sources=RecordSources.build(self.engine, self.settings, self.log_channel),
            caught_up=lambda: self.ready,
        )

        def register(server: grpc.Server) -> list[str]:
            pb_grpc.add_ConsumeQueueServicer_to_server(self.servicer, server)
            return [SERVICE_NAME]

        self.host = ServiceHost(
            "cq_svc",
            self.settings,
            register=register,
            on_stop=self._closed,
            stream_caps=self.settings.stream_caps(),
        )
        self.host.start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.host.port}")
        self.stub = pb_grpc.ConsumeQueueStub(self.channel)
        self._stopped = False

    def _closed(self) -> None:
        self.log_channel.close()
        self.engine.close()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.channel.close()
        self.watch.close()
        self.host.shutdown()

    # -- feeding ---------------------------------------------------------------------------------

    def handshake(
        self, min_offset: int = 0, max_offset: int = 0, store_id: bytes = STORE_A
    ) -> None:
        # As the log's handshake says it: one epoch from the start, truncate at its end.
        self.sink.on_handshake(store_id, min_offset, max_offset, max_offset, LogHistory([(1, 0)]))

    def agree_with_log(self) -> None:
        """Handshake as the real commit log at `commitlog_target` would: its store id and
        history (a record it refuses is then damaged, not cut since the handshake)."""
        status = cl_grpc.CommitLogStub(self.log_channel).GetStatus(
            cl_pb.GetStatusRequest(), timeout=10
        )
        self.sink.on_handshake(
            status.store_id,
            status.min_offset,
            status.max_offset,
            status.max_offset,
            history_from_proto(status.history),
        )

    def dispatch(self, entries: Sequence[DispatchEntry]) -> None:
        frame = DispatchColumns.from_entries(entries)
        self.sink.on_batch(frame, max(e.end_offset for e in entries))


def entries(
    n: int,
    *,
    topic: str = "T",
    queue_id: int = 0,
    start: int = 0,
    phy_base: int = 0,
    size: int = 100,
    time_base: int = 1_000,
    time_step: int = 10,
    tags: str = "",
) -> list[DispatchEntry]:
    """Units start..start+n-1 of one queue: unit i at phy phy_base + size*(i-start), stored
    at time_base + time_step*i (no commit log behind them: for tests that read no bytes)."""
    return [
        DispatchEntry(
            topic=topic,
            queue_id=queue_id,
            queue_offset=i,
            commit_log_offset=phy_base + size * (i - start),
            size=size,
            tags_code=tags_code(tags),
            store_timestamp_ms=time_base + time_step * i,
        )
        for i in range(start, start + n)
    ]


def rpc_error(call: Callable[[], object]) -> tuple[grpc.StatusCode, str, str]:
    """(code, message, field) of a call that must fail."""
    try:
        call()
    except grpc.RpcError as err:
        return error_from_rpc(err)
    raise AssertionError("the call succeeded")


def wait_for(predicate: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


WHOLE_CQ_RPC_TIMEOUT_S = 30.0


class WholeCq:
    """A whole cq_svc (CqService: subscriber, engine, tail, API) following the commit log at
    `log_target`, and a client of it; caught up when made."""

    def __init__(self, data_dir: Path, log_target: str, **overrides: Any) -> None:
        overrides.setdefault("subscriber_id", f"cq-{uuid.uuid4().hex[:8]}")
        self.overrides = overrides
        self.service = CqService(settings_for(data_dir, commitlog_target=log_target, **overrides))
        self.service.start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.service.host.port}")
        self.stub = pb_grpc.ConsumeQueueStub(self.channel)
        assert wait_for(lambda: self.service.subscriber.caught_up, 30), "never caught up"

    def wait_applied(self, offset: int) -> None:
        def done() -> bool:
            status = self.stub.GetStatus(cq_pb.GetStatusRequest(), timeout=5)
            return bool(status.caught_up and status.applied_offset >= offset)

        assert wait_for(done, 30), f"cq did not apply up to {offset}"

    def pull(self, topic: str, offset: int, **fields: Any) -> cq_pb.PullResponse:
        request = cq_pb.PullRequest(topic=topic, offset=offset, **fields)
        response: cq_pb.PullResponse = self.stub.Pull(request, timeout=WHOLE_CQ_RPC_TIMEOUT_S)
        return response

    def stop(self) -> None:
        self.channel.close()
        self.service.stop()
