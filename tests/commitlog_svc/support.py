"""Helpers for the commitlog_svc tests.

`Running` is the real service in this process (CommitLogService: engine, registry, servicer,
ServiceHost with its interceptors, port 0) and a real client channel to it. Tests that need a
crash the process cannot survive (kill -9, SIGTERM) run `python -m commitlog_svc` instead
(`start_process`). Segments are 64 KiB so that rollover and retention happen within a test.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from commitlog_svc.main import CommitLogService
from commitlog_svc.settings import CommitLogSettings
from mqstore.formats.properties import encode_properties
from mqstore.formats.record import Record, read_record
from mqstore.launcher import ServiceProcess
from mqstore.rpc.channel import make_channel
from mqstore.rpc.errors import error_from_rpc
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as pb_grpc
from mqstore.storage.clock import Clock
from mqstore.storage.disk import Disk
from mqstore.storage.mapped_file import offset_to_file_name

FILE_BYTES = 64 * 1024
TOPIC = "TopicTest"
EPHEMERAL = {"port": 0, "health_port": 0, "metrics_port": 0}
SMALL: dict[str, Any] = {
    "file_bytes": FILE_BYTES,
    "warm_ahead_bytes": 0,
    "flush_interval_ms": 20,
    "checkpoint_interval_ms": 50,
    "retention": False,
    "grace_period_s": 3.0,
    "log_format": "console",
}
# Generous: the machine is shared; these bound a wait, they never time a result.
WAIT_S = 20.0
RPC_TIMEOUT_S = 20.0


def settings_for(data_dir: Path | str, **overrides: Any) -> CommitLogSettings:
    values: dict[str, Any] = {**EPHEMERAL, **SMALL, "data_dir": str(data_dir)}
    values.update(overrides)
    return CommitLogSettings.load([], **values)


class Running:
    """An in-process commitlog_svc and a channel to it."""

    def __init__(
        self,
        data_dir: Path | str,
        *,
        disk: Disk | None = None,
        clock: Clock | None = None,
        **overrides: Any,
    ) -> None:
        self.data_dir = str(data_dir)
        self.settings = settings_for(data_dir, **overrides)
        self.service = CommitLogService(self.settings, disk=disk, clock=clock)
        self.service.start()
        self.channel = make_channel(self.target)
        self.stub = pb_grpc.CommitLogStub(self.channel)
        self.stopped = False

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.service.host.port}"

    @property
    def health_target(self) -> str:
        return f"127.0.0.1:{self.service.host.health_port}"

    @property
    def engine(self) -> Any:
        assert self.service.engine is not None
        return self.service.engine

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.channel.close()
        self.service.stop()

    # -- calls ----------------------------------------------------------------------------------

    def append(self, *batches: pb.MessageBatch, **fields: Any) -> pb.AppendResponse:
        response: pb.AppendResponse = self.stub.Append(
            pb.AppendRequest(batches=list(batches), **fields), timeout=RPC_TIMEOUT_S
        )
        return response

    def append_ok(self, *batches: pb.MessageBatch, **fields: Any) -> pb.AppendResponse:
        response = self.append(*batches, **fields)
        assert all(s == pb.PUT_OK for s in response.statuses), response.refusals
        return response

    def status(self) -> pb.GetStatusResponse:
        response: pb.GetStatusResponse = self.stub.GetStatus(
            pb.GetStatusRequest(), timeout=RPC_TIMEOUT_S
        )
        return response

    def subscriber(self, subscriber_id: str) -> pb.SubscriberStatus | None:
        for sub in self.status().subscribers:
            if sub.subscriber_id == subscriber_id:
                return sub
        return None


# Ports picked by the kernel, 64 KiB segments, no warming thread.
PROCESS_ARGS = (
    *("--port", "0", "--health-port", "0", "--metrics-port", "0"),
    *("--file-bytes", str(FILE_BYTES), "--warm-ahead-bytes", "0", "--log-format", "console"),
)


def start_process(data_dir: Path, *args: str, log_name: str = "commitlog.log") -> ServiceProcess:
    """`python -m commitlog_svc` on port 0 with small segments; waits until it listens."""
    process = ServiceProcess(
        "commitlog_svc",
        str(data_dir),
        args=[*PROCESS_ARGS, *args],
        log_path=str(data_dir.parent / log_name),
    )
    process.start()
    process.wait_listening()
    return process


# -- messages ---------------------------------------------------------------------------------


def body_for(i: int, nbytes: int = 100) -> bytes:
    """Different for every i, no zero byte (so damage to any byte shows)."""
    seed = f"message-{i}-".encode()
    return (seed * (nbytes // len(seed) + 1))[:nbytes]


def batch(
    first: int,
    count: int,
    *,
    topic: str = TOPIC,
    queues: int = 4,
    body_bytes: int = 100,
    keys: bool = True,
    **fields: Any,
) -> pb.MessageBatch:
    """Messages first..first+count-1, message i in queue i % queues, with KEYS/TAGS/UNIQ_KEY."""
    ids = range(first, first + count)
    props = (
        [
            encode_properties({"KEYS": f"key-{i}", "TAGS": f"tag{i % 3}", "UNIQ_KEY": f"U{i:08X}"})
            for i in ids
        ]
        if keys
        else []
    )
    return pb.MessageBatch(
        topic=topic,
        queue_ids=[i % queues for i in ids],
        bodies=[body_for(i, body_bytes) for i in ids],
        properties=props,
        **fields,
    )


def parse(raw: bytes) -> Record:
    found = read_record(raw, 0, len(raw))
    assert isinstance(found, Record), found
    return found


# -- errors -----------------------------------------------------------------------------------


def rpc_error(call: Callable[[], object]) -> tuple[grpc.StatusCode, str, str]:
    """(code, message, BadRequest field) of a call that must fail."""
    try:
        call()
    except grpc.RpcError as err:
        return error_from_rpc(err)
    raise AssertionError("the call succeeded")


# -- waiting ----------------------------------------------------------------------------------


def wait_until(predicate: Callable[[], object], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class FrameReader:
    """Reads a Subscribe stream on a thread, so a test can wait for frames with a bound."""

    def __init__(self, frames: Iterator[pb.SubscribeResponse]) -> None:
        self.call = frames
        self.frames: list[pb.SubscribeResponse] = []
        self.error: grpc.RpcError | None = None
        self.ended = threading.Event()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for frame in self.call:
                with self._cond:
                    self.frames.append(frame)
                    self._cond.notify_all()
        except grpc.RpcError as err:
            self.error = err
        finally:
            self.ended.set()
            with self._cond:
                self._cond.notify_all()

    def wait(self, predicate: Callable[[list[pb.SubscribeResponse]], bool], what: str) -> None:
        with self._cond:
            if not self._cond.wait_for(
                lambda: predicate(self.frames) or self.ended.is_set(), WAIT_S
            ):
                raise AssertionError(f"timed out waiting for {what}")
            if not predicate(self.frames):
                raise AssertionError(f"the stream ended before {what}: {self.error}")

    @property
    def handshake(self) -> pb.Handshake:
        self.wait(lambda f: len(f) >= 1, "the handshake")
        assert self.frames[0].WhichOneof("frame") == "handshake"
        return self.frames[0].handshake

    def batches(self) -> list[pb.DispatchBatch]:
        with self._cond:
            return [f.batch for f in self.frames if f.WhichOneof("frame") == "batch"]

    def wait_reaching(self, offset: int) -> list[pb.DispatchBatch]:
        """Every batch up to the one whose next_offset reaches `offset`."""
        self.wait(
            lambda f: any(
                x.WhichOneof("frame") == "batch" and x.batch.next_offset >= offset for x in f
            ),
            f"dispatch to reach {offset}",
        )
        return self.batches()

    def cancel(self) -> None:
        cancel = getattr(self.call, "cancel", None)
        if cancel is not None:
            cancel()
        self.ended.wait(WAIT_S)


def fill(svc: Running, messages: int, per_call: int = 10) -> list[pb.AppendResponse]:
    return [svc.append_ok(batch(i, per_call)) for i in range(0, messages, per_call)]


def offsets_of(responses: list[pb.AppendResponse]) -> list[int]:
    return [o for r in responses for o in r.commit_log_offsets]


def dispatched_offsets(batches: Sequence[pb.DispatchBatch]) -> list[int]:
    return [o for b in batches for o in b.commit_log_offsets]


def subscribe(running: Running, subscriber_id: str, **fields: Any) -> FrameReader:
    return FrameReader(
        running.stub.Subscribe(pb.SubscribeRequest(subscriber_id=subscriber_id, **fields))
    )


# -- bytes on disk ----------------------------------------------------------------------------


def segment_path(data_dir: Path | str, offset: int) -> str:
    start = offset - offset % FILE_BYTES
    return os.path.join(str(data_dir), "commitlog", offset_to_file_name(start))


def write_at(data_dir: Path | str, offset: int, data: bytes) -> None:
    """Overwrite bytes of a segment in place (the running store's map sees it at once)."""
    with open(segment_path(data_dir, offset), "r+b") as f:
        f.seek(offset % FILE_BYTES)
        f.write(data)


def read_at(data_dir: Path | str, offset: int, nbytes: int) -> bytes:
    with open(segment_path(data_dir, offset), "rb") as f:
        f.seek(offset % FILE_BYTES)
        return f.read(nbytes)


def damage_body(data_dir: Path | str, offset: int) -> None:
    """Flip a bit in the body of the record at `offset` (IPv4 hosts: the body starts at 88)."""
    (byte,) = read_at(data_dir, offset + 90, 1)
    write_at(data_dir, offset + 90, bytes([byte ^ 0x10]))


def health(target: str, service: str) -> int:
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            return int(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status)
        except grpc.RpcError:
            return -1


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
