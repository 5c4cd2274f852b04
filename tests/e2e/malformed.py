"""Request bytes that never parse, sent to every RPC of a service process, and what the process
kept afterwards (issue 23, item 2): its anonymous memory (RssAnon) and its log's size.

Every method of the API port (the service's own and reflection) and of the health port is
called with each payload of MALFORMED in turn, through generic channel methods with no
serializer, so the bytes reach the server exactly as written. The payloads fail for different
reasons: a field number 0 of an unknown wire type (the issue's reproduction), a length-delimited
field longer than what follows, a varint that never ends, and a string field that is not UTF-8
(the first field of every mqstore request is a string or a message).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from mqstore.launcher import ServiceProcess
from mqstore.rpc import reflection
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2
from mqstore.rpc.gen.index.v1 import index_pb2

MALFORMED: tuple[bytes, ...] = (
    b"\xff\xff\xff\xff\x01",  # the bytes: a tag of field 0, wire type 7
    b"\x0a\x05ab",  # field 1, length 5, two bytes follow
    b"\x08" + b"\xff" * 10,  # field 1, a varint of ten continuation bytes
    b"\x0b",  # field 1, a group that never ends
    b"\x0a\xff\xff\xff\xff\x0f",  # field 1, a length of 4 GiB
)
CALL_TIMEOUT_S = 10.0
# Client threads sending at once to one service: enough to keep its workers busy.
SENDERS = 4


@dataclass(frozen=True)
class Method:
    path: str  # /package.Service/Method
    client_streaming: bool
    server_streaming: bool


def _methods(service: ServiceDescriptor) -> list[Method]:
    return [
        Method(f"/{service.full_name}/{m.name}", m.client_streaming, m.server_streaming)
        for m in service.methods
    ]


_OWN: dict[str, ServiceDescriptor] = {
    "commitlog_svc": commitlog_pb2.DESCRIPTOR.services_by_name["CommitLog"],
    "cq_svc": consumequeue_pb2.DESCRIPTOR.services_by_name["ConsumeQueue"],
    "index_svc": index_pb2.DESCRIPTOR.services_by_name["Index"],
}
REFLECTION = [
    *_methods(reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"]),
    *_methods(reflection.v1_file().services_by_name["ServerReflection"]),
]
# What grpcio-health-checking serves (its proto also names List, which it does not serve).
HEALTH = [
    m
    for m in _methods(health_pb2.DESCRIPTOR.services_by_name["Health"])
    if m.path.endswith(("/Check", "/Watch"))
]


def api_methods(package: str) -> list[Method]:
    """Every method of a service's API port: its own service's and reflection's (v1alpha and
    v1). Its health Check, open without a token, is sent such bytes in
    tests/security/test_health_on_api_port.py."""
    return [*_methods(_OWN[package]), *REFLECTION]


def call_once(
    channel: grpc.Channel,
    method: Method,
    payload: bytes,
    metadata: Sequence[tuple[str, str]] = (),
) -> grpc.StatusCode:
    """One call whose request is `payload` as it is; the status it ends with."""
    md = list(metadata) or None
    try:
        if method.client_streaming and method.server_streaming:
            for _ in channel.stream_stream(method.path)(
                iter([payload]), timeout=CALL_TIMEOUT_S, metadata=md
            ):
                pass
        elif method.client_streaming:
            channel.stream_unary(method.path)(iter([payload]), timeout=CALL_TIMEOUT_S, metadata=md)
        elif method.server_streaming:
            for _ in channel.unary_stream(method.path)(
                payload, timeout=CALL_TIMEOUT_S, metadata=md
            ):
                pass
        else:
            channel.unary_unary(method.path)(payload, timeout=CALL_TIMEOUT_S, metadata=md)
    except grpc.RpcError as err:
        code: grpc.StatusCode = err.code()
        return code
    return grpc.StatusCode.OK


def anon_bytes(pid: int) -> int:
    """RssAnon of a process: its anonymous resident memory (heap, stacks), page cache aside."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no RssAnon for {pid}")


@dataclass
class Flood:
    """What `flood` saw: statuses by (method, code), and the process before and after (the
    log's growth counts the warm-up's calls too)."""

    calls: int
    seconds: float
    codes: Counter[tuple[str, str]]
    anon_before: int
    anon_after: int
    log_bytes: int

    @property
    def grown_mib(self) -> float:
        return (self.anon_after - self.anon_before) / (1 << 20)

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.seconds if self.seconds else 0.0

    def figures(self, name: str) -> str:
        return (
            f"{name}: {self.calls} malformed calls at {self.calls_per_s:.0f}/s, anon "
            f"{self.anon_before / (1 << 20):.1f} -> {self.anon_after / (1 << 20):.1f} MiB "
            f"({self.grown_mib:+.1f}), log +{self.log_bytes} B"
        )


Target = tuple[grpc.Channel, Method]


def _plan(targets: Sequence[Target], calls: int) -> Iterator[tuple[grpc.Channel, Method, bytes]]:
    """`calls` calls spread evenly over the targets, each cycling through MALFORMED."""
    for i in range(calls):
        channel, method = targets[i % len(targets)]
        yield channel, method, MALFORMED[(i // len(targets)) % len(MALFORMED)]


def flood(
    process: ServiceProcess,
    channels: Sequence[tuple[grpc.Channel, Sequence[Method]]],
    calls: int,
    *,
    metadata: Sequence[tuple[str, str]] = (),
    warm_up_calls: int = 0,
) -> Flood:
    """`calls` malformed calls spread over every (channel, its methods), SENDERS at a time.
    Memory is taken after `warm_up_calls` of the same kind (the server's worker threads and
    the handlers' wrappers exist by then), the log's size before them; both again once every
    call has ended."""
    assert process.proc is not None
    pid = process.proc.pid
    targets = [(channel, m) for channel, methods in channels for m in methods]

    def send(job: tuple[grpc.Channel, Method, bytes]) -> tuple[str, str]:
        channel, method, payload = job
        return method.path, call_once(channel, method, payload, metadata).name

    def run(n: int, codes: Counter[tuple[str, str]]) -> None:
        with futures.ThreadPoolExecutor(SENDERS) as pool:
            codes.update(pool.map(send, _plan(targets, n)))

    log_path = Path(process.log_path)
    log_before = log_path.stat().st_size
    if warm_up_calls:
        run(warm_up_calls, Counter())
    time.sleep(0.5)  # the last calls' memory returned before the first figure
    anon_before = anon_bytes(pid)
    codes: Counter[tuple[str, str]] = Counter()
    began = time.monotonic()
    run(calls, codes)
    seconds = time.monotonic() - began
    time.sleep(0.5)
    return Flood(
        calls=calls,
        seconds=seconds,
        codes=codes,
        anon_before=anon_before,
        anon_after=anon_bytes(pid),
        log_bytes=log_path.stat().st_size - log_before,
    )


def calls_from_env(default: int) -> int:
    """MQSTORE_MALFORMED_CALLS: the full form's count per service (docs/security.md)."""
    return int(os.environ.get("MQSTORE_MALFORMED_CALLS", default))
