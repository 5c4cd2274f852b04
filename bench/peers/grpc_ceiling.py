"""The transport ceiling: a trivial gRPC service moving the same batches mqstore moves, as in
reference §3, so that mqstore's figures can be read against what Python gRPC alone allows.

    python -m bench.peers.grpc_ceiling --ports-file F [--data-dir D]     (the server process)

The server is started as mqstore's services are (mqstore.launcher.ServiceProcess: the
`--data-dir` it passes is not used, nothing is stored), and writes its ports file the same way.

The service is the sync grpc.server with a thread pool, as mqstore's services are, with the
same message-size options and no interceptors. Its proto is one of three messages made at run
time (no generated code): Batch { repeated bytes payloads }, Ack { messages, bytes },
FetchRequest { max_messages, size }.
- Append (bidi, the shape of mqstore's AppendStream): a Batch of 1000 payloads in, an Ack
  out; the server touches every payload (sum of lengths), as a store must. The client keeps
  as many batches in flight as the SDK Producer's default window.
- Fetch (unary, the shape of a Pull): 1000 payloads of the asked size out, one call in flight,
  the client reading every payload. The server's batch is built once and re-serialised.
- Ping (unary, empty): the bare round trip a time lookup is read against.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from bench.meters import rss_mib
from bench.peers.common import BATCH, SIZES, anon_mib
from bench.peers.context import Context
from bench.processes import pids
from bench.report import percentile
from mqstore.client.producer import WINDOW_DEFAULT
from mqstore.launcher import ServiceProcess
from mqstore.rpc.channel import MAX_MESSAGE_BYTES, make_channel
from mqstore.rpc.server import server_options
from mqstore.stop_request import StopRequest

SERVICE = "benchceiling.Ceiling"
SERVER_THREADS = 8  # the reference's sync server
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
LOOKUP_WARM_UP = 20
_F = descriptor_pb2.FieldDescriptorProto


@cache
def messages() -> dict[str, Any]:
    """The three message classes, from a descriptor built here."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="bench_ceiling.proto", package="benchceiling", syntax="proto3"
    )
    optional, repeated = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
    layout = {
        "Batch": [("payloads", _F.TYPE_BYTES, repeated)],
        "Ack": [("messages", _F.TYPE_INT64, optional), ("bytes", _F.TYPE_INT64, optional)],
        "FetchRequest": [
            ("max_messages", _F.TYPE_INT32, optional),
            ("size", _F.TYPE_INT32, optional),
        ],
    }
    for name, fields in layout.items():
        message = proto.message_type.add(name=name)
        for number, (field_name, kind, label) in enumerate(fields, 1):
            message.field.add(name=field_name, number=number, type=kind, label=label)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(proto.SerializeToString())
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"benchceiling.{name}"))
        for name in layout
    }


# -- the server -------------------------------------------------------------------------------


