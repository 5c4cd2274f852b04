"""Helpers for the index_svc tests: in-process servers, health probes, free ports."""

from __future__ import annotations

import os
import socket
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from index_svc.servicer import IndexServicer
from mqstore.formats.properties import KEYS, UNIQ_KEY, encode_properties
from mqstore.formats.record import HEADER_V4_V4
from mqstore.launcher import ServiceProcess
from mqstore.rpc.errors import ErrorInterceptor
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2, commitlog_pb2_grpc
from mqstore.rpc.gen.index.v1 import index_pb2, index_pb2_grpc
from mqstore.rpc.logs import LoggingInterceptor
from mqstore.rpc.metrics import MetricsInterceptor
from mqstore.rpc.subscriber import wait_until

STORE_ID = bytes(range(1, 17))


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@contextmanager
def serve_servicer(servicer: IndexServicer) -> Iterator[index_pb2_grpc.IndexStub]:
    """The servicer on a real loopback server with the interceptors every service has."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        interceptors=[LoggingInterceptor(), MetricsInterceptor(), ErrorInterceptor()],
    )
    index_pb2_grpc.add_IndexServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield index_pb2_grpc.IndexStub(channel)
    finally:
        server.stop(0).wait()


def health_status(target: str, service: str) -> str:
    """SERVING / NOT_SERVING / ... of one health service name ("UNREACHABLE" if no answer)."""
    with grpc.insecure_channel(target) as channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=5
            )
        except grpc.RpcError:
            return "UNREACHABLE"
    name: str = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
    return name


def sample(name: str, **labels: str) -> float:
    """The current value of a series in this process's registry (0 before its first use)."""
    value = REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


def queries(kind: str, result: str) -> float:
    return sample("mqstore_index_queries_total", kind=kind, result=result)


# -- the commit log ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Appended:
    """What one Append stored: per message its offset and size, and the batch's store time."""

    offsets: list[int]
    sizes: list[int]
    store_timestamp_ms: int

    @property
    def end_offset(self) -> int:
        return self.offsets[-1] + self.sizes[-1]


def append(
    stub: commitlog_pb2_grpc.CommitLogStub,
    topic: str,
    messages: Sequence[tuple[str, str]],
    *,
    body_prefix: bytes = b"body",
) -> Appended:
    """Append (keys, uniq_key) messages to `topic` in one call; bodies name their index."""
    properties = [
        encode_properties({k: v for k, v in ((KEYS, keys), (UNIQ_KEY, uniq)) if v})
        for keys, uniq in messages
    ]
    batch = commitlog_pb2.MessageBatch(
        topic=topic,
        queue_ids=[0] * len(messages),
        bodies=[body_prefix + b"-%d" % i for i in range(len(messages))],
        properties=properties,
    )
    response = stub.Append(commitlog_pb2.AppendRequest(batches=[batch]), timeout=30)
    assert list(response.statuses) == [commitlog_pb2.PUT_OK] * len(messages), response
    return Appended(
        list(response.commit_log_offsets), list(response.sizes), response.store_timestamp_ms
    )


def wait_applied(stub: index_pb2_grpc.IndexStub, offset: int, timeout_s: float = 30) -> None:
    """Until the replica has applied everything below `offset` and caught up."""

    def done() -> bool:
        status = stub.GetStatus(index_pb2.GetStatusRequest(), timeout=5)
        return bool(status.caught_up and status.applied_offset >= offset)

    assert wait_until(done, timeout_s, step_s=0.02), f"index did not reach {offset}"


def offsets_of(response: index_pb2.QueryResponse) -> list[int]:
    return [m.commit_log_offset for m in response.messages]


def segment_holding(data_dir: str, offset: int) -> str:
    """The commit-log segment file (named by its 20-digit start offset) holding `offset`."""
    segments = []
    for base, _, names in os.walk(data_dir):
        segments += [os.path.join(base, n) for n in names if len(n) == 20 and n.isdigit()]
    starts = sorted((int(os.path.basename(p)), p) for p in segments)
    return [p for start, p in starts if start <= offset][-1]


def flip_body_bit(data_dir: str, offset: int) -> None:
    """Flip one bit of the body of the (IPv4-host) record at `offset`, in its segment file, under
    the running commit log (its mapping sees the change): the body CRC no longer matches."""
    path = segment_holding(data_dir, offset)
    body_at = offset - int(os.path.basename(path)) + HEADER_V4_V4.size
    with open(path, "r+b") as f:
        f.seek(body_at)
        byte = f.read(1)
        f.seek(body_at)
        f.write(bytes([byte[0] ^ 0x01]))


def commitlog_calls(commitlog: ServiceProcess, method: str) -> float:
    """grpc_server_handled_total of one CommitLog method, from the commit log's metrics port."""
    url = f"http://127.0.0.1:{commitlog.ports['metrics_port']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("grpc_server_handled_total{") and f'grpc_method="{method}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total