def serve(ports_file: str) -> None:
    m = messages()
    batches = {size: m["Batch"](payloads=[os.urandom(size)] * BATCH) for size in SIZES}

    def append(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        for batch in requests:
            yield m["Ack"](messages=len(batch.payloads), bytes=sum(map(len, batch.payloads)))

    def fetch(request: Any, context: grpc.ServicerContext) -> Any:
        return batches[request.size]

    def ping(request: Any, context: grpc.ServicerContext) -> Any:
        return request

    handlers = {
        "Append": grpc.stream_stream_rpc_method_handler(
            append, m["Batch"].FromString, m["Ack"].SerializeToString
        ),
        "Fetch": grpc.unary_unary_rpc_method_handler(
            fetch, m["FetchRequest"].FromString, m["Batch"].SerializeToString
        ),
        "Ping": grpc.unary_unary_rpc_method_handler(
            ping, m["Ack"].FromString, m["Ack"].SerializeToString
        ),
    }
    server = grpc.server(
        ThreadPoolExecutor(max_workers=SERVER_THREADS), options=server_options(MAX_MESSAGE_BYTES)
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stop = StopRequest()
    stop.install((signal.SIGTERM,))
    tmp = f"{ports_file}.tmp"
    Path(tmp).write_text(json.dumps({"port": port, "pid": os.getpid()}), encoding="utf-8")
    os.replace(tmp, ports_file)
    while not stop.wait(3600):
        pass
    server.stop(grace=1).wait()


@contextmanager
def ceiling_server(root: Path) -> Iterator[ServiceProcess]:
    """The server as a process of its own under `root`, listening; stopped (SIGTERM, SIGKILL
    past STOP_TIMEOUT_S) when the block ends."""
    server = ServiceProcess(
        "bench.peers.grpc_ceiling", str(root / "ceiling"), log_path=str(root / "ceiling.log")
    )
    server.start()
    try:
        server.wait_listening(READY_TIMEOUT_S)
        yield server
    finally:
        server.stop(STOP_TIMEOUT_S)


# -- the clients (worker processes) -----------------------------------------------------------


def _stubs(channel: grpc.Channel) -> dict[str, Any]:
    m = messages()
    return {
        "append": channel.stream_stream(
            f"/{SERVICE}/Append", m["Batch"].SerializeToString, m["Ack"].FromString
        ),
        "fetch": channel.unary_unary(
            f"/{SERVICE}/Fetch", m["FetchRequest"].SerializeToString, m["Batch"].FromString
        ),
        "ping": channel.unary_unary(
            f"/{SERVICE}/Ping", m["Ack"].SerializeToString, m["Ack"].FromString
        ),
    }


def produce(target: str, size: int, n: int, window: int = WINDOW_DEFAULT) -> dict[str, Any]:
    batch = messages()["Batch"](payloads=[os.urandom(size)] * BATCH)
    calls = max(1, n // BATCH)
    slots = threading.Semaphore(window)

    def requests() -> Iterator[Any]:
        for _ in range(calls):
            slots.acquire()
            yield batch

    with make_channel(target) as channel:
        grpc.channel_ready_future(channel).result(timeout=READY_TIMEOUT_S)
        append = _stubs(channel)["append"]
        acked = 0
        began = time.perf_counter()
        for ack in append(requests()):
            slots.release()
            acked += ack.messages
        took = time.perf_counter() - began
    if acked != calls * BATCH:
        raise RuntimeError(f"ceiling: {acked} acked of {calls * BATCH}")
    return {"rate": acked / took, "seconds": took, "window": window}


def consume(target: str, size: int, n: int) -> dict[str, Any]:
    request = messages()["FetchRequest"](max_messages=BATCH, size=size)
    with make_channel(target) as channel:
        grpc.channel_ready_future(channel).result(timeout=READY_TIMEOUT_S)
        fetch = _stubs(channel)["fetch"]
        count = body_bytes = 0
        began = time.perf_counter()
        while count < n:
            batch = fetch(request, timeout=READY_TIMEOUT_S)
            body_bytes += sum(map(len, batch.payloads))
            count += len(batch.payloads)
        took = time.perf_counter() - began
    return {"rate": count / took, "seconds": took, "body_bytes": body_bytes}


@contextmanager
def pinger(target: str) -> Iterator[Callable[[], None]]:
    """One bare Ping to `target` per call (a system's lookups interleave it with theirs)."""
    request = messages()["Ack"](messages=random.randrange(1 << 30))
    with make_channel(target) as channel:
        grpc.channel_ready_future(channel).result(timeout=READY_TIMEOUT_S)
        ping = _stubs(channel)["ping"]
        yield lambda: ping(request, timeout=READY_TIMEOUT_S)


def pings(target: str, count: int) -> dict[str, Any]:
    times: list[float] = []
    with pinger(target) as ping:
        for i in range(LOOKUP_WARM_UP + count):
            began = time.perf_counter()
            ping()
            if i >= LOOKUP_WARM_UP:
                times.append((time.perf_counter() - began) * 1000)
    return {"p50_ms": percentile(times, 0.5), "p99_ms": percentile(times, 0.99)}


def run(ctx: Context) -> None:
    scale, results = ctx.scale, ctx.results
    with ceiling_server(ctx.root) as server:
        servers = pids({"ceiling": server})
        results.describe(
            "ceiling",
            f"grpcio {grpc.__version__}; sync grpc.server, {SERVER_THREADS} threads, "
            "no interceptors; nothing stored",
        )
        for run_no in range(scale.runs):
            for size in SIZES:
                ctx.say(f"ceiling: run {run_no + 1}/{scale.runs}, {size} B")
                got, m = ctx.measure(servers, produce, server.target, size, scale.messages)
                detail = f"bidi stream of {BATCH}-payload batches, {WINDOW_DEFAULT} in flight"
                results.add("produce", size, "ceiling", got["rate"], m.foreign_cores, detail, **got)
                got, m = ctx.measure(servers, consume, server.target, size, scale.messages)
                detail = f"unary Fetch of {BATCH} payloads, 1 in flight"
                results.add("consume", size, "ceiling", got["rate"], m.foreign_cores, detail, **got)
                results.add("consume_fast", size, "ceiling", got["rate"], m.foreign_cores, detail)
                got, m = ctx.measure(servers, pings, server.target, scale.lookups)
                for q in ("p50", "p99"):
                    results.add(
                        f"lookup_{q}",
                        size,
                        "ceiling",
                        got[f"{q}_ms"],
                        m.foreign_cores,
                        "unary empty round trip",
                        **got,
                    )
        memory = rss_mib(servers["ceiling"])
        results.add(
            "memory",
            0,
            "ceiling",
            anon_mib(memory),
            0.0,
            "server anonymous RSS",
            pid=servers["ceiling"],
            **memory,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the gRPC ceiling's server process")
    parser.add_argument("--ports-file", required=True, help="written once it listens")
    parser.add_argument("--data-dir", default=None, help="not used: nothing is stored")
    serve(parser.parse_args(argv).ports_file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
